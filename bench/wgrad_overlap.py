"""How much of the dense weight-gradient work could hide behind the TBE backward (the ceiling of "async wgrad"),
on one GPU, with the MLPerf DLRM-v2 shapes::

    python -m bench.wgrad_overlap --batch-sizes 8192 32768

In ``pipeline=graphed`` the step's kernels run on one stream in autograd's order: the TBE backward (with its fused
Adagrad) starts only once the whole compiled dense backward, weight gradients included, has run, because every
DCN layer multiplies by ``x0`` and so the pooled-embedding gradient is complete only at the end. Splitting the
weight gradients out of the dense backward would let them run on a second stream beside the TBE backward. This
bench times the two halves that such a split would overlap, alone and on two streams at once, outside the
trainer:

- ``tbe``: FBGEMM's TBE forward then backward, 26 tables of dim 128 (MLPerf cardinalities capped at
  ``--row-cap``), fp32 weights, bf16 pooled embeddings, element-wise Adagrad (``EXACT_ADAGRAD``, lr 0.004, eps
  1e-8) fused into the backward, the MLPerf multi-hot sizes (214 ids per sample), uniform ids;
- ``wgrad``: the bf16 weight-gradient products of the dense side at that batch (``grad_out^T @ input`` for each
  layer of the bottom MLP 13-512-256-128, the DCN's 3 low-rank layers 3456-512-3456 and the top MLP
  3456-1024-1024-512-256-1);
- ``both``: ``wgrad`` on a second stream once the TBE forward is done, beside the TBE backward.

Each is captured as a CUDA graph (no host time in the figures) and replayed; the median of ``--repeats`` timings
of ``--steps`` replays is printed in ms per step, with ``saved = tbe + wgrad - both``: the most that overlapping
the two could take off a step (the real split would also add work: the dense backward's pieces saved and read
again).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Callable, Dict, List, Tuple

import torch

from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS

DIM = 128
DENSE_IN = 13
BOTTOM = [512, 256, 128]
DCN_LAYERS, DCN_RANK = 3, 512
TOP = [1024, 1024, 512, 256, 1]


def wgrad_shapes() -> List[Tuple[int, int]]:
    """(out_features, in_features) of every weight whose gradient the dense backward computes."""
    shapes, d = [], DENSE_IN
    for n in BOTTOM:
        shapes.append((n, d))
        d = n
    x0 = (len(MLPERF_NUM_EMBEDDINGS) + 1) * DIM  # 3456: the interaction's input, the DCN's width
    shapes += [(DCN_RANK, x0), (x0, DCN_RANK)] * DCN_LAYERS
    d = x0
    for n in TOP:
        shapes.append((n, d))
        d = n
    return shapes


def _tbe(batch: int, row_cap: int, device: torch.device) -> Callable[[], torch.Tensor]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    rows = [min(r, row_cap) for r in MLPERF_NUM_EMBEDDINGS]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, DIM, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for r in rows],
        optimizer=EmbOptimType.EXACT_ADAGRAD,
        learning_rate=0.004,
        eps=1e-8,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.BF16,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )
    gen = torch.Generator(device=device).manual_seed(0)
    ids, lengths = [], []
    for r, m in zip(rows, MLPERF_MULTI_HOT_SIZES):
        ids.append(torch.randint(0, r, (batch * m,), device=device, generator=gen))
        lengths.append(torch.full((batch,), m, device=device, dtype=torch.int64))
    indices = torch.cat(ids)
    offsets = torch.cat([torch.zeros(1, device=device, dtype=torch.int64), torch.cat(lengths).cumsum(0)])
    grad = torch.randn(batch, len(rows) * DIM, device=device, generator=gen).to(torch.bfloat16)

    def forward() -> torch.Tensor:
        return tbe(indices, offsets)

    forward.grad = grad  # type: ignore[attr-defined]
    return forward


def _wgrad(batch: int, device: torch.device) -> Callable[[], None]:
    gen = torch.Generator(device=device).manual_seed(1)
    pairs = [
        (
            torch.randn(batch, n, device=device, generator=gen).to(torch.bfloat16),
            torch.randn(batch, k, device=device, generator=gen).to(torch.bfloat16),
        )
        for n, k in wgrad_shapes()
    ]
    outs = [torch.empty(n, k, device=device, dtype=torch.bfloat16) for n, k in wgrad_shapes()]

    def run() -> None:
        for (g, x), o in zip(pairs, outs):
            torch.mm(g.t(), x, out=o)

    return run


def measure(batch: int, row_cap: int, steps: int, repeats: int, device: torch.device) -> Dict[str, float]:
    """ms per step of ``tbe``, ``wgrad`` and ``both`` (module docstring), and ``saved``."""
    forward = _tbe(batch, row_cap, device)
    wgrad = _wgrad(batch, device)
    side = torch.cuda.Stream(device)

    def tbe() -> None:
        forward().backward(forward.grad)  # type: ignore[attr-defined]

    def both() -> None:
        pooled = forward()
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            wgrad()
        pooled.backward(forward.grad)  # type: ignore[attr-defined]
        torch.cuda.current_stream(device).wait_stream(side)

    figures = {}
    for name, fn in (("tbe", tbe), ("wgrad", wgrad), ("both", both)):
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        times = []
        for _ in range(repeats):
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / steps)
        figures[name] = statistics.median(times)
        del graph
    figures["saved"] = figures["tbe"] + figures["wgrad"] - figures["both"]
    return figures


def main(argv: List[str] | None = None) -> List[Dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8192, 32768], help="samples per step")
    p.add_argument("--row-cap", type=int, default=4_000_000, help="rows per table at most (as bench.throughput)")
    p.add_argument("--steps", type=int, default=50, help="replays per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings; the median is printed")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: bench.wgrad_overlap needs a CUDA device")
    device = torch.device("cuda", 0)
    rows = []
    print("| batch | tbe ms | wgrad ms | both ms | saved ms |")
    print("| --- | --- | --- | --- | --- |")
    for b in args.batch_sizes:
        f = measure(b, args.row_cap, args.steps, args.repeats, device)
        rows.append({"batch": b, **f})
        print(f"| {b} | {f['tbe']:.3f} | {f['wgrad']:.3f} | {f['both']:.3f} | {f['saved']:.3f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
