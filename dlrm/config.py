"""Typed configuration schemas for the trainer.

Hydra composes ``conf/config.yaml`` over the structured schema registered here as ``base_config``, so every
YAML file in ``conf/`` is type-checked (an unknown key or a wrong type fails at compose time, naming the key).
:func:`to_config` then turns the composed ``DictConfig`` into these dataclasses, whose ``__post_init__``
validates values and names the config key and the fix in its error.

Compose and validate without training::

    python train.py --cfg job            # print the composed config
    python -c "from dlrm.config import compose; print(compose(['model=dlrm_v2']))"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

# MLPerf Training DLRM-v2 (recommendation_v2/torchrec_dlrm README): per-feature cardinalities of the 26 tables.
MLPERF_NUM_EMBEDDINGS: List[int] = [
    40000000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40000000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40000000,
    40000000,
    40000000,
    590152,
    12973,
    108,
    36,
]
# MLPerf Training DLRM-v2: ids per sample per feature (214 in all) of the synthetic multi-hot dataset.
MLPERF_MULTI_HOT_SIZES: List[int] = [
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
]
NUM_DENSE_FEATURES = 13  # Criteo: I1..I13
NUM_SPARSE_FEATURES = 26  # Criteo: C1..C26


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and the fix."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key `{key}`: {msg}")


@dataclass
class ModelConfig:
    """The network. ``interaction=dcn`` is DLRM-v2 (torchrec ``DLRM_DCN``); ``dot`` is the original DLRM.

    Fields:
        name: label of the preset (``dlrm_v2``, ``dlrm_v2_small``, ``dlrm``); informational.
        interaction: ``dcn`` (DCNv2 low-rank cross layers) or ``dot`` (pairwise dot products).
        embedding_dim: width of every table (MLPerf: 128). Must be a multiple of 4 for FBGEMM fused kernels.
        num_embeddings_per_feature: rows per table, one per sparse feature C1..C26 (MLPerf cardinalities).
        row_cap: optional upper bound on rows per table (``min(rows, row_cap)``), e.g. to fit a laptop.
        multi_hot_sizes: ids per sample per feature after multi-hot expansion (MLPerf: 214 in all).
        dense_arch_layer_sizes: bottom MLP; its last size must equal ``embedding_dim``.
        over_arch_layer_sizes: top MLP; its last size must be 1 (one logit).
        dcn_num_layers / dcn_low_rank_dim: DCNv2 cross layers and their low rank (MLPerf: 3 and 512).
    """

    name: str = "dlrm_v2_small"
    interaction: str = "dcn"
    embedding_dim: int = 16
    num_embeddings_per_feature: List[int] = field(default_factory=lambda: list(MLPERF_NUM_EMBEDDINGS))
    row_cap: Optional[int] = 2000
    multi_hot_sizes: List[int] = field(default_factory=lambda: list(MLPERF_MULTI_HOT_SIZES))
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 16])
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 1])
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 32

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
    """Where samples come from and how they are batched.

    Fields:
        name: ``synthetic`` (teacher-labelled MLPerf-shaped data, generated in memory), ``criteo_tsv`` or
            ``criteo_binary`` (a directory written by ``data/preprocess_criteo.py``, memory-mapped).
        batch_size: samples per rank per step (global batch = batch_size x world size).
        global_batch_size: if set, overrides ``batch_size`` with ``global_batch_size / world size`` per rank, so
            the same command does the same math on any world size (must divide evenly).
        multi_hot: expand each 1-hot id into its table's ``model.multi_hot_sizes`` ids the MLPerf way;
            false keeps one id per feature.
        multi_hot_seed: numpy legacy seed of the expansion tables (MLPerf reference: 0).
        train_path / val_path: Criteo TSV files (``label, I1..I13, C1..C26``); required for ``criteo_tsv``.
        test_path: optional TSV scored once at the end (MLPerf: the second half of day 23).
        val_fraction: without ``val_path``, the last fraction of the training rows validates.
        max_rows: read at most this many rows of ``train_path`` (null: all).
        num_train_samples / num_val_samples / num_test_samples: sizes of the synthetic splits (test 0: none).
        teacher_seed: seed of the hidden teacher model that labels synthetic samples.
        teacher_dim: width of the teacher's latent factors.
        shuffle: reshuffle training rows each epoch (MLPerf: no shuffling).
        dataset_dir: ``criteo_binary``: the preprocessed dataset (``meta.json`` and ``day_*.npy``); splits follow
            MLPerf (train = all days but the last; validation / test = first / second half of the last day).
        multi_hot_source: ``criteo_binary`` with ``multi_hot``: ``materialized`` (``day_*_sparse_multi_hot.npy``),
            ``on_the_fly`` (gather from the expansion tables per batch) or ``auto`` (materialized when present).
        prefetch: ``criteo_binary``: batches a background thread keeps ready (0: none).
        pin_memory: ``criteo_binary``: assemble batches in pinned host memory (null: when CUDA is available).
    """

    name: str = "synthetic"
    batch_size: int = 256
    global_batch_size: Optional[int] = None
    multi_hot: bool = True
    multi_hot_seed: int = 0
    train_path: Optional[str] = None
    val_path: Optional[str] = None
    test_path: Optional[str] = None
    val_fraction: float = 0.2
    max_rows: Optional[int] = None
    num_train_samples: int = 131072
    num_val_samples: int = 16384
    num_test_samples: int = 0
    teacher_seed: int = 1234
    teacher_dim: int = 8
    shuffle: bool = False
    dataset_dir: Optional[str] = None
    multi_hot_source: str = "auto"
    prefetch: int = 2
    pin_memory: Optional[bool] = None

    def __post_init__(self) -> None:
        _check(
            self.name in ("synthetic", "criteo_tsv", "criteo_binary"),
            "data.name",
            f"got {self.name!r}; choose data=synthetic, data=criteo_tsv or data=criteo_binary",
        )
        _check(self.batch_size > 0, "data.batch_size", "must be positive")
        _check(
            self.global_batch_size is None or self.global_batch_size > 0,
            "data.global_batch_size",
            "must be positive or null",
        )
        _check(0.0 < self.val_fraction < 1.0, "data.val_fraction", "must be in (0, 1)")
        if self.name == "criteo_tsv":
            _check(
                bool(self.train_path),
                "data.train_path",
                "data=criteo_tsv needs a training TSV: pass data.train_path=<file.tsv>",
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
        _check(self.max_rows is None or self.max_rows > 0, "data.max_rows", "must be positive or null")
        _check(
            self.multi_hot_source in ("auto", "materialized", "on_the_fly"),
            "data.multi_hot_source",
            f"got {self.multi_hot_source!r}; use auto, materialized or on_the_fly",
        )
        _check(self.prefetch >= 0, "data.prefetch", "must be >= 0 (0: no background thread)")
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
    """Adagrad for both sides, as MLPerf's compliance rules fix it (lr_decay 0, weight_decay 0, eps 1e-8).

    Fields:
        lr: learning rate of the dense (MLP) parameters.
        sparse_lr: learning rate of the embedding tables (null: same as ``lr``).
        eps: Adagrad epsilon for both (MLPerf Training rules: 1e-8; PyTorch's default 1e-10 is not used).
        sparse_type: ``adagrad`` (element-wise, FBGEMM EXACT_ADAGRAD, the MLPerf rule) or ``rowwise_adagrad``
            (one accumulator per row, EXACT_ROWWISE_ADAGRAD, 1/dim of the optimizer memory).

        warmup_steps: linear warmup over this many steps: step s (0-based) uses ``lr * (s + 1) / warmup_steps``,
            so warmup 4 gives 0.25, 0.5, 0.75, 1.0 x lr and no plateau below lr.
        decay_start_step / decay_steps: from ``decay_start_step`` for ``decay_steps`` steps the rate decays
            polynomially, ``lr * ((end - s) / decay_steps) ** decay_power`` with ``end = start + steps``, never
            below ``end_lr``; from ``end`` on it stays at ``end_lr`` (it does not climb again). 0 steps: no decay.
        decay_power: exponent of the decay (MLPerf reference: 2).
        end_lr: the floor of the decay (MLPerf reference: 1e-7).

    The schedule is the MLPerf reference's (warmup, constant, polynomial decay); the MLPerf closed division
    runs it with warmup = decay start = decay steps = 0, i.e. a constant rate. Both Adagrads start their
    accumulators at 0 (MLPerf rule; FBGEMM's TBE has no other option).
    """

    lr: float = 0.01
    sparse_lr: Optional[float] = None
    eps: float = 1e-8
    sparse_type: str = "adagrad"
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0
    end_lr: float = 1e-7

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optimizer.lr", "must be positive")
        _check(self.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
        _check(self.decay_steps >= 0, "optimizer.decay_steps", "must be >= 0")
        _check(self.decay_start_step >= 0, "optimizer.decay_start_step", "must be >= 0")
        if self.decay_steps:
            _check(
                self.decay_start_step >= self.warmup_steps,
                "optimizer.decay_start_step",
                f"{self.decay_start_step} falls inside the warmup ({self.warmup_steps} steps); start the decay "
                "at or after optimizer.warmup_steps",
            )
        _check(0 <= self.end_lr <= self.lr, "optimizer.end_lr", "must be in [0, optimizer.lr]")
        _check(self.sparse_lr is None or self.sparse_lr > 0, "optimizer.sparse_lr", "must be positive or null")
        _check(self.eps > 0, "optimizer.eps", "must be positive")
        _check(
            self.sparse_type in ("adagrad", "rowwise_adagrad"),
            "optimizer.sparse_type",
            f"got {self.sparse_type!r}; use adagrad or rowwise_adagrad",
        )

    @property
    def embedding_lr(self) -> float:
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
    """Per-table planner constraints (TorchRec ``ParameterConstraints``), ``sharding.constraints.<table>.*``.

    Fields (null: the table follows the preset / the planner):
        sharding_types: sharding types the planner may pick for this table.
        compute_kernels: compute kernels the planner may pick (``fused``: weights in HBM on GPU, host memory on
            CPU; ``fused_uvm``: weights in host memory via UVM; ``fused_uvm_caching``: host memory with an HBM
            cache; ``dense``: data_parallel only).
        min_partition: column shard width for column_wise / table_column_wise / grid_shard, in columns; must be a
            multiple of 4 that divides ``model.embedding_dim``.
        pooling_factors: mean ids per sample of the table's feature (default: its ``model.multi_hot_sizes``
            entry with ``data.multi_hot``, else 1); the planner's cost model only.
        num_poolings / batch_sizes: TorchRec's per-feature pooling count and batch size hints (rarely needed).
    """

    sharding_types: Optional[List[str]] = None
    compute_kernels: Optional[List[str]] = None
    min_partition: Optional[int] = None
    pooling_factors: Optional[List[float]] = None
    num_poolings: Optional[List[float]] = None
    batch_sizes: Optional[List[int]] = None

    def validate(self, prefix: str) -> None:
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


@dataclass
class ShardingConfig:
    """How the TorchRec planner places embedding tables (``dlrm/sharding.py``; docs/sharding.md).

    Fields:
        name: the preset: ``auto`` lets the planner choose among every sharding type the backend supports;
            ``table_wise``, ``row_wise``, ``column_wise``, ``table_row_wise``, ``data_parallel``,
            ``grid_shard`` force that type on every table (per-table ``constraints`` still override).
        sharding_types: the sharding types of the preset (null: all); set by the ``conf/sharding`` files.
        compute_kernel: kernel of every table (null: the planner chooses; ``dense`` only with data_parallel).
        min_partition: column shard width for every column-split table (null: TorchRec's 128, capped at the dim).
        constraints: per-table overrides keyed by table name (``t_cat_0`` .. ``t_cat_25``), see
            :class:`TableConstraintConfig`; add one with ``+sharding.constraints.t_cat_0.sharding_types=[row_wise]``.
        storage_reservation: fraction of device memory the planner keeps free for activations (TorchRec
            ``HeuristicalStorageReservation``; the MLPerf reference uses 0.05).
        hbm_cap_gb: device memory per rank the planner may use, in GiB (null: the device's real capacity on
            CUDA; required when planning for CUDA on a machine without one).
        ddr_cap_gb: host memory per rank, in GiB (null: this host's RAM / local world size).
        plan_path: a ``plan.json`` written by an earlier run or by ``python -m dlrm.plan``; it is used exactly
            (no planning) after checking it matches the model, world size and device.
        data_parallel_max_rows: tables with at most this many rows (after ``model.row_cap``) are data_parallel:
            replicated on every rank, their pooled embeddings never enter the output dist's all-to-all, and their
            gradients are all-reduced with the dense ones (the hybrid placement of NVIDIA HugeCTR's MLPerf DLRM,
            which keeps its frequent embeddings data-parallel). A table's own ``constraints`` entry with
            ``sharding_types`` wins. Such tables need fp32 weights (``perf.embedding_dtype``). null: off.
    """

    name: str = "auto"
    sharding_types: Optional[List[str]] = None
    compute_kernel: Optional[str] = None
    min_partition: Optional[int] = None
    # Typed per entry in __post_init__: OmegaConf cannot add keys to a Dict[str, <dataclass>] from the command line.
    constraints: Dict[str, Any] = field(default_factory=dict)
    storage_reservation: float = 0.05
    hbm_cap_gb: Optional[float] = None
    ddr_cap_gb: Optional[float] = None
    plan_path: Optional[str] = None
    data_parallel_max_rows: Optional[int] = None

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
                c = self.constraints[table] = TableConstraintConfig(**c)
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
    """The training loop driver (``dlrm/pipeline.py`` builds it).

    Fields:
        name: ``sparse_dist`` (TorchRec ``TrainPipelineSparseDist``: batch i+1's host-to-device copy and KJT
            input dist overlap batch i), ``fused_sparse_dist`` (``TrainPipelineFusedSparseDist``: also starts batch
            i+1's embedding lookup and output dist while batch i's dense optimizer steps; same numerics; needs
            CUDA), ``semi_sync`` (``TrainPipelineSemiSync``: batch i+1's lookup and output-dist all-to-all run
            beside batch i's dense backward; each lookup reads the tables one update stale; needs CUDA),
            ``prefetch`` (``PrefetchTrainPipelineSparseDist``: also prefetches batch i+1's rows into the
            ``fused_uvm_caching`` HBM cache on its own stream; needs CUDA) or ``base`` (``TrainPipelineBase``: no
            overlap, for debugging).
        input_dist_group: ``shared`` sends the input dist's all-to-alls on the default process group;
            ``dedicated`` on one extra group over the same ranks created at start-up (its own NCCL communicator and
            stream, so the next batch's keys do not queue behind this step's output dist, backward all-to-all and
            DDP all-reduce; ``dlrm/comms.py``).
        input_dist_max_ctas: with ``input_dist_group=dedicated``, the most CUDA thread blocks (SMs) NCCL may use
            for that group's all-to-alls (NCCL ``ncclConfig_t.maxCTAs``); null: NCCL's choice. The input dist
            moves little data (the ids: 4-8 bytes each), and its kernels run beside the step's compute and
            collectives, where every thread block they hold is one SM less for those. NCCL only.
        semi_sync_start_batch: with ``semi_sync``, the batch (counted from the pipeline's start, 0-based) from
            which lookups run ahead; the batches before it train synchronously, each ending with a device
            synchronize (TorchRec's ``start_batch``; TorchRec's default is 900, to let early training settle).
    """

    name: str = "sparse_dist"
    input_dist_group: str = "shared"
    input_dist_max_ctas: Optional[int] = None
    semi_sync_start_batch: int = 0

    def __post_init__(self) -> None:
        _check(
            self.name in ("sparse_dist", "fused_sparse_dist", "semi_sync", "prefetch", "base"),
            "pipeline.name",
            f"got {self.name!r}; use sparse_dist, fused_sparse_dist (CUDA), semi_sync (CUDA), prefetch (uvm "
            "caching, CUDA) or base (plain loop, no overlap, for debugging)",
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
        _check(
            self.input_dist_max_ctas is None or self.input_dist_max_ctas >= 1,
            "pipeline.input_dist_max_ctas",
            f"got {self.input_dist_max_ctas}; use a count of thread blocks >= 1, or null for NCCL's choice",
        )
        _check(
            self.input_dist_max_ctas is None or self.input_dist_group == "dedicated",
            "pipeline.input_dist_max_ctas",
            "sets the dedicated input-dist group's NCCL communicator (CUDA runs only) and has no effect while "
            "pipeline.input_dist_group=shared; add pipeline.input_dist_group=dedicated, or drop it on CPU",
        )


@dataclass
class PerfConfig:
    """Speed levers (issue 9; ``conf/perf/*.yaml``). ``perf=fp32`` (default) keeps the reference numerics;
    ``perf=fast`` turns on the levers measured in ``bench/throughput.py`` / docs/benchmarks.md.

    Fields:
        name: label of the preset (logged; ``fp32``, ``fast`` or your own).
        embedding_dtype: TBE weight precision of the tables: ``fp32``, ``fp16`` or ``bf16`` (the tables'
            ``EmbeddingBagConfig.data_type``; the planner counts 2 bytes per element). FBGEMM keeps the Adagrad
            state in fp32 and rounds fp16/bf16 updates stochastically. Fused kernels only: ``sharding=auto`` keeps
            such tables off data_parallel, and a table forced data_parallel is refused at plan time when this is
            not fp32 (a dense optimizer would step fp16 weights).
        embedding_output_dtype: dtype of the pooled embeddings (TBE ``output_dtype`` fused param), and so of the
            output dist's all-to-all and the gradients sent back: ``fp32``, ``fp16`` or ``bf16``.
        allreduce_dtype: precision of the DDP all-reduce of the dense gradients (and of data_parallel tables):
            ``fp32`` (default, exact), ``bf16`` or ``fp16`` (TorchRec's ``DefaultDataParallelWrapper``
            ``allreduce_comm_precision``: PyTorch's ``bf16_compress_hook`` / ``fp16_compress_hook`` cast each
            gradient bucket, divided by the world size, to 16 bits, all-reduce it, and copy the sum back into the
            fp32 gradient). Halves the all-reduce bytes; no effect on one rank (no hook is registered there).
            bf16 needs CUDA and NCCL (refused on CPU); fp16 also runs on gloo.
        allreduce_group: ``shared`` (default: DDP all-reduces on the default process group, the one the sharded
            modules' all-to-alls use) or ``dedicated`` (one extra process group over the same ranks, created at
            start-up: its own NCCL communicator and stream, so the backward all-to-all of the pooled embeddings and
            the TBE backward do not wait behind the all-reduce; ``dlrm/comms.py``). Same numerics. No effect on one
            rank. Not faster with ``perf=fast`` on 2x H200 (docs/benchmarks.md).
        allreduce_max_ctas: with ``allreduce_group=dedicated``, the most CUDA thread blocks (SMs) NCCL may use for
            that group's all-reduce (NCCL ``ncclConfig_t.maxCTAs``); null: NCCL's choice. Fewer leave more SMs to
            the backward all-to-all and the TBE backward running beside it; the all-reduce then takes longer.
            NCCL only (refused on CPU).
        tbe_bounds_check: FBGEMM's per-batch check of every id against its table's rows, a kernel of its own in
            each lookup (``BoundsCheckMode``): ``warning`` (FBGEMM's default: an out-of-range id is looked up as
            row 0 and a warning logged), ``fatal`` (the step fails) or ``none`` (no check: 0.2 ms less per step
            at batch 32768 on an H200, docs/benchmarks.md). ``none`` relies on the ids being in range, which every
            loader here guarantees before a batch is built: TSV categories are hashed modulo the table's rows,
            binary days are range-checked on load, synthetic ids are drawn below the rows. Feed your own KJTs
            with ``none`` only if they hold the same guarantee: an out-of-range id then reads or updates memory
            outside the table.
        autocast: ``none``, ``bf16`` or ``fp16``: run the dense arch, the interaction (DCN) and the over arch
            under ``torch.autocast`` (weights stay fp32; the loss is computed in fp32 from fp32 logits).
        dcn_residual_dtype: dtype of the DCN's residual stream under ``autocast`` (each cross layer's
            ``x_{l+1} = x_0 * (W (V x_l) + b) + x_l`` and its gradient, ``[B, 27 * 128]`` for MLPerf): ``fp32``
            (TorchRec's ``LowRankCrossNet``: its fp32 bias promotes every layer's output, and so the elementwise
            work and memory traffic of the cross layers forward and backward, to fp32) or ``autocast`` (the bias
            and ``x_0`` are cast to the products' dtype, so the stream stays in the autocast dtype:
            :class:`dlrm.model.AutocastLowRankCrossNet`; parameters stay fp32 and keep their names). ``autocast``
            needs ``perf.autocast`` on and ``model.interaction=dcn`` (refused otherwise). Without autocast both
            compute the same values bit for bit. ``perf=fast`` uses ``autocast``: on H200 at batch 32768 it saved
            0.52 ms per step on one GPU with the step split at DDP's buckets, and with one graph 0.12 ms on one GPU
            and 0.26 ms on two; validation AUC within 0.002 of fp32 over 3 seeds on the synthetic and Kaggle data
            (docs/benchmarks.md, seventh session).
        tf32: allow TF32 matrix products for fp32 work on CUDA (``torch.backends.cuda.matmul.allow_tf32``;
            MLPerf reference: on). Ignored on CPU.
        compile: ``torch.compile`` the dense arch, the interaction, the over arch and the loss as one graph (split
            at DDP's gradient buckets unless ``compile_ddp_split`` is false)
            (``dlrm.model.compile_dense``; the modules are not wrapped, so parameter names and checkpoints are
            unchanged). The first steps and every new batch size compile (tens of seconds).
        coordinate_descent_tuning: with ``compile``, Inductor's ``coordinate_descent_tuning`` (a process-wide
            Inductor setting): the block sizes of the generated triton kernels are tuned while compiling, which
            makes the first steps slower. No consistent gain on 2x H200 (seventh session: 13.83 and 13.95 against
            13.90-14.13 ms/step).
        compile_mode: ``torch.compile`` mode: ``default`` or ``max-autotune-no-cudagraphs`` (Inductor benchmarks
            triton matrix-product templates against cuBLAS while compiling: on one H200 the first steps took about
            4.5 min, with many "No valid triton configs" errors logged, for 11.77 against 11.99 ms/step; not in
            ``perf=fast``). The CUDA-graph
            modes (``reduce-overhead``, ``max-autotune``) are refused: at batch 32768 on H200 they were not faster
            (fifth session: 13.07 against 12.95 ms/step on one GPU, 15.06 against 15.04 on two; seventh, with one
            graph: 13.91 against 13.90 on two), and the trainer's
            run with them, which failed at validation before the step's outputs were copied out of the graphs'
            reused buffers ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"),
            has not been re-tested since (docs/benchmarks.md).
        compile_ddp_split: with ``compile``, let dynamo's DDPOptimizer split the compiled dense step at DDP's
            gradient buckets (``torch._dynamo.config.optimize_ddp``, a process-wide dynamo setting; true is
            PyTorch's default), so each bucket's all-reduce can start while the rest of the dense backward runs.
            false: one graph, forward and backward, and the all-reduces start after the whole dense backward
            (Inductor fuses across the bucket boundaries, and there are fewer graph calls per step). On H200 at
            batch 32768, false was 0.55 ms per step faster on two GPUs and 0.65 ms on one (seventh session,
            docs/benchmarks.md); ``perf=fast`` sets false.
        ddp_bucket_cap_mb: DDP's gradient bucket size in MiB (TorchRec ``DefaultDataParallelWrapper``
            ``bucket_cap_mb``; 25 is TorchRec's and PyTorch's default). Larger buckets mean fewer, larger
            all-reduces (and, with ``compile_ddp_split``, fewer graph pieces). The MLPerf DLRM-v2 dense side holds
            about 61 MiB of fp32 gradients (16 M parameters). Same numerics. On 2x H200: 100 MiB was 0.1 ms per
            step faster than 25 with one graph (seventh session). The sixth session's figures timed DDP's reducer
            only, with the compiled step still split at 25 MiB: 100 MiB within each host's spread, 8 MiB 1.0-1.2
            ms slower on one noisy host (docs/benchmarks.md). ``perf=fast`` sets 100.
        lean_output_dist: send the pooled embeddings of table_wise and column_wise tables (table_row_wise and
            grid_shard: their all-to-all across hosts; row_wise uses a reduce-scatter, untouched) in the output
            dist's all-to-all, forward and backward, without TorchRec's extra passes over them
            (``dlrm/output_dist.py``): no staging copy before each forward all-to-all. When every table is
            table_wise, the pooled embeddings are handed over as received: the sparse arch gathers the features from
            the rank blocks inside the compiled dense step, whose backward writes the gradient straight in the send
            layout, divided by the world size (no ``cat`` forward, no regrouping pass backward). Other plans
            regroup and divide the gradient in one pass instead of four. Same collectives, same values bit for bit
            (CPU tests against TorchRec's). On 2x H200 with the rest of ``perf=fast``: 0.23-0.34 ms per step faster
            with the regrouping pass, 0.56-0.62 ms with the rank blocks (ninth session, docs/benchmarks.md);
            ``perf=fast`` sets true. No effect on one rank.
        allreduce_after_output_dist: with ``lean_output_dist``, hold DDP's all-reduce of the dense gradients
            until the backward all-to-alls of the pooled embeddings are issued, so that it runs beside the TBE
            backward instead of ahead of the all-to-all on the shared communicator
            (:class:`dlrm.comms.AllReduceAfterOutputDist`). Same gradients bit for bit. 0.16-0.17 ms per step
            faster on 2x H200 (ninth session); ``perf=fast`` sets true. Needs ``allreduce_dtype=fp32`` and
            ``allreduce_group=shared``. No effect on one rank.
    """

    name: str = "fp32"
    embedding_dtype: str = "fp32"
    embedding_output_dtype: str = "fp32"
    allreduce_dtype: str = "fp32"
    allreduce_group: str = "shared"
    allreduce_max_ctas: Optional[int] = None
    tbe_bounds_check: str = "warning"
    autocast: str = "none"
    dcn_residual_dtype: str = "fp32"
    tf32: bool = True
    compile: bool = False
    compile_mode: str = "default"
    coordinate_descent_tuning: bool = False
    compile_ddp_split: bool = True
    ddp_bucket_cap_mb: int = 25
    lean_output_dist: bool = False
    allreduce_after_output_dist: bool = False

    def __post_init__(self) -> None:
        for key in ("embedding_dtype", "embedding_output_dtype", "allreduce_dtype"):
            v = getattr(self, key)
            _check(v in ("fp32", "fp16", "bf16"), f"perf.{key}", f"got {v!r}; use fp32, fp16 or bf16")
        _check(
            self.allreduce_group in ("shared", "dedicated"),
            "perf.allreduce_group",
            f"got {self.allreduce_group!r}; use shared or dedicated",
        )
        _check(
            self.allreduce_max_ctas is None or self.allreduce_max_ctas >= 1,
            "perf.allreduce_max_ctas",
            f"got {self.allreduce_max_ctas}; use a count of thread blocks >= 1, or null for NCCL's choice",
        )
        _check(
            self.allreduce_max_ctas is None or self.allreduce_group == "dedicated",
            "perf.allreduce_max_ctas",
            "sets the dedicated all-reduce group's NCCL communicator (CUDA runs only) and has no effect "
            "while perf.allreduce_group=shared; add perf.allreduce_group=dedicated, or drop it on CPU",
        )
        if self.allreduce_after_output_dist:
            _check(
                self.lean_output_dist,
                "perf.allreduce_after_output_dist",
                "holds DDP's all-reduce until the lean output dists' backward all-to-alls are issued; add "
                "perf.lean_output_dist=true, or set perf.allreduce_after_output_dist=false",
            )
            _check(
                self.allreduce_dtype == "fp32" and self.allreduce_group == "shared",
                "perf.allreduce_after_output_dist",
                "issues DDP's fp32 all-reduce (PyTorch's default hook) on the shared group; with "
                f"perf.allreduce_dtype={self.allreduce_dtype} and perf.allreduce_group={self.allreduce_group} set "
                "perf.allreduce_after_output_dist=false (or use fp32 and shared)",
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
            f"{self.compile_mode} captures CUDA graphs: not faster on H200, and the trainer's validation with "
            f"them is not re-tested since it failed (docs/benchmarks.md); use default or "
            f"max-autotune-no-cudagraphs",
        )
        modes = ("default", "max-autotune-no-cudagraphs")
        _check(self.compile_mode in modes, "perf.compile_mode", f"got {self.compile_mode!r}; use one of {modes}")
        _check(
            self.compile or self.compile_mode == "default",
            "perf.compile_mode",
            f"{self.compile_mode} has no effect while perf.compile=false; add perf.compile=true",
        )
        _check(
            self.compile or not self.coordinate_descent_tuning,
            "perf.coordinate_descent_tuning",
            "tunes compiled kernels and has no effect while perf.compile=false; add perf.compile=true",
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
    """Embedding tables in host memory (``dlrm/offload.py``), through planner constraints on the compute kernel.

    Fields:
        name: ``none`` (the planner decides; tables in HBM when they fit), ``uvm`` (``fused_uvm``: the table in
            host memory, read over the bus by the TBE kernels) or ``uvm_caching`` (``fused_uvm_caching``: the table
            in host memory plus an HBM cache of ``cache_load_factor`` x its rows; needs ``pipeline=prefetch`` so
            batch i+1's rows are fetched into the cache on their own stream during batch i). Both need CUDA to train.
        min_table_rows: offload only tables with at least this many rows (0: every table).
        min_table_mb: offload only tables whose fp32 weights take at least this many MiB (0: no byte threshold);
            a table must pass both thresholds.
        cache_load_factor: HBM cache size as a fraction of the table's rows (FBGEMM ``cache_load_factor``;
            ``uvm_caching`` only).
        cache_algorithm: ``lru`` or ``lfu`` (FBGEMM ``CacheAlgorithm``; ``uvm_caching`` only).
    """

    name: str = "none"
    min_table_rows: int = 0
    min_table_mb: float = 0.0
    cache_load_factor: float = 0.2
    cache_algorithm: str = "lru"

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
    """One dense line per logged step and per validation on rank 0.

    Fields:
        enabled: print lines.
        progress_bar: null (auto) shows a tqdm bar with ETA when stdout is a terminal, plain lines otherwise;
            true / false force it.
    """

    enabled: bool = False
    progress_bar: Optional[bool] = None


@dataclass
class TensorBoardSink:
    """TensorBoard event files under ``<run_dir>/<dir>`` (``tensorboard --logdir <run_dir>``)."""

    enabled: bool = False
    dir: str = "tensorboard"


@dataclass
class WandbSink:
    """Weights & Biases. ``mode``: ``online``, ``offline`` (no network; ``wandb sync`` later) or null (the
    ``WANDB_MODE`` environment variable, else online). Files go under ``<run_dir>/wandb``."""

    enabled: bool = False
    project: str = "dlrm-v2"
    entity: Optional[str] = None
    name: Optional[str] = None
    mode: Optional[str] = None

    def __post_init__(self) -> None:
        _check(
            self.mode in (None, "online", "offline", "disabled"),
            "logger.wandb.mode",
            f"got {self.mode!r}; use online, offline, disabled or null",
        )


@dataclass
class MlperfSink:
    """MLPerf ``mllog`` lines (``mlperf-logging`` package) for ``dlrm_dcnv2`` in ``<run_dir>/<file>``."""

    enabled: bool = False
    file: str = "mlperf.log"
    submission_org: str = "reference"
    submission_platform: str = "unknown"
    submission_division: str = "open"
    submission_status: str = "research"

    def __post_init__(self) -> None:
        _check(
            self.submission_division in ("open", "closed"), "logger.mlperf.submission_division", "use open or closed"
        )


@dataclass
class LoggerConfig:
    """Where metrics go. ``metrics.jsonl`` (one JSON object per logged step and per evaluation) and
    ``config.yaml`` are always written to the run directory by rank 0; every sink runs on rank 0 only.

    Pick sinks as a list: ``logger=[stdout,tensorboard,wandb]`` (each file in ``conf/logger/`` turns one on).

    Fields:
        log_every_n_steps: one record per this many steps (and the last step).
        train_auc: compute a windowed training AUC over each logging window (histogram method).
    """

    log_every_n_steps: int = 20
    train_auc: bool = True
    stdout: StdoutSink = field(default_factory=StdoutSink)
    tensorboard: TensorBoardSink = field(default_factory=TensorBoardSink)
    wandb: WandbSink = field(default_factory=WandbSink)
    mlperf: MlperfSink = field(default_factory=MlperfSink)

    def __post_init__(self) -> None:
        _check(self.log_every_n_steps > 0, "logger.log_every_n_steps", "must be positive")


@dataclass
class TrainerConfig:
    """Fields:
    epochs: passes over the training split.
    max_steps: stop after this many optimizer steps (null: run all epochs).
    on_nonfinite: a NaN or inf training loss ``stop``s the run (the default) with the step, the batch's
        position in its file and the last finite metrics. ``skip_batch`` also drops, without stopping, batches
        whose inputs (dense features, labels) are not finite: their loss is multiplied by 0 on the device, so
        they leave weights and optimizer state unchanged; a non-finite loss from finite inputs (divergence)
        still stops the run, since the update has already been applied by the fused optimizer.
    """

    epochs: int = 1
    max_steps: Optional[int] = None
    on_nonfinite: str = "stop"

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
    """Fields:
    every_n_steps: validate every this many steps (null: see ``per_epoch``).
    per_epoch: validate this many times per epoch, every ``floor(steps_per_epoch / per_epoch)`` steps (MLPerf:
        20, i.e. every floor(train samples / (global batch x 20)) steps). Exclusive with ``every_n_steps``.
    at_end: validate after the last step; the test split (if any) is scored once, at the end.
    batch_size: per-rank evaluation batch (null: ``data.batch_size``).
    target_auc: stop training once validation AUC reaches this (MLPerf: 0.80275); null: never.
    auc_method: ``exact`` gathers all predictions to every rank (equals sklearn; memory O(rows));
        ``histogram`` counts predictions per float32 bucket of relative width 2^-13 and all-reduces 16 MB of
        counts (error <= 1e-4 against sklearn, tested; bounded memory for MLPerf's 89 M rows); ``auto``: exact
        up to 16 M evaluation rows, histogram above.
    """

    every_n_steps: Optional[int] = None
    per_epoch: Optional[int] = None
    at_end: bool = True
    batch_size: Optional[int] = None
    target_auc: Optional[float] = None
    auc_method: str = "auto"

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
    """Sharded checkpoints (``torch.distributed.checkpoint``), exact resume and preemption (``dlrm/checkpoint.py``).

    Fields:
        dir: where ``step_<N>/`` checkpoints go (null: ``<run_dir>/checkpoints``). A restart must see the same
            directory to resume: fix ``hydra.run.dir`` or set this key (Hydra's default run dir is timestamped).
        every_n_steps: save every this many optimizer steps and after the last step (0: only on SIGTERM).
        keep_last: keep the newest this many complete checkpoints, delete older ones (null: keep all).
        resume: ``auto`` continues from the newest complete checkpoint in ``dir`` (a fresh start if there is none),
            ``none`` always starts fresh, any other value is the path of one ``step_<N>`` directory.
        async_save: stage the state to host memory and write it in a background thread while training continues
            (``dcp.async_save``); false writes synchronously.
        save_on_sigterm: on SIGTERM finish the current step, save, and exit with status 0.
    """

    dir: Optional[str] = None
    every_n_steps: int = 0
    keep_last: Optional[int] = 2
    resume: str = "auto"
    async_save: bool = True
    save_on_sigterm: bool = True

    def __post_init__(self) -> None:
        _check(self.every_n_steps >= 0, "checkpoint.every_n_steps", "must be >= 0 (0: save only on SIGTERM)")
        _check(
            self.keep_last is None or self.keep_last >= 1,
            "checkpoint.keep_last",
            "must be >= 1, or null to keep every checkpoint",
        )
        _check(bool(self.resume), "checkpoint.resume", "use auto, none, or the path of a step_<N> directory")


@dataclass
class Config:
    """The whole run. ``device``: ``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda``.

    ``profile=true`` records ``profile_steps`` training steps with ``torch.profiler`` after ``profile_wait_steps``
    steps (plus one warm-up step), into ``<run_dir>/profile/`` (see ``dlrm/profiling.py``).
    """

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
    device: str = "auto"
    profile: bool = False
    profile_wait_steps: int = 10
    profile_steps: int = 5

    def __post_init__(self) -> None:
        _check(self.device in ("auto", "cpu", "cuda"), "device", f"got {self.device!r}; use auto, cpu or cuda")
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


def _reject_unknown_keys(node: Any, schema: Any, prefix: str) -> None:
    """Hydra's ``+key=value`` can add keys that no schema field takes; refuse them rather than drop them."""
    names = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(
                f"config key `{path}` is not a known setting; the keys of `{prefix.rstrip('.') or 'the top level'}`"
                f" are: {', '.join(sorted(names))}"
            )
        ftype = names[key].default_factory if names[key].default_factory is not dataclasses.MISSING else None
        if isinstance(ftype, type) and dataclasses.is_dataclass(ftype):
            _reject_unknown_keys(node[key], ftype, path + ".")


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
    return obj


def compose(overrides: Sequence[str] = (), config_dir: Optional[str] = None) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides outside a Hydra app (tests, tools).

    Returns the composed ``DictConfig`` (Hydra's own ``hydra`` node removed).
    """
    import os

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    config_dir = config_dir or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))
