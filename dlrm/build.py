"""Build the training stack from the config: model, plan and DMP, the ``perf.*`` levers, the optimizers, the LR
schedule and the pipeline (:func:`build_training`), exactly as :class:`dlrm.trainer.Trainer` runs them; the step
benchmarks (``bench/throughput.py``) time this same stack and swap one piece of it through :class:`BuildHooks`.
:func:`log_built` logs what was built: the model, the perf levers, the plan and its step traffic.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer

from dlrm.config import Config
from dlrm.errors import ConfigError
from dlrm.graphed import check_graphed, use_capture_stream
from dlrm.model import FEATURE_NAMES, DLRMTrain, build_model, table_configs
from dlrm.offload import offload_constraints
from dlrm.perf import PerfSetup, apply_device_settings, apply_perf, check_perf_device, compile_dense, perf_line
from dlrm.pipeline import build_pipeline
from dlrm.process_group import DistInfo
from dlrm.schedule import make_scheduler
from dlrm.sharding import dense_optimizer, format_plan, fused_params_of, seed_tables, shard, sharding_types_of
from dlrm.traffic import model_traffic
from dlrm.traffic_report import traffic_report

log = logging.getLogger("dlrm.trainer")  # the trainer's build: its lines keep the trainer's logger name


@dataclass
class BuildHooks:
    """Where :func:`build_training` lets a caller swap one piece of the stack (benchmarks A/B a code change this
    way, with everything else built exactly as the trainer builds it).

    Fields:
        model: called with the unsharded model before it is planned (e.g. to replace a submodule).
        compile_dense: what compiles the dense step under ``perf.compile`` (:func:`dlrm.perf.compile_dense`).
    """

    model: Optional[Callable[[DLRMTrain], None]] = None
    compile_dense: Callable[..., List[str]] = compile_dense


@dataclass
class Built:
    """What :func:`build_training` returns."""

    unsharded: torch.nn.Module  # the model as built (tables on meta: DMP materialised the local shards)
    model: DistributedModelParallel
    plan: ShardingPlan
    optimizer: CombinedOptimizer  # the fused TBE optimizers plus the dense one
    scheduler: Any
    pipeline: Any
    perf: PerfSetup  # what the perf levers switched on
    dense: Any = None  # the optimizer of the parameters not fused into the TBE backward (part of ``optimizer``)


def build_training(
    cfg: Config,
    info: DistInfo,
    batch_size: int,
    skip_nonfinite: bool = False,
    hooks: Optional[BuildHooks] = None,
    init_tables: bool = True,
    checked: bool = False,
) -> Built:
    """Model, plan, DMP, perf levers, optimizers, LR schedule and pipeline, exactly as the trainer runs them (the
    step benchmark, ``bench/throughput.py``, times this same stack).

    Args:
        cfg: the whole config.
        info: this process's rank, world size and device (:func:`dlrm.process_group.init_distributed`).
        batch_size: samples per rank per step (the planner's batch size).
        skip_nonfinite: ``trainer.on_nonfinite=skip_batch``.
        hooks: pieces to swap (:class:`BuildHooks`); None: the trainer's own.
        init_tables: give every table its initial weights from ``seed`` alone (:func:`dlrm.sharding.seed_tables`),
            the same for every plan and world size; false when a checkpoint will overwrite them.
        checked: the caller ran :func:`dlrm.startup.check_device_and_world` already (the trainer's pre-flight
            does); false: the perf and ``pipeline=graphed`` device checks run here.

    Raises:
        ConfigError: a ``perf.*`` setting this device cannot run.
        PlanError: see :func:`dlrm.sharding.plan_model`.
    """
    hooks = hooks or BuildHooks()
    perf = cfg.perf
    if not checked:  # the checks the stack's own build needs (the trainer's pre-flight runs them and more)
        check_perf_device(perf, info.device)
        check_graphed(cfg, info.world_size, info.device)
    apply_device_settings(perf, info.device)
    if cfg.pipeline.name == "graphed":
        use_capture_stream(info.device)  # before DDP binds the gradients' accumulation to the current stream
    # model
    model = build_model(cfg.model, dense_device=info.device, skip_nonfinite=skip_nonfinite, perf=perf)
    if hooks.model is not None:
        hooks.model(model)
    # plan and DMP
    pooling = {
        f"t_{f}": float(m if cfg.data.multi_hot else 1) for f, m in zip(FEATURE_NAMES, cfg.model.multi_hot_sizes)
    }
    tables = table_configs(cfg.model, perf.embedding_dtype)
    dmp, plan = shard(
        model,
        info,
        cfg.sharding,
        cfg.optimizer,
        batch_size,
        pooling,
        constraint_hook=lambda c: offload_constraints(cfg.offload, tables, base=c),
        fused_params=fused_params_of(perf.embedding_output_dtype, perf.tbe_bounds_check, perf.tbe_stochastic_rounding),
        allreduce_dtype=perf.allreduce_dtype,
        ddp_bucket_cap_mb=perf.ddp_bucket_cap_mb,
    )
    if init_tables:
        t0 = time.perf_counter()
        n = seed_tables(dmp, tables, cfg.seed)
        log.info(
            "initial tables from seed %d (the same for every plan): %d shard(s) on this rank in %.1fs",
            cfg.seed,
            n,
            time.perf_counter() - t0,
        )
    # perf levers on the sharded model
    perf_setup = apply_perf(dmp, plan, perf, info.world_size, compile_fn=hooks.compile_dense)
    # optimizers and schedule
    dense = dense_optimizer(dmp, cfg.optimizer)  # MLPs, and data_parallel tables
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
    scheduler = make_scheduler(optimizer, cfg.optimizer)
    _check_planned(cfg, info, plan)
    # pipeline: semi_sync steps the dense optimizer only (the tables' fused optimizer runs in the TBE backward;
    # its step only hands a changed rate to the TBE, and Config refuses a schedule with semi_sync)
    pipeline = build_pipeline(
        dmp, dense if cfg.pipeline.name == "semi_sync" else optimizer, info.device, cfg.pipeline, dense=dense
    )
    return Built(model, dmp, plan, optimizer, scheduler, pipeline, perf_setup, dense)


def _check_planned(cfg: Config, info: DistInfo, plan: ShardingPlan) -> None:
    """The ``pipeline=graphed`` rules that depend on the planner's choice of sharding types.

    Raises:
        ConfigError: a sharding type the graph cannot run on this world, or data_parallel tables with an
            optimizer other than Adagrad (the graph steps them with element-wise Adagrad).
    """
    check_graphed(cfg, info.world_size, info.device, sharding_types_of(plan))  # the planner's choice too
    # data_parallel tables are stepped by the dense optimizer, which the graph replaces by element-wise Adagrad
    dp_tables = "data_parallel" in sharding_types_of(plan)
    if cfg.pipeline.name == "graphed" and cfg.optimizer.sparse_type != "adagrad" and dp_tables:
        raise ConfigError(
            "config key `pipeline.name`: pipeline=graphed steps data_parallel tables with element-wise Adagrad "
            f"only, but optimizer.sparse_type={cfg.optimizer.sparse_type}; use optimizer.sparse_type=adagrad, a "
            "plan without data_parallel tables, or pipeline=sparse_dist"
        )


def log_built(cfg: Config, info: DistInfo, built: Built, batch_size: int) -> None:
    """Log the model, the perf levers, and on rank 0 the plan (a summary line; the tables at detail level) and its
    step traffic for ``batch_size`` samples per rank (:func:`dlrm.traffic.model_traffic`)."""
    n_params = sum(p.numel() for p in built.unsharded.parameters())
    log.info(
        "model %s (%s interaction), %.2f M parameters on rank 0 incl. local shards; world %d on %s (%s)",
        cfg.model.name,
        cfg.model.interaction,
        n_params / 1e6,
        info.world_size,
        info.device,
        info.backend,
    )
    log.info("%s", perf_line(cfg.perf, built.perf, info.world_size, info.device, cfg.model.interaction == "dcn"))
    if info.is_main:
        log.info("%s", plan_summary(built.model.plan_info))
        log.info("%s", format_plan(built.model.plan_info), extra={"detail": True})
        traffic = model_traffic(
            cfg,
            built.plan,
            built.unsharded,
            world_size=info.world_size,
            local_world_size=info.local_world_size,
            batch_size=batch_size,
        )
        log.info("%s", traffic_report(traffic, info.device.type), extra={"detail": True})


def plan_summary(pi: Any) -> str:
    """One line for stdout: the tables per sharding type and kernel, and where the full plan is."""
    kinds: Dict[str, set] = {}
    for sh in pi.shards:
        kinds.setdefault(f"{sh['sharding_type']} {sh['compute_kernel']}", set()).add(sh["table"])
    types = ", ".join(f"{len(t)} {k}" for k, t in sorted(kinds.items(), key=lambda kv: -len(kv[1])))
    return (
        f"sharding plan ({pi.source}) for {pi.world_size} rank{'s' * (pi.world_size != 1)}: tables {types}; the "
        "plan and step-traffic tables are in train.log and plan.json (logger.verbose=true prints them here)"
    )
