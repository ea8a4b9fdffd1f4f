"""The input dist of a batch of fixed bag sizes as one ids all-to-all with static splits (``pipeline=graphed`` on
several ranks).

TorchRec's input dist sends a KJT in several collectives whose sizes it learns on the host each batch: the splits
(how many ids go to each rank), then the lengths, then the ids. A CUDA graph cannot hold a collective whose sizes
are read on the host. With fixed bag sizes (the MLPerf multi-hot, or 1-hot ids) and an input dist that routes ids
by feature alone (table_wise, column_wise, table_column_wise; data_parallel sends nothing), every full batch sends
the same number of ids from the same positions of each rank's KJT to the same positions of each receiving rank's
input-dist output; only the id values change. :class:`StaticInputDist` finds those positions once and from then on
moves only the ids: a gather into a send buffer, one ``torch.distributed.all_to_all_single`` with fixed split
sizes, and a gather of the received ids into the held input-dist output (whose lengths and offsets stay those of
the batch it was made from).

How the positions are found: TorchRec's own input dist runs once on a probe KJT of the batch's keys and lengths
whose ids are codes of where they come from (``position * world + rank``); the codes each rank receives say which
ids of which rank it needs and where they go. Each rank then sends every source the sorted list of the positions it
needs from it (one all-to-all of counts, one of positions). An id a rank needs twice (two column shards of one
table on one rank) travels once. The result is checked against TorchRec's input dist on the batch itself
(:meth:`StaticInputDist.check`), as :class:`dlrm.graphed.GraphedTrainPipeline` does on its first full batches.

Input dists that route ids by their value send each id to the rank that holds its row, so how many ids each rank
receives changes with every batch. For tables split by rows the ids all-to-all sends whole bags instead (the same
fixed sizes every batch, their positions from every rank's lengths): row_wise features' bags to every rank,
table_row_wise features' bags to every rank of the host group that holds the table (rows split over the
``LOCAL_WORLD_SIZE`` ranks of one host; the other hosts' ranks receive nothing of it). A receiving rank lays them
out as TorchRec's input dist does: feature by feature (its part's order), then by source rank, then by sample.
row_wise takes the sources in rank order; table_row_wise in the staggered order of TorchRec's all-to-all
(``KJTAllToAll``'s ``stagger``: 0, 2, 1, 3 for 2 hosts x 2), which the probe reads off TorchRec's own input dist:
its table_row_wise ids are spread over the row blocks of the host (id ``j`` of a feature to block
``j % LOCAL_WORLD_SIZE``) with the source rank as per-sample weight, so every rank receives some from every source
and sees which source each block of bags came from. The held output of such a part is a KJT of those whole bags
with per-id weights: an id in this rank's rows ``[b * size, (b + 1) * size)`` (``b``: the rank's block, its rank
for row_wise and its rank within the host for table_row_wise; ``size``: TorchRec's rows per block,
:func:`dlrm.torchrec_compat.row_block_sizes`) becomes ``id - b * size`` with weight 1, any other id row 0 with
weight 0 (``torch.where`` on fixed shapes, inside the graph). The TBE pools with these weights, so the pooled
partial sums and the updated rows are those of TorchRec's ids; :meth:`StaticInputDist.check` compares the weight-1
ids and their count per bag with TorchRec's input dist. grid_shard (each column shard of a table split by rows
within a host) is not sent this way (:data:`NOT_SENT`), and :func:`dlrm.graphed.check_graphed` refuses it on
several ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.sharding.dp_sharding import DpSparseFeaturesDist
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.sharding.tw_sharding import TwSparseFeaturesDist
from torchrec.distributed.sharding.twrw_sharding import TwRwSparseFeaturesDist
from torchrec.distributed.types import ShardedModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm import torchrec_compat as compat
from dlrm.errors import ConfigError

# sharding types whose input dist the ids all-to-all does not send: grid_shard's column shards, each split by rows
# within a host, are built on TwRwSparseFeaturesDist like table_row_wise but not laid out as whole bags here
NOT_SENT = ("grid_shard",)
# input dists that route ids by feature alone: table_wise, column_wise and table_column_wise build
# TwSparseFeaturesDist (column shards are features of their own), data_parallel DpSparseFeaturesDist (no collective)
_FEATURE_ROUTED = (TwSparseFeaturesDist, DpSparseFeaturesDist)
# row_wise and table_row_wise (grid_shard too, told apart by its output dist): whole bags, weighted 0 / 1
_ROW_SPLIT = (RwSparseFeaturesDist, TwRwSparseFeaturesDist)
_SOURCE_BITS = 40  # sort key: source rank above bit 40, position below (positions < 2**40)


@dataclasses.dataclass
class _RowSplit:
    """How one row-split input dist's part reaches this rank as whole bags: ``sources``, the source rank of each
    block of bags of a feature in TorchRec's order; ``block``, this rank's row block (rows
    ``[block * size, (block + 1) * size)``); ``sizes``, the rows per block of each feature of the part."""

    sources: List[int]
    block: int
    sizes: List[int]


class StaticInputDist:
    """The ids all-to-all of one sharded module's input dist, with splits fixed from a held batch.

    Args:
        module: the sharded ``EmbeddingBagCollection`` (its input dists built: call after its first batch).
        kjt: this rank's KJT of the held batch (its keys and lengths fix the layout; its ids are not read).
        held: the module's input-dist output for that batch (``module.input_dist(ctx, kjt).wait().wait()``, one
            KJT per sharding); :meth:`run` writes the ids into these KJTs' values.

    Collective: every rank of the input dist's process group builds it at the same point, with a KJT of the same
    keys and lengths layout.

    Raises:
        ConfigError: an input dist it does not send (grid_shard), one that runs on a sub-group of the ranks, a KJT
            with weights, or ids too many to code in the KJT's dtype.
        RuntimeError: TorchRec's input dist laid the probe out otherwise than the batch (an upgrade changed it).
    """

    def __init__(self, module: ShardedModule, kjt: KeyedJaggedTensor, held: Sequence[KeyedJaggedTensor]) -> None:
        self.group = _input_dist_group(module)
        world = dist.get_world_size(self.group)
        _check_codable(kjt, world)
        dists = compat.input_dists(module)
        if len(dists) != len(held):
            raise RuntimeError(f"{len(dists)} input dists gave {len(held)} KJTs")
        splits, spread = _row_splits(dists, held, kjt, self.group)
        probe = _probe(kjt, {k for i in splits for k in held[i].keys()}, spread, dist.get_rank(self.group), world)
        routed = module.input_dist(module.create_context(), probe).wait().wait()
        if len(routed) != len(held):
            raise RuntimeError(f"input dist gave {len(routed)} KJTs for the probe, {len(held)} for the batch")
        got = [p.values().to(torch.int64) for p in routed]
        self.held: List[KeyedJaggedTensor] = list(held)  # what the lookups read (row-split parts: weighted KJTs)
        self._rows: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # part -> (ids, low, high)
        if splits:
            every = [torch.empty_like(kjt.lengths()) for _ in range(world)]
            dist.all_gather(every, kjt.lengths().contiguous(), group=self.group)
            for i, split in splits.items():
                if isinstance(dists[i], TwRwSparseFeaturesDist):
                    split.sources = _source_order(routed[i], world)
                got[i], self.held[i], self._rows[i] = _whole_bags(kjt, held[i], split, every)
        self.sizes = [g.numel() for g in got]
        for i, (h, s) in enumerate(zip(held, self.sizes)):
            if i not in self._rows and h.values().numel() != s:
                raise RuntimeError(f"input dist sent {s} probe ids where the batch had {h.values().numel()}")
        self._exchange_positions(got, kjt.values().numel(), kjt.values().device)

    def _exchange_positions(self, got: List[torch.Tensor], n: int, device: torch.device) -> None:
        """From the codes of every id this rank receives (``position * world + source``, per part), the send and
        receive splits, which positions of its KJT each rank sends (:attr:`send_index`) and where each received
        id goes (:attr:`out_index`). Collective: two all-to-alls."""
        world = dist.get_world_size(self.group)
        # receive buffer: per source rank in rank order, the positions it sends in ascending order, each once
        src = torch.cat(got) if got else torch.zeros(0, dtype=torch.int64, device=device)
        key = (src % world) * (1 << _SOURCE_BITS) + src // world
        needed, where = torch.unique(key, sorted=True, return_inverse=True)
        self.out_index = where  # received ids -> the held input-dist output, all parts in order
        recv_counts = torch.bincount(needed >> _SOURCE_BITS, minlength=world)
        send_counts = torch.empty_like(recv_counts)
        dist.all_to_all_single(send_counts, recv_counts, group=self.group)
        self.recv_splits: List[int] = recv_counts.tolist()
        self.send_splits: List[int] = send_counts.tolist()
        positions = needed & ((1 << _SOURCE_BITS) - 1)
        self.send_index = torch.empty(sum(self.send_splits), dtype=torch.int64, device=device)
        dist.all_to_all_single(
            self.send_index,
            positions,
            output_split_sizes=self.send_splits,
            input_split_sizes=self.recv_splits,
            group=self.group,
        )
        self._identity_send = _is_arange(self.send_index, n)
        self._identity_out = _is_arange(self.out_index, sum(self.recv_splits))

    def run(self, values: torch.Tensor) -> None:
        """Send the ids of ``values`` (this rank's KJT values, in the held batch's layout: ``[n]`` int) and write
        the ids this rank receives into the held input-dist output (:attr:`held`; row-split parts: the ids in
        this rank's rows less its first row with weight 1, the others row 0 with weight 0). The sizes are fixed:
        CUDA-graph safe."""
        if len(self.held) == 1 and self._identity_out and not self._rows:  # received straight into the held ids
            send = values if self._identity_send else values.index_select(0, self.send_index)
            dist.all_to_all_single(self.held[0].values(), send, self.recv_splits, self.send_splits, group=self.group)
            return
        self.place(self.send(values))

    def send(self, values: torch.Tensor) -> torch.Tensor:
        """The all-to-all of :meth:`run` alone: send the ids of ``values`` (as there) and return the ids this
        rank receives (``[sum(recv_splits)]``, ``values``' dtype), for :meth:`place`. Leaves :attr:`held` as it
        is, so a step can send the next batch's ids while it looks up the current batch's."""
        send = values if self._identity_send else values.index_select(0, self.send_index)
        recv = torch.empty(sum(self.recv_splits), dtype=values.dtype, device=values.device)
        dist.all_to_all_single(recv, send, self.recv_splits, self.send_splits, group=self.group)
        return recv

    def place(self, recv: torch.Tensor) -> None:
        """Write ids received by :meth:`send` into the held input-dist output (as :meth:`run` does)."""
        off = 0
        for i, (part, size) in enumerate(zip(self.held, self.sizes)):
            out = self._rows[i][0] if i in self._rows else part.values()
            if self._identity_out:
                out.copy_(recv[off : off + size])
            else:
                torch.index_select(recv, 0, self.out_index[off : off + size], out=out)
            off += size
            if i in self._rows:
                ids, low, high = self._rows[i]
                mine = (ids >= low) & (ids < high)
                part.values().copy_(torch.where(mine, ids - low, torch.zeros_like(ids)))
                part.weights().copy_(mine)

    def check(self, module: ShardedModule, kjt: KeyedJaggedTensor) -> Tuple[bool, str]:
        """Compare the held output, as :meth:`run` left it for ``kjt``, with TorchRec's input dist of ``kjt``
        (collective: TorchRec's all-to-alls). Returns ``(equal, what differs)``; bit for bit: ids and lengths."""
        ref = module.input_dist(module.create_context(), kjt).wait().wait()
        for i, (r, h) in enumerate(zip(ref, self.held)):
            if list(r.keys()) != list(h.keys()):
                return False, f"part {i}: keys {list(r.keys())[:3]}... against {list(h.keys())[:3]}..."
            values, lengths = h.values(), h.lengths()
            if i in self._rows:  # the ids looked up with weight 1, and how many of each bag
                mine = h.weights() != 0
                bags = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
                values = values[mine]
                lengths = torch.bincount(bags[mine], minlength=lengths.numel()).to(r.lengths().dtype)
            if not torch.equal(r.lengths(), lengths):
                return False, f"part {i} ({list(r.keys())[:3]}...): bag sizes differ"
            if not torch.equal(r.values(), values):
                return False, f"part {i} ({list(r.keys())[:3]}...): ids differ"
        return True, ""


def _check_codable(kjt: KeyedJaggedTensor, world: int) -> None:
    """Refuse a KJT whose ids the probe cannot code: one with weights, or too many ids for its dtype."""
    if kjt.weights_or_none() is not None:
        raise ConfigError(
            "config key `pipeline.name`: pipeline=graphed sends ids without per-sample weights on several "
            "ranks, but this KJT has weights; use pipeline=sparse_dist"
        )
    n = kjt.values().numel()
    if n * world >= torch.iinfo(kjt.values().dtype).max:
        raise ConfigError(
            f"config key `data.batch_size`: pipeline=graphed codes each id's position in a KJT of "
            f"{kjt.values().dtype}, and {n} ids per rank x {world} ranks do not fit; use int64 ids or "
            "pipeline=sparse_dist"
        )


def _row_splits(
    dists: Sequence[torch.nn.Module],
    held: Sequence[KeyedJaggedTensor],
    kjt: KeyedJaggedTensor,
    group: dist.ProcessGroup,
) -> Tuple[Dict[int, _RowSplit], Dict[str, Tuple[int, int]]]:
    """The row-split parts of this rank's input-dist output (sources of table_row_wise parts: rank order until
    the probe tells them, :func:`_source_order`), and for the probe every table_row_wise feature's
    ``(ranks per host, rows per block)``. Collective (all-gather) when there are table_row_wise input dists.

    A table_row_wise input dist's block sizes are those of its input features, every host's in host order, each
    host's features in the order its ranks receive them; each rank's part names its host's features, so the
    parts of the hosts' first ranks, gathered, name the block sizes."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    splits: Dict[int, _RowSplit] = {}
    spread: Dict[str, Tuple[int, int]] = {}
    twrw = [i for i, d in enumerate(dists) if isinstance(d, TwRwSparseFeaturesDist)]
    for i, d in enumerate(dists):
        if isinstance(d, RwSparseFeaturesDist):
            splits[i] = _RowSplit(list(range(world)), rank, compat.row_block_sizes(d))
    if not twrw:
        return splits, spread
    keys = list(kjt.keys())
    mine = torch.full((len(twrw), len(keys)), -1, dtype=torch.int64)
    for row, i in enumerate(twrw):
        mine[row, : len(held[i].keys())] = torch.tensor([keys.index(k) for k in held[i].keys()], dtype=torch.int64)
    mine = mine.to(kjt.values().device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    for row, i in enumerate(twrw):
        host, sizes = compat.host_size(dists[i]), compat.row_block_sizes(dists[i])
        names = [keys[j] for h in range(0, world, host) for j in every[h][row].tolist() if j >= 0]
        if len(names) != len(sizes):
            raise RuntimeError(f"{len(sizes)} table_row_wise block sizes for {len(names)} features over the hosts")
        spread.update((k, (host, s)) for k, s in zip(names, sizes))
        splits[i] = _RowSplit(list(range(world)), rank % host, [spread[k][1] for k in held[i].keys()])
    return splits, spread


def _probe(
    kjt: KeyedJaggedTensor, row_keys: set, spread: Dict[str, Tuple[int, int]], rank: int, world: int
) -> KeyedJaggedTensor:
    """``kjt``'s keys and lengths with ids that say where they come from: ``position * world + rank`` for the
    features routed by feature; 0 for row_wise ones (a code would be routed by its value; their layout comes from
    the lengths); for table_row_wise ones id ``j`` of a feature in row block ``j % ranks per host`` (its first
    row), and, with them, weights: this rank, for every id (:func:`_source_order`).

    Raises:
        ConfigError: a table_row_wise feature with fewer ids on this rank than its host has ranks."""
    device, n = kjt.values().device, kjt.values().numel()
    codes = (torch.arange(n, device=device, dtype=torch.int64) * world + rank).to(kjt.values().dtype)
    for k, start, count in zip(kjt.keys(), kjt.offset_per_key(), kjt.length_per_key()):
        if k in spread:
            host, size = spread[k]
            if count < host:  # each rank of the host must receive an id of every source to learn the order
                raise ConfigError(
                    f"config key `data.batch_size`: pipeline=graphed learns where the ids of table_row_wise "
                    f"feature {k} go from one id per rank of its host, but a batch has {count} of its ids on this "
                    f"rank for {host} ranks per host; use a larger data.batch_size or pipeline=sparse_dist"
                )
            codes[start : start + count] = (torch.arange(count, device=device) % host * size).to(codes.dtype)
        elif k in row_keys:
            codes[start : start + count] = 0
    weights = torch.full((n,), float(rank), device=device) if spread else None
    return KeyedJaggedTensor(keys=kjt.keys(), values=codes, lengths=kjt.lengths(), weights=weights)


def _source_order(part: KeyedJaggedTensor, world: int) -> List[int]:
    """The source rank of each block of bags of a feature in a table_row_wise part of the probe's input-dist
    output (TorchRec's staggered order), read off the weights :func:`_probe` gave the ids.

    Raises:
        RuntimeError: a block without ids from the probe, or one whose ids name several sources."""
    if not part.keys():  # a rank of a host without table_row_wise tables receives nothing
        return list(range(world))
    per_block = part.lengths().view(len(part.keys()) * world, -1).sum(1)
    block = torch.repeat_interleave(torch.arange(per_block.numel(), device=per_block.device) % world, per_block)
    sources = part.weights().to(torch.int64)
    order = []
    for b in range(world):
        got = torch.unique(sources[block == b])
        if got.numel() != 1:
            raise RuntimeError(
                f"the probe's table_row_wise ids of block {b} came from {got.tolist()}, one source each expected"
            )
        order.append(int(got))
    if sorted(order) != list(range(world)):
        raise RuntimeError(f"table_row_wise bags came from sources {order}, not from every rank once")
    return order


def _whole_bags(
    kjt: KeyedJaggedTensor,
    part: KeyedJaggedTensor,
    split: _RowSplit,
    every_lengths: Sequence[torch.Tensor],
) -> Tuple[torch.Tensor, KeyedJaggedTensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A row-split part of this rank's input-dist output as whole bags: every id of every sample of each of its
    features (``part``'s keys) from every source rank, in TorchRec's order (feature-major, then source rank in
    ``split.sources``' order, then sample).

    Returns:
        ``(codes, held, (ids, low, high))``: the source of each id as ``position * world + source`` (int64
        ``[m]``); the KJT the lookup reads (``part``'s keys, every source's lengths, ids and float32 weights
        ``[m]`` written by :meth:`StaticInputDist.run`); the received ids' buffer ``[m]`` and this rank's row range
        of each id's table (``[low, high)``, each ``[m]``, in the ids' dtype).
    """
    world, keys = len(every_lengths), kjt.keys()
    index = {k: j for j, k in enumerate(keys)}
    per_key = [lens.view(len(keys), -1) for lens in every_lengths]  # [keys, batch] per source rank
    starts = [torch.cumsum(p.sum(1), 0) - p.sum(1) for p in per_key]
    codes, lengths, low, high = [], [], [], []
    device, dtype = kjt.values().device, kjt.values().dtype
    for k, size in zip(part.keys(), split.sizes):
        j = index[k]
        for s in split.sources:
            count = int(per_key[s][j].sum())
            start = int(starts[s][j])
            codes.append(torch.arange(start, start + count, device=device, dtype=torch.int64) * world + s)
            lengths.append(per_key[s][j])
            low.append(torch.full((count,), split.block * size, device=device, dtype=dtype))
            high.append(torch.full((count,), (split.block + 1) * size, device=device, dtype=dtype))
    m = sum(c.numel() for c in codes)
    held = KeyedJaggedTensor(
        keys=part.keys(),
        values=torch.zeros(m, device=device, dtype=dtype),
        lengths=(torch.cat(lengths) if lengths else part.lengths()).to(part.lengths().dtype),
        weights=torch.zeros(m, device=device, dtype=torch.float32),
    )
    return (
        _cat(codes, torch.int64, device),
        held,
        (torch.empty(m, device=device, dtype=dtype), _cat(low, dtype, device), _cat(high, dtype, device)),
    )


def _cat(parts: List[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=device)


def _is_arange(index: torch.Tensor, n: int) -> bool:
    return index.numel() == n and bool(torch.equal(index, torch.arange(n, device=index.device)))


def _input_dist_group(module: ShardedModule) -> dist.ProcessGroup:
    """The one process group of ``module``'s input-dist all-to-alls (the default group if it has none: all
    data_parallel); refuses input dists it does not send (grid_shard) and those that run on a sub-group."""
    groups = []
    dists = compat.input_dists(module)
    outputs = compat.output_dists(module)
    for i, input_dist in enumerate(dists):
        # grid_shard builds table_row_wise's input dist; its output dist tells them apart
        grid = i < len(outputs) and compat.pooled_output_dist_kind(outputs[i]) == "grid_shard"
        if grid or not isinstance(input_dist, _FEATURE_ROUTED + _ROW_SPLIT):
            raise ConfigError(
                f"config key `sharding.name`: pipeline=graphed sends ids with fixed splits, and row-split tables "
                f"as whole bags (row_wise, table_row_wise), but this plan's "
                f"{'grid_shard' if grid else type(input_dist).__name__} input dist sends each id to the rank "
                f"holding its row, so the all-to-all's sizes change with every batch ({', '.join(NOT_SENT)}); use "
                "sharding=table_wise, column_wise, row_wise or table_row_wise, or pipeline=sparse_dist"
            )
        groups += [compat.kjt_all_to_all_group(m) for m in input_dist.modules() if isinstance(m, KJTAllToAll)]
    group = groups[0] if groups else dist.group.WORLD
    world = list(range(dist.get_world_size()))
    for g in groups:
        if dist.get_process_group_ranks(g) != world:
            raise ConfigError(
                "config key `sharding.name`: pipeline=graphed sends ids over all ranks, but an input dist runs on "
                f"the sub-group {dist.get_process_group_ranks(g)} (a hierarchical plan); use pipeline=sparse_dist"
            )
    return group
