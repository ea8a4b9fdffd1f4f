"""Data sources, MLPerf multi-hot expansion and per-rank KJT batches: what the trainer calls.

:func:`load_splits` loads ``(train, val, test or None)`` for ``data.name``; each split implements
:class:`~dlrm.data.source.Source`, which :func:`train_batches`, :func:`eval_batches` and :func:`batch_position`
call through. :func:`make_multi_hot` builds the source's multi-hot expander. The modules:

* ``source.py``: the :class:`~dlrm.data.source.Source` protocol (what a split yields: shapes and dtypes).
* ``layout.py``: the rank layout of training and evaluation batches, shared by every source.
* ``in_memory.py``: :class:`Split` (rows in memory), :class:`MultiHot`, :func:`to_batch`.
* ``synthetic.py`` (``data=synthetic``), ``criteo_tsv.py`` (``data=criteo_tsv``): sources of in-memory splits.
* ``binary_format.py``, ``binary.py``, ``prefetch.py`` (``data=criteo_binary``): the preprocessed format, its
  memory-mapped reader and the thread that reads ahead; ``multihot.py``: the MLPerf expansion tables;
  ``preprocess.py`` (the driver) and ``preprocess_passes.py`` (the parser and per-day passes): raw TSV to the
  binary format.

Rank layout: global batch ``i`` is rows ``[i*G, (i+1)*G)`` (``G`` = global batch) and rank ``r`` takes the
``r``-th contiguous block of it, so the sequence of global batches, and hence the math, does not depend on the
world size when ``data.global_batch_size`` is fixed.
"""

from __future__ import annotations

import logging
from typing import Iterator, Optional, Sequence, Tuple

import torch
from torchrec.datasets.utils import Batch

from dlrm.config import NUM_SPARSE_FEATURES, DataConfig, ModelConfig
from dlrm.data import binary, binary_format
from dlrm.data.criteo_tsv import held_out_rows, load_criteo_tsv
from dlrm.data.in_memory import MULTI_HOT_MAX_BYTES, MultiHot, Split, share_rare_ids, to_batch
from dlrm.data.layout import eval_spans, steps_per_epoch, train_plan
from dlrm.data.source import EvalRequest, Source, TrainRequest
from dlrm.data.synthetic import SYNTHETIC_MAX_VOCAB, Teacher, load_synthetic

__all__ = [
    "MULTI_HOT_MAX_BYTES",
    "SYNTHETIC_MAX_VOCAB",
    "MultiHot",
    "Source",
    "Split",
    "Teacher",
    "EvalRequest",
    "TrainRequest",
    "assemble_on",
    "batch_position",
    "eval_batches",
    "eval_spans",
    "expand_on",
    "held_out_rows",
    "load_criteo_tsv",
    "load_splits",
    "load_synthetic",
    "make_multi_hot",
    "share_rare_ids",
    "steps_per_epoch",
    "to_batch",
    "train_batches",
    "train_plan",
]

log = logging.getLogger(__name__)


def train_batches(
    split: Source,
    *,
    global_batch: int,
    rank: int,
    world_size: int,
    epochs: int,
    max_steps: Optional[int],
    feature_names: Sequence[str],
    multi_hot: Optional[object],
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
    yield from split.train_batches(
        TrainRequest(plan, rank, epochs, max_steps, feature_names, multi_hot, shuffle, seed, start_step)
    )


def batch_position(split: Source, step: int, *, global_batch: int, rank: int, world_size: int, shuffle: bool) -> str:
    """Where this rank's batch of training step ``step`` (1-based, as :func:`train_batches` yields) came from."""
    plan = train_plan(len(split), global_batch, world_size)
    epoch, i = divmod(step - 1, len(plan))
    start, size = plan[i]
    lo = start + rank * size
    where = split.describe_rows(lo, lo + size)
    if shuffle:
        return f"epoch {epoch} batch {i}: positions {lo}-{lo + size - 1} of the epoch's shuffled order ({split.source})"
    return f"epoch {epoch} batch {i}: {where}"


def eval_batches(
    split: Source,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    feature_names: Sequence[str],
    multi_hot: Optional[object],
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
    yield from split.eval_batches(EvalRequest(batch_size, rank, world_size, feature_names, multi_hot))


# ---------------------------------------------------------------------------------------------------------
# Sources


def load_splits(data: DataConfig, model: ModelConfig, seed: int) -> Tuple[Source, Source, Optional[Source]]:
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
        return binary.load_splits(
            data.dataset_dir,
            rows,
            data.max_rows,
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
        source = "materialized" if _binary_materialized(data, model) else "on_the_fly"
        meta = binary_format.read_dataset_meta(data.dataset_dir)
        return binary.make_multi_hot(data.dataset_dir, meta, source, model.multi_hot_sizes, data.multi_hot_seed)
    return MultiHot(model.table_rows, model.multi_hot_sizes, data.multi_hot_seed)
