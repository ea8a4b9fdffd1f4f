"""The training loop: set up (process group, data, model, plan, DMP, optimizers, pipeline), train, evaluate.

``train.py`` composes the config with Hydra and hands it here::

    python train.py                                   # synthetic default, 1 process
    torchrun --nproc_per_node 2 train.py              # same, 2 processes (gloo on CPU, NCCL on GPU)

Why our own loop rather than a generic one: the loop is this project's subject (pipelined sparse dist with
in-training evaluation, per-rank data layout, TorchRec's fused optimizers); everything around it is a library
(Hydra, TorchRec planner / DMP / pipelines, torchmetrics).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf

from dlrm import data as data_mod
from dlrm.build import BuildHooks as BuildHooks  # the benchmarks' import
from dlrm.build import build_training, log_built
from dlrm.checkpoint import (
    Checkpointer,
    RunFacts,
    TrainState,
)
from dlrm.config import Config, to_config
from dlrm.evaluation import Scorer, eval_line, eval_record, final_line
from dlrm.graphed import GraphedTrainPipeline
from dlrm.loggers import MetricsLogger, setup_logging
from dlrm.metrics import MetricWindow
from dlrm.mlperf_log import MlperfLogger
from dlrm.model import FEATURE_NAMES
from dlrm.process_group import DistInfo
from dlrm.profiling import StepProfiler
from dlrm.rundir import DirLock, is_storage_fault, storage_error
from dlrm.schedule import lr_at
from dlrm.sharding import save_plan
from dlrm.startup import (
    agree_run_dir,
    batching,
    choose_resume,
    claim_dirs,
    load_data,
    make_run_dirs,
    planning_config,
    preflight,
    run_length,
)
from dlrm.step_log import TimedIterator, WindowLog, window_line

log = logging.getLogger(__name__)


class _StateField:
    """A :class:`Trainer` attribute kept in its :class:`~dlrm.checkpoint.TrainState` (what a checkpoint restores),
    under the same name."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        return self if obj is None else getattr(obj.state, self.name)

    def __set__(self, obj: Any, value: int) -> None:
        setattr(obj.state, self.name, value)


class Trainer:
    """Owns one run. Call :meth:`fit`; :meth:`close` runs on every exit path (``train.py`` uses try/finally).

    Args:
        cfg: composed config (``DictConfig`` from Hydra or a :class:`Config`).
        run_dir: directory for ``config.yaml``, ``metrics.jsonl`` and ``train.log`` (rank 0 writes them).
    """

    def __init__(self, cfg: DictConfig | Config, run_dir: str) -> None:
        self.raw_cfg = cfg
        self.cfg: Config = to_config(cfg)
        self.run_dir = run_dir
        self.info: Optional[DistInfo] = None
        self.metrics: Optional[MetricsLogger] = None
        self.state = TrainState()  # step, samples seen, metric window: what a checkpoint restores
        self._it: Optional[TimedIterator] = None
        self.history: list = []
        self.target_met_before = False  # resumed from the checkpoint where the run reached eval.target_auc
        self._locks: List[DirLock] = []  # ownership of the run (and checkpoint) directory, rank 0

    step = _StateField("Optimizer steps done.")
    samples_seen = _StateField("Training samples over all ranks so far.")

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Prepare the run (collective: every rank calls it): join the process group, load the splits, choose and
        verify the checkpoint to resume from, plan and shard the model, build the optimizers, schedule and
        pipeline, restore the checkpoint if there is one, then write ``config.yaml`` and ``plan.json`` (rank 0).
        The phases before the build are in :mod:`dlrm.startup`.

        Raises:
            ConfigError: a launch environment that cannot work (``WORLD_SIZE`` > 1 without ``MASTER_ADDR``, more
                local ranks than GPUs); a config value this run cannot use: a device, offload, perf or pipeline
                setting this device or world cannot run, ``data.global_batch_size`` not a multiple of the world
                size, fewer training rows than ranks, data kept on the GPU that fills its HBM,
                ``checkpoint.resume`` naming no checkpoint, or ``none`` where checkpoints are, a checkpoint of
                another global batch, a ``checkpoint.dir`` that is a file or that saves could not write, a sink's
                directory that cannot be made; a run directory (or ``checkpoint.dir``) that a live run owns
                (:mod:`dlrm.rundir`).
            dlrm.rundir.StorageError: ``config.yaml`` or ``plan.json`` cannot be written for want of space.
            InputError: other bad input, as the subclass that names the file, row or table: a data file
                (``TsvFormatError``, ``BinaryFormatError``; a directory given as a file), the sharding
                (``PlanError``), a damaged or mismatched checkpoint (``CheckpointError``).
            FileNotFoundError: a data file named by the config does not exist.

        ``train.py`` prints ``InputError`` (``ConfigError`` is one) and ``FileNotFoundError`` as one ``error:``
        line and exits with status 2 (``dlrm/cli.py``).
        """
        cfg = self.cfg
        self.info = info = preflight(cfg)
        self._open_run_dir()
        resolved = (
            OmegaConf.to_container(self.raw_cfg, resolve=True)
            if isinstance(self.raw_cfg, DictConfig)
            else OmegaConf.to_container(OmegaConf.structured(cfg))
        )
        b = batching(cfg, info.world_size)
        self.batch_size, self.global_batch, self.eval_batch_size = b.batch_size, b.global_batch, b.eval_batch_size
        resume_from = choose_resume(cfg, self.run_dir, info)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        d = load_data(cfg, info.device)
        self.train_split, self.val_split, self.test_split = d.train, d.val, d.test
        self.multi_hot, self.device_data_bytes = d.multi_hot, d.device_bytes
        n = run_length(cfg, len(d.train), len(d.val), b.global_batch, info.world_size)
        self.steps_per_epoch, self.total_steps, self.eval_every = n.steps_per_epoch, n.total_steps, n.eval_every
        self.auc_method = n.auc_method
        log.info(
            "data %s: %d train, %d val, %s test rows (%.1fs); %s ids per sample; AUC method %s",
            cfg.data.name,
            len(d.train),
            len(d.val),
            len(d.test) if d.test is not None else "no",
            time.perf_counter() - t0,
            sum(cfg.model.multi_hot_sizes) if d.multi_hot else len(FEATURE_NAMES),
            n.auc_method,
        )
        self.skip_nonfinite = cfg.trainer.on_nonfinite == "skip_batch"
        build_cfg = planning_config(cfg, info, d.device_bytes, resume_from, b.global_batch)
        built = build_training(
            build_cfg, info, b.batch_size, self.skip_nonfinite, init_tables=resume_from is None, checked=True
        )
        self.model, self.plan, self.optimizer = built.model, built.plan, built.optimizer
        self.scheduler, self.pipeline = built.scheduler, built.pipeline
        log_built(cfg, info, built, b.batch_size)
        log.info(
            "batch %d per rank, %d global; %d steps/epoch, %d steps to run, validation every %s steps; run dir %s",
            b.batch_size,
            b.global_batch,
            n.steps_per_epoch,
            n.total_steps,
            n.eval_every or "(end only)",
            self.run_dir,
        )
        self._open_metrics(resolved)
        self._resume(resume_from)
        self._write_run_files(resolved)
        self.scorer = Scorer(
            self.model, self.pipeline, info, b.eval_batch_size, d.multi_hot, n.auc_method, cfg.eval.cache_on_device
        )
        if cfg.perf.compile and (self.eval_every or cfg.eval.at_end or self.test_split is not None):
            self.scorer.compile_step(self.val_split)

    def _open_run_dir(self) -> None:
        """Own the run directory (the owner lock is taken before anything of it is read, removed or written), make
        it and the sinks' directories, start the log files and the MLPerf log (``init_start``)."""
        cfg, info = self.cfg, self.info
        assert info is not None
        self.run_dir = agree_run_dir(self.run_dir)
        claim_dirs(cfg, info, self.run_dir, self._locks)  # before anything of it is read, removed or written
        make_run_dirs(cfg, info, self.run_dir)
        setup_logging(info.rank, self.run_dir, cfg.logger.verbose)
        for lock in self._locks:
            if lock.notice is not None:
                log.log(*lock.notice)
        self.mlperf = MlperfLogger(self.run_dir, cfg.logger.mlperf, info.is_main)
        self.mlperf.init_start()

    def _open_metrics(self, resolved: Any) -> None:
        """Start ``metrics.jsonl`` and the other metric sinks; log the MLPerf hyperparameters."""
        cfg, info, opt = self.cfg, self.info, self.cfg.optimizer
        assert info is not None
        self.metrics = MetricsLogger(self.run_dir, info.is_main, cfg.logger, self.total_steps, resolved)
        self.mlperf.hyperparameters(
            global_batch=self.global_batch,
            seed=cfg.seed,
            lr=opt.lr,
            eps=opt.eps,
            warmup=opt.warmup_steps,
            decay_start=opt.decay_start_step,
            decay_steps=opt.decay_steps,
            train_samples=len(self.train_split),
            eval_samples=len(self.val_split),
            sparse_lr=opt.sparse_lr,
        )

    def _resume(self, resume_from: Optional[str]) -> None:
        """Make the :class:`~dlrm.checkpoint.Checkpointer` and restore model, optimizers, schedule, step, RNG and
        the metric window from ``resume_from`` (None: a fresh run); warn when the checkpoint leaves nothing to
        train (the run's last step, or the step where it reached ``eval.target_auc``).

        Raises:
            CheckpointError: the checkpoint is damaged or does not match this run (:meth:`Checkpointer.resume`).
        """
        cfg, info = self.cfg, self.info
        assert info is not None and self.metrics is not None
        self.state.window = MetricWindow(info.device)
        self.ckpt = Checkpointer(
            cfg.checkpoint,
            self.run_dir,
            info,
            self.model,
            self.optimizer,
            self.scheduler,
            RunFacts(self.global_batch, self.steps_per_epoch, self.total_steps, self.model.plan_info, cfg),
        )
        if not self.ckpt.resume(self.state, resume_from):
            return
        self.metrics.advance(self.step)
        self.metrics.resumed(self.step, resume_from)  # the steps after it that metrics.jsonl holds are replayed
        if self.step >= self.total_steps:  # a relaunch of a finished run: nothing to train, and say so
            log.warning(
                "checkpoint %s is at step %d, which is already this run's last (%d: trainer.max_steps / "
                "trainer.epochs): nothing left to train; raise trainer.max_steps (or trainer.epochs) to go on",
                resume_from,
                self.step,
                self.total_steps,
            )
        reached, target = self.state.target_auc_reached, cfg.eval.target_auc
        if self.step < self.total_steps and reached is not None and target is not None and reached >= target:
            self.target_met_before = True  # a relaunch of a run that stopped at its target: the same
            log.warning(
                "checkpoint %s is at step %d, where this run reached eval.target_auc=%s (validation AUC %.5f): "
                "nothing left to train; raise eval.target_auc (or set it to null) to go on",
                resume_from,
                self.step,
                target,
                reached,
            )

    def _write_run_files(self, resolved: Any) -> None:
        """Write ``config.yaml`` and ``plan.json`` (rank 0), only once the resume checks passed: a refused relaunch
        leaves the run's files as they were.

        Raises:
            dlrm.rundir.StorageError: a file cannot be written for want of space.
        """
        info = self.info
        assert info is not None
        if not info.is_main:
            return
        path = os.path.join(self.run_dir, "config.yaml")
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(OmegaConf.to_yaml(resolved))
            path = os.path.join(self.run_dir, "plan.json")
            save_plan(self.model.plan_info, path)
        except OSError as e:
            if not is_storage_fault(e):
                raise
            raise storage_error(path, e, None, "free space there, or give hydra.run.dir on a larger disk") from None

    # ------------------------------------------------------------------------------------------------ train
    def _train_iter(self) -> Iterator[Any]:
        cfg, info = self.cfg, self.info
        assert info is not None
        return TimedIterator(
            data_mod.train_batches(
                self.train_split,
                global_batch=self.global_batch,
                rank=info.rank,
                world_size=info.world_size,
                epochs=cfg.trainer.epochs,
                max_steps=self.total_steps,
                feature_names=FEATURE_NAMES,
                multi_hot=self.multi_hot,
                shuffle=cfg.data.shuffle,
                seed=cfg.seed,
                start_step=self.step,
            )
        )

    def _position(self, step: int) -> str:
        info = self.info
        assert info is not None
        return data_mod.batch_position(
            self.train_split,
            step,
            global_batch=self.global_batch,
            rank=info.rank,
            world_size=info.world_size,
            shuffle=self.cfg.data.shuffle,
        )

    def fit(self) -> Dict[str, Any]:
        """Train up to ``self.total_steps`` steps, validating as configured (and stopping early once
        ``eval.target_auc`` is reached); score the test split at the end. Returns the last validation record.

        Raises:
            FloatingPointError: a non-finite training loss (the message names the step, the batch's position in
                its file on this rank, and the last finite metrics).
        """
        if self.info is None:
            self.setup()
        assert self.info is not None and self.metrics is not None
        it, win, t_start = self._start_fit()
        last_val: Dict[str, Any] = {}
        target_hit = self.target_met_before
        while self.step < self.total_steps and not target_hit:
            self._train_step(it, win)
            if self._at_log_step():
                self._log_window(win, t_start)
            if self._eval_due():
                last_val, target_hit = self._validate(win, t_start)
                if target_hit:
                    break
            # checkpoint: periodic save; SIGTERM saves and ends the run; never a diverged state
            if self.ckpt.after_step(self.state, before_save=lambda: self._check_finite(win)):
                self.metrics.log_line(self.ckpt.preempt_message or "")
                return last_val
        self._finish(win, t_start, target_hit)
        if last_val and self.info.is_main:
            self.metrics.log_line(final_line(last_val, self.step, time.perf_counter() - t_start))
        return last_val

    def _start_fit(self) -> Tuple[TimedIterator, MetricWindow, float]:
        """Open the training batches, restart the metric window's clock, start MLPerf's timed run and the
        profiler. Returns the batches, the window and the run's clock (``time.perf_counter`` at the start)."""
        cfg, info = self.cfg, self.info
        assert info is not None
        it = self._it = self._train_iter()
        win = self.state.window  # a resumed run's holds the unlogged steps of its checkpoint
        assert win is not None
        win.restart_clock()
        self.last_train: Dict[str, Any] = {}
        t_start = time.perf_counter()
        self._window_log = WindowLog(info, self.steps_per_epoch, self.total_steps, self.skip_nonfinite, self.step)
        self.mlperf.run_start()
        self.mlperf.block_start(0.0, 0)
        self.model.train()
        self.profiler = StepProfiler(
            cfg.profile,
            os.path.join(self.run_dir, "profile"),
            info.rank,
            self.model,
            info.device,
            cfg.profile_wait_steps,
            cfg.profile_steps,
        )
        return it, win, t_start

    def _train_step(self, it: TimedIterator, win: MetricWindow) -> None:
        """One optimizer step through the pipeline; then the LR schedule, the step and sample counts and the
        metric window."""
        cfg, info = self.cfg, self.info
        assert info is not None and self.metrics is not None
        self.profiler.begin_step(self.step + 1)
        out = self.pipeline.progress(it)
        self.profiler.end_step()
        self.lr = lr_at(self.step, cfg.optimizer.lr, cfg.optimizer)  # the dense rate this step used
        self.scheduler.step()
        loss, logits, labels = out[0], out[1], out[2]
        self.step += 1
        n = int(labels.shape[0]) * info.world_size
        self.samples_seen += n
        win.add(loss, logits, labels, out[3] if len(out) > 3 else None, n)
        self.metrics.advance()

    def _at_log_step(self) -> bool:
        """Whether the step just taken ends a log window (``logger.log_every_n_steps``, and the last step)."""
        return self.step % self.cfg.logger.log_every_n_steps == 0 or self.step == self.total_steps

    def _eval_due(self) -> bool:
        """Whether a validation is due after the step just taken (``eval.every_n_steps``, ``eval.at_end``)."""
        return bool(self.eval_every and self.step % self.eval_every == 0) or (
            self.cfg.eval.at_end and self.step == self.total_steps
        )

    def _validate(self, win: MetricWindow, t_start: float) -> Tuple[Dict[str, Any], bool]:
        """Validate after the step just taken, outside the training clock and MLPerf's training block. Returns the
        validation record and whether it reached ``eval.target_auc`` (the run stops there)."""
        self._check_finite(win)
        epoch_num = self.step / self.steps_per_epoch
        self.mlperf.block_stop(epoch_num, self.samples_seen)
        win.pause_clock()  # evaluation time is not training time
        last_val = self.evaluate()
        if self._target_reached(last_val, epoch_num, t_start):
            return last_val, True
        if self.step < self.total_steps:
            self.mlperf.block_start(epoch_num, self.samples_seen)
        win.resume_clock()
        return last_val, False

    def _target_reached(self, last_val: Dict[str, Any], epoch_num: float, t_start: float) -> bool:
        """Whether the validation record ``last_val`` reached ``eval.target_auc``; if so, log it and keep it in the
        checkpoint's state."""
        assert self.metrics is not None
        target = self.cfg.eval.target_auc
        # a histogram AUC counts as reached only if the exact one must be: a success MLPerf would accept
        if target is None or last_val["val_auc"] - last_val["val_auc_bound"] < target:
            return False
        self.state.target_auc_reached = last_val["val_auc"] - last_val["val_auc_bound"]
        msg = (
            f"target AUC {target} reached: {last_val['val_auc']:.5f} at step {self.step}, "
            f"{self.samples_seen:,} samples seen ({epoch_num:.3f} epochs), "
            f"{time.perf_counter() - t_start:.1f}s"
        )
        log.info(msg)
        self.metrics.log(
            {"step": self.step, "samples": self.samples_seen, "target_auc": target, "target_reached": True},
            msg,
            kind="val",
        )
        return True

    def _finish(self, win: MetricWindow, t_start: float, target_hit: bool) -> None:
        """After the last step: end MLPerf's timed run (the final checkpoint and the test split come after it) and
        the profiler, check the graphed pipeline's bag sizes, log an early stop's partial window, save the last
        step's checkpoint, and score the test split."""
        self.mlperf.run_stop(success=target_hit or self.cfg.eval.target_auc is None, samples=self.samples_seen)
        self.profiler.close()
        if isinstance(self.pipeline, GraphedTrainPipeline):
            self.pipeline.check_bag_sizes()
        if target_hit and not self.target_met_before and not self._at_log_step():
            self._log_window(win, t_start)  # the early stop's partial window (the loop logs the others)
        self.ckpt.at_end(self.state)  # checkpoint: the last step, if an early stop skipped its periodic save
        if self.test_split is not None:
            self.evaluate(self.test_split, "test")

    def _nonfinite(self, step: int) -> FloatingPointError:
        """The error for a non-finite training loss first seen at ``step`` (1-based)."""
        assert self.info is not None
        return FloatingPointError(
            f"non-finite training loss at step {step} (rank {self.info.rank} batch: {self._position(step)}); "
            f"last finite metrics: {self.last_train or 'none yet'}. Lower optimizer.lr, check that batch's "
            "rows, or set trainer.on_nonfinite=skip_batch to drop batches with non-finite inputs"
        )

    def _check_finite(self, win: MetricWindow) -> None:
        """Raise :meth:`_nonfinite` if a step of the unlogged window diverged (collective)."""
        bad = win.first_nonfinite()
        if bad is not None:
            raise self._nonfinite(self.step - len(win.losses) + 1 + bad)

    def _log_window(self, win: MetricWindow, t_start: float) -> None:
        """Reduce the window over ranks, check it for non-finite losses, and log one record."""
        cfg, info = self.cfg, self.info
        assert info is not None and self.metrics is not None
        stats = win.reduce(cfg.logger.train_auc)
        if stats["bad_steps"]:
            raise self._nonfinite(self.step - stats["steps"] + 1 + stats["bad_steps"][0])
        if stats["skipped"]:
            where = "; ".join(self._position(self.step - stats["steps"] + 1 + i) for i in stats["skipped"][:5])
            log.warning(
                "skipped %d batch(es) with non-finite or out-of-range inputs on rank %d: %s",
                len(stats["skipped"]),
                info.rank,
                where,
            )
        input_s = self._it.take_seconds() if self._it is not None else 0.0
        rec = self._window_log.record(stats, self.step, self.samples_seen, self.lr, input_s, t_start)
        self.metrics.log(rec, window_line(rec, self.total_steps))
        self.last_train = {
            k: round(v, 6) if isinstance(v, float) else v
            for k, v in rec.items()
            if k in ("step", "loss", "train_auc", "lr")
        }
        self.history.append(rec)

    # ------------------------------------------------------------------------------------------------- eval
    def evaluate(self, split: Optional[data_mod.Split] = None, kind: str = "val") -> Dict[str, Any]:
        """Score a split (default: validation) on all ranks; logs and returns ``<kind>_*`` metrics."""
        assert self.metrics is not None
        t0 = time.perf_counter()
        if kind == "val":
            self.mlperf.eval_start(self.step / self.steps_per_epoch, self.samples_seen)
        res = self.scorer.score(split if split is not None else self.val_split, cache=kind == "val")
        rec = eval_record(kind, res, self.step, self.samples_seen, time.perf_counter() - t0)
        self.metrics.log(rec, eval_line(kind, res, self.step, self.total_steps, rec["eval_s"]), kind=kind)
        if kind == "val":
            self.mlperf.eval(self.step / self.steps_per_epoch, res["auc"], self.samples_seen)
        self.history.append(rec)
        return rec

    # ------------------------------------------------------------------------------------------------ close
    def close(self) -> None:
        """Shut down in order, on every exit path: the profiler, the loader's background thread, the last async
        checkpoint write, the metric sinks, the ownership of the run directory (the process groups go last, in
        ``dlrm.process_group.shutdown``). A failed last async save (a full disk) is raised after the rest is closed."""
        if getattr(self, "profiler", None) is not None:
            self.profiler.close()  # an exception mid-run: stop profiling, drop the hooks
        if getattr(self, "_it", None) is not None:
            self._it.close()  # stops and joins the loader's prefetch thread
            self._it = None
        try:
            if getattr(self, "ckpt", None) is not None:
                self.ckpt.close()  # checkpoint: wait for the last async save to be written and published
        finally:
            if self.metrics is not None:
                self.metrics.close()
            for lock in self._locks:  # last: the run's files are complete
                lock.release()
            self._locks = []
