"""The ``data`` section of the schema (``data=synthetic|criteo_tsv|criteo_binary``) and the batch arithmetic of a
run: :func:`per_rank_batch`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from dlrm.config.checks import check
from dlrm.errors import ConfigError

DEFAULT_BATCH_SIZE = 256  # data.batch_size when neither batch key is set


def per_rank_batch(data: "DataConfig", world_size: int) -> int:
    """The training batch per rank: ``data.global_batch_size / world_size`` when that is set, else
    ``data.batch_size`` (null: :data:`DEFAULT_BATCH_SIZE`).

    Raises:
        ConfigError: ``data.global_batch_size`` does not divide over ``world_size`` ranks, or ``data.batch_size``
            is also set and is not that quotient (both keys named).
    """
    gb = data.global_batch_size
    if gb is None:
        return data.batch_size or DEFAULT_BATCH_SIZE
    if gb % world_size:
        raise ConfigError(
            f"config key `data.global_batch_size`: {gb} does not divide over {world_size} ranks; use a multiple of "
            "the world size"
        )
    if data.batch_size is not None and data.batch_size * world_size != gb:
        raise ConfigError(
            f"config keys `data.batch_size` and `data.global_batch_size` disagree: {data.batch_size} per rank x "
            f"{world_size} rank{'s' * (world_size != 1)} is {data.batch_size * world_size}, not {gb}; set one of "
            f"them (data.global_batch_size=null to give the batch per rank)"
        )
    return gb // world_size


@dataclass
class DataConfig:
    """Where samples come from and how they are batched (``data=synthetic|criteo_tsv|criteo_binary``)."""

    name: str = "synthetic"
    """``synthetic`` (teacher-labelled MLPerf-shaped data, generated in memory), ``criteo_tsv`` (raw Criteo TSV)
    or ``criteo_binary`` (a directory written by ``data/preprocess_criteo.py``, memory-mapped)."""
    batch_size: Optional[int] = None
    """Samples per rank per step (global batch = batch_size x world size); null: 256, or ``global_batch_size / world
    size`` when that is set. Set together with ``global_batch_size`` it must equal that quotient."""
    global_batch_size: Optional[int] = None
    """If set, the per-rank batch is ``global_batch_size / world size``, so the same command does the same math on
    any world size (must divide evenly)."""
    multi_hot: bool = True
    """Expand each 1-hot id into its table's ``model.multi_hot_sizes`` ids as the MLPerf reference does; false
    keeps one id per feature."""
    multi_hot_seed: int = 0
    """numpy legacy seed of the multi-hot expansion tables (MLPerf reference: 0)."""
    train_path: Optional[str] = None
    """``criteo_tsv``: the training TSV (``label, I1..I13, C1..C26``; Kaggle ``train.txt`` or a 1TB ``day_N``), plain
    or gzip-compressed."""
    val_path: Optional[str] = None
    """``criteo_tsv``: the validation TSV, plain or gzip (null: the last ``data.val_fraction`` of the training rows);
    not the ``train_path`` file."""
    test_path: Optional[str] = None
    """``criteo_tsv``: a TSV scored once at the end, plain or gzip (MLPerf: the second half of day 23); not the
    ``train_path`` file."""
    val_fraction: float = 0.2
    """``criteo_tsv`` without ``val_path``: the last fraction of the rows read from ``train_path`` validates (see
    ``max_rows``). Other values are refused where the validation rows come from elsewhere: ``val_path``,
    ``data=criteo_binary`` (the first half of its last day), ``data=synthetic`` (``num_val_samples``)."""
    max_rows: Optional[int] = None
    """Train on at most this many rows, the first ones of ``train_path`` or of the training days (null: all).
    Validation and test rows are never capped; without ``val_path`` the rows after them validate, so the rows read
    still split by ``val_fraction`` (the counts: docs/data.md, "``data.max_rows``"). Refused with
    ``data=synthetic`` (set ``num_train_samples``)."""
    min_id_count: int = 0
    """``criteo_tsv`` and ``synthetic``: ids seen fewer than this many times in a table's training rows (after
    ``max_rows``) share its row 0, the row of missing values, in every split, as do ids that only validation or
    test rows use (1: only those; 0: off). Why: docs/data.md. Refused with ``criteo_binary`` (its ids are fixed
    when the days are preprocessed)."""
    num_train_samples: int = 131072
    """``synthetic``: training samples."""
    num_val_samples: int = 16384
    """``synthetic``: validation samples."""
    num_test_samples: int = 16384
    """``synthetic``: test samples, scored once at the end (0: no test split)."""
    teacher_seed: int = 1234
    """``synthetic``: seed of the hidden teacher model that labels the samples."""
    teacher_dim: int = 8
    """``synthetic``: width of the teacher's latent factors."""
    shuffle: bool = False
    """Reshuffle the training rows each epoch (MLPerf: no shuffling)."""
    dataset_dir: Optional[str] = None
    """``criteo_binary``: the preprocessed dataset (``meta.json``, ``day_*.npy``). Splits follow MLPerf: train =
    all days but the last, validation / test = first / second half of the last day."""
    multi_hot_source: str = "auto"
    """``criteo_binary``: ``materialized`` (``day_*_sparse_multi_hot.npy``), ``on_the_fly`` (gathered from the
    expansion tables per batch) or ``auto`` (materialized when present)."""
    multi_hot_on_device: Optional[bool] = None
    """``criteo_binary``, on-the-fly multi-hot: copy the expansion tables to the training device (2.5 GB at
    ``model.row_cap=4000000``, 23.9 GB for the MLPerf tables) and expand each batch's 1-hot ids there, off the
    host (null: on CUDA)."""
    prefetch: int = 2
    """``criteo_binary``: batches a background thread keeps ready (0: none)."""
    pin_memory: Optional[bool] = None
    """``criteo_binary``: assemble batches in pinned host memory (null: when CUDA is available)."""
    assemble_on_device: Optional[bool] = None
    """``synthetic`` and ``criteo_tsv``: keep the rows (and the multi-hot expansion tables) on the training device
    and build each batch's KJT there, off the host (null: on CUDA). Costs that much device memory."""

    def __post_init__(self) -> None:
        self._check_values()
        if self.val_fraction != DataConfig.__dataclass_fields__["val_fraction"].default:
            self._check_val_fraction()
        if self.name == "criteo_tsv":
            self._check_tsv_files()
        if self.name == "synthetic":
            self._check_synthetic()
        self._check_loader()
        self._check_dataset_dir()

    def _check_values(self) -> None:
        """The source's name and the ranges of the keys every source reads."""
        check(
            self.name in ("synthetic", "criteo_tsv", "criteo_binary"),
            "data.name",
            f"got {self.name!r}; choose data=synthetic, data=criteo_tsv or data=criteo_binary",
        )
        check(self.batch_size is None or self.batch_size > 0, "data.batch_size", "must be positive or null")
        check(
            self.global_batch_size is None or self.global_batch_size > 0,
            "data.global_batch_size",
            "must be positive or null",
        )
        check(0.0 < self.val_fraction < 1.0, "data.val_fraction", "must be in (0, 1)")
        check(0 <= self.multi_hot_seed < 2**32, "data.multi_hot_seed", "must be in 0 .. 2**32 - 1 (a numpy seed)")
        check(self.teacher_dim >= 0, "data.teacher_dim", "must be >= 0")
        check(self.min_id_count >= 0, "data.min_id_count", "must be >= 0 (0: off)")
        check(
            self.min_id_count == 0 or self.name != "criteo_binary",
            "data.min_id_count",
            "data=criteo_binary reads the ids its preprocessing wrote; set data.min_id_count=0, or train on the "
            "TSV with data=criteo_tsv",
        )

    def _check_val_fraction(self) -> None:
        """A ``val_fraction`` other than the default is refused where the validation rows come from elsewhere."""
        check(
            self.name != "criteo_binary",
            "data.val_fraction",
            "data=criteo_binary validates on the first half of its last day; drop data.val_fraction",
        )
        check(
            self.name != "synthetic",
            "data.val_fraction",
            "data=synthetic validates on data.num_val_samples generated rows; set data.num_val_samples "
            "instead of data.val_fraction",
        )
        check(
            not self.val_path,
            "data.val_fraction",
            "data.val_path gives the validation rows, so data.val_fraction is unused; drop data.val_fraction, "
            "or drop data.val_path to validate on the last data.val_fraction of data.train_path",
        )

    def _check_tsv_files(self) -> None:
        """``criteo_tsv``: a training file, and validation and test files that are not the training rows."""
        check(
            bool(self.train_path),
            "data.train_path",
            "data=criteo_tsv needs a training TSV: pass data.train_path=<file.tsv>",
        )
        for key, what, fix in (
            (
                "val_path",
                "validating",
                "a separate validation file, or drop data.val_path to validate on the last data.val_fraction of "
                "data.train_path",
            ),
            ("test_path", "testing", "a separate test file, or drop data.test_path"),
        ):
            path = getattr(self, key)
            check(
                not (path and _same_file(path, self.train_path or "")),
                f"data.{key}",
                f"{path!r} is the same file as data.train_path ({self.train_path!r}): {what} on the training "
                f"rows inflates AUC; pass {fix}",
            )
        check(
            not (self.test_path and self.val_path and _same_file(self.test_path, self.val_path)),
            "data.test_path",
            f"{self.test_path!r} is the same file as data.val_path: the test split would repeat the validation "
            "rows the run was tuned on; pass a separate test file, or drop data.test_path",
        )

    def _check_synthetic(self) -> None:
        """``synthetic``: no files, positive sample counts, no ``max_rows``."""
        for key in ("train_path", "val_path", "test_path"):
            check(
                getattr(self, key) is None,
                f"data.{key}",
                f"is set ({getattr(self, key)!r}) but data=synthetic ignores files; add data=criteo_tsv "
                "(or experiment=criteo_sample) to train on it",
            )
        check(self.num_train_samples > 0, "data.num_train_samples", "must be positive")
        check(self.num_val_samples > 0, "data.num_val_samples", "must be positive")
        check(self.num_test_samples >= 0, "data.num_test_samples", "must be >= 0")
        check(
            self.max_rows is None,
            "data.max_rows",
            "data=synthetic generates data.num_train_samples training rows; set data.num_train_samples "
            "instead of data.max_rows",
        )

    def _check_loader(self) -> None:
        """The row cap, the multi-hot source and the loader's threads and device."""
        check(self.max_rows is None or self.max_rows > 0, "data.max_rows", "must be positive or null")
        check(
            self.multi_hot_source in ("auto", "materialized", "on_the_fly"),
            "data.multi_hot_source",
            f"got {self.multi_hot_source!r}; use auto, materialized or on_the_fly",
        )
        check(self.prefetch >= 0, "data.prefetch", "must be >= 0 (0: no background thread)")
        check(
            not (self.assemble_on_device and self.name == "criteo_binary"),
            "data.assemble_on_device",
            "data=criteo_binary builds its batches in loader threads, in pinned host memory (data.pin_memory); drop "
            "data.assemble_on_device",
        )

    def _check_dataset_dir(self) -> None:
        """``criteo_binary`` reads ``dataset_dir`` (in file order) and no TSV paths; the other sources refuse it."""
        if self.name == "criteo_binary":
            check(
                bool(self.dataset_dir),
                "data.dataset_dir",
                "data=criteo_binary needs a preprocessed dataset: pass data.dataset_dir=<dir with meta.json> "
                "(build it with data/preprocess_criteo.py)",
            )
            check(
                not self.shuffle,
                "data.shuffle",
                "data=criteo_binary reads rows in file order (MLPerf: no shuffling); set data.shuffle=false",
            )
            for key in ("train_path", "val_path", "test_path"):
                check(
                    getattr(self, key) is None,
                    f"data.{key}",
                    f"is set but data=criteo_binary reads data.dataset_dir; drop data.{key}",
                )
        else:
            check(
                self.dataset_dir is None,
                "data.dataset_dir",
                f"is set but data={self.name} ignores it; add data=criteo_binary to train on it",
            )


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file (equal paths, or :func:`os.path.samefile`); False when either
    does not exist yet, for the loader to name."""
    if os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b)):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): the loader names it
        return False
