"""Host-memory offload of embedding tables (``offload=none|uvm|uvm_caching``), as TorchRec planner constraints.

``uvm`` constrains the chosen tables to the ``fused_uvm`` compute kernel (weights and optimizer state in host
memory, mapped into the GPU's address space and read over PCIe/C2C by the FBGEMM TBE kernels); ``uvm_caching``
to ``fused_uvm_caching`` (the same, plus an HBM cache of ``cache_load_factor`` x rows managed by FBGEMM with LRU or
LFU replacement). With ``uvm_caching`` the trainer uses TorchRec's ``PrefetchTrainPipelineSparseDist``, which
fetches batch i+1's missing rows into the cache on its own stream while batch i trains; the cache is told so
(``CacheParams.prefetch_pipeline=True``) so that rows prefetched for batch i+1 are not evicted by batch i.

Why our own code: TorchRec has the kernels and the planner; what is ours is the policy (which tables, from the
config) and the early, clear errors. The planner still does placement and memory accounting.

Try a plan without a GPU (the planner runs on the meta device for a CUDA topology)::

    python -m dlrm.plan model=dlrm_v2 offload=uvm_caching pipeline=prefetch device=cuda sharding.hbm_cap_gb=139.8 \
        sharding.ddr_cap_gb=512

Rules: the compute kernels and ``CacheParams`` fields are TorchRec's (``torchrec.distributed.planner.types.
ParameterConstraints``, ``torchrec.distributed.types.CacheParams``); ``CacheAlgorithm`` is FBGEMM's.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dlrm.config import OffloadConfig
from dlrm.errors import ConfigError

KERNELS = {"uvm": EmbeddingComputeKernel.FUSED_UVM.value, "uvm_caching": EmbeddingComputeKernel.FUSED_UVM_CACHING.value}
ALGORITHMS = {"lru": CacheAlgorithm.LRU, "lfu": CacheAlgorithm.LFU}
FP32_BYTES = 4


def table_mib(table: EmbeddingBagConfig) -> float:
    """fp32 weight size of a table in MiB (rows x dim x 4 bytes; optimizer state not counted)."""
    return table.num_embeddings * table.embedding_dim * FP32_BYTES / 2**20


def offloaded_tables(cfg: OffloadConfig, tables: Sequence[EmbeddingBagConfig]) -> List[str]:
    """Names of the tables ``cfg`` puts in host memory: none for ``offload=none``, else those with at least
    ``min_table_rows`` rows and ``min_table_mb`` MiB of fp32 weights."""
    if cfg.name == "none":
        return []
    return [t.name for t in tables if t.num_embeddings >= cfg.min_table_rows and table_mib(t) >= cfg.min_table_mb]


def offload_constraints(
    cfg: OffloadConfig, tables: Sequence[EmbeddingBagConfig], base: Optional[Dict[str, ParameterConstraints]] = None
) -> Optional[Dict[str, ParameterConstraints]]:
    """Planner constraints that put the offloaded tables on ``fused_uvm`` / ``fused_uvm_caching``.

    Args:
        cfg: the offload config.
        tables: every table of the model.
        base: constraints from elsewhere (e.g. sharding types); they are kept, with the compute kernel and cache
            parameters of the offloaded tables replaced.

    Returns:
        ``{table name: ParameterConstraints}`` (``base`` unchanged, or None, for ``offload=none``).
    """
    names = offloaded_tables(cfg, tables)
    if not names:
        return base
    out = dict(base or {})
    cache = None
    if cfg.name == "uvm_caching":
        cache = CacheParams(
            algorithm=ALGORITHMS[cfg.cache_algorithm], load_factor=cfg.cache_load_factor, prefetch_pipeline=True
        )
    for name in names:
        prev = out.get(name) or ParameterConstraints()
        out[name] = dataclasses.replace(prev, compute_kernels=[KERNELS[cfg.name]], cache_params=cache)
    return out


def check_can_train(cfg: OffloadConfig, device: torch.device) -> None:
    """Refuse to train with host offload off CUDA (plans and dry runs are fine).

    Raises:
        ConfigError: ``offload`` is not ``none`` and ``device`` is not CUDA.
    """
    if cfg.name != "none" and device.type != "cuda":
        raise ConfigError(
            f"config key `offload.name`: offload={cfg.name} needs CUDA to train (FBGEMM's {KERNELS[cfg.name]} "
            f"kernels keep tables in host memory mapped into a GPU), but this run is on {device.type}; use "
            "offload=none on CPU (plans and dry runs accept it)"
        )
