"""Loader throughput of ``data=criteo_binary``: samples/s per process, 1-hot, materialized multi-hot and
on-the-fly multi-hot (MLPerf sizes, 214 ids per sample), on a generated dataset in the binary format.

    python -m bench.loader --rows 10000000 --dir /tmp/dlrm_bench_loader

The dataset (``--rows`` training rows in two days plus a small evaluation day, uniform ids over the MLPerf
tables capped at ``--row-cap`` rows, materialized multi-hot and expansion tables) is generated once under
``--dir`` and reused. Each mode iterates ``BinarySplit.train_batches`` (one process, world size 1, ``--batch`` rows
per batch, KJTs built as the trainer gets them) for ``--seconds`` after ``--warmup`` batches, without and with
the background prefetch thread. Nothing is trained: this is the input side only. ``samples_per_s`` is wall
clock; ``samples_per_cpu_s`` divides by the process's CPU time (all its threads), which other jobs on a shared
host disturb less (it still counts time lost to their memory traffic).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import torch

from bench import ids as bench_ids
from dlrm.config import MLPERF_MULTI_HOT_SIZES, ModelConfig
from dlrm.data import binary as B
from dlrm.data import binary_format as BF
from dlrm.data import preprocess as P
from dlrm.data import train_plan
from dlrm.data.source import TrainRequest
from dlrm.model import FEATURE_NAMES


def generate(root: str, rows: int, row_cap: int, ids_dist: str = "uniform", eval_day_rows: int = 65536) -> None:
    """Write the dataset under ``root`` unless one of these rows, tables and ``ids_dist`` is there: ``rows``
    training rows in two days and an evaluation day of ``eval_day_rows`` (its first half validates); 1-hot ids
    uniform over each table's rows, or skewed (``bench.ids``: ``criteo``, ``criteo_kaggle``; recorded in
    ``ids.txt``; a dataset without it has uniform ids)."""
    table_rows = ModelConfig(row_cap=row_cap).table_rows  # the MLPerf tables
    meta_path = os.path.join(root, BF.META)
    dist_path = os.path.join(root, "ids.txt")
    if os.path.isfile(meta_path):
        meta = json.load(open(meta_path))
        made = open(dist_path).read().strip() if os.path.isfile(dist_path) else "uniform"
        if (
            sum(d["rows"] for d in meta["days"][:-1]) == rows
            and meta["days"][-1]["rows"] == eval_day_rows
            and meta["table_rows"] == table_rows
            and (meta.get("multi_hot") or {}).get("materialized")
            and made == ids_dist
        ):
            return
    if os.path.isfile(dist_path):
        os.remove(dist_path)  # written again last, once the new dataset is complete
    t0 = time.perf_counter()
    g = np.random.default_rng(0)
    sampler = None if ids_dist == "uniform" else bench_ids.PowerLawIds(table_rows, bench_ids.exponents(ids_dist, 26))
    g_ids = torch.Generator().manual_seed(0)
    days = []
    for n in (rows // 2, rows - rows // 2, eval_day_rows):
        dense = np.log1p(g.exponential(20.0, (n, 13))).astype(np.float32)
        ids = np.empty((n, 26), dtype=np.int32)
        for t, r in enumerate(table_rows):
            ids[:, t] = g.integers(0, r, n) if sampler is None else sampler.draw(t, n, g_ids).numpy()
        days.append((dense, ids, (g.random(n) < 0.03).astype(np.int32)))
    BF.write_dataset(root, days, table_rows)
    del days
    P.multihot(out=root, sizes=MLPERF_MULTI_HOT_SIZES, seed=0, materialize=True, workers=1)
    with open(dist_path, "w", encoding="utf-8") as f:
        f.write(ids_dist + "\n")
    print(f"generated {root} in {time.perf_counter() - t0:.0f}s", flush=True)


def measure(root: str, mode: str, batch: int, seconds: float, warmup: int, prefetch: int) -> dict:
    meta = BF.read_dataset_meta(root)
    train, _, _ = B.load_splits(
        root, meta["table_rows"], None, multi_hot_files=mode == "materialized", prefetch=prefetch, pin_memory=False
    )
    mh = None if mode == "one_hot" else B.make_multi_hot(root, meta, mode, MLPERF_MULTI_HOT_SIZES, 0)
    plan = train_plan(len(train), batch, 1)
    it = train.train_batches(
        TrainRequest(plan, rank=0, epochs=1, max_steps=None, feature_names=FEATURE_NAMES, multi_hot=mh)
    )
    ids = 0
    for _ in range(warmup):
        next(it)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    for b in it:
        n += b.labels.shape[0]
        ids += b.sparse_features.values().numel()
        if time.perf_counter() - t0 >= seconds:
            break
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if hasattr(it, "close"):
        it.close()
    return {
        "mode": mode,
        "prefetch": prefetch,
        "batch": batch,
        "samples": n,
        "seconds": round(dt, 3),
        "samples_per_s": round(n / dt),
        "ids_per_sample": ids // max(n, 1),
        "cpu_seconds": round(cpu, 3),
        "samples_per_cpu_s": round(n / cpu),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dir", default="/tmp/dlrm_bench_loader")
    ap.add_argument("--row-cap", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="one_hot,materialized,on_the_fly")
    ap.add_argument(
        "--eval-day-rows", type=int, default=65536, help="rows of the evaluation day (its first half validates)"
    )
    args = ap.parse_args()
    generate(args.dir, args.rows, args.row_cap, eval_day_rows=args.eval_day_rows)
    print(
        f"host {platform.node()} {os.cpu_count()} cpus, numpy {np.__version__}; {args.rows:,} train rows, batch "
        f"{args.batch}",
        flush=True,
    )
    for mode in args.modes.split(","):
        for prefetch in (0, 2):
            print(json.dumps(measure(args.dir, mode, args.batch, args.seconds, args.warmup, prefetch)), flush=True)


if __name__ == "__main__":
    main()
