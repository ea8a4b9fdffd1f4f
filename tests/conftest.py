"""Shared test helpers: a gloo multi-process runner and paths to the real Criteo samples."""

from __future__ import annotations

import json
import os
import pickle
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
# real Criteo rows (Criteo's, CC BY-NC-SA 4.0: never committed), from $DLRM_CRITEO_DIR; unset, their tests skip
CRITEO_DIR_ENV = "DLRM_CRITEO_DIR"
CRITEO_DIR = os.environ.get(CRITEO_DIR_ENV)
KAGGLE_SAMPLE = Path(CRITEO_DIR or "") / "kaggle_train_head10k.tsv"
TB_SAMPLE = Path(CRITEO_DIR or "") / "terabyte_day0_head1000.tsv"
# a short synthetic run of the small model on one GPU, no evaluation or checkpoint resume (``Trainer`` tests)
CUDA_SMALL_RUN = [
    "device=cuda",
    "model=dlrm_v2_small",
    "data.batch_size=1024",
    "eval.every_n_steps=null",
    "eval.at_end=false",
    "checkpoint.resume=none",
]


def _missing_sample(path: Path, what: str) -> str:
    where = f" in {path.parent}" if CRITEO_DIR else ""
    return f"needs {path.name} ({what}){where}; set {CRITEO_DIR_ENV} to the folder that holds it"


needs_kaggle = pytest.mark.skipif(
    not (CRITEO_DIR and KAGGLE_SAMPLE.is_file()),
    reason=_missing_sample(KAGGLE_SAMPLE, "the first 10,000 lines of Criteo Kaggle train.txt"),
)
needs_tb = pytest.mark.skipif(
    not (CRITEO_DIR and TB_SAMPLE.is_file()),
    reason=_missing_sample(TB_SAMPLE, "the first 1,000 lines of Criteo 1TB day_0"),
)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """``@pytest.mark.gpu`` tests skip where CUDA is absent (run them on a GPU host with ``pytest -m gpu``)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu); run on a GPU host: pytest -m gpu")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _worker(rank: int, world: int, init: str, fn: Callable, args: tuple, q: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        # plain pickle copies tensor data; multiprocessing's own pickler would share it through memory that
        # vanishes when this process exits before the parent reads the queue
        q.put((rank, "ok", pickle.dumps(fn(rank, world, *args))))
    except BaseException:  # report to the parent instead of hanging it
        q.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo(world: int, fn: Callable, *args: Any, timeout: float = 300) -> List[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes; return the results ordered by rank."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # a file store: a free port picked here could be taken by another process before the workers bind it
    store_dir = tempfile.mkdtemp(prefix="gloo_")
    init = "file://" + os.path.join(store_dir, "store")
    procs = [ctx.Process(target=_worker, args=(r, world, init, fn, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict = {}
    try:
        for _ in range(world):
            rank, status, value = q.get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        shutil.rmtree(store_dir, ignore_errors=True)
    return [out[r] for r in range(world)]


def dense_param_count(m: Any) -> int:
    """The dense parameters of ``ModelConfig`` ``m``, counted by hand: each MLP layer's weight [out, in] and bias
    [out]; per DCN layer V [F, r], W [r, F] and bias [F], with F = (tables + 1) x embedding_dim."""

    def mlp(n_in: int, sizes: List[int]) -> int:
        return sum(a * b + b for a, b in zip([n_in, *sizes[:-1]], sizes))

    f = (len(m.table_rows) + 1) * m.embedding_dim
    return (
        mlp(13, list(m.dense_arch_layer_sizes))
        + m.dcn_num_layers * (2 * f * m.dcn_low_rank_dim + f)
        + mlp(f, list(m.over_arch_layer_sizes))
    )


def output_lines(proc: subprocess.Popen, timeout: float) -> Iterator[str]:
    """Yield the lines of ``proc``'s text stdout until it ends; kill ``proc`` and fail the test if it has not ended
    within ``timeout`` seconds (a plain read of the pipe would block the suite on a process that never stops)."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            pytest.fail(f"{proc.args!r}: output still open after {timeout:.0f} s; killed")
        if line is None:
            return
        yield line


# what a make run of the suite (`make test STACK=gpu`) hands down to a make the tests start: MAKEFLAGS carries its
# command-line variables, and the Makefile's `?=` variables read the environment
MAKE_ENV_DROP = (
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
    "MAKEOVERRIDES",
    "STACK",
    "VENV",
    "TORCH_PIP_ARGS",
    "TORCH_INDEX_URL",
)


def make_env() -> Dict[str, str]:
    """The environment for a ``make`` the tests run: this one, less what an enclosing make passes down."""
    return {k: v for k, v in os.environ.items() if k not in MAKE_ENV_DROP}


def python() -> str:
    return sys.executable


def bench_smoke_two_processes(module: str, out: Path, result_file: str) -> dict:
    """Run ``python -m bench.<module> --smoke --out <out>`` under torchrun in 2 gloo processes; assert it exits 0
    and return the JSON it wrote to ``out / result_file``."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(
        [
            str(bin_dir / "torchrun"),
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            f"bench.{module}",
            "--smoke",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return json.loads((out / result_file).read_text())
