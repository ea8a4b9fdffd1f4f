"""Floors of the training step: each part of the MLPerf DLRM-v2 step timed alone, or counted in bytes, to set beside
the step's profile (``bench.throughput --profile``; docs/performance.md, "Where the time goes"). Run from the
repository root::

    python -m bench.roofline --batch 32768      # a GPU: the MLPerf model, tables capped at 4 M rows
    python -m bench.roofline --smoke            # CPU, tiny model: the same code paths, numbers meaningless

Parts:
  products  every matrix product of the dense side (bottom MLP, DCN, top MLP) at ``--batch`` rows: forward,
            input gradient and weight gradient of each layer, bf16, each timed alone (cuBLAS on a GPU), with its
            TFLOP/s; and one square 8192 product, the rate the GPU reaches at its best.
  copy      a 1 GiB device-to-device copy: the HBM bandwidth (bytes read plus written per second) of a streaming
            kernel.
  dcn       the DCN's cross layers alone as ``perf=fast`` runs them (:class:`dlrm.model.AutocastLowRankCrossNet`
            under bf16 autocast, compiled on a GPU), forward and backward to ``x_0``; the difference to the sum of
            its products' times is its elementwise work.
  tables    the row bytes the TBE moves in a step of the step benchmark's batches (``--ids``, as
            ``bench.throughput --ids``; ids and offsets aside), counted, not timed: with uniform ids a table of ``r``
            rows with ``h`` ids per sample sees ``r (1 - (1 - 1/r)^(h B))`` distinct rows in a batch of ``B``; with
            skewed ids, ``bench.ids.expected_rows`` (the power law's distinct 1-hot ids, each with its ``h - 1``
            MLPerf multi-hot ids); the backward with element-wise Adagrad
            reads and writes each distinct row's fp32 weights and fp32 state and reads one bf16 gradient row per
            id; the forward reads each distinct row once from HBM (repeats of a row hit the L2 cache) and writes
            the bf16 pooled output. Divide by the TBE kernels' times in the profile for their bandwidth.

Times are the mean of ``--reps`` calls after 3 warm-up calls (CUDA events on a GPU). Output: a table, then the
same figures as one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

from bench import ids as bench_ids
from dlrm.config import NUM_DENSE_FEATURES, ModelConfig, compose, to_config
from dlrm.model import AutocastLowRankCrossNet

SMOKE = ["model=dlrm_v2_small", "model.row_cap=1000"]
MLPERF = ["model=dlrm_v2", "model.row_cap=4000000"]  # bench.throughput's model


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Mean ms per call of ``fn`` over ``reps`` calls, after 3 untimed ones."""
    for _ in range(3):
        fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / reps


def interaction_width(m: ModelConfig) -> int:
    """Width of the DCN's input ``x_0``: the bottom MLP's output beside one pooled embedding per table."""
    return m.embedding_dim * (len(m.num_embeddings_per_feature) + 1)


def layers(m: ModelConfig) -> List[Tuple[str, int, int]]:
    """``(name, in, out)`` of every linear layer of ``DLRM_DCN`` for ``m``, the DCN's as its two low-rank factors."""
    d = interaction_width(m)
    out: List[Tuple[str, int, int]] = []
    widths = [NUM_DENSE_FEATURES, *m.dense_arch_layer_sizes]
    out += [(f"dense_arch.{i}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
    for i in range(m.dcn_num_layers):
        out += [(f"dcn.{i}.V", d, m.dcn_low_rank_dim), (f"dcn.{i}.W", m.dcn_low_rank_dim, d)]
    widths = [d, *m.over_arch_layer_sizes]
    out += [(f"over_arch.{i}", a, b) for i, (a, b) in enumerate(zip(widths, widths[1:]))]
    return out


def products(m: ModelConfig, batch: int, device: torch.device, reps: int) -> Dict[str, Any]:
    """Each layer's three products at ``batch`` rows, bf16: forward ``x W^T``, input gradient ``dy W``, weight
    gradient ``dy^T x``; ms and TFLOP/s each, and the totals."""
    bf16 = torch.bfloat16
    rows = []
    for name, k, n in layers(m):
        x = torch.randn(batch, k, device=device, dtype=bf16)
        w = torch.randn(n, k, device=device, dtype=bf16)
        dy = torch.randn(batch, n, device=device, dtype=bf16)
        calls = (lambda x=x, w=w: x @ w.t(), lambda dy=dy, w=w: dy @ w, lambda dy=dy, x=x: dy.t() @ x)
        ms = [timed(f, device, reps) for f in calls]
        rows.append({"layer": name, "in": k, "out": n, "ms": ms, "tflops": [2 * batch * k * n / t / 1e9 for t in ms]})
    total_ms = sum(sum(r["ms"]) for r in rows)
    flop = sum(6 * batch * r["in"] * r["out"] for r in rows)
    side = 8192 if device.type == "cuda" else 256
    a = torch.randn(side, side, device=device, dtype=bf16)
    square = timed(lambda: a @ a, device, reps)
    return {
        "layers": rows,
        "total_ms": total_ms,
        "tflop": flop / 1e12,
        "tflops": flop / total_ms / 1e9,
        "square": {"side": side, "ms": square, "tflops": 2 * side**3 / square / 1e9},
    }


def copy_bandwidth(device: torch.device, reps: int) -> Dict[str, float]:
    """GB/s (read plus written) of a device-to-device copy of 1 GiB (4 MiB on a CPU)."""
    n = 2**28 if device.type == "cuda" else 2**20
    src = torch.empty(n, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), device, reps)
    return {"bytes": 2 * 4 * n, "ms": ms, "gb_per_s": 2 * 4 * n / ms / 1e6}


def dcn(m: ModelConfig, batch: int, device: torch.device, reps: int) -> Dict[str, Any]:
    """The cross layers alone, forward and backward (to ``x_0`` and the parameters), bf16 autocast, compiled on a
    GPU."""
    from torchrec.modules.crossnet import LowRankCrossNet

    d = interaction_width(m)
    net = LowRankCrossNet(in_features=d, num_layers=m.dcn_num_layers, low_rank=m.dcn_low_rank_dim).to(device)
    net.__class__ = AutocastLowRankCrossNet  # as dlrm.model.build_model does for perf.dcn_residual_dtype=autocast
    fn = torch.compile(net) if device.type == "cuda" else net
    x0 = torch.randn(batch, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(batch, d, device=device, dtype=torch.bfloat16)
    params = list(net.parameters())

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = fn(x0)
        torch.autograd.grad(out, [x0, *params], grad)

    return {"in_features": d, "layers": m.dcn_num_layers, "ms": timed(step, device, reps)}


def tables(m: ModelConfig, batch: int, ids_dist: str = "uniform") -> Dict[str, float]:
    """Bytes the TBE reads and writes in one step of ``ids_dist`` ids (``bench.ids.DISTRIBUTIONS``; see the module
    docstring)."""
    dim = m.embedding_dim
    hot = m.multi_hot_sizes
    ids = batch * sum(hot)
    s = [None] * len(hot) if ids_dist == "uniform" else bench_ids.exponents(ids_dist, len(hot))
    rows = sum(bench_ids.expected_rows(r, e, h, batch) for r, e, h in zip(m.table_rows, s, hot))
    row = 4 * dim  # fp32 weights, and fp32 element-wise Adagrad state
    backward = rows * 2 * (row + row) + ids * 2 * dim
    forward = rows * row + batch * len(hot) * 2 * dim
    return {"ids": ids, "distinct_rows": rows, "backward_bytes": backward, "forward_bytes": forward}


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32768, help="rows per step (per GPU)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, batch 64")
    p.add_argument("--ids", choices=bench_ids.DISTRIBUTIONS, default="uniform", help="id distribution (bench/ids.py)")
    args = p.parse_args(argv)
    smoke = args.smoke
    device = torch.device("cpu" if smoke or not torch.cuda.is_available() else "cuda")
    batch = 64 if smoke else args.batch
    m = to_config(compose(SMOKE if smoke else MLPERF)).model
    out: Dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    out["batch"] = batch
    out["products"] = products(m, batch, device, args.reps)
    out["copy"] = copy_bandwidth(device, args.reps)
    out["dcn"] = dcn(m, batch, device, args.reps)
    out["dcn"]["products_ms"] = sum(sum(r["ms"]) for r in out["products"]["layers"] if r["layer"].startswith("dcn."))
    out["tables"] = tables(m, batch, args.ids)
    out["ids"] = args.ids

    pr = out["products"]
    print(f"# roofline: {out['device']}, batch {batch}, torch {torch.__version__}")
    print("| layer | in | out | forward ms | input grad ms | weight grad ms | TFLOP/s (each) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in pr["layers"]:
        ms, tf = r["ms"], r["tflops"]
        print(f"| {r['layer']} | {r['in']} | {r['out']} | " + " | ".join(f"{t:.3f}" for t in ms) + " | "
              + " / ".join(f"{t:.0f}" for t in tf) + " |")  # fmt: skip
    sq = pr["square"]
    print(f"products: {pr['total_ms']:.3f} ms for {pr['tflop']:.3f} TFLOP ({pr['tflops']:.0f} TFLOP/s); "
          f"square {sq['side']}: {sq['tflops']:.0f} TFLOP/s")  # fmt: skip
    print(f"copy: {out['copy']['gb_per_s']:.0f} GB/s")
    d = out["dcn"]
    print(f"dcn: {d['layers']} layers of {d['in_features']}, forward and backward {d['ms']:.3f} ms; "
          f"its products alone {d['products_ms']:.3f} ms")  # fmt: skip
    t = out["tables"]
    print(f"tables ({args.ids} ids): {t['ids'] / 1e6:.3f} M ids, {t['distinct_rows'] / 1e6:.3f} M distinct rows; "
          f"backward {t['backward_bytes'] / 1e9:.2f} GB, forward {t['forward_bytes'] / 1e9:.2f} GB")  # fmt: skip
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
