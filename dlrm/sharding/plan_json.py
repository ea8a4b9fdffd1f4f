"""``plan.json``: a plan written as JSON with its fingerprint, and read back into the exact ``ShardingPlan`` after
checking it fits the job (TorchRec has no file format for plans)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Sequence

from torchrec.distributed.sharding_plan import placement
from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan, ShardingType

from dlrm.errors import InputError
from dlrm.sharding.sharders import EmbeddingBagSharder
from dlrm.sharding.types import PlanError, PlanInfo, TableInfo
from dlrm.torchrec_compat import EnumerableShardingSpec, ShardMetadata

PLAN_FORMAT = "dlrm-plan/1"
_KEY = "config key `sharding.plan_path`"  # the key every load_plan error names


def plan_to_json(pi: PlanInfo) -> Dict[str, Any]:
    """The plan as a JSON-able dict (``plan.json``): topology, then one entry per table with its shards."""
    est = {(s["module"], s["table"], s["rank"], tuple(s["offsets"])): s for s in pi.shards}
    tables = []
    for module, mplan in pi.plan.plan.items():
        for name, ps in mplan.items():  # type: ignore[union-attr]
            if ps.sharding_spec is not None:
                metas = [
                    (m.placement.rank(), list(m.shard_offsets), list(m.shard_sizes)) for m in ps.sharding_spec.shards
                ]
            else:  # data_parallel: a full replica on every rank
                full = next((s["sizes"] for s in pi.shards if s["table"] == name), None)
                metas = [(r, [0, 0], full) for r in ps.ranks]
            shards = []
            for rank, off, size in metas:
                e = est.get((module, name, rank, tuple(off)), {})
                shards.append(
                    {
                        "rank": rank,
                        "offsets": off,
                        "sizes": size,
                        "hbm_bytes": e.get("hbm_bytes"),
                        "ddr_bytes": e.get("ddr_bytes"),
                    }
                )
            tables.append(
                {
                    "module": module,
                    "table": name,
                    "sharding_type": ps.sharding_type,
                    "compute_kernel": ps.compute_kernel,
                    "ranks": list(ps.ranks or []),
                    "shards": shards,
                }
            )
    return {
        "format": PLAN_FORMAT,
        "world_size": pi.world_size,
        "local_world_size": pi.local_world_size,
        "compute_device": pi.compute_device,
        "hbm_cap_bytes": pi.hbm_cap_bytes,
        "ddr_cap_bytes": pi.ddr_cap_bytes,
        "tables": tables,
    }


def plan_fingerprint(pi: PlanInfo) -> str:
    """12 hex digits naming the placement: every table's sharding type, kernel, ranks and shards, and the world
    layout (memory estimates left out). The same plan gives the same fingerprint on every launch and machine."""
    doc = plan_to_json(pi)
    tables = [
        {k: v for k, v in t.items() if k != "shards"}
        | {"shards": [[s["rank"], s["offsets"], s["sizes"]] for s in t["shards"]]}
        for t in doc["tables"]
    ]
    key = {
        "world_size": pi.world_size,
        "local_world_size": pi.local_world_size,
        "device": pi.compute_device,
        "tables": tables,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def save_plan(pi: PlanInfo, path: str) -> None:
    """Write ``plan.json`` (:func:`plan_to_json` plus its :func:`plan_fingerprint`)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**plan_to_json(pi), "fingerprint": plan_fingerprint(pi)}, f, indent=1)
        f.write("\n")


def load_plan(
    path: str,
    tables: Sequence[TableInfo],
    world_size: int,
    local_world_size: int,
    device_type: str,
    hbm_cap: int = 0,
    ddr_cap: int = 0,
) -> PlanInfo:
    """Read a ``plan.json`` and rebuild the exact ``ShardingPlan``, after checking it fits this job.

    Raises:
        PlanError: unreadable file; a different world size; a table missing from the model or the plan; shards
            that do not tile the table; a kernel this device cannot run.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(f"{_KEY}: cannot read {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(f"{_KEY}: {path} is not a plan.json ({PLAN_FORMAT}); write one with python -m dlrm.plan")
    try:
        return _plan_from_json(doc, path, tables, world_size, local_world_size, device_type, hbm_cap, ddr_cap)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PlanError(
            f"{_KEY}: {path} is damaged or hand-edited ({type(e).__name__}: {e}); write it again with python -m "
            "dlrm.plan ... out=<file>, or drop sharding.plan_path to re-plan"
        ) from e


def _plan_from_json(
    doc: Dict[str, Any],
    path: str,
    tables: Sequence[TableInfo],
    world_size: int,
    local_world_size: int,
    device_type: str,
    hbm_cap: int,
    ddr_cap: int,
) -> PlanInfo:
    """:func:`load_plan`'s checks and rebuild of a parsed ``plan.json`` (a missing or mistyped field raises
    KeyError / TypeError / ValueError, which :func:`load_plan` reports)."""
    if doc["world_size"] != world_size:
        raise PlanError(
            f"{_KEY}: {path} places tables on {doc['world_size']} ranks but this job has {world_size}; "
            f"launch {doc['world_size']} processes, or drop sharding.plan_path to re-plan"
        )
    by_name = {t.name: t for t in tables}
    named = {t["table"] for t in doc["tables"]}
    if named != set(by_name):
        extra, missing = sorted(named - set(by_name)), sorted(set(by_name) - named)
        raise PlanError(
            f"{_KEY}: {path} does not match the model: tables not in the model {extra}, tables not in "
            f"the plan {missing}; re-plan for this model (drop sharding.plan_path)"
        )
    sharder = EmbeddingBagSharder()
    plan: Dict[str, Any] = {}
    shards = []
    for t in doc["tables"]:
        info = by_name[t["table"]]
        stype, kernel = t["sharding_type"], t["compute_kernel"]
        if stype not in sharder.sharding_types(device_type) or kernel not in sharder.compute_kernels(
            stype, device_type
        ):
            raise PlanError(
                f"{_KEY}: table {info.name} is {stype} / {kernel} in {path}, which {device_type} cannot "
                "run; re-plan on this device (drop sharding.plan_path)"
            )
        _check_tiling(t, info, path, world_size)
        shards += [
            {"module": t["module"], "table": info.name, "sharding_type": stype, "compute_kernel": kernel, **s}
            for s in t["shards"]
        ]
        plan.setdefault(t["module"], {})[info.name] = _parameter_sharding(t, device_type, local_world_size)
    sp = ShardingPlan({m: EmbeddingModuleShardingPlan(p) for m, p in plan.items()})
    return PlanInfo(sp, world_size, local_world_size, device_type, hbm_cap, ddr_cap, shards, source=path)


def _check_tiling(t: Dict[str, Any], info: TableInfo, path: str, world_size: int) -> None:
    """Check that the shards of table entry ``t`` (of the ``plan.json`` at ``path``) tile the ``info.rows`` x
    ``info.dim`` table on ranks below ``world_size``: inside it, listed in ``ranks`` in order, not overlapping,
    and covering it (once per rank for data_parallel).

    Raises:
        PlanError: naming the table, the file and the shard at fault.
    """
    area = 0
    for s in t["shards"]:
        r0, c0 = s["offsets"]
        r, c = s["sizes"]
        if not (0 <= s["rank"] < world_size and r0 + r <= info.rows and c0 + c <= info.dim):
            raise PlanError(
                f"{_KEY}: table {info.name} in {path}: shard {s} lies outside the {info.rows} x "
                f"{info.dim} table or the {world_size} ranks; re-plan for this model"
            )
        area += r * c
    if list(t["ranks"]) != [s["rank"] for s in t["shards"]]:  # TorchRec places shard i on ranks[i]
        raise PlanError(
            f"{_KEY}: table {info.name} in {path}: ranks {t['ranks']} do not list its shards' ranks "
            f"{[s['rank'] for s in t['shards']]} in order; re-plan for this model (drop sharding.plan_path)"
        )
    replicated = t["sharding_type"] == ShardingType.DATA_PARALLEL.value
    if not replicated:
        boxes = [(*s["offsets"], *s["sizes"]) for s in t["shards"]]
        for i, (r0, c0, r, c) in enumerate(boxes):
            for q0, d0, q, d in boxes[i + 1 :]:
                if r0 < q0 + q and q0 < r0 + r and c0 < d0 + d and d0 < c0 + c:
                    raise PlanError(
                        f"{_KEY}: table {info.name} in {path}: shards at rows {r0}, cols {c0} and rows {q0}, "
                        f"cols {d0} overlap; re-plan for this model (drop sharding.plan_path)"
                    )
    expect = info.rows * info.dim * (world_size if replicated else 1)
    if area != expect:
        raise PlanError(
            f"{_KEY}: table {info.name} in {path}: its shards cover {area} of {expect} "
            f"elements of the {info.rows} x {info.dim} table; re-plan for this model"
        )


def _parameter_sharding(t: Dict[str, Any], device_type: str, local_world_size: int) -> ParameterSharding:
    """TorchRec's ``ParameterSharding`` of the checked table entry ``t``: its shards as an
    ``EnumerableShardingSpec`` placed on ``device_type`` ranks (none for a data_parallel replica)."""
    stype = t["sharding_type"]
    spec = (
        None
        if stype == ShardingType.DATA_PARALLEL.value
        else EnumerableShardingSpec(
            [
                ShardMetadata(
                    shard_offsets=list(s["offsets"]),
                    shard_sizes=list(s["sizes"]),
                    placement=placement(device_type, s["rank"], local_world_size),
                )
                for s in t["shards"]
            ]
        )
    )
    return ParameterSharding(
        sharding_type=stype, compute_kernel=t["compute_kernel"], ranks=list(t["ranks"]), sharding_spec=spec
    )
