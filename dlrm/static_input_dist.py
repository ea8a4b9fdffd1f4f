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
receives changes with every batch. For row_wise tables the ids all-to-all sends every rank the whole bags of each
row_wise feature instead (the same fixed sizes every batch; the probe carries id 0 for these features, and their
positions come from every rank's lengths). The held output of that part is a KJT of those whole bags with
per-id weights: an id in this rank's rows ``[r * size, (r + 1) * size)`` (``size``: TorchRec's rows per rank,
:func:`dlrm.torchrec_compat.row_block_sizes`) becomes ``id - r * size`` with weight 1, any other id row 0 with
weight 0 (``torch.where`` on fixed shapes, inside the graph). The TBE pools with these weights, so the pooled
partial sums and the updated rows are those of TorchRec's ids; :meth:`StaticInputDist.check` compares the weight-1
ids and their count per bag with TorchRec's input dist. table_row_wise and grid_shard bucketize within a host and
receive in a staggered rank order; they are not sent this way (:data:`VALUE_ROUTED`), and
:func:`dlrm.graphed.check_graphed` refuses them on several ranks.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.sharding.dp_sharding import DpSparseFeaturesDist
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.sharding.tw_sharding import TwSparseFeaturesDist
from torchrec.distributed.types import ShardedModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm import torchrec_compat as compat
from dlrm.errors import ConfigError

# sharding types whose input dist sends each id to the rank holding its row within a host (bucketized by value),
# in a staggered rank order; row_wise tables are sent as whole bags instead (module docstring)
VALUE_ROUTED = ("table_row_wise", "grid_shard")
# input dists that route ids by feature alone: table_wise, column_wise and table_column_wise build
# TwSparseFeaturesDist (column shards are features of their own), data_parallel DpSparseFeaturesDist (no collective)
_FEATURE_ROUTED = (TwSparseFeaturesDist, DpSparseFeaturesDist)
_TAKEN = _FEATURE_ROUTED + (RwSparseFeaturesDist,)  # row_wise: whole bags to every rank, weighted 0 / 1
_SOURCE_BITS = 40  # sort key: source rank above bit 40, position below (positions < 2**40)


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
        ConfigError: an input dist that routes ids by value within a host (table_row_wise, grid_shard), runs on
            a sub-group of the ranks, or a KJT with weights.
    """

    def __init__(self, module: ShardedModule, kjt: KeyedJaggedTensor, held: Sequence[KeyedJaggedTensor]) -> None:
        self.group = _input_dist_group(module)
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if kjt.weights_or_none() is not None:
            raise ConfigError(
                "config key `pipeline.name`: pipeline=graphed sends ids without per-sample weights on several "
                "ranks, but this KJT has weights; use pipeline=sparse_dist"
            )
        device, n = kjt.values().device, kjt.values().numel()
        if n * world >= torch.iinfo(kjt.values().dtype).max:
            raise ConfigError(
                f"config key `data.batch_size`: pipeline=graphed codes each id's position in a KJT of "
                f"{kjt.values().dtype}, and {n} ids per rank x {world} ranks do not fit; use int64 ids or "
                "pipeline=sparse_dist"
            )
        dists = compat.input_dists(module)
        if len(dists) != len(held):
            raise RuntimeError(f"{len(dists)} input dists gave {len(held)} KJTs")
        rows = [i for i, d in enumerate(dists) if isinstance(d, RwSparseFeaturesDist)]
        row_keys = {k for i in rows for k in held[i].keys()}
        # where each id of every rank goes: TorchRec's input dist of ids that are codes of their source (row_wise
        # features' ids 0 in the probe: a code would be routed by its value, and their layout is built below)
        codes = (torch.arange(n, device=device, dtype=torch.int64) * world + rank).to(kjt.values().dtype)
        for k, start, count in zip(kjt.keys(), kjt.offset_per_key(), kjt.length_per_key()):
            if k in row_keys:
                codes[start : start + count] = 0
        probe = KeyedJaggedTensor(keys=kjt.keys(), values=codes, lengths=kjt.lengths())
        routed = module.input_dist(module.create_context(), probe).wait().wait()
        if len(routed) != len(held):
            raise RuntimeError(f"input dist gave {len(routed)} KJTs for the probe, {len(held)} for the batch")
        got = [p.values().to(torch.int64) for p in routed]
        self.held: List[KeyedJaggedTensor] = list(held)  # what the lookups read (row_wise parts: weighted KJTs)
        self._rows: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # part -> (ids, low, high)
        if rows:
            every = [torch.empty_like(kjt.lengths()) for _ in range(world)]
            dist.all_gather(every, kjt.lengths().contiguous(), group=self.group)
            for i in rows:
                got[i], self.held[i], self._rows[i] = _whole_bags(kjt, held[i], dists[i], every, rank)
        self.sizes = [g.numel() for g in got]
        for i, (h, s) in enumerate(zip(held, self.sizes)):
            if i not in self._rows and h.values().numel() != s:
                raise RuntimeError(f"input dist sent {s} probe ids where the batch had {h.values().numel()}")
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
        the ids this rank receives into the held input-dist output (:attr:`held`; row_wise parts: the ids in this
        rank's rows less its first row with weight 1, the others row 0 with weight 0). The sizes are fixed:
        CUDA-graph safe."""
        send = values if self._identity_send else values.index_select(0, self.send_index)
        if len(self.held) == 1 and self._identity_out and not self._rows:  # received straight into the held ids
            dist.all_to_all_single(self.held[0].values(), send, self.recv_splits, self.send_splits, group=self.group)
            return
        recv = torch.empty(sum(self.recv_splits), dtype=values.dtype, device=values.device)
        dist.all_to_all_single(recv, send, self.recv_splits, self.send_splits, group=self.group)
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


def _whole_bags(
    kjt: KeyedJaggedTensor,
    part: KeyedJaggedTensor,
    input_dist: torch.nn.Module,
    every_lengths: Sequence[torch.Tensor],
    rank: int,
) -> Tuple[torch.Tensor, KeyedJaggedTensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The row_wise part of this rank's input-dist output as whole bags: every id of every sample of each of its
    features (``part``'s keys) from every rank, in TorchRec's order (feature-major, then source rank, then
    sample).

    Returns:
        ``(codes, held, (ids, low, high))``: the source of each id as ``position * world + source`` (int64
        ``[m]``); the KJT the lookup reads (``part``'s keys, every source's lengths, ids and float32 weights
        ``[m]`` written by :meth:`StaticInputDist.run`); the received ids' buffer ``[m]`` and this rank's row range
        of each id's table (``[low, high)``, each ``[m]``, in the ids' dtype).
    """
    world, keys = len(every_lengths), kjt.keys()
    index = {k: j for j, k in enumerate(keys)}
    blocks = compat.row_block_sizes(input_dist)
    per_key = [lens.view(len(keys), -1) for lens in every_lengths]  # [keys, batch] per source rank
    starts = [torch.cumsum(p.sum(1), 0) - p.sum(1) for p in per_key]
    codes, lengths, low, high = [], [], [], []
    device, dtype = kjt.values().device, kjt.values().dtype
    for k, block in zip(part.keys(), blocks):
        j = index[k]
        for s in range(world):
            count = int(per_key[s][j].sum())
            start = int(starts[s][j])
            codes.append(torch.arange(start, start + count, device=device, dtype=torch.int64) * world + s)
            lengths.append(per_key[s][j])
            low.append(torch.full((count,), rank * block, device=device, dtype=dtype))
            high.append(torch.full((count,), (rank + 1) * block, device=device, dtype=dtype))
    m = sum(c.numel() for c in codes)
    held = KeyedJaggedTensor(
        keys=part.keys(),
        values=torch.zeros(m, device=device, dtype=dtype),
        lengths=torch.cat(lengths).to(part.lengths().dtype),
        weights=torch.zeros(m, device=device, dtype=torch.float32),
    )
    return torch.cat(codes), held, (torch.empty(m, device=device, dtype=dtype), torch.cat(low), torch.cat(high))


def _is_arange(index: torch.Tensor, n: int) -> bool:
    return index.numel() == n and bool(torch.equal(index, torch.arange(n, device=index.device)))


def _input_dist_group(module: ShardedModule) -> dist.ProcessGroup:
    """The one process group of ``module``'s input-dist all-to-alls (the default group if it has none: all
    data_parallel); refuses input dists that route by value within a host or run on a sub-group."""
    groups = []
    for input_dist in compat.input_dists(module):
        if not isinstance(input_dist, _TAKEN):
            raise ConfigError(
                f"config key `sharding.name`: pipeline=graphed sends ids with fixed splits, but this plan's "
                f"{type(input_dist).__name__} sends each id to the rank holding its row, so the all-to-all's "
                f"sizes change with every batch ({', '.join(VALUE_ROUTED)}); use sharding=table_wise, column_wise "
                "or row_wise, or pipeline=sparse_dist"
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
