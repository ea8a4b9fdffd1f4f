"""Evaluation speed: ``pipeline=graphed``'s captured forward against the eager forward the other pipelines run,
on the same model and batches, in one process. Run from the repository root::

    # 1x H200 (the MLPerf DLRM-v2 model, tables capped at 4 M rows, element-wise Adagrad, perf=fast)
    torchrun --standalone --nproc_per_node 1 -m bench.eval_throughput --batch 32768
    # several batch sizes in one run (one line each)
    torchrun --standalone --nproc_per_node 1 -m bench.eval_throughput --batch 16384 32768 65536
    # the several-rank path (ids all-to-all with fixed splits in the graph) forced on one rank
    torchrun --standalone --nproc_per_node 1 -m bench.eval_throughput --batch 32768 --ids-all-to-all
    # CPU smoke test (gloo, tiny model, the capture path run eagerly): numbers meaningless
    .venv/bin/torchrun --standalone --nproc_per_node 1 -m bench.eval_throughput --smoke

What is timed, per batch size of ``--batch`` and mode: ``--repeats`` passes over ``--batches`` evaluation batches
(a pool of 8 random batches built once on the device, cycled: no loader or host-to-device copy), each batch's
outputs added to the trainer's ``dlrm.metrics.EvalAccumulator`` (histogram AUC, as for the MLPerf validation
split) as ``Trainer.evaluate`` does, and again without it (the forward alone); a device synchronize and a barrier
end a pass. ``eager``: ``model(batch)`` in eval mode (the path of every other pipeline); ``graphed``:
``GraphedTrainPipeline.evaluate`` (one eager batch, the held one, then the captured forward replayed; a first
untimed pass captures it; each batch size gets a graphed pipeline of its own over the same model, as a replay
serves one shape). The model trains ``--train-steps`` graphed steps first, as a run evaluates after training.
samples/s is per rank (the slowest rank's pass), the median pass; each line also gives the share of the forward
alone's samples/s that the accumulator keeps. ``--ids criteo`` draws skewed ids
(``bench/ids.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from bench import ids as bench_ids
from bench import runner
from bench.throughput import BASE, GRAPHED_ELEMENTWISE, SMOKE_BASE
from dlrm.build import build_training
from dlrm.config import compose, to_config
from dlrm.graphed import GraphedTrainPipeline
from dlrm.metrics import EvalAccumulator
from dlrm.process_group import init_distributed


def _pass(forward: Any, batches: List[Any], n: int, device: torch.device, metrics: bool = True) -> float:
    """Seconds for one evaluation pass of ``n`` batches (the slowest rank's); ``metrics``: with the trainer's
    accumulator, else the forward alone."""
    acc = EvalAccumulator(device, "histogram") if metrics else None
    weight = torch.ones(batches[0].labels.numel(), device=device)
    dist.barrier()
    t0 = time.perf_counter()
    for out, w in forward((batches[i % len(batches)], weight) for i in range(n)):
        if acc is not None:
            acc.update(out[1], out[2], w)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item())


def _graphed(args: argparse.Namespace, built: Any, device: torch.device) -> GraphedTrainPipeline:
    """A graphed pipeline over ``built``'s model (captured on CUDA; the capture path run eagerly with --smoke)."""
    return GraphedTrainPipeline(
        built.model,
        built.optimizer,
        built.dense,
        device,
        capture=not args.smoke,
        ids_all_to_all=True if args.ids_all_to_all else None,
    )


def _modes(
    args: argparse.Namespace, batch: int, cfg: Any, built: Any, device: torch.device, seed: int
) -> Dict[str, Any]:
    """Time eager and graphed evaluation at ``batch`` rows per rank, with and without the accumulator: one fresh
    graphed pipeline over the trained model, so that its evaluation forward is captured for this batch size."""
    pool = runner.make_batches(cfg.model, batch, 8, device, False, seed=seed, ids=args.ids)
    pipe = _graphed(args, built, device)
    model = pipe.detach()
    model.eval()

    def eager(pairs: Any) -> Any:
        return ((model(b)[1], w) for b, w in pairs)

    res: Dict[str, Any] = {}
    with torch.no_grad():
        for name, forward in (("eager", eager), ("graphed", pipe.evaluate)):
            _pass(forward, pool, 4, device)  # warm: compiles the eval forward; graphed: holds and captures it
            secs = [_pass(forward, pool, args.batches, device) for _ in range(args.repeats)]
            alone = [_pass(forward, pool, args.batches, device, False) for _ in range(args.repeats)]
            res[name] = {
                "samples_per_s_per_rank": batch * args.batches / statistics.median(secs),
                "passes_s": secs,
                "forward_alone_samples_per_s_per_rank": batch * args.batches / statistics.median(alone),
                "forward_alone_passes_s": alone,
            }
    res["graphed_vs_eager"] = res["graphed"]["samples_per_s_per_rank"] / res["eager"]["samples_per_s_per_rank"]
    return res


def _line(batch: int, args: argparse.Namespace, r: Dict[str, Any]) -> str:
    """The result line of one batch size."""
    e, g = r["eager"], r["graphed"]
    return (
        f"evaluation, {batch} rows per rank, {args.ids} ids{', ids all-to-all' if args.ids_all_to_all else ''}: "
        f"with the accumulator: eager {e['samples_per_s_per_rank'] / 1e6:.2f} M samples/s per rank, graphed "
        f"{g['samples_per_s_per_rank'] / 1e6:.2f} M ({r['graphed_vs_eager']:.2f}x); the forward alone: eager "
        f"{e['forward_alone_samples_per_s_per_rank'] / 1e6:.2f} M, graphed "
        f"{g['forward_alone_samples_per_s_per_rank'] / 1e6:.2f} M; the accumulator keeps "
        f"{e['samples_per_s_per_rank'] / e['forward_alone_samples_per_s_per_rank']:.1%} (eager), "
        f"{g['samples_per_s_per_rank'] / g['forward_alone_samples_per_s_per_rank']:.1%} (graphed)"
    )


def main(argv: Any = None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[32768], help="evaluation rows per rank and batch")
    p.add_argument("--batches", type=int, default=100, help="batches per timed pass")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train-steps", type=int, default=4, help="graphed training steps before evaluating")
    p.add_argument("--ids", choices=bench_ids.DISTRIBUTIONS, default="uniform")
    p.add_argument("--ids-all-to-all", action="store_true", help="the several-rank path, on any world size")
    p.add_argument("--sharding", default="table_wise")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU; numbers are meaningless")
    args = p.parse_args(argv)
    info = init_distributed("cpu" if args.smoke else "cuda")
    device = info.device
    overrides = (SMOKE_BASE if args.smoke else BASE) + [f"sharding={args.sharding}"]
    overrides += ["optimizer.sparse_type=adagrad"] if args.smoke else GRAPHED_ELEMENTWISE
    cfg = to_config(compose(overrides + ["data.batch_size=4096" if not args.smoke else "data.batch_size=32"]))
    torch.manual_seed(0)
    built = build_training(cfg, info, cfg.data.batch_size)
    pipe = _graphed(args, built, device)
    seed = 1000 + dist.get_rank()
    train = iter(runner.make_batches(cfg.model, cfg.data.batch_size, args.train_steps, device, False, seed=seed))
    for _ in range(args.train_steps):
        pipe.progress(train)
    res: Dict[str, Any] = {"ids": args.ids, "ids_all_to_all": args.ids_all_to_all, "by_batch": {}}
    for batch in args.batch:
        r = res["by_batch"][batch] = _modes(args, batch, cfg, built, device, seed + 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the captured forward's memory pool went with its pipeline
        if info.is_main:
            print(_line(batch, args, r), flush=True)
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    main()
