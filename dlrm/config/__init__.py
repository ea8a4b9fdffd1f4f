"""Typed configuration schemas for the trainer.

Hydra composes ``conf/config.yaml`` over the structured schema registered here as ``base_config``, so every
YAML file in ``conf/`` is type-checked (an unknown key or a wrong type fails at compose time, naming the key).
:func:`to_config` then turns the composed ``DictConfig`` into these dataclasses, whose ``__post_init__``
validates values and names the config key and the fix in its error.

Each field has a short docstring beside it; ``docs/configuration.md`` is generated from them and from the
shipped config groups::

    python -m dlrm.config --markdown docs/configuration.md   # regenerate the configuration reference
    python train.py --cfg job                                 # print the composed config
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import math
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dlrm.config.mlperf import (
    MLPERF_MULTI_HOT_SIZES,
    MLPERF_NUM_EMBEDDINGS,
    NUM_DENSE_FEATURES,
    NUM_SPARSE_FEATURES,
)
from dlrm.errors import ConfigError
from dlrm.writable import output_file_problem

__all__ = [
    "CONF_DIR",
    "COMPUTE_KERNELS",
    "DEFAULT_BATCH_SIZE",
    "GROUPS",
    "MLPERF_MULTI_HOT_SIZES",
    "MLPERF_NUM_EMBEDDINGS",
    "NUM_DENSE_FEATURES",
    "NUM_SPARSE_FEATURES",
    "SHARDING_PRESETS",
    "SHARDING_TYPES",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "LoggerConfig",
    "MlperfSink",
    "ModelConfig",
    "OffloadConfig",
    "OptimizerConfig",
    "PerfConfig",
    "PipelineConfig",
    "ShardingConfig",
    "StdoutSink",
    "TableConstraintConfig",
    "TensorBoardSink",
    "TrainerConfig",
    "WandbSink",
    "compose",
    "configuration_markdown",
    "error_line",
    "field_docs",
    "group_options",
    "main",
    "output_file_problem",
    "per_rank_batch",
    "register_configs",
    "to_config",
    "unknown_key_error",
]


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key `{key}`: {msg}")


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
class ModelConfig:
    """The network: ``interaction=dcn`` is DLRM-v2 (TorchRec ``DLRM_DCN``), ``dot`` the original DLRM."""

    name: str = "dlrm_v2_small"
    """Label of the preset (``dlrm_v2``, ``dlrm_v2_small``, ``dlrm``); informational."""
    interaction: str = "dcn"
    """``dcn`` (DCNv2 low-rank cross layers) or ``dot`` (pairwise dot products)."""
    embedding_dim: int = 16
    """Width of every table (MLPerf: 128); a multiple of 4 for FBGEMM's fused TBE kernels."""
    num_embeddings_per_feature: List[int] = field(default_factory=lambda: list(MLPERF_NUM_EMBEDDINGS))
    """Rows per table, one per sparse feature C1..C26 (default: the MLPerf cardinalities, 204,184,588 rows)."""
    row_cap: Optional[int] = 2000
    """Upper bound on the rows of every table (``min(rows, row_cap)``); null: no cap."""
    multi_hot_sizes: List[int] = field(default_factory=lambda: list(MLPERF_MULTI_HOT_SIZES))
    """Ids per sample per feature after the multi-hot expansion (MLPerf: 214 in all)."""
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 16])
    """Bottom MLP; its last size must equal ``model.embedding_dim``."""
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 1])
    """Top MLP; its last size must be 1 (one click logit)."""
    dcn_num_layers: int = 3
    """DCNv2 cross layers (MLPerf: 3)."""
    dcn_low_rank_dim: int = 32
    """Low rank of each cross layer (MLPerf: 512)."""
    dense_buckets: int = 0
    """0: off; else that many one-hot buckets per dense feature appended to the bottom MLP's input."""
    dense_bucket_width: float = 1.0
    """Bucket width in units of the dense features as loaded (``log(x + 1)``, or ``log(x - m + 2)`` for days
    preprocessed with ``--dense-transform mlperf``): bucket ``floor(x / width)``, clamped to [0, dense_buckets - 1]."""

    def __post_init__(self) -> None:
        _check(self.interaction in ("dcn", "dot"), "model.interaction", f"got {self.interaction!r}; use dcn or dot")
        _check(self.embedding_dim > 0, "model.embedding_dim", "must be positive")
        n = len(self.num_embeddings_per_feature)
        _check(
            n == NUM_SPARSE_FEATURES,
            "model.num_embeddings_per_feature",
            f"has {n} entries; Criteo has {NUM_SPARSE_FEATURES} sparse features C1..C26, give one per feature",
        )
        _check(
            all(r > 0 for r in self.num_embeddings_per_feature),
            "model.num_embeddings_per_feature",
            "every table needs at least one row",
        )
        _check(
            len(self.multi_hot_sizes) == n,
            "model.multi_hot_sizes",
            f"has {len(self.multi_hot_sizes)} entries; give one per table ({n})",
        )
        _check(all(m >= 1 for m in self.multi_hot_sizes), "model.multi_hot_sizes", "every size must be >= 1")
        _check(self.row_cap is None or self.row_cap > 0, "model.row_cap", "must be positive or null")
        _check(
            len(self.dense_arch_layer_sizes) > 0 and self.dense_arch_layer_sizes[-1] == self.embedding_dim,
            "model.dense_arch_layer_sizes",
            f"the last size ({self.dense_arch_layer_sizes[-1:]}) must equal model.embedding_dim "
            f"({self.embedding_dim}) so dense and sparse outputs interact",
        )
        _check(
            len(self.over_arch_layer_sizes) > 0 and self.over_arch_layer_sizes[-1] == 1,
            "model.over_arch_layer_sizes",
            "the last size must be 1 (one click logit)",
        )
        for key in ("dense_arch_layer_sizes", "over_arch_layer_sizes"):
            _check(all(w > 0 for w in getattr(self, key)), f"model.{key}", "every layer needs a positive width")
        _check(self.dense_buckets >= 0, "model.dense_buckets", "must be >= 0 (0: no buckets)")
        _check(self.dense_bucket_width > 0, "model.dense_bucket_width", "must be positive")
        if self.interaction == "dcn":
            _check(self.dcn_num_layers > 0, "model.dcn_num_layers", "must be positive")
            _check(self.dcn_low_rank_dim > 0, "model.dcn_low_rank_dim", "must be positive")

    @property
    def table_rows(self) -> List[int]:
        """Rows per table after ``row_cap``."""
        cap = self.row_cap
        return [min(r, cap) if cap else r for r in self.num_embeddings_per_feature]


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
        _check(
            self.name in ("synthetic", "criteo_tsv", "criteo_binary"),
            "data.name",
            f"got {self.name!r}; choose data=synthetic, data=criteo_tsv or data=criteo_binary",
        )
        _check(self.batch_size is None or self.batch_size > 0, "data.batch_size", "must be positive or null")
        _check(
            self.global_batch_size is None or self.global_batch_size > 0,
            "data.global_batch_size",
            "must be positive or null",
        )
        _check(0.0 < self.val_fraction < 1.0, "data.val_fraction", "must be in (0, 1)")
        _check(0 <= self.multi_hot_seed < 2**32, "data.multi_hot_seed", "must be in 0 .. 2**32 - 1 (a numpy seed)")
        _check(self.teacher_dim >= 0, "data.teacher_dim", "must be >= 0")
        _check(self.min_id_count >= 0, "data.min_id_count", "must be >= 0 (0: off)")
        _check(
            self.min_id_count == 0 or self.name != "criteo_binary",
            "data.min_id_count",
            "data=criteo_binary reads the ids its preprocessing wrote; set data.min_id_count=0, or train on the "
            "TSV with data=criteo_tsv",
        )
        if self.val_fraction != DataConfig.__dataclass_fields__["val_fraction"].default:
            _check(
                self.name != "criteo_binary",
                "data.val_fraction",
                "data=criteo_binary validates on the first half of its last day; drop data.val_fraction",
            )
            _check(
                self.name != "synthetic",
                "data.val_fraction",
                "data=synthetic validates on data.num_val_samples generated rows; set data.num_val_samples "
                "instead of data.val_fraction",
            )
            _check(
                not self.val_path,
                "data.val_fraction",
                "data.val_path gives the validation rows, so data.val_fraction is unused; drop data.val_fraction, "
                "or drop data.val_path to validate on the last data.val_fraction of data.train_path",
            )
        if self.name == "criteo_tsv":
            _check(
                bool(self.train_path),
                "data.train_path",
                "data=criteo_tsv needs a training TSV: pass data.train_path=<file.tsv>",
            )

            def same_file(a: str, b: str) -> bool:
                if os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b)):
                    return True
                try:
                    return os.path.samefile(a, b)
                except OSError:  # one of them does not exist (yet): the loader names it
                    return False

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
                _check(
                    not (path and same_file(path, self.train_path or "")),
                    f"data.{key}",
                    f"{path!r} is the same file as data.train_path ({self.train_path!r}): {what} on the training "
                    f"rows inflates AUC; pass {fix}",
                )
            _check(
                not (self.test_path and self.val_path and same_file(self.test_path, self.val_path)),
                "data.test_path",
                f"{self.test_path!r} is the same file as data.val_path: the test split would repeat the validation "
                "rows the run was tuned on; pass a separate test file, or drop data.test_path",
            )
        if self.name == "synthetic":
            for key in ("train_path", "val_path", "test_path"):
                _check(
                    getattr(self, key) is None,
                    f"data.{key}",
                    f"is set ({getattr(self, key)!r}) but data=synthetic ignores files; add data=criteo_tsv "
                    "(or experiment=criteo_sample) to train on it",
                )
            _check(self.num_train_samples > 0, "data.num_train_samples", "must be positive")
            _check(self.num_val_samples > 0, "data.num_val_samples", "must be positive")
            _check(self.num_test_samples >= 0, "data.num_test_samples", "must be >= 0")
            _check(
                self.max_rows is None,
                "data.max_rows",
                "data=synthetic generates data.num_train_samples training rows; set data.num_train_samples "
                "instead of data.max_rows",
            )
        _check(self.max_rows is None or self.max_rows > 0, "data.max_rows", "must be positive or null")
        _check(
            self.multi_hot_source in ("auto", "materialized", "on_the_fly"),
            "data.multi_hot_source",
            f"got {self.multi_hot_source!r}; use auto, materialized or on_the_fly",
        )
        _check(self.prefetch >= 0, "data.prefetch", "must be >= 0 (0: no background thread)")
        _check(
            not (self.assemble_on_device and self.name == "criteo_binary"),
            "data.assemble_on_device",
            "data=criteo_binary builds its batches in loader threads, in pinned host memory (data.pin_memory); drop "
            "data.assemble_on_device",
        )
        if self.name == "criteo_binary":
            _check(
                bool(self.dataset_dir),
                "data.dataset_dir",
                "data=criteo_binary needs a preprocessed dataset: pass data.dataset_dir=<dir with meta.json> "
                "(build it with data/preprocess_criteo.py)",
            )
            _check(
                not self.shuffle,
                "data.shuffle",
                "data=criteo_binary reads rows in file order (MLPerf: no shuffling); set data.shuffle=false",
            )
            for key in ("train_path", "val_path", "test_path"):
                _check(
                    getattr(self, key) is None,
                    f"data.{key}",
                    f"is set but data=criteo_binary reads data.dataset_dir; drop data.{key}",
                )
        else:
            _check(
                self.dataset_dir is None,
                "data.dataset_dir",
                f"is set but data={self.name} ignores it; add data=criteo_binary to train on it",
            )


@dataclass
class OptimizerConfig:
    """Adagrad for both sides, as the MLPerf Training rules fix it (lr_decay 0, weight_decay 0, initial
    accumulator 0, eps 1e-8), with the MLPerf reference's lr schedule (warmup, constant, polynomial decay; all
    0 in the closed division: a constant rate)."""

    lr: float = 0.01
    """Learning rate of the dense (MLP) parameters."""
    sparse_lr: Optional[float] = None
    """Learning rate of the embedding tables (null: ``optimizer.lr``)."""
    eps: float = 1e-8
    """Adagrad epsilon of both optimizers (MLPerf Training rules: 1e-8; PyTorch's default 1e-10 is not used)."""
    sparse_type: str = "adagrad"
    """``adagrad`` (element-wise, FBGEMM EXACT_ADAGRAD, the MLPerf rule) or ``rowwise_adagrad`` (one
    accumulator per row, EXACT_ROWWISE_ADAGRAD: 1/dim of the optimizer memory)."""
    warmup_steps: int = 0
    """Linear warmup: step s (0-based) uses ``lr * (s + 1) / warmup_steps`` (0: none)."""
    decay_start_step: int = 0
    """First step of the polynomial decay."""
    decay_steps: int = 0
    """Length of the decay, ``lr * ((start + steps - s) / steps) ** decay_power``, never below ``end_lr``; after
    it the rate stays at ``end_lr`` (0: no decay)."""
    decay_power: float = 2.0
    """Exponent of the decay (MLPerf reference: 2)."""
    end_lr: float = 1e-7
    """Floor of the decay (MLPerf reference: 1e-7)."""

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optimizer.lr", "must be positive")
        _check(self.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
        _check(self.decay_steps >= 0, "optimizer.decay_steps", "must be >= 0")
        _check(self.decay_start_step >= 0, "optimizer.decay_start_step", "must be >= 0")
        _check(self.decay_power > 0, "optimizer.decay_power", "must be positive (a negative power raises the rate)")
        if self.decay_steps:
            _check(
                self.decay_start_step >= self.warmup_steps,
                "optimizer.decay_start_step",
                f"{self.decay_start_step} falls inside the warmup ({self.warmup_steps} steps); start the decay "
                "at or after optimizer.warmup_steps",
            )
        _check(
            0 <= self.end_lr <= min(self.lr, self.sparse_lr or self.lr),
            "optimizer.end_lr",
            f"{self.end_lr} must be in [0, the smaller of optimizer.lr and optimizer.sparse_lr] (the decay's floor "
            "for both); lower optimizer.end_lr",
        )
        _check(self.sparse_lr is None or self.sparse_lr > 0, "optimizer.sparse_lr", "must be positive or null")
        _check(self.eps > 0, "optimizer.eps", "must be positive")
        _check(
            self.sparse_type in ("adagrad", "rowwise_adagrad"),
            "optimizer.sparse_type",
            f"got {self.sparse_type!r}; use adagrad or rowwise_adagrad",
        )

    @property
    def embedding_lr(self) -> float:
        """Learning rate of the embedding tables: ``sparse_lr``, or ``lr`` when it is null."""
        return self.sparse_lr if self.sparse_lr is not None else self.lr


# TorchRec ``ShardingType`` values this trainer runs (``sharding=<name>`` presets, per-table constraints), and
# the ``EmbeddingComputeKernel`` values of the EmbeddingBagCollection sharder (``dense`` is data_parallel's).
SHARDING_TYPES = (
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
    "grid_shard",
)
SHARDING_PRESETS = ("auto", "table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "grid_shard")
COMPUTE_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching", "dense")


def _check_types(values: Optional[List[str]], allowed: Sequence[str], key: str) -> None:
    if values is None:
        return
    _check(len(values) > 0, key, "give at least one value, or null for no constraint")
    bad = [v for v in values if v not in allowed]
    _check(not bad, key, f"unknown value(s) {bad}; choose from {', '.join(allowed)}")


@dataclass
class TableConstraintConfig:
    """Per-table planner constraints (TorchRec ``ParameterConstraints``): ``sharding.constraints.<table>.*``, e.g.
    ``+sharding.constraints.t_cat_0.sharding_types=[row_wise]``; a list field also takes one value as a one-element
    list (``sharding_types=row_wise``). Null: the table follows the preset."""

    sharding_types: Optional[List[str]] = None
    """Sharding types the planner may pick for this table."""
    compute_kernels: Optional[List[str]] = None
    """Compute kernels the planner may pick: ``fused`` (weights in HBM on GPU), ``fused_uvm`` (host memory),
    ``fused_uvm_caching`` (host memory with an HBM cache), ``dense`` (data_parallel only)."""
    min_partition: Optional[int] = None
    """Column shard width for column_wise / table_column_wise / grid_shard: a multiple of 4 dividing the dim."""
    pooling_factors: Optional[List[float]] = None
    """Mean ids per sample of the table's feature, for the planner's cost model (default: its
    ``model.multi_hot_sizes`` entry with ``data.multi_hot``, else 1)."""
    num_poolings: Optional[List[float]] = None
    """TorchRec's per-feature pooling count hint (rarely needed)."""
    batch_sizes: Optional[List[int]] = None
    """TorchRec's per-feature batch size hint (rarely needed)."""

    def validate(self, prefix: str) -> None:
        """Raise ConfigError naming ``<prefix>.<field>`` (``sharding.constraints.<table>.<field>``) for an empty or
        unknown sharding type or compute kernel list, or a ``min_partition`` or pooling factor <= 0."""
        _check_types(self.sharding_types, SHARDING_TYPES, f"{prefix}.sharding_types")
        _check_types(self.compute_kernels, COMPUTE_KERNELS, f"{prefix}.compute_kernels")
        _check(
            self.min_partition is None or self.min_partition > 0,
            f"{prefix}.min_partition",
            "must be a positive number of columns or null",
        )
        _check(
            self.pooling_factors is None or all(x > 0 for x in self.pooling_factors),
            f"{prefix}.pooling_factors",
            "every pooling factor must be positive",
        )


# An example value per field of ``sharding.constraints.<table>``, for the fix in a type error's message.
_CONSTRAINT_EXAMPLES = {
    "sharding_types": "[row_wise]",
    "compute_kernels": "[fused]",
    "min_partition": "8",
    "pooling_factors": "[2.0]",
    "num_poolings": "[1.0]",
    "batch_sizes": "[512]",
}
_KINDS = {str: "name", int: "whole number", float: "number"}


def _of_type(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, not a count or a factor
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _typed_constraint(fields: Dict[str, Any], key: str) -> Dict[str, Any]:
    """The fields of ``sharding.constraints.<table>`` (``key``) checked against :class:`TableConstraintConfig`'s
    types, for its constructor. ``sharding.constraints`` is an untyped dict (OmegaConf cannot add keys to a dict of
    dataclasses from the command line), so nothing else checks them. A list field takes one bare value as a
    one-element list (``sharding_types=row_wise``); list items of a float field become floats.

    Raises:
        ConfigError: a value of the wrong type (a string for ``min_partition``, a mapping for a list, a list item
            of the wrong type), naming ``<key>.<field>`` and an example value.
    """
    hints = typing.get_type_hints(TableConstraintConfig)
    out: Dict[str, Any] = {}
    for name, value in fields.items():
        if value is None:
            out[name] = None
            continue
        (kind,) = [t for t in typing.get_args(hints[name]) if t is not type(None)]  # Optional[X] -> X
        is_list = typing.get_origin(kind) is list
        item = typing.get_args(kind)[0] if is_list else kind
        items = value if is_list and isinstance(value, (list, tuple)) else [value]
        what = f"a list of {_KINDS[item]}s" if is_list else f"a {_KINDS[item]}"
        _check(
            all(_of_type(v, item) for v in items),
            f"{key}.{name}",
            f"got {value!r}; give {what} or null, e.g. {key}.{name}={_CONSTRAINT_EXAMPLES[name]}",
        )
        out[name] = [float(v) if item is float else v for v in items] if is_list else value
    return out


@dataclass
class ShardingConfig:
    """How the TorchRec planner places the embedding tables (``sharding=<preset>``; ``dlrm/sharding.py``,
    docs/sharding.md)."""

    name: str = "auto"
    """The preset: ``auto`` lets the planner choose among every sharding type the backend runs; ``table_wise``,
    ``row_wise``, ``column_wise``, ``table_row_wise``, ``data_parallel`` and ``grid_shard`` force that type on
    every table (per-table constraints still override)."""
    sharding_types: Optional[List[str]] = None
    """The sharding types the planner may use for every table (null: all); set by the ``conf/sharding`` files."""
    compute_kernel: Optional[str] = None
    """Kernel of every table: ``fused``, ``fused_uvm``, ``fused_uvm_caching`` (GPU), ``dense`` (data_parallel);
    null: the planner chooses."""
    min_partition: Optional[int] = None
    """Column shard width for every column-split table (null: TorchRec's 128, capped at the dim)."""
    # Typed per entry in __post_init__: OmegaConf cannot add keys to a Dict[str, <dataclass>] from the command line.
    constraints: Dict[str, Any] = field(default_factory=dict)
    """Per-table overrides keyed by table name (``t_cat_0`` .. ``t_cat_25``); the fields of
    ``sharding.constraints.<table>`` below."""
    storage_reservation: float = 0.05
    """Fraction of device memory the planner keeps free for activations and the dense model (TorchRec
    ``HeuristicalStorageReservation``; the MLPerf reference uses 0.05)."""
    hbm_cap_gb: Optional[float] = None
    """Device memory per rank the planner may use, in GiB (null: the device's capacity; required to plan for
    CUDA on a machine without a GPU)."""
    ddr_cap_gb: Optional[float] = None
    """Host memory per rank, in GiB (null: this host's RAM / local world size)."""
    plan_path: Optional[str] = None
    """A ``plan.json`` (written by a run or by ``python -m dlrm.plan``) used exactly, without planning, after
    checking that it matches the model, world size and device."""
    data_parallel_max_rows: Optional[int] = None
    """Tables of at most this many rows (after ``model.row_cap``) are data_parallel: replicated, their pooled
    embeddings skip the output dist, their gradients join DDP's all-reduce (HugeCTR's hybrid placement). A
    table's own ``sharding_types`` wins; needs fp32 tables. Null: off."""

    def __post_init__(self) -> None:
        _check(
            self.name in SHARDING_PRESETS,
            "sharding.name",
            f"got {self.name!r}; choose sharding={'|'.join(SHARDING_PRESETS)}",
        )
        _check_types(self.sharding_types, SHARDING_TYPES, "sharding.sharding_types")
        _check(
            self.compute_kernel is None or self.compute_kernel in COMPUTE_KERNELS,
            "sharding.compute_kernel",
            f"got {self.compute_kernel!r}; choose from {', '.join(COMPUTE_KERNELS)} or null",
        )
        if self.compute_kernel == "dense":
            _check(
                self.sharding_types == ["data_parallel"],
                "sharding.compute_kernel",
                "the dense kernel only runs data_parallel tables; use sharding=data_parallel, or a fused kernel",
            )
        if self.sharding_types == ["data_parallel"]:
            _check(
                self.compute_kernel in (None, "dense"),
                "sharding.compute_kernel",
                f"data_parallel tables run the dense kernel, not {self.compute_kernel}; "
                "set sharding.compute_kernel=null",
            )
        _check(
            self.min_partition is None or self.min_partition > 0,
            "sharding.min_partition",
            "must be a positive number of columns or null",
        )
        for table, c in list(self.constraints.items()):
            key = f"sharding.constraints.{table}"
            if not isinstance(c, TableConstraintConfig):
                _check(isinstance(c, dict), key, "must be a mapping of constraint fields")
                names = {f.name for f in dataclasses.fields(TableConstraintConfig)}
                bad = sorted(set(c) - names)
                _check(not bad, key, f"unknown field(s) {bad}; the fields are: {', '.join(sorted(names))}")
                c = self.constraints[table] = TableConstraintConfig(**_typed_constraint(c, key))
            c.validate(key)
        _check(0.0 <= self.storage_reservation < 1.0, "sharding.storage_reservation", "must be in [0, 1)")
        _check(
            self.data_parallel_max_rows is None or self.data_parallel_max_rows > 0,
            "sharding.data_parallel_max_rows",
            "must be a positive number of rows, or null (off)",
        )
        _check(self.hbm_cap_gb is None or self.hbm_cap_gb > 0, "sharding.hbm_cap_gb", "must be positive or null")
        _check(self.ddr_cap_gb is None or self.ddr_cap_gb > 0, "sharding.ddr_cap_gb", "must be positive or null")


@dataclass
class PipelineConfig:
    """The training loop driver: one of TorchRec's pipelines, or the CUDA-graph one (``pipeline=<name>``;
    ``dlrm/pipeline.py``)."""

    name: str = "sparse_dist"
    """``sparse_dist`` (TorchRec's ``TrainPipelineSparseDist``), ``fused_sparse_dist``, ``semi_sync``,
    ``prefetch``, ``base`` (``TrainPipelineBase``: no overlap, for debugging) or ``graphed`` (fixed bag sizes,
    the step as one CUDA graph: ``dlrm/graphed.py``); what each overlaps: docs/configuration.md, "Config groups".
    All but ``sparse_dist`` and ``base`` need CUDA."""
    input_dist_group: str = "shared"
    """``shared``: the input dist's KJT all-to-alls run on the default process group; ``dedicated``: on one extra
    group over the same ranks (its own NCCL communicator and stream), so the next batch's ids do not queue behind
    this step's output dist, backward all-to-all and all-reduce (``dlrm/comms.py``)."""
    semi_sync_start_batch: int = 0
    """``semi_sync``: the batches before this one train synchronously (TorchRec's ``start_batch``; its default
    is 900)."""

    def __post_init__(self) -> None:
        _check(
            self.name in ("sparse_dist", "fused_sparse_dist", "semi_sync", "prefetch", "base", "graphed"),
            "pipeline.name",
            f"got {self.name!r}; use sparse_dist, fused_sparse_dist (CUDA), semi_sync (CUDA), prefetch (uvm "
            "caching, CUDA), base (plain loop, no overlap, for debugging) or graphed (CUDA graph, fixed bag sizes)",
        )
        _check(
            self.semi_sync_start_batch >= 0,
            "pipeline.semi_sync_start_batch",
            f"got {self.semi_sync_start_batch}; use a batch index >= 0",
        )
        _check(
            self.input_dist_group in ("shared", "dedicated"),
            "pipeline.input_dist_group",
            f"got {self.input_dist_group!r}; use shared or dedicated",
        )


@dataclass
class PerfConfig:
    """Speed levers (``perf=<preset>``; ``dlrm/perf.py``). ``perf=fp32`` (the schema's defaults) keeps the
    reference numerics; ``perf=fast`` sets the combination measured fastest on H200 (docs/performance.md)."""

    name: str = "fp32"
    """Label of the preset (logged): ``fp32``, ``fast`` or your own."""
    embedding_dtype: str = "fp32"
    """Table weights: ``fp32`` or ``fp16`` (FBGEMM's TBE trains no bf16 weights). fp16 halves table memory;
    FBGEMM keeps the Adagrad state in fp32. Not for data_parallel tables."""
    embedding_output_dtype: str = "fp32"
    """Pooled embeddings (TBE ``output_dtype``), and so the output dist's all-to-all and the gradients sent
    back: ``fp32``, ``fp16`` or ``bf16`` (bf16: CUDA only). Under autocast: fp32 or the autocast dtype."""
    allreduce_dtype: str = "fp32"
    """DDP all-reduce of the dense gradients: ``fp32`` (exact), ``bf16`` (CUDA and NCCL) or ``fp16``
    (PyTorch's compress hooks, through TorchRec's ``allreduce_comm_precision``); no effect on one rank."""
    tbe_bounds_check: str = "warning"
    """FBGEMM's per-batch check of every id against its table's rows: ``warning`` (FBGEMM's default: an
    out-of-range id is looked up as row 0 and a warning logged), ``fatal`` (the step fails) or ``none`` (no
    check; every loader here keeps ids in range; keep a check for KJTs of your own)."""
    tbe_stochastic_rounding: bool = True
    """With fp16 tables: ``true`` rounds each updated weight stochastically (FBGEMM's default on CUDA; its CPU
    kernels always round to nearest), ``false`` to nearest, faster on H200, but an update below half the fp16
    spacing at the weight (1/4096 to 1/2048 of it) is lost, not kept on average (docs/performance.md, "Rejected
    levers")."""
    autocast: str = "none"
    """``none``, ``bf16`` or ``fp16``: ``torch.autocast`` around the dense arch, the interaction and the over
    arch (weights stay fp32; the loss is computed in fp32 from fp32 logits)."""
    dcn_residual_dtype: str = "fp32"
    """The DCN's residual stream under autocast: ``fp32`` (TorchRec's ``LowRankCrossNet``, whose fp32 bias
    promotes every layer's output) or ``autocast`` (bias and ``x_0`` cast to the products' dtype:
    ``dlrm.model.AutocastLowRankCrossNet``; same parameters). Needs ``perf.autocast`` and ``model.interaction=dcn``."""
    tf32: bool = True
    """Allow TF32 matrix products for fp32 work on CUDA (the MLPerf reference's ``--allow_tf32``, off there by
    default); ignored on CPU."""
    compile: bool = False
    """``torch.compile`` the dense arch, the interaction, the over arch and the loss as one graph (the modules
    are not wrapped: parameter names and checkpoints are unchanged); each new batch size compiles once."""
    compile_mode: str = "default"
    """``default`` or ``max-autotune-no-cudagraphs`` (Inductor benchmarks matrix-product templates while
    compiling: minutes of compile for a small gain)."""
    compile_ddp_split: bool = True
    """With ``compile`` under DDP: let dynamo split the compiled step at DDP's gradient buckets
    (``torch._dynamo.config.optimize_ddp``, PyTorch's default) so each bucket's all-reduce starts during the
    backward; false compiles one graph."""
    ddp_bucket_cap_mb: int = 25
    """DDP's gradient bucket size in MiB (25: PyTorch's and TorchRec's default); the MLPerf dense side holds
    61 MiB of fp32 gradients."""
    lean_output_dist: bool = False
    """Send the pooled embeddings of table_wise and column_wise tables (table_row_wise, grid_shard: across
    hosts) without TorchRec's staging copy; with every table table_wise, hand them over as received and gather
    them inside the compiled dense step (``dlrm/output_dist.py``). Same values bit for bit; several ranks only."""
    allreduce_after_output_dist: bool = False
    """With ``lean_output_dist``: hold DDP's all-reduce until the backward all-to-alls of the pooled embeddings
    are issued, so it runs beside the TBE backward (``dlrm.comms.AllReduceAfterOutputDist``). Needs an fp32
    all-reduce; several ranks only."""

    def __post_init__(self) -> None:
        _check(
            self.embedding_dtype != "bf16",
            "perf.embedding_dtype",
            "FBGEMM's TBE trains no bf16 table weights (its CUDA cache set-up refuses them, its CPU kernels have "
            "none); use fp16 (half the memory) or fp32",
        )
        _check(
            self.embedding_dtype in ("fp32", "fp16"),
            "perf.embedding_dtype",
            f"got {self.embedding_dtype!r}; use fp32 or fp16",
        )
        for key in ("embedding_output_dtype", "allreduce_dtype"):
            v = getattr(self, key)
            _check(v in ("fp32", "fp16", "bf16"), f"perf.{key}", f"got {v!r}; use fp32, fp16 or bf16")
        _check(
            self.tbe_stochastic_rounding or self.embedding_dtype == "fp16",
            "perf.tbe_stochastic_rounding",
            "false rounds fp16 table updates to nearest and has no effect on fp32 tables; add "
            "perf.embedding_dtype=fp16, or drop the key",
        )
        if self.allreduce_after_output_dist:
            _check(
                self.lean_output_dist,
                "perf.allreduce_after_output_dist",
                "holds DDP's all-reduce until the lean output dists' backward all-to-alls are issued; add "
                "perf.lean_output_dist=true, or set perf.allreduce_after_output_dist=false",
            )
            _check(
                self.allreduce_dtype == "fp32",
                "perf.allreduce_after_output_dist",
                "issues DDP's fp32 all-reduce (PyTorch's default hook); with "
                f"perf.allreduce_dtype={self.allreduce_dtype} set perf.allreduce_after_output_dist=false (or use "
                "perf.allreduce_dtype=fp32)",
            )
        _check(
            self.tbe_bounds_check in ("warning", "fatal", "none"),
            "perf.tbe_bounds_check",
            f"got {self.tbe_bounds_check!r}; use warning, fatal or none",
        )
        _check(
            self.autocast in ("none", "bf16", "fp16"), "perf.autocast", f"got {self.autocast!r}; use none, bf16 or fp16"
        )
        _check(
            self.autocast == "none" or self.embedding_output_dtype in ("fp32", self.autocast),
            "perf.embedding_output_dtype",
            f"{self.embedding_output_dtype} pooled embeddings cannot meet {self.autocast} autocast (autocast's "
            f"torch.cat promotion refuses fp16 with bf16); use perf.embedding_output_dtype={self.autocast} or fp32",
        )
        _check(
            self.dcn_residual_dtype in ("fp32", "autocast"),
            "perf.dcn_residual_dtype",
            f"got {self.dcn_residual_dtype!r}; use fp32 or autocast",
        )
        _check(
            self.dcn_residual_dtype == "fp32" or self.autocast != "none",
            "perf.dcn_residual_dtype",
            "autocast keeps the DCN's residual stream in the autocast dtype and has no effect while "
            "perf.autocast=none; add perf.autocast=bf16, or use perf.dcn_residual_dtype=fp32",
        )
        _check(
            self.compile_mode not in ("reduce-overhead", "max-autotune"),
            "perf.compile_mode",
            f"{self.compile_mode} captures CUDA graphs, which the trainer does not run (not faster on H200: "
            f"docs/performance.md); use default or max-autotune-no-cudagraphs",
        )
        modes = ("default", "max-autotune-no-cudagraphs")
        _check(self.compile_mode in modes, "perf.compile_mode", f"got {self.compile_mode!r}; use one of {modes}")
        _check(
            self.compile or self.compile_mode == "default",
            "perf.compile_mode",
            f"{self.compile_mode} has no effect while perf.compile=false; add perf.compile=true",
        )
        _check(
            self.compile or self.compile_ddp_split,
            "perf.compile_ddp_split",
            "splits the compiled dense step and has no effect while perf.compile=false; add perf.compile=true",
        )
        _check(
            self.ddp_bucket_cap_mb >= 1,
            "perf.ddp_bucket_cap_mb",
            f"got {self.ddp_bucket_cap_mb}; use a bucket size in MiB >= 1 (25: PyTorch's default)",
        )


@dataclass
class OffloadConfig:
    """Embedding tables in host memory (``offload=none|uvm|uvm_caching``; ``dlrm/offload.py``), through planner
    constraints on the compute kernel. Training needs CUDA; plans accept it anywhere."""

    name: str = "none"
    """``none`` (tables where the planner puts them), ``uvm`` (``fused_uvm``: tables in host memory, read over
    the bus by the TBE) or ``uvm_caching`` (``fused_uvm_caching``: host memory plus an HBM cache; needs
    ``pipeline=prefetch``)."""
    min_table_rows: int = 0
    """Offload only tables with at least this many rows (0: every table)."""
    min_table_mb: float = 0.0
    """Offload only tables whose fp32 weights take at least this many MiB (0: no threshold); a table must pass
    both thresholds."""
    cache_load_factor: float = 0.2
    """``uvm_caching``: HBM cache rows as a fraction of the table's rows (FBGEMM ``cache_load_factor``)."""
    cache_algorithm: str = "lru"
    """``uvm_caching``: ``lru`` or ``lfu`` (FBGEMM ``CacheAlgorithm``)."""

    def __post_init__(self) -> None:
        _check(
            self.name in ("none", "uvm", "uvm_caching"),
            "offload.name",
            f"got {self.name!r}; use offload=none, offload=uvm or offload=uvm_caching",
        )
        _check(self.min_table_rows >= 0, "offload.min_table_rows", "must be >= 0")
        _check(self.min_table_mb >= 0, "offload.min_table_mb", "must be >= 0")
        _check(0.0 < self.cache_load_factor <= 1.0, "offload.cache_load_factor", "must be in (0, 1]")
        _check(
            self.cache_algorithm in ("lru", "lfu"),
            "offload.cache_algorithm",
            f"got {self.cache_algorithm!r}; use lru or lfu",
        )


@dataclass
class StdoutSink:
    """One line per logged step and per evaluation on rank 0 (``logger=[stdout,...]``)."""

    enabled: bool = False
    """Print the lines (set by listing ``stdout`` in ``logger``)."""
    progress_bar: Optional[bool] = None
    """null: a tqdm bar with ETA when stdout is a terminal, plain lines otherwise; true / false force it."""


@dataclass
class TensorBoardSink:
    """TensorBoard event files (``tensorboard --logdir <run_dir>``)."""

    enabled: bool = False
    """Write event files (set by listing ``tensorboard`` in ``logger``)."""
    dir: str = "tensorboard"
    """Directory under the run directory."""

    def __post_init__(self) -> None:
        _needs_package(self.enabled, "tensorboard", "tensorboard", "tensorboard==2.21.0 (or pip install -e .)")


@dataclass
class WandbSink:
    """Weights & Biases; files go under ``<run_dir>/wandb``."""

    enabled: bool = False
    """Log to W&B (set by listing ``wandb`` in ``logger``)."""
    project: str = "dlrm-v2"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (null: your default)."""
    name: Optional[str] = None
    """Run name (null: W&B's)."""
    mode: Optional[str] = None
    """``online``, ``offline`` (no network; ``wandb sync`` later), ``disabled`` or null (the ``WANDB_MODE``
    environment variable, else online)."""

    def __post_init__(self) -> None:
        _check(
            self.mode in (None, "online", "offline", "disabled"),
            "logger.wandb.mode",
            f"got {self.mode!r}; use online, offline, disabled or null",
        )
        _needs_package(self.enabled, "wandb", "wandb", "-e '.[wandb]' (or pip install wandb)")


def _needs_package(enabled: bool, module: str, sink: str, install: str) -> None:
    """Refuse a sink whose package is missing when the config loads, not after the model is planned and sharded
    (wandb is an extra; the others are dependencies that a hand-assembled environment can lack)."""
    _check(
        not enabled or importlib.util.find_spec(module) is not None,
        "logger",
        f"logger=[...,{sink}] needs the {module} package, which is not installed; pip install {install}, or leave "
        f"{sink} out of logger",
    )


@dataclass
class MlperfSink:
    """MLPerf ``mllog`` lines for ``dlrm_dcnv2`` (``mlperf-logging`` package)."""

    enabled: bool = False
    """Write the log (set by listing ``mlperf`` in ``logger``)."""
    file: str = "mlperf.log"
    """File under the run directory."""
    submission_org: str = "reference"
    """``submission_org`` of the log."""
    submission_platform: str = "unknown"
    """``submission_platform`` of the log."""
    submission_division: str = "open"
    """``open`` or ``closed`` (closed also needs MLPerf's data: 89,137,319 evaluation samples)."""
    submission_status: str = "research"
    """``submission_status`` of the log."""

    def __post_init__(self) -> None:
        _check(
            self.submission_division in ("open", "closed"), "logger.mlperf.submission_division", "use open or closed"
        )
        _needs_package(self.enabled, "mlperf_logging", "mlperf", "mlperf-logging==4.1.68 (or pip install -e .)")


@dataclass
class LoggerConfig:
    """Where metrics go (``logger=[stdout,jsonl,tensorboard,wandb,mlperf]``, any subset). ``metrics.jsonl`` and
    ``config.yaml`` are always written to the run directory; every sink runs on rank 0 only."""

    log_every_n_steps: int = 20
    """One record per this many steps (and the last step)."""
    train_auc: bool = True
    """Compute a windowed training AUC over each logging window (histogram method)."""
    verbose: bool = False
    """Print the sharding plan and step-traffic tables on stdout too (always in ``train.log`` and ``plan.json``;
    stdout gets a one-line summary of the plan)."""
    stdout: StdoutSink = field(default_factory=StdoutSink)
    tensorboard: TensorBoardSink = field(default_factory=TensorBoardSink)
    wandb: WandbSink = field(default_factory=WandbSink)
    mlperf: MlperfSink = field(default_factory=MlperfSink)

    def __post_init__(self) -> None:
        _check(self.log_every_n_steps > 0, "logger.log_every_n_steps", "must be positive")


@dataclass
class TrainerConfig:
    """How long to train and what to do with a non-finite loss."""

    epochs: int = 1
    """Passes over the training split."""
    max_steps: Optional[int] = None
    """Stop after this many optimizer steps (null: all epochs)."""
    on_nonfinite: str = "stop"
    """``stop``: a NaN or inf loss ends the run (exit 1), naming the step, the batch's rows and the last finite
    metrics; the losses are checked at every log window and before every checkpoint and evaluation, so no
    checkpoint is saved after a step whose loss was not finite. ``skip_batch``: also drop batches whose inputs are
    not finite (their update is zeroed on the device)."""

    def __post_init__(self) -> None:
        _check(
            self.on_nonfinite in ("stop", "skip_batch"),
            "trainer.on_nonfinite",
            f"got {self.on_nonfinite!r}; use stop or skip_batch",
        )
        _check(self.epochs > 0, "trainer.epochs", "must be positive")
        _check(self.max_steps is None or self.max_steps > 0, "trainer.max_steps", "must be positive or null")


@dataclass
class EvalConfig:
    """Validation during training, the stop target and the AUC method."""

    every_n_steps: Optional[int] = None
    """Validate every this many steps (null: see ``eval.per_epoch``)."""
    per_epoch: Optional[int] = None
    """Validate this many times per epoch, every ``floor(training rows / (global batch * per_epoch))`` steps
    (at least 1; the MLPerf reference's rule, 20 per epoch); exclusive with ``eval.every_n_steps``."""
    at_end: bool = True
    """Validate after the last step too (the MLPerf recipe does not: its 20th validation is its last); the test
    split, if any, is scored at the end either way."""
    batch_size: Optional[int] = None
    """Per-rank evaluation batch (null: ``data.batch_size``)."""
    target_auc: Optional[float] = None
    """Stop once validation AUC reaches this (MLPerf: 0.80275); null: never. A histogram AUC must reach it by more
    than its error bound (``val_auc_bound`` in metrics.jsonl), so the exact AUC reaches it too."""
    auc_method: str = "auto"
    """``exact`` (every prediction gathered; equals sklearn), ``histogram`` (16 MB of counts per rank, within
    1e-4 of sklearn in tests) or ``auto`` (exact up to 16 M evaluation rows)."""

    def __post_init__(self) -> None:
        _check(self.every_n_steps is None or self.every_n_steps > 0, "eval.every_n_steps", "must be positive or null")
        _check(self.per_epoch is None or self.per_epoch > 0, "eval.per_epoch", "must be positive or null")
        _check(
            self.every_n_steps is None or self.per_epoch is None,
            "eval.per_epoch",
            "set either eval.every_n_steps or eval.per_epoch, not both (null the other)",
        )
        _check(self.batch_size is None or self.batch_size > 0, "eval.batch_size", "must be positive or null")
        _check(self.target_auc is None or 0.5 < self.target_auc <= 1.0, "eval.target_auc", "must be in (0.5, 1]")
        _check(
            self.auc_method in ("auto", "exact", "histogram"),
            "eval.auc_method",
            f"got {self.auc_method!r}; use auto, exact or histogram",
        )


@dataclass
class CheckpointConfig:
    """Sharded ``torch.distributed.checkpoint`` checkpoints, exact resume and preemption (``dlrm/checkpoint.py``)."""

    dir: Optional[str] = None
    """Where ``step_<N>/`` checkpoints go (null: ``<run_dir>/checkpoints``); a restart must see the same one."""
    every_n_steps: int = 0
    """Save every this many steps and after the last step (0: only on SIGTERM)."""
    keep_last: Optional[int] = 2
    """Keep the newest this many complete checkpoints (null: all)."""
    resume: str = "auto"
    """``auto`` (the newest complete checkpoint in ``checkpoint.dir``, else a fresh start), ``none``, or the path
    of a ``step_<N>`` directory (any world size and plan: DCP reshards) that is the newest in its directory. The
    run must cut the same batches: data source and row settings, ``data.shuffle`` (and its ``seed``), global batch
    and steps per epoch as in the checkpoint (paths may differ), else it is refused naming the key."""
    async_save: bool = True
    """Stage the state in host memory and write it in a background thread while training continues."""
    save_on_sigterm: bool = True
    """On SIGTERM finish the current step, save, and exit with status 0."""
    verify: str = "full"
    """Before resuming, check the checkpoint against the manifest written with it: ``full`` (every file's size
    and block checksums, read once across all ranks) or ``size`` (sizes only: instant, catches truncation)."""

    def __post_init__(self) -> None:
        _check(self.every_n_steps >= 0, "checkpoint.every_n_steps", "must be >= 0 (0: save only on SIGTERM)")
        _check(
            self.keep_last is None or self.keep_last >= 1,
            "checkpoint.keep_last",
            "must be >= 1, or null to keep every checkpoint",
        )
        _check(bool(self.resume), "checkpoint.resume", "use auto, none, or the path of a step_<N> directory")
        _check(self.verify in ("full", "size"), "checkpoint.verify", f"got {self.verify!r}; use full or size")


@dataclass
class Config:
    """The whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = 0
    """Seed of the model's initialisation and of data shuffling."""
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda``."""
    profile: bool = False
    """Record a ``torch.profiler`` trace (``<run_dir>/profile/trace_rank<r>.pt.trace.json``) with ranges for the
    step's parts."""
    profile_wait_steps: int = 10
    """``profile``: steps before the trace starts (plus one warm-up step)."""
    profile_steps: int = 5
    """``profile``: steps recorded."""

    def __post_init__(self) -> None:
        _check(self.device in ("auto", "cpu", "cuda"), "device", f"got {self.device!r}; use auto, cpu or cuda")
        _check(0 <= self.seed < 2**63, "seed", f"got {self.seed}; use 0 .. 2**63 - 1 (torch.manual_seed's range)")
        _check(self.profile_wait_steps >= 0, "profile_wait_steps", "must be >= 0")
        _check(self.profile_steps > 0, "profile_steps", "must be positive")
        _check(
            self.perf.dcn_residual_dtype == "fp32" or self.model.interaction == "dcn",
            "perf.dcn_residual_dtype",
            f"autocast sets the dtype of the DCN cross layers, and model.interaction={self.model.interaction} "
            f"has none; use perf.dcn_residual_dtype=fp32 or model.interaction=dcn",
        )
        _check(
            self.sharding.data_parallel_max_rows is None or self.perf.embedding_dtype == "fp32",
            "sharding.data_parallel_max_rows",
            f"data_parallel tables are stepped by the dense optimizer in fp32, and perf.embedding_dtype="
            f"{self.perf.embedding_dtype} gives them half-precision weights; set perf.embedding_dtype=fp32 or "
            f"sharding.data_parallel_max_rows=null",
        )
        opt = self.optimizer
        _check(
            self.pipeline.name != "semi_sync" or not (opt.warmup_steps or opt.decay_steps),
            "pipeline.name",
            f"pipeline=semi_sync steps only the dense optimizer, and TorchRec hands a new rate to the tables' TBE in "
            f"the fused optimizer's step, so the tables would keep their base rate through optimizer.warmup_steps="
            f"{opt.warmup_steps} / optimizer.decay_steps={opt.decay_steps}; set both to 0, or use pipeline=sparse_dist",
        )
        if self.offload.name == "uvm_caching":
            _check(
                self.pipeline.name == "prefetch",
                "pipeline.name",
                f"offload=uvm_caching trains with the prefetch pipeline (cache rows of batch i+1 fetched during "
                f"batch i), got pipeline={self.pipeline.name}; add pipeline=prefetch",
            )


def register_configs() -> None:
    """Register the schema as ``base_config`` so ``conf/config.yaml`` composes on top of it."""
    ConfigStore.instance().store(name="base_config", node=Config)


def _section_schema(field_: Any) -> Optional[type]:
    """The schema class of a field that is a nested section (a dataclass default factory), else None."""
    sub = field_.default_factory
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


def _unknown_key(path: str, section: str, names: Any) -> ConfigError:
    return ConfigError(
        f"config key `{path}` is not a known setting; the keys of `{section or 'the top level'}` are: "
        f"{', '.join(sorted(names))}"
    )


def unknown_key_error(path: str) -> Optional[ConfigError]:
    """The error for a dotted ``path`` that names no schema field (listing the keys its section has), or None when
    the field exists (or lies below a field that is not a section, such as ``sharding.constraints``)."""
    schema: Optional[type] = Config
    parts = path.split(".")
    for i, part in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
        if part not in names:
            return _unknown_key(path, ".".join(parts[:i]), names)
        schema = _section_schema(names[part])
        if schema is None:
            return None
    return None


def _reject_unknown_keys(node: Any, schema: Any, prefix: str) -> None:
    """Hydra's ``+key=value`` can add keys that no schema field takes; refuse them rather than drop them."""
    names = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in names:
            raise _unknown_key(path, prefix.rstrip("."), names)
        sub = _section_schema(names[key])
        if sub is not None:
            _reject_unknown_keys(node[key], sub, path + ".")


def to_config(cfg: DictConfig | Any) -> Config:
    """Convert a composed config to :class:`Config`, running every ``__post_init__`` check.

    Raises:
        ConfigError: a value is out of range; the message names the key and the fix.
    """
    if isinstance(cfg, Config):
        return cfg
    _reject_unknown_keys(cfg, Config, "")
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, Config), type(obj)
    _check_finite(obj, "")
    return obj


def _check_finite(obj: Any, prefix: str) -> None:
    """Refuse an infinite or NaN float anywhere in the config (``optimizer.lr=inf`` passes a ``> 0`` check, then
    trains to a non-finite loss or, as ``optimizer.eps=inf``, not at all)."""
    for f in dataclasses.fields(obj):
        v, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            _check_finite(v, key + ".")
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(x, float) and not math.isfinite(x):
                raise ConfigError(f"config key `{key}`: got {x}; give a finite number")


# conf/ sits beside the dlrm package in a checkout and in an editable install (`pip install -e .`); an absolute
# path because Hydra resolves a relative one against the package (pkg://), where conf/ is not.
CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "conf")


def compose(overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides outside a Hydra app (tests, tools).

    Returns the composed ``DictConfig`` (Hydra's own ``hydra`` node removed).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir or CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def error_line(e: BaseException) -> str:
    """``e`` as the one line a command prints after ``error:``: runs of whitespace collapsed (Hydra's messages
    span lines); a Hydra override error whose cause is an OmegaConf one gets that cause's first line, which says
    what is wrong with the value (``Error merging override data.batch_size=abc (Value 'abc' of type 'str' could
    not be converted to Integer)``). A misspelt key is named with the keys its section has: Hydra's advice to
    add it with ``+`` would only meet :func:`unknown_key_error` next."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    misspelt = re.match(r"Could not override '([\w.]+)'", str(e)) if isinstance(e, HydraException) else None
    unknown = unknown_key_error(misspelt.group(1)) if misspelt else None
    if unknown is not None:
        return str(unknown)
    text = " ".join(str(e).split()).split(" Config search path:")[0]  # Hydra appends its search path
    missing = re.search(r"Could not load '(\w+)/([^']+)'", text)  # an unknown entry of a list group (logger=[...])
    if missing and missing.group(1) in GROUPS:
        group = missing.group(1)
        return f"{text} Available options in '{group}': {' '.join(group_options(group))}"
    cause = e.__cause__
    if isinstance(e, HydraException) and isinstance(cause, OmegaConfBaseException) and str(cause).strip():
        text += f" ({str(cause).strip().splitlines()[0].strip()})"
    return text


# ------------------------------------------------------------------------------------ configuration reference
def field_docs(schema: type) -> Dict[str, str]:
    """The docstring beside each field of a schema class (the string literal after its annotation), as one
    line per field; fields without one (the nested sections) are absent."""
    tree = ast.parse(inspect.getsource(schema).strip() + "\n")
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: Dict[str, str] = {}
    for a, b in zip(body, body[1:]):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            out[a.target.id] = " ".join(b.value.value.split())
    return out


def _sections() -> List[tuple]:
    """``(key prefix, schema class)`` for every section of :class:`Config`, in document order."""
    out: List[tuple] = [("", Config)]

    def walk(prefix: str, schema: type) -> None:
        for f in dataclasses.fields(schema):
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            if isinstance(sub, type) and dataclasses.is_dataclass(sub):
                out.append((f"{prefix}{f.name}.", sub))
                walk(f"{prefix}{f.name}.", sub)
                if sub is ShardingConfig:
                    out.append((f"{prefix}{f.name}.constraints.<table>.", TableConstraintConfig))

    walk("", Config)
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        items = [_fmt(v) for v in value]
        shown = items if len(items) <= 6 else items[:4] + [f"... ({len(items)} values)"]
        return "[" + ", ".join(shown) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{...}"
    return str(value)


def _md(text: str) -> str:
    """reST literals (double backquotes) as Markdown code; pipes escaped for a table cell."""
    return text.replace("``", "`").replace("|", "\\|")


def _flat(node: Any, prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, dict) and v and k != "constraints":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _composed(overrides: Sequence[str]) -> Dict[str, Any]:
    node = OmegaConf.to_container(compose(overrides), resolve=False)
    assert isinstance(node, dict)
    node.pop("hydra", None)
    return _flat(node)


def group_options(group: str) -> List[str]:
    """The option names of a config group: its ``conf/<group>/*.yaml`` files."""
    return sorted(n[:-5] for n in os.listdir(os.path.join(CONF_DIR, group)) if n.endswith(".yaml"))


GROUPS = ("model", "data", "optimizer", "sharding", "pipeline", "offload", "perf", "logger", "experiment")
_GROUP_DEFAULT = {
    "model": "dlrm_v2_small",
    "data": "synthetic",
    "optimizer": "adagrad",
    "sharding": "auto",
    "pipeline": "sparse_dist",
    "offload": "none",
    "perf": "fp32",
    "logger": "[stdout, jsonl]",
    "experiment": "none",
}


def _yaml_comment(group: str, option: str) -> str:
    """The first comment paragraph of a group file, as one line."""
    words: List[str] = []
    with open(os.path.join(CONF_DIR, group, f"{option}.yaml"), encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if not s.startswith("#") or s.startswith("# @package"):
                if words or not s.startswith("# @package"):
                    break
                continue
            text = s.lstrip("#").strip()
            if not text:
                break
            words.append(text)
    return " ".join(words)


def configuration_markdown() -> str:
    """``docs/configuration.md``: every config key with its default (what ``python train.py`` composes), the
    values the shipped group options give it, and its docstring from this module."""
    default = _composed([])
    by_option: Dict[str, List[str]] = {}
    for group in GROUPS:
        if group == "experiment":
            continue
        for option in group_options(group):
            base = ["logger=[]"] if group == "logger" else []
            ref = _composed(base) if base else default
            over = _composed([f"logger=[{option}]"] if group == "logger" else [f"{group}={option}"])
            for key, value in over.items():
                if key.startswith(f"{group}.") and value != ref.get(key):
                    by_option.setdefault(key, []).append(
                        f"`{group}={option}`: `{_fmt(value)}`"
                        if group != "logger"
                        else f"`logger=[{option}]`: `{_fmt(value)}`"
                    )
    lines = [
        "# Configuration reference",
        "",
        "Every key of the trainer's config, with its default (what `python train.py` composes) and the values the",
        "shipped config groups give it. Generated from the schema in `dlrm/config.py` (the docstring beside each",
        "field) and the files in `conf/` by `python -m dlrm.config --markdown docs/configuration.md`; a test fails",
        "when this file is out of date. Set any key on the command line (`data.batch_size=1024`), pick a group",
        "option (`perf=fast`), add a per-table constraint with `+` (`+sharding.constraints.t_cat_0.sharding_types=",
        "[row_wise]`), and print the composed config with `python train.py --cfg job`. Hydra's own keys",
        "(`hydra.run.dir`, the run directory) are Hydra's.",
        "",
        "## Config groups",
        "",
        "| option | what it is |",
        "| --- | --- |",
    ]
    for group in GROUPS:
        d = _GROUP_DEFAULT[group]
        for o in group_options(group):
            default_mark = " (default)" if o == d or o in d.strip("[]").split(", ") else ""
            option = f"`logger=[{o}]`" if group == "logger" else f"`{group}={o}`"
            lines.append(f"| {option}{default_mark} | {_md(_yaml_comment(group, o))} |")
    for prefix, schema in _sections():
        docs = field_docs(schema)
        title = prefix.rstrip(".") or "top level"
        lines += [
            "",
            f"## `{title}`" if prefix else "## Top-level keys",
            "",
            _md(" ".join((inspect.getdoc(schema) or "").split())),
            "",
            "| key | default | set by | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for f in dataclasses.fields(schema):
            if f.name not in docs:
                continue
            key = f"{prefix}{f.name}"
            value = default.get(key) if "<table>" not in prefix else None
            setby = "; ".join(by_option.get(key, []))
            lines.append(f"| `{key}` | `{_fmt(value)}` | {setby} | {_md(docs[f.name])} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m dlrm.config", description="The trainer's configuration reference.")
    p.add_argument(
        "--markdown",
        metavar="PATH",
        required=True,
        help="write the configuration reference (docs/configuration.md) to PATH; - for stdout",
    )
    args = p.parse_args(argv)
    text = configuration_markdown()
    if args.markdown == "-":
        print(text, end="")
    else:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
