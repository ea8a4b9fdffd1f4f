"""The sharding package's shared names and records: the plan error, kernel and sharding-type groups, one
table's shape (:class:`TableInfo`) and a plan with its estimates (:class:`PlanInfo`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

import torch
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrm.errors import InputError

GiB = 2**30
# Rewrites the per-table planner constraints (table name -> ParameterConstraints) before planning.
ConstraintHook = Callable[[Dict[str, ParameterConstraints]], Dict[str, ParameterConstraints]]
# Kernels that keep the weights in device memory (HBM) on CUDA; FBGEMM's TBE needs dim % 4 == 0 for all fused ones.
FUSED_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching")
WHOLE_TABLE_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.DATA_PARALLEL.value)
COLUMN_TYPES = (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value, ShardingType.GRID_SHARD.value)


class PlanError(InputError):
    """The sharding config cannot be planned or run; the message names the table, config key and fix."""


@dataclasses.dataclass
class TableInfo:
    """One embedding table of a shardable module: ``rows`` x ``dim`` weights of ``weight_bytes`` bytes each (4:
    fp32, 2: fp16, ``perf.embedding_dtype``), at ``module`` (an FQN)."""

    module: str
    name: str
    rows: int
    dim: int
    features: List[str]
    weight_bytes: int = 4


def tables_of(model: torch.nn.Module) -> List[TableInfo]:
    """Every table of every ``EmbeddingBagCollection`` in ``model``, in order."""
    out = []
    for path, m in model.named_modules():
        if isinstance(m, EmbeddingBagCollection):
            for c in m.embedding_bag_configs():
                nbytes = 4 if c.data_type == DataType.FP32 else 2
                out.append(TableInfo(path, c.name, c.num_embeddings, c.embedding_dim, list(c.feature_names), nbytes))
    return out


@dataclasses.dataclass
class PlanInfo:
    """A plan with what the table and ``plan.json`` show beside it.

    ``shards``: one dict per shard: ``module``, ``table``, ``sharding_type``, ``compute_kernel``, ``rank``,
    ``offsets`` / ``sizes`` (rows, columns), ``hbm_bytes`` / ``ddr_bytes`` (TorchRec's estimate: weights,
    optimizer state, I/O buffers; null for a loaded plan without estimates).
    """

    plan: ShardingPlan
    world_size: int
    local_world_size: int
    compute_device: str
    hbm_cap_bytes: int
    ddr_cap_bytes: int
    shards: List[Dict[str, Any]]
    source: str = "planner"
