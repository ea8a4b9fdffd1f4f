"""The planner's inputs: the topology of the job's machines and one ``ParameterConstraints`` per table from
``sharding.*``, with the checks that name the table, config key and fix where TorchRec would fail late or remap
silently."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence

import torch
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingType

from dlrm.config import ShardingConfig, TableConstraintConfig
from dlrm.sharding.sharders import EmbeddingBagSharder
from dlrm.sharding.types import COLUMN_TYPES, FUSED_KERNELS, WHOLE_TABLE_TYPES, GiB, PlanError, TableInfo


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


def _state_bytes_per_row(dim: int, sparse_type: str, weight_bytes: int = 4) -> int:
    """Weights plus fp32 Adagrad state per row: element-wise ``dim`` floats, row-wise one float (FBGEMM keeps the
    state in fp32 for fp16 weights too)."""
    return weight_bytes * dim + (4 * dim if sparse_type == "adagrad" else 4)


@dataclasses.dataclass
class _TableChoice:
    """What one table may use, each with the config key it comes from (named in errors): ``types`` (sharding
    types), ``kernels`` (compute kernels; None: any the sharder offers), ``min_part`` (column shard width)."""

    types: List[str]
    type_key: str
    kernels: Optional[List[str]]
    kernel_key: str
    min_part: Optional[int]
    part_key: str


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
    data_parallel (see :func:`dlrm.sharding.planner._check_dtypes`). With ``sharding.data_parallel_max_rows``, a
    table of at most that many rows and no ``sharding_types`` of its own is data_parallel on the dense kernel (or
    its own ``compute_kernels``), whatever the preset says.

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
    for t in tables:
        c = cfg.constraints.get(t.name)
        choice = _choose(cfg, t, runnable)
        _check_runnable(t, choice, sharder, runnable, device_type)
        _check_widths(t, choice)
        out[t.name] = ParameterConstraints(
            sharding_types=list(choice.types),
            compute_kernels=list(choice.kernels) if choice.kernels else None,
            min_partition=choice.min_part,
            pooling_factors=_pooling_factors_of(t, c, pooling_factors),
            num_poolings=c.num_poolings if c else None,
            batch_sizes=c.batch_sizes if c else None,
        )
    return out


def _choose(cfg: ShardingConfig, t: TableInfo, runnable: Sequence[str]) -> _TableChoice:
    """Table ``t``'s sharding types, kernels and column shard width: ``sharding.constraints.<table>`` over the
    preset, ``sharding.data_parallel_max_rows`` over both for a table without its own types, all of ``runnable``
    (the sharder's types on this device) where nothing is set, and no data_parallel for fp16 tables under
    ``sharding=auto``."""
    c = cfg.constraints.get(t.name)
    ckey = f"sharding.constraints.{t.name}"
    dp_rows = cfg.data_parallel_max_rows
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
    return _TableChoice(types, type_key, kernels, kernel_key, min_part, part_key)


def _check_runnable(
    t: TableInfo, choice: _TableChoice, sharder: Any, runnable: Sequence[str], device_type: str
) -> None:
    """Refuse a sharding type the sharder does not offer on ``device_type``, or kernels that run none of them.

    Raises:
        PlanError: naming the table, the config key, and what the device runs.
    """
    bad = [s for s in choice.types if s not in runnable]
    if bad:
        raise PlanError(
            f"table {t.name}: config key `{choice.type_key}` asks for {bad[0]}, which the "
            f"{device_type} backend cannot run (it runs {', '.join(runnable)}); pick one of those"
        )
    kernels = choice.kernels
    if kernels is not None:
        for s in choice.types:
            ok = sharder.compute_kernels(s, device_type)
            if not any(k in ok for k in kernels):
                need = (
                    " (needs CUDA)" if device_type != "cuda" and any(k.startswith("fused_uvm") for k in kernels) else ""
                )
                raise PlanError(
                    f"table {t.name}: config key `{choice.kernel_key}` = {kernels} cannot run {s} tables "
                    f"on {device_type}{need}; kernels for {s} there: {', '.join(ok)}"
                )


def _check_widths(t: TableInfo, choice: _TableChoice) -> None:
    """Refuse a dim that FBGEMM's fused kernels cannot run (not a multiple of 4), and a column shard width that is
    not a multiple of 4 dividing the dim (TorchRec would silently widen the shard).

    Raises:
        PlanError: naming the table, the config key, and dims or widths that work.
    """
    fused_possible = any(s != ShardingType.DATA_PARALLEL.value for s in choice.types) and (
        choice.kernels is None or any(k in FUSED_KERNELS for k in choice.kernels)
    )
    if fused_possible and t.dim % 4:
        raise PlanError(
            f"table {t.name}: embedding_dim {t.dim} is not a multiple of 4, which FBGEMM's fused "
            f"TBE kernels need; set model.embedding_dim to a multiple of 4 (e.g. {t.dim + 4 - t.dim % 4}),"
            f" or sharding=data_parallel (dense kernel)"
        )
    min_part = choice.min_part
    if min_part is not None and any(s in COLUMN_TYPES for s in choice.types):
        if min_part % 4 or t.dim % min_part:
            divisors = [w for w in range(4, t.dim + 1, 4) if t.dim % w == 0]
            raise PlanError(
                f"table {t.name}: config key `{choice.part_key}` = {min_part} is not a column shard width "
                f"for embedding_dim {t.dim}: it must be a multiple of 4 that divides {t.dim} "
                f"({', '.join(map(str, divisors)) or 'none: make the dim a multiple of 4'})"
            )


def _pooling_factors_of(
    t: TableInfo, c: Optional[TableConstraintConfig], pooling_factors: Optional[Dict[str, float]]
) -> List[float]:
    """Mean ids per sample of each of ``t``'s features: the table's own ``pooling_factors``, else its entry in
    ``pooling_factors`` (table -> mean ids per sample), else 1."""
    if c and c.pooling_factors:
        return c.pooling_factors
    if pooling_factors and t.name in pooling_factors:
        return [float(pooling_factors[t.name])] * len(t.features)
    return [1.0] * len(t.features)


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
