"""The ``logger`` section of the schema: the logging cadence and one sub-section per sink
(``logger=[stdout,jsonl,tensorboard,wandb,mlperf]``)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Optional

from dlrm.config.checks import check


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
        check(
            self.mode in (None, "online", "offline", "disabled"),
            "logger.wandb.mode",
            f"got {self.mode!r}; use online, offline, disabled or null",
        )
        _needs_package(self.enabled, "wandb", "wandb", "-e '.[wandb]' (or pip install wandb)")


def _needs_package(enabled: bool, module: str, sink: str, install: str) -> None:
    """Refuse a sink whose package is missing when the config loads, not after the model is planned and sharded
    (wandb is an extra; the others are dependencies that a hand-assembled environment can lack)."""
    check(
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
        check(self.submission_division in ("open", "closed"), "logger.mlperf.submission_division", "use open or closed")
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
        check(self.log_every_n_steps > 0, "logger.log_every_n_steps", "must be positive")
