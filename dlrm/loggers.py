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
from typing import Any, Dict, List, Optional


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
        fh = _RunFileHandler(os.path.join(run_dir, "train.log"))
        fh.setFormatter(fmt)
        fh.addFilter(_OursOr(logging.INFO, logging.WARNING))
        root.addHandler(fh)
    root.setLevel(logging.INFO)
    # imported here, not at the top: dlrm.cli imports this module before TorchRec's version is checked
    from dlrm.torchrec_compat import FX_TRACE_LOGGER

    logging.getLogger(FX_TRACE_LOGGER).setLevel(logging.ERROR)  # is_fx_tracing notice, every start
    quiet_known_warnings()


class _RunFileHandler(logging.FileHandler):
    """``train.log``: a failed write (a full disk) is kept for :class:`MetricsLogger` to raise as one ``error:``
    line, and the handler stops writing, instead of logging's traceback on stderr for every later record."""

    failure: Optional[BaseException] = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)
            return
        _RunFileHandler.failure = _RunFileHandler.failure or exc
        logging.getLogger().removeHandler(self)
        try:
            self.stream.close()  # drops what is buffered: it cannot be written
        except OSError:
            pass
        self.stream = None  # type: ignore[assignment]


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
    - On the GPU stack: TorchRec's call of torch's deprecated ``_get_pg_default_device``, and FBGEMM's notice that
      its B200 backward path is off on other GPUs.
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
    # TorchRec 1.6 calls torch's own `_get_pg_default_device` when it shards; FBGEMM 1.6's TBE backward reports on
    # CUDA that its B200-only path is off (device_major 9 is the H100/H200): neither is ours to act on
    warnings.filterwarnings("ignore", message=r"`_get_pg_default_device` will be deprecated")
    warnings.filterwarnings("ignore", message=r"TBE B200 optimization: ")
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*HeuristicalStorageReservation")


def _after(rec: Dict[str, Any], step: int) -> bool:
    s = rec.get("step")
    return isinstance(s, int) and not isinstance(s, bool) and s > step and rec.get("event") != "resume"


def _last_resume(records: List[Dict[str, Any]]) -> int:
    return max((i for i, r in enumerate(records) if r.get("event") == "resume"), default=-1)


def apply_resume(records: List[Dict[str, Any]], rec: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``records`` (read so far from a ``metrics.jsonl``) followed by ``rec``; a resume marker
    (:meth:`MetricsLogger.resumed`) first drops the records it supersedes (a step after its ``step``)."""
    if rec.get("event") == "resume" and isinstance(rec.get("step"), int):
        records = [r for r in records if not _after(r, rec["step"])]
    return [*records, rec]


def _repair_last_line(path: str) -> None:
    """Cut a half-written last line off ``path`` (a run killed, or out of disk, while writing a record), so that
    a resumed run appends whole records after whole records; the cut is logged as a warning."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            keep = size
            while keep > 0:  # back to the last newline, a block at a time
                start = max(0, keep - 65536)
                f.seek(start)
                nl = f.read(keep - start).rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                keep = start
            f.truncate(keep)
    except FileNotFoundError:
        return
    logging.getLogger(__name__).warning(
        "%s: removed a half-written last record (%d bytes) left by a run that stopped while writing it",
        path,
        size - keep,
    )


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
        self.path = os.path.join(run_dir, "metrics.jsonl")
        if not is_main:
            return
        _repair_last_line(self.path)
        # unbuffered: a record is one write(2), and one that fails is cut off again (see log)
        self._f = open(self.path, "ab", buffering=0)
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
        self._write(json.dumps({k: _clean(v) for k, v in record.items()}).encode("utf-8") + b"\n")
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

    def resumed(self, step: int, checkpoint: str) -> None:
        """Mark in ``metrics.jsonl`` that the run resumed at ``step`` from ``checkpoint``: one record
        ``{"event": "resume", "step", "checkpoint", "superseded", "previous_segment_s"}``. The records before it with
        a step after ``step`` (``superseded`` of them: steps the killed run had logged past its last checkpoint)
        are replayed by this run, and readers drop them (:func:`dlrm.report.load_run`), leaving one record per
        step; ``previous_segment_s`` is the training time the ended segment logged (its last ``time_s``), so
        that wall time adds up over segments."""
        if not self.is_main:
            return
        kept: List[Dict[str, Any]] = []
        with open(self.path, "rb") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    kept = apply_resume(kept, rec)
        segment = [r for r in kept[_last_resume(kept) + 1 :] if isinstance(r.get("time_s"), (int, float))]
        self._write(
            json.dumps(
                {
                    "event": "resume",
                    "step": step,
                    "checkpoint": checkpoint,
                    "superseded": sum(1 for r in kept if _after(r, step)),
                    "previous_segment_s": max((r["time_s"] for r in segment), default=0.0),
                }
            ).encode("utf-8")
            + b"\n"
        )

    def _write(self, data: bytes) -> None:
        """Append one record to ``metrics.jsonl``, whole or not at all.

        Raises:
            dlrm.rundir.StorageError: the run directory's disk is full (or over quota, read-only), here or in
                ``train.log`` earlier: names the file, the bytes needed and free. The part of the record that was
                written is cut off again, so the file ends with a whole line.
        """
        from dlrm.rundir import is_storage_fault, storage_error

        fix = (
            "free space there (or give hydra.run.dir on a larger disk) and launch again: the run resumes from its "
            "newest checkpoint"
        )
        if _RunFileHandler.failure is not None and is_storage_fault(_RunFileHandler.failure):
            log_path = os.path.join(os.path.dirname(self.path), "train.log")
            raise storage_error(log_path, _RunFileHandler.failure, None, fix) from None
        assert self._f is not None
        start = os.fstat(self._f.fileno()).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[self._f.write(view) :]
        except OSError as e:
            try:
                os.ftruncate(self._f.fileno(), start)
            except OSError:
                pass
            if is_storage_fault(e):
                raise storage_error(self.path, e, len(data), fix) from None
            raise

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
        for name, finish in (("_bar", "close"), ("_tb", "close"), ("_wandb", "finish"), ("_f", "close")):
            sink = getattr(self, name)
            if sink is not None:
                getattr(sink, finish)()
                setattr(self, name, None)
