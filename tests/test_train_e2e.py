"""End-to-end runs of train.py: single process, torchrun with 2 gloo processes, torchx dist.ddp, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import yaml

from conftest import KAGGLE_SAMPLE, REPO, needs_kaggle

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def run(cmd: List[str], timeout: int = 300) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
    return p


def records(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_default_run_single_process(tmp_path: Path) -> None:
    d = tmp_path / "run"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            "trainer.max_steps=40",
            "eval.every_n_steps=20",
            "logger.log_every_n_steps=10",
            "data.num_val_samples=2048",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(d)
    steps = [r for r in recs if "loss" in r]
    vals = [r for r in recs if "val_auc" in r]
    assert [r["step"] for r in steps] == [10, 20, 30, 40]
    assert {"step", "loss", "lr", "samples_per_s"} <= set(steps[0])
    assert [r["step"] for r in vals] == [20, 40]
    assert {"val_auc", "val_logloss"} <= set(vals[0]) and vals[0]["val_samples"] == 2048
    assert vals[-1]["val_auc"] > 0.6, vals
    assert steps[-1]["samples"] == 40 * 256
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert cfg["trainer"]["max_steps"] == 40 and cfg["model"]["name"] == "dlrm_v2_small"
    assert f"final validation AUC {vals[-1]['val_auc']:.4f}" in p.stdout
    assert sum(line.startswith("step ") for line in p.stdout.splitlines()) == 4


def _final_auc(d: Path) -> float:
    return [r for r in records(d) if "val_auc" in r][-1]["val_auc"]


@needs_kaggle
def test_criteo_sample_one_and_two_processes_agree(tmp_path: Path) -> None:
    """The acceptance run on real rows, and the same under torchrun with 2 gloo processes."""
    common = ["experiment=criteo_sample", f"data.train_path={KAGGLE_SAMPLE}"]
    d1, d2 = tmp_path / "one", tmp_path / "two"
    p1 = run([sys.executable, "train.py", f"hydra.run.dir={d1}", *common])
    assert p1.returncode == 0, p1.stdout + p1.stderr
    p2 = run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "train.py", f"hydra.run.dir={d2}", *common]
    )
    assert p2.returncode == 0, p2.stdout + p2.stderr
    a1, a2 = _final_auc(d1), _final_auc(d2)
    assert [r["val_samples"] for r in records(d2) if "val_auc" in r][-1] == 2000  # rows 8,001-10,000
    assert abs(a1 - 0.7364) <= 0.002, a1  # seed 0 of the recipe (docs/data.md)
    assert a1 == a2, (a1, a2)  # global batch 64 either way: bit for bit the same AUC (docs/data.md)


def test_torchx_dist_ddp_two_processes(tmp_path: Path) -> None:
    d = tmp_path / "tx"
    p = run(
        [
            str(BIN / "torchx"),
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            f"log_dir={tmp_path / 'logs'}",
            "dist.ddp",
            "-j",
            "1x2",
            "--script",
            "train.py",
            "--",
            f"hydra.run.dir={d}",
            "trainer.max_steps=20",
            "data.num_train_samples=10240",
            "data.num_val_samples=1024",
            "logger.log_every_n_steps=10",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(d)
    assert [r["step"] for r in recs if "loss" in r] == [10, 20]
    assert [r["val_samples"] for r in recs if "val_auc" in r] == [1024]
    assert recs[0]["samples"] == 10 * 256 * 2  # per-rank batch x 2 ranks


@pytest.mark.parametrize(
    "content,override,match",
    [
        (None, "data.train_path={tmp}/missing.tsv", "config key `data.train_path`: no such file"),
        ("", "data.train_path={tmp}/x.tsv", r"x\.tsv: empty file"),
        ("1\t2\n", "data.train_path={tmp}/x.tsv", r"x\.tsv:1: 2 tab-separated fields, expected 40"),
        (
            "\t".join(["0", "9" * 400] + [""] * 38) + "\n",
            "data.train_path={tmp}/x.tsv",
            r"x\.tsv:1: integer feature I1 has 400 digits, too large for a float \(at most 1\.8e308\)",
        ),
    ],
)
def test_bad_input_fails_fast_with_file_and_line(tmp_path: Path, content, override, match) -> None:
    if content is not None:
        (tmp_path / "x.tsv").write_text(content)
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={tmp_path / 'run'}",
            "data=criteo_tsv",
            override.format(tmp=tmp_path),
        ]
    )
    one_error_line(p, match)


def one_error_line(p: subprocess.CompletedProcess, match: str, status: int = 2) -> str:
    """A run ended by ``dlrm/cli.py``: exit ``status`` (2: bad input; 1: a diverged loss) with one ``error:`` line on
    stderr that ``match`` finds, and no traceback; returns that line."""
    assert p.returncode == status, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(match, errors[0]) and "Traceback" not in p.stderr, p.stderr
    return errors[0]


def test_dedicated_input_dist_group_trains_and_offload_needs_cuda(tmp_path: Path) -> None:
    d = tmp_path / "ded"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            "device=cpu",
            "pipeline.input_dist_group=dedicated",
            "trainer.max_steps=10",
            "logger.log_every_n_steps=5",
            "data.num_train_samples=2560",
            "data.num_val_samples=1024",
            "data.num_test_samples=0",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert [r["step"] for r in records(d) if "loss" in r] == [5, 10]
    assert "input dist of 1 sharded module(s) on a dedicated process group" in p.stdout + p.stderr
    p = run([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'uvm'}", "device=cpu", "offload=uvm"])
    one_error_line(p, re.escape("config key `offload.name`: offload=uvm needs CUDA"))


def test_a_missing_plan_or_checkpoint_is_reported_before_the_data_is_read(tmp_path: Path) -> None:
    """The training file is malformed: the errors below come first, so they were checked before reading it."""
    bad = tmp_path / "bad.tsv"
    bad.write_text("not a criteo row\n")
    base = [sys.executable, "train.py", "data=criteo_tsv", f"data.train_path={bad}"]
    p = run([*base, f"hydra.run.dir={tmp_path / 'a'}", f"sharding.plan_path={tmp_path / 'nope.json'}"])
    one_error_line(
        p,
        re.escape(
            f"config key `sharding.plan_path`: {tmp_path / 'nope.json'} does not exist (cwd {REPO}); give a plan.json "
            "written by python -m dlrm.plan or a run's <run_dir>/plan.json"
        ),
    )
    p = run([*base, f"hydra.run.dir={tmp_path / 'b'}", f"checkpoint.resume={tmp_path / 'step_5'}"])
    one_error_line(p, re.escape("config key `checkpoint.resume`: "))


def test_a_launch_without_a_rendezvous_is_one_error_line(tmp_path: Path) -> None:
    """``WORLD_SIZE=2`` by hand, without torchrun's ``MASTER_ADDR``: the ranks could never meet."""
    env = {k: v for k, v in ENV.items() if k != "MASTER_ADDR"}
    p = subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO,
        env={**env, "WORLD_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_error_line(
        p,
        re.escape(
            "error: environment: WORLD_SIZE=2 but MASTER_ADDR is unset, so the ranks cannot meet; launch with "
            "torchrun or torchx (they set both), or unset WORLD_SIZE for one process"
        )
        + "$",
    )


def test_two_rank_trainer_exits_cleanly_under_load(tmp_path: Path) -> None:
    """Two 2-rank runs back to back, with a busy loop competing for the CPU, each with everything that runs
    beside the loop (the binary loader's prefetch thread, async checkpoint writes, gloo groups): every run ends
    with exit status 0, no rank aborting at shutdown."""
    import numpy as np

    from dlrm.config import compose, to_config
    from dlrm.data import binary_format as BF

    rows = to_config(compose(["model.row_cap=100"])).model.table_rows
    g = np.random.default_rng(0)
    days = [
        (
            g.standard_normal((n, 13)).astype(np.float32),
            np.stack([g.integers(0, r, n) for r in rows], axis=1).astype(np.int32),
            (g.random(n) < 0.3).astype(np.int32),
        )
        for n in (1024, 256)
    ]
    BF.write_dataset(str(tmp_path / "bin"), days, rows)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for i in range(2):
            d = tmp_path / f"run{i}"
            p = run(
                [
                    str(BIN / "torchrun"),
                    "--standalone",
                    "--nproc_per_node",
                    "2",
                    "train.py",
                    f"hydra.run.dir={d}",
                    "data=criteo_binary",
                    f"data.dataset_dir={tmp_path / 'bin'}",
                    "data.multi_hot=false",
                    "model.row_cap=100",
                    "data.batch_size=32",
                    "trainer.max_steps=12",
                    "eval.every_n_steps=6",
                    "checkpoint.every_n_steps=4",
                    "logger.log_every_n_steps=6",
                ],
                timeout=300,
            )
            assert p.returncode == 0, (i, p.stdout[-3000:] + p.stderr[-3000:])
            assert "final validation AUC" in p.stdout and (d / "checkpoints" / "step_12" / "manifest.json").is_file()
    finally:
        burner.kill()
        burner.wait()


def test_a_refused_relaunch_leaves_the_run_as_it_was(tmp_path: Path) -> None:
    """A relaunch in a run directory with checkpoints: ``checkpoint.resume=none`` is refused (its saves would go
    beside the earlier run's, and ``keep_last`` would prune them first), and so is another model; either way the
    run's checkpoints, ``config.yaml`` and ``plan.json`` stay as they were. A ``checkpoint.dir`` that is a file is
    refused before training."""
    from dlrm.config import compose
    from dlrm.errors import ConfigError, InputError
    from dlrm.trainer import Trainer

    base = [
        "data.num_train_samples=512",
        "data.num_val_samples=256",
        "data.num_test_samples=0",
        "data.batch_size=128",
        "eval.every_n_steps=null",
        "checkpoint.every_n_steps=2",
        "checkpoint.async_save=false",
        "logger=[jsonl]",
    ]
    t = Trainer(compose(base), str(tmp_path))
    try:
        t.fit()
    finally:
        t.close()
    root = tmp_path / "checkpoints"
    kept = {n: (tmp_path / n).read_bytes() for n in ("config.yaml", "plan.json")}
    assert sorted(os.listdir(root)) == ["step_2", "step_4"]
    none = (
        f"config key `checkpoint.resume`: none, but {root} holds step_4 of an earlier run; set "
        "checkpoint.dir=<a new directory> (or hydra.run.dir) to start fresh, leave checkpoint.resume=auto to "
        "continue it, or move its checkpoints aside"
    )
    (tmp_path / "afile").write_text("")
    for extra, error, match in (
        (["checkpoint.resume=none"], ConfigError, re.escape(none) + "$"),
        (
            ["model.embedding_dim=32", "model.dense_arch_layer_sizes=[64,32]"],
            InputError,
            re.escape("has no place in this model: model.dense_arch_layer_sizes was [64, 32, 16] in the checkpoint"),
        ),
        ([f"checkpoint.dir={tmp_path / 'afile'}"], ConfigError, "is a file; give a directory$"),
    ):
        t = Trainer(compose(base + extra), str(tmp_path))
        try:
            with pytest.raises(error, match=match):
                t.setup()
        finally:
            t.close()
    assert sorted(os.listdir(root)) == ["step_2", "step_4"]
    assert {n: (tmp_path / n).read_bytes() for n in kept} == kept


def test_sink_directories_are_made_at_start_or_refused(tmp_path: Path) -> None:
    """An mlperf.log in a subdirectory of the run gets that directory; a tensorboard directory that cannot be made
    stops set-up before planning, naming its key."""
    from dlrm.config import compose
    from dlrm.errors import ConfigError
    from dlrm.trainer import Trainer

    (tmp_path / "afile").write_text("")
    small = ["data.num_train_samples=256", "data.num_val_samples=128", "data.num_test_samples=0"]
    t = Trainer(compose([*small, "logger=[jsonl,mlperf]", "logger.mlperf.file=sub/mlperf.log"]), str(tmp_path / "a"))
    try:
        t.fit()
    finally:
        t.close()
    assert "run_stop" in (tmp_path / "a" / "sub" / "mlperf.log").read_text()
    bad = tmp_path / "afile" / "tb"
    t = Trainer(compose([*small, "logger=[jsonl,tensorboard]", f"logger.tensorboard.dir={bad}"]), str(tmp_path / "b"))
    try:
        with pytest.raises(ConfigError) as e:
            t.setup()
    finally:
        t.close()
    assert str(e.value) == (
        f"config key `logger.tensorboard.dir`: cannot make {bad} (Not a directory); give a writable path"
    )
    assert not hasattr(t, "plan")  # set-up stopped before the planner ran
