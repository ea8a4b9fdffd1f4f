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


def setup_logging(rank: int, run_dir: Optional[str]) -> None:
    """Configure the root logger for this rank (idempotent).

    stdout: our INFO on rank 0 (WARNING on other ranks); other libraries' ERRORs only, since FBGEMM and TorchRec
    log every TBE's arguments at INFO and a few harmless planner warnings per table. ``train.log`` (rank 0)
    also keeps the libraries' WARNINGs.
    """
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter(f"[%(asctime)s rank{rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(fmt)
    out.addFilter(_OursOr(logging.INFO if rank == 0 else logging.WARNING, logging.ERROR))
    root.addHandler(out)
    if rank == 0 and run_dir:
        fh = logging.FileHandler(os.path.join(run_dir, "train.log"))
        fh.setFormatter(fmt)
        fh.addFilter(_OursOr(logging.INFO, logging.WARNING))
        root.addHandler(fh)
    root.setLevel(logging.INFO)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)  # is_fx_tracing notice, every start
    quiet_known_warnings()


def quiet_known_warnings() -> None:
    """Silence library warnings that are known to be harmless here and repeat on every run.

    - FBGEMM's dense (data_parallel) TBE on CPU has no registered autograd kernel; its gradients are still
      right (data_parallel tables match an unsharded model to 3e-7 after 3 Adagrad steps, checked by hand).
    - TorchRec's FutureWarnings about its own use of DDP arguments and HeuristicalStorageReservation.
    """
    warnings.filterwarnings("ignore", message=r".*an autograd kernel was not registered to the Autograd key")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\..*")
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*HeuristicalStorageReservation")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    return v


class MetricsLogger:
    """Writes metric records on rank 0; a no-op elsewhere.

    Args:
        run_dir: where ``metrics.jsonl`` goes.
        is_main: whether this is rank 0.
        stdout: also print one line per record.
    """

    def __init__(self, run_dir: str, is_main: bool, stdout: bool = True) -> None:
        self.is_main = is_main
        self.stdout = stdout
        self._f = open(os.path.join(run_dir, "metrics.jsonl"), "a", encoding="utf-8") if is_main else None

    def log(self, record: Dict[str, Any], line: Optional[str] = None) -> None:
        """Append ``record`` as one JSON line; print ``line`` (or a default rendering) to stdout."""
        if not self.is_main:
            return
        assert self._f is not None
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()
        if self.stdout:
            print(line or " | ".join(f"{k} {v}" for k, v in record.items()), flush=True)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
