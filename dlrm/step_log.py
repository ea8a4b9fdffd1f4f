"""The training side of the log: the record and line of one log window (:class:`WindowLog`,
:func:`window_line`), and the host time the loop waits for batches (:class:`TimedIterator`)."""

from __future__ import annotations

import datetime
import logging
import math
import time
from typing import Any, Dict, Iterator

import torch

from dlrm.process_group import DistInfo

log = logging.getLogger("dlrm.trainer")  # the trainer's step log: its lines keep the trainer's logger name


class WindowLog:
    """Turns the statistics of a log window reduced over ranks (:meth:`dlrm.metrics.MetricWindow.reduce`) into
    its ``metrics.jsonl`` record; warns once when waiting for batches takes over half of a step.

    Args:
        info: this process's rank, world size and device.
        steps_per_epoch: optimizer steps in one epoch (the record's ``epoch`` is fractional).
        total_steps: the run's last step (the ETA's end).
        skip_nonfinite: ``trainer.on_nonfinite=skip_batch``: the record counts the skipped batches.
        first_step: the step this process started training at: the ETA counts this process's steps (a resumed
            run starts later).
    """

    def __init__(
        self, info: DistInfo, steps_per_epoch: int, total_steps: int, skip_nonfinite: bool, first_step: int
    ) -> None:
        self.info, self.steps_per_epoch, self.total_steps = info, steps_per_epoch, total_steps
        self.skip_nonfinite, self.first_step = skip_nonfinite, first_step
        self._input_warned = False
        self._windows_logged = 0  # by this process: a resumed run's first window also holds the compile

    def record(
        self, stats: Dict[str, Any], step: int, samples: int, lr: float, input_seconds: float, t_start: float
    ) -> Dict[str, Any]:
        """The record of the window ``stats`` ending at ``step``, with ``samples`` training samples seen, the dense
        rate ``lr``, ``input_seconds`` spent waiting for its batches, and the run's clock started at ``t_start``
        (``time.perf_counter``). Times: ``step_ms``, ``input_ms`` per step; ``time_s``, ``eta_s`` seconds."""
        info = self.info
        elapsed = stats["elapsed"]
        rec = {
            "step": step,
            "epoch": step / self.steps_per_epoch,
            "loss": stats["loss"],
            "train_auc": stats["auc"],
            "lr": lr,
            "samples_per_s": stats["samples"] / elapsed,
            "samples_per_s_per_rank": stats["samples"] / elapsed / info.world_size,
            "step_ms": 1000.0 * elapsed / stats["steps"],
            "input_ms": 1000.0 * input_seconds / stats["steps"],
            "peak_mem_gb": peak_memory_gb(info.device),
            "samples": samples,
            "time_s": time.perf_counter() - t_start,
        }
        # remaining steps at this process's wall time per step so far (evaluations and saves included)
        rec["eta_s"] = rec["time_s"] / max(step - self.first_step, 1) * (self.total_steps - step)
        if self.skip_nonfinite:
            rec["skipped_batches"] = stats["skipped_global"]
        self._windows_logged += 1
        if rec["input_ms"] > 0.5 * rec["step_ms"] and not self._input_warned and self._windows_logged > 1:
            self._input_warned = True  # the first window holds the compile and the loader's start
            log.warning(
                "the input side took %.1f of each %.1f ms step on rank %d (host time waiting for batches): the "
                "loader bounds the step; see data.prefetch, data.assemble_on_device, or materialized multi-hot",
                rec["input_ms"],
                rec["step_ms"],
                info.rank,
            )
        return rec


def window_line(rec: Dict[str, Any], total_steps: int) -> str:
    """The step line ``train.log`` shows for a window's record ``rec`` (:meth:`WindowLog.record`)."""
    auc = f"{rec['train_auc']:.4f}" if math.isfinite(rec["train_auc"]) else "n/a"
    return (
        f"step {rec['step']:>6}/{total_steps} | epoch {rec['epoch']:.2f} | loss {rec['loss']:.5f} | "
        f"auc(win) {auc} | lr {rec['lr']:.3g} | {rec['samples_per_s']:,.0f} samples/s | "
        f"{rec['step_ms']:.1f} ms/step | mem {rec['peak_mem_gb']:.2f} GB | {rec['time_s']:.1f}s | "
        f"eta {datetime.timedelta(seconds=round(rec['eta_s']))}"
    )


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process in GB: CUDA allocator peak on GPU, peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB


class TimedIterator:
    """The training batches, with the host time spent waiting for each (building it, or for the loader's thread
    to hand it over): the input side's share of a step, logged as ``input_ms``."""

    def __init__(self, it: Iterator[Any]) -> None:
        self.it, self.seconds = it, 0.0

    def __iter__(self) -> "TimedIterator":
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            return next(self.it)
        finally:
            self.seconds += time.perf_counter() - t0

    def take_seconds(self) -> float:
        """Seconds spent since the last call."""
        s, self.seconds = self.seconds, 0.0
        return s

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()  # a generator: its finally stops and joins the prefetch thread (dlrm.data.binary.Prefetcher)
