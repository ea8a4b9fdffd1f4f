"""Build the training pipeline (``pipeline=sparse_dist|fused_sparse_dist|semi_sync|prefetch|base|graphed``,
``pipeline.input_dist_group``; ``graphed`` is :mod:`dlrm.graphed`).

The pipelines are TorchRec's, used as they are:

* ``sparse_dist``: ``TrainPipelineSparseDist``: batch i+1's host-to-device copy (memcpy stream) and KJT input
  dist (data-dist stream) overlap batch i's forward/backward.
* ``fused_sparse_dist``: ``TrainPipelineFusedSparseDist``: as ``sparse_dist``, and batch i+1's embedding lookup
  and output dist are issued on the data-dist stream before its forward, so on the GPU they overlap batch i's
  dense optimizer step. Same numerics: the fused TBE has already updated the tables in backward, and the lookup
  does not read the dense weights. CUDA only.
* ``semi_sync``: ``TrainPipelineSemiSync``: batch i+1's embedding lookup and output-dist all-to-all are issued
  right after batch i's forward, so the all-to-all runs beside batch i's dense backward. Not the same numerics:
  batch i+1 reads the tables before batch i's update (one step stale; the dense weights are not stale). From
  batch ``pipeline.semi_sync_start_batch`` on; before it, each step ends with a device synchronize (TorchRec's
  synchronous warm-up). The pipeline gets the dense optimizer only: the fused TBE optimizer updates the tables in
  the embedding backward, and TorchRec warns about an optimizer that holds the pipelined tables. CUDA only.
* ``prefetch``: ``PrefetchTrainPipelineSparseDist``: also prefetches batch i+1's rows into the
  ``fused_uvm_caching`` HBM cache on a prefetch stream; for ``offload=uvm_caching``.
* ``base``: ``TrainPipelineBase``: no overlap (debugging, A/B checks).
* ``graphed``: :class:`dlrm.graphed.GraphedTrainPipeline` (not TorchRec's): fixed bag sizes; the step after the
  input dist (on several ranks with it: the ids all-to-all with fixed splits) is captured once and replayed as one
  CUDA graph, for batch sizes where issuing the step takes the host longer than the GPU needs to run it. CUDA.

Only the constructor arguments ``(model, optimizer, device)`` are passed (plus ``execute_all_batches=True`` for
the sparse-dist ones, so the last, possibly partial, batch is trained, and ``start_batch`` for ``semi_sync``): they
exist unchanged in torchrec 1.3 through 1.8, whereas later arguments (``enqueue_batch_after_forward``,
``free_features_storage_early``, ...) do not exist in torchrec 1.6.1.

With ``pipeline.input_dist_group=dedicated`` the input dist's all-to-alls go to one extra process group
(:mod:`dlrm.comms`).

Example::

    pipe = build_pipeline(dmp_model, optimizer, device, PipelineConfig(name="sparse_dist",
                                                                      input_dist_group="dedicated"))
    while True:
        out = pipe.progress(batch_iterator)   # raises StopIteration after the last batch
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Type, Union

import torch
from torchrec.distributed.train_pipeline import (
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelineSparseDist,
)
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync  # not re-exported in 1.6

from dlrm.comms import input_dist_group, use_group_for_input_dist
from dlrm.config import PipelineConfig
from dlrm.errors import ConfigError
from dlrm.graphed import GraphedTrainPipeline

log = logging.getLogger(__name__)

PIPELINES: Dict[str, Type[TrainPipeline]] = {
    "sparse_dist": TrainPipelineSparseDist,
    "fused_sparse_dist": TrainPipelineFusedSparseDist,
    "semi_sync": TrainPipelineSemiSync,
    "prefetch": PrefetchTrainPipelineSparseDist,
    "base": TrainPipelineBase,
}


# pipelines that run part of the step on their own CUDA stream (TorchRec calls record_stream, which CPU tensors
# refuse with "unknown parameter type")
CUDA_ONLY = {
    "prefetch": "prefetches fused_uvm_caching rows on a CUDA stream",
    "fused_sparse_dist": "runs the embedding lookup on a CUDA stream (TorchRec records the batch's tensors on it)",
    "semi_sync": "records the batch's tensors on CUDA streams",
    "graphed": "replays a CUDA graph",
}


def check_pipeline_device(cfg: PipelineConfig, device: torch.device) -> None:
    """Refuse a CUDA-only pipeline setting off CUDA (the trainer calls this before loading data).

    Raises:
        ConfigError: ``pipeline=prefetch``, ``fused_sparse_dist``, ``semi_sync`` or ``graphed`` on a non-CUDA
            device.
    """
    if cfg.name in CUDA_ONLY and device.type != "cuda":
        raise ConfigError(
            f"config key `pipeline.name`: pipeline={cfg.name} {CUDA_ONLY[cfg.name]} and needs CUDA, "
            f"but this run is on {device.type}; use pipeline=sparse_dist on CPU"
        )


def build_pipeline(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    cfg: PipelineConfig,
    dense: Optional[torch.optim.Optimizer] = None,
) -> Union[TrainPipeline, GraphedTrainPipeline]:
    """The configured pipeline over a DMP-wrapped ``model``; ``dense`` (the optimizer of the parameters not fused
    into the TBE backward) is what ``pipeline=graphed`` steps inside its graph.

    With ``cfg.input_dist_group == "dedicated"`` this creates the dedicated process group (collective: call on
    every rank) and hooks every sharded module of ``model`` to it.

    Raises:
        ConfigError: a CUDA-only pipeline setting off CUDA (:func:`check_pipeline_device`).
    """
    check_pipeline_device(cfg, device)
    if cfg.input_dist_group == "dedicated":
        n = use_group_for_input_dist(model, input_dist_group())
        log.info("input dist of %d sharded module(s) on a dedicated process group", n)
    if cfg.name == "graphed":
        assert dense is not None, "pipeline=graphed steps the dense optimizer itself: pass it"
        return GraphedTrainPipeline(model, optimizer, dense, device)
    cls = PIPELINES[cfg.name]
    if cls is TrainPipelineBase:
        return cls(model, optimizer, device)
    if cls is TrainPipelineSemiSync:
        log.info(
            "semi-synchronous pipeline from batch %d: each batch's lookup reads the tables before the previous "
            "batch's update",
            cfg.semi_sync_start_batch,
        )
        return cls(model, optimizer, device, execute_all_batches=True, start_batch=cfg.semi_sync_start_batch)
    return cls(model, optimizer, device, execute_all_batches=True)
