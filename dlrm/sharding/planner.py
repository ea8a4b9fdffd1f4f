"""Plan the model with TorchRec's ``EmbeddingShardingPlanner`` (or load a saved plan), broadcast one plan to every
rank, and wrap the model in ``DistributedModelParallel``."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Stats
from torchrec.distributed.types import ShardingPlan, ShardingType

from dlrm.config import OptimizerConfig, ShardingConfig
from dlrm.process_group import DistInfo
from dlrm.sharding.constraints import _check_fits, _state_bytes_per_row, _too_big, build_constraints, topology
from dlrm.sharding.optimizer import fuse_embedding_optimizer
from dlrm.sharding.plan_json import load_plan
from dlrm.sharding.sharders import EmbeddingBagSharder, sharders
from dlrm.sharding.types import FUSED_KERNELS, ConstraintHook, GiB, PlanError, PlanInfo, TableInfo, tables_of

# The order in which equally good options are tried: the planner keeps the first of equal cost, so this fixes the
# tie-break (TorchRec enumerates a table's types and kernels through set intersections, whose order varies with
# PYTHONHASHSEED from one launch to the next).
_TYPE_ORDER = {t.value: i for i, t in enumerate(ShardingType)}
_KERNEL_ORDER = {k: i for i, k in enumerate(FUSED_KERNELS + ("dense",))}


class DeterministicEnumerator(EmbeddingEnumerator):
    """TorchRec's enumerator with its sharding options in a fixed order: tables as the model holds them, and per
    table by sharding type (``ShardingType`` order), then compute kernel, then TorchRec's own order. Same options,
    same cost estimates; only equal-cost ties resolve the same way on every launch, so the same model, world size,
    topology and config give the same plan."""

    def enumerate(self, module: torch.nn.Module, sharders: List[Any]) -> List[Any]:
        """TorchRec's ``ShardingOption`` list for ``module``, sorted by table (first appearance), then sharding type
        (``ShardingType`` order), then compute kernel (fused, fused_uvm, fused_uvm_caching, dense, then others by
        name); options equal in all three keep TorchRec's order."""
        options = super().enumerate(module, sharders)
        first = {}
        for i, so in enumerate(options):
            first.setdefault((so.path, so.name), i)
        return sorted(
            options,
            key=lambda so: (
                first[(so.path, so.name)],
                _TYPE_ORDER.get(so.sharding_type, len(_TYPE_ORDER)),
                _KERNEL_ORDER.get(so.compute_kernel, len(_KERNEL_ORDER)),
                so.compute_kernel,
            ),
        )


class _CaptureStats(Stats):
    """Keeps the planner's chosen ``ShardingOption`` list (per-shard storage estimates) for the plan table."""

    def __init__(self) -> None:
        self.best_plan: List[Any] = []

    def log(self, *args: Any, **kwargs: Any) -> None:  # signature: torchrec Stats.log (keyword call)
        self.best_plan = list(kwargs.get("best_plan") or (args[7] if len(args) > 7 else []))


def _check_dtypes(pi: "PlanInfo", tables: Sequence[TableInfo]) -> "PlanInfo":
    """Refuse fp16 weights on data_parallel tables (DDP gradients and a dense optimizer would step them in
    half precision, without FBGEMM's fp32 state and stochastic rounding)."""
    half = {t.name for t in tables if t.weight_bytes != 4}
    bad = sorted({s["table"] for s in pi.shards if s["sharding_type"] == ShardingType.DATA_PARALLEL.value} & half)
    if bad:
        raise PlanError(
            f"tables {', '.join(bad)} are data_parallel with half-precision weights "
            f"(perf.embedding_dtype); set perf.embedding_dtype=fp32, or constrain them to a fused "
            f"sharding type (sharding.constraints.<table>.sharding_types=[table_wise])"
        )
    return pi


def _apply_constraint_kernels(pi: PlanInfo, wanted: Dict[str, ParameterConstraints], path: str) -> None:
    """Hold a loaded plan to the kernels and cache parameters the constraint hook sets (host offload): a table
    ``offload.*`` puts in host memory must have that kernel in the plan, and gets the hook's ``CacheParams``
    (``plan.json`` records placements, not cache settings), so a plan and a resumed run keep ``offload.*``.

    Raises:
        PlanError: the plan gives such a table another compute kernel.
    """
    for module_plan in pi.plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            c = wanted.get(name)
            if c is None or not c.compute_kernels:
                continue
            if ps.compute_kernel not in c.compute_kernels:
                raise PlanError(
                    f"config key `sharding.plan_path`: table {name} is {ps.compute_kernel} in {path}, but "
                    f"offload.* puts it on {c.compute_kernels[0]}; write the plan with the same offload.* keys "
                    "(python -m dlrm.plan ... out=plan.json), or drop sharding.plan_path to re-plan"
                )
            ps.cache_params = c.cache_params


def plan_model(
    model: torch.nn.Module,
    cfg: ShardingConfig,
    *,
    world_size: int,
    local_world_size: int,
    device: torch.device,
    batch_size: int,
    sparse_type: str = "adagrad",
    pooling_factors: Optional[Dict[str, float]] = None,
    constraint_hook: Optional[ConstraintHook] = None,
) -> PlanInfo:
    """Plan ``model`` (tables on the meta device) in this process; no process group needed.

    Args:
        model: the unsharded model; call :func:`fuse_embedding_optimizer` first so the planner counts the
            optimizer state.
        cfg: ``sharding.*``. With ``plan_path`` set, the saved plan is loaded and checked instead of planning.
        world_size / local_world_size / device: the job to plan for (``device.type``: ``cuda`` or ``cpu``).
        batch_size: samples per rank per step.
        sparse_type: ``optimizer.sparse_type``, for the memory check.
        pooling_factors: table -> mean ids per sample (the MLPerf multi-hot sizes).
        constraint_hook: rewrites the per-table constraints after the ``sharding.*`` ones are built (host offload
            sets kernels and cache parameters this way: ``dlrm.offload.offload_constraints``).

    Raises:
        PlanError: see :func:`build_constraints`, :func:`load_plan`; a table that cannot fit; no plan found.
    """
    tables = tables_of(model)
    topo = topology(world_size, local_world_size, device.type, cfg, device)
    hbm_cap, ddr_cap = int(topo.devices[0].storage.hbm), int(topo.devices[0].storage.ddr)
    if cfg.plan_path:
        pi = load_plan(cfg.plan_path, tables, world_size, local_world_size, device.type, hbm_cap, ddr_cap)
        return _checked_loaded_plan(pi, tables, cfg.plan_path, constraint_hook)
    sharder = EmbeddingBagSharder()
    constraints = build_constraints(cfg, tables, device.type, pooling_factors, sharder)
    if world_size == 1 and not cfg.sharding_types:
        _table_wise_on_one_rank(constraints, cfg)
    if constraint_hook is not None:
        constraints = constraint_hook(constraints)
    _check_fits(tables, constraints, topo, cfg, sparse_type)
    stats = _CaptureStats()
    planner = EmbeddingShardingPlanner(
        topology=topo,
        batch_size=batch_size,
        enumerator=DeterministicEnumerator(topology=topo, batch_size=batch_size, constraints=constraints),
        constraints=constraints,
        storage_reservation=HeuristicalStorageReservation(percentage=cfg.storage_reservation),
        stats=[stats],
        debug=False,
    )
    all_sharders = [sharder if isinstance(s, EmbeddingBagSharder) else s for s in sharders()]
    try:
        plan = planner.plan(model, all_sharders)
    except PlannerError as e:
        mem_cap = hbm_cap if device.type == "cuda" else ddr_cap
        raise _no_placement(e, tables, cfg, sparse_type, world_size, batch_size, mem_cap, device.type) from e
    shards = _shards_of(stats.best_plan)
    pi = _check_dtypes(PlanInfo(plan, world_size, local_world_size, device.type, hbm_cap, ddr_cap, shards), tables)
    return _check_half_precision_state(pi, tables, sparse_type, cfg)


def _checked_loaded_plan(
    pi: PlanInfo, tables: Sequence[TableInfo], path: str, constraint_hook: Optional[ConstraintHook]
) -> PlanInfo:
    """A plan read from ``path`` (``sharding.plan_path``), held to the dtype rule and to the kernels and cache
    parameters ``constraint_hook`` sets.

    Raises:
        PlanError: see :func:`_check_dtypes`, :func:`_apply_constraint_kernels`.
    """
    pi = _check_dtypes(pi, tables)
    if constraint_hook is not None:
        wanted = constraint_hook({t.name: ParameterConstraints() for t in tables}) or {}
        _apply_constraint_kernels(pi, wanted, path)
    return pi


def _table_wise_on_one_rank(constraints: Dict[str, ParameterConstraints], cfg: ShardingConfig) -> None:
    """Constrain every table to table_wise on a one-rank job whose preset names no sharding type, except tables
    with their own ``sharding_types`` and those ``sharding.data_parallel_max_rows`` makes data_parallel."""
    # One rank holds every table whatever the type; TorchRec's planner then picks among equal-memory layouts by
    # small cost-model differences (table_wise, table_column_wise or column_wise, depending on the HBM cap),
    # and the column-split ones keep more TBE groups and launch more kernels per step.
    # table_wise is the layout stock TorchRec gets on one GPU.
    for name, c in constraints.items():
        explicit = cfg.constraints.get(name)
        kept = c.sharding_types == [ShardingType.DATA_PARALLEL.value]  # sharding.data_parallel_max_rows
        if not (explicit and explicit.sharding_types) and not kept:
            c.sharding_types = [ShardingType.TABLE_WISE.value]


def _no_placement(
    e: PlannerError,
    tables: Sequence[TableInfo],
    cfg: ShardingConfig,
    sparse_type: str,
    world_size: int,
    batch_size: int,
    mem_cap: int,
    device_type: str,
) -> PlanError:
    """The error for a planner that found no placement: whether the tables exceed all ranks' memory together,
    the largest alone exceeds one rank's, or the other buffers the planner counts do, with the options for each.
    ``mem_cap``: bytes per rank of HBM (``cuda``) or host memory, before ``sharding.storage_reservation``."""
    per_row = {t.name: _state_bytes_per_row(t.dim, sparse_type, t.weight_bytes) for t in tables}
    biggest = max(tables, key=lambda t: t.rows * per_row[t.name])
    need = biggest.rows * per_row[biggest.name]
    cap = mem_cap * (1 - cfg.storage_reservation)
    total = sum(t.rows * per_row[t.name] for t in tables)
    if total > cap * world_size:
        why = (
            f"Together they need at least {math.ceil(total / cap)} ranks of this size. Options: use more GPUs, "
            f"keep tables in host memory with an HBM cache (offload=uvm_caching pipeline=prefetch, CUDA only), "
            f"fewer rows (model.row_cap), or raise sharding.hbm_cap_gb / ddr_cap_gb if the device has more"
        )
    elif need > cap:
        why = "Largest: " + _too_big(biggest, need, int(cap), device_type == "cuda")
    else:
        why = (
            f"The tables fit by size ({world_size} x {cap / GiB:.2f} GiB), so the planner's estimate of the "
            f"other memory at batch size {batch_size} per rank (input and output buffers) does not: lower "
            f"data.batch_size or sharding.storage_reservation, or use more GPUs"
        )
    return PlanError(
        f"the planner found no placement for {len(tables)} tables on {world_size} rank{'s' * (world_size != 1)} "
        f"({total / GiB:.2f} GiB of weights and optimizer state in all, about {cap / GiB:.2f} GiB per rank "
        f"usable). {why}\nTorchRec planner: {str(e).splitlines()[0]}"
    )


def _shards_of(best_plan: Sequence[Any]) -> List[Dict[str, Any]]:
    """:attr:`PlanInfo.shards` from the planner's chosen ``ShardingOption`` list (``_CaptureStats.best_plan``)."""
    shards = []
    for so in best_plan:
        for sh in so.shards:
            st = sh.storage
            shards.append(
                {
                    "module": so.path,
                    "table": so.name,
                    "sharding_type": so.sharding_type,
                    "compute_kernel": so.compute_kernel,
                    "rank": int(sh.rank),
                    "offsets": list(sh.offset),
                    "sizes": list(sh.size),
                    "hbm_bytes": int(st.hbm) if st else None,
                    "ddr_bytes": int(st.ddr) if st else None,
                }
            )
    return shards


def _check_half_precision_state(
    pi: PlanInfo, tables: Sequence[TableInfo], sparse_type: str, cfg: ShardingConfig
) -> PlanInfo:
    """Add what TorchRec's planner leaves out for fp16 tables with element-wise Adagrad, and refuse a plan
    that then overflows HBM.

    TorchRec (1.6-1.8) sizes the optimizer state of a table in the weights' dtype, while FBGEMM keeps the Adagrad
    state in fp32 (tests/test_perf.py checks both), so each such weight needs 2 bytes more than planned. Row-wise
    Adagrad (one float per row) and fp32 tables are counted right.

    Raises:
        PlanError: naming the rank, its planned and real HBM need, and the storage reservation that leaves room.
    """
    half = {t.name: t for t in tables if t.weight_bytes != 4}
    if pi.compute_device != "cuda" or sparse_type != "adagrad" or not half:
        return pi
    planned: Dict[int, int] = {}
    missing: Dict[int, int] = {}
    for s in pi.shards:
        r = s["rank"]
        planned[r] = planned.get(r, 0) + (s["hbm_bytes"] or 0)
        t = half.get(s["table"])
        if t is not None and s["compute_kernel"] == "fused":  # weights and state in HBM
            rows, cols = s["sizes"]
            missing[r] = missing.get(r, 0) + rows * cols * (4 - t.weight_bytes)
    usable = pi.hbm_cap_bytes * (1 - cfg.storage_reservation)
    over = {r: planned[r] + missing.get(r, 0) for r in planned if planned[r] + missing.get(r, 0) > usable}
    if over:
        r, need = max(over.items(), key=lambda kv: kv[1])
        reserve = min(0.95, cfg.storage_reservation + (need - usable) / pi.hbm_cap_bytes + 0.01)
        raise PlanError(
            f"rank {r} would need {need / GiB:.2f} GiB of HBM, above the {usable / GiB:.2f} GiB usable: the plan "
            f"counted {planned[r] / GiB:.2f} GiB, but FBGEMM keeps the Adagrad state of fp16 tables in fp32 "
            f"({missing.get(r, 0) / GiB:.2f} GiB more than TorchRec's planner counts). Re-plan with "
            f"sharding.storage_reservation={reserve:.2f}, or use optimizer.sparse_type=rowwise_adagrad or "
            f"perf.embedding_dtype=fp32"
        )
    return pi


def make_plan(
    model: torch.nn.Module,
    info: DistInfo,
    cfg: ShardingConfig,
    batch_size: int,
    sparse_type: str = "adagrad",
    pooling_factors: Optional[Dict[str, float]] = None,
    constraint_hook: Optional[ConstraintHook] = None,
) -> PlanInfo:
    """Plan on rank 0 and broadcast (the planner is deterministic, but one plan must be used by all ranks).

    Config checks run on every rank first; a planner error on rank 0 is broadcast and raised on every rank
    (no rank is left waiting).

    Raises:
        PlanError: as :func:`plan_model`, on every rank.
    """
    kwargs = dict(
        world_size=info.world_size,
        local_world_size=info.local_world_size,
        device=info.device,
        batch_size=batch_size,
        sparse_type=sparse_type,
        pooling_factors=pooling_factors,
        constraint_hook=constraint_hook,
    )
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return plan_model(model, cfg, **kwargs)  # type: ignore[arg-type]
    if cfg.plan_path is None:
        build_constraints(cfg, tables_of(model), info.device.type, pooling_factors)  # same errors on all ranks
    box: List[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = plan_model(model, cfg, **kwargs)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - sent to the other ranks, re-raised below
            box[0] = e
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]


def shard(
    model: torch.nn.Module,
    info: DistInfo,
    cfg: ShardingConfig,
    opt: OptimizerConfig,
    batch_size: int,
    pooling_factors: Optional[Dict[str, float]] = None,
    constraint_hook: Optional[ConstraintHook] = None,
    fused_params: Optional[Dict[str, Any]] = None,
    allreduce_dtype: str = "fp32",
    ddp_bucket_cap_mb: int = 25,
) -> Tuple[DistributedModelParallel, ShardingPlan]:
    """Fuse the embedding optimizer, plan, and wrap with DMP (materialises the meta tables on their owners).

    ``fused_params`` go to the TBE kernels (e.g. ``{"output_dtype": SparseType.BF16}``, :func:`fused_params_of`).
    ``allreduce_dtype`` (``perf.allreduce_dtype``): ``fp32``, or ``bf16`` / ``fp16`` for TorchRec's
    ``DefaultDataParallelWrapper(allreduce_comm_precision=...)`` (a compress hook on the DDP all-reduce; none
    on one rank). ``ddp_bucket_cap_mb`` (``perf.ddp_bucket_cap_mb``): DDP's gradient bucket size in MiB.

    Returns ``(dmp, plan)``; the planner's estimates are on ``dmp.plan_info`` (:class:`PlanInfo`).

    Raises:
        PlanError: as :func:`make_plan`.
    """
    fuse_embedding_optimizer(model, opt)
    info_ = make_plan(model, info, cfg, batch_size, opt.sparse_type, pooling_factors, constraint_hook)
    # one rank has nothing to reduce: a compress hook there would only round the gradients
    precision = None if allreduce_dtype == "fp32" or info.world_size == 1 else allreduce_dtype
    wrapper = DefaultDataParallelWrapper(bucket_cap_mb=ddp_bucket_cap_mb, allreduce_comm_precision=precision)
    dmp = DistributedModelParallel(
        module=model,
        device=info.device,
        plan=info_.plan,
        sharders=sharders(fused_params),
        data_parallel_wrapper=wrapper,
    )
    dmp.plan_info = info_  # type: ignore[attr-defined]
    return dmp, info_.plan
