"""Plan and shard the model with TorchRec: ``EmbeddingShardingPlanner`` over the real topology with per-table
``ParameterConstraints`` from ``sharding.*``, then ``DistributedModelParallel`` (DMP), with the embedding
optimizer fused into the TBE backward. Plans are printed as a table and saved / loaded as ``plan.json``.

Plan without training (any world size, meta device, no GPU needed)::

    python -m dlrm.plan model=dlrm_v2 world_size=8 device=cuda sharding.hbm_cap_gb=139.8

What is ours and why: the planner, sharders, enumerator and cost model are TorchRec's. Ours are the mapping from
config to ``ParameterConstraints`` with checks that fail at plan time naming the table and the fix (TorchRec
silently widens a column shard that does not divide, and its no-plan error does not name the table), a sharder
that allows row_wise / table_row_wise / grid_shard on CPU (TorchRec's refuses them there although they train
correctly: tests/test_sharding_equivalence.py), and a JSON form of the plan (TorchRec has no file format).

Modules: ``types`` (PlanError, TableInfo, PlanInfo), ``sharders`` (the sharder and TBE fused params), ``optimizer``
(fused embedding and dense optimizers), ``constraints`` (topology and per-table ParameterConstraints), ``planner``
(plan, broadcast, DMP), ``weights`` (seeded table weights), ``plan_json`` (plan.json), ``plan_format`` (plan tables).
"""

from dlrm.sharding.constraints import build_constraints, topology
from dlrm.sharding.optimizer import dense_optimizer, dense_params, fuse_embedding_optimizer
from dlrm.sharding.plan_format import format_plan, plan_rows, sharding_types_of
from dlrm.sharding.plan_json import load_plan, plan_fingerprint, save_plan
from dlrm.sharding.planner import plan_model, shard
from dlrm.sharding.sharders import EmbeddingBagSharder, fused_params_of, sharders
from dlrm.sharding.types import GiB, PlanError, PlanInfo, tables_of
from dlrm.sharding.weights import initial_weights, seed_tables

__all__ = [
    "EmbeddingBagSharder",
    "GiB",
    "PlanError",
    "PlanInfo",
    "build_constraints",
    "dense_optimizer",
    "dense_params",
    "format_plan",
    "fuse_embedding_optimizer",
    "fused_params_of",
    "initial_weights",
    "load_plan",
    "plan_fingerprint",
    "plan_model",
    "plan_rows",
    "save_plan",
    "seed_tables",
    "shard",
    "sharders",
    "sharding_types_of",
    "tables_of",
    "topology",
]
