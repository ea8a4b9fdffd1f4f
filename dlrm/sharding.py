"""Plan and shard the model with TorchRec: ``EmbeddingShardingPlanner`` over the real topology with per-table
``ParameterConstraints`` from ``sharding.*``, then ``DistributedModelParallel`` (DMP), with the embedding
optimizer fused into the TBE backward. Plans are printed as a table and saved / loaded as ``plan.json``.

Plan without training (any world size, meta device, no GPU needed)::

    python -m dlrm.plan model=dlrm_v2 world_size=8 device=cuda sharding.hbm_cap_gb=139.8

What is ours and why: the planner, sharders, enumerator and cost model are TorchRec's. Ours are the mapping from
config to ``ParameterConstraints`` with checks that fail at plan time naming the table and the fix (TorchRec
silently widens a column shard that does not divide, and its no-plan error does not name the table), a sharder
that allows row_wise / table_row_wise / grid_shard on CPU (TorchRec's refuses them there although they train
correctly: tests/test_sharding_equivalence.py), and a JSON form of the plan (TorchRec has no file format).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torchrec.optim as trec_optim
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Stats
from torchrec.distributed.sharding_plan import get_default_sharders, placement
from torchrec.distributed.types import ParameterSharding, ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrm.config import OptimizerConfig, ShardingConfig
from dlrm.dist import DistInfo
from dlrm.errors import InputError
from dlrm.torchrec_compat import EnumerableShardingSpec, ShardMetadata

log = logging.getLogger(__name__)

PLAN_FORMAT = "dlrm-plan/1"
GiB = 2**30
# Rewrites the per-table planner constraints (table name -> ParameterConstraints) before planning.
ConstraintHook = Callable[[Dict[str, ParameterConstraints]], Dict[str, ParameterConstraints]]
# Kernels that keep the weights in device memory (HBM) on CUDA; FBGEMM's TBE needs dim % 4 == 0 for all fused ones.
FUSED_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching")
WHOLE_TABLE_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.DATA_PARALLEL.value)
COLUMN_TYPES = (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value, ShardingType.GRID_SHARD.value)


class PlanError(InputError):
    """The sharding config cannot be planned or run; the message names the table, config key and fix."""


# ------------------------------------------------------------------------------------------------ sharders
class EmbeddingBagSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EmbeddingBagCollection sharder, plus row_wise, table_row_wise and grid_shard on CPU.

    TorchRec lists those three only for CUDA; on CPU with gloo they train exactly like the unsharded model
    (tests/test_sharding_equivalence.py checks every type against an unsharded reference).
    """

    def sharding_types(self, compute_device_type: str) -> List[str]:
        """TorchRec's sharding types for ``compute_device_type`` (``cuda``, ``cpu``, ...), plus row_wise,
        table_row_wise and grid_shard on ``cpu``."""
        types = list(super().sharding_types(compute_device_type))
        if compute_device_type == "cpu":
            for t in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD):
                if t.value not in types:
                    types.append(t.value)
        return types


def sharders(fused_params: Optional[Dict[str, Any]] = None) -> List[Any]:
    """TorchRec's default sharders with the EmbeddingBagCollection one replaced by :class:`EmbeddingBagSharder`
    built with ``fused_params`` (TBE options such as ``output_dtype``: :func:`fused_params_of`)."""
    return [
        EmbeddingBagSharder(fused_params=fused_params) if type(s) is EmbeddingBagCollectionSharder else s
        for s in get_default_sharders()
    ]


def fused_params_of(
    embedding_output_dtype: str, tbe_bounds_check: str = "warning", tbe_stochastic_rounding: bool = True
) -> Optional[Dict[str, Any]]:
    """TBE fused params for ``perf.embedding_output_dtype``, ``perf.tbe_bounds_check`` and
    ``perf.tbe_stochastic_rounding`` (None when all are TorchRec's defaults: fp32 output, FBGEMM's
    ``BoundsCheckMode.WARNING``, stochastic rounding of fp16 weights)."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    dtypes = {"fp16": SparseType.FP16, "bf16": SparseType.BF16}
    params: Dict[str, Any] = {}
    if embedding_output_dtype in dtypes:
        params["output_dtype"] = dtypes[embedding_output_dtype]
    if tbe_bounds_check != "warning":
        params["bounds_check_mode"] = {"fatal": BoundsCheckMode.FATAL, "none": BoundsCheckMode.NONE}[tbe_bounds_check]
    if not tbe_stochastic_rounding:
        params["stochastic_rounding"] = False
    return params or None


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


# ------------------------------------------------------------------------------------------------ optimizer
def fuse_embedding_optimizer(model: torch.nn.Module, opt: OptimizerConfig) -> None:
    """Attach the embedding optimizer to every table weight, to be fused into backward by DMP.

    ``adagrad`` maps to FBGEMM EXACT_ADAGRAD (element-wise, the MLPerf rule), ``rowwise_adagrad`` to
    EXACT_ROWWISE_ADAGRAD. eps comes from the config (MLPerf: 1e-8); the accumulator starts at 0. The planner
    reads the optimizer class off the weights to estimate optimizer-state memory.
    """
    cls = torch.optim.Adagrad if opt.sparse_type == "adagrad" else trec_optim.RowWiseAdagrad
    params = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    kwargs = {"lr": opt.embedding_lr, "eps": opt.eps}
    apply_optimizer_in_backward(cls, params, kwargs)


def sharding_types_of(plan: ShardingPlan) -> List[str]:
    """The sharding type of every table in ``plan`` (a ``ShardingPlan``), in plan order."""
    return [ps.sharding_type for module_plan in plan.plan.values() for ps in module_plan.values()]  # type: ignore


def dense_params(model: DistributedModelParallel) -> dict:
    """Parameters not updated in backward by a fused optimizer (the MLPs, and data_parallel tables)."""
    return dict(in_backward_optimizer_filter(model.named_parameters()))


def dense_optimizer(model: DistributedModelParallel, opt: OptimizerConfig) -> KeyedOptimizer:
    """The optimizer of every parameter not fused into backward.

    The MLPs get Adagrad(``optimizer.lr``). data_parallel tables, which DMP trains with all-reduced gradients
    rather than a fused TBE optimizer, get the embedding optimizer (``optimizer.sparse_type``,
    ``optimizer.sparse_lr``) that fused tables get, so every placement trains the same model.
    """
    params = dense_params(model)
    tables = {n: p for n, p in params.items() if "embedding_bags" in n}
    mlp = {n: p for n, p in params.items() if n not in tables}
    table_cls = torch.optim.Adagrad if opt.sparse_type == "adagrad" else trec_optim.RowWiseAdagrad
    parts: List[Tuple[str, KeyedOptimizer]] = []
    if mlp:
        parts.append(("dense", KeyedOptimizerWrapper(mlp, lambda ps: torch.optim.Adagrad(ps, lr=opt.lr, eps=opt.eps))))
    if tables:
        parts.append(
            ("dp_tables", KeyedOptimizerWrapper(tables, lambda ps: table_cls(ps, lr=opt.embedding_lr, eps=opt.eps)))
        )
    return parts[0][1] if len(parts) == 1 else CombinedOptimizer(parts)


# ------------------------------------------------------------------------------------------------ topology
def _host_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def topology(
    world_size: int, local_world_size: int, device_type: str, cfg: ShardingConfig, device: Optional[torch.device] = None
) -> Topology:
    """The planner's view of the machines.

    Args:
        world_size / local_world_size: from the launcher (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``).
        device_type: ``cuda`` or ``cpu``.
        cfg: ``sharding.hbm_cap_gb`` (GiB per rank; null: the device's ``total_memory``) and
            ``sharding.ddr_cap_gb`` (GiB per rank; null: this host's RAM / local world size).
        device: the CUDA device to read the capacity from.

    Raises:
        PlanError: CUDA planning without a visible GPU and without ``sharding.hbm_cap_gb``.
    """
    if world_size % local_world_size:
        raise PlanError(
            f"world size {world_size} is not a multiple of the local world size {local_world_size}; "
            "give a local_world_size that divides it"
        )
    ddr = int(cfg.ddr_cap_gb * GiB) if cfg.ddr_cap_gb else _host_memory_bytes() // local_world_size
    kwargs: Dict[str, Any] = {"ddr_cap": ddr}
    if device_type == "cuda":
        if cfg.hbm_cap_gb:
            kwargs["hbm_cap"] = int(cfg.hbm_cap_gb * GiB)
        elif torch.cuda.is_available():
            kwargs["hbm_cap"] = int(torch.cuda.get_device_properties(device or torch.device("cuda", 0)).total_memory)
        else:
            raise PlanError(
                "config key `sharding.hbm_cap_gb`: planning for CUDA on a machine without a GPU needs "
                "the device memory per rank in GiB, e.g. sharding.hbm_cap_gb=139.8 (H200: "
                "torch.cuda.get_device_properties(0).total_memory / 2**30 on the GPU machine)"
            )
    return Topology(world_size=world_size, local_world_size=local_world_size, compute_device=device_type, **kwargs)


# ------------------------------------------------------------------------------------------------ constraints
@dataclasses.dataclass
class TableInfo:
    """One embedding table of a shardable module: ``rows`` x ``dim`` weights of ``weight_bytes`` bytes each (4:
    fp32, 2: fp16, ``perf.embedding_dtype``), at ``module`` (an FQN)."""

    module: str
    name: str
    rows: int
    dim: int
    features: List[str]
    weight_bytes: int = 4


def tables_of(model: torch.nn.Module) -> List[TableInfo]:
    """Every table of every ``EmbeddingBagCollection`` in ``model``, in order."""
    out = []
    for path, m in model.named_modules():
        if isinstance(m, EmbeddingBagCollection):
            for c in m.embedding_bag_configs():
                nbytes = 4 if c.data_type == DataType.FP32 else 2
                out.append(TableInfo(path, c.name, c.num_embeddings, c.embedding_dim, list(c.feature_names), nbytes))
    return out


def _state_bytes_per_row(dim: int, sparse_type: str, weight_bytes: int = 4) -> int:
    """Weights plus fp32 Adagrad state per row: element-wise ``dim`` floats, row-wise one float (FBGEMM keeps the
    state in fp32 for fp16 weights too)."""
    return weight_bytes * dim + (4 * dim if sparse_type == "adagrad" else 4)


def build_constraints(
    cfg: ShardingConfig,
    tables: Sequence[TableInfo],
    device_type: str,
    pooling_factors: Optional[Dict[str, float]] = None,
    sharder: Optional[Any] = None,
) -> Dict[str, ParameterConstraints]:
    """Map ``sharding.*`` onto TorchRec ``ParameterConstraints``, one per table, checking what TorchRec would
    refuse late, silently remap, or run wrongly.

    Per table, ``sharding.constraints.<table>`` fields win over the preset (``sharding.sharding_types``,
    ``sharding.compute_kernel``, ``sharding.min_partition``). ``pooling_factors`` (table -> mean ids per
    sample) feeds the planner's cost model when the table has no ``pooling_factors`` of its own. A table with
    fp16 weights (``perf.embedding_dtype``) and no explicit sharding types (``sharding=auto``) is not offered
    data_parallel (see :func:`_check_dtypes`). With ``sharding.data_parallel_max_rows``, a table of at most that
    many rows and no ``sharding_types`` of its own is data_parallel on the dense kernel (or its own
    ``compute_kernels``), whatever the preset says.

    Raises:
        PlanError: a constraint names an unknown table; the dim is not a multiple of 4 for a fused kernel; a
            column shard width does not divide the dim; a sharding type or kernel the backend cannot run.
    """
    sharder = sharder or EmbeddingBagSharder()
    by_name = {t.name: t for t in tables}
    unknown = sorted(set(cfg.constraints) - set(by_name))
    if unknown:
        raise PlanError(
            f"config key `sharding.constraints.{unknown[0]}`: the model has no table {unknown[0]!r}; "
            f"its tables are {tables[0].name} .. {tables[-1].name} ({len(tables)} in all)"
        )
    runnable = sharder.sharding_types(device_type)
    out: Dict[str, ParameterConstraints] = {}
    dp_rows = cfg.data_parallel_max_rows
    for t in tables:
        c = cfg.constraints.get(t.name)
        ckey = f"sharding.constraints.{t.name}"
        types = (c.sharding_types if c and c.sharding_types else cfg.sharding_types) or list(runnable)
        type_key = f"{ckey}.sharding_types" if c and c.sharding_types else "sharding"
        kernels = c.compute_kernels if c and c.compute_kernels else [cfg.compute_kernel] if cfg.compute_kernel else None
        kernel_key = f"{ckey}.compute_kernels" if c and c.compute_kernels else "sharding.compute_kernel"
        by_rows = dp_rows is not None and t.rows <= dp_rows and not (c and c.sharding_types)
        if by_rows:
            # the hybrid placement: small tables replicated (their pooled embeddings skip the all-to-all); the
            # preset's kernel is for the model-parallel tables, so these take the dense one unless set per table
            types, type_key = [ShardingType.DATA_PARALLEL.value], "sharding.data_parallel_max_rows"
            if not (c and c.compute_kernels):
                kernels = None
        min_part = c.min_partition if c and c.min_partition else cfg.min_partition
        part_key = f"{ckey}.min_partition" if c and c.min_partition else "sharding.min_partition"
        if (
            t.weight_bytes != 4 and not (c and c.sharding_types) and not cfg.sharding_types and not by_rows
        ):  # those are refused by _check_dtypes
            # sharding=auto with fp16 weights: data_parallel cannot hold them (_check_dtypes), so the planner
            # must not pick it (it does for tiny tables on CPU, which made the plan fail after planning)
            types = [s for s in types if s != ShardingType.DATA_PARALLEL.value]

        bad = [s for s in types if s not in runnable]
        if bad:
            raise PlanError(
                f"table {t.name}: config key `{type_key}` asks for {bad[0]}, which the "
                f"{device_type} backend cannot run (it runs {', '.join(runnable)}); pick one of those"
            )
        if kernels is not None:
            for s in types:
                ok = sharder.compute_kernels(s, device_type)
                if not any(k in ok for k in kernels):
                    need = (
                        " (needs CUDA)"
                        if device_type != "cuda" and any(k.startswith("fused_uvm") for k in kernels)
                        else ""
                    )
                    raise PlanError(
                        f"table {t.name}: config key `{kernel_key}` = {kernels} cannot run {s} tables "
                        f"on {device_type}{need}; kernels for {s} there: {', '.join(ok)}"
                    )
        fused_possible = any(s != ShardingType.DATA_PARALLEL.value for s in types) and (
            kernels is None or any(k in FUSED_KERNELS for k in kernels)
        )
        if fused_possible and t.dim % 4:
            raise PlanError(
                f"table {t.name}: embedding_dim {t.dim} is not a multiple of 4, which FBGEMM's fused "
                f"TBE kernels need; set model.embedding_dim to a multiple of 4 (e.g. {t.dim + 4 - t.dim % 4}),"
                f" or sharding=data_parallel (dense kernel)"
            )
        if min_part is not None and any(s in COLUMN_TYPES for s in types):
            if min_part % 4 or t.dim % min_part:
                divisors = [w for w in range(4, t.dim + 1, 4) if t.dim % w == 0]
                raise PlanError(
                    f"table {t.name}: config key `{part_key}` = {min_part} is not a column shard width "
                    f"for embedding_dim {t.dim}: it must be a multiple of 4 that divides {t.dim} "
                    f"({', '.join(map(str, divisors)) or 'none: make the dim a multiple of 4'})"
                )
        pf = (
            c.pooling_factors
            if c and c.pooling_factors
            else [float(pooling_factors[t.name])] * len(t.features)
            if pooling_factors and t.name in pooling_factors
            else [1.0] * len(t.features)
        )
        out[t.name] = ParameterConstraints(
            sharding_types=list(types),
            compute_kernels=list(kernels) if kernels else None,
            min_partition=min_part,
            pooling_factors=pf,
            num_poolings=c.num_poolings if c else None,
            batch_sizes=c.batch_sizes if c else None,
        )
    return out


def _check_fits(
    tables: Sequence[TableInfo],
    constraints: Dict[str, ParameterConstraints],
    topo: Topology,
    cfg: ShardingConfig,
    sparse_type: str,
) -> None:
    """A table that can only be placed whole (table_wise / data_parallel) in a memory that cannot hold it.

    Raises:
        PlanError: naming the table, its size, the per-rank capacity and the options.
    """
    cuda = topo.compute_device == "cuda"
    cap = topo.devices[0].storage.hbm if cuda else topo.devices[0].storage.ddr
    cap = int(cap * (1 - cfg.storage_reservation))
    for t in tables:
        c = constraints[t.name]
        in_hbm = not cuda or (c.compute_kernels is not None and set(c.compute_kernels) <= {"fused", "dense"})
        if not (set(c.sharding_types or []) <= set(WHOLE_TABLE_TYPES) and in_hbm):
            continue
        need = t.rows * _state_bytes_per_row(t.dim, sparse_type, t.weight_bytes)
        if need > cap:
            raise PlanError(_too_big(t, need, cap, cuda))


def _too_big(t: TableInfo, need: int, cap: int, cuda: bool) -> str:
    mem = "HBM" if cuda else "host memory"
    dtype = "fp32" if t.weight_bytes == 4 else "fp16"
    return (
        f"table {t.name} ({t.rows:,} x {t.dim} {dtype} with its optimizer state, {need / GiB:.2f} GiB) does not fit "
        f"the {cap / GiB:.2f} GiB of {mem} per rank the planner may use (after sharding.storage_reservation). "
        f"Options: split it by rows (+sharding.constraints.{t.name}.sharding_types=[row_wise], or sharding="
        f"row_wise), use more GPUs, or keep it in host memory with an HBM cache "
        f"(offload=uvm_caching pipeline=prefetch, CUDA only); or raise sharding.hbm_cap_gb / ddr_cap_gb if "
        f"the device has more"
    )


# ------------------------------------------------------------------------------------------------ planning
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


@dataclasses.dataclass
class PlanInfo:
    """A plan with what the table and ``plan.json`` show beside it.

    ``shards``: one dict per shard: ``module``, ``table``, ``sharding_type``, ``compute_kernel``, ``rank``,
    ``offsets`` / ``sizes`` (rows, columns), ``hbm_bytes`` / ``ddr_bytes`` (TorchRec's estimate: weights,
    optimizer state, I/O buffers; null for a loaded plan without estimates).
    """

    plan: ShardingPlan
    world_size: int
    local_world_size: int
    compute_device: str
    hbm_cap_bytes: int
    ddr_cap_bytes: int
    shards: List[Dict[str, Any]]
    source: str = "planner"


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
        pi = _check_dtypes(
            load_plan(cfg.plan_path, tables, world_size, local_world_size, device.type, hbm_cap, ddr_cap), tables
        )
        if constraint_hook is not None:
            wanted = constraint_hook({t.name: ParameterConstraints() for t in tables}) or {}
            _apply_constraint_kernels(pi, wanted, cfg.plan_path)
        return pi
    sharder = EmbeddingBagSharder()
    constraints = build_constraints(cfg, tables, device.type, pooling_factors, sharder)
    if world_size == 1 and not cfg.sharding_types:
        # One rank holds every table whatever the type; TorchRec's planner then picks among equal-memory layouts by
        # small cost-model differences (table_wise, table_column_wise or column_wise, depending on the HBM cap),
        # and the column-split ones keep more TBE groups and launch more kernels per step.
        # table_wise is the layout stock TorchRec gets on one GPU.
        for name, c in constraints.items():
            explicit = cfg.constraints.get(name)
            kept = c.sharding_types == [ShardingType.DATA_PARALLEL.value]  # sharding.data_parallel_max_rows
            if not (explicit and explicit.sharding_types) and not kept:
                c.sharding_types = [ShardingType.TABLE_WISE.value]
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
        per_row = {t.name: _state_bytes_per_row(t.dim, sparse_type, t.weight_bytes) for t in tables}
        biggest = max(tables, key=lambda t: t.rows * per_row[t.name])
        need = biggest.rows * per_row[biggest.name]
        cap = (hbm_cap if device.type == "cuda" else ddr_cap) * (1 - cfg.storage_reservation)
        total = sum(t.rows * per_row[t.name] for t in tables)
        if total > cap * world_size:
            why = (
                f"Together they need at least {math.ceil(total / cap)} ranks of this size. Options: use more GPUs, "
                f"keep tables in host memory with an HBM cache (offload=uvm_caching pipeline=prefetch, CUDA only), "
                f"fewer rows (model.row_cap), or raise sharding.hbm_cap_gb / ddr_cap_gb if the device has more"
            )
        elif need > cap:
            why = "Largest: " + _too_big(biggest, need, int(cap), device.type == "cuda")
        else:
            why = (
                f"The tables fit by size ({world_size} x {cap / GiB:.2f} GiB), so the planner's estimate of the "
                f"other memory at batch size {batch_size} per rank (input and output buffers) does not: lower "
                f"data.batch_size or sharding.storage_reservation, or use more GPUs"
            )
        raise PlanError(
            f"the planner found no placement for {len(tables)} tables on {world_size} rank{'s' * (world_size != 1)} "
            f"({total / GiB:.2f} GiB of weights and optimizer state in all, about {cap / GiB:.2f} GiB per rank "
            f"usable). {why}\nTorchRec planner: {str(e).splitlines()[0]}"
        ) from e
    shards = []
    for so in stats.best_plan:
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
    pi = _check_dtypes(PlanInfo(plan, world_size, local_world_size, device.type, hbm_cap, ddr_cap, shards), tables)
    return _check_half_precision_state(pi, tables, sparse_type, cfg)


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


# ------------------------------------------------------------------------------------------- table weights
_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) of int64 tensors holding values in [0, 2^32); multipliers
    below 2^31 keep every product inside int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def _table_key(name: str, seed: int) -> int:
    key = torch.tensor([(zlib.crc32(name.encode()) ^ (seed * 0x61C88647)) & _M32], dtype=torch.int64)
    return int(_mix32(_mix32(key))[0])


def initial_weights(
    name: str, seed: int, rows: Tuple[int, int], cols: Tuple[int, int], low: float, high: float, device: torch.device
) -> torch.Tensor:
    """Initial weights of rows ``[rows[0], rows[1])`` and columns ``[cols[0], cols[1])`` of table ``name``: uniform in
    ``[low, high)`` (TorchRec's default range is ``+-sqrt(1 / num_embeddings)``), each value a hash of ``(seed,
    table, row, column)`` alone. So a shard computes its own part wherever it lives, on any device, and every
    sharding plan and world size starts from the same tables. Returns fp32 ``[rows, cols]`` on ``device``."""
    key = _table_key(name, seed)
    r = torch.arange(rows[0], rows[1], dtype=torch.int64, device=device)[:, None]
    c = torch.arange(cols[0], cols[1], dtype=torch.int64, device=device)[None, :]
    h = _mix32(_mix32(r ^ key) ^ ((c * 0x61C88647) & _M32))
    return low + (high - low) * ((h >> 8).to(torch.float32) * (1.0 / (1 << 24)))


def seed_tables(model: torch.nn.Module, configs: Sequence[Any], seed: int, rows_per_chunk: int = 1 << 16) -> int:
    """Overwrite every table shard of the sharded ``model`` with :func:`initial_weights` (DMP initialises each
    shard from its rank's RNG stream, so the tables would otherwise depend on the plan and the world size).

    Args:
        model: the DMP model (its ``state_dict`` views the live TBE weights and data_parallel replicas).
        configs: the ``EmbeddingBagConfig`` of every table (names, init ranges).
        seed: the run's ``seed``.
        rows_per_chunk: rows computed at a time (bounds the temporary int64 tensors).

    Returns:
        How many table shards (or replicas) were written on this rank.
    """
    by_name = {c.name: c for c in configs}
    n = 0
    with torch.no_grad():
        for key, value in model.state_dict().items():
            parts = key.split(".")
            if len(parts) < 2 or parts[-1] != "weight" or parts[-2] not in by_name or "embedding_bags" not in key:
                continue
            cfg = by_name[parts[-2]]
            pieces = (
                [(s.metadata.shard_offsets, s.tensor) for s in value.local_shards()]
                if hasattr(value, "local_shards")
                else [((0, 0), value)]
            )
            for (r0, c0), t in pieces:
                for lo in range(0, t.shape[0], rows_per_chunk):
                    hi = min(t.shape[0], lo + rows_per_chunk)
                    t[lo:hi].copy_(
                        initial_weights(
                            cfg.name,
                            seed,
                            (r0 + lo, r0 + hi),
                            (c0, c0 + t.shape[1]),
                            cfg.get_weight_init_min(),
                            cfg.get_weight_init_max(),
                            t.device,
                        )
                    )
                n += 1
    return n


# ------------------------------------------------------------------------------------------------ plan.json
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
    key = "config key `sharding.plan_path`"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(f"{key}: cannot read {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(f"{key}: {path} is not a plan.json ({PLAN_FORMAT}); write one with python -m dlrm.plan")
    try:
        return _plan_from_json(doc, path, tables, world_size, local_world_size, device_type, hbm_cap, ddr_cap)
    except InputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PlanError(
            f"{key}: {path} is damaged or hand-edited ({type(e).__name__}: {e}); write it again with python -m "
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
    key = "config key `sharding.plan_path`"
    if doc["world_size"] != world_size:
        raise PlanError(
            f"{key}: {path} places tables on {doc['world_size']} ranks but this job has {world_size}; "
            f"launch {doc['world_size']} processes, or drop sharding.plan_path to re-plan"
        )
    by_name = {t.name: t for t in tables}
    named = {t["table"] for t in doc["tables"]}
    if named != set(by_name):
        extra, missing = sorted(named - set(by_name)), sorted(set(by_name) - named)
        raise PlanError(
            f"{key}: {path} does not match the model: tables not in the model {extra}, tables not in "
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
                f"{key}: table {info.name} is {stype} / {kernel} in {path}, which {device_type} cannot "
                "run; re-plan on this device (drop sharding.plan_path)"
            )
        area = 0
        for s in t["shards"]:
            r0, c0 = s["offsets"]
            r, c = s["sizes"]
            if not (0 <= s["rank"] < world_size and r0 + r <= info.rows and c0 + c <= info.dim):
                raise PlanError(
                    f"{key}: table {info.name} in {path}: shard {s} lies outside the {info.rows} x "
                    f"{info.dim} table or the {world_size} ranks; re-plan for this model"
                )
            area += r * c
            shards.append(
                {"module": t["module"], "table": info.name, "sharding_type": stype, "compute_kernel": kernel, **s}
            )
        if list(t["ranks"]) != [s["rank"] for s in t["shards"]]:  # TorchRec places shard i on ranks[i]
            raise PlanError(
                f"{key}: table {info.name} in {path}: ranks {t['ranks']} do not list its shards' ranks "
                f"{[s['rank'] for s in t['shards']]} in order; re-plan for this model (drop sharding.plan_path)"
            )
        if stype != ShardingType.DATA_PARALLEL.value:
            boxes = [(*s["offsets"], *s["sizes"]) for s in t["shards"]]
            for i, (r0, c0, r, c) in enumerate(boxes):
                for q0, d0, q, d in boxes[i + 1 :]:
                    if r0 < q0 + q and q0 < r0 + r and c0 < d0 + d and d0 < c0 + c:
                        raise PlanError(
                            f"{key}: table {info.name} in {path}: shards at rows {r0}, cols {c0} and rows {q0}, "
                            f"cols {d0} overlap; re-plan for this model (drop sharding.plan_path)"
                        )
        expect = info.rows * info.dim * (world_size if stype == ShardingType.DATA_PARALLEL.value else 1)
        if area != expect:
            raise PlanError(
                f"{key}: table {info.name} in {path}: its shards cover {area} of {expect} "
                f"elements of the {info.rows} x {info.dim} table; re-plan for this model"
            )
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
        plan.setdefault(t["module"], {})[info.name] = ParameterSharding(
            sharding_type=stype, compute_kernel=kernel, ranks=list(t["ranks"]), sharding_spec=spec
        )
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    sp = ShardingPlan({m: EmbeddingModuleShardingPlan(p) for m, p in plan.items()})
    return PlanInfo(sp, world_size, local_world_size, device_type, hbm_cap, ddr_cap, shards, source=path)


# ------------------------------------------------------------------------------------------------ printing
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
