"""The phases of :meth:`dlrm.trainer.Trainer.setup`, in the order it runs them; each returns a small record.

1. :func:`preflight`: join the process group and run every device and world check once.
2. :func:`batching`: the batch sizes per rank and over all ranks.
3. :func:`choose_resume`: the checkpoint to resume from, verified before the data is read.
4. :func:`load_data`: the splits and the multi-hot expansion, placed where batches are assembled.
5. :func:`run_length`: steps per epoch and to run, the validation cadence, the AUC method.
6. :func:`planning_config`: the config the stack is planned from (HBM left by the data, a checkpoint's plan).

The trainer then builds the stack (:func:`dlrm.build.build_training`), opens its sinks and restores the
checkpoint. Between phases 1 and 2 the run directory is settled: :func:`agree_run_dir` (rank 0's everywhere),
:func:`claim_dirs` (owned through :mod:`dlrm.rundir`, before anything of it is read, removed or written) and
:func:`make_run_dirs` (it and the sinks' directories).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from dlrm import data as data_mod
from dlrm.checkpoint import checkpoint_root, choose_checkpoint, planning_inputs, saved_plan
from dlrm.config import Config, per_rank_batch
from dlrm.errors import ConfigError
from dlrm.graphed import check_graphed
from dlrm.metrics import EXACT_AUC_MAX_ROWS
from dlrm.offload import check_can_train
from dlrm.perf import check_perf_device
from dlrm.pipeline import check_pipeline_device
from dlrm.process_group import DistInfo, init_distributed
from dlrm.rundir import DirLock, claim_run, make_dir

log = logging.getLogger("dlrm.trainer")  # the trainer's start-up: its lines keep the trainer's logger name


def check_device_and_world(cfg: Config, info: DistInfo) -> None:
    """Every config rule that needs the device or the world size and can be checked before the data is read: the
    offload (needs CUDA), the perf levers (bf16 TBE kernels), the stream-based pipelines and ``pipeline=graphed``.

    Raises:
        ConfigError: a setting this device or world cannot run (the key and the fix named).
    """
    check_can_train(cfg.offload, info.device)  # before loading data: offload needs CUDA
    check_perf_device(cfg.perf, info.device)  # and bf16 TBE kernels too
    check_pipeline_device(cfg.pipeline, info.device)  # and the stream-based pipelines
    check_graphed(cfg, info.world_size, info.device)


def preflight(cfg: Config) -> DistInfo:
    """Join the process group (:func:`dlrm.process_group.init_distributed`) and run the device and world checks once
    (:func:`check_device_and_world`), before the run directory is claimed or any data is read.

    Raises:
        ConfigError: a launch environment that cannot work, or a setting this device or world cannot run.
    """
    info = init_distributed(cfg.device)
    check_device_and_world(cfg, info)
    return info


@dataclass
class Batching:
    """Samples per step: ``batch_size`` per rank, ``global_batch`` over all ranks, ``eval_batch_size`` per rank."""

    batch_size: int
    global_batch: int
    eval_batch_size: int


def batching(cfg: Config, world_size: int) -> Batching:
    """The batch sizes of a run on ``world_size`` ranks (:func:`dlrm.config.per_rank_batch`; ``eval.batch_size``
    null: the training batch).

    Raises:
        ConfigError: ``data.global_batch_size`` does not divide over the ranks, or disagrees with ``data.batch_size``.
    """
    batch = per_rank_batch(cfg.data, world_size)
    return Batching(batch, batch * world_size, cfg.eval.batch_size or batch)


def choose_resume(cfg: Config, run_dir: str, info: DistInfo) -> Optional[str]:
    """The checkpoint to resume from (None: a fresh run), chosen and verified before the data is read (a wrong
    path is reported at once, not after loading it) and before planning (its saved plan may be reused, and its
    tables replace the initial ones); ``sharding.plan_path`` is checked to exist here too.

    Raises:
        ConfigError: ``checkpoint.dir`` is a file; ``checkpoint.resume`` names no checkpoint, or is ``none`` where
            checkpoints are (:func:`dlrm.checkpoint.choose_checkpoint`); ``sharding.plan_path`` is missing or a
            directory.
        CheckpointError: the chosen checkpoint is damaged.
    """
    root = checkpoint_root(cfg.checkpoint, run_dir)
    if os.path.exists(root) and not os.path.isdir(root):  # else the first save would fail after training
        raise ConfigError(f"config key `checkpoint.dir`: {root} is a file; give a directory")
    resume_from = choose_checkpoint(cfg.checkpoint, root, info)
    plan_path = cfg.sharding.plan_path
    if plan_path and not os.path.isfile(plan_path):  # read after the data; its contents are checked there
        what = "is a directory" if os.path.isdir(plan_path) else f"does not exist (cwd {os.getcwd()})"
        raise ConfigError(
            f"config key `sharding.plan_path`: {plan_path} {what}; give a plan.json written by python -m "
            "dlrm.plan or a run's <run_dir>/plan.json"
        )
    return resume_from


@dataclass
class RunData:
    """The splits (each a :class:`dlrm.data.source.Source`; ``test`` None without a test split), the multi-hot
    expansion (None: one-hot ids) and the bytes of them kept on the GPU (0: all in host memory), which the
    planner's HBM budget leaves out."""

    train: Any
    val: Any
    test: Any
    multi_hot: Any
    device_bytes: int = 0


def load_data(cfg: Config, device: torch.device) -> RunData:
    """Load the splits (:func:`dlrm.data.load_splits`) and the multi-hot expansion, and place them where batches
    are assembled (``data.assemble_on_device``) or expanded (``data.multi_hot_on_device``).

    Raises:
        InputError: a bad data file (``TsvFormatError``, ``BinaryFormatError``) or data config.
        FileNotFoundError: a data file named by the config does not exist.
    """
    train, val, test = data_mod.load_splits(cfg.data, cfg.model, cfg.seed)
    d = RunData(train, val, test, data_mod.make_multi_hot(cfg.data, cfg.model))
    where = data_mod.assemble_on(cfg.data, device)
    if where.type != "cpu":  # the host then only slices indices; the KJT is built on the device
        d.train, d.val = d.train.to(where), d.val.to(where)
        d.test = d.test.to(where) if d.test is not None else None
        if d.multi_hot is not None:
            d.multi_hot = d.multi_hot.to(where)
        torch.cuda.synchronize(where)  # the pipeline reads them on its own streams
        d.device_bytes = sum(
            s.dense.nbytes + s.ids.nbytes + s.labels.nbytes for s in (d.train, d.val, d.test) if s is not None
        ) + (d.multi_hot.nbytes() if d.multi_hot is not None else 0)
        log.info(
            "batches are assembled on %s from the splits and expansion tables kept there (%.2f GB, left "
            "out of the planner's HBM)",
            where,
            d.device_bytes / 1e9,
        )
    elif cfg.data.name == "criteo_binary" and d.multi_hot is not None:
        on = data_mod.expand_on(cfg.data, device)
        if on is not None:
            d.multi_hot = d.multi_hot.to(on)
            if on.type != "cpu":
                d.device_bytes = d.multi_hot.device_nbytes()
        if d.device_bytes:
            log.info(
                "on-the-fly multi-hot expanded on %s from expansion tables kept there (%.2f GB, left out of the "
                "planner's HBM)",
                device,
                d.device_bytes / 1e9,
            )
    return d


@dataclass
class RunLength:
    """Steps per epoch and to run, validation every ``eval_every`` steps (0: at the end only), the AUC method."""

    steps_per_epoch: int
    total_steps: int
    eval_every: int
    auc_method: str


def run_length(cfg: Config, n_train: int, n_val: int, global_batch: int, world_size: int) -> RunLength:
    """How long the run trains (``trainer.epochs``, ``trainer.max_steps``) and how often it validates
    (``eval.every_n_steps``, or ``eval.per_epoch`` times an epoch), for ``n_train`` training and ``n_val``
    validation rows.

    Raises:
        ConfigError: fewer training rows than ranks; ``profile=true`` recording steps past the run's end.
    """
    steps_per_epoch = data_mod.steps_per_epoch(n_train, global_batch, world_size)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"config key `data.train_path` / `data.num_train_samples`: the training split has "
            f"{n_train} rows, fewer than the world size ({world_size}); give more rows"
        )
    total = steps_per_epoch * cfg.trainer.epochs
    total_steps = min(total, cfg.trainer.max_steps) if cfg.trainer.max_steps else total
    last = cfg.profile_wait_steps + 1 + cfg.profile_steps  # StepProfiler records steps wait + 2 .. last
    if cfg.profile and total_steps < last:
        raise ConfigError(
            f"config key `profile_steps`: profile=true records steps {cfg.profile_wait_steps + 2}-{last}, but this "
            f"run trains {total_steps}; lower profile_wait_steps / profile_steps, or train longer"
        )
    ev = cfg.eval
    # per_epoch: the MLPerf reference's floor(rows / (global batch * per_epoch)), not from the rounded-up epoch
    per = max(1, n_train // (global_batch * ev.per_epoch)) if ev.per_epoch else 0
    auc = ev.auc_method if ev.auc_method != "auto" else ("exact" if n_val <= EXACT_AUC_MAX_ROWS else "histogram")
    return RunLength(steps_per_epoch, total_steps, ev.every_n_steps or per, auc)


def planning_config(
    cfg: Config, info: DistInfo, device_data_bytes: int, resume_from: Optional[str], global_batch: int
) -> Config:
    """The config the stack is planned and built from: ``cfg`` with the HBM the data on the device leaves
    (``sharding.hbm_cap_gb``), and, on resuming, the checkpoint's saved plan as ``sharding.plan_path`` when this
    job has the layout it was planned for (:func:`dlrm.checkpoint.saved_plan`).

    Raises:
        ConfigError: the data kept on the device fills its HBM.
    """
    build_cfg = cfg
    if device_data_bytes:  # the planner may use what the data on the device leaves of its HBM
        hbm = cfg.sharding.hbm_cap_gb or torch.cuda.get_device_properties(info.device).total_memory / 2**30
        if device_data_bytes / 2**30 >= hbm:
            raise ConfigError(
                f"config key `data.assemble_on_device` / `data.multi_hot_on_device`: the data kept on "
                f"{info.device} ({device_data_bytes / 2**30:.1f} GiB) fills its {hbm:.1f} GiB of HBM before "
                "any table; set both to false to keep the data in host memory"
            )
        build_cfg = dataclasses.replace(
            cfg, sharding=dataclasses.replace(cfg.sharding, hbm_cap_gb=hbm - device_data_bytes / 2**30)
        )
    if resume_from is not None and cfg.sharding.plan_path is None:
        plan_path = saved_plan(resume_from, info, planning_inputs(cfg, global_batch))
        if plan_path is not None:
            build_cfg = dataclasses.replace(
                build_cfg, sharding=dataclasses.replace(build_cfg.sharding, plan_path=plan_path)
            )
    return build_cfg


def agree_run_dir(run_dir: str) -> str:
    """Use rank 0's run directory everywhere; remove the empty one another rank's Hydra made (its
    timestamp can differ by a second)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return run_dir
    obj = [run_dir]
    dist.broadcast_object_list(obj, src=0)
    if obj[0] != run_dir and os.path.isdir(run_dir):
        try:
            os.rmdir(run_dir)
        except OSError:
            pass
    return obj[0]


def claim_dirs(cfg: Config, info: DistInfo, run_dir: str, locks: List[DirLock]) -> None:
    """Own the run directory (and ``checkpoint.dir`` outside it) for this run (:func:`dlrm.rundir.claim_run`):
    rank 0 decides and every rank raises its verdict together, so no rank waits on a peer that stopped. The
    locks go into ``locks`` as soon as they are taken, so the caller releases them on every exit path.

    Raises:
        ConfigError: a live run owns the directory (naming its host, pid and start time), or it, or a
            ``checkpoint.dir`` this run would save to, cannot be written.
    """
    ck = cfg.checkpoint
    verdict: Optional[str] = None
    if info.is_main:
        saves = bool(ck.every_n_steps) or ck.save_on_sigterm
        try:
            locks[:] = claim_run(run_dir, checkpoint_root(ck, run_dir), saves, os.environ)
        except ConfigError as e:
            verdict = str(e)
    if dist.is_initialized() and info.world_size > 1:
        box = [verdict]
        dist.broadcast_object_list(box, src=0)
        verdict = box[0]
    if verdict is not None:
        raise ConfigError(verdict)


def make_run_dirs(cfg: Config, info: DistInfo, run_dir: str) -> None:
    """Make the run directory (rank 0) and the sinks' own directories (every rank, so none waits on a rank that
    stopped), now rather than after planning.

    Raises:
        ConfigError: a sink's directory cannot be made (``logger.tensorboard.dir``, ``logger.mlperf.file``).
    """
    if info.is_main:
        os.makedirs(run_dir, exist_ok=True)
    for key, sub, on in (
        ("logger.tensorboard.dir", cfg.logger.tensorboard.dir, cfg.logger.tensorboard.enabled),
        ("logger.mlperf.file", os.path.dirname(cfg.logger.mlperf.file), cfg.logger.mlperf.enabled),
    ):
        if on and sub:
            path = os.path.join(run_dir, sub)
            make_dir(path, f"config key `{key}`: cannot make {path}", "give a writable path", ConfigError)
