"""Rank-aware logging: Python logging for messages, :class:`MetricsLogger` for metrics.

Rank 0 prints INFO to stdout and writes ``<run_dir>/train.log``; other ranks print only warnings and errors,
prefixed with their rank. Metrics records go, on rank 0 only, to ``<run_dir>/metrics.jsonl`` (one JSON object per
line) and, as one dense line per logged step, to stdout.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import warnings
from typing import Any, Dict, Optional


class _OursOr(logging.Filter):
    """Pass our own records from ``level`` up, and other libraries' records from ``other_level`` up."""

    def __init__(self, level: int, other_level: int) -> None:
        super().__init__()
        self.level, self.other_level = level, other_level

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name.startswith("dlrm") or record.name == "__main__"
        return record.levelno >= (self.level if ours else self.other_level)


class _DropMessage(logging.Filter):
    """Drop the records whose message starts with ``prefix``; pass the rest."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


class _NoDetail(logging.Filter):
    """Drop records logged with ``extra={"detail": True}`` (the plan and traffic tables) from stdout."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "detail", False)


def setup_logging(rank: int, run_dir: Optional[str], verbose: bool = False) -> None:
    """Configure the root logger for this rank (idempotent).

    stdout: our INFO on rank 0 (WARNING on other ranks), without the records logged with ``extra={"detail":
    True}`` (the plan and traffic tables) unless ``verbose`` (``logger.verbose``); other libraries' ERRORs only,
    since FBGEMM and TorchRec log every TBE's arguments at INFO and a few harmless planner warnings per table.
    ``train.log`` (rank 0) keeps everything of ours and the libraries' WARNINGs.
    """
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(f"[%(asctime)s rank{rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(fmt)
    out.addFilter(_OursOr(logging.INFO if rank == 0 else logging.WARNING, logging.ERROR))
    if not verbose:
        out.addFilter(_NoDetail())
    root.addHandler(out)
    if rank == 0 and run_dir:
        fh = logging.FileHandler(os.path.join(run_dir, "train.log"))
        fh.setFormatter(fmt)
        fh.addFilter(_OursOr(logging.INFO, logging.WARNING))
        root.addHandler(fh)
    root.setLevel(logging.INFO)
    # imported here, not at the top: dlrm.cli imports this module before TorchRec's version is checked
    from dlrm.torchrec_compat import FX_TRACE_LOGGER

    logging.getLogger(FX_TRACE_LOGGER).setLevel(logging.ERROR)  # is_fx_tracing notice, every start
    quiet_known_warnings()


def log_error_to_file(text: str) -> None:
    """Write ``text`` as an ERROR record to ``train.log`` only (the console gets the ``error:`` line once, from the
    command line's own print); nothing when logging to a file is not set up (ranks other than 0, early errors)."""
    record = logging.getLogger("dlrm").makeRecord("dlrm", logging.ERROR, __file__, 0, text, None, None)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            h.handle(record)


def quiet_known_warnings() -> None:
    """Silence library warnings that are known to be harmless here and repeat on every run.

    - FBGEMM's dense (data_parallel) TBE on CPU has no registered autograd kernel; its gradients are still
      right (``tests/test_sharding_equivalence.py`` compares data_parallel tables with an unsharded model).
    - TorchRec's FutureWarnings about its own use of DDP arguments and HeuristicalStorageReservation.
    """
    warnings.filterwarnings("ignore", message=r".*an autograd kernel was not registered to the Autograd key")
    # torch 2.13 deprecates the collectives TorchRec 1.8 itself calls (row_wise output dist, gradient all-gather),
    # once per rank per evaluation and training start; nothing here calls them, and TorchRec's own switch will end it
    warnings.filterwarnings(
        "ignore",
        category=FutureWarning,
        message=r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
    )
    # dlrm.sharding.topology builds TorchRec's Topology directly, on purpose: it plans for the job's devices (world
    # size, HBM cap, link rates set from the config), which TopologyFactory would resolve by probing this machine
    planner_types = logging.getLogger("torchrec.distributed.planner.types")
    if not any(isinstance(f, _DropMessage) for f in planner_types.filters):
        planner_types.addFilter(_DropMessage("The topology was constructed directly rather than via TopologyFactory"))
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\..*")
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*HeuristicalStorageReservation")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    return v


class MetricsLogger:
    """Fans metric records out to the configured sinks, on rank 0 only (a no-op elsewhere).

    Always: ``<run_dir>/metrics.jsonl``, one JSON object per record (NaN written as null). Optional, per
    ``logger.*.enabled``: stdout lines (or a tqdm progress bar with ETA when stdout is a terminal, with the lines
    written above it), TensorBoard scalars under ``<kind>/<key>``, and wandb.

    Args:
        run_dir: where files go.
        is_main: whether this is rank 0.
        cfg: the ``logger`` config.
        total_steps: length of the progress bar.
        run_config: the resolved config as a dict, given to wandb.
    """

    def __init__(
        self,
        run_dir: str,
        is_main: bool,
        cfg: Any = None,
        total_steps: int = 0,
        run_config: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.is_main = is_main
        self.stdout = bool(cfg.stdout.enabled) if cfg is not None else True
        self._f = None
        self._bar = None
        self._tb = None
        self._wandb = None
        if not is_main:
            return
        self._f = open(os.path.join(run_dir, "metrics.jsonl"), "a", encoding="utf-8")
        if cfg is None:
            return
        bar = cfg.stdout.progress_bar
        if self.stdout and total_steps and (bar or (bar is None and sys.stdout.isatty())):
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit="step", dynamic_ncols=True, leave=True)
        if cfg.tensorboard.enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=os.path.join(run_dir, cfg.tensorboard.dir))
        if cfg.wandb.enabled:
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb.project,
                entity=cfg.wandb.entity,
                name=cfg.wandb.name,
                mode=cfg.wandb.mode,
                dir=run_dir,
                config=run_config or {},
            )

    def advance(self, n: int = 1) -> None:
        """Move the progress bar by ``n`` steps."""
        if self._bar is not None:
            self._bar.update(n)

    def log(self, record: Dict[str, Any], line: Optional[str] = None, kind: str = "train") -> None:
        """Write ``record`` to every sink; ``line`` (or a default rendering) goes to stdout.

        ``kind`` (``train``, ``val``, ``test``) prefixes TensorBoard and wandb keys; ``record["step"]`` is their
        x axis.
        """
        if not self.is_main:
            return
        assert self._f is not None
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()
        self.log_line(line or " | ".join(f"{k} {v}" for k, v in record.items()))
        scalars = {
            k: float(v)
            for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        step = int(record.get("step", 0))
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(f"{kind}/{k}", v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({f"{kind}/{k}": v for k, v in scalars.items()}, step=step)

    def log_line(self, text: str) -> None:
        """Print a line on rank 0 (above the progress bar if there is one); not a metrics record."""
        if not (self.is_main and self.stdout):
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Close the progress bar, TensorBoard writer, wandb run and ``metrics.jsonl``; a second call does nothing."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._f is not None:
            self._f.close()
            self._f = None
