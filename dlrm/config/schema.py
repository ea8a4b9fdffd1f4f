"""The schema of the whole run, :class:`Config`, and its smaller sections (model, optimizer, pipeline, offload,
trainer, eval, checkpoint); the larger sections have modules of their own (:mod:`dlrm.config.data`,
:mod:`dlrm.config.sharding`, :mod:`dlrm.config.perf`, :mod:`dlrm.config.logger`).

Each field has a short docstring beside it (``docs/configuration.md`` shows it); each section's ``__post_init__``
checks its values and raises :class:`~dlrm.errors.ConfigError` naming the key and the fix. Choices are plain
``str`` fields checked there: OmegaConf 2.3 refuses ``typing.Literal`` annotations in structured configs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from dlrm.config.checks import check
from dlrm.config.data import DataConfig
from dlrm.config.logger import LoggerConfig
from dlrm.config.mlperf import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS, NUM_SPARSE_FEATURES
from dlrm.config.perf import PerfConfig
from dlrm.config.sharding import ShardingConfig


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
        check(self.interaction in ("dcn", "dot"), "model.interaction", f"got {self.interaction!r}; use dcn or dot")
        check(self.embedding_dim > 0, "model.embedding_dim", "must be positive")
        n = len(self.num_embeddings_per_feature)
        check(
            n == NUM_SPARSE_FEATURES,
            "model.num_embeddings_per_feature",
            f"has {n} entries; Criteo has {NUM_SPARSE_FEATURES} sparse features C1..C26, give one per feature",
        )
        check(
            all(r > 0 for r in self.num_embeddings_per_feature),
            "model.num_embeddings_per_feature",
            "every table needs at least one row",
        )
        check(
            len(self.multi_hot_sizes) == n,
            "model.multi_hot_sizes",
            f"has {len(self.multi_hot_sizes)} entries; give one per table ({n})",
        )
        check(all(m >= 1 for m in self.multi_hot_sizes), "model.multi_hot_sizes", "every size must be >= 1")
        check(self.row_cap is None or self.row_cap > 0, "model.row_cap", "must be positive or null")
        check(
            len(self.dense_arch_layer_sizes) > 0 and self.dense_arch_layer_sizes[-1] == self.embedding_dim,
            "model.dense_arch_layer_sizes",
            f"the last size ({self.dense_arch_layer_sizes[-1:]}) must equal model.embedding_dim "
            f"({self.embedding_dim}) so dense and sparse outputs interact",
        )
        check(
            len(self.over_arch_layer_sizes) > 0 and self.over_arch_layer_sizes[-1] == 1,
            "model.over_arch_layer_sizes",
            "the last size must be 1 (one click logit)",
        )
        for key in ("dense_arch_layer_sizes", "over_arch_layer_sizes"):
            check(all(w > 0 for w in getattr(self, key)), f"model.{key}", "every layer needs a positive width")
        check(self.dense_buckets >= 0, "model.dense_buckets", "must be >= 0 (0: no buckets)")
        check(self.dense_bucket_width > 0, "model.dense_bucket_width", "must be positive")
        if self.interaction == "dcn":
            check(self.dcn_num_layers > 0, "model.dcn_num_layers", "must be positive")
            check(self.dcn_low_rank_dim > 0, "model.dcn_low_rank_dim", "must be positive")

    @property
    def table_rows(self) -> List[int]:
        """Rows per table after ``row_cap``."""
        cap = self.row_cap
        return [min(r, cap) if cap else r for r in self.num_embeddings_per_feature]


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
        check(self.lr > 0, "optimizer.lr", "must be positive")
        check(self.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0")
        check(self.decay_steps >= 0, "optimizer.decay_steps", "must be >= 0")
        check(self.decay_start_step >= 0, "optimizer.decay_start_step", "must be >= 0")
        check(self.decay_power > 0, "optimizer.decay_power", "must be positive (a negative power raises the rate)")
        if self.decay_steps:
            check(
                self.decay_start_step >= self.warmup_steps,
                "optimizer.decay_start_step",
                f"{self.decay_start_step} falls inside the warmup ({self.warmup_steps} steps); start the decay "
                "at or after optimizer.warmup_steps",
            )
        check(
            0 <= self.end_lr <= min(self.lr, self.sparse_lr or self.lr),
            "optimizer.end_lr",
            f"{self.end_lr} must be in [0, the smaller of optimizer.lr and optimizer.sparse_lr] (the decay's floor "
            "for both); lower optimizer.end_lr",
        )
        check(self.sparse_lr is None or self.sparse_lr > 0, "optimizer.sparse_lr", "must be positive or null")
        check(self.eps > 0, "optimizer.eps", "must be positive")
        check(
            self.sparse_type in ("adagrad", "rowwise_adagrad"),
            "optimizer.sparse_type",
            f"got {self.sparse_type!r}; use adagrad or rowwise_adagrad",
        )

    @property
    def embedding_lr(self) -> float:
        """Learning rate of the embedding tables: ``sparse_lr``, or ``lr`` when it is null."""
        return self.sparse_lr if self.sparse_lr is not None else self.lr


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
    this step's output dist, backward all-to-all and all-reduce (``dlrm/comms.py``). With ``pipeline=graphed`` on
    several ranks each captured step sends the next batch's ids on a stream of their own, beside its compute. For
    several hosts: slower on one NVLink host with the eager pipelines, up to 1.6% slower forced on one GPU with the
    graph (docs/performance.md, "Rejected levers")."""
    semi_sync_start_batch: int = 0
    """``semi_sync``: the batches before this one train synchronously (TorchRec's ``start_batch``; its default
    is 900)."""

    def __post_init__(self) -> None:
        check(
            self.name in ("sparse_dist", "fused_sparse_dist", "semi_sync", "prefetch", "base", "graphed"),
            "pipeline.name",
            f"got {self.name!r}; use sparse_dist, fused_sparse_dist (CUDA), semi_sync (CUDA), prefetch (uvm "
            "caching, CUDA), base (plain loop, no overlap, for debugging) or graphed (CUDA graph, fixed bag sizes)",
        )
        check(
            self.semi_sync_start_batch >= 0,
            "pipeline.semi_sync_start_batch",
            f"got {self.semi_sync_start_batch}; use a batch index >= 0",
        )
        check(
            self.input_dist_group in ("shared", "dedicated"),
            "pipeline.input_dist_group",
            f"got {self.input_dist_group!r}; use shared or dedicated",
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
        check(
            self.name in ("none", "uvm", "uvm_caching"),
            "offload.name",
            f"got {self.name!r}; use offload=none, offload=uvm or offload=uvm_caching",
        )
        check(self.min_table_rows >= 0, "offload.min_table_rows", "must be >= 0")
        check(self.min_table_mb >= 0, "offload.min_table_mb", "must be >= 0")
        check(0.0 < self.cache_load_factor <= 1.0, "offload.cache_load_factor", "must be in (0, 1]")
        check(
            self.cache_algorithm in ("lru", "lfu"),
            "offload.cache_algorithm",
            f"got {self.cache_algorithm!r}; use lru or lfu",
        )


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
        check(
            self.on_nonfinite in ("stop", "skip_batch"),
            "trainer.on_nonfinite",
            f"got {self.on_nonfinite!r}; use stop or skip_batch",
        )
        check(self.epochs > 0, "trainer.epochs", "must be positive")
        check(self.max_steps is None or self.max_steps > 0, "trainer.max_steps", "must be positive or null")


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
    cache_on_device: bool = False
    """Hold this rank's validation batches on the device after the first validation, so that later ones read and
    build nothing on the host (``data=criteo_binary`` builds its batches on the host; the in-memory sources build
    theirs on the GPU already). Costs their device memory, logged at the first validation: about 0.9 KB per row
    with the MLPerf multi-hot (10 GB a rank for MLPerf's 89 M validation rows over 8 ranks), 170 bytes 1-hot. The
    MLPerf recipe sets it."""
    target_auc: Optional[float] = None
    """Stop once validation AUC reaches this (MLPerf: 0.80275); null: never. A histogram AUC must reach it by more
    than its error bound (``val_auc_bound`` in metrics.jsonl), so the exact AUC reaches it too."""
    auc_method: str = "auto"
    """``exact`` (every prediction gathered; equals sklearn), ``histogram`` (16 MB of counts per rank, within
    1e-4 of sklearn in tests) or ``auto`` (exact up to 16 M evaluation rows)."""

    def __post_init__(self) -> None:
        check(self.every_n_steps is None or self.every_n_steps > 0, "eval.every_n_steps", "must be positive or null")
        check(self.per_epoch is None or self.per_epoch > 0, "eval.per_epoch", "must be positive or null")
        check(
            self.every_n_steps is None or self.per_epoch is None,
            "eval.per_epoch",
            "set either eval.every_n_steps or eval.per_epoch, not both (null the other)",
        )
        check(self.batch_size is None or self.batch_size > 0, "eval.batch_size", "must be positive or null")
        check(self.target_auc is None or 0.5 < self.target_auc <= 1.0, "eval.target_auc", "must be in (0.5, 1]")
        check(
            self.auc_method in ("auto", "exact", "histogram"),
            "eval.auc_method",
            f"got {self.auc_method!r}; use auto, exact or histogram",
        )


@dataclass
class CheckpointConfig:
    """Sharded ``torch.distributed.checkpoint`` checkpoints, exact resume and preemption (``dlrm/checkpoint/``)."""

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
        check(self.every_n_steps >= 0, "checkpoint.every_n_steps", "must be >= 0 (0: save only on SIGTERM)")
        check(
            self.keep_last is None or self.keep_last >= 1,
            "checkpoint.keep_last",
            "must be >= 1, or null to keep every checkpoint",
        )
        check(bool(self.resume), "checkpoint.resume", "use auto, none, or the path of a step_<N> directory")
        check(self.verify in ("full", "size"), "checkpoint.verify", f"got {self.verify!r}; use full or size")


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
        check(self.device in ("auto", "cpu", "cuda"), "device", f"got {self.device!r}; use auto, cpu or cuda")
        check(0 <= self.seed < 2**63, "seed", f"got {self.seed}; use 0 .. 2**63 - 1 (torch.manual_seed's range)")
        check(self.profile_wait_steps >= 0, "profile_wait_steps", "must be >= 0")
        check(self.profile_steps > 0, "profile_steps", "must be positive")
        check(
            self.perf.dcn_residual_dtype == "fp32" or self.model.interaction == "dcn",
            "perf.dcn_residual_dtype",
            f"autocast sets the dtype of the DCN cross layers, and model.interaction={self.model.interaction} "
            f"has none; use perf.dcn_residual_dtype=fp32 or model.interaction=dcn",
        )
        check(
            self.sharding.data_parallel_max_rows is None or self.perf.embedding_dtype == "fp32",
            "sharding.data_parallel_max_rows",
            f"data_parallel tables are stepped by the dense optimizer in fp32, and perf.embedding_dtype="
            f"{self.perf.embedding_dtype} gives them half-precision weights; set perf.embedding_dtype=fp32 or "
            f"sharding.data_parallel_max_rows=null",
        )
        opt = self.optimizer
        check(
            self.pipeline.name != "semi_sync" or not (opt.warmup_steps or opt.decay_steps),
            "pipeline.name",
            f"pipeline=semi_sync steps only the dense optimizer, and TorchRec hands a new rate to the tables' TBE in "
            f"the fused optimizer's step, so the tables would keep their base rate through optimizer.warmup_steps="
            f"{opt.warmup_steps} / optimizer.decay_steps={opt.decay_steps}; set both to 0, or use pipeline=sparse_dist",
        )
        if self.offload.name == "uvm_caching":
            check(
                self.pipeline.name == "prefetch",
                "pipeline.name",
                f"offload=uvm_caching trains with the prefetch pipeline (cache rows of batch i+1 fetched during "
                f"batch i), got pipeline={self.pipeline.name}; add pipeline=prefetch",
            )
