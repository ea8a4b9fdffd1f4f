"""The trainer on a real Slurm cluster through torchx, as the README's Launch section runs it from a login node.

The suite starts a two-node Slurm 22.05 cluster on this host with slurmdbd accounting (daemons.py) and runs the
README's commands from a copy of the checkout: ``torchx run -s slurm`` of the component on 2 ranks with a job
directory, ``torchx status`` / ``describe`` (read from ``sacct``) / ``log``; a job stopped by SIGTERM (what Slurm
sends on preemption) that exits 143, is requeued by its batch script and resumes from its checkpoint to the same
final model as the uninterrupted job; and the same command on two nodes, one rank each.

    make integration          # or: python -m pytest -m integration tests/integration/test_slurm.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from daemons import SlurmCluster, needs_root_and_packages

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def readme_commands() -> Dict[str, List[str]]:
    """The README's Slurm commands (its first code block under "Slurm, from a login node"), by first words:
    ``export``, ``run``, ``status``, ``describe``, ``log``; comments dropped, continuation lines joined."""
    text = (REPO / "README.md").read_text().split("### Slurm, from a login node", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    cmds = [shlex.split(line, comments=True) for line in block.splitlines()]
    return {(c[0] if c[0] == "export" else c[1]): c for c in cmds if c}


README = readme_commands()
STEPS = int(next(a for a in README["run"] if a.startswith("trainer.max_steps=")).split("=")[1])
VAL_SAMPLES = int(next(a for a in README["run"] if a.startswith("data.num_val_samples=")).split("=")[1])


def test_the_readme_gives_the_commands_this_suite_runs() -> None:
    assert sorted(README) == ["describe", "export", "log", "run", "status"]
    assert README["run"][:6] == ["torchx", "run", "-s", "slurm", "-cfg", "job_dir=$HOME/jobs/smoke"]
    assert "--max_retries" in README["run"] and "eval.every_n_steps=null" in README["run"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    why = needs_root_and_packages(["munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sbatch"])
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="dlrm-slurm-"))
    c = SlurmCluster(root, nodes=2)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout as a user has it on the login node: the repository's files, tracked and untracked-not-ignored
    (no outputs/, no .venv); torchx copies it into each job's directory."""
    dst = tmp_path_factory.mktemp("login") / "dlrm"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for f in filter(None, (x.decode() for x in files)):
        if (REPO / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)
    return dst


def _env(cluster: SlurmCluster) -> Dict[str, str]:
    env = {
        k: v
        for k, v in cluster.env.items()
        if not k.startswith(("DLRM_", "TORCHX_", "TORCHELASTIC_", "SLURM_JOB", "SBATCH_"))
        and k not in ("RANK", "WORLD_SIZE")
    }
    # the venv's torchx and python, as after `source .venv/bin/activate`, and the README's exports
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    env.update(kv.split("=", 1) for kv in README["export"][1:])
    return env


def torchx(cluster: SlurmCluster, login: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "torchx"), *args], cwd=login, env=_env(cluster), capture_output=True, text=True, timeout=timeout
    )


def submit(cluster: SlurmCluster, login: Path, job_dir: Path) -> str:
    """The README's ``torchx run`` with ``job_dir`` in place of its example path; returns the app handle
    ``slurm://torchx/<job id>``."""
    args = [f"job_dir={job_dir}" if a.startswith("job_dir=") else a for a in README["run"][1:]]
    p = torchx(cluster, login, *args)
    handle = re.search(r"slurm://torchx/(\d+)", p.stdout + p.stderr)
    assert p.returncode == 0 and handle, p.stdout + p.stderr
    return handle.group(0)


def readme(cmd: str, handle: str) -> List[str]:
    """The README's ``torchx <cmd>`` for the app ``handle``, without the leading ``torchx``."""
    return [a.replace("slurm://torchx/JOBID", handle) for a in README[cmd][1:]]


def wait_state(cluster: SlurmCluster, login: Path, handle: str, timeout: float) -> str:
    """Poll ``torchx status`` until the app is in a final state; return that state's name."""
    end = time.monotonic() + timeout
    out = ""
    while time.monotonic() < end:
        p = torchx(cluster, login, "status", handle)
        out = p.stdout + p.stderr
        m = re.search(r"State: (\w+)", out)
        if m and m.group(1) in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return m.group(1)
        time.sleep(2)
    raise TimeoutError(f"{handle} not finished within {timeout:.0f} s: {out}\n{cluster.log('slurmctld')}")


def metrics(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(cluster: SlurmCluster, login: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One job of the README's form run to the end: its handle, job directory and run directory."""
    job_dir = tmp_path_factory.mktemp("runs") / "smoke"
    handle = submit(cluster, login, job_dir)
    state = wait_state(cluster, login, handle, timeout=300)
    job_id = handle.rsplit("/", 1)[1]
    return {"handle": handle, "id": job_id, "job_dir": job_dir, "state": state}


def test_two_ranks_finish_with_status_describe_and_logs_in_the_job_dir(
    cluster: SlurmCluster, login: Path, finished: dict
) -> None:
    handle, job_id, job_dir = finished["handle"], finished["id"], finished["job_dir"]
    assert finished["state"] == "SUCCEEDED", (job_dir / f"slurm-{job_id}-train-0.err").read_text()

    # status and describe come from sacct (slurmdbd accounting)
    status = torchx(cluster, login, *readme("status", handle))
    assert status.returncode == 0 and re.search(r"State: SUCCEEDED", status.stdout), status.stdout + status.stderr
    describe = torchx(cluster, login, *readme("describe", handle))
    assert describe.returncode == 0, describe.stdout + describe.stderr
    assert re.search(r"'name': 'train',\s+'num_replicas': 1,", describe.stdout), describe.stdout
    rows = cluster.sacct(job_id, "JobID,JobName,State,ExitCode")
    assert rows[0] == {"JobID": job_id, "JobName": "train-0", "State": "COMPLETED", "ExitCode": "0:0"}, rows

    # logs: Slurm's files in the job directory, none in the caller's folder; torchx log reads them from there
    assert sorted(p.name for p in job_dir.glob("slurm-*")) == [
        f"slurm-{job_id}-train-0.err",
        f"slurm-{job_id}-train-0.out",
        f"slurm-{job_id}.out",
    ]
    assert not list(login.glob("slurm-*")) and not list(login.glob("outputs"))
    log = torchx(cluster, login, *readme("log", handle))
    assert log.returncode == 0, log.stdout + log.stderr
    final = re.search(r"final validation AUC (0\.\d{4})", log.stdout)
    assert final, log.stdout[-3000:]

    # the run directory: outputs/<job id> in the job directory, both ranks in one
    run_dir = job_dir / "outputs" / job_id
    recs = metrics(run_dir)
    assert [r["step"] for r in recs if "loss" in r] == list(range(10, STEPS + 1, 10))
    assert recs[0]["samples"] == 10 * 256 * 2
    (val,) = [r for r in recs if "val_auc" in r]
    assert val["val_samples"] == VAL_SAMPLES and f"{val['val_auc']:.4f}" == final.group(1)
    assert sorted(p.name for p in (job_dir / "outputs").iterdir()) == [job_id]


def test_sigterm_exits_143_and_the_requeued_job_resumes_to_the_same_model(
    cluster: SlurmCluster, login: Path, finished: dict, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``scancel --signal=TERM`` (Slurm's preemption signal) mid-run: both ranks save, the launcher exits 143, the
    batch script requeues the job (``--max_retries 1``); the same job id starts again in the same run directory,
    resumes from the checkpoint and ends with the uninterrupted job's loss and AUC, bit for bit."""
    job_dir = tmp_path_factory.mktemp("runs") / "preempted"
    handle = submit(cluster, login, job_dir)
    job_id = handle.rsplit("/", 1)[1]
    out, err = job_dir / f"slurm-{job_id}-train-0.out", job_dir / f"slurm-{job_id}-train-0.err"
    end = time.monotonic() + 240
    while not (out.is_file() and re.search(r"step +\d+/", out.read_text())):
        assert time.monotonic() < end, cluster.log("slurmctld")
        time.sleep(0.2)
    cluster.run(["scancel", "--signal=TERM", job_id])
    state = wait_state(cluster, login, handle, timeout=300)
    # both attempts' lines: the job was submitted with SBATCH_OPEN_MODE / SLURM_OPEN_MODE=append
    log, batch = out.read_text() + err.read_text(), (job_dir / f"slurm-{job_id}.out").read_text()
    assert state == "SUCCEEDED", log[-3000:]
    assert re.findall(r"^job exited with code (\d+)$", batch, re.M) == ["143", "0"], batch[-3000:]
    assert "torchrun: stopped by SIGTERM" in log and "exit status 143" in log, log[-3000:]
    saved = re.search(r"SIGTERM: finished step (\d+), saved", log)
    assert saved, log[-3000:]
    attempts = cluster.sacct(job_id, "JobID,State", "--duplicates")
    assert [r["State"] for r in attempts if r["JobID"] == job_id] == ["REQUEUED", "COMPLETED"], attempts

    run_dir = job_dir / "outputs" / job_id
    assert sorted(p.name for p in (job_dir / "outputs").iterdir()) == [job_id]
    recs = metrics(run_dir)
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps[-1] == STEPS and int(saved.group(1)) < STEPS
    ref = metrics(finished["job_dir"] / "outputs" / finished["id"])
    last = {k: [r for r in recs if k in r][-1][k] for k in ("loss", "val_auc")}
    want = {k: [r for r in ref if k in r][-1][k] for k in ("loss", "val_auc")}
    assert last == want


def test_two_nodes_one_rank_each(cluster: SlurmCluster, login: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The README's command with ``-j 2x1``: one het-job group per node (two slurmd on this host), torchrun on each,
    rendezvous at the first node; both ranks write one run directory, each node its own log files."""
    job_dir = tmp_path_factory.mktemp("runs") / "two-nodes"
    args = [f"job_dir={job_dir}" if a.startswith("job_dir=") else a for a in README["run"][1:]]
    args[args.index("-j") + 1] = "2x1"
    p = torchx(cluster, login, *args)
    handle = re.search(r"slurm://torchx/(\d+)", p.stdout + p.stderr)
    assert p.returncode == 0 and handle, p.stdout + p.stderr
    job_id = handle.group(1)
    state = wait_state(cluster, login, handle.group(0), timeout=300)
    assert state == "SUCCEEDED", (job_dir / f"slurm-{job_id}-train-0.err").read_text()[-3000:]
    # torchx's state is its last sacct row's: the other het-job group may still be completing
    end = time.monotonic() + 60
    while True:
        rows = cluster.sacct(job_id, "JobID,State,NodeList")
        groups = {r["JobID"]: (r["State"], r["NodeList"]) for r in rows if "." not in r["JobID"]}
        if all(st in ("COMPLETED", "FAILED", "CANCELLED") for st, _ in groups.values()) or time.monotonic() > end:
            break
        time.sleep(1)
    assert groups == {f"{job_id}+0": ("COMPLETED", cluster.nodes[0]), f"{job_id}+1": ("COMPLETED", cluster.nodes[1])}
    assert {f"slurm-{job_id}-train-{n}.{s}" for n in (0, 1) for s in ("out", "err")} <= {
        p.name for p in job_dir.glob("slurm-*")
    }
    # rank 0 is on whichever node joined torchrun's rendezvous first: read both nodes' logs
    logs = [torchx(cluster, login, *readme("log", handle.group(0)))]
    logs.append(torchx(cluster, login, *[a.replace("/train/0", "/train/1") for a in readme("log", handle.group(0))]))
    assert all(p.returncode == 0 for p in logs), [p.stderr for p in logs]
    finals = [re.findall(r"final validation AUC 0\.\d{4}", p.stdout) for p in logs]
    assert sorted(len(f) for f in finals) == [0, 1], [p.stdout[-2000:] for p in logs]
    recs = metrics(job_dir / "outputs" / job_id)
    assert [r["step"] for r in recs if "loss" in r] == list(range(10, STEPS + 1, 10))
    assert recs[0]["samples"] == 10 * 256 * 2  # two ranks
    assert [r["val_samples"] for r in recs if "val_auc" in r] == [VAL_SAMPLES]
