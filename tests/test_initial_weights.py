"""The initial embedding tables are a function of ``seed`` alone: every sharding plan and world size starts from
the same tables, bit for bit (``dlrm.sharding.seed_tables``), whatever each rank's RNG stream holds.

    .venv/bin/python -m pytest -q tests/test_initial_weights.py
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from conftest import run_gloo

DIM = 8
TINY = [
    "model.row_cap=50",
    f"model.embedding_dim={DIM}",
    f"model.dense_arch_layer_sizes=[16,{DIM}]",
    "model.over_arch_layer_sizes=[16,1]",
    "model.dcn_num_layers=1",
    "model.dcn_low_rank_dim=4",
    f"model.multi_hot_sizes=[{','.join(['2'] * 26)}]",
    "data.batch_size=8",
]
# 2-rank plans that split the tables every way: whole tables, rows, columns, rows within a host, replicas
PLANS_2 = [
    ["sharding=table_wise"],
    ["sharding=row_wise"],
    ["sharding=column_wise", "sharding.min_partition=4"],
    ["sharding=table_row_wise"],
    ["sharding=data_parallel"],
]


def _full_tables(dmp: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Every table whole, gathered from all ranks' shards (or a replica)."""
    import torch.distributed as dist

    local: Dict[str, Any] = {}
    shapes: Dict[str, Any] = {}
    for k, v in dmp.state_dict().items():
        if "embedding_bags" not in k:
            continue
        name = k.split(".")[-2]
        shapes[name] = tuple(v.size())
        if hasattr(v, "local_shards"):
            local[name] = [(tuple(s.metadata.shard_offsets), s.tensor.detach().clone()) for s in v.local_shards()]
        else:
            local[name] = [((0, 0), v.detach().clone())]
    every: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, local)
    out = {}
    for name, shape in shapes.items():
        full = torch.full(shape, float("nan"))
        for pieces in every:
            for (r0, c0), t in pieces.get(name, []):
                full[r0 : r0 + t.shape[0], c0 : c0 + t.shape[1]] = t
        out[name] = full
    return out


def _worker(rank: int, world: int, plans: List[List[str]]) -> List[Dict[str, Any]]:
    import logging
    import warnings

    from dlrm.config import compose, to_config
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    info = init_distributed("cpu")
    out = []
    for overrides in plans:
        cfg = to_config(compose(TINY + overrides))
        torch.manual_seed(1000 + 17 * rank + len(out))  # each rank and build draws from another RNG stream
        built = build_training(cfg, info, 8)
        types = sorted({s["sharding_type"] for s in built.model.plan_info.shards})
        out.append({"types": types, "tables": _full_tables(built.model)})
    return out


def test_every_plan_and_world_size_starts_from_the_same_tables() -> None:
    from dlrm.config import compose, to_config
    from dlrm.model import table_configs
    from dlrm.sharding import initial_weights

    one = run_gloo(1, _worker, [["sharding=auto"]], timeout=300)[0][0]
    two = run_gloo(2, _worker, PLANS_2, timeout=600)
    assert [r["types"] for r in two[0]] == [
        ["table_wise"],
        ["row_wise"],
        ["column_wise"],
        ["table_row_wise"],
        ["data_parallel"],
    ]
    ref = one["tables"]
    assert len(ref) == 26 and not any(torch.isnan(t).any() for t in ref.values())
    for rank in range(2):
        for plan, r in zip(PLANS_2, two[rank]):
            for name, t in r["tables"].items():
                assert torch.equal(t, ref[name]), (rank, plan, name)
    # and they are the documented function of (seed, table, row, column): uniform in TorchRec's +-sqrt(1 / rows)
    cfg = to_config(compose(TINY))
    c = table_configs(cfg.model)[3]

    def table(seed: int) -> torch.Tensor:
        lo, hi = c.get_weight_init_min(), c.get_weight_init_max()
        return initial_weights(c.name, seed, (0, c.num_embeddings), (0, DIM), lo, hi, torch.device("cpu"))

    want = table(0)
    assert torch.equal(ref[c.name], want)
    assert ref[c.name].abs().max() < c.get_weight_init_max() and ref[c.name].std() > 0.5 * c.get_weight_init_max()
    # another seed gives other tables
    assert not torch.equal(table(1), want)
