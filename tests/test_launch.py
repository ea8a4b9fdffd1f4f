"""Launching: run-directory naming per job (dlrm/cli.py), the torchx component (launch/components.py) and its
``.torchxconfig``, end to end under torchx local_cwd and torchrun with 2 gloo processes.

    .venv/bin/python -m pytest tests/test_launch.py -q
"""

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import yaml

from conftest import REPO, make_env, output_lines
from dlrm import cli
from dlrm.cli import _NAME_OK, job_name, run_dir_overrides
from dlrm.errors import InputError
from launch.components import RUN_NAME_RE, trainer

BIN = Path(sys.executable).parent
SHORT = [
    "trainer.max_steps=20",
    "data.num_train_samples=10240",
    "data.num_val_samples=1024",
    "logger.log_every_n_steps=10",
    "eval.every_n_steps=null",
]


def _env(**extra: str) -> Dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DLRM_", "TORCHX_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE")
    }
    env.update(PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra)
    return env


# ------------------------------------------------------------------------------------------- run directory
@pytest.mark.parametrize(
    "env,name",
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "none"}, None),  # torchrun's static-rendezvous placeholder
        ({"TORCHELASTIC_RUN_ID": "45cf2ab6-ab5f-4647-9bef-99f4d59fb395"}, "45cf2ab6-ab5f-4647-9bef-99f4d59fb395"),
        (
            {"TORCHX_JOB_ID": "local_cwd://torchx/train-k2x9s8d", "TORCHELASTIC_RUN_ID": "train-k2x9s8d"},
            "train-k2x9s8d",
        ),
        ({"TORCHX_JOB_ID": "slurm://torchx/81234", "TORCHELASTIC_RUN_ID": "81234"}, "81234"),
        ({"TORCHX_JOB_ID": "kubernetes://torchx/ml:dlrm-v2-x1", "TORCHELASTIC_RUN_ID": "x"}, "ml_dlrm-v2-x1"),
        ({"DLRM_RUN_NAME": "ablation.3", "TORCHX_JOB_ID": "local_cwd://torchx/train-k2"}, "ablation.3"),
    ],
)
def test_job_name_sources_in_order(env: Dict[str, str], name: str) -> None:
    assert job_name(env) == name


@pytest.mark.parametrize("bad", ["", "../up", "a/b", "-x", "a b"])
def test_bad_run_name_is_refused_naming_the_variable(bad: str) -> None:
    with pytest.raises(InputError, match=r"^environment variable \$DLRM_RUN_NAME=.* is not a plain directory name"):
        job_name({"DLRM_RUN_NAME": bad})
    with pytest.raises(ValueError, match="--run_name"):
        trainer(run_name=bad)
    assert _NAME_OK.pattern == RUN_NAME_RE.pattern  # the component checks the rule the job applies


def test_run_dir_overrides() -> None:
    job = {"TORCHX_JOB_ID": "local_cwd://torchx/train-k2", "TORCHELASTIC_RUN_ID": "train-k2"}
    assert run_dir_overrides([], {**job, "RANK": "0"}) == ["hydra.run.dir='outputs/train-k2'"]
    assert run_dir_overrides([], {**job, "RANK": "1"}) == [
        "hydra.output_subdir=null",
        "hydra.run.dir='outputs/train-k2'",
    ]
    assert run_dir_overrides([], {**job, "RANK": "1", "DLRM_OUTPUT_ROOT": "/mnt/runs"}) == [
        "hydra.output_subdir=null",
        "hydra.run.dir='/mnt/runs/train-k2'",
    ]
    # the user's hydra.run.dir wins on every rank
    assert run_dir_overrides(["hydra.run.dir=/x"], {**job, "RANK": "0"}) == []
    assert run_dir_overrides(["a=1", "hydra.run.dir=/x"], {**job, "RANK": "3"}) == ["hydra.output_subdir=null"]
    # no job name: rank 0 keeps the config's timestamped default, other ranks make no directory of their own
    assert run_dir_overrides([], {}) == []
    assert run_dir_overrides([], {"RANK": "1", "TORCHELASTIC_RUN_ID": "none"}) == [
        "hydra.output_subdir=null",
        "hydra.run.dir='outputs'",
    ]
    assert run_dir_overrides([], {"DLRM_OUTPUT_ROOT": "/r"}) == ["hydra.run.dir='/r/${now:%Y-%m-%d}/${now:%H-%M-%S}'"]
    with pytest.raises(InputError, match="DLRM_OUTPUT_ROOT"):
        run_dir_overrides([], {**job, "DLRM_OUTPUT_ROOT": "/it's"})
    assert run_dir_overrides(["hydra.run.dir=/x"], {"DLRM_OUTPUT_ROOT": "/it's"}) == []  # the root is not used


@pytest.mark.parametrize(
    "var,value,message",
    [
        (
            "DLRM_RUN_NAME",
            "a b",
            "environment variable $DLRM_RUN_NAME='a b' is not a plain directory name; set it to letters, digits, "
            "'.', '_' and '-', starting with a letter or digit, or unset it (for another parent directory set "
            "$DLRM_OUTPUT_ROOT)",
        ),
        (
            "DLRM_OUTPUT_ROOT",
            "/runs/it's",
            'environment variable $DLRM_OUTPUT_ROOT="/runs/it\'s": quotes and backslashes are not supported in the '
            "output root; set it to a directory without them (or pass hydra.run.dir=<dir>)",
        ),
    ],
)
def test_bad_run_dir_variable_is_one_error_line_and_exit_2(
    var: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``train.py`` / ``dlrm-train`` refuse the variable before Hydra starts: no traceback, no run directory."""
    for k in list(os.environ):
        if k.startswith(("DLRM_", "TORCHX_", "TORCHELASTIC_")) or k == "RANK":
            monkeypatch.delenv(k)
    monkeypatch.setenv(var, value)
    monkeypatch.setattr(sys, "argv", ["train.py", "trainer.max_steps=1"])
    monkeypatch.setattr(cli, "hydra_main", lambda: pytest.fail("Hydra started despite the bad variable"))
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert sys.argv == ["train.py", "trainer.max_steps=1"]


def _only_run_dir(root: Path) -> Path:
    entries = sorted(root.iterdir())
    assert len(entries) == 1 and entries[0].is_dir(), entries  # one run directory per job, none per rank
    return entries[0]


def _check_run_dir(d: Path, world: int) -> None:
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "loss" in r] == [10, 20]
    assert recs[0]["samples"] == 10 * 256 * world
    assert [r["val_samples"] for r in recs if "val_auc" in r] == [1024]
    assert sorted(p.name for p in (d / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    hydra_cfg = yaml.safe_load((d / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert Path(hydra_cfg["runtime"]["output_dir"]) == d and hydra_cfg["output_subdir"] == ".hydra"  # rank 0's


def test_torchrun_two_ranks_share_one_run_dir_named_by_run_id(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    p = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "train.py", *SHORT],
        cwd=REPO,
        env=_env(DLRM_OUTPUT_ROOT=str(root)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    d = _only_run_dir(root)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", d.name), d.name
    _check_run_dir(d, world=2)
    assert f"run dir {d}" in p.stdout + p.stderr


def test_sigterm_to_the_launcher_saves_and_exits_143(tmp_path: Path) -> None:
    """SIGTERM to ``python -m dlrm.torchrun`` (what a scheduler sends on preemption): torchrun forwards it, both
    ranks finish the step and save, and the launcher exits 143 (128 + SIGTERM) with one line, not torchrun's 1
    and a traceback, so that a retry policy restarts the job and reads it as preempted."""
    root, ck = tmp_path / "runs", tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node", "2", "train.py"]
        + [o for o in SHORT if not o.startswith(("trainer.max_steps=", "logger.log_every_n_steps="))]
        + ["trainer.max_steps=100000", "logger.log_every_n_steps=1", f"checkpoint.dir={ck}"],
        cwd=REPO,
        env=_env(DLRM_OUTPUT_ROOT=str(root)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, sent = [], False
    for line in output_lines(proc, timeout=300):
        out.append(line)
        if line.startswith("step ") and not sent:
            proc.send_signal(signal.SIGTERM)
            sent = True
    rc = proc.wait(timeout=60)
    text = "".join(out)
    assert rc == 143, text
    assert "Traceback" not in text, text
    assert "torchrun: stopped by SIGTERM" in text and "exit status 143" in text, text
    saved = re.search(r"SIGTERM: finished step (\d+), saved", text)
    assert saved, text
    assert (ck / f"step_{saved.group(1)}" / "manifest.json").is_file(), sorted(os.listdir(ck))


def test_a_config_error_under_the_launcher_exits_2_without_a_traceback(tmp_path: Path) -> None:
    """Each rank prints its ``error:`` line and exits 2; the launcher exits 2 too, without torchrun's
    ChildFailedError traceback (the error happens at config load: no training)."""
    p = subprocess.run(
        [sys.executable, "-m", "dlrm.torchrun", "--standalone", "--nproc_per_node", "2", "train.py"]
        + ["data.global_batch_size=257"],
        cwd=REPO,
        env=_env(DLRM_OUTPUT_ROOT=str(tmp_path / "runs")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = p.stdout + p.stderr
    assert p.returncode == 2, text
    assert "Traceback" not in text and "ChildFailedError" not in text, text
    line = (
        "error: config key `data.global_batch_size`: 257 does not divide over 2 ranks; use a multiple of the world size"
    )
    assert line in p.stderr, text  # the ranks' lines may interleave: no line-exact check


@pytest.mark.parametrize(
    "codes,status", [([2, 2], 2), ([2], 2), ([-15, 2], 2), ([1, 2], None), ([-9], None), ([-15, -15], None)]
)
def test_launcher_exits_2_only_for_workers_stopped_by_bad_input(
    codes: list, status: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    import dlrm.torchrun

    def failing(argv: object) -> None:
        failures = {
            r: ProcessFailure(local_rank=r, pid=100 + r, exitcode=c, error_file="<N/A>") for r, c in enumerate(codes)
        }
        raise ChildFailedError("train.py", failures)

    monkeypatch.setattr(dlrm.torchrun, "torchrun_main", failing)
    if status is None:
        with pytest.raises(ChildFailedError):
            dlrm.torchrun.main([])
    else:
        assert dlrm.torchrun.main([]) == status


@pytest.mark.parametrize(
    "argv,bad",
    [
        (["--standalone", "--nproc_per_node", "0", "train.py"], "0"),
        (["--nnodes", "1", "--nproc-per-node=-2", "train.py"], "-2"),
        (["--nproc_per_node", "2", "train.py", "--nproc_per_node", "0"], None),  # the script's own argument
        (["--nproc_per_node", "gpu", "train.py"], None),
    ],
)
def test_launcher_refuses_fewer_than_one_process_per_node(
    argv: list, bad: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import dlrm.torchrun

    calls = []
    monkeypatch.setattr(dlrm.torchrun, "torchrun_main", calls.append)
    status = dlrm.torchrun.main(argv)
    if bad is None:
        assert status == 0 and calls == [argv]
    else:
        assert status == 2 and calls == []
        assert capsys.readouterr().err == (
            f"error: --nproc_per_node {bad}: give a positive number of processes per node (or gpu, cpu, auto)\n"
        )


# --------------------------------------------------------------------------------------------- component
def test_component_appdef() -> None:
    app = trainer(
        "model=dlrm_v2",
        "trainer.max_steps=5",
        j="2x8",
        gpu=8,
        cpu=32,
        memMB=512000,
        max_retries=3,
        data="/mnt/criteo",
        outputs="pvc:dlrm-runs",
        mounts=["type=bind", "src=/ckpt", "dst=/ckpt"],
        env={"NCCL_DEBUG": "INFO", "X": "1"},
        run_name="exp1",
        name="dlrm",
    )
    (role,) = app.roles
    assert app.name == "dlrm" and role.image == "dlrm-v2:latest"
    assert role.num_replicas == 2 and role.max_retries == 3
    assert (role.resource.gpu, role.resource.cpu, role.resource.memMB) == (8, 32, 512000)
    cmd = role.args[1]
    assert role.entrypoint == "bash" and cmd.startswith("python -m dlrm.torchrun --rdzv_backend ")
    assert "--nnodes 2 --nproc_per_node 8" in cmd and cmd.endswith("train.py model=dlrm_v2 trainer.max_steps=5")
    assert {k: role.env[k] for k in ("NCCL_NVLS_ENABLE", "NCCL_DEBUG", "DLRM_OUTPUT_ROOT", "DLRM_RUN_NAME", "X")} == {
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_DEBUG": "INFO",
        "DLRM_OUTPUT_ROOT": "/outputs",
        "DLRM_RUN_NAME": "exp1",
        "X": "1",
    }
    mounts = [
        (type(m).__name__, getattr(m, "src_path", getattr(m, "src", None)), m.dst_path, m.read_only)
        for m in role.mounts
    ]
    assert mounts == [
        ("BindMount", "/mnt/criteo", "/data", True),
        ("VolumeMount", "dlrm-runs", "/outputs", False),
        ("BindMount", "/ckpt", "/ckpt", False),
    ]

    assert role.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # in-place restarts rejoin (pytorch#135712)
    assert "--max_restarts" not in cmd
    restarting = trainer("trainer.max_steps=5", max_restarts=2).roles[0].args[1]
    assert restarting.startswith("python -m dlrm.torchrun --max_restarts 2 --rdzv_backend "), restarting
    with pytest.raises(ValueError, match="--max_restarts=-1 must be >= 0"):
        trainer(max_restarts=-1)

    plain = trainer(nccl_debug="").roles[0]
    assert plain.mounts == [] and "NCCL_DEBUG" not in plain.env and "DLRM_OUTPUT_ROOT" not in plain.env
    assert trainer(output_root="/shared/runs").roles[0].env["DLRM_OUTPUT_ROOT"] == "/shared/runs"
    with pytest.raises(ValueError, match="--outputs mounts at /outputs"):
        trainer(outputs="/mnt/runs", output_root="/elsewhere")
    with pytest.raises(ValueError, match="empty mount source for /data"):
        trainer(data="")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_retries": -1}, "--max_retries=-1 must be >= 0"),
        (
            {"j": "1x4", "gpu": 2},
            "-j 1x4 runs 4 processes per node but --gpu 2 gives each node 2 GPUs; run at most one process per GPU "
            "(-j ...x2) or ask for --gpu 4",
        ),
        (
            {"j": "1:2x8", "gpu": 4},
            "-j 1:2x8 runs 8 processes per node but --gpu 4 gives each node 4 GPUs; run at most one process per GPU "
            "(-j ...x4) or ask for --gpu 8",
        ),
    ],
)
def test_component_refuses_negative_retries_and_more_processes_than_gpus(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        trainer(**kwargs)
    assert str(e.value) == message
    # torchx reports a component's exception with its traceback; the message is its last line
    p = subprocess.run(
        [str(BIN / "torchx"), "run", "--dryrun", "-s", "local_cwd", "launch/components.py:trainer"]
        + [a for k, v in kwargs.items() for a in (f"-{k}" if len(k) == 1 else f"--{k}", str(v))],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and p.stderr.splitlines()[-1] == f"ValueError: {message}", p.stdout + p.stderr


def test_component_sizes_a_gpu_node_unless_told() -> None:
    """The README's Slurm MLPerf command gives no --cpu / --memMB: an 8-GPU node gets 96 CPUs and 1 TB, not the
    CPU job's 2 and 8 GB."""
    res = [
        trainer(j=j, gpu=g, **kw).roles[0].resource
        for j, g, kw in (("2x8", 8, {}), ("1x2", 0, {}), ("1x8", 8, {"cpu": 4}))
    ]
    assert [(r.cpu, r.memMB) for r in res] == [(96, 1_000_000), (2, 8192), (4, 1_000_000)]
    # as torchx's command line passes them (it parses the component's arguments by their annotations)
    p = subprocess.run(
        [str(BIN / "torchx"), "run", "--dryrun", "-s", "local_cwd", "launch/components.py:trainer"]
        + ["-j", "1x1", "--cpu", "4", "--memMB", "4096"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "'cpu': 4," in p.stdout and "'memMB': 4096}" in p.stdout, p.stdout + p.stderr


def test_component_accepts_one_process_per_gpu_or_a_cpu_job() -> None:
    assert "--nproc_per_node 2" in trainer(j="1x2", gpu=2).roles[0].args[1]
    assert "--nproc_per_node 4" in trainer(j="1x4", gpu=0).roles[0].args[1]  # gloo on CPUs: no GPU to share
    assert trainer(max_retries=0).roles[0].max_retries == 0


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_keeps_the_runs() -> None:
    """README's fix for a CUDA torch in the CPU venv is ``make clean``: it must not delete outputs/."""
    p = subprocess.run(
        ["make", "--no-print-directory", "-n", "clean"],
        cwd=REPO,
        env=make_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and p.stdout == "rm -rf .venv .pytest_cache\n", p.stdout + p.stderr


def test_docker_image_installs_the_wandb_extra() -> None:
    """``logger=[stdout,jsonl,wandb]`` in the image: the dependencies layer installs pyproject's ``wandb`` extra,
    pinned as in requirements.txt."""
    import tomllib

    docker = (REPO / "Dockerfile").read_text()
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["wandb"]
    pins = [x for x in (REPO / "requirements.txt").read_text().split() if x.startswith("wandb==")]
    assert re.search(r"^ +&& pip install -e \.\[wandb\] ", docker, re.M) and extra == pins and len(pins) == 1


def test_component_docstring_overrides_compose() -> None:
    """The trainer overrides after ``--`` in launch/components.py's example commands (those given in full) are a
    valid config, with the paths as the container sees its mounts."""
    import launch.components as components
    from dlrm.config import compose, to_config

    commands = components.__doc__.replace("\\\n", " ").splitlines()
    examples = [c.split(" -- ", 1)[1].split() for c in commands if c.lstrip().startswith("torchx run") and " -- " in c]
    full = [o for o in examples if o[-1] != "..."]
    assert len(full) == 2 and ["experiment=mlperf_dlrmv2", "data.dataset_dir=/data/criteo_bin"] in full
    for overrides in full:
        to_config(compose(overrides))


def test_torchxconfig_options_are_known_to_torchx() -> None:
    """torchx only warns about an unknown option and drops it; a typo would silently change nothing."""
    from torchx.schedulers import get_scheduler_factories

    cfg = configparser.ConfigParser()
    cfg.optionxform = str  # type: ignore[assignment]  # torchx's options are case-sensitive
    cfg.read(REPO / ".torchxconfig")
    schedulers = {"local_cwd", "local_docker", "slurm", "kubernetes"}
    assert schedulers <= set(cfg.sections())
    factories = get_scheduler_factories()
    for s in schedulers:
        opts = factories[s](session_name="test").run_opts()
        for key in cfg[s]:
            assert opts.get(key) is not None, f".torchxconfig [{s}] {key}: not a run option of torchx's {s}"
    assert cfg["kubernetes"]["queue"]  # required by the kubernetes scheduler
    assert cfg["cli:run"]["scheduler"] == "local_cwd"
    assert not [s for s in cfg.sections() if s.startswith("component:")]  # dist.ddp keeps torchx's defaults


def test_torchx_component_two_processes_one_run_dir_named_by_app_id(tmp_path: Path) -> None:
    root, logs = tmp_path / "runs", tmp_path / "logs"
    p = subprocess.run(
        [
            str(BIN / "torchx"),
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            f"log_dir={logs}",
            "launch/components.py:trainer",
            "-j",
            "1x2",
            "--output_root",
            str(root),
            "--",
            *SHORT,
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    app_id = re.search(r"local_cwd://torchx/(dlrm-v2-\w+)", p.stdout + p.stderr)
    assert app_id, p.stdout + p.stderr
    d = _only_run_dir(root)
    assert d.name == app_id.group(1)
    _check_run_dir(d, world=2)
