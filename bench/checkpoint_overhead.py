"""Training speed with and without periodic checkpoints (async and synchronous), 1 process::

    .venv/bin/python bench/checkpoint_overhead.py [--steps 200] [--every 50] [overrides ...]

Runs the same training three times in this process (no checkpoints; ``checkpoint.async_save=true`` every
``--every`` steps; ``async_save=false`` every ``--every`` steps) and prints samples/s of the whole fit loop,
saves included. Results go in docs/benchmarks.md with the hardware they were measured on.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere


def run(steps: int, every: int, async_save: bool, extra: list) -> float:
    from dlrm.config import compose
    from dlrm.trainer import Trainer

    with tempfile.TemporaryDirectory() as d:
        cfg = compose([f"trainer.max_steps={steps}", f"checkpoint.every_n_steps={every}",
                       f"checkpoint.async_save={str(async_save).lower()}", "eval.every_n_steps=null",
                       "eval.at_end=false", "data.num_test_samples=0", "logger.log_every_n_steps=50",
                       "checkpoint.resume=none", *extra])
        t = Trainer(cfg, d)
        t.setup()
        t0 = time.perf_counter()
        t.fit()
        t.close()  # includes waiting for the last async save
        dt = time.perf_counter() - t0
        return steps * t.global_batch / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    res = {name: run(a.steps, every, asy, a.overrides)
           for name, every, asy in (("none", 0, True), ("async", a.every, True), ("sync", a.every, False))}
    for name, v in res.items():
        print(f"checkpoints {name:>5} (every {a.every if name != 'none' else '-'} steps): {v:,.0f} samples/s "
              f"({100 * (1 - v / res['none']):+.1f}% slower than none)" if name != "none" else
              f"checkpoints  none: {v:,.0f} samples/s")


if __name__ == "__main__":
    main()
