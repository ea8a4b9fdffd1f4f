"""Training speed with and without periodic checkpoints (async and synchronous), 1 process (or torchrun)::

    .venv/bin/python -m bench.checkpoint_overhead [--steps 200] [--every 50] [--modes none,async,sync] [overrides ...]
    # GPU, DLRM-v2 tables capped at 4 M rows (12.4 GB of weights):
    python -m bench.checkpoint_overhead --steps 120 --every 40 device=cuda model=dlrm_v2 model.row_cap=4000000 \\
        data.multi_hot=false data.batch_size=8192 data.num_train_samples=1048576 data.num_val_samples=8192

Runs the same training once per mode in this process (``none``: no checkpoints; ``async``:
``checkpoint.async_save=true`` every ``--every`` steps; ``sync``: ``async_save=false`` every ``--every`` steps)
and prints samples/s of the whole fit loop, saves included (the last async save is waited for), and the mean
time the training loop spent in each save (``Checkpointer.save_seconds``; async: staging; the first save of a run
also allocates and pins the host buffers). Results go in docs/performance.md with the hardware they were
measured on.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from typing import List, Tuple

import torch


def run(steps: int, every: int, async_save: bool, extra: list) -> Tuple[float, List[float]]:
    """Returns (samples/s, seconds spent in each Checkpointer.save call)."""
    from dlrm.config import compose
    from dlrm.trainer import Trainer

    with tempfile.TemporaryDirectory() as d:
        cfg = compose(
            [
                f"trainer.max_steps={steps}",
                f"checkpoint.every_n_steps={every}",
                f"checkpoint.async_save={str(async_save).lower()}",
                "eval.every_n_steps=null",
                "eval.at_end=false",
                "data.num_test_samples=0",
                "logger.log_every_n_steps=50",
                "checkpoint.resume=none",
                f"checkpoint.dir={d}/ck",
                *extra,
            ]
        )
        t = Trainer(cfg, d)
        t.setup()
        t0 = time.perf_counter()
        t.fit()
        t.close()  # includes waiting for the last async save
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        return steps * t.global_batch / dt, list(t.ckpt.save_seconds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--modes", default="none,async,sync", help="comma-separated subset of none,async,sync")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    main_rank = int(os.environ.get("RANK", "0")) == 0
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else (platform.processor() or platform.machine())
    if main_rank:
        print(f"host: {dev}, {os.cpu_count()} cores, torch {torch.__version__}; overrides: {' '.join(a.overrides)}")
    modes = {"none": (0, True), "async": (a.every, True), "sync": (a.every, False)}
    res = {}
    for name in a.modes.split(","):
        every, asy = modes[name]
        res[name] = run(a.steps, every, asy, a.overrides)
        if not main_rank:
            continue
        v, saves = res[name]
        line = f"checkpoints {name:>5} (every {every or '-'} steps): {v:,.0f} samples/s"
        if "none" in res and name != "none":
            line += f" ({100 * (v / res['none'][0] - 1):+.1f}% vs none)"
        if saves:
            later = saves[1:] or saves
            line += (
                f"; in save(): first {saves[0]:.2f}s, later mean {sum(later) / len(later):.3f}s ({len(saves)} saves)"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
