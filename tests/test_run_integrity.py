"""One owner per run directory, and storage faults that fail early and safe: a second process launched into a live
run's directory, a ``kill -9``'d owner, a restart of the same job, a read-only ``checkpoint.dir``, a full disk
(a real tmpfs) under the checkpoints and under the run directory, a half-written last line of ``metrics.jsonl``.

    .venv/bin/python -m pytest -q tests/test_run_integrity.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

import pytest
from test_train_e2e import ENV, records

from conftest import REPO, output_lines, run_gloo

SMALL = [
    "data.batch_size=64",
    "data.num_train_samples=8192",
    "trainer.epochs=10",
    "data.num_val_samples=256",
    "data.num_test_samples=0",
    "eval.every_n_steps=null",
    "eval.at_end=false",
    "logger.log_every_n_steps=1",
    "logger.train_auc=false",
    "checkpoint.every_n_steps=5",
]


def _train(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, *extra]
    return subprocess.run(cmd, cwd=REPO, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=300)


@contextmanager
def _owner(run_dir: Path, env: dict | None = None) -> Iterator[subprocess.Popen]:
    """A training run in ``run_dir`` (up to 1000 steps), yielded once its step_5 checkpoint is written; killed (-9) on
    exit unless the test ended it."""
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, "trainer.max_steps=1000"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env={**ENV, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for line in output_lines(proc, timeout=240):
            if "checkpoints/step_5 written" in line:
                break
        else:
            pytest.fail(f"the first run ended before its first checkpoint (status {proc.wait()})")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _tree(d: Path) -> dict:
    """path -> bytes of every file under ``d`` that the live run itself does not change: all but its logs and its
    own checkpoints (it goes on saving), plus the planted in-flight ``step_999.tmp``."""
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file()
        and p.name not in ("metrics.jsonl", "train.log")
        and (p.parent.name == "step_999.tmp" or "checkpoints" not in p.relative_to(d).parts)
    }


def test_a_live_run_owns_its_directory_and_a_killed_one_is_taken_over(tmp_path: Path) -> None:
    """A second launch into a live run's directory: exit 2, the one error line naming the owner, and nothing of
    the first run touched (its .hydra/, config.yaml, an in-flight step_N.tmp, its metrics). Then the owner is
    killed with -9: the next launch takes the directory over with a warning and resumes from its checkpoint."""
    d = tmp_path / "run"
    with _owner(d) as first:
        inflight = d / "checkpoints" / "step_999.tmp"
        inflight.mkdir()
        (inflight / "__0_0.distcp").write_bytes(b"in flight")
        before = _tree(d)
        rec = json.loads((d / "owner.lock").read_text())
        assert (rec["pid"], rec["host"], rec["job"]) == (first.pid, socket.gethostname(), {}), rec
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", rec["start"]), rec
        p = _train(d, "trainer.max_steps=3")
        assert first.poll() is None, "the first run ended while the second was refused"
        first.kill()
        first.wait()
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr == (
        f"error: config key `hydra.run.dir`: {d} is in use by a live run: pid {first.pid} on host "
        f"{socket.gethostname()}, started {rec['start']}; wait for it to end or stop it, or give this run another "
        "directory\n"
    )
    assert _tree(d) == before
    steps = [r["step"] for r in records(d) if "loss" in r]
    assert steps == list(range(1, len(steps) + 1)), steps  # the first run's records only, in order

    newest = max(int(n[5:]) for n in os.listdir(d / "checkpoints") if re.fullmatch(r"step_\d+", n))
    p = _train(d, f"trainer.max_steps={newest + 2}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (
        f"WARNING dlrm.trainer: {d} was owned by a run that is gone (pid {first.pid} on host {socket.gethostname()}, "
        f"started {rec['start']}: killed or its node lost); taking it over"
    ) in p.stdout, p.stdout
    assert f"resumed from {d / 'checkpoints' / f'step_{newest}'} at step {newest}" in p.stdout, p.stdout
    assert not inflight.exists()  # the new owner removes the interrupted save it found
    assert (d / "owner.lock").read_text() == ""  # a clean end releases the directory: no warning next time

    # metrics.jsonl across the restart: the killed run's steps after step_<newest> are marked as replayed, and a
    # reader sees one record per step; wall time adds the killed segment's
    from dlrm.report import load_run, summarize

    raw = records(d)
    marker = next(r for r in raw if r.get("event") == "resume")
    first_run = raw[: raw.index(marker)]
    assert marker == {
        "event": "resume",
        "step": newest,
        "checkpoint": str(d / "checkpoints" / f"step_{newest}"),
        "superseded": sum(1 for r in first_run if r["step"] > newest),
        "previous_segment_s": first_run[-1]["time_s"],
    }
    assert marker["superseded"] >= 1 or steps[-1] == newest
    got = load_run(str(d))
    assert [r["step"] for r in got if "loss" in r] == list(range(1, newest + 3))
    assert summarize(got)["wall_s"] == first_run[-1]["time_s"] + raw[-1]["time_s"]


def test_a_restart_of_the_same_job_resumes_as_its_owner(tmp_path: Path) -> None:
    """A relaunch with the job's identity (``$TORCHELASTIC_RUN_ID``, as ``torchrun --max-restarts`` keeps it; the
    same for ``$SLURM_JOB_ID`` on a requeue and ``$TORCHX_JOB_ID`` on a torchx retry) after its first attempt was
    killed with -9: it takes over as the same job (an info line, no warning) and resumes."""
    d = tmp_path / "run"
    job = {"TORCHELASTIC_RUN_ID": "job-7", "SLURM_JOB_ID": "4242"}
    with _owner(d, env=job) as first:
        rec = json.loads((d / "owner.lock").read_text())
        first.kill()
    assert rec["job"] == {"torchrun": "job-7", "slurm": "4242"}, rec
    newest = max(int(n[5:]) for n in os.listdir(d / "checkpoints") if re.fullmatch(r"step_\d+", n))
    p = _train(d, f"trainer.max_steps={newest + 1}", env=job)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (
        f"INFO dlrm.trainer: {d}: taking over from this job's previous attempt (pid {first.pid} on host "
        f"{socket.gethostname()}, started {rec['start']} (slurm 4242, torchrun job-7))"
    ) in p.stdout, p.stdout
    assert "killed or its node lost" not in p.stdout + p.stderr
    assert f"at step {newest}" in p.stdout, p.stdout


def _setup_in_held_dir(rank: int, world: int, run_dir: str) -> str:
    from dlrm.config import compose
    from dlrm.errors import ConfigError
    from dlrm.trainer import Trainer

    t = Trainer(compose(["data.num_train_samples=256", "data.num_val_samples=128"]), run_dir)
    try:
        t.setup()
    except ConfigError as e:
        return str(e)
    finally:
        t.close()
    return "set up"


@contextmanager
def _holder(d: Path) -> Iterator[subprocess.Popen]:
    """Another process that owns ``d`` (:func:`dlrm.rundir.claim`) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from dlrm.rundir import claim; claim(sys.argv[1], 'k', {}); "
         "print('held', flush=True); sys.stdin.read()", str(d)],
        cwd=REPO, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def _in_use(key: str, d: Path, pid: int) -> str:
    start = json.loads((d / "owner.lock").read_text())["start"]
    return (
        f"config key `{key}`: {d} is in use by a live run: pid {pid} on host {socket.gethostname()}, started {start}; "
        "wait for it to end or stop it, or give this run another directory"
    )


def test_every_rank_refuses_a_directory_a_live_run_owns(tmp_path: Path) -> None:
    """Two ranks into a directory another process owns: rank 0 decides, both raise the same error (no hang), and
    the directory holds only the owner's lock."""
    d = tmp_path / "run"
    with _holder(d) as holder:
        line = _in_use("hydra.run.dir", d, holder.pid)
        got = run_gloo(2, _setup_in_held_dir, str(d), timeout=240)
    assert got == [line, line]
    assert os.listdir(d) == ["owner.lock"]


def test_a_checkpoint_dir_another_run_owns_is_refused(tmp_path: Path) -> None:
    """Two runs with their own run directories but one ``checkpoint.dir``: the second is refused naming
    ``checkpoint.dir`` and the owner, and leaves neither a run directory nor a change in the checkpoints."""
    ck, d = tmp_path / "ck", tmp_path / "run"
    with _holder(ck) as holder:
        p = _train(d, f"checkpoint.dir={ck}", "trainer.max_steps=2")
        line = _in_use("checkpoint.dir", ck, holder.pid)
    assert (p.returncode, p.stderr) == (2, f"error: {line}\n"), p.stdout + p.stderr
    assert not d.exists() and os.listdir(ck) == ["owner.lock"]


# ------------------------------------------------------------------------------------------------ storage faults
@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[callable]:
    """``mount(size_kib, ro=False)``: a real tmpfs at a fresh directory (unmounted at the end)."""
    mounted: List[Path] = []

    def mount(size_kib: int, ro: bool = False) -> Path:
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        opts = f"size={size_kib}k" + (",ro" if ro else "")
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {p.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_read_only_checkpoint_dir_is_refused_at_start(tmp_path: Path, tmpfs) -> None:
    """A ``checkpoint.dir`` on a read-only mount: one error line at start-up, before any training, exit 2."""
    ro = tmpfs(64, ro=True)
    d = tmp_path / "run"
    p = _train(d, f"checkpoint.dir={ro / 'ck'}", "trainer.max_steps=5")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr == (
        f"error: config key `checkpoint.dir`: {ro / 'ck'} is on a read-only filesystem; give a writable "
        "checkpoint.dir, or set checkpoint.every_n_steps=0 checkpoint.save_on_sigterm=false to train without saving\n"
    )
    assert "step " not in p.stdout and not (d / "metrics.jsonl").exists()


def test_a_full_disk_during_a_save_keeps_the_earlier_checkpoints(tmp_path: Path, tmpfs) -> None:
    """``checkpoint.dir`` on an 8 MiB tmpfs that holds one checkpoint (5.7 MB) but not two: the second save is one
    error line naming step_10.tmp, the bytes needed (the size of step_5) and free; exit 2; step_5 intact, the
    partial save removed; a launch with room resumes from step_5."""
    ck = tmpfs(8192) / "ck"
    d = tmp_path / "run"
    p = _train(d, f"checkpoint.dir={ck}", "trainer.max_steps=10")
    assert p.returncode == 2, p.stdout + p.stderr
    step5 = ck / "step_5"
    size = sum(f.stat().st_size for f in step5.iterdir())
    m = re.fullmatch(
        rf"error: cannot write {re.escape(str(ck / 'step_10.tmp'))}: No space left on device; needs {size:,} "
        r"bytes, ([\d,]+) free; the earlier checkpoints are intact \(newest step_5\): free space there or set "
        r"checkpoint.dir to a larger disk, and launch again to resume from it\n",
        p.stderr,
    )
    assert m, p.stderr
    assert int(m.group(1).replace(",", "")) < size
    assert sorted(os.listdir(ck)) == ["owner.lock", "step_5"]
    from dlrm.checkpoint import verify_checkpoint

    assert verify_checkpoint(str(step5)) is None
    subprocess.run(["mount", "-o", "remount,size=32m", str(ck.parent)], check=True)
    p = _train(d, f"checkpoint.dir={ck}", "trainer.max_steps=10")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"resumed from {step5} at step 5" in p.stdout


def test_a_full_run_directory_stops_the_run_and_a_resume_repairs_metrics(tmp_path: Path, tmpfs) -> None:
    """The run directory on a 48 KiB tmpfs: once metrics.jsonl cannot grow, one error line naming it and the
    record's bytes, exit 2, and the file ends with a whole record. A half-written last line (as a kill -9 in the
    middle of a write leaves) is cut off by the resume, which dlrm.report then reads."""
    from dlrm.report import main as report_main

    d = tmpfs(48) / "run"
    p = _train(d, f"checkpoint.dir={tmp_path / 'ck'}", "trainer.max_steps=300")
    assert p.returncode == 2, p.stdout + p.stderr
    m = re.fullmatch(
        rf"error: cannot write {re.escape(str(d / 'metrics.jsonl'))}: No space left on device; needs (\d+) bytes, "
        r"(\d+) free; free space there \(or give hydra.run.dir on a larger disk\) and launch again: the run resumes "
        r"from its newest checkpoint\n",
        p.stderr,
    )
    assert m and int(m.group(1)) > int(m.group(2)), p.stderr
    text = (d / "metrics.jsonl").read_bytes()
    assert text.endswith(b"\n") and all(json.loads(line) for line in text.splitlines())

    subprocess.run(["mount", "-o", "remount,size=4m", str(d.parent)], check=True)
    with open(d / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 9999, "loss": 0.5')  # what a run killed mid-write leaves
    newest = max(int(n[5:]) for n in os.listdir(tmp_path / "ck") if re.fullmatch(r"step_\d+", n))
    p = _train(d, f"checkpoint.dir={tmp_path / 'ck'}", f"trainer.max_steps={newest + 1}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (
        f"{d / 'metrics.jsonl'}: removed a half-written last record (26 bytes) left by a run that stopped while "
        "writing it"
    ) in p.stdout, p.stdout
    assert report_main([str(d), "--out", str(tmp_path / "r.png")]) == 0
    assert records(d)[-1]["step"] == newest + 1


def test_a_refused_launch_leaves_no_run_directory(tmp_path: Path) -> None:
    """A launch refused at start-up removes the run directory it made (Hydra had written .hydra/ there); one into an
    existing directory leaves it as it was."""
    d = tmp_path / "new"
    p = _train(d, "data.batch_size=-3")
    assert (p.returncode, p.stderr) == (2, "error: config key `data.batch_size`: must be positive or null\n")
    assert not d.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    p = _train(kept, "data.batch_size=-3")
    assert p.returncode == 2 and (kept / "notes.txt").read_text() == "mine"


def test_a_refused_launch_keeps_a_directory_another_run_owns(tmp_path: Path) -> None:
    """The clean-up of a refused launch spares a directory whose ``owner.lock`` names a run (one that started at
    the same moment and won it), or that holds a metrics record or checkpoints."""
    from dlrm.cli import remove_refused_run_dir

    made = {"owner.lock": '{"pid": 1}\n', "metrics.jsonl": '{"step": 1}\n', "checkpoints/step_1/x": ""}
    for name, text in made.items():
        d = tmp_path / name.split("/")[0].replace(".", "_")
        (d / ".hydra").mkdir(parents=True)
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
        assert not remove_refused_run_dir(str(d)) and (d / name).is_file()
    d = tmp_path / "refused"
    (d / ".hydra").mkdir(parents=True)
    (d / "owner.lock").write_text("")  # released by the refused launch itself
    (d / "train.log").write_text("error: ...\n")
    assert remove_refused_run_dir(str(d)) and not d.exists()
