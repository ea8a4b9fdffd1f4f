"""A/B benchmark of the pipelined stack: dedicated input-dist group, host offload, all-to-all under offload traffic.

Per configuration it runs ``--repeats`` (>= 5) timed repeats of ``--steps`` (>= 200) steps, alternating the
configurations of a suite repeat by repeat (ABBA order, so slow drift cancels), and reports the median, min, max
and spread of ms/step (the slowest rank's time: a step is collective). Every repeat: ``--warmup`` untimed steps,
a barrier and a device synchronize, the timed steps (synchronize-based wall time), then the batches still in
flight are drained untimed. Batches are synthetic, generated once on the device before timing (uniform random
ids, MLPerf multi-hot sizes), so no KJT is built in Python inside the timed loop; ``--host-batches`` keeps them
in pinned host memory instead, so the pipeline's host-to-device copy (its own stream) is part of each step.
The TorchRec pipelines run the input dist and the ``fused_uvm_caching`` prefetch on their own streams.

Suites (``--suite``, several allowed):
  input_group  shared vs dedicated input-dist group (``dlrm/comms.py``), per sharding type (``--sharding-types``,
               default table_wise row_wise) and per-GPU batch (``--batch-sizes``, default 8192 32768); the two
               models of one sharding type and batch are alive together and alternate repeat by repeat.
  offload      all tables in HBM (``fused``) vs ``fused_uvm_caching`` at each ``--load-factors`` (0.05 0.2), for
               each ``--sparse-opts`` (rowwise_adagrad, adagrad), trained with the prefetch pipeline;
               ``--full-cardinality`` uses the MLPerf table sizes (204 M rows; configurations then run one after
               another, since two such models do not fit at once: the JSON says ``"order": "blocked"``).
  a2a          the output-dist-sized all-to-all (batch x 26 x 128 fp32 per rank) alone, and while a side stream
               copies ``--traffic-mb`` MiB host->device and device->host per all-to-all (a stand-in for UVM /
               cache traffic on the bus).
Every model suite also runs ``stock``: plain TorchRec (its ``DLRMTrain(DLRM_DCN)``, DMP with default sharders and
free planner choice, ``TrainPipelineSparseDist``, tables capped at 4 M rows, fp32, row-wise Adagrad), for
comparison in the same run.

Commands, from the repository root (results go to ``--out``: ``pipeline_ab.json`` and ``pipeline_ab.md``)::

    # 2x H200: shared vs dedicated; all-to-all with and without offload traffic
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m bench.pipeline_ab --suite input_group a2a
    # 1x H200: full MLPerf cardinalities, row-wise Adagrad, HBM vs uvm_caching 0.05 / 0.2
    torchrun --standalone --nproc_per_node 1 -m bench.pipeline_ab --suite offload --full-cardinality \\
        --sparse-opts rowwise_adagrad
    # 2x H200: full cardinalities, element-wise Adagrad (MLPerf rule)
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m bench.pipeline_ab --suite offload \\
        --full-cardinality --sparse-opts adagrad --load-factors 0.2 --profile-kernels
    # CPU smoke test (gloo, tiny sizes): the same code paths, numbers meaningless
    .venv/bin/torchrun --standalone --nproc_per_node 2 -m bench.pipeline_ab --smoke --out /tmp/ab
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from bench.runner import STOCK_ROW_CAP, Spec, run_specs, summarize
from bench.traces import sync


def input_group_specs(args: argparse.Namespace) -> List[List[Spec]]:
    groups = [
        [Spec(f"{st}/b{b}", b, sharding=st, input_dist_group=g) for g in ("shared", "dedicated")]
        for st in args.sharding_types
        for b in args.batch_sizes
    ]
    if not args.no_stock:
        groups += [[Spec(f"stock/b{b}", b, stock=True)] for b in args.batch_sizes]
    return groups


def offload_specs(args: argparse.Namespace, device: torch.device) -> List[List[Spec]]:
    """One group of every offload configuration (alternating), or one group each with ``--full-cardinality``
    (two models of 204 M rows do not fit at once)."""
    b = args.offload_batch
    specs = []
    for opt in args.sparse_opts:
        specs.append(Spec(f"hbm/{opt}/b{b}", b, sparse_opt=opt))
        if device.type == "cuda":  # fused_uvm_caching needs CUDA
            specs += [
                Spec(f"uvm_caching{lf}/{opt}/b{b}", b, offload="uvm_caching", load_factor=lf, sparse_opt=opt)
                for lf in args.load_factors
            ]
    if not args.no_stock:
        specs.append(Spec(f"stock/b{b}", b, stock=True))
    return [[s] for s in specs] if args.full_cardinality else [specs]


def a2a_bench(args: argparse.Namespace, device: torch.device, world: int) -> List[Dict[str, Any]]:
    """All-to-all of the output dist's size (batch x 26 tables x dim fp32 per rank), alone and with host<->device
    copies of ``--traffic-mb`` MiB each way on a side stream per all-to-all; alternating, synchronize-timed."""
    dim = 16 if args.smoke else 128
    batch = args.a2a_batch
    n = batch * 26 * dim
    n -= n % world
    send = torch.randn(n, device=device)
    recv = torch.empty_like(send)
    variants = ["idle"]
    if device.type == "cuda":
        elems = args.traffic_mb * 2**20 // 4
        host_src = torch.empty(elems, pin_memory=True)
        host_dst = torch.empty(elems, pin_memory=True)
        dev_buf = torch.empty(elems, device=device)
        side = torch.cuda.Stream(device)
        variants.append("h2d+d2h_traffic")
    times: Dict[str, List[float]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for v in variants if r % 2 == 0 else list(reversed(variants)):
            for i in range(args.warmup + args.steps):
                if i == args.warmup:
                    sync(device)
                    dist.barrier()
                    sync(device)
                    t0 = time.perf_counter()
                if v != "idle":
                    with torch.cuda.stream(side):
                        dev_buf.copy_(host_src, non_blocking=True)
                        host_dst.copy_(dev_buf, non_blocking=True)
                dist.all_to_all_single(recv, send)
            sync(device)
            ms = torch.tensor([(time.perf_counter() - t0) * 1000.0 / args.steps], dtype=torch.float64)
            ms = ms.to(device) if device.type == "cuda" else ms
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            times[v].append(float(ms.item()))
    mb = n * 4 / 2**20
    return [
        summarize(
            f"a2a/{mb:.1f}MiB",
            None,
            v,
            times[v],
            world,
            0,
            {"a2a_mib_per_rank": mb, "traffic_mib_each_way": args.traffic_mb if v != "idle" else 0},
        )
        for v in variants
    ]


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    lines = [
        f"# pipeline_ab: {meta['date']} on {meta['device']} x{meta['world']} "
        f"(torch {meta['torch']}, torchrec {meta['torchrec']}; {meta['repeats']} repeats x {meta['steps']} "
        f"steps, warm-up {meta['warmup']})",
        "",
        "| config | variant | batch/rank | ms/step median | min | max | spread % | samples/s | plan | order |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        plan = "; ".join(f"{a}/{b}" for a, b in r.get("plan", []))
        sps = f"{r['samples_per_s'] / 1e6:.3f} M" if r.get("samples_per_s") else ""
        lines.append(
            f"| {r['config']} | {r['variant']} | {r['batch_per_rank'] or ''} | {r['ms_median']:.3f} | "
            f"{r['ms_min']:.3f} | {r['ms_max']:.3f} | {r['spread_pct']:.1f} | {sps} | {plan} | "
            f"{r.get('order', 'alternating')} |"
        )
    for r in rows:
        if "gpu_ms_per_step" in r:
            lines += [
                "",
                f"CUDA kernel ms per step, {r['config']} (10 profiled steps; streams overlap; NCCL time "
                "includes waiting for the slower rank): "
                + ", ".join(f"{k} {v:.2f}" for k, v in r["gpu_ms_per_step"].items()),
            ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--suite", nargs="+", choices=["input_group", "offload", "a2a"], default=["input_group", "offload", "a2a"]
    )
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per configuration (>= 5 for reports)")
    p.add_argument("--steps", type=int, default=200, help="timed steps per repeat (>= 200 for reports)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before each repeat")
    p.add_argument("--pool", type=int, default=8, help="distinct random batches, cycled")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8192, 32768], help="per-rank, input_group")
    p.add_argument("--sharding-types", nargs="+", default=["table_wise", "row_wise"])
    p.add_argument("--offload-batch", type=int, default=32768, help="per-rank batch of the offload suite")
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.05, 0.2])
    p.add_argument(
        "--sparse-opts", nargs="+", choices=["rowwise_adagrad", "adagrad"], default=["rowwise_adagrad", "adagrad"]
    )
    p.add_argument("--offload-min-rows", type=int, default=0, help="offload tables with >= this many rows")
    p.add_argument("--full-cardinality", action="store_true", help="MLPerf table sizes (204 M rows, 104.5 GB)")
    p.add_argument("--row-cap", type=int, default=STOCK_ROW_CAP, help="rows per table without --full-cardinality")
    p.add_argument("--a2a-batch", type=int, default=32768, help="per-rank batch whose pooled output is sent")
    p.add_argument("--traffic-mb", type=int, default=256, help="MiB copied each way per all-to-all")
    p.add_argument(
        "--profile-kernels",
        action="store_true",
        help="blocked suites: after timing, profile 10 steps per configuration and report CUDA kernel "
        "time per step by category (all-to-all inside the training step, with and without offload)",
    )
    p.add_argument("--host-batches", action="store_true", help="batches in pinned host memory (H2D per step)")
    p.add_argument("--no-stock", action="store_true", help="skip the stock-TorchRec baseline")
    p.add_argument("--lr", type=float, default=0.004)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU test); numbers are meaningless")
    p.add_argument("--out", default=None, help="output directory (default bench/results/<timestamp>)")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.warmup, args.repeats, args.pool = (
            min(args.steps, 3),
            min(args.warmup, 1),
            min(args.repeats, 2),
            4,
        )
        args.batch_sizes, args.offload_batch, args.a2a_batch = [32], 32, 32
    return args


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if not dist.is_initialized():
        from dlrm.process_group import init_distributed

        init_distributed("cpu" if args.smoke else "auto")
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if (torch.cuda.is_available() and not args.smoke)
        else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    world, rank = dist.get_world_size(), dist.get_rank()
    import torchrec

    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "world": world,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "torchrec": getattr(torchrec, "__version__", "?"),
        "backend": dist.get_backend(),
        "argv": sys.argv,
        **{k: v for k, v in vars(args).items()},
    }
    rows: List[Dict[str, Any]] = []
    if "input_group" in args.suite:
        rows += run_specs(input_group_specs(args), args, device, world)
    if "offload" in args.suite:
        rows += run_specs(offload_specs(args, device), args, device, world)
    if "a2a" in args.suite:
        rows += a2a_bench(args, device, world)
    if rank == 0:
        out = args.out or os.path.join("bench", "results", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "pipeline_ab.json"), "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1, default=str)
        md = markdown(rows, meta)
        with open(os.path.join(out, "pipeline_ab.md"), "w", encoding="utf-8") as f:
            f.write(md)
        print(md)
        print(f"wrote {out}/pipeline_ab.json and pipeline_ab.md")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
