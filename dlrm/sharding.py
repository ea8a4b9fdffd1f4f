"""Plan and shard the model with TorchRec: ``EmbeddingShardingPlanner`` over the real topology, then
``DistributedModelParallel`` (DMP), with the embedding optimizer fused into the TBE backward.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter
import torchrec.optim as trec_optim

from dlrm.config import OptimizerConfig, ShardingConfig
from dlrm.dist import DistInfo

log = logging.getLogger(__name__)


def fuse_embedding_optimizer(model: torch.nn.Module, opt: OptimizerConfig) -> None:
    """Attach the embedding optimizer to every table weight, to be fused into backward by DMP.

    ``adagrad`` maps to FBGEMM EXACT_ADAGRAD (element-wise, the MLPerf rule), ``rowwise_adagrad`` to
    EXACT_ROWWISE_ADAGRAD. eps comes from the config (MLPerf: 1e-8); the accumulator starts at 0.
    """
    cls = torch.optim.Adagrad if opt.sparse_type == "adagrad" else trec_optim.RowWiseAdagrad
    params = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    kwargs = {"lr": opt.embedding_lr, "eps": opt.eps}
    apply_optimizer_in_backward(cls, params, kwargs)


def topology(info: DistInfo, cfg: ShardingConfig) -> Topology:
    """The planner's view of the machines: world and local world size from the launcher, HBM from the device."""
    kwargs = {}
    if info.device.type == "cuda":
        cap = cfg.hbm_cap_gb * 2**30 if cfg.hbm_cap_gb else torch.cuda.get_device_properties(info.device).total_memory
        kwargs["hbm_cap"] = int(cap)
    return Topology(world_size=info.world_size, local_world_size=info.local_world_size,
                    compute_device=info.device.type, **kwargs)


def make_plan(model: torch.nn.Module, info: DistInfo, cfg: ShardingConfig, batch_size: int,
              constraints: Optional[Dict[str, ParameterConstraints]] = None) -> ShardingPlan:
    """Plan every sharded module collectively (rank 0 plans, the plan is broadcast). ``constraints``: per-table
    planner constraints (e.g. host offload from ``dlrm.offload.offload_constraints``)."""
    planner = EmbeddingShardingPlanner(
        topology=topology(info, cfg),
        batch_size=batch_size,
        storage_reservation=HeuristicalStorageReservation(percentage=cfg.storage_reservation),
        constraints=constraints,
        debug=False,
    )
    sharders = get_default_sharders()
    if dist.is_initialized():
        return planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return planner.plan(model, sharders)


def plan_rows(plan: ShardingPlan) -> List[Tuple[str, str, str, str]]:
    """``(tables, sharding type, compute kernel, ranks)``, one row per distinct placement, tables in order."""
    groups: Dict[Tuple[str, str, str], List[str]] = {}
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            ranks = sorted({int(r) for r in (ps.ranks or [])})
            key = (ps.sharding_type, ps.compute_kernel, ",".join(map(str, ranks)) or "all")
            groups.setdefault(key, []).append(name)

    def natural(name: str) -> Tuple[str, int]:
        head, _, tail = name.rpartition("_")
        return (head, int(tail)) if tail.isdigit() else (name, -1)

    return [(" ".join(sorted(tables, key=natural)), *key) for key, tables in sorted(groups.items())]


def shard(model: torch.nn.Module, info: DistInfo, cfg: ShardingConfig, opt: OptimizerConfig,
          batch_size: int, constraints: Optional[Dict[str, ParameterConstraints]] = None
          ) -> Tuple[DistributedModelParallel, ShardingPlan]:
    """Fuse the embedding optimizer, plan, and wrap with DMP (materialises the meta tables on their owners)."""
    fuse_embedding_optimizer(model, opt)
    plan = make_plan(model, info, cfg, batch_size, constraints)
    dmp = DistributedModelParallel(module=model, device=info.device, plan=plan)
    return dmp, plan


def dense_params(model: DistributedModelParallel) -> dict:
    """Parameters not updated in backward by a fused optimizer (the MLPs, and data_parallel tables)."""
    return dict(in_backward_optimizer_filter(model.named_parameters()))
