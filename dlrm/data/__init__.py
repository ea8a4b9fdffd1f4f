"""Data sources, MLPerf multi-hot expansion and per-rank KJT batches.

A :class:`Split` holds rows in memory in model terms (dense features already transformed, one table id per
sparse feature). :func:`load_splits` builds the train and validation splits from the config (``data=synthetic``
or ``data=criteo_tsv``; ``data=criteo_binary`` gives memory-mapped ``binary.BinarySplit`` objects that
:func:`train_batches` / :func:`eval_batches` hand to ``dlrm/data/binary.py``); :class:`MultiHot` expands 1-hot ids
into bags; :func:`train_batches` and :func:`eval_batches` cut a split into per-rank
``torchrec.datasets.utils.Batch`` objects.

Rank layout: global batch ``i`` is rows ``[i*G, (i+1)*G)`` (``G`` = global batch) and rank ``r`` takes the
``r``-th contiguous block of it, so the sequence of global batches, and hence the math, does not depend on the
world size when ``data.global_batch_size`` is fixed.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import NUM_DENSE_FEATURES, NUM_SPARSE_FEATURES, ConfigError, DataConfig, ModelConfig
from dlrm.data.criteo_tsv import RawRows, check_file, hash_to_rows, read_tsv
from dlrm.data.multihot import build_tables

log = logging.getLogger(__name__)

# Expansion tables above this size are refused with a fix (model.row_cap or data.multi_hot=false): they are int32
# ``[rows, size]`` per table of size > 1: 16.0 GB (14.9 GiB) for the 40 M-row table of size 100.
MULTI_HOT_MAX_BYTES = 16 * 2**30
# Synthetic ids are drawn from at most this many rows per table, so the teacher stays small for huge tables.
SYNTHETIC_MAX_VOCAB = 100_000


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


def train_plan(n_rows: int, global_batch: int, world_size: int) -> List[Tuple[int, int]]:
    """``(start, per_rank_size)`` of every global batch of a training epoch.

    Full global batches give each rank ``global_batch // world_size`` rows. The last partial global batch of
    ``R`` rows is trained too, each rank taking ``R // world_size`` rows (so all ranks step together); its
    ``R % world_size`` leftover rows, fewer than the world size, are not used.
    """
    per_rank = global_batch // world_size
    plan = []
    for start in range(0, n_rows, global_batch):
        rows = min(global_batch, n_rows - start)
        size = per_rank if rows == global_batch else rows // world_size
        if size > 0:
            plan.append((start, size))
    return plan


def train_batches(
    split: Split,
    *,
    global_batch: int,
    rank: int,
    world_size: int,
    epochs: int,
    max_steps: Optional[int],
    feature_names: Sequence[str],
    multi_hot: Optional[MultiHot],
    shuffle: bool,
    seed: int,
    start_step: int = 0,
) -> Iterator[Batch]:
    """Yield this rank's training batches over ``epochs`` passes, stopping after ``max_steps`` in all.

    Every rank yields the same number of batches of the same size. With ``shuffle``, each epoch's row order is
    a permutation seeded by ``(seed, epoch)``, identical on every rank. ``start_step`` (a resumed run's step
    count) skips that many whole batches by index without building them, so the first batch yielded is the one
    step ``start_step + 1`` trains on.
    """
    plan = train_plan(len(split), global_batch, world_size)
    if not isinstance(split, Split):  # data=criteo_binary: memory-mapped, vectorised reader (dlrm/data/binary.py)
        from dlrm.data import binary

        yield from binary.train_batches(
            split,
            plan=plan,
            rank=rank,
            epochs=epochs,
            max_steps=max_steps,
            feature_names=feature_names,
            multi_hot=multi_hot,  # type: ignore[arg-type]
            prefetch=split.prefetch,
            pin_memory=split.pin_memory,
            start_step=start_step,
        )
        return
    step = 0
    for epoch in range(epochs):
        if step + len(plan) <= start_step:
            step += len(plan)
            continue
        order = None
        if shuffle:
            g = torch.Generator().manual_seed(seed * 1000003 + epoch)
            order = torch.randperm(len(split), generator=g).to(split.device)
        for start, size in plan:
            if step < start_step:
                step += 1
                continue
            if max_steps is not None and step >= max_steps:
                return
            idx = torch.arange(start + rank * size, start + (rank + 1) * size, device=split.device)
            if order is not None:
                idx = order[idx]
            yield to_batch(split, idx, feature_names, multi_hot)
            step += 1


def steps_per_epoch(n_rows: int, global_batch: int, world_size: int) -> int:
    """Training steps in one epoch of ``n_rows`` rows: ``ceil(n_rows / global_batch)``, the last partial global
    batch included, except when it has fewer rows than ``world_size`` (:func:`train_plan`); 0 when ``n_rows <
    world_size``."""
    return len(train_plan(n_rows, global_batch, world_size))


def batch_position(split: Split, step: int, *, global_batch: int, rank: int, world_size: int, shuffle: bool) -> str:
    """Where this rank's batch of training step ``step`` (1-based, as :func:`train_batches` yields) came from."""
    plan = train_plan(len(split), global_batch, world_size)
    epoch, i = divmod(step - 1, len(plan))
    start, size = plan[i]
    lo = start + rank * size
    where = split.describe_rows(lo, lo + size)
    if shuffle:
        return f"epoch {epoch} batch {i}: positions {lo}-{lo + size - 1} of the epoch's shuffled order ({split.source})"
    return f"epoch {epoch} batch {i}: {where}"


def eval_spans(n: int, batch_size: int, rank: int, world_size: int) -> Tuple[int, List[Tuple[int, int]]]:
    """The evaluation layout of :func:`eval_batches` for a split of ``n`` rows: ``(batch size, [(start, real
    rows), ...])`` of this rank's batches. Rows split into ``world_size`` contiguous shares (sizes differ by at
    most one); every rank gets as many batches as the longest share needs, of ``batch_size`` rows or the longest
    share's when that is fewer (no batch of mostly padding); ``real`` may be 0 past the end of a short share."""
    bounds = [n * r // world_size for r in range(world_size + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    longest = max(bounds[r + 1] - bounds[r] for r in range(world_size))
    batch_size = max(1, min(batch_size, longest))
    starts = [lo + i * batch_size for i in range(math.ceil(longest / batch_size))]
    return batch_size, [(start, max(0, min(batch_size, hi - start))) for start in starts]


def eval_batches(
    split: Split,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    feature_names: Sequence[str],
    multi_hot: Optional[MultiHot],
) -> Iterator[Tuple[Batch, torch.Tensor]]:
    """Yield ``(batch, weight)`` for this rank's share of an evaluation split.

    Rows are split into ``world_size`` contiguous shares (sizes differ by at most one). Every rank yields the
    same number of full-size batches, so sharded collectives never wait on a rank that ran out: rows past the
    end of a share are padding (copies of row 0) with weight 0.0; real rows have weight 1.0. A rank whose
    share is empty yields only padding.

    Yields:
        ``batch``: a ``Batch`` of ``batch_size`` rows, or of the longest share's when that is fewer (an in-memory
            split's on its device, :func:`to_batch`).
        ``weight``: float32 ``[batch_size]`` (that size), on the CPU whatever the split's device.
    """
    if not isinstance(split, Split):  # data=criteo_binary (dlrm/data/binary.py), same layout
        from dlrm.data import binary

        yield from binary.eval_batches(
            split,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            feature_names=feature_names,
            multi_hot=multi_hot,  # type: ignore[arg-type]
            prefetch=split.prefetch,
            pin_memory=split.pin_memory,
        )
        return
    batch_size, spans = eval_spans(len(split), batch_size, rank, world_size)
    for start, real in spans:
        idx = torch.zeros(batch_size, dtype=torch.int64, device=split.device)
        idx[:real] = torch.arange(start, start + real, device=split.device)
        weight = torch.zeros(batch_size)
        weight[:real] = 1.0
        yield to_batch(split, idx, feature_names, multi_hot), weight


# ---------------------------------------------------------------------------------------------------------
# Sources


def _split_from_raw(raw: RawRows, table_rows: Sequence[int], name: str, source: str) -> Split:
    return Split(
        dense=torch.from_numpy(raw.ints),
        ids=torch.from_numpy(hash_to_rows(raw.cats, table_rows)),
        labels=torch.from_numpy(raw.labels.astype(np.float32)),
        name=name,
        source=source,
    )


def held_out_rows(max_rows: int, val_fraction: float) -> int:
    """Validation rows beside ``max_rows`` training rows of one TSV file (``data.max_rows`` without
    ``data.val_path``): ``max(1, round(max_rows * val_fraction / (1 - val_fraction)))``, so that the rows read
    split ``1 - val_fraction : val_fraction`` as they do without a cap."""
    return max(1, int(round(max_rows * val_fraction / (1.0 - val_fraction))))


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


def load_criteo_tsv(cfg: DataConfig, table_rows: Sequence[int]) -> Tuple[Split, Split, Optional[Split]]:
    """Train, validation and (optional) test splits: ``data.train_path`` and ``data.val_path`` (or the last
    ``data.val_fraction`` of the training rows), and ``data.test_path``.

    ``data.max_rows`` caps the training rows at the first ``max_rows`` rows of ``data.train_path``, as
    ``data=criteo_binary`` caps its training days. Without ``data.val_path``, the :func:`held_out_rows` rows
    after them validate; when the file holds fewer rows than the two together it is split by
    ``data.val_fraction`` as without a cap (at most ``max_rows`` training rows either way). ``data.val_path`` and
    ``data.test_path`` are read whole.

    Every path is checked (an existing file, not a directory) before the first one is parsed.

    Raises:
        FileNotFoundError: a ``data.*_path`` does not exist (the message names the key).
        InputError: a ``data.*_path`` is a directory.
        TsvFormatError: a malformed file (names the file and line).
        ConfigError: without ``data.val_path``, too few rows to hold out ``data.val_fraction`` of them.
    """
    assert cfg.train_path
    for key in ("train_path", "val_path", "test_path"):
        if getattr(cfg, key):
            check_file(getattr(cfg, key), f"data.{key}")
    cap = cfg.max_rows
    n_val_cap = held_out_rows(cap, cfg.val_fraction) if cap is not None and not cfg.val_path else 0
    read_rows = None if cap is None else cap + n_val_cap
    raw = read_tsv(cfg.train_path, max_rows=read_rows, config_key="data.train_path")
    train = _split_from_raw(raw, table_rows, "train", cfg.train_path)
    test = (
        _split_from_raw(read_tsv(cfg.test_path, config_key="data.test_path"), table_rows, "test", cfg.test_path)
        if cfg.test_path
        else None
    )
    if cfg.val_path:
        val = _split_from_raw(read_tsv(cfg.val_path, config_key="data.val_path"), table_rows, "val", cfg.val_path)
        return train, val, test
    if cap is not None and len(train) == read_rows:
        n_train = cap
    else:
        n_train = int(round(len(train) * (1.0 - cfg.val_fraction)))
        if cap is not None:
            n_train = min(n_train, cap)
    if n_train == 0 or n_train == len(train):
        raise ConfigError(
            f"config key `data.train_path`: {cfg.train_path!r} has {len(train)} rows: too few to hold out "
            f"data.val_fraction={cfg.val_fraction}; give data.val_path or more rows"
        )
    return train.rows(0, n_train, "train"), train.rows(n_train, len(train), "val"), test


class Teacher:
    """The hidden model that labels synthetic samples.

    logit = dense · w + sum_t bias_t[id_t] + sum_{t<s} <v_t[id_t], v_s[id_s]> (factorisation-machine pairs),
    each part at unit scale (weights 1 : 1 : 0.5), rescaled to a standard deviation of 2 and shifted so that about
    25% of samples click (Criteo: 26%). Labels are Bernoulli(sigmoid(logit)), so the best achievable AUC is
    about 0.85, well above 0.5.
    """

    def __init__(self, vocab: Sequence[int], dim: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(NUM_DENSE_FEATURES, generator=g) / math.sqrt(NUM_DENSE_FEATURES)
        self.bias = [torch.randn(v, generator=g) for v in vocab]
        self.v = [torch.randn(v, dim, generator=g) for v in vocab]

    def logits(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Unnormalised teacher logits, float32 ``[N]``: dense, per-id and pairwise parts, each scaled to unit
        standard deviation, weighted 1 : 1 : 0.5."""

        def unit(x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean()) / x.std().clamp_min(1e-12)

        t = ids.shape[1]
        bias = sum(self.bias[k][ids[:, k]] for k in range(t))
        vs = torch.stack([self.v[k][ids[:, k]] for k in range(t)], dim=1)  # [N, T, dim]
        pairs = 0.5 * (vs.sum(1).pow(2).sum(-1) - vs.pow(2).sum((1, 2)))
        return unit(dense @ self.w) + unit(bias) + 0.5 * unit(pairs)


def load_synthetic(cfg: DataConfig, table_rows: Sequence[int], seed: int) -> Tuple[Split, Split, Optional[Split]]:
    """Teacher-labelled MLPerf-shaped splits of ``data.num_train_samples``, ``data.num_val_samples`` and
    ``data.num_test_samples`` rows (no test split when 0).

    Dense features are ``log(count + 1)`` of log-normal counts, ids are uniform over each table's first
    ``min(rows, 100000)`` rows. Both splits come from one generator seeded by ``data.teacher_seed`` (the
    global ``seed`` only drives model init), so every rank and every world size sees the same rows.
    """
    del seed
    vocab = [min(r, SYNTHETIC_MAX_VOCAB) for r in table_rows]
    teacher = Teacher(vocab, cfg.teacher_dim, cfg.teacher_seed)
    g = torch.Generator().manual_seed(cfg.teacher_seed + 1)
    n = cfg.num_train_samples + cfg.num_val_samples + cfg.num_test_samples
    counts = torch.exp(torch.randn(n, NUM_DENSE_FEATURES, generator=g) * 1.5 + 1.0).floor()
    dense = torch.log1p(counts)
    ids = torch.stack([torch.randint(0, v, (n,), generator=g) for v in vocab], dim=1)
    z = teacher.logits(dense, ids)
    z = (z - z.mean()) / z.std() * 2.0
    z = z - 1.6  # about 25% positives after the sigmoid draw
    labels = torch.bernoulli(torch.sigmoid(z), generator=g)
    whole = Split(dense, ids, labels, "all")
    k, v = cfg.num_train_samples, cfg.num_train_samples + cfg.num_val_samples
    test = whole.rows(v, n, "test") if cfg.num_test_samples else None
    return whole.rows(0, k, "train"), whole.rows(k, v, "val"), test


def load_splits(data: DataConfig, model: ModelConfig, seed: int) -> Tuple[Split, Split, Optional[Split]]:
    """Load ``(train, val, test or None)`` for ``data.name``. Row ids are already within each table's
    ``model.table_rows``, rare ones merged into row 0 by ``data.min_id_count`` (:func:`share_rare_ids`).

    Raises:
        FileNotFoundError / InputError / TsvFormatError / ConfigError: ``criteo_tsv`` (:func:`load_criteo_tsv`).
        BinaryFormatError: ``criteo_binary``: the dataset is missing, damaged or built for other table sizes, or
            ``data.multi_hot_source=materialized`` on one without materialized multi-hot
            (``binary.load_splits``, ``binary.reads_materialized``).
    """
    rows = model.table_rows
    assert len(rows) == NUM_SPARSE_FEATURES
    if data.name == "synthetic":
        return share_rare_ids(load_synthetic(data, rows, seed), data.min_id_count)
    if data.name == "criteo_binary":
        from dlrm.data import binary

        return binary.load_splits(
            data.dataset_dir,
            rows,
            data.max_rows,  # type: ignore[return-value]
            multi_hot_files=_binary_materialized(data, model),
            prefetch=data.prefetch,
            pin_memory=data.pin_memory,
        )
    return share_rare_ids(load_criteo_tsv(data, rows), data.min_id_count)


# ---------------------------------------------------------------------------------------------------------
# data=criteo_binary (dlrm/data/binary.py): memory-mapped splits with their own vectorised batch reader.


def _binary_materialized(data: DataConfig, model: ModelConfig) -> bool:
    if not data.multi_hot or data.name != "criteo_binary" or data.multi_hot_source == "on_the_fly":
        return False
    from dlrm.data import binary, binary_format

    meta = binary_format.read_dataset_meta(data.dataset_dir)
    return binary.reads_materialized(
        data.dataset_dir, meta, data.multi_hot_source, model.multi_hot_sizes, data.multi_hot_seed
    )


def assemble_on(data: DataConfig, device: torch.device) -> torch.device:
    """Where batches of the in-memory sources are built (``data.assemble_on_device``; null: on CUDA). The binary
    format builds its own, on the host."""
    if data.name == "criteo_binary":
        return torch.device("cpu")
    on = data.assemble_on_device if data.assemble_on_device is not None else device.type == "cuda"
    return device if on else torch.device("cpu")


def expand_on(data: DataConfig, device: torch.device) -> Optional[torch.device]:
    """The device on which ``data=criteo_binary`` expands on-the-fly multi-hot (``data.multi_hot_on_device``;
    null: on CUDA), or None: in the loader, on the host."""
    on = data.multi_hot_on_device if data.multi_hot_on_device is not None else device.type == "cuda"
    return device if on else None


def make_multi_hot(data: DataConfig, model: ModelConfig) -> Optional[object]:
    """The multi-hot expander for ``data`` (None when ``data.multi_hot`` is false): :class:`MultiHot` for
    in-memory splits; for ``criteo_binary`` a ``binary.BinaryMultiHot`` (materialized files or on-the-fly
    tables, ``data.multi_hot_source``), which never builds MLPerf-size tables in memory.

    Raises:
        ConfigError: in-memory expansion tables over ``MULTI_HOT_MAX_BYTES`` (:class:`MultiHot`).
        BinaryFormatError: ``criteo_binary``: no usable ``meta.json``, ``materialized`` asked for but absent,
            damaged on-disk expansion tables, or tables over 16 GiB that are not on disk (``binary.make_multi_hot``).
    """
    if not data.multi_hot:
        return None
    if data.name == "criteo_binary":
        from dlrm.data import binary, binary_format

        source = "materialized" if _binary_materialized(data, model) else "on_the_fly"
        meta = binary_format.read_dataset_meta(data.dataset_dir)
        return binary.make_multi_hot(data.dataset_dir, meta, source, model.multi_hot_sizes, data.multi_hot_seed)
    return MultiHot(model.table_rows, model.multi_hot_sizes, data.multi_hot_seed)
