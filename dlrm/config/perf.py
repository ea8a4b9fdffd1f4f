"""The ``perf`` section of the schema: the speed levers (``perf=fp32|fast``; applied by ``dlrm/perf.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from dlrm.config.checks import check


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
        self._check_tables_and_comms()
        self._check_autocast()
        self._check_compile_and_ddp()

    def _check_tables_and_comms(self) -> None:
        """The table and pooled-embedding dtypes, the all-reduce's dtype and timing, and FBGEMM's checks."""
        check(
            self.embedding_dtype != "bf16",
            "perf.embedding_dtype",
            "FBGEMM's TBE trains no bf16 table weights (its CUDA cache set-up refuses them, its CPU kernels have "
            "none); use fp16 (half the memory) or fp32",
        )
        check(
            self.embedding_dtype in ("fp32", "fp16"),
            "perf.embedding_dtype",
            f"got {self.embedding_dtype!r}; use fp32 or fp16",
        )
        for key in ("embedding_output_dtype", "allreduce_dtype"):
            v = getattr(self, key)
            check(v in ("fp32", "fp16", "bf16"), f"perf.{key}", f"got {v!r}; use fp32, fp16 or bf16")
        check(
            self.tbe_stochastic_rounding or self.embedding_dtype == "fp16",
            "perf.tbe_stochastic_rounding",
            "false rounds fp16 table updates to nearest and has no effect on fp32 tables; add "
            "perf.embedding_dtype=fp16, or drop the key",
        )
        if self.allreduce_after_output_dist:
            check(
                self.lean_output_dist,
                "perf.allreduce_after_output_dist",
                "holds DDP's all-reduce until the lean output dists' backward all-to-alls are issued; add "
                "perf.lean_output_dist=true, or set perf.allreduce_after_output_dist=false",
            )
            check(
                self.allreduce_dtype == "fp32",
                "perf.allreduce_after_output_dist",
                "issues DDP's fp32 all-reduce (PyTorch's default hook); with "
                f"perf.allreduce_dtype={self.allreduce_dtype} set perf.allreduce_after_output_dist=false (or use "
                "perf.allreduce_dtype=fp32)",
            )
        check(
            self.tbe_bounds_check in ("warning", "fatal", "none"),
            "perf.tbe_bounds_check",
            f"got {self.tbe_bounds_check!r}; use warning, fatal or none",
        )

    def _check_autocast(self) -> None:
        """The autocast dtype, and the keys that must agree with it."""
        check(
            self.autocast in ("none", "bf16", "fp16"), "perf.autocast", f"got {self.autocast!r}; use none, bf16 or fp16"
        )
        check(
            self.autocast == "none" or self.embedding_output_dtype in ("fp32", self.autocast),
            "perf.embedding_output_dtype",
            f"{self.embedding_output_dtype} pooled embeddings cannot meet {self.autocast} autocast (autocast's "
            f"torch.cat promotion refuses fp16 with bf16); use perf.embedding_output_dtype={self.autocast} or fp32",
        )
        check(
            self.dcn_residual_dtype in ("fp32", "autocast"),
            "perf.dcn_residual_dtype",
            f"got {self.dcn_residual_dtype!r}; use fp32 or autocast",
        )
        check(
            self.dcn_residual_dtype == "fp32" or self.autocast != "none",
            "perf.dcn_residual_dtype",
            "autocast keeps the DCN's residual stream in the autocast dtype and has no effect while "
            "perf.autocast=none; add perf.autocast=bf16, or use perf.dcn_residual_dtype=fp32",
        )

    def _check_compile_and_ddp(self) -> None:
        """``torch.compile``'s mode and DDP split, and DDP's bucket size."""
        check(
            self.compile_mode not in ("reduce-overhead", "max-autotune"),
            "perf.compile_mode",
            f"{self.compile_mode} captures CUDA graphs, which the trainer does not run (not faster on H200: "
            f"docs/performance.md); use default or max-autotune-no-cudagraphs",
        )
        modes = ("default", "max-autotune-no-cudagraphs")
        check(self.compile_mode in modes, "perf.compile_mode", f"got {self.compile_mode!r}; use one of {modes}")
        check(
            self.compile or self.compile_mode == "default",
            "perf.compile_mode",
            f"{self.compile_mode} has no effect while perf.compile=false; add perf.compile=true",
        )
        check(
            self.compile or self.compile_ddp_split,
            "perf.compile_ddp_split",
            "splits the compiled dense step and has no effect while perf.compile=false; add perf.compile=true",
        )
        check(
            self.ddp_bucket_cap_mb >= 1,
            "perf.ddp_bucket_cap_mb",
            f"got {self.ddp_bucket_cap_mb}; use a bucket size in MiB >= 1 (25: PyTorch's default)",
        )
