"""The interface every data source's splits implement: :class:`Source`.

A source (``data.name``) is loaded by :func:`dlrm.data.load_splits` into ``(train, val, test or None)`` splits;
the trainer then reads them only through :class:`Source`, via :func:`dlrm.data.train_batches`,
:func:`dlrm.data.eval_batches` and :func:`dlrm.data.batch_position`. Implementations:

* :class:`dlrm.data.in_memory.Split`: rows in memory (``data=synthetic``, :mod:`dlrm.data.synthetic`;
  ``data=criteo_tsv``, :func:`dlrm.data.criteo_tsv.load_criteo_tsv`).
* :class:`dlrm.data.binary.BinarySplit`: memory-mapped day files (``data=criteo_binary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional, Protocol, Sequence, Tuple

import torch
from torchrec.datasets.utils import Batch


@dataclass(frozen=True)
class TrainRequest:
    """What :meth:`Source.train_batches` reads for this rank.

    Attributes:
        plan: ``(start, per_rank_size)`` of each global batch of an epoch (:func:`dlrm.data.layout.train_plan`);
            this rank reads rows ``[start + rank * size, start + (rank + 1) * size)`` of each.
        rank: this rank, ``0 <= rank < world size``.
        epochs: passes over ``plan``.
        max_steps: stop after this many batches in all (None: after ``epochs``).
        feature_names: the 26 KJT keys, one per table.
        multi_hot: None for 1-hot ids, else the expander :func:`dlrm.data.make_multi_hot` built for this source.
        shuffle: read each epoch's rows in a permutation seeded by ``(seed, epoch)``, the same on every rank (a
            source that cannot is refused at config time).
        seed: the shuffle seed (``seed``).
        start_step: skip that many whole batches by index, without building them (a resumed run).
    """

    plan: Sequence[Tuple[int, int]]
    rank: int
    epochs: int
    max_steps: Optional[int]
    feature_names: Sequence[str]
    multi_hot: Optional[Any]
    shuffle: bool = False
    seed: int = 0
    start_step: int = 0


@dataclass(frozen=True)
class EvalRequest:
    """What :meth:`Source.eval_batches` reads for this rank: ``batch_size`` rows a batch (fewer when the longest
    share is shorter) of this rank's share among ``world_size``, with ``feature_names`` and ``multi_hot`` as in
    :class:`TrainRequest`."""

    batch_size: int
    rank: int
    world_size: int
    feature_names: Sequence[str]
    multi_hot: Optional[Any]


class Source(Protocol):
    """One split (train, val or test) of a data source, and this rank's batches cut from it.

    Every batch is a ``torchrec.datasets.utils.Batch`` of ``B`` rows:

    * ``dense_features``: float32 ``[B, 13]``, the transformed dense features.
    * ``sparse_features``: a ``KeyedJaggedTensor`` over the 26 keys ``feature_names``, feature-major: key ``t``
      holds ``B * m_t`` ids (``m_t`` = 1, or table ``t``'s multi-hot size when ``multi_hot`` is given), each
      ``0 <= id < model.table_rows[t]``; lengths int32 ``[26 * B]``; values int64 from in-memory splits, int32
      from the binary format.
    * ``labels``: float32 ``[B]``, 0.0 or 1.0.

    Batches are built on the host, or on the device where the source keeps its rows or expansion tables there
    (``data.assemble_on_device``, ``data.multi_hot_on_device``). Every rank yields the same number of batches of
    the same size, so collectives never wait on a rank that ran out.

    Attributes:
        name: ``train``, ``val`` or ``test``, used in messages.
        source: where the rows come from (a file, a dataset directory, or ``synthetic``), used in messages.
    """

    name: str
    source: str

    def __len__(self) -> int:
        """Rows in the split."""
        ...

    def describe_rows(self, start: int, stop: int) -> str:
        """Where rows ``[start, stop)`` are on disk (file and lines or rows), for messages that point at a row."""
        ...

    def train_batches(self, req: TrainRequest) -> Iterator[Batch]:
        """This rank's training batches over ``req.epochs`` passes of ``req.plan``, stopping after
        ``req.max_steps`` in all (:class:`TrainRequest`)."""
        ...

    def eval_batches(self, req: EvalRequest) -> Iterator[Tuple[Batch, torch.Tensor]]:
        """``(batch, weight)`` of this rank's contiguous share (:func:`dlrm.data.layout.eval_spans`): padding rows
        (copies of split row 0) weigh 0.0, real rows 1.0; ``weight`` is float32 ``[batch size]`` on the CPU."""
        ...
