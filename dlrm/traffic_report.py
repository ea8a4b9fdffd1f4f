"""The text of :mod:`dlrm.traffic`'s step traffic: a table of where each sharding type's ids, pooling and pooled
embeddings go, the bytes each rank hands each collective and their time at a link rate, as ``python -m dlrm.plan``
prints it and the trainer logs it at start-up."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from dlrm.traffic import IB_400_GBPS, NVLINK_H200_GBPS, StepTraffic, dtype_size


def format_bytes(n: float) -> str:
    """``n`` bytes in GiB / MiB / KiB (2 decimals) or B."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def _dataflow(stype: str) -> Tuple[str, str, str]:
    """(ids to the shards, where the TBE pools, what brings the pooled embeddings back) for a sharding type."""
    if stype == "table_wise":
        return "all-to-all to the table's rank", "whole bags, on that rank", "all-to-all (gradients: all-to-all)"
    if stype in ("column_wise", "table_column_wise"):
        return (
            "all-to-all, every id to each column shard",
            "whole bags, per column shard",
            "all-to-all (gradients: all-to-all)",
        )
    if stype == "row_wise":
        return (
            "all-to-all to the row's rank",
            "partial sums, on every rank",
            "reduce-scatter (gradients: all-gather)",
        )
    if stype in ("table_row_wise", "grid_shard"):
        return (
            "all-to-all to the row's rank in the host",
            "partial sums, per rank of the host",
            "reduce-scatter in the host + all-to-all across hosts",
        )
    return "none (a replica on every rank)", "whole bags, on every rank", "none (gradients: all-reduce)"


def _fmt_seconds(t: float) -> str:
    return f"{t * 1e3:.2f} ms" if t >= 1e-5 else f"{t * 1e6:.2f} us"


def _rate(gbps: float) -> str:
    name = {NVLINK_H200_GBPS: ", NVLink on H200", IB_400_GBPS: ", InfiniBand"}.get(gbps, "")
    return f"{gbps:g} Gb/s ({gbps / 8:g} GB/s{name})"


def format_traffic(traffic: StepTraffic, intra_gbps: Optional[float], inter_gbps: Optional[float]) -> str:
    """The step's traffic as text: one line per sharding type (where ids go, where the TBE pools, which collective
    brings the pooled embeddings back), the all-reduces, then one line per rank (bytes handed to the input dist's
    all-to-alls, the output dist forward and backward and the all-reduces, their sum, the bytes that leave the
    rank, and the time at ``intra_gbps`` within a host / ``inter_gbps`` across hosts, Gb/s; no time column when
    they are None), then the step's collectives one after another."""
    tr = traffic
    head = (
        f"traffic per training step ({tr.batch_size:,} samples per rank; ids {dtype_size(tr.id_dtype)[0]}, lengths "
        f"{dtype_size(tr.length_dtype)[0]}, pooled embeddings and their gradients {tr.pooled_dtype}; ids are not "
        "deduplicated):"
    )
    if tr.world_size == 1:
        return head[:-1] + ": one rank, no collectives."
    counts: Dict[str, int] = {}
    for t in tr.tables:
        counts[t.sharding_type] = counts.get(t.sharding_type, 0) + 1
    flow = [("sharding type", "tables", "input dist: ids to the shards", "pooling (FBGEMM TBE)", "output dist")]
    for stype in sorted(counts, key=lambda s: (-counts[s], s)):
        flow.append((stype, str(counts[stype]), *_dataflow(stype)))
    out = [head, *_table(flow)]
    dp = sum(t.rows * t.dim for t in tr.tables if t.sharding_type == "data_parallel")
    out.append(
        f"all-reduce: {tr.dense_params:,} dense gradients ({tr.allreduce_dtype})"
        + (f", {dp:,} data_parallel table gradients (fp32, a DDP of their own)" if dp else "")
    )
    timed = intra_gbps is not None and inter_gbps is not None
    what = "bytes each rank hands each collective (its own share included)"
    if not timed:
        out.append(f"{what}:")
    elif tr.world_size > tr.local_world_size and intra_gbps != inter_gbps:
        out.append(f"{what}, and their time at {_rate(intra_gbps)} within a host, {_rate(inter_gbps)} across hosts:")  # type: ignore[arg-type]
    else:
        out.append(f"{what}, and their time at {_rate(intra_gbps)} per link:")  # type: ignore[arg-type]
    cols = ("rank", "splits", "lengths", "values", "out fwd", "out bwd", "all-reduce", "sum", "leaves rank")
    rows = [cols + (("time",) if timed else ())]
    for r in range(tr.world_size):
        ms = tr.of_rank(r)
        by = {
            "splits": sum(m.send_bytes for m in ms if m.tensor == "splits"),
            "lengths": sum(m.send_bytes for m in ms if m.tensor == "lengths"),
            "values": sum(m.send_bytes for m in ms if m.tensor == "values"),
            "out fwd": sum(m.send_bytes for m in ms if m.stage == "output dist fwd"),
            "out bwd": sum(m.send_bytes for m in ms if m.stage == "output dist bwd"),
            "all-reduce": sum(m.send_bytes for m in ms if m.stage == "all-reduce"),
        }
        row = [str(r), *(format_bytes(v) for v in by.values()), format_bytes(sum(by.values()))]
        row.append(format_bytes(sum(m.out_intra + m.out_inter for m in ms)))
        if timed:
            row.append(_fmt_seconds(sum(m.seconds(intra_gbps, inter_gbps) for m in ms)))  # type: ignore[arg-type]
        rows.append(tuple(row))
    out += _table(rows)
    if timed:
        step = _fmt_seconds(tr.step_seconds(intra_gbps, inter_gbps))  # type: ignore[arg-type]
        out.append(
            f"the step's collectives one after another, each as slow as its slowest rank: {step} "
            "(link peak rates; overlap with compute not counted)"
        )
    return "\n".join(out)


def _table(rows: Sequence[Tuple[str, ...]]) -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(rows[0]), line(tuple("-" * w for w in widths)), *(line(r) for r in rows[1:])]


def link_rates(device_type: str, link_gbps: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
    """``(within a host, across hosts)`` in Gb/s: ``link_gbps`` for both when given; else on CUDA the named
    defaults (:data:`NVLINK_H200_GBPS`, :data:`IB_400_GBPS`); else ``(None, None)`` (no time for CPU jobs)."""
    if link_gbps is not None:
        return link_gbps, link_gbps
    if device_type == "cuda":
        return NVLINK_H200_GBPS, IB_400_GBPS
    return None, None


def traffic_report(traffic: StepTraffic, device_type: str, link_gbps: Optional[float] = None) -> str:
    """:func:`format_traffic` at the rates of :func:`link_rates`: what ``python -m dlrm.plan`` prints and the
    trainer logs at start-up."""
    return format_traffic(traffic, *link_rates(device_type, link_gbps))
