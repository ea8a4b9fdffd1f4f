"""Communication of one training step, from the sharding plan alone: every collective the input dist, the output
dist and the gradient all-reduces run, the bytes each rank hands each of them, and how long they take at a given
link bandwidth. ``python -m dlrm.plan`` and the trainer's start-up log print it beside the memory per rank
(:mod:`dlrm.traffic_report`); ``tests/test_traffic.py`` checks every message against the collectives TorchRec and DDP
really issue in a training step on 2 and 4 gloo ranks.

Pure arithmetic on the plan (per table: sharding type, shard ranks, offsets and sizes), the batch per rank, the
bags and ids per sample, the embedding dims and dtypes, and the dense parameter count; no process group and no
tensors. Units: bytes, seconds, link rates in Gb/s (10^9 bits per second, per direction, per rank).

What runs in a step (TorchRec 1.6 and 1.8 alike), per group of tables of one sharding type in one sharded
``EmbeddingBagCollection`` (TorchRec builds one input dist and one output dist per group), with ``W`` ranks, ``L``
per host, ``H = W / L`` hosts and ``B`` samples per rank. An id travels once per column block of its table (the
whole table, or each column shard); EmbeddingBagCollection's input dist does not deduplicate ids.

* input dist (``KJTAllToAll`` over all ranks; none for data_parallel), three all-to-alls:

  - splits: int64 ``[W, 3]`` per group, for each peer its number of lengths, of ids, and this rank's batch size
    (with ``TORCHREC_VALIDATE_COLLECTIVES=1`` torchrec 1.8 adds a 4th). TorchRec's pipelines
    (``TrainPipelineSparseDist`` and its subclasses: every ``pipeline=`` but ``base``) fuse the splits of every
    group into one all-to-all of ``[W, 3 x groups]``; ``pipeline=base`` runs one per group;
  - lengths: one per bag and destination, in the KJT's lengths dtype (int32 from every loader here): table_wise
    and column-split tables send ``B`` per bag to the rank of each column shard; row_wise to every rank (the
    bucketize step gives every rank a length, zero or not); table_row_wise and grid_shard to every rank of the
    host holding the (column block of the) table;
  - values: every id to the rank holding its row, in the KJT's id dtype (:data:`ID_BYTES`). The total is exact;
    for row-split tables the share per destination depends on the ids and is taken as proportional to each row
    shard's rows (ids spread evenly over a table's rows).

* output dist, the pooled embeddings back to the rank that owns the samples (dtype ``perf.embedding_output_dtype``,
  the TBE's output dtype; this trainer sets no quantized-communication codecs), and their gradients backward in
  the same dtype. ``D_r``: the pooled width a rank computes (sum over its shards of columns x bags):

  - table_wise, column_wise, table_column_wise: all-to-all over all ranks of ``[W*B, D_r]`` forward (``B*D_r``
    to each rank), ``[B, sum D]`` gathered; backward the reverse;
  - row_wise: reduce-scatter over all ranks of ``[W*B, D]`` partial sums (``D``: every row_wise table's width;
    every rank pools its rows of every bag) into ``[B, D]``; backward an all-gather of ``[B, D]``;
  - table_row_wise, grid_shard: reduce-scatter within the host of ``[W*B, D_h]`` (``D_h``: the host's width) into
    ``[H*B, D_h]``, then an all-to-all across hosts among the ranks with the same local rank (``B*D_h`` to each);
    backward the all-to-all back, then an all-gather within the host. A group of one rank runs no collective
    (one host: no all-to-all; one rank per host: no reduce-scatter);
  - data_parallel: none. The tables' gradients are all-reduced by a DDP of their own (TorchRec wraps the
    data_parallel lookup in DDP), always in the weights' dtype (fp32): ``perf.allreduce_dtype``'s compress hook
    is on the dense DDP only.

* all-reduce of the dense gradients (DDP, in ``perf.allreduce_dtype``): every parameter outside the tables, in
  buckets of ``perf.ddp_bucket_cap_mb`` (the bytes do not depend on the bucket size).

A rank's own block of an all-to-all stays on the rank; the rest leaves it. Ring collectives (reduce-scatter,
all-gather, all-reduce) send ``(n-1)/n`` of the reduced or gathered tensor per rank (``2(n-1)/n`` for an
all-reduce), NCCL's bus-bandwidth model; a ring that spans hosts goes at the cross-host rate. Times use link
peak rates and no overlap with compute: lower bounds on each collective's time. (gloo runs a reduce-scatter as an
all-reduce of the whole tensor: the bytes handed are the same, the bytes on the wire are not.)

Sources: TorchRec's ``dist_data`` (``KJTAllToAll``, ``PooledEmbeddingsAllToAll``,
``PooledEmbeddingsReduceScatter``), ``sharding/{tw,cw,rw,twrw,grid,dp}_sharding.py``, the data_parallel DDP in
``embeddingbag.py`` and the fused splits in ``train_pipeline/utils.py``; ``tests/test_traffic.py`` holds the
module to what they issue.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torchrec.modules.embedding_configs import DataType

# Link peak rates per direction per rank, in Gb/s.
# NVLink 4 on an H200 SXM: 900 GB/s bidirectional per GPU (NVIDIA H200 Tensor Core GPU datasheet), 450 GB/s each way.
NVLINK_H200_GBPS = 3600.0
# Across hosts: one 400 Gb/s InfiniBand NDR NIC per GPU (ConnectX-7), as in NVIDIA DGX H200 / HGX H200 systems.
IB_400_GBPS = 400.0

# Bytes per id and per length in the KJTs the loaders build: dlrm.data.to_batch (synthetic, criteo_tsv) has int64
# ids, dlrm.data.binary.BatchReader (criteo_binary) int32 ids; both have int32 lengths (tests/test_binary_loader.py
# checks these against the batches).
ID_BYTES = {"criteo_binary": 4}
DEFAULT_ID_BYTES = 8
LENGTH_BYTES = 4

STAGES = ("input dist", "output dist fwd", "output dist bwd", "all-reduce")
ROW_SPLIT = ("row_wise", "table_row_wise", "grid_shard")
WHOLE_BAGS = ("row_wise", "table_row_wise")  # sent as whole bags by pipeline=graphed on several ranks
ALL_TO_ALL_BACK = ("table_wise", "column_wise", "table_column_wise")
_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int32": "int32", "int64": "int64"}


def dtype_size(name: str) -> Tuple[str, int]:
    """``(torch dtype name, bytes per element)`` of a config dtype (``fp32``, ``fp16``, ``bf16``, ``int32``,
    ``int64``) or a torch name (``float32``, ...)."""
    torch_name = _DTYPE_NAMES.get(name, name)
    return torch_name, getattr(torch, torch_name).itemsize


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard of a table: ``rows`` x ``cols`` from ``(row_offset, col_offset)`` on ``rank``."""

    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int


@dataclasses.dataclass(frozen=True)
class ShardedTable:
    """A table as the step's traffic sees it.

    ``bags``: features (bags per sample) that look the table up; ``ids_per_sample``: ids per sample over those
    bags (its pooling factor: the multi-hot size); ``shards``: where it lives (data_parallel: one full replica per
    rank); ``weight_bytes``: bytes per weight (4: fp32).
    """

    module: str
    name: str
    sharding_type: str
    rows: int
    dim: int
    bags: int
    ids_per_sample: float
    shards: Tuple[Shard, ...]
    weight_bytes: int = 4

    def blocks(self) -> Dict[int, List[Shard]]:
        """Column offset -> the row shards of that column block (one block unless column-split)."""
        out: Dict[int, List[Shard]] = {}
        for s in self.shards:
            out.setdefault(s.col_offset, []).append(s)
        return out


@dataclasses.dataclass(frozen=True)
class Message:
    """What one rank hands one collective in one training step.

    ``send_bytes`` / ``recv_bytes``: the tensors this rank passes in and gets back (its own block of an all-to-all
    included; for row-split values ``recv_bytes`` is the even-spread estimate). ``out_*`` / ``in_*``: bytes that
    leave / reach this rank over links within its host (``intra``) and across hosts (``inter``); for ring
    collectives the ring's share, all ``inter`` when the ring spans hosts. ``estimated``: the per-peer split rests
    on ids spread evenly over rows (row-split values); every total is exact.
    """

    rank: int
    stage: str  # one of STAGES
    tensor: str  # splits, lengths, values, pooled embeddings, pooled gradients, dense gradients, table gradients
    sharding_type: str  # the tables' sharding type; "dense" for the dense gradients, "all" for fused splits
    module: str  # the sharded module ("" for the dense gradients)
    op: str  # all_to_all, reduce_scatter, all_gather, all_reduce
    group_size: int
    dtype: str  # torch dtype name
    send_bytes: float
    recv_bytes: float
    out_intra: float
    out_inter: float
    in_intra: float
    in_inter: float
    estimated: bool = False

    def seconds(self, intra_gbps: float, inter_gbps: float) -> float:
        """Time at ``intra_gbps`` within a host and ``inter_gbps`` across hosts (Gb/s per direction): the slower
        of the two link classes, each bounded by the larger of what this rank sends and receives on it."""
        intra = max(self.out_intra, self.in_intra) * 8 / (intra_gbps * 1e9)
        inter = max(self.out_inter, self.in_inter) * 8 / (inter_gbps * 1e9)
        return max(intra, inter)

    @property
    def key(self) -> Tuple[str, str, str, str, str]:
        """Names the collective across ranks (one call on every rank of its groups)."""
        return (self.stage, self.tensor, self.sharding_type, self.module, self.op)


@dataclasses.dataclass(frozen=True)
class StepTraffic:
    """Every :class:`Message` of one training step, and what they were computed from."""

    messages: Tuple[Message, ...]
    tables: Tuple[ShardedTable, ...]
    world_size: int
    local_world_size: int
    batch_size: int
    dense_params: int
    pooled_dtype: str
    allreduce_dtype: str
    id_dtype: str
    length_dtype: str

    def of_rank(self, rank: int) -> List[Message]:
        """The messages of ``rank``."""
        return [m for m in self.messages if m.rank == rank]

    def step_seconds(self, intra_gbps: float, inter_gbps: float) -> float:
        """The step's collectives one after another, each finishing with its slowest rank."""
        slowest: Dict[Tuple[str, ...], float] = {}
        for m in self.messages:
            slowest[m.key] = max(slowest.get(m.key, 0.0), m.seconds(intra_gbps, inter_gbps))
        return sum(slowest.values())


# ------------------------------------------------------------------------------------------------ messages
class _Layout:
    def __init__(self, world: int, local: int) -> None:
        self.world, self.local = world, local

    def host(self, r: int) -> int:
        return r // self.local

    def host_ranks(self, h: int) -> List[int]:
        return list(range(h * self.local, (h + 1) * self.local))

    def cross_ranks(self, r: int) -> List[int]:
        """The ranks with ``r``'s local rank, one per host (TorchRec's cross-host group)."""
        return list(range(r % self.local, self.world, self.local))


def _all_to_all(
    lay: _Layout,
    rank: int,
    group: Sequence[int],
    to: Callable[[int, int], float],
    total: Optional[float] = None,
    **fields: object,
) -> Message:
    """An all-to-all among ``group`` in which rank ``s`` sends ``to(s, d)`` bytes to rank ``d`` (``total``: what
    each rank sends in all, when the per-peer split is an estimate)."""
    out = {"intra": 0.0, "inter": 0.0}
    inn = {"intra": 0.0, "inter": 0.0}
    for p in group:
        if p == rank:
            continue
        kind = "intra" if lay.host(p) == lay.host(rank) else "inter"
        out[kind] += to(rank, p)
        inn[kind] += to(p, rank)
    return Message(
        rank=rank,
        op="all_to_all",
        group_size=len(group),
        send_bytes=total if total is not None else sum(to(rank, d) for d in group),
        recv_bytes=sum(to(s, rank) for s in group),
        out_intra=out["intra"],
        out_inter=out["inter"],
        in_intra=inn["intra"],
        in_inter=inn["inter"],
        **fields,  # type: ignore[arg-type]
    )


def _ring(
    lay: _Layout, rank: int, group: Sequence[int], op: str, send: float, recv: float, **fields: object
) -> Message:
    """A reduce-scatter (``send``: the full tensor), all-gather (``recv``: the full tensor) or all-reduce."""
    n = len(group)
    full = recv if op == "all_gather" else send
    wire = full * (n - 1) / n * (2 if op == "all_reduce" else 1)
    spans = len({lay.host(p) for p in group}) > 1
    return Message(
        rank=rank,
        op=op,
        group_size=n,
        send_bytes=send,
        recv_bytes=recv,
        out_intra=0.0 if spans else wire,
        out_inter=wire if spans else 0.0,
        in_intra=0.0 if spans else wire,
        in_inter=wire if spans else 0.0,
        **fields,  # type: ignore[arg-type]
    )


def _input_dist(
    lay: _Layout,
    group_tables: Sequence[ShardedTable],
    b: int,
    id_dtype: str,
    length_dtype: str,
    whole_row_bags: bool = False,
) -> List[Message]:
    """The lengths and values all-to-alls of one group's KJTAllToAll, on every rank (module docstring);
    ``whole_row_bags``: row_wise tables' bags go whole to every rank, table_row_wise tables' to every rank of the
    table's host (``pipeline=graphed`` on several ranks)."""
    w = lay.world
    lengths = [0.0] * w  # per destination, what every rank sends (same batch, same bags everywhere)
    ids = [0.0] * w
    total_ids = 0.0  # exact, whatever the split
    estimated = False
    for t in group_tables:
        for block in t.blocks().values():
            if t.sharding_type in WHOLE_BAGS and whole_row_bags:  # every id to every rank (of the host), exactly
                whole = range(w) if t.sharding_type == "row_wise" else lay.host_ranks(lay.host(block[0].rank))
                for d in whole:
                    lengths[d] += b * t.bags
                    ids[d] += b * t.ids_per_sample
                total_ids += len(whole) * b * t.ids_per_sample
                continue
            if t.sharding_type == "row_wise":
                dests = list(range(w))
            elif t.sharding_type in ROW_SPLIT:  # bucketized over the ranks of the block's host
                dests = lay.host_ranks(lay.host(block[0].rank))
            else:
                dests = [block[0].rank]
            rows = sum(s.rows for s in block) or 1
            for d in dests:
                lengths[d] += b * t.bags
            for s in block:
                ids[s.rank] += b * t.ids_per_sample * s.rows / rows
            total_ids += b * t.ids_per_sample
            estimated |= len(dests) > 1
    id_name, id_b = dtype_size(id_dtype)
    len_name, len_b = dtype_size(length_dtype)
    sharding_type, module = group_tables[0].sharding_type, group_tables[0].module
    out = []
    everyone = list(range(w))
    for r in everyone:
        common = dict(stage="input dist", sharding_type=sharding_type, module=module)
        out.append(
            _all_to_all(lay, r, everyone, lambda s, d: lengths[d] * len_b, tensor="lengths", dtype=len_name, **common)
        )
        out.append(
            _all_to_all(
                lay,
                r,
                everyone,
                lambda s, d: ids[d] * id_b,
                total=total_ids * id_b,
                tensor="values",
                dtype=id_name,
                estimated=estimated,
                **common,
            )
        )
    return out


def _output_dist(lay: _Layout, group_tables: Sequence[ShardedTable], b: int, pooled_dtype: str) -> List[Message]:
    """The pooled embeddings forward and their gradients backward of one group, on every rank."""
    w, local = lay.world, lay.local
    name, e = dtype_size(pooled_dtype)
    stype, module = group_tables[0].sharding_type, group_tables[0].module
    width = [0.0] * w  # pooled columns each rank computes, over all samples of the step
    for t in group_tables:
        for s in t.shards:
            width[s.rank] += s.cols * t.bags
    fwd = dict(stage="output dist fwd", tensor="pooled embeddings", sharding_type=stype, module=module, dtype=name)
    bwd = dict(stage="output dist bwd", tensor="pooled gradients", sharding_type=stype, module=module, dtype=name)
    everyone = list(range(w))
    out: List[Message] = []
    if stype in ALL_TO_ALL_BACK:
        for r in everyone:
            out.append(_all_to_all(lay, r, everyone, lambda s, d: b * width[s] * e, **fwd))
            out.append(_all_to_all(lay, r, everyone, lambda s, d: b * width[d] * e, **bwd))
    elif stype == "row_wise":
        dim = sum(t.dim * t.bags for t in group_tables)  # every rank pools its rows of every bag
        for r in everyone:
            out.append(_ring(lay, r, everyone, "reduce_scatter", w * b * dim * e, b * dim * e, **fwd))
            out.append(_ring(lay, r, everyone, "all_gather", b * dim * e, w * b * dim * e, **bwd))
    else:  # table_row_wise, grid_shard: rows split within a host, then across hosts
        hosts = w // local
        host_width = [0.0] * hosts
        for t in group_tables:
            for block in t.blocks().values():
                host_width[lay.host(block[0].rank)] += block[0].cols * t.bags
        for r in everyone:
            dh = host_width[lay.host(r)]
            host = lay.host_ranks(lay.host(r))
            cross = lay.cross_ranks(r)
            if local > 1:
                out.append(_ring(lay, r, host, "reduce_scatter", w * b * dh * e, hosts * b * dh * e, **fwd))
                out.append(_ring(lay, r, host, "all_gather", hosts * b * dh * e, w * b * dh * e, **bwd))
            if hosts > 1:
                out.append(_all_to_all(lay, r, cross, lambda s, d: b * host_width[lay.host(s)] * e, **fwd))
                out.append(_all_to_all(lay, r, cross, lambda s, d: b * host_width[lay.host(d)] * e, **bwd))
    return out


def _groups(tables: Sequence[ShardedTable]) -> Tuple[List[List[ShardedTable]], Dict[str, float]]:
    """The sharded groups (one per module and sharding type, data_parallel apart) and, per module, the bytes of its
    data_parallel tables (what their DDP all-reduces)."""
    groups: Dict[Tuple[str, str], List[ShardedTable]] = {}
    for t in tables:
        groups.setdefault((t.module, t.sharding_type), []).append(t)
    dp_bytes: Dict[str, float] = {}
    sharded = []
    for (module, stype), group in groups.items():
        if stype == "data_parallel":
            dp_bytes[module] = dp_bytes.get(module, 0.0) + sum(t.rows * t.dim * t.weight_bytes for t in group)
        else:
            sharded.append(group)
    return sharded, dp_bytes


def _splits(lay: _Layout, sharded: Sequence[Sequence[ShardedTable]], fused: bool) -> List[Message]:
    """The input dist's splits all-to-all(s), on every rank: one for every group when ``fused``, else one per
    group; none without a sharded group."""
    everyone = list(range(lay.world))
    calls = [(len(sharded), "all", "")] if fused else [(1, g[0].sharding_type, g[0].module) for g in sharded]
    out = []
    for n, stype, module in calls if sharded else []:
        for r in everyone:
            out.append(
                _all_to_all(
                    lay,
                    r,
                    everyone,
                    lambda s, d, n=n: 3 * 8 * n,  # type: ignore[misc]
                    stage="input dist",
                    tensor="splits",
                    sharding_type=stype,
                    module=module,
                    dtype="int64",
                )
            )
    return out


def _all_reduces(lay: _Layout, dense_params: int, allreduce_dtype: str, dp_bytes: Mapping[str, float]) -> List[Message]:
    """The dense gradients' all-reduce (DDP, ``allreduce_dtype``) and each module's data_parallel tables' (fp32),
    on every rank."""
    ar_name, ar_b = dtype_size(allreduce_dtype)
    reduced = [(dense_params * ar_b, "dense gradients", "dense", "", ar_name)]
    reduced += [(nbytes, "table gradients", "data_parallel", module, "float32") for module, nbytes in dp_bytes.items()]
    everyone = list(range(lay.world))
    out = []
    for r in everyone:
        for nbytes, tensor, stype, module, dtype in reduced:
            fields = dict(stage="all-reduce", tensor=tensor, sharding_type=stype, module=module, dtype=dtype)
            out.append(_ring(lay, r, everyone, "all_reduce", nbytes, nbytes, **fields))
    return out


def step_traffic(
    tables: Sequence[ShardedTable],
    *,
    world_size: int,
    local_world_size: int,
    batch_size: int,
    dense_params: int,
    pooled_dtype: str = "fp32",
    allreduce_dtype: str = "fp32",
    id_dtype: str = "int64",
    length_dtype: str = "int32",
    fused_splits: bool = True,
    whole_row_bags: bool = False,
) -> StepTraffic:
    """Every collective of one training step, per rank (the module docstring lists them).

    Args:
        tables: every table with its placement (:func:`tables_from_plan`).
        world_size / local_world_size: ranks in the job and per host.
        batch_size: samples per rank per step.
        dense_params: parameters outside the tables (the MLPs; what DDP all-reduces).
        pooled_dtype: the pooled embeddings and their gradients (``perf.embedding_output_dtype``).
        allreduce_dtype: the dense all-reduce (``perf.allreduce_dtype``).
        id_dtype / length_dtype: the KJT's values and lengths (:data:`ID_BYTES`, :data:`LENGTH_BYTES`).
        fused_splits: one splits all-to-all for every group (TorchRec's pipelines), else one per group.
        whole_row_bags: row_wise tables' ids go to every rank as whole bags, table_row_wise tables' to every rank
            of the table's host (``pipeline=graphed`` on several ranks: :mod:`dlrm.static_input_dist`),
            ``world_size`` and ``local_world_size`` times their ids in all.

    Returns:
        A :class:`StepTraffic`; no messages on one rank (TorchRec and DDP send nothing over a link then).

    Raises:
        ValueError: a world size that is not a multiple of the local world size.
    """
    if world_size % local_world_size:
        raise ValueError(f"world size {world_size} is not a multiple of the local world size {local_world_size}")
    lay = _Layout(world_size, local_world_size)
    messages: List[Message] = []
    if world_size > 1:
        sharded, dp_bytes = _groups(tables)
        messages += _splits(lay, sharded, fused_splits)
        for group in sharded:
            messages += _input_dist(lay, group, batch_size, id_dtype, length_dtype, whole_row_bags)
            messages += _output_dist(lay, group, batch_size, pooled_dtype)
        messages += _all_reduces(lay, dense_params, allreduce_dtype, dp_bytes)
    return StepTraffic(
        tuple(messages),
        tuple(tables),
        world_size,
        local_world_size,
        batch_size,
        dense_params,
        pooled_dtype,
        allreduce_dtype,
        id_dtype,
        length_dtype,
    )


# ------------------------------------------------------------------------------------------------ from a plan
def tables_from_plan(
    plan: object, configs: Iterable[object], ids_per_sample: Mapping[str, float], world_size: int
) -> List[ShardedTable]:
    """The tables of a TorchRec ``ShardingPlan`` with their placement.

    Args:
        plan: the ``ShardingPlan`` (module FQN -> table -> ``ParameterSharding``: sharding type, ranks, and the
            sharding spec's shards; data_parallel tables have no spec and a replica on every rank).
        configs: the ``EmbeddingBagConfig`` of every table (rows, dim, features, weight dtype).
        ids_per_sample: table -> ids per sample over its features (the multi-hot size; 1 for one-hot).
        world_size: ranks in the job.

    Raises:
        KeyError: a table of the plan that ``configs`` or ``ids_per_sample`` lacks.
    """
    by_name = {c.name: c for c in configs}  # type: ignore[attr-defined]
    out = []
    for module, mplan in plan.plan.items():  # type: ignore[attr-defined]
        for name, ps in mplan.items():
            c = by_name[name]
            rows, dim = c.num_embeddings, c.embedding_dim
            if ps.sharding_spec is not None:
                shards = tuple(
                    Shard(
                        m.placement.rank(), m.shard_offsets[0], m.shard_sizes[0], m.shard_offsets[1], m.shard_sizes[1]
                    )
                    for m in ps.sharding_spec.shards
                )
            else:
                shards = tuple(Shard(r, 0, rows, 0, dim) for r in (ps.ranks or range(world_size)))
            out.append(
                ShardedTable(
                    module=module,
                    name=name,
                    sharding_type=ps.sharding_type,
                    rows=rows,
                    dim=dim,
                    bags=len(c.feature_names),
                    ids_per_sample=float(ids_per_sample[name]),
                    shards=shards,
                    weight_bytes=4 if c.data_type == DataType.FP32 else 2,
                )
            )
    return out


def dense_parameters(model: torch.nn.Module) -> int:
    """Parameters DDP all-reduces: every one outside the EmbeddingBagCollection's tables (on meta too)."""
    return sum(p.numel() for n, p in model.named_parameters() if "embedding_bags" not in n)


def job_traffic(
    cfg: object,
    plan: object,
    *,
    dense_params: int,
    world_size: int,
    local_world_size: int,
    batch_size: int,
    id_dtype: Optional[str] = None,
) -> StepTraffic:
    """:func:`step_traffic` of a trainer job: ``cfg`` the :class:`dlrm.config.Config`, ``plan`` its
    ``ShardingPlan``, ``dense_params`` from :func:`dense_parameters`. Ids per sample are the MLPerf multi-hot sizes
    with ``data.multi_hot``, else 1; dtypes come from ``perf.embedding_output_dtype``, ``perf.allreduce_dtype``
    and, unless ``id_dtype`` is given, ``data.name`` (:data:`ID_BYTES`); every ``pipeline=`` but ``base`` fuses
    the splits; ``pipeline=graphed`` sends row_wise tables' bags whole to every rank, table_row_wise tables' to
    every rank of the table's host."""
    from dlrm.model import FEATURE_NAMES, table_configs

    data = cfg.data  # type: ignore[attr-defined]
    sizes = cfg.model.multi_hot_sizes  # type: ignore[attr-defined]
    ids = {f"t_{f}": float(m if data.multi_hot else 1) for f, m in zip(FEATURE_NAMES, sizes)}
    configs = table_configs(cfg.model, cfg.perf.embedding_dtype)  # type: ignore[attr-defined]
    return step_traffic(
        tables_from_plan(plan, configs, ids, world_size),
        world_size=world_size,
        local_world_size=local_world_size,
        batch_size=batch_size,
        dense_params=dense_params,
        pooled_dtype=cfg.perf.embedding_output_dtype,  # type: ignore[attr-defined]
        allreduce_dtype=cfg.perf.allreduce_dtype,  # type: ignore[attr-defined]
        id_dtype=id_dtype or ("int32" if ID_BYTES.get(data.name, DEFAULT_ID_BYTES) == 4 else "int64"),
        length_dtype="int32",
        fused_splits=cfg.pipeline.name != "base",  # type: ignore[attr-defined]
        whole_row_bags=cfg.pipeline.name == "graphed",  # type: ignore[attr-defined]
    )


def model_traffic(
    cfg: object, plan: object, model: torch.nn.Module, *, world_size: int, local_world_size: int, batch_size: int
) -> StepTraffic:
    """:func:`job_traffic` for ``model``, its dense parameters counted by :func:`dense_parameters`."""
    return job_traffic(
        cfg,
        plan,
        dense_params=dense_parameters(model),
        world_size=world_size,
        local_world_size=local_world_size,
        batch_size=batch_size,
    )
