"""The checkpoint policy of a run (:class:`Checkpointer`): resume, periodic async saves, SIGTERM, retention."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
import warnings
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf
from torch.distributed.checkpoint import CheckpointException, FileSystemWriter

from dlrm.checkpoint.layout import META, PLAN, checkpoint_root, list_checkpoints, step_dir
from dlrm.checkpoint.manifest import write_manifest
from dlrm.checkpoint.plan_reuse import planning_inputs
from dlrm.checkpoint.reader import CheckpointError, read_checkpoint_meta
from dlrm.checkpoint.resume_checks import check_resume
from dlrm.checkpoint.rng import rng_state, set_rng_state
from dlrm.checkpoint.run_state import RunFacts, TrainState
from dlrm.checkpoint.state import LoadReport, app_state, load_app_state
from dlrm.checkpoint.writers import (
    ManifestWriter,
    StreamStagedWriter,
    save_failure,
)
from dlrm.config import CheckpointConfig
from dlrm.process_group import DistInfo
from dlrm.rundir import StorageError
from dlrm.schedule import load_scheduler_state
from dlrm.sharding import plan_fingerprint, plan_rows, save_plan

log = logging.getLogger(__name__)


class Checkpointer:
    """The checkpoint policy: resume at set-up, periodic async saves, SIGTERM, retention.

    Construct on every rank after the process group exists (it creates two gloo groups collectively).

    Args:
        cfg: the ``checkpoint`` config.
        run_dir: the run directory (``checkpoint.dir`` defaults to ``<run_dir>/checkpoints``).
        info: this rank's layout.
        model: the DMP model (its state dict: every table shard and the dense parameters).
        optimizer: the combined fused and dense optimizer.
        scheduler: the lr scheduler.
        run: the run's batch, steps, plan and config (:class:`RunFacts`).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: str,
        info: DistInfo,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any,
        run: RunFacts,
    ) -> None:
        self.cfg = cfg
        self.info = info
        self.model, self.optimizer, self.scheduler, self.run = model, optimizer, scheduler, run
        # TorchRec's state dicts are ShardedTensors; DCP warns about that on every access
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*deprecating ShardedTensor")
        self.root = checkpoint_root(cfg, run_dir)
        # Saves run collectives from a background thread; a group of their own keeps them apart from training's.
        self.pg = dist.new_group(backend="gloo")
        self.sig_pg = dist.new_group(backend="gloo") if info.world_size > 1 else None
        self._writer: Optional[FileSystemWriter] = None
        self._pending: Optional[Tuple[Any, int, str]] = None  # (future, step, tmp dir)
        self.last_saved_step = -1
        self.preempted = False
        self.preempt_message: Optional[str] = None
        self.save_seconds: List[float] = []  # time the training loop spent in each save (async: staging)
        self.resumed_from: Optional[str] = None
        self.report: Optional[LoadReport] = None
        self._sigterm = False
        self._prev_handler: Any = None
        if cfg.save_on_sigterm and threading.current_thread() is threading.main_thread():
            self._prev_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        del signum, frame
        self._sigterm = True

    # -------------------------------------------------------------------------------------------- resume
    def resume(self, state: TrainState, path: Optional[str]) -> Optional[str]:
        """Restore the model, optimizers, lr schedule and ``state`` (step, samples, RNG, metric window) from the
        checkpoint ``path`` (:func:`choose_checkpoint`'s choice; None: a fresh start). Returns ``path``.

        Raises:
            ConfigError: the checkpoint was trained on other data settings, global batch or steps per epoch
                (:func:`check_resume`: the data position would not match).
            CheckpointError: the checkpoint cannot be read, its ``meta.json`` is damaged, it holds another
                model, or optimizer state that does not carry over to this plan (:func:`load_app_state`).
        """
        if path is None:
            return None
        t0 = time.perf_counter()
        try:
            meta = read_checkpoint_meta(path)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {path}: {META} is unreadable ({type(e).__name__}: {e})") from e
        check_resume(path, meta, self.run)
        report = load_app_state(path, self.model, self.optimizer, self.pg, self.run.config.model)
        load_scheduler_state(self.scheduler, meta["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        state.step = self.last_saved_step = int(meta["step"])
        state.samples_seen = int(meta["samples"])
        state.target_auc_reached = meta.get("target_auc_reached")  # absent in checkpoints of earlier versions
        rank_file = os.path.join(path, f"rank_{self.info.rank}.pt")
        if meta["world_size"] == self.info.world_size and os.path.isfile(rank_file):
            extra = torch.load(rank_file, weights_only=False)
            set_rng_state(extra["rng"])
            if state.window is not None:
                state.window.load_state_dict(extra.get("window"))
        else:
            log.warning(
                "checkpoint %s was written by %d ranks, this run has %d: RNG states and the unlogged "
                "metric window are not restored (model, optimizer, schedule and data position are)",
                path,
                meta["world_size"],
                self.info.world_size,
            )
        log.info("checkpoint load: %s", report.summary())
        log.info(
            "resumed from %s at step %d (%d samples seen), %.1fs",
            path,
            state.step,
            state.samples_seen,
            time.perf_counter() - t0,
        )
        self.resumed_from, self.report = path, report
        return path

    # ---------------------------------------------------------------------------------------------- save
    def after_step(self, state: TrainState, before_save: Optional[Callable[[], None]] = None) -> bool:
        """Call at the end of every training step. Saves when due; on SIGTERM saves and returns True (the
        caller leaves the loop, logs :attr:`preempt_message`, and the run ends with status 0). ``before_save``
        runs on every rank before either save (the trainer's check for a diverged loss: it raises, and nothing
        is written)."""
        self._poll()
        sigterm = self.cfg.save_on_sigterm and self._agree_sigterm()
        every = self.cfg.every_n_steps
        due = bool(every) and (state.step % every == 0 or state.step == self.run.total_steps)
        if (sigterm or due) and before_save is not None:
            before_save()
        if sigterm:
            self.save(state, block=True)
            self.preempted = True
            self.preempt_message = (
                f"SIGTERM: finished step {state.step}, saved {step_dir(self.root, state.step)}; exiting with status "
                f"0. Start again with the same checkpoint.dir ({self.root}) to resume"
            )
            log.warning(self.preempt_message)
            return True
        if due:
            self.save(state, block=not self.cfg.async_save)
        return False

    def at_end(self, state: TrainState) -> None:
        """After the loop: save the last step if checkpointing is on and it is not saved yet (early stop)."""
        if self.cfg.every_n_steps and not self.preempted and self.last_saved_step != state.step:
            self.save(state, block=not self.cfg.async_save)

    def _agree_sigterm(self) -> bool:
        if self.sig_pg is None:
            return self._sigterm
        flag = torch.tensor([1 if self._sigterm else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.sig_pg)
        return bool(flag.item())

    def save(self, state: TrainState, block: bool = False) -> str:
        """Write a checkpoint of the current step (collective: every rank calls it at the same step).

        The previous async save is waited for first. With ``block=False`` this returns once the state is staged
        in host memory; the files appear as ``step_<N>/`` when the background write has finished.

        Raises:
            dlrm.rundir.StorageError: the disk of ``checkpoint.dir`` is full (or over quota, or read-only): the
                message names ``step_<N>.tmp``, the bytes needed and free; the partial save is removed and the
                earlier checkpoints are left as they were (:meth:`_failed`).
            OSError: ``checkpoint.dir`` cannot be created or written for another reason (permissions).
            torch.distributed.checkpoint.CheckpointException: DCP's write failed on a rank (it wraps that rank's
                error). With ``block=False`` a failure of the background write surfaces from the next
                :meth:`wait` (which :meth:`save` and :meth:`close` call).
        """
        self.wait()
        try:
            return self._save(state, block)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - only a storage fault is translated
            err = self._failed(state.step, e)
            if err is None:
                raise
            raise err from e

    def _failed(self, step: int, e: BaseException) -> Optional[StorageError]:
        """:func:`~dlrm.checkpoint.writers.save_failure` of the save of ``step`` that failed with ``e``."""
        return save_failure(self.root, step, e, self.info.is_main, lambda: app_state(self.model, self.optimizer))

    def _save(self, state: TrainState, block: bool) -> str:
        step = state.step
        final, tmp = step_dir(self.root, step), step_dir(self.root, step) + ".tmp"
        t0 = time.perf_counter()
        os.makedirs(tmp, exist_ok=True)
        window = state.window.state_dict() if state.window is not None else None
        torch.save({"rng": rng_state(), "window": window}, os.path.join(tmp, f"rank_{self.info.rank}.pt"))
        if self.info.is_main:
            meta = {
                "step": step,
                "samples": state.samples_seen,
                "target_auc_reached": state.target_auc_reached,
                "world_size": self.info.world_size,
                "global_batch": self.run.global_batch,
                "steps_per_epoch": self.run.steps_per_epoch,
                "scheduler": self.scheduler.state_dict(),
                "time": time.time(),
                "plan": [list(r) for r in plan_rows(self.run.plan.plan)],
                "plan_fingerprint": plan_fingerprint(self.run.plan),
                "planning": planning_inputs(self.run.config, self.run.global_batch),
                "config": OmegaConf.to_container(OmegaConf.structured(self.run.config)),
                "versions": {"torch": torch.__version__},
            }
            with open(os.path.join(tmp, META), "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1, default=str)
            save_plan(self.run.plan, os.path.join(tmp, PLAN))
        app = app_state(self.model, self.optimizer)
        writer = self._make_writer(tmp)
        if block:
            dcp.save(app, storage_writer=writer, checkpoint_id=tmp, process_group=self.pg)
            self._finish(step, tmp)
            log.info("checkpoint %s saved in %.2fs", final, time.perf_counter() - t0)
        else:
            fut = dcp.async_save(app, storage_writer=writer, checkpoint_id=tmp, process_group=self.pg)
            self._pending = (fut, step, tmp)
            log.info("checkpoint step %d staged in %.2fs; writing in the background", step, time.perf_counter() - t0)
        self.last_saved_step = step
        self.save_seconds.append(time.perf_counter() - t0)
        return final

    def _make_writer(self, tmp: str) -> FileSystemWriter:
        if self._writer is None:  # reused so that its pinned staging buffers (CUDA) are reused
            self._writer = (
                StreamStagedWriter(tmp, self.info.device) if self.info.device.type == "cuda" else ManifestWriter(tmp)
            )  # CPU: DCP's own staging copy, a fresh one per save
        return self._writer

    def _poll(self) -> None:
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the pending async save (if any) has finished, then publish it.

        Raises:
            dlrm.rundir.StorageError: as :meth:`save`; other failures of the background write as they were.
        """
        if self._pending is None:
            return
        fut, step, tmp = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            fut.result()
            self._finish(step, tmp)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - only a storage fault is translated
            err = self._failed(step, e)
            if err is None:
                raise
            raise err from e
        log.info("checkpoint %s written (waited %.2fs)", step_dir(self.root, step), time.perf_counter() - t0)

    def _finish(self, step: int, tmp: str) -> None:
        """Rank 0: write the manifest, publish ``step_<N>.tmp`` as ``step_<N>`` and prune old checkpoints. DCP's
        save has returned, so every rank's data and its ``manifest_rank_<r>.json`` are on disk."""
        if not self.info.is_main:
            return
        write_manifest(tmp)
        final = step_dir(self.root, step)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        keep = self.cfg.keep_last
        if keep:
            for _, old in list_checkpoints(self.root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Wait for the last async save; restore the previous SIGTERM handler."""
        try:
            self.wait()
        finally:
            if self._prev_handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._prev_handler)
                self._prev_handler = None
