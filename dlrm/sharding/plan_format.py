"""Plans for people: the plan table printed before training, and short summaries of a ``ShardingPlan``."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from torchrec.distributed.types import ShardingPlan

from dlrm.sharding.plan_json import plan_fingerprint
from dlrm.sharding.types import GiB, PlanInfo


def _fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit, div in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def _ranks(rs: Sequence[int]) -> str:
    rs = sorted(set(rs))
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"{rs[0]}-{rs[-1]}"
    return ",".join(map(str, rs))


def format_plan(pi: PlanInfo) -> str:
    """The plan as a text table: one line per table (sharding type, kernel, ranks, shard shapes, estimated
    memory on each rank it uses), then one line per rank (estimated HBM and host memory, and capacity)."""
    by_table: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for s in pi.shards:
        by_table.setdefault((s["module"], s["table"]), []).append(s)
    mem_key = "hbm_bytes" if pi.compute_device == "cuda" else "ddr_bytes"

    def natural(k: Tuple[str, str]) -> Tuple[str, str, int]:
        head, _, tail = k[1].rpartition("_")
        return (k[0], head, int(tail)) if tail.isdigit() else (k[0], k[1], -1)

    rows = []
    for k in sorted(by_table, key=natural):
        ss = by_table[k]
        shapes: Dict[Tuple[int, int], int] = {}
        for s in ss:
            shapes[tuple(s["sizes"])] = shapes.get(tuple(s["sizes"]), 0) + 1  # type: ignore[index]
        shape_txt = " + ".join(f"{n}x[{a},{b}]" for (a, b), n in shapes.items())
        per_rank: Dict[int, float] = {}
        for s in ss:
            if s.get(mem_key) is not None:
                per_rank[s["rank"]] = per_rank.get(s["rank"], 0) + s[mem_key]
        if per_rank:
            vals = set(round(v) for v in per_rank.values())
            mem = (
                f"{_fmt_bytes(next(iter(per_rank.values())))} on each"
                if len(vals) == 1 and len(per_rank) > 1
                else ", ".join(f"r{r}: {_fmt_bytes(v)}" for r, v in sorted(per_rank.items()))
            )
        else:
            mem = "?"
        rows.append(
            (k[1], ss[0]["sharding_type"], ss[0]["compute_kernel"], _ranks([s["rank"] for s in ss]), shape_txt, mem)
        )
    head = ("table", "sharding type", "kernel", "ranks", "shards (rows x cols)", "est. memory per rank")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    out = [
        f"sharding plan ({pi.source}) for {pi.world_size} ranks ({pi.local_world_size} per host) on "
        f"{pi.compute_device}, fingerprint {plan_fingerprint(pi)}:",
        line(head),
        line(tuple("-" * w for w in widths)),
    ]
    out += [line(r) for r in rows]
    hbm = [0.0] * pi.world_size
    ddr = [0.0] * pi.world_size
    known = any(s.get("hbm_bytes") is not None for s in pi.shards)
    for s in pi.shards:
        hbm[s["rank"]] += s.get("hbm_bytes") or 0
        ddr[s["rank"]] += s.get("ddr_bytes") or 0
    if known:
        out.append("estimated embedding memory per rank (TorchRec estimate: weights, optimizer state, buffers):")
        for r in range(pi.world_size):
            if pi.compute_device == "cuda":
                out.append(
                    f"  rank {r}: HBM {_fmt_bytes(hbm[r])} of {_fmt_bytes(pi.hbm_cap_bytes)}, "
                    f"host {_fmt_bytes(ddr[r])} of {_fmt_bytes(pi.ddr_cap_bytes)}"
                )
            else:
                out.append(f"  rank {r}: host {_fmt_bytes(ddr[r])} of {_fmt_bytes(pi.ddr_cap_bytes)}")
    return "\n".join(out)


def plan_rows(plan: ShardingPlan) -> List[Tuple[str, str, str, str]]:
    """``(tables, sharding type, compute kernel, ranks)``, one row per distinct placement, tables in order."""
    groups: Dict[Tuple[str, str, str], List[str]] = {}
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            ranks = sorted({int(r) for r in (ps.ranks or [])})
            key = (ps.sharding_type, ps.compute_kernel, ",".join(map(str, ranks)) or "all")
            groups.setdefault(key, []).append(name)

    def natural(name: str) -> Tuple[str, int]:
        head, _, tail = name.rpartition("_")
        return (head, int(tail)) if tail.isdigit() else (name, -1)

    return [(" ".join(sorted(tables, key=natural)), *key) for key, tables in sorted(groups.items())]


def sharding_types_of(plan: ShardingPlan) -> List[str]:
    """The sharding type of every table in ``plan`` (a ``ShardingPlan``), in plan order."""
    return [ps.sharding_type for module_plan in plan.plan.values() for ps in module_plan.values()]  # type: ignore
