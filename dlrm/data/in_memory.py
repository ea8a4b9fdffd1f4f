"""Rows held in memory (``data=synthetic``, ``data=criteo_tsv``): :class:`Split`, the MLPerf multi-hot expansion
:class:`MultiHot`, and :func:`to_batch`, which builds one KJT batch from rows of a split.

A :class:`Split` holds rows in model terms (dense features already transformed, one table id per sparse feature)
and implements :class:`dlrm.data.source.Source`; the rank layout of its batches is :mod:`dlrm.data.layout`'s.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.data.layout import eval_spans
from dlrm.data.multihot import build_tables
from dlrm.data.source import EvalRequest, TrainRequest
from dlrm.errors import ConfigError

# Expansion tables above this size are refused with a fix (model.row_cap or data.multi_hot=false): they are int32
# ``[rows, size]`` per table of size > 1: 16.0 GB (14.9 GiB) for the 40 M-row table of size 100.
MULTI_HOT_MAX_BYTES = 16 * 2**30


@dataclass
class Split:
    """Rows of one split, in memory.

    Attributes:
        dense: float32 ``[N, 13]``, transformed dense features.
        ids: int64 ``[N, 26]``, one row id per table (``0 <= ids[:, t] < rows[t]``).
        labels: float32 ``[N]``, 0.0 or 1.0.
        name: ``train``, ``val`` or ``test``, used in messages.
        source: the file the rows came from (or ``synthetic``), for messages that point at a row.
        first_line: 1-based line number in ``source`` of row 0.
    """

    dense: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor
    name: str
    source: str = "synthetic"
    first_line: int = 1

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def rows(self, start: int, stop: int, name: str) -> "Split":
        """Rows ``[start, stop)`` as a new split (views, no copy)."""
        return Split(
            self.dense[start:stop],
            self.ids[start:stop],
            self.labels[start:stop],
            name,
            self.source,
            self.first_line + start,
        )

    def to(self, device: torch.device) -> "Split":
        """The same rows with their tensors on ``device`` (batches are then assembled there)."""
        return Split(
            self.dense.to(device), self.ids.to(device), self.labels.to(device), self.name, self.source, self.first_line
        )

    @property
    def device(self) -> torch.device:
        """The device the rows are on (that of ``ids``; :meth:`to` keeps all three tensors together)."""
        return self.ids.device

    def describe_rows(self, start: int, stop: int) -> str:
        """Where rows ``[start, stop)`` are, e.g. ``train.tsv lines 101-164``."""
        if self.source == "synthetic":
            return f"synthetic {self.name} rows {start}-{stop - 1}"
        return f"{self.source} lines {self.first_line + start}-{self.first_line + stop - 1}"

    def train_batches(self, req: TrainRequest) -> Iterator[Batch]:
        """:meth:`dlrm.data.source.Source.train_batches`: batches built by :func:`to_batch` on the split's device;
        with ``req.shuffle``, each epoch's row order is a permutation seeded by ``(req.seed, epoch)``."""
        step, plan = 0, req.plan
        for epoch in range(req.epochs):
            if step + len(plan) <= req.start_step:
                step += len(plan)
                continue
            order = None
            if req.shuffle:
                g = torch.Generator().manual_seed(req.seed * 1000003 + epoch)
                order = torch.randperm(len(self), generator=g).to(self.device)
            for start, size in plan:
                if step < req.start_step:
                    step += 1
                    continue
                if req.max_steps is not None and step >= req.max_steps:
                    return
                idx = torch.arange(start + req.rank * size, start + (req.rank + 1) * size, device=self.device)
                if order is not None:
                    idx = order[idx]
                yield to_batch(self, idx, req.feature_names, req.multi_hot)
                step += 1

    def eval_batches(self, req: EvalRequest) -> Iterator[Tuple[Batch, torch.Tensor]]:
        """:meth:`dlrm.data.source.Source.eval_batches`: batches built by :func:`to_batch` on the split's device."""
        batch_size, spans = eval_spans(len(self), req.batch_size, req.rank, req.world_size)
        for start, real in spans:
            idx = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
            idx[:real] = torch.arange(start, start + real, device=self.device)
            weight = torch.zeros(batch_size)
            weight[:real] = 1.0
            yield to_batch(self, idx, req.feature_names, req.multi_hot), weight


class MultiHot:
    """The MLPerf DLRM-v2 1-hot to multi-hot expansion.

    Each table ``t`` with multi-hot size ``m`` gets a fixed lookup table ``[rows, m]`` whose row ``i`` is ``i``
    followed by ``m - 1`` ids drawn uniformly from ``[0, rows)``; a sample's bag is the row of its 1-hot id.
    The draws use numpy's legacy global generator seeded once with ``seed`` (MLPerf reference
    ``torchrec_dlrm/multi_hot.py``: ``np.random.seed(0)``, ``randint(0, rows, (rows, m - 1))`` per table in
    order), so every rank, and the reference, derive the same bags.

    Raises:
        ConfigError: the expansion tables would exceed ``MULTI_HOT_MAX_BYTES``; the message names the fix.
    """

    def __init__(self, table_rows: Sequence[int], sizes: Sequence[int], seed: int = 0) -> None:
        need = sum(r * m * 4 for r, m in zip(table_rows, sizes) if m > 1)
        if need > MULTI_HOT_MAX_BYTES:
            raise ConfigError(
                f"data.multi_hot: the MLPerf expansion tables would take {need / 2**30:.1f} GiB of memory "
                f"(limit {MULTI_HOT_MAX_BYTES / 2**30:.0f} GiB); cap the tables with model.row_cap=<rows> or "
                "keep ids 1-hot with data.multi_hot=false"
            )
        self.sizes = [int(m) for m in sizes]
        # the reference's draws, int32 as the reference stores them (dlrm.data.multihot: one implementation)
        self.tables: List[Optional[torch.Tensor]] = [
            None if tab is None else torch.from_numpy(tab) for tab in build_tables(table_rows, sizes, seed)
        ]

    def bags(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """Ids of table ``t``'s bags, int64 ``[len(ids) * size_t]`` (sample-major)."""
        table = self.tables[t]
        return ids if table is None else table[ids].reshape(-1).long()

    def to(self, device: torch.device) -> "MultiHot":
        """The same expansion with its tables on ``device`` (int32, as built)."""
        out = object.__new__(MultiHot)
        out.sizes = list(self.sizes)
        out.tables = [None if tab is None else tab.to(device) for tab in self.tables]
        return out

    def nbytes(self) -> int:
        """Bytes held by the expansion tables (0 when every size is 1)."""
        return sum(tab.numel() * tab.element_size() for tab in self.tables if tab is not None)


_LENGTHS: Dict[Tuple[Tuple[int, ...], int, str], torch.Tensor] = {}


def _lengths(sizes: Tuple[int, ...], b: int, device: torch.device) -> torch.Tensor:
    """int32 ``[F * B]`` lengths of fixed-size bags (feature-major), built once per sizes, batch size and device
    (a KJT only reads them)."""
    key = (sizes, b, str(device))
    if key not in _LENGTHS:
        _LENGTHS[key] = torch.tensor(sizes, dtype=torch.int32).repeat_interleave(b).to(device)
    return _LENGTHS[key]


def to_batch(split: Split, idx: torch.Tensor, feature_names: Sequence[str], multi_hot: Optional[MultiHot]) -> Batch:
    """Build one ``Batch`` from rows ``idx`` of ``split``, on the split's device: dense float32 ``[B, 13]``, labels
    float32 ``[B]``, and a KJT over 26 keys with int64 values (``Split.ids``, feature-major, ``B * m_t`` ids per
    key) and int32 lengths ``[26 * B]``. Every bag of a feature has the same size (1, or its multi-hot size), so
    the KJT's per-key lengths are known on the host: it is built without a device sync."""
    idx = idx.to(split.device)
    ids = split.ids[idx]
    b = int(idx.shape[0])
    sizes = tuple(multi_hot.sizes[t] if multi_hot is not None else 1 for t in range(ids.shape[1]))
    values = [multi_hot.bags(t, ids[:, t]) if multi_hot is not None else ids[:, t] for t in range(ids.shape[1])]
    per_key = [b * m for m in sizes]
    kjt = KeyedJaggedTensor(
        keys=list(feature_names),
        values=torch.cat(values),
        lengths=_lengths(sizes, b, split.device),
        stride=b,
        length_per_key=per_key,
        offset_per_key=[0, *itertools.accumulate(per_key)],
    )
    return Batch(dense_features=split.dense[idx], sparse_features=kjt, labels=split.labels[idx])


def share_rare_ids(
    splits: Tuple[Split, Split, Optional[Split]], min_count: int
) -> Tuple[Split, Split, Optional[Split]]:
    """Frequency thresholding (``data.min_id_count``): in each table, the ids that occur fewer than ``min_count``
    times in the training split's ``ids`` become row 0, in the training, validation and test splits alike; so do
    ids that no training row holds (count 0). Row 0 is where a missing category hashes (``0 % rows``), so rare,
    unseen and missing values train one shared row instead of rows that a few updates, or none, left near their
    initial values.

    Args:
        splits: ``(train, val, test or None)``; ``ids`` int64 ``[N, 26]``. Only ``train`` is counted.
        min_count: the threshold; 1 remaps only the ids that no training row holds, 0 returns ``splits``.

    Returns:
        The splits with new ``ids`` tensors (the inputs are not modified); dense features and labels shared.
    """
    if min_count <= 0:
        return splits
    train = splits[0]
    # unique + isin rather than bincount: the work follows the rows, not the table sizes (up to 40 M rows).
    keep = []
    for t in range(train.ids.shape[1]):
        values, counts = torch.unique(train.ids[:, t], return_counts=True)
        keep.append(values[counts >= min_count])

    def remap(split: Optional[Split]) -> Optional[Split]:
        if split is None:
            return None
        ids = split.ids.clone()
        for t, frequent in enumerate(keep):
            col = ids[:, t]
            ids[:, t] = torch.where(torch.isin(col, frequent.to(col.device)), col, torch.zeros_like(col))
        return Split(split.dense, ids, split.labels, split.name, split.source, split.first_line)

    return remap(splits[0]), remap(splits[1]), remap(splits[2])  # type: ignore[return-value]
