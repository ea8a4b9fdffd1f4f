"""The ``perf.*`` levers, wired in one place: device checks, TF32, the lean output dist and the held all-reduce,
``torch.compile`` of the dense step, and the start-up line that says what is on.

What each lever does lives beside the code it changes: the table and pooled-embedding dtypes in the sharder's
fused params (:func:`dlrm.sharding.fused_params_of`), autocast and the bf16 DCN stream in the model
(:func:`dlrm.model.build_model`), the lean output dist in :mod:`dlrm.output_dist`, the held all-reduce in
:class:`dlrm.comms.AllReduceAfterOutputDist`. :func:`dlrm.build.build_training` calls, in order::

    check_perf_device(perf, device)          # refuse what this device cannot run, before any data loads
    apply_device_settings(perf, device)      # TF32
    ... build the model, plan, DMP ...
    setup = apply_perf(dmp, plan, perf, world_size)   # lean output dist, held all-reduce, compile
    log.info(perf_line(perf, setup, ...))
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
from torch.nn.parallel import DistributedDataParallel
from torchrec.distributed.types import ShardingPlan

from dlrm import torchrec_compat as compat
from dlrm.comms import AllReduceAfterOutputDist
from dlrm.config import PerfConfig
from dlrm.errors import ConfigError
from dlrm.model import DLRMTrainAutocast, ZeroCopySparseArch
from dlrm.output_dist import use_lean_output_dist
from dlrm.sharding import sharding_types_of

log = logging.getLogger(__name__)

DENSE_MODULES = ("dense_arch", "inter_arch", "over_arch")
# sharding types whose output dist sends pooled embeddings with an all-to-all on one host
# (table_row_wise / grid_shard only across hosts)
_POOLED_ALL_TO_ALL_TYPES = ("table_wise", "column_wise", "table_column_wise")


def check_perf_device(perf: PerfConfig, device: torch.device) -> None:
    """Refuse ``perf.*`` settings this device cannot run, before any data is loaded.

    Raises:
        ConfigError: bf16 pooled embeddings on CPU (FBGEMM's CPU TBE kernels have no bf16 output); a bf16
            all-reduce on CPU (PyTorch's ``bf16_compress_hook`` needs CUDA and NCCL).
    """
    if device.type != "cpu":
        return
    if perf.allreduce_dtype == "bf16":
        raise ConfigError(
            "config key `perf.allreduce_dtype`: PyTorch's bf16_compress_hook needs CUDA and NCCL; "
            "use fp16 or fp32 on CPU"
        )
    if perf.embedding_output_dtype == "bf16":
        # fp16 pooled embeddings cannot meet bf16 autocast (PerfConfig), so name the one value that works then
        fix = "fp32 on CPU (fp16 too, without bf16 autocast)" if perf.autocast == "bf16" else "fp16 or fp32 on CPU"
        raise ConfigError(
            f"config key `perf.embedding_output_dtype`: FBGEMM's CPU TBE kernels have no bf16; use {fix} "
            "(perf=fast is for CUDA: on CPU add perf.embedding_output_dtype=fp32)"
        )


def apply_device_settings(perf: PerfConfig, device: torch.device) -> None:
    """``perf.tf32`` on CUDA (process-wide matmul and cuDNN settings); nothing on CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = perf.tf32
        torch.backends.cudnn.allow_tf32 = perf.tf32


def compile_dense(train_model: DLRMTrainAutocast, mode: str = "default", ddp_split: bool = True) -> List[str]:
    """``torch.compile`` everything after the lookup as one compiled region (``perf.compile``): the dense arch,
    the interaction, the over arch and the loss (:meth:`dlrm.model.DLRMTrainAutocast.dense_step`).

    One graph rather than one per module lets Inductor fuse across the modules' boundaries (the casts autocast
    adds between them, the loss). The modules themselves are not wrapped, so parameter names, DMP, DDP, the
    optimizers and checkpoints see the same model. TorchRec's pipelines fx-trace the model once to find the sparse
    arch's inputs; that trace runs the uncompiled code.

    Under DDP (TorchRec wraps the dense modules in DDP, on one rank too) dynamo splits the graph at DDP's
    gradient buckets by default (``ddp_split``, ``perf.compile_ddp_split``), so each bucket's all-reduce can start
    while the rest of the backward runs; ``ddp_split=False`` compiles one graph, forward and backward. The setting
    is process-wide and read when the step first compiles; dynamo is reset first, so every build compiles under
    its own settings (:func:`dlrm.torchrec_compat.set_dynamo_for_compiled_step`).

    Args:
        train_model: the unwrapped :class:`dlrm.model.DLRMTrainAutocast` (``dmp.module``).
        mode: ``torch.compile`` mode (``perf.compile_mode``: ``default`` or ``max-autotune-no-cudagraphs``).
        ddp_split: split the compiled step at DDP's gradient buckets.

    Returns:
        What was compiled: ``["model.dense_arch", "model.inter_arch", "model.over_arch", "loss"]``.
    """
    compat.set_dynamo_for_compiled_step(ddp_split)
    train_model.compiled_step = torch.compile(train_model.dense_step, mode=None if mode == "default" else mode)
    train_model.compiled_parts = [
        f"model.{n}" for n in DENSE_MODULES if getattr(train_model.model, n, None) is not None
    ] + ["loss"]
    log.info(
        "torch.compile (mode %s): %s as one region, %s",
        mode,
        ", ".join(train_model.compiled_parts),
        "split at DDP's gradient buckets (one piece where the dense side fits one bucket)"
        if ddp_split
        else "one unsplit graph",
    )
    return train_model.compiled_parts


@dataclass
class PerfSetup:
    """What :func:`apply_perf` switched on."""

    lean_output_dists: int = 0  # output dists sending through dlrm.output_dist (0: TorchRec's)
    rank_blocks: bool = False  # pooled embeddings handed over as received (every table table_wise)
    held_allreduce: Optional[AllReduceAfterOutputDist] = None  # perf.allreduce_after_output_dist's DDP hook
    compiled: Optional[List[str]] = None  # perf.compile: what was compiled


def apply_perf(
    dmp: torch.nn.Module,
    plan: ShardingPlan,
    perf: PerfConfig,
    world_size: int,
    compile_fn: Callable[..., List[str]] = compile_dense,
) -> PerfSetup:
    """Switch on the levers that act on the sharded model: the lean output dist and the held all-reduce (several
    ranks only: one rank has no all-to-all) and ``torch.compile`` of the dense step.

    Args:
        dmp: the ``DistributedModelParallel`` model (its ``module`` is the trainer's ``DLRMTrain``).
        plan: its sharding plan.
        perf: the ``perf`` config.
        world_size: ranks in the job.
        compile_fn: what compiles the dense step (:func:`compile_dense`; a benchmark may pass another).

    Raises:
        RuntimeError: a switch would do nothing where it should act: ``perf.lean_output_dist`` on a plan with
            table_wise / column_wise tables over several ranks finds no TorchRec output dist to switch, or
            ``perf.allreduce_after_output_dist`` finds no DDP module to hook.
    """
    setup = PerfSetup()
    train_model = dmp.module
    if perf.lean_output_dist and world_size > 1:
        types = sharding_types_of(plan)
        # rank blocks (no cat, no regrouping pass: the sparse arch gathers inside the dense step) need the sparse
        # arch that gathers them and whole tables per rank
        setup.rank_blocks = isinstance(train_model.model.sparse_arch, ZeroCopySparseArch) and all(
            t == "table_wise" for t in types
        )
        held = None
        if perf.allreduce_after_output_dist:
            ddp = next((m for m in dmp.modules() if isinstance(m, DistributedDataParallel)), None)
            if ddp is None:
                raise RuntimeError(
                    "perf.allreduce_after_output_dist: the sharded model has no DDP module whose "
                    "all-reduce could be held; set perf.allreduce_after_output_dist=false"
                )
            held = AllReduceAfterOutputDist(ddp.process_group, bool(getattr(ddp, "static_graph", False)))
        setup.lean_output_dists = use_lean_output_dist(dmp, rank_blocks=setup.rank_blocks, a2a_listener=held)
        expected = sorted({t for t in types if t in _POOLED_ALL_TO_ALL_TYPES})
        if expected and not setup.lean_output_dists:
            raise RuntimeError(
                f"perf.lean_output_dist: the plan has {'/'.join(expected)} tables on {world_size} ranks, but no "
                "TorchRec output dist sending their pooled embeddings was found to switch; this TorchRec version "
                "builds output dists differently (dlrm/torchrec_compat.py), or set perf.lean_output_dist=false"
            )
        if held is not None and setup.lean_output_dists:
            ddp.register_comm_hook(None, held.hook)
            setup.held_allreduce = held
            log.info(
                "perf.allreduce_after_output_dist: DDP's all-reduce is issued after the %d backward "
                "all-to-all(s) of the pooled embeddings",
                setup.lean_output_dists,
            )
        log.info(
            "perf.lean_output_dist: %d output dist(s) send pooled embeddings without TorchRec's staging copy, %s%s",
            setup.lean_output_dists,
            "handed over as received (the dense step gathers the features from the rank blocks and returns "
            "their gradient in that layout)"
            if setup.rank_blocks
            else "and regroup and divide the gradient in one pass",
            ""
            if setup.lean_output_dists
            else " (none here: no table_wise or column_wise tables, nor table_row_wise / grid_shard across hosts)",
        )
    if perf.compile:
        setup.compiled = compile_fn(train_model, perf.compile_mode, perf.compile_ddp_split)
    return setup


def perf_line(perf: PerfConfig, setup: PerfSetup, world_size: int, device: torch.device, has_dcn: bool) -> str:
    """The start-up line that says which levers are on, as they apply to this run."""
    dcn = "n/a (no DCN)" if not has_dcn else perf.autocast if perf.dcn_residual_dtype == "autocast" else "fp32"
    if perf.compile:
        graph = "split at DDP buckets" if perf.compile_ddp_split else "one unsplit graph"
        compiled = f"on (mode {perf.compile_mode}, {graph})"
    else:
        compiled = "off"
    if world_size == 1:
        allreduce, output_dist = "none (one rank)", "torchrec (one rank: no all-to-all)"
    else:
        held = " after the backward all-to-all" if setup.held_allreduce is not None else ""
        allreduce = f"{perf.allreduce_dtype}{held}"
        output_dist = ("lean, rank blocks" if setup.rank_blocks else "lean") if setup.lean_output_dists else "torchrec"
    rounding = "" if perf.tbe_stochastic_rounding else " (updates rounded to nearest)"
    return (
        f"perf {perf.name}: tables {perf.embedding_dtype}{rounding}, pooled embeddings {perf.embedding_output_dtype}, "
        f"autocast {perf.autocast} (DCN residual stream {dcn}), "
        f"tf32 {perf.tf32 if device.type == 'cuda' else 'n/a (cpu)'}, compile {compiled}, "
        f"TBE bounds check {perf.tbe_bounds_check}, all-reduce {allreduce}, DDP buckets "
        f"{perf.ddp_bucket_cap_mb} MiB, output dist {output_dist}"
    )
