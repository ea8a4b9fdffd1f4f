"""The input buffers of ``pipeline=graphed``'s captured step (or evaluation forward): one batch shape's dense
features, KJT and labels, and the sharded module's input dist held for them. :class:`HeldBatch` copies each next
batch of that shape into the buffers (ids gathered into the held input dist on one rank, or sent by
:class:`dlrm.static_input_dist.StaticInputDist` with fixed splits on several), flags other bag sizes on the
device, and compares the static ids all-to-all with TorchRec's input dist on the first ``VERIFY_BATCHES``
batches."""

from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed.types import ShardedModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.errors import ConfigError
from dlrm.static_input_dist import StaticInputDist

VERIFY_BATCHES = 2  # full batches whose static ids all-to-all is compared with TorchRec's input dist


class HeldBatch:
    """Input buffers of one batch shape and the sharded module's input dist held for them (the training step's,
    or the evaluation forward's).

    Args:
        module: the sharded module; batch: the batch whose copies become the buffers (on the device).
        ids_all_to_all: send the ids with fixed splits (:class:`dlrm.static_input_dist.StaticInputDist`; collective,
            every rank at the same point); else rebuild the held input dist by a gather (one rank).

    Raises:
        ConfigError: without the ids all-to-all, an input dist that changes the ids; with it, those of
            :class:`dlrm.static_input_dist.StaticInputDist`.
    """

    def __init__(self, module: ShardedModule, batch: Batch, ids_all_to_all: bool) -> None:
        kjt = batch.sparse_features
        values, lengths = kjt.values().clone(), kjt.lengths().clone()
        self.batch = Batch(
            dense_features=batch.dense_features.clone(),
            sparse_features=KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=lengths),
            labels=batch.labels.clone(),
        )
        self.bad = torch.zeros((), dtype=torch.bool, device=values.device)  # a loaded batch had other bag sizes
        self.ctx = module.create_context()
        self.dist = module.input_dist(self.ctx, self.batch.sparse_features).wait().wait()
        self.gathers: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = []  # (held values, gather index)
        self.static_dist: Optional[StaticInputDist] = None
        self.verify_left = VERIFY_BATCHES
        held_kjt = self.batch.sparse_features
        if ids_all_to_all:  # the step sends the ids itself (verified on the first batches: verify)
            self.static_dist = StaticInputDist(module, held_kjt, self.dist)
            self.dist = self.static_dist.held  # row_wise parts: whole bags, weighted (StaticInputDist)
            if any(_same_storage(part.values(), values) for part in self.dist):
                # on one rank TorchRec's input dist hands back the KJT's own ids: the ids sent get a buffer of
                # their own, so that the next batch's ids loaded ahead (load_ids) leave this step's lookups as
                # they are
                self.batch.sparse_features = KeyedJaggedTensor(keys=kjt.keys(), values=values.clone(), lengths=lengths)
            return
        starts = dict(zip(kjt.keys(), held_kjt.offset_per_key()))
        counts = dict(zip(kjt.keys(), held_kjt.length_per_key()))
        for part in self.dist:
            index = torch.cat(
                [torch.arange(starts[k], starts[k] + counts[k], device=values.device) for k in part.keys()]
            )
            identity = index.numel() == values.numel() and bool(
                torch.equal(index, torch.arange(index.numel(), device=index.device))
            )
            held = part.values()
            if not torch.equal(held, values[index].to(held.dtype)):
                raise ConfigError(
                    "config key `pipeline.name`: pipeline=graphed found an input dist that changes the ids (this "
                    f"plan's {type(part).__name__} for keys {list(part.keys())[:3]}...), which a replay cannot "
                    "rebuild; use sharding=table_wise or pipeline=sparse_dist"
                )
            self.gathers.append((held, None if identity else index))

    def fits(self, batch: Batch) -> bool:
        """Whether ``batch`` has the buffers' shapes (its bag sizes are checked on the device: :meth:`load`)."""
        kjt, held = batch.sparse_features, self.batch
        return (
            batch.dense_features.shape == held.dense_features.shape
            and kjt.values().numel() == held.sparse_features.values().numel()
            and kjt.keys() == held.sparse_features.keys()
        )

    def load(self, batch: Batch) -> None:
        """Copy ``batch`` into the input buffers (ids into the held input dist's values, or into the buffers' KJT
        that the ids all-to-all sends); flag other bag sizes on the device, without a host sync."""
        self.load_ids(batch)
        self.load_dense(batch)

    def load_ids(self, batch: Batch) -> None:
        """The ids part of :meth:`load` (with the ids all-to-all: the KJT values it sends next), and the bag-size
        flag."""
        kjt = batch.sparse_features
        self.bad |= (kjt.lengths() != self.batch.sparse_features.lengths()).any()
        src = kjt.values()
        if self.static_dist is not None:
            self.batch.sparse_features.values().copy_(src, non_blocking=True)
        for held, index in self.gathers:
            held.copy_(src if index is None else src.index_select(0, index), non_blocking=True)

    def load_dense(self, batch: Batch) -> None:
        """The rest of :meth:`load`: dense features and labels."""
        self.batch.dense_features.copy_(batch.dense_features, non_blocking=True)
        self.batch.labels.copy_(batch.labels, non_blocking=True)

    def any_bad(self) -> bool:
        """Whether a loaded batch had other bag sizes (one host sync; with the ids all-to-all collective: true on
        every rank if on one)."""
        bad = self.bad
        if self.static_dist is not None:
            bad = bad.to(torch.int32).reshape(1)
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.static_dist.group)
        return bool(bad.item())

    def verify(self, module: ShardedModule, what: str, when: str) -> bool:
        """On the first ``VERIFY_BATCHES`` batches with the ids all-to-all (else nothing): send the buffers' ids
        with the static all-to-all and compare the result with TorchRec's input dist of the same KJT, on every
        rank; all ranks raise ConfigError together if one differs. Returns whether it sent them (the held input
        dist then holds the buffers' ids)."""
        if self.static_dist is None or self.verify_left <= 0:
            return False
        kjt = self.batch.sparse_features
        self.static_dist.run(kjt.values())
        same, why = self.static_dist.check(module, kjt)
        flag = torch.tensor([0 if same else 1], dtype=torch.int32, device=kjt.values().device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.static_dist.group)
        self.verify_left -= 1
        if int(flag.item()):
            raise ConfigError(
                f"config key `pipeline.name`: pipeline=graphed's ids all-to-all with fixed splits differs from "
                f"TorchRec's input dist on {what} {VERIFY_BATCHES - self.verify_left} {when} "
                f"({why or 'on another rank'}); use pipeline=sparse_dist"
            )
        return True

    @contextlib.contextmanager
    def forward_from_input_dist(self, module: ShardedModule) -> Iterator[None]:
        """``module``'s forward, for the duration, is the lookup and output dist of the held input dist."""
        ctx, held = self.ctx, self.dist
        module.forward = lambda *args, **kwargs: module.compute_and_output_dist(ctx, held)  # type: ignore[method-assign]
        try:
            yield
        finally:
            del module.forward


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
