"""``dlrm.traffic`` against the collectives a training step really issues, and its arithmetic by hand.

The gloo tests build the trainer's stack (``build_training``: planner, DMP, perf levers, TorchRec's
``TrainPipelineSparseDist``) for a plan that holds every sharding type (table_wise, row_wise, column_wise,
table_column_wise, table_row_wise, grid_shard, data_parallel), run one pipeline step to fill it, and record every
c10d collective of the next step (its input dist for the next batch, lookup, output dist, backward, DDP's
all-reduces; ``dlrm.torchrec_compat.record_collectives`` sees the C++ ones too). Each recorded call must be a
message of ``dlrm.traffic`` for that rank with the same op, group size, dtype and bytes sent and received, and no
message may be left over; the bytes row-split tables' ids bring each rank depend on the ids, so there the
received bytes are checked in total over the ranks. 2 ranks (one host): fp32 and int64 ids, then fp16 pooled
embeddings and all-reduce, int32 ids and the lean output dist (no column-split tables: see NO_COLUMN_SPLIT); 4
ranks as 2 hosts x 2: fp32 and int64 ids. One process launch per world size.

Run: ``.venv/bin/python -m pytest -q tests/test_traffic.py``
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from conftest import dense_param_count, run_gloo
from dlrm.traffic import (
    IB_400_GBPS,
    NVLINK_H200_GBPS,
    Shard,
    ShardedTable,
    StepTraffic,
    dense_parameters,
    job_traffic,
    step_traffic,
    tables_from_plan,
)
from dlrm.traffic_report import format_traffic

BATCH = 8  # per rank
SMALL = ["model.row_cap=64", "sharding.min_partition=4", f"data.batch_size={BATCH}"]
EVERY_TYPE = [
    "+sharding.constraints.t_cat_0.sharding_types=[row_wise]",
    "+sharding.constraints.t_cat_1.sharding_types=[column_wise]",
    "+sharding.constraints.t_cat_2.sharding_types=[data_parallel]",
    "+sharding.constraints.t_cat_3.sharding_types=[table_row_wise]",
    "+sharding.constraints.t_cat_4.sharding_types=[grid_shard]",
    "+sharding.constraints.t_cat_5.sharding_types=[table_column_wise]",
    "sharding.sharding_types=[table_wise]",
]
HALF = ["perf.embedding_output_dtype=fp16", "perf.allreduce_dtype=fp16", "perf.lean_output_dist=true"]
# fp16 pooled embeddings: no column-split tables, whose shards may all land on one rank; a rank without a shard of
# a group then runs that group's pooled all-to-all in fp32 (its empty lookup's dtype) while its peers run it in
# fp16, and gloo stops on the size mismatch (TorchRec 1.8 on CPU)
NO_COLUMN_SPLIT = [c for c in EVERY_TYPE if "column_wise]" not in c]


def _batches(cfg: Any, rank: int, n: int, int32_ids: bool) -> List[Any]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm import data as D
    from dlrm.model import FEATURE_NAMES

    g = torch.Generator().manual_seed(rank)
    mh = D.MultiHot(cfg.model.table_rows, cfg.model.multi_hot_sizes)
    out = []
    for _ in range(n):
        ids = torch.stack([torch.randint(0, r, (BATCH,), generator=g) for r in cfg.model.table_rows], 1)
        split = D.Split(torch.rand(BATCH, 13, generator=g), ids, (torch.rand(BATCH, generator=g) < 0.3).float(), "t")
        b = D.to_batch(split, torch.arange(BATCH), FEATURE_NAMES, mh)
        if int32_ids:  # as dlrm.data.binary's batches (criteo_binary)
            kjt = b.sparse_features
            b.sparse_features = KeyedJaggedTensor(
                keys=kjt.keys(), values=kjt.values().int(), lengths=kjt.lengths(), stride=kjt.stride()
            )
        out.append(b)
    return out


def _worker(rank: int, world: int, cases: List[Tuple[str, Any, bool]], local: Optional[int]) -> Dict[str, Any]:
    torch.set_num_threads(1)  # N processes on 2 cores
    if local:  # simulate world / local hosts
        os.environ.update(LOCAL_WORLD_SIZE=str(local), LOCAL_RANK=str(rank % local))
    from dlrm import torchrec_compat as compat
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    info = init_distributed("cpu")
    out = {}
    for label, cfg, int32_ids in cases:
        built = build_training(cfg, info, BATCH)
        it = iter(_batches(cfg, rank, 3, int32_ids))
        built.pipeline.progress(it)  # fills the pipeline: input dists of batches 0 and 1, trains batch 0
        with compat.record_collectives() as calls:
            built.pipeline.progress(it)  # steady state: input dist of batch 2, trains batch 1
        out[label] = {"calls": list(calls), "plan": built.plan}
    return out


def _expected(cfg: Any, plan: Any, world: int, local: int, int32_ids: bool) -> StepTraffic:
    from dlrm.model import build_model

    dense = dense_parameters(build_model(cfg.model, dense_device=torch.device("meta")))
    assert dense == dense_param_count(cfg.model) == 117_569  # the small model's MLPs and DCN
    id_dtype = "int32" if int32_ids else None
    return job_traffic(
        cfg, plan, dense_params=dense, world_size=world, local_world_size=local, batch_size=BATCH, id_dtype=id_dtype
    )


def _check_against_recorded(results: List[Dict[str, Any]], label: str, traffic: StepTraffic) -> None:
    est_sent, est_recv = 0.0, 0.0
    for rank, res in enumerate(results):
        calls = res[label]["calls"]
        msgs = traffic.of_rank(rank)
        got = Counter((c.op, c.group_size, c.dtype, c.send_bytes, c.recv_bytes) for c in calls)
        exact = Counter((m.op, m.group_size, m.dtype, m.send_bytes, m.recv_bytes) for m in msgs if not m.estimated)
        assert not exact - got, (label, rank, "predicted, not issued:", exact - got, "issued:", got - exact)
        rest = got - exact
        estimated = Counter((m.op, m.group_size, m.dtype, m.send_bytes) for m in msgs if m.estimated)
        assert Counter({k[:4]: n for k, n in rest.items()}) == estimated, (label, rank, rest, estimated)
        est_sent += sum(k[3] * n for k, n in rest.items())
        est_recv += sum(k[4] * n for k, n in rest.items())
        assert len(calls) == len(msgs), (label, rank, len(calls), len(msgs))
    assert est_recv == est_sent  # row-split ids: what arrives is what was sent, over all ranks


def test_traffic_equals_recorded_collectives_2_ranks() -> None:
    """2 gloo ranks: every sharding type in one plan (fp32, int64 ids); then fp16 pooled embeddings and dense
    all-reduce, int32 ids and the lean output dist (the same collectives as TorchRec's)."""
    from dlrm.config import compose, to_config

    every = to_config(compose([*SMALL, *EVERY_TYPE]))
    half = to_config(compose([*SMALL, *NO_COLUMN_SPLIT, *HALF]))
    results = run_gloo(2, _worker, [("every", every, False), ("half", half, True)], None, timeout=600)
    traffic = _expected(every, results[0]["every"]["plan"], 2, 2, False)
    assert {t.sharding_type for t in traffic.tables} == {
        "row_wise",
        "column_wise",
        "data_parallel",
        "table_row_wise",
        "grid_shard",
        "table_column_wise",
        "table_wise",
    }
    _check_against_recorded(results, "every", traffic)
    traffic = _expected(half, results[0]["half"]["plan"], 2, 2, True)
    _check_against_recorded(results, "half", traffic)
    dtypes = Counter((m.tensor, m.dtype) for m in traffic.of_rank(0))
    assert dtypes[("values", "int32")] == 4 and dtypes[("pooled embeddings", "float16")] == 4
    assert dtypes[("dense gradients", "float16")] == 1 and dtypes[("table gradients", "float32")] == 1


def test_traffic_equals_recorded_collectives_4_ranks_2_hosts() -> None:
    """4 gloo ranks as 2 hosts x 2: table_row_wise / grid_shard reduce within a host and send across hosts."""
    from dlrm.config import compose, to_config

    cfg = to_config(compose([*SMALL, *EVERY_TYPE]))
    results = run_gloo(4, _worker, [("fp32", cfg, False)], 2, timeout=600)
    traffic = _expected(cfg, results[0]["fp32"]["plan"], 4, 2, False)
    _check_against_recorded(results, "fp32", traffic)
    ops = Counter((m.op, m.group_size, m.sharding_type) for m in traffic.of_rank(0) if m.stage != "input dist")
    for stype in ("table_row_wise", "grid_shard"):  # both levels, each way
        assert ops[("reduce_scatter", 2, stype)] == ops[("all_gather", 2, stype)] == 1
        assert ops[("all_to_all", 2, stype)] == 2
    assert ops[("reduce_scatter", 4, "row_wise")] == ops[("all_gather", 4, "row_wise")] == 1


# ------------------------------------------------------------------------------------------------ by hand
def _tw(name: str, rank: int, dim: int, ids: float, rows: int = 100) -> ShardedTable:
    return ShardedTable("ebc", name, "table_wise", rows, dim, 1, ids, (Shard(rank, 0, rows, 0, dim),))


def test_table_wise_and_row_wise_by_hand() -> None:
    """4 ranks on 2 hosts, 10 samples per rank: t0 table_wise on rank 1 (dim 8, 3 ids per sample), t1 row_wise
    over the 4 ranks (40 rows as 10 each, dim 4, 2 ids), 1000 dense parameters; int64 ids, int32 lengths, fp32."""
    rw = ShardedTable("ebc", "t1", "row_wise", 40, 4, 1, 2.0, tuple(Shard(r, 10 * r, 10, 0, 4) for r in range(4)))
    tr = step_traffic([_tw("t0", 1, 8, 3.0), rw], world_size=4, local_world_size=2, batch_size=10, dense_params=1000)
    by = {(m.rank, m.sharding_type, m.tensor, m.stage): m for m in tr.messages}
    # splits: [4 peers x 3] int64 per group, the 2 groups' in one all-to-all (as TorchRec's pipelines fuse them)
    assert by[(0, "all", "splits", "input dist")].send_bytes == 192
    # table_wise: rank 0 sends its 10 x 3 ids (8 bytes) and 10 lengths (4 bytes) to rank 1, which gets 4 x that
    v0, v1 = by[(0, "table_wise", "values", "input dist")], by[(1, "table_wise", "values", "input dist")]
    assert (v0.send_bytes, v0.recv_bytes, v0.out_intra, v0.out_inter) == (240, 0, 240, 0)
    assert (v1.send_bytes, v1.recv_bytes, v1.out_intra, v1.in_intra, v1.in_inter) == (240, 960, 0, 240, 480)
    assert by[(3, "table_wise", "lengths", "input dist")].send_bytes == 40
    # pooled: rank 1 sends [40, 8] fp32 (320 bytes to each rank), every rank gets [10, 8]
    f1 = by[(1, "table_wise", "pooled embeddings", "output dist fwd")]
    assert (f1.send_bytes, f1.recv_bytes, f1.out_intra, f1.out_inter) == (1280, 320, 320, 640)
    assert by[(2, "table_wise", "pooled gradients", "output dist bwd")].send_bytes == 320
    # row_wise: 10 lengths to every rank, the 20 ids spread over the 4 row shards (estimated split)
    rl, rv = by[(0, "row_wise", "lengths", "input dist")], by[(0, "row_wise", "values", "input dist")]
    assert (rl.send_bytes, rl.recv_bytes) == (160, 160) and rv.estimated and rv.send_bytes == 160
    # reduce-scatter of [40, 4] fp32 partial sums into [10, 4]; ring share 3/4, across hosts
    rs = by[(0, "row_wise", "pooled embeddings", "output dist fwd")]
    assert (rs.op, rs.send_bytes, rs.recv_bytes, rs.out_inter, rs.out_intra) == ("reduce_scatter", 640, 160, 480, 0)
    ag = by[(0, "row_wise", "pooled gradients", "output dist bwd")]
    assert (ag.op, ag.send_bytes, ag.recv_bytes, ag.out_inter) == ("all_gather", 160, 640, 480)
    ar = by[(0, "dense", "dense gradients", "all-reduce")]
    assert (ar.send_bytes, ar.out_inter) == (4000, 6000)  # 2 x 3/4 of 4000 bytes
    assert len(tr.of_rank(0)) == 1 + 2 * 4 + 1


def test_table_row_wise_by_hand() -> None:
    """8 ranks on 2 hosts of 4: one table_row_wise table (dim 16, 1 id) on host 1, 20 samples per rank, bf16
    pooled embeddings: reduce-scatter within the host, then across the hosts' ranks of the same local rank."""
    t = ShardedTable(
        "ebc", "t", "table_row_wise", 40, 16, 1, 1.0, tuple(Shard(4 + i, 10 * i, 10, 0, 16) for i in range(4))
    )
    tr = step_traffic([t], world_size=8, local_world_size=4, batch_size=20, dense_params=0, pooled_dtype="bf16")
    by = {(m.rank, m.stage, m.op): m for m in tr.messages}
    # lengths and ids go to host 1's ranks only (20 each to each of them)
    assert by[(0, "input dist", "all_to_all")].group_size == 8
    lengths = [m for m in tr.of_rank(0) if m.tensor == "lengths"][0]
    assert (lengths.send_bytes, lengths.out_intra, lengths.out_inter) == (320, 0, 320)
    # host 1: [160, 16] bf16 reduce-scattered into [40, 16] among 4 ranks; host 0 reduces nothing (width 0)
    rs = by[(5, "output dist fwd", "reduce_scatter")]
    assert (rs.group_size, rs.send_bytes, rs.recv_bytes, rs.out_intra) == (4, 5120, 1280, 3840)
    assert by[(1, "output dist fwd", "reduce_scatter")].send_bytes == 0
    # then rank 5 sends [20, 16] bf16 to rank 1 (and keeps its own), rank 1 sends nothing and gets it
    a5, a1 = by[(5, "output dist fwd", "all_to_all")], by[(1, "output dist fwd", "all_to_all")]
    assert (a5.group_size, a5.send_bytes, a5.out_inter, a1.send_bytes, a1.recv_bytes) == (2, 1280, 640, 0, 640)
    assert by[(1, "output dist bwd", "all_to_all")].send_bytes == 640


def test_graphed_step_sends_row_wise_bags_whole_to_every_rank() -> None:
    """``pipeline=graphed`` on several ranks: a row_wise table's 10 x 2 ids of each rank go whole to each of the 4
    ranks (160 bytes to each, 640 sent and received, exact); a table_row_wise table's on host 1 to its 2 ranks
    only (320 sent by each rank, 640 received by ranks 2 and 3, none by 0 and 1); the table_wise table's ids are
    as in TorchRec's."""
    rw = ShardedTable("ebc", "t1", "row_wise", 40, 4, 1, 2.0, tuple(Shard(r, 10 * r, 10, 0, 4) for r in range(4)))
    twrw = ShardedTable("ebc", "t2", "table_row_wise", 40, 4, 1, 2.0, (Shard(2, 0, 20, 0, 4), Shard(3, 20, 20, 0, 4)))
    tables = [_tw("t0", 1, 8, 3.0), rw, twrw]
    kw = dict(world_size=4, local_world_size=2, batch_size=10, dense_params=1000)
    tr = step_traffic(tables, whole_row_bags=True, **kw)  # type: ignore[arg-type]
    by = {(m.rank, m.sharding_type, m.tensor): m for m in tr.messages if m.stage == "input dist"}
    rv = by[(0, "row_wise", "values")]
    assert (rv.send_bytes, rv.recv_bytes, rv.out_intra, rv.out_inter, rv.estimated) == (640, 640, 160, 320, False)
    t0, t2 = by[(0, "table_row_wise", "values")], by[(2, "table_row_wise", "values")]
    assert (t0.send_bytes, t0.recv_bytes, t0.out_intra, t0.out_inter, t0.estimated) == (320, 0, 0, 320, False)
    assert (t2.send_bytes, t2.recv_bytes, t2.out_intra, t2.out_inter, t2.estimated) == (320, 640, 160, 0, False)
    ref = step_traffic(tables, **kw)  # type: ignore[arg-type]
    tw = [m for m in ref.messages if m.sharding_type == "table_wise"]
    assert tw == [m for m in tr.messages if m.sharding_type == "table_wise"]


def test_times_at_link_rates() -> None:
    """Time is the larger of what leaves and what arrives, per link class: rank 1's 640 bytes to host 1 at 400 Gb/s
    and its 320 bytes within the host at 3600 Gb/s; a world all-reduce of 10^9 fp32 parameters on one host of 4."""
    tr = step_traffic([_tw("t0", 1, 8, 3.0)], world_size=4, local_world_size=2, batch_size=10, dense_params=0)
    f1 = next(m for m in tr.of_rank(1) if m.stage == "output dist fwd")
    assert f1.seconds(NVLINK_H200_GBPS, IB_400_GBPS) == pytest.approx(640 * 8 / 400e9)
    one_host = step_traffic([], world_size=4, local_world_size=4, batch_size=1, dense_params=10**9)
    ar = one_host.of_rank(0)[0]
    assert ar.seconds(NVLINK_H200_GBPS, IB_400_GBPS) == pytest.approx(6e9 * 8 / 3600e9)  # 2 x 3/4 x 4 GB
    assert one_host.step_seconds(NVLINK_H200_GBPS, IB_400_GBPS) == pytest.approx(6e9 * 8 / 3600e9)
    alone = step_traffic([_tw("t0", 0, 8, 1.0)], world_size=1, local_world_size=1, batch_size=4, dense_params=9)
    assert alone.messages == ()  # one rank: nothing crosses a link


def test_format_lists_types_and_ranks() -> None:
    """The by-hand job above as text. Rank 1 sends 144 B of splits, 120 B of lengths and 120 B of ids to its
    peers, 960 B of pooled embeddings, the ring shares of the reduce-scatter and all-gather (480 B each) and of
    the all-reduce (6000 B): 8304 B leave it."""
    rw = ShardedTable("ebc", "t1", "row_wise", 40, 4, 1, 2.0, tuple(Shard(r, 10 * r, 10, 0, 4) for r in range(4)))
    tr = step_traffic([_tw("t0", 1, 8, 3.0), rw], world_size=4, local_world_size=2, batch_size=10, dense_params=1000)
    lines = format_traffic(tr, NVLINK_H200_GBPS, IB_400_GBPS).splitlines()
    assert lines[0] == (
        "traffic per training step (10 samples per rank; ids int64, lengths int32, pooled embeddings and their "
        "gradients fp32; ids are not deduplicated):"
    )
    assert lines[3].split("  ")[0] == "row_wise" and "partial sums, on every rank" in lines[3]
    assert lines[3].endswith("reduce-scatter (gradients: all-gather)")
    assert lines[4].endswith("all-to-all (gradients: all-to-all)") and lines[4].startswith("table_wise ")
    assert lines[5] == "all-reduce: 1,000 dense gradients (fp32)"
    assert lines[6].endswith(
        "time at 3600 Gb/s (450 GB/s, NVLink on H200) within a host, 400 Gb/s (50 GB/s, InfiniBand) across hosts:"
    )
    assert lines[7].split() == [
        "rank", "splits", "lengths", "values", "out", "fwd", "out", "bwd", "all-reduce", "sum", "leaves", "rank", "time"
    ]  # fmt: skip
    # handed: 192 B splits, 40 + 160 B lengths, 240 + 160 B ids, 1280 + 640 B out fwd, 320 + 160 B out bwd, 4000 B
    # time: InfiniBand's share of each collective (all-to-alls: the larger of sent and received), e.g. 96 B of
    # splits, 480 B of ids in, 640 B of pooled embeddings out, 6000 B of all-reduce: 181.12 ns in all
    us = sum(m.seconds(NVLINK_H200_GBPS, IB_400_GBPS) for m in tr.of_rank(1)) * 1e6
    assert us == pytest.approx(0.18112, abs=1e-9)
    assert lines[10].split() == "1 192 B 200 B 400 B 1.88 KiB 480 B 3.91 KiB 7.02 KiB 8.11 KiB 0.18 us".split()
    assert lines[-1].startswith("the step's collectives one after another, each as slow as its slowest rank: ")
    untimed = format_traffic(tr, None, None).splitlines()
    assert untimed[6] == "bytes each rank hands each collective (its own share included):" and " us" not in untimed[-1]


def test_tables_from_a_loaded_plan() -> None:
    """The planner's plan for the small model on 4 ranks, row_wise: every table split in 4 row shards."""
    from dlrm.config import compose, to_config
    from dlrm.model import table_configs
    from dlrm.plan import plan_job

    pi = plan_job([*SMALL, "sharding=row_wise"], world_size=4, local_world_size=2)
    cfg = to_config(compose([*SMALL, "sharding=row_wise"]))
    tables = tables_from_plan(pi.plan, table_configs(cfg.model), {f"t_cat_{i}": 1.0 for i in range(26)}, 4)
    t0 = next(t for t in tables if t.name == "t_cat_0")
    assert t0.sharding_type == "row_wise" and [(s.rank, s.rows, s.cols) for s in t0.shards] == [
        (0, 16, 16),
        (1, 16, 16),
        (2, 16, 16),
        (3, 16, 16),
    ]
    tr = job_traffic(cfg, pi.plan, dense_params=0, world_size=4, local_world_size=2, batch_size=BATCH)
    # 26 bags to each of 4 ranks, 8 samples: 832 int32 lengths; 214 int64 ids per sample
    assert [m.send_bytes for m in tr.of_rank(2) if m.tensor in ("lengths", "values")] == [832 * 4, 214 * 8 * 8]
