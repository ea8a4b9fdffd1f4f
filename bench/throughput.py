"""Steady-state training speed of the trainer (each ``perf.*`` lever alone and combined) against stock TorchRec,
in the same process and on the same batches. Run from the repository root::

    # 1x H200 (the MLPerf DLRM-v2 model, tables capped at 4 M rows like the stock baseline)
    torchrun --standalone --nproc_per_node 1 -m bench.throughput --batch-sizes 32768 --sharding table_wise \
        --variants stock fast
    # 2x H200
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m bench.throughput --batch-sizes 32768 \
        --sharding table_wise --variants stock fast fast_balanced_plan
    # CPU smoke test (gloo, tiny model): the same code paths, numbers meaningless
    .venv/bin/torchrun --standalone --nproc_per_node 2 -m bench.throughput --smoke --out /tmp/tp

What is timed, per variant and per-rank batch size: ``--repeats`` repeats of ``--steps`` steps after ``--warmup``
untimed steps, a device synchronize and a barrier (a rank still copying must not look like a slow collective);
ms/step is the slowest rank's; the median repeat is reported with min and max. Batches are random (uniform ids,
MLPerf multi-hot sizes: 214 ids per sample; int64, or int32 with ``--ids-dtype int32`` as ``data=criteo_binary``
loads them; ``--ids criteo``: skewed as in Criteo 1TB, ``bench/ids.py``), built once on the device before timing
and cycled, the same pool for every variant.

Variants (``--variants``):
  stock      plain TorchRec as the MLPerf reference sets it up (``bench/runner.py``'s stock model: TorchRec's
             ``DLRMTrain(DLRM_DCN)``, planner, DMP, ``TrainPipelineSparseDist``, fp32, TF32 on, dense Adagrad), with
             row-wise Adagrad fused into the TBE backward (the reference trains element-wise; row-wise is the
             faster, so ratios to it are the conservative ones).
  stock_elementwise  the same with element-wise Adagrad (FBGEMM EXACT_ADAGRAD), the reference's table optimizer.
  others     the trainer's own stack, built by ``dlrm.build.build_training`` from the composed config
             ``BASE + LEVERS[name]`` (see ``LEVERS`` below), and timed as ``Trainer.fit`` steps: ``pipeline.progress``,
             the LR scheduler step, and the metric window (one host sync per ``--log-every`` steps, with the
             windowed train AUC). ``HOOKS[name]`` swaps one piece of the build through
             ``dlrm.build.BuildHooks`` (an A/B of a code change, not of a config key); ``PIPELINE_ARGS[name]``
             builds ``pipeline=graphed`` with other arguments (``fast_graphed_elementwise_ids_all_to_all``: the
             several-rank graph, ids all-to-all and dense all-reduce included, on any number of ranks).
Variants are built one after another and freed (two capped models plus compiled graphs would not all fit at
32768); the stock variants run first and again last, so drift over the run shows.

Each row also has ``host_ms_per_step``: the median host time to issue one step (``runner.Runner.repeat``);
while the GPU is behind, ``progress()`` returns once the step is queued, so a value near ms/step means the loop
is host-bound.

``--profile VARIANT [VARIANT ...]`` additionally profiles 10 steps of those variants with torch.profiler (built
again after all variants of the batch size were timed: profiling slows what runs after it in the process) and
prints where the GPU time goes (``pipeline_traces.gpu_time_by_category``: kernel time per step for TBE forward, TBE
backward with the fused optimizer, NCCL all-to-all and all-reduce, matrix products, fused (triton) elementwise,
other elementwise, copies), the 25 largest kernels, and where the GPU sits idle and why
(``pipeline_traces.idle_gaps``: waiting for the host, blamed on a blocking call or the launching Python frame, or
waiting on another stream). A variant that fails is reported as failed and the others still run.

``--alternate`` builds all ``--variants`` first and interleaves their repeats (A B B A ...). Two compiled copies of
the model in one process make each slower, so compare compiled variants in the default blocked mode.

``--probe host:0.5 gpu:0.5`` times each trainer variant again, on the same built model, with that many ms added
to every step on the host (a spin after the step is issued) or on the GPU (a spinning kernel on the compute stream):
a step that grows by the full amount is bound by that side; one that does not grow had that much slack.

Output: ``throughput.json`` and ``throughput.md`` under ``--out`` (default ``bench/results/<timestamp>``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from bench import ids as bench_ids
from bench import runner, traces
from dlrm import torchrec_compat as compat
from dlrm.build import BuildHooks, build_training
from dlrm.config import compose, to_config
from dlrm.graphed import GraphedTrainPipeline
from dlrm.metrics import MetricWindow
from dlrm.model import DLRMTrain
from dlrm.process_group import DistInfo, init_distributed

# The MLPerf DLRM-v2 model at the stock baseline's size (tables capped at 4 M rows, row-wise Adagrad); lr is the
# MLPerf value for global batch 65,536 (it only sets the magnitude of the updates).
BASE = [
    "model=dlrm_v2",
    "model.row_cap=4000000",
    "optimizer.sparse_type=rowwise_adagrad",
    "optimizer.lr=0.004",
    "data.multi_hot=true",
]
SMOKE_BASE = ["model=dlrm_v2_small", "model.row_cap=1000", "optimizer.lr=0.004"]
GRAPHED_ELEMENTWISE = ["perf=fast", "pipeline=graphed", "optimizer.sparse_type=adagrad"]  # MLPerf's optimizer
NOT_HELD = ["perf.allreduce_after_output_dist=false"]  # the held all-reduce needs an fp32 all-reduce
BALANCED_PLAN = "conf/plans/dlrm_v2_cap4m_2gpu_table_wise.json"

LEVERS: Dict[str, List[str]] = {
    # the trainer at reference numerics (TF32 matmuls, as stock), and each lever alone on top of it
    "fp32": ["perf=fp32"],
    "no_tf32": ["perf=fp32", "perf.tf32=false"],
    "fp16_tables": ["perf.embedding_dtype=fp16"],
    "bf16_pooled": ["perf.embedding_output_dtype=bf16"],
    "autocast": ["perf.autocast=bf16", "perf.embedding_output_dtype=bf16"],
    "compile": ["perf.compile=true"],
    "autocast_compile": ["perf.autocast=bf16", "perf.embedding_output_dtype=bf16", "perf.compile=true"],
    # perf=fast, and perf=fast with one of its levers undone or another key on top
    "fast": ["perf=fast"],
    "fast_elementwise_adagrad": ["perf=fast", "optimizer.sparse_type=adagrad"],
    # one GPU: the step after the input dist replayed as one CUDA graph (dlrm/graphed.py)
    "fast_graphed": ["perf=fast", "pipeline=graphed"],
    "fast_graphed_elementwise_adagrad": GRAPHED_ELEMENTWISE,
    # the several-rank graph (ids all-to-all with fixed splits, dense all-reduce in the graph), on any world size
    "fast_graphed_elementwise_ids_all_to_all": GRAPHED_ELEMENTWISE,
    "fast_graphed_ids_all_to_all": ["perf=fast", "pipeline=graphed"],
    # the same, the input dist on its own group: each step sends the next batch's ids on a stream of their own
    "fast_graphed_elementwise_ids_ahead": GRAPHED_ELEMENTWISE + ["pipeline.input_dist_group=dedicated"],
    "fp32_graphed": ["perf=fp32", "pipeline=graphed"],
    "fast_graphed_elementwise_max_autotune": GRAPHED_ELEMENTWISE + ["perf.compile_mode=max-autotune-no-cudagraphs"],
    "fast_fp16_tables": ["perf=fast", "perf.embedding_dtype=fp16"],
    "fast_graphed_elementwise_fp16_tables": GRAPHED_ELEMENTWISE + ["perf.embedding_dtype=fp16"],
    "fast_graphed_elementwise_fp16_nearest": GRAPHED_ELEMENTWISE
    + ["perf.embedding_dtype=fp16", "perf.tbe_stochastic_rounding=false"],
    "fast_max_autotune": ["perf=fast", "perf.compile_mode=max-autotune-no-cudagraphs"],
    "fast_fused_sparse_dist": ["perf=fast", "pipeline=fused_sparse_dist"],
    "fast_semi_sync": ["perf=fast", "pipeline=semi_sync"],
    "fast_dedicated_input_dist": ["perf=fast", "pipeline.input_dist_group=dedicated"],
    "fast_allreduce_bf16": ["perf=fast", "perf.allreduce_dtype=bf16"] + NOT_HELD,
    "fast_bounds_check": ["perf=fast", "perf.tbe_bounds_check=warning"],
    "fast_split_at_buckets": ["perf=fast", "perf.compile_ddp_split=true"],
    "fast_fp32_dcn_stream": ["perf=fast", "perf.dcn_residual_dtype=fp32"],
    "fast_bucket25": ["perf=fast", "perf.ddp_bucket_cap_mb=25"],
    "fast_hybrid": ["perf=fast", "sharding.data_parallel_max_rows=100000"],
    "fast_no_lean_output_dist": ["perf=fast", "perf.lean_output_dist=false"] + NOT_HELD,
    "fast_allreduce_not_held": ["perf=fast"] + NOT_HELD,
    # 2 ranks, the capped MLPerf tables: a table_wise plan balanced by hand for the TBE backward's time per rank
    "fast_balanced_plan": ["perf=fast", f"sharding.plan_path={BALANCED_PLAN}"],
    # built with HOOKS below
    "fast_torchrec_sparse_arch": ["perf=fast"],
}


def _torchrec_sparse_arch(model: DLRMTrain) -> None:
    """TorchRec's own ``SparseArch`` in place of ``ZeroCopySparseArch``: its copy of the pooled embeddings into
    feature order, outside the compiled dense step (and on several ranks no rank-block hand-over)."""
    from torchrec.models.dlrm import SparseArch

    net = model.model
    net.sparse_arch = SparseArch(net.sparse_arch.embedding_bag_collection)


# variant -> the piece of the trainer's build it swaps (dlrm.build.BuildHooks)
HOOKS: Dict[str, BuildHooks] = {
    "fast_torchrec_sparse_arch": BuildHooks(model=_torchrec_sparse_arch),
}
# variant -> GraphedTrainPipeline arguments the build does not set (the several-rank path forced on one rank)
PIPELINE_ARGS: Dict[str, Dict[str, Any]] = {
    "fast_graphed_elementwise_ids_all_to_all": {"ids_all_to_all": True},
    "fast_graphed_ids_all_to_all": {"ids_all_to_all": True},
    "fast_graphed_elementwise_ids_ahead": {"ids_all_to_all": True},
}
DEFAULT_VARIANTS = [
    "stock",
    "fp32",
    "no_tf32",
    "autocast",
    "compile",
    "autocast_compile",
    "fast",
    "fast_elementwise_adagrad",
]


class TrainerRunner(runner.Runner):
    """The trainer's stack (``build_training``) over the same batch pool, timed like ``Trainer.fit`` steps."""

    def __init__(
        self, name: str, overrides: List[str], batch: int, args: argparse.Namespace, info: DistInfo, world: int
    ) -> None:
        self.args, self.device, self.spec = args, info.device, None
        if info.device.type == "cpu":  # FBGEMM's CPU TBE has no bf16: the smoke test runs fp16 instead
            overrides = [o.replace("bf16", "fp16") for o in overrides]
            overrides += ["perf.embedding_output_dtype=fp16", "perf.autocast=fp16"] if "perf=fast" in overrides else []
        self.overrides = overrides
        cfg = to_config(
            compose(
                (SMOKE_BASE if args.smoke else BASE)
                + [f"sharding={args.sharding}"]
                + overrides
                + [f"data.batch_size={batch}"]
            )
        )
        self.cfg = cfg
        torch.manual_seed(0)
        built = build_training(cfg, info, batch, hooks=HOOKS.get(name))
        self.model, self.opt, self.pipe, self.scheduler = built.model, built.optimizer, built.pipeline, built.scheduler
        if name in PIPELINE_ARGS:
            self.pipe = GraphedTrainPipeline(
                built.model, built.optimizer, built.dense, info.device, **PIPELINE_ARGS[name]
            )
        # what the build swapped or compiled, recorded so a result shows it took effect
        self.applied = {"compiled": built.perf.compiled or []}
        self.plan_kernels = sorted(
            {(ps.sharding_type, ps.compute_kernel) for mp in built.plan.plan.values() for ps in mp.values()}
        )  # type: ignore
        self.mc = cfg.model
        self.pool = runner.make_batches(
            cfg.model,
            batch,
            args.pool,
            info.device,
            False,
            seed=1000 + dist.get_rank(),
            ids_dtype=runner.IDS_DTYPES[args.ids_dtype],
            ids=args.ids,
        )
        self.win = MetricWindow(info.device)
        self.n = 0

    probe: Optional[Tuple[str, float]] = None  # --probe: (host | gpu, ms) added to every step

    def after_step(self, out: Any) -> None:
        self.scheduler.step()
        self.win.add(out[0], out[1], out[2], out[3] if len(out) > 3 else None, int(out[2].shape[0]))
        self.n += 1
        if self.n % self.args.log_every == 0:
            self.win.reduce(True)  # the trainer's per-window sync: loss, train AUC, non-finite check
        if self.probe is not None:
            kind, ms = self.probe
            if kind == "host":  # spin, not sleep: a sleep's wake-up adds a variable 50-100 us
                end = time.perf_counter() + ms / 1000.0
                while time.perf_counter() < end:
                    pass
            else:  # a kernel that spins ms on the compute stream, queued after the step's optimizer
                compat.gpu_spin(int(ms * _cycles_per_ms(self.device)))


_CYCLES: Dict[str, float] = {}


def _cycles_per_ms(device: torch.device) -> float:
    """GPU clock cycles per ms of :func:`dlrm.torchrec_compat.gpu_spin`, measured once with CUDA events."""
    if str(device) not in _CYCLES:
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 1 << 24
        a.record()
        compat.gpu_spin(n)
        b.record()
        b.synchronize()
        _CYCLES[str(device)] = n / a.elapsed_time(b)
    return _CYCLES[str(device)]


def run_variant(name: str, batch: int, args: argparse.Namespace, info: DistInfo, world: int) -> List[Dict[str, Any]]:
    try:
        return _run_variant(name, batch, args, info, world)
    except Exception as e:  # noqa: BLE001 - one failing lever (e.g. a compile mode) must not lose the others
        if info.is_main:
            print(
                f"{name:>16} b{batch}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                flush=True,
            )
        gc.collect()
        if info.device.type == "cuda":
            torch.cuda.empty_cache()
        return [
            {
                "config": name,
                "batch_per_rank": batch,
                "error": f"{type(e).__name__}: {e}"[:2000],
                "overrides": LEVERS.get(name, []),
            }
        ]


# stock variant -> its table optimizer (``optimizer.sparse_type``)
STOCK = {"stock": "rowwise_adagrad", "stock_elementwise": "adagrad"}


def _build(name: str, batch: int, args: argparse.Namespace, info: DistInfo, world: int) -> Tuple[Any, List[str], float]:
    t0 = time.perf_counter()
    if name in STOCK:
        return (
            runner.Runner(
                runner.Spec(f"{name}/b{batch}", batch, stock=True, sparse_opt=STOCK[name]), args, info.device, world
            ),
            [],
            time.perf_counter() - t0,
        )
    return TrainerRunner(name, LEVERS[name], batch, args, info, world), LEVERS[name], time.perf_counter() - t0


def _free(run: Any, info: DistInfo) -> None:
    run.close()
    for attr in ("scheduler", "win"):
        if hasattr(run, attr):
            delattr(run, attr)
    gc.collect()
    if info.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(info.device)


def profile_variant(name: str, batch: int, args: argparse.Namespace, info: DistInfo, world: int) -> Dict[str, Any]:
    """``--profile``: build ``name`` again after every variant of this batch size was timed, warm it up, and break
    its GPU time down (``pipeline_traces.gpu_time_by_category``, with idle gaps and host syncs).

    Profiling runs last because it leaves the process slower: on H200 the variants timed after a profiled one in
    the same process ran 0.5-4 ms/step slower (compiled, host-sensitive ones; stock, GPU-bound, did not move)."""
    run, _, _ = _build(name, batch, args, info, world)
    run.repeat(1, args.warmup + args.first_warmup)  # compile and warm up, untimed
    top: List[Tuple[str, float]] = []
    syncs: List[Tuple[str, float, float]] = []
    trace = os.path.join(args.out, f"trace_{name}_b{batch}_rank{dist.get_rank()}.json") if args.trace else None
    gaps: Dict[str, Any] = {}
    host: Dict[str, Any] = {}
    out = {
        "breakdown_ms_per_step": traces.gpu_time_by_category(
            run, top=top, trace=trace, syncs=syncs, gaps=gaps, host=host
        ),
        "host_time": host,
        "top_kernels_ms_per_step": top,
        "host_syncs": syncs,  # (call <- python stack, calls per step, host ms per step)
        "idle_gaps": gaps,
    }
    _free(run, info)
    if info.is_main:
        print(
            f"{name:>16} b{batch} profile: {out['breakdown_ms_per_step']['total GPU kernel time']:.3f} ms/step of "
            f"kernels; idle {gaps['idle_ms_per_step']:.3f} ms/step ({gaps['gaps_per_step']:.0f} gaps): host "
            f"{gaps['host_ms_per_step']:.3f}, device {gaps['device_ms_per_step']:.3f}; busy "
            f"{gaps['busy_ms_per_step']:.3f}",
            flush=True,
        )
        for kind, label, t, n in gaps["top"][:10]:
            print(f"  idle {kind} {t:.3f} ms/step x{n:.1f}: {label[:300]}", flush=True)
        for call, n, t in syncs[:8]:
            print(f"  sync {t:.3f} ms/step x{n:.1f}: {call[:400]}", flush=True)
        for label, t, n in host.get("ranges", [])[:12]:
            print(f"  host range {t:.3f} ms/step x{n:.1f}: {label}", flush=True)
        for label, t, n in host.get("self_ops", [])[:15]:
            print(f"  host op {t:.3f} ms/step x{n:.1f}: {label[:120]}", flush=True)
    return out


def _finish(
    name: str,
    run: Any,
    overrides: List[str],
    built_s: float,
    ms: List[float],
    batch: int,
    args: argparse.Namespace,
    info: DistInfo,
    world: int,
    order: str,
) -> Dict[str, Any]:
    extra: Dict[str, Any] = {
        "overrides": overrides,
        "plan": run.plan_kernels,
        # what was built, so a result shows it: stock is TorchRec's DLRMTrain and SparseArch
        "model": f"{type(run.model.module).__module__}.{type(run.model.module).__qualname__}",
        "sparse_arch": type(run.model.module.model.sparse_arch).__name__,
        "last_loss": run.last_loss,
        "host_ms_per_step": round(run.host_ms, 3),
        **getattr(run, "applied", {}),
        "build_s": round(built_s, 1),
        "order": order,
    }
    if info.device.type == "cuda":
        extra["peak_mem_gb"] = round(torch.cuda.max_memory_allocated(info.device) / 1e9, 2)
    row = runner.summarize(name, None, "-", ms, world, batch, extra)
    _free(run, info)
    if info.is_main:
        print(
            f"{name:>16} b{batch}: {row['ms_median']:.3f} ms/step ({row['ms_min']:.3f}-{row['ms_max']:.3f}), "
            f"{row['samples_per_s'] / 1e6:.3f} M samples/s, host {run.host_ms:.2f} ms/step, "
            f"loss {run.last_loss:.4f}, built in {built_s:.0f}s",
            flush=True,
        )
    return row


def _run_variant(name: str, batch: int, args: argparse.Namespace, info: DistInfo, world: int) -> List[Dict[str, Any]]:
    run, overrides, built_s = _build(name, batch, args, info, world)
    ms = [run.repeat(args.steps, args.warmup if r else args.warmup + args.first_warmup) for r in range(args.repeats)]
    rows = []
    host_ms = run.host_ms  # the probes' repeats overwrite it
    if isinstance(run, TrainerRunner) and args.probe and info.device.type == "cuda":
        # the same built model, each probe in turn, then none again (drift check)
        for probe in [p.split(":") for p in args.probe] + [None]:
            run.probe = None if probe is None else (probe[0], float(probe[1]))
            pms = [run.repeat(args.steps, args.warmup) for _ in range(args.repeats)]
            label = f"{name}+{probe[0]}{probe[1]}ms" if probe else f"{name} (again)"
            rows.append(
                runner.summarize(
                    label,
                    None,
                    "-",
                    pms,
                    world,
                    batch,
                    {"overrides": overrides, "probe": probe, "host_ms_per_step": round(run.host_ms, 3)},
                )
            )
            if info.is_main:
                r = rows[-1]
                print(
                    f"{label:>16} b{batch}: {r['ms_median']:.3f} ms/step ({r['ms_min']:.3f}-{r['ms_max']:.3f}), "
                    f"host {run.host_ms:.2f} ms/step",
                    flush=True,
                )
        run.probe, run.host_ms = None, host_ms
    return [_finish(name, run, overrides, built_s, ms, batch, args, info, world, "blocked")] + rows


def run_alternating(
    names: List[str], batch: int, args: argparse.Namespace, info: DistInfo, world: int
) -> List[Dict[str, Any]]:
    """``--alternate``: build every variant first (all alive at once: two capped models fit one H200 at 32768),
    then time their repeats interleaved, A B B A ..., so that drift of the host or the GPU hits all alike."""
    built = {n: _build(n, batch, args, info, world) for n in names}
    for n in names:  # compile and warm up each before any timing
        built[n][0].repeat(1, args.warmup + args.first_warmup)
    ms: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        for n in runner.abba(names, r):
            ms[n].append(built[n][0].repeat(args.steps, args.warmup))
    return [
        _finish(n, built[n][0], built[n][1], built[n][2], ms[n], batch, args, info, world, "alternating") for n in names
    ]


def _attach_profile(
    rows: List[Dict[str, Any]], name: str, batch: int, args: argparse.Namespace, info: DistInfo, world: int
) -> List[Dict[str, Any]]:
    """Profile ``name`` (:func:`profile_variant`) into its first timed row of this batch size; adds no row."""
    try:
        prof = profile_variant(name, batch, args, info, world)
    except Exception as e:  # noqa: BLE001 - the timings already taken must still be written
        prof = {"profile_error": f"{type(e).__name__}: {e}"[:2000]}
    for r in rows:
        if r["config"] == name and r["batch_per_rank"] == batch and "error" not in r:
            r.update(prof)
            break
    return []


def markdown(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> str:
    ids = "" if meta.get("ids", "uniform") == "uniform" else f", {meta['ids']}"
    lines = [
        f"# throughput: {meta['date']} on {meta['device']} x{meta['world']} (torch {meta['torch']}, "
        f"torchrec {meta['torchrec']}; {meta['repeats']} repeats x {meta['steps']} steps, warm-up "
        f"{meta['warmup']}; KJT ids {meta.get('ids_dtype', 'int64')}{ids})",
        "",
        "| variant | overrides | batch/GPU | ms/step median | min | max | samples/s | vs stock | vs stock_elementwise "
        "| peak GB | plan |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    # (stock variant, batch) -> its runs' ms/step (first and last run): the ratio is a range where they differ
    stock: Dict[Tuple[str, int], List[float]] = {}
    for r in rows:
        if r["config"] in STOCK and "error" not in r:
            stock.setdefault((r["config"], r["batch_per_rank"]), []).append(r["ms_median"])

    def ratio(kind: str, r: Dict[str, Any]) -> str:
        ms = stock.get((kind, r["batch_per_rank"]))
        if not ms:
            return ""
        lo, hi = min(ms) / r["ms_median"], max(ms) / r["ms_median"]
        return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"

    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['config']} | {' '.join(r['overrides'])} | {r['batch_per_rank']} | failed: "
                f"{r['error'].splitlines()[0][:120]} | | | | | | | |"
            )
            continue
        plan = "; ".join(f"{a}/{b}" for a, b in r.get("plan", []))
        lines.append(
            f"| {r['config']} | {' '.join(r['overrides'])} | {r['batch_per_rank']} | {r['ms_median']:.3f} | "
            f"{r['ms_min']:.3f} | {r['ms_max']:.3f} | {r['samples_per_s'] / 1e6:.3f} M | {ratio('stock', r)} | "
            f"{ratio('stock_elementwise', r)} | "
            f"{r.get('peak_mem_gb', '')} | {plan} |"
        )
    for r in rows:
        if "breakdown_ms_per_step" in r:
            lines += [
                "",
                f"Where the GPU time goes: {r['config']}, batch {r['batch_per_rank']} per GPU "
                f"(kernel ms per step; streams overlap, so the total can exceed the step time)",
                "",
                "| category | ms/step |",
                "| --- | --- |",
            ]
            lines += [f"| {k} | {v:.3f} |" for k, v in r["breakdown_ms_per_step"].items()]
            lines += ["", "| largest kernels | ms/step |", "| --- | --- |"]
            lines += [f"| `{k}` | {v:.3f} |" for k, v in r.get("top_kernels_ms_per_step", [])]
            g = r.get("idle_gaps") or {}
            if g:
                lines += [
                    "",
                    f"GPU idle: {g['idle_ms_per_step']:.3f} ms/step in {g['gaps_per_step']:.0f} gaps (host "
                    f"{g['host_ms_per_step']:.3f}, device {g['device_ms_per_step']:.3f}; busy "
                    f"{g['busy_ms_per_step']:.3f})",
                    "",
                    "| idle | cause | ms/step | gaps/step |",
                    "| --- | --- | --- | --- |",
                ]
                lines += [f"| {kind} | `{label[:200]}` | {t:.3f} | {n:.1f} |" for kind, label, t, n in g["top"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(STOCK) + list(LEVERS))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8192, 32768], help="per GPU")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=15, help="untimed steps before each repeat")
    p.add_argument(
        "--first-warmup",
        type=int,
        default=25,
        help="extra untimed steps before the first repeat (torch.compile and autotuning)",
    )
    p.add_argument("--pool", type=int, default=8, help="distinct random batches, cycled")
    p.add_argument(
        "--ids-dtype",
        choices=sorted(runner.IDS_DTYPES),
        default="int64",
        help="dtype of the KJT ids of every variant, stock included (int32: as data=criteo_binary loads them)",
    )
    p.add_argument(
        "--ids",
        choices=bench_ids.DISTRIBUTIONS,
        default="uniform",
        help="id distribution of every variant's batches, stock included (bench/ids.py): uniform, or 1-hot ids of "
        "the power law fitted to Criteo 1TB (criteo) or Kaggle (criteo_kaggle), expanded by the MLPerf multi-hot",
    )
    p.add_argument("--log-every", type=int, default=20, help="the trainer's logger.log_every_n_steps")
    p.add_argument(
        "--sharding",
        default="auto",
        help="the trainer variants' sharding preset (auto: TorchRec's planner picks); table_wise, as in "
        "docs/performance.md, matches what the planner gives stock on the capped model",
    )
    p.add_argument("--profile", nargs="*", default=[], help="variants whose GPU time is broken down (e.g. fast)")
    p.add_argument(
        "--alternate",
        action="store_true",
        help="build all --variants first and interleave their "
        "repeats (A B B A ...); they must fit in memory together (two capped models do at 32768)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="with --profile: also write a Chrome trace (with Python stacks) per profiled variant and rank into --out",
    )
    p.add_argument(
        "--probe",
        nargs="*",
        default=[],
        metavar="host:MS|gpu:MS",
        help="after each trainer variant's timing, time it again with MS ms added to every step: on the "
        "host (a spin after the step is issued) or on the GPU (a spinning kernel on the compute "
        "stream after the step's optimizer); ms/step rising by MS means that side bounds the step, "
        "rising less means it had that much slack. CUDA only; rows <variant>+hostMSms / +gpuMSms, "
        "then <variant> (again)",
    )
    p.add_argument("--lr", type=float, default=0.004, help="stock runner's lr")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (tests); numbers are meaningless")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    for pr in args.probe:
        kind, _, ms = pr.partition(":")
        try:
            ok = kind in ("host", "gpu") and float(ms) > 0
        except ValueError:
            ok = False
        if not ok:
            p.error(f"--probe {pr}: give host:MS or gpu:MS with MS > 0 (e.g. host:0.5)")
    # attributes runner.Runner reads for the stock runner
    args.full_cardinality, args.row_cap, args.host_batches, args.offload_min_rows = (
        False,
        runner.STOCK_ROW_CAP,
        False,
        0,
    )
    if args.smoke:
        args.steps, args.warmup, args.first_warmup, args.repeats, args.pool = 3, 1, 0, 2, 4
        args.batch_sizes, args.log_every = [32], 2
    return args


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    args = parse_args(argv)
    info = init_distributed("cpu" if args.smoke else "auto")
    if info.device.type == "cuda":
        torch.cuda.set_device(info.device)
        torch.backends.cuda.matmul.allow_tf32 = True  # the stock setup; trainer variants set perf.tf32 themselves
        torch.backends.cudnn.allow_tf32 = True
    world = info.world_size
    import torchrec

    variants = list(args.variants)
    if any(v not in STOCK for v in variants):
        variants += [v for v in variants if v in STOCK]  # again at the end: drift check
    out = args.out = args.out or os.path.join("bench", "results", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "world": world,
        "device": torch.cuda.get_device_name(info.device) if info.device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "torchrec": getattr(torchrec, "__version__", "?"),
        "argv": sys.argv,
        **vars(args),
    }
    rows: List[Dict[str, Any]] = []
    for b in args.batch_sizes:
        # --alternate times all variants as one unit; otherwise each variant is built, timed and freed in turn
        units = (
            [lambda b=b: run_alternating(list(args.variants), b, args, info, world)]
            if args.alternate
            else [lambda v=v, b=b: run_variant(v, b, args, info, world) for v in variants]
        )
        # profiles run after every variant of this batch size was timed (see profile_variant)
        units += [
            lambda v=v, b=b, rows=rows: _attach_profile(rows, v, b, args, info, world)
            for v in dict.fromkeys(args.profile)
            if v in variants
        ]
        for unit in units:
            rows += unit()
            if info.is_main:  # after every unit, so a run cut short keeps what it measured
                with open(os.path.join(out, "throughput.json"), "w", encoding="utf-8") as f:
                    json.dump({"meta": meta, "results": rows}, f, indent=1, default=str)
                with open(os.path.join(out, "throughput.md"), "w", encoding="utf-8") as f:
                    f.write(markdown(rows, meta))
    if info.is_main:
        print(markdown(rows, meta))
    dist.barrier()
    return rows


if __name__ == "__main__":
    main()
    dist.destroy_process_group()
