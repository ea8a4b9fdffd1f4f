"""``train.py`` itself against the step benchmark, per data source, in one call. Run from the repository root::

    # 1x H200: MLPerf DLRM-v2 capped at 4 M rows, perf=fast, batch 32768, a generated 10 M-row binary dataset
    python -m bench.e2e --rows 10000000 --dir /tmp/dlrm_e2e
    # CPU smoke test (tiny model and data; numbers meaningless)
    .venv/bin/python -m bench.e2e --smoke --dir /tmp/dlrm_e2e_smoke

What runs: the dataset is generated once under ``--dir`` (``bench.loader.generate``: two training days, an
evaluation day, the materialized MLPerf multi-hot and its expansion tables) and reused. Then, each in its own
process: ``bench.throughput --variants <variant>`` (the step on random batches already on the device), and
``train.py`` on every ``--sources``: ``synthetic`` (``data.num_train_samples=--rows``), ``binary_materialized``,
``binary_on_the_fly`` (``data=criteo_binary`` with ``data.multi_hot_source``) and ``tsv`` (the first
``--tsv-rows`` rows written as a Criteo TSV; ``data=criteo_tsv``). ``--ids criteo`` draws the step benchmark's
ids and the generated dataset's 1-hot ids from the power law fitted to Criteo 1TB (``bench/ids.py``); the
``synthetic`` source draws its own, uniform. A trainer's figure is the median samples/s
of its logged windows after the first (the first holds the compile), with its median ``input_ms`` (host time the
step waited for batches); no validation runs during the timed steps.

Output: a table of samples/s per source beside the step benchmark's and their ratio, and ``e2e.json`` /
``e2e.md`` under ``--out`` (default ``--dir``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List

import numpy as np

from bench import ids as bench_ids
from bench.loader import generate
from bench.throughput import BASE, SMOKE_BASE

GPU_MODEL = [*BASE, "sharding=table_wise"]  # the step benchmark's model, as it runs with --sharding table_wise
SMOKE_MODEL = [*SMOKE_BASE, "device=cpu"]
SOURCES = ("synthetic", "binary_materialized", "binary_on_the_fly", "tsv")


def write_tsv(root: str, path: str, rows: int) -> None:
    """The first ``rows`` training rows of the generated dataset as a Criteo TSV (counts as integers, ids as
    hex: ``int(hex, 16) % rows`` gives the id back)."""
    if os.path.isfile(path):
        return
    dense = np.load(os.path.join(root, "day_0_dense.npy"), mmap_mode="r")[:rows]
    ids = np.load(os.path.join(root, "day_0_sparse.npy"), mmap_mode="r")[:rows]
    labels = np.load(os.path.join(root, "day_0_labels.npy"), mmap_mode="r")[:rows, 0]
    counts = np.expm1(np.asarray(dense)).round().astype(np.int64)
    with open(path + ".partial", "w", encoding="utf-8") as f:
        for i in range(len(labels)):
            f.write(
                "\t".join([str(int(labels[i])), *map(str, counts[i]), *(format(int(x), "x") for x in ids[i])]) + "\n"
            )
    os.replace(path + ".partial", path)


def _source_overrides(source: str, args: argparse.Namespace) -> List[str]:
    if source == "synthetic":
        return [
            "data=synthetic",
            f"data.num_train_samples={args.rows}",
            "data.num_val_samples=65536",
            "data.num_test_samples=0",
        ]
    if source == "tsv":
        return ["data=criteo_tsv", f"data.train_path={args.tsv}"]
    mode = source.split("_", 1)[1]
    return ["data=criteo_binary", f"data.dataset_dir={args.dir}", f"data.multi_hot_source={mode}"]


def run_trainer(source: str, args: argparse.Namespace) -> Dict[str, Any]:
    run_dir = os.path.join(args.out, f"train_{source}")
    cmd = [
        sys.executable,
        "train.py",
        f"hydra.run.dir={run_dir}",
        *args.model,
        f"perf={args.perf}",
        f"pipeline={args.pipeline}",
        f"data.batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        "trainer.epochs=1000",
        "eval.every_n_steps=null",
        "eval.at_end=false",
        f"logger.log_every_n_steps={args.log_every}",
        "logger.train_auc=false",
        "checkpoint.resume=none",
        *_source_overrides(source, args),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        return {"source": source, "error": (p.stdout + p.stderr)[-2000:]}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if '"samples_per_s"' in line]
    steady = recs[1:] or recs
    return {
        "source": source,
        "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
        "step_ms": statistics.median(r["step_ms"] for r in steady),
        "input_ms": statistics.median(r.get("input_ms", 0.0) for r in steady),
        "windows": len(steady),
    }


def run_step_bench(args: argparse.Namespace) -> Dict[str, Any]:
    out = os.path.join(args.out, "step")
    cmd = [
        sys.executable,
        "-m",
        "bench.throughput",
        "--out",
        out,
        "--variants",
        args.variant,
        "--batch-sizes",
        str(args.batch),
        "--sharding",
        "table_wise",
        "--ids",
        args.ids,
    ] + (["--smoke"] if args.smoke else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        return {"error": (p.stdout + p.stderr)[-2000:]}
    with open(os.path.join(out, "throughput.json"), encoding="utf-8") as f:
        row = next(r for r in json.load(f)["results"] if r["config"] == args.variant)
    return {"samples_per_s": row["samples_per_s"], "step_ms": row["ms_median"]}


def main(argv: List[str] | None = None) -> List[Dict[str, Any]]:
    ap = argparse.ArgumentParser(
        prog="python -m bench.e2e",
        description="train.py itself against the step benchmark, per data source, in one call (see bench/e2e.py's "
        "docstring for what runs).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--rows", type=int, default=10_000_000, help="training rows of the generated dataset")
    ap.add_argument(
        "--tsv-rows",
        type=int,
        default=1_048_576,
        help="rows of the TSV source (parsed at start-up; 80%% train, and each epoch ends in a partial batch)",
    )
    ap.add_argument("--dir", default="/tmp/dlrm_e2e", help="where the generated dataset is kept and reused")
    ap.add_argument("--out", default=None, help="where results and run directories go (default: --dir)")
    ap.add_argument("--batch", type=int, default=32768, help="per-GPU batch of every run")
    ap.add_argument("--steps", type=int, default=200, help="training steps of each train.py run")
    ap.add_argument("--log-every", type=int, default=20, help="steps per logged window (the figure is their median)")
    ap.add_argument("--perf", default="fast", help="the trainer's perf preset")
    ap.add_argument(
        "--pipeline", default="sparse_dist", help="the trainer's pipeline (graphed: pair --variant fast_graphed)"
    )
    ap.add_argument("--variant", default="fast", help="the step benchmark's variant to compare with")
    ap.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES)
    ap.add_argument(
        "--ids",
        choices=bench_ids.DISTRIBUTIONS,
        default="uniform",
        help="ids of the step benchmark and of the generated dataset (bench/ids.py; data=synthetic draws its own)",
    )
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed to each run")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (tests); numbers are meaningless")
    args = ap.parse_args(argv)
    args.model = GPU_MODEL
    if args.smoke:
        args.rows, args.tsv_rows, args.batch, args.steps, args.log_every = 4096, 2048, 32, 12, 4  # --smoke batch
        args.perf, args.variant, args.model = "fp32", "fp32", SMOKE_MODEL
    args.out = args.out or args.dir
    os.makedirs(args.out, exist_ok=True)
    row_cap = 1000 if args.smoke else 4_000_000
    generate(args.dir, args.rows, row_cap, args.ids)
    args.tsv = os.path.join(args.dir, f"train_{args.tsv_rows}_of_{args.rows}_cap{row_cap}.tsv")
    if "tsv" in args.sources:
        if args.tsv_rows > args.rows // 2:
            print(
                f"error: --tsv-rows {args.tsv_rows} exceeds the {args.rows // 2} rows of the generated day_0 "
                "(--rows / 2); raise --rows or lower --tsv-rows",
                file=sys.stderr,
            )
            raise SystemExit(2)
        write_tsv(args.dir, args.tsv, args.tsv_rows)
    step = run_step_bench(args)
    rows = []
    for source in args.sources:
        r = run_trainer(source, args)
        if "samples_per_s" in r and "samples_per_s" in step:
            r["of_step_bench"] = r["samples_per_s"] / step["samples_per_s"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    lines = [
        f"# bench.e2e: {datetime.datetime.now().isoformat(timespec='seconds')}, batch {args.batch}, "
        f"perf={args.perf}, {args.steps} steps",
        "",
        f"step benchmark ({args.variant}): {step.get('samples_per_s', float('nan')):,.0f} samples/s, "
        f"{step.get('step_ms', float('nan')):.2f} ms/step",
        "",
        "| source | train.py samples/s | ms/step | input ms/step | of the step benchmark |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['source']} | failed | | | |")
        else:
            ratio = f"{100 * r['of_step_bench']:.0f}%" if "of_step_bench" in r else ""
            lines.append(
                f"| {r['source']} | {r['samples_per_s']:,.0f} | {r['step_ms']:.2f} | {r['input_ms']:.2f} | {ratio} |"
            )
    md = "\n".join(lines) + "\n"
    print(md)
    with open(os.path.join(args.out, "e2e.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"args": {k: v for k, v in vars(args).items()}, "step_bench": step, "results": rows},
            f,
            indent=1,
            default=str,
        )
    with open(os.path.join(args.out, "e2e.md"), "w", encoding="utf-8") as f:
        f.write(md)
    return rows


if __name__ == "__main__":
    main()
