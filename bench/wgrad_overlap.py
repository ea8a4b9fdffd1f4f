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
- ``serial``: both halves one after the other on one stream (what ``pipeline=graphed`` does today);
- ``both``: ``wgrad`` on a second stream once the TBE forward is done, beside the TBE backward;
- ``both_priority``: the same with the second stream at high priority, so the products' blocks are scheduled as
  soon as SMs free up rather than after the TBE's queued blocks;
- ``both_priority_carveout<k>``: the same with cuBLAS told to leave ``k`` SMs to the TBE
  (``torch._C._set_sm_carveout_experimental``);
- ``tbe_green<n>`` / ``both_green<n>``: the TBE alone in a CUDA green context of ``n`` SMs, and beside the
  products in a green context of the other SMs (``torch.cuda.green_contexts``; eager, not captured).

Each mode but the green contexts is captured as a CUDA graph (no host time in the figures) and replayed; the
median of ``--repeats`` timings of ``--steps`` replays is printed in ms per step, with ``saved = serial - best``:
the most that overlapping the two could take off a step (the real split would also add work: the dense
backward's pieces saved and read again).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Callable, Dict, List, Optional, Tuple

import torch

from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS

DIM = 128
DENSE_IN = 13
BOTTOM = [512, 256, 128]
DCN_LAYERS, DCN_RANK = 3, 512
TOP = [1024, 1024, 512, 256, 1]
CARVEOUTS = (33, 66, 99)  # SMs of 132 that cuBLAS leaves free
GREEN_SMS = (96, 112, 120)  # SMs of the TBE's green context


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


def _time(fn: Callable[[], None], steps: int, repeats: int, device: torch.device, graph: bool = True) -> float:
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize(device)
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn()
        run = g.replay
    times = []
    for _ in range(repeats):
        run()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / steps)
    return statistics.median(times)


def measure(batch: int, row_cap: int, steps: int, repeats: int, device: torch.device) -> Dict[str, float]:
    """ms per step of every mode of the module docstring, and ``saved``."""
    forward = _tbe(batch, row_cap, device)
    wgrad = _wgrad(batch, device)
    nsm = torch.cuda.get_device_properties(device).multi_processor_count

    def tbe() -> None:
        forward().backward(forward.grad)  # type: ignore[attr-defined]

    def serial() -> None:
        tbe()
        wgrad()

    def beside(side: torch.cuda.Stream, carveout: int = 0, main: Optional[torch.cuda.Stream] = None):
        def both() -> None:
            cur = torch.cuda.current_stream(device)
            own = main or cur
            own.wait_stream(cur)
            with torch.cuda.stream(own):
                pooled = forward()
            side.wait_stream(own)
            with torch.cuda.stream(side):
                torch._C._set_sm_carveout_experimental(carveout)
                wgrad()
                torch._C._set_sm_carveout_experimental(0)
            with torch.cuda.stream(own):
                pooled.backward(forward.grad)  # type: ignore[attr-defined]
            cur.wait_stream(side)
            cur.wait_stream(own)

        return both

    figures = {
        "tbe": _time(tbe, steps, repeats, device),
        "wgrad": _time(wgrad, steps, repeats, device),
        "serial": _time(serial, steps, repeats, device),
        "both": _time(beside(torch.cuda.Stream(device)), steps, repeats, device),
        "both_priority": _time(beside(torch.cuda.Stream(device, priority=-1)), steps, repeats, device),
    }
    for k in CARVEOUTS:
        side = torch.cuda.Stream(device, priority=-1)
        figures[f"both_priority_carveout{k}"] = _time(beside(side, k), steps, repeats, device)
    from torch.cuda.green_contexts import GreenContext

    for n in GREEN_SMS:
        # the contexts must outlive their streams: a collected one destroys them
        contexts = [GreenContext.create(num_sms=k, device_id=device.index) for k in (n, nsm - n)]
        mine, other = (c.Stream() for c in contexts)

        def tbe_green(mine: torch.cuda.Stream = mine) -> None:
            cur = torch.cuda.current_stream(device)
            mine.wait_stream(cur)
            with torch.cuda.stream(mine):
                tbe()
            cur.wait_stream(mine)

        figures[f"tbe_green{n}"] = _time(tbe_green, steps, repeats, device, graph=False)
        figures[f"both_green{n}"] = _time(beside(other, 0, mine), steps, repeats, device, graph=False)
    best = min(v for k, v in figures.items() if k.startswith("both"))
    figures["saved"] = figures["serial"] - best
    return figures


def main(argv: List[str] | None = None) -> List[Dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8192, 32768], help="samples per step")
    p.add_argument("--row-cap", type=int, default=4_000_000, help="rows per table at most (as bench.throughput)")
    p.add_argument("--steps", type=int, default=30, help="replays per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings; the median is printed")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: bench.wgrad_overlap needs a CUDA device")
    device = torch.device("cuda", 0)
    rows = []
    for b in args.batch_sizes:
        f = measure(b, args.row_cap, args.steps, args.repeats, device)
        rows.append({"batch": b, **f})
        print(f"batch {b}: " + ", ".join(f"{k} {v:.3f}" for k, v in f.items()), flush=True)
    return rows


if __name__ == "__main__":
    main()
