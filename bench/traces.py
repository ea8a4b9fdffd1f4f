"""Profiling and trace analysis shared by the benchmarks (``bench/pipeline_ab.py``, ``bench/throughput.py``) and
their tests: where a step's GPU time goes, where the host's goes, and where and why the GPU sits idle.

* :func:`gpu_time_by_category`: profile steps of a running pipeline and sum CUDA kernel time per
  :data:`CATEGORIES` (TBE forward / backward, NCCL, matrix products, ...), with the top kernels, host-blocking
  calls (:data:`SYNC_EVENTS`), :func:`host_time` and :func:`idle_gaps` on request.
* :func:`idle_gaps`: the GPU's idle gaps in a torch.profiler Chrome trace, each blamed on the host (a blocking
  call or a launch, with its Python frame) or on another stream.

A run profiled here is any object with ``pipe`` (a TorchRec-style pipeline with ``progress``), ``pool`` (the
batches to cycle through), ``device`` and ``after_step`` (``bench.pipeline_ab.Runner``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import torch


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA only; CPU work is already done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def drain(pipe: Any, it: Any) -> None:
    """Run the pipeline until ``it`` and the batches still in flight are used up (untimed)."""
    while True:
        try:
            pipe.progress(it)
        except StopIteration:
            break


CATEGORIES = [  # (label, substrings of CUDA kernel names); the first match wins
    ("TBE backward + fused optimizer", ("backward", "_bwd")),
    ("TBE forward (lookup)", ("embedding_forward", "split_embedding", "_fwd_kernel", "bounds_check")),
    ("NCCL all-reduce", ("AllReduce",)),
    ("NCCL all-to-all", ("SendRecv", "AllToAll", "nccl")),
    (
        "TBE cache (uvm_caching prefetch)",
        ("lru_cache", "lfu_cache", "cache_insert", "linearize_cache", "lxu_cache", "direct_mapped"),
    ),
    ("matrix products", ("gemm", "cutlass", "sm90_", "sm100_", "cublas", "xmma", "_mm_", "nvjet")),
    ("fused elementwise (triton)", ("triton",)),
    ("copies", ("memcpy", "Memcpy", "copy_", "CatArrayBatchedCopy")),
]


def _is_annotation(ev: Any) -> bool:
    """A GPU-side record_function range (e.g. ``DistributedDataParallel.forward``, TorchRec's
    ``[lookup]_[...]``, ``Optimizer.step#Adagrad.step``): it spans kernels already counted, so it is skipped."""
    if getattr(ev, "is_user_annotation", False):
        return True
    k = ev.key
    return (
        k.startswith(("[", "##"))
        or "#" in k
        or k.endswith((".forward", ".backward"))
        or k.startswith(("DistributedDataParallel", "Optimizer.", "ProfilerStep"))
    )


def _device_time(ev: Any) -> float:
    """Total device time (us) of a profiler event (``device_time_total``; ``cuda_time_total`` before torch 2.4)."""
    t = getattr(ev, "device_time_total", None)
    return getattr(ev, "cuda_time_total", 0.0) if t is None else t


SYNC_EVENTS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aten::_local_scalar_dense",
    "aten::item",
)


def _profile_steps(run: Any, steps: int, **profile_kwargs: Any) -> Any:
    """``steps`` pipeline steps of ``run`` (with its per-step work) under ``torch.profiler.profile(**profile_kwargs)``,
    after 3 untimed steps; the pipeline is drained afterwards. Returns the finished profiler."""
    from torch.profiler import profile

    it = itertools.islice(itertools.cycle(run.pool), steps + 8)
    for _ in range(3):
        run.pipe.progress(it)
    sync(run.device)
    with profile(**profile_kwargs) as prof:
        for _ in range(steps):
            run.after_step(run.pipe.progress(it))
        sync(run.device)
    drain(run.pipe, it)
    return prof


def gpu_time_by_category(
    run: Any,
    steps: int = 10,
    top: Optional[List[Tuple[str, float]]] = None,
    trace: Optional[str] = None,
    syncs: Optional[List[Tuple[str, float, float]]] = None,
    gaps: Optional[Dict[str, Any]] = None,
    host: Optional[Dict[str, Any]] = None,
) -> Dict[str, float]:
    """CUDA kernel time per step (ms) by :data:`CATEGORIES` over ``steps`` profiled steps of ``run``; with
    ``top`` (a list), also appends the 25 largest kernels as ``(name, ms per step)``.

    Kernels on different streams overlap, so the categories can add up to more than the step time; NCCL kernel
    time includes waiting for the slower rank. ``trace``: also write a Chrome trace (with Python stacks) there, and
    with ``gaps`` the CUDA-only one beside it (``*_cuda_only.json``).
    ``syncs``: appends ``(host call and the Python frames above it, calls per step, host ms per step)`` for every
    host-blocking call (:data:`SYNC_EVENTS`) seen, the longest first. ``gaps`` (a dict): filled with
    :func:`idle_gaps` of ``steps`` more steps profiled with CUDA activity only (kernels and runtime calls; no
    CPU op or Python tracing, which would slow the host and starve the GPU). ``host`` (a dict): filled with
    :func:`host_time` of the profiled steps (host ms per step in the pipeline's ``## ... ##`` ranges and the
    ops with the most host time of their own; CPU op tracing inflates both, so read them as shares)."""
    from torch.profiler import ProfilerActivity

    prof = _profile_steps(
        run,
        steps,
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        with_stack=trace is not None or syncs is not None,
    )
    if trace is not None:
        prof.export_chrome_trace(trace)
    if gaps is not None and run.device.type != "cuda":
        gaps.update(idle_gaps({"traceEvents": []}, steps))  # no device timeline: nothing busy, nothing idle
    elif gaps is not None:
        # a second run with CUDA activity only: CPU op and Python tracing slow the host enough to starve the GPU
        # (measured on H200: 12 ms idle in a 13.6 ms step with Python stacks), which would blame the host
        cuda_prof = _profile_steps(run, steps, activities=[ProfilerActivity.CUDA])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json") if trace is None else f"{os.path.splitext(trace)[0]}_cuda_only.json"
            cuda_prof.export_chrome_trace(path)  # with ``trace``: kept beside it (the undisturbed device timeline)
            with open(path, encoding="utf-8") as f:
                gaps.update(idle_gaps(json.load(f), steps))
    if host is not None:
        host.update(host_time(prof, steps))
    if syncs is not None:
        syncs += _sync_calls(prof, steps)
    return _kernel_time(prof, steps, top)


def _sync_calls(prof: Any, steps: int) -> List[Tuple[str, float, float]]:
    """The 20 costliest host-blocking calls (:data:`SYNC_EVENTS`) of a finished profile of ``steps`` steps with
    Python stacks: ``(call <- frames, calls per step, host ms per step)``, the longest first."""
    found = [
        (
            f"{ev.key} <- {' <- '.join(fr for fr in ev.stack if 'nn/modules/module.py' not in fr)[:600]}",
            ev.count / steps,
            ev.cpu_time_total / 1000.0 / steps,
        )
        for ev in prof.key_averages(group_by_stack_n=15)
        if ev.key in SYNC_EVENTS
    ]
    return sorted(found, key=lambda x: -x[2])[:20]


def _kernel_time(prof: Any, steps: int, top: Optional[List[Tuple[str, float]]]) -> Dict[str, float]:
    """CUDA kernel ms per step of a finished profile of ``steps`` steps, by :data:`CATEGORIES` and in all; with
    ``top`` (a list), appends the 25 largest kernels as ``(name, ms per step)``."""
    cats: Dict[str, float] = {c: 0.0 for c, _ in CATEGORIES}
    cats["other elementwise / reductions"] = 0.0
    total = 0.0
    for ev in prof.key_averages():
        if ev.device_type.name != "CUDA" or _is_annotation(ev):
            continue
        t = _device_time(ev)
        total += t
        for label, keys in CATEGORIES:
            if any(k in ev.key for k in keys):
                cats[label] += t
                break
        else:
            cats["other elementwise / reductions"] += t
    if top is not None:
        kernels = [
            (ev.key, _device_time(ev))
            for ev in prof.key_averages()
            if ev.device_type.name == "CUDA" and not _is_annotation(ev)
        ]
        top += [(k[:120], t / 1000.0 / steps) for k, t in sorted(kernels, key=lambda kv: -kv[1])[:25]]
    out = {k: v / 1000.0 / steps for k, v in cats.items()}
    out["total GPU kernel time"] = total / 1000.0 / steps
    return out


def host_time(prof: Any, steps: int, top: int = 25) -> Dict[str, Any]:
    """Where the host's time per step goes in a finished CPU-activity profile of ``steps`` steps:
    ``ranges``: ``[(range, host ms per step, calls per step)]`` for the ``## ... ##`` ranges (TorchRec's pipeline
    stages and this repo's labels; batch numbers stripped, so one row per stage), longest first; ``self_ops``: the
    ``top`` CPU ops by host time of their own (not counting their children), ``[(op, ms per step, calls per
    step)]``."""
    ranges: Dict[str, List[float]] = {}
    own: List[Tuple[str, float, float]] = []
    for ev in prof.key_averages():
        if ev.device_type.name != "CPU":
            continue
        if ev.key.startswith("## "):
            name = re.sub(r" \d+ ##$", " ##", ev.key)
            acc = ranges.setdefault(name, [0.0, 0.0])
            acc[0] += ev.cpu_time_total / 1000.0 / steps
            acc[1] += ev.count / steps
        else:
            own.append((ev.key, ev.self_cpu_time_total / 1000.0 / steps, ev.count / steps))
    return {
        "ranges": sorted([(k, v[0], v[1]) for k, v in ranges.items()], key=lambda x: -x[1]),
        "self_ops": sorted(own, key=lambda x: -x[1])[:top],
    }


_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
# the CUDA runtime calls among SYNC_EVENTS, and the copies that block the host (pageable memory)
_BLOCKING = tuple(e for e in SYNC_EVENTS if e.startswith("cuda")) + ("cudaMemcpy", "cudaMemcpyAsync")


def idle_gaps(trace: Dict[str, Any], steps: int, min_us: float = 2.0, top: int = 12) -> Dict[str, Any]:
    """Where and why the GPU of one rank sits idle, from a torch.profiler Chrome trace (``export_chrome_trace``).

    The device's busy time is the union of its kernel, memcpy and memset intervals over all streams; every hole of
    at least ``min_us`` between the first and the last of them is a gap. A gap is ``host``-bound when the kernel
    that ends it was launched (its ``cudaLaunchKernel`` / ``cuLaunchKernel`` returned) after the gap began: the GPU
    waited for the host to issue work. Such a gap is attributed to the longest host-blocking call
    (``cudaStreamSynchronize``, ``cudaMemcpy``...) on the launching thread inside the gap, else to the launch
    itself (the host was busy issuing other work), each with the innermost Python frame around it when the trace
    has them (``with_stack``), else with the name of the kernel that ends the gap. Otherwise the work was queued and
    waited on another stream (an event wait, a collective's peer): ``device``, attributed to the kernel that
    ends the gap.

    Returns ``{"idle_ms_per_step", "host_ms_per_step", "device_ms_per_step", "busy_ms_per_step", "gaps_per_step",
    "top": [(kind, label, ms per step, gaps per step), ...]}`` with the ``top`` largest labels. Times from the
    trace's microsecond timestamps.
    """
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    dev = sorted((e for e in evs if e.get("cat") in _DEVICE_CATS), key=lambda e: e["ts"])
    launches = {
        e["args"]["correlation"]: e for e in evs if e.get("cat") in _LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    blocking = [e for e in evs if e.get("cat") in _LAUNCH_CATS and e["name"] in _BLOCKING]
    frames: Dict[Any, List[Dict[str, Any]]] = {}
    for e in sorted(evs, key=lambda e: e["ts"]):
        if e.get("cat") == "python_function" and "nn/modules/module.py" not in e["name"]:
            frames.setdefault(e.get("tid"), []).append(e)
    starts = {tid: [f["ts"] for f in fs] for tid, fs in frames.items()}

    def where(tid: Any, t: float, nxt: Dict[str, Any]) -> str:
        # a thread's Python frames nest, so the latest-starting frame that still contains t is the innermost;
        # a trace without Python frames (CUDA activity only) names the kernel the GPU was waiting for instead
        fs = frames.get(tid, [])
        for i in range(bisect.bisect_right(starts.get(tid, []), t) - 1, -1, -1):
            if fs[i]["ts"] + fs[i]["dur"] >= t:
                return f" in {fs[i]['name']}"
        return f" -> {nxt['name'][:70]}"

    gaps: List[Tuple[float, float, Dict[str, Any]]] = []
    busy = 0.0
    end = None
    for e in dev:
        s, f = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        if end is None:
            busy, end = f - s, f
            continue
        if s - end >= min_us:
            gaps.append((end, s, e))
        busy += max(0.0, f - max(s, end))
        end = max(end, f)
    by: Dict[Tuple[str, str], List[float]] = {}
    for g0, g1, nxt in gaps:
        launch = launches.get(nxt.get("args", {}).get("correlation"))
        if launch is not None and launch["ts"] + launch.get("dur", 0.0) > g0:
            tid = launch.get("tid")
            waits = [b for b in blocking if b.get("tid") == tid and b["ts"] < launch["ts"] and b["ts"] + b["dur"] > g0]
            if waits:
                w = max(waits, key=lambda b: b["dur"])
                key = ("host", f"{w['name']}{where(tid, w['ts'], nxt)}")
            else:
                key = ("host", f"launch{where(tid, launch['ts'], nxt)}")
        else:
            key = ("device", f"{nxt['name'][:80]} (stream {nxt.get('args', {}).get('stream', '?')})")
        by.setdefault(key, []).append(g1 - g0)
    per = 1000.0 * steps
    kinds = {k: sum(sum(v) for (kk, _), v in by.items() if kk == k) / per for k in ("host", "device")}
    ranked = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "idle_ms_per_step": sum(g1 - g0 for g0, g1, _ in gaps) / per,
        "host_ms_per_step": kinds["host"],
        "device_ms_per_step": kinds["device"],
        "busy_ms_per_step": busy / per,
        "gaps_per_step": len(gaps) / steps,
        "top": [(k, label, sum(v) / per, len(v) / steps) for (k, label), v in ranked],
    }
