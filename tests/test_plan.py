"""Planner tests on the meta device (no process group): config -> constraints, the 8 x H200 MLPerf plan,
plan.json round trips, the ``python -m dlrm.plan`` command, plan-time errors, and the trainer's plan output.

Run: ``.venv/bin/python -m pytest -q tests/test_plan.py``
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from conftest import REPO, dense_param_count
from dlrm.config import DataConfig, compose, to_config
from dlrm.model import build_model
from dlrm.plan import plan_job
from dlrm.sharding import (
    GiB,
    PlanError,
    build_constraints,
    load_plan,
    save_plan,
    tables_of,
)
from dlrm.traffic import dense_parameters, job_traffic

SMALL = ["model.row_cap=64"]
H200 = [
    "model=dlrm_v2",
    "device=cuda",
    "sharding.hbm_cap_gb=139.8",
    "sharding.ddr_cap_gb=200",
    "data.global_batch_size=65536",
]


def _by_table(pi) -> dict:
    return {n: ps for mp in pi.plan.plan.values() for n, ps in mp.items()}


@pytest.mark.parametrize(
    "preset", ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "grid_shard"]
)
def test_preset_forces_its_type_on_every_table(preset: str) -> None:
    pi = plan_job([*SMALL, f"sharding={preset}", "sharding.min_partition=4"], world_size=4, local_world_size=2)
    plan = _by_table(pi)
    assert len(plan) == 26 and {ps.sharding_type for ps in plan.values()} == {preset}
    assert {ps.compute_kernel for ps in plan.values()} == {"dense" if preset == "data_parallel" else "fused"}
    t0 = plan["t_cat_0"]
    if preset in ("row_wise", "data_parallel"):
        assert sorted(t0.ranks) == [0, 1, 2, 3]
    if preset == "table_row_wise":  # rows over one host's 2 ranks
        assert len(t0.ranks) == 2 and t0.ranks[0] // 2 == t0.ranks[1] // 2
    if preset in ("column_wise", "grid_shard"):  # width-4 column shards of the dim-16 table
        assert {tuple(m.shard_sizes)[1] for m in t0.sharding_spec.shards} == {4}


def test_per_table_constraints_override_the_preset() -> None:
    pi = plan_job(
        [
            *SMALL,
            "sharding=table_wise",
            "+sharding.constraints.t_cat_3.sharding_types=[row_wise]",
            "+sharding.constraints.t_cat_4.sharding_types=[column_wise]",
            "+sharding.constraints.t_cat_4.min_partition=8",
        ],
        world_size=2,
    )
    plan = _by_table(pi)
    assert plan["t_cat_3"].sharding_type == "row_wise" and plan["t_cat_0"].sharding_type == "table_wise"
    assert [m.shard_sizes for m in plan["t_cat_4"].sharding_spec.shards] == [[64, 8], [64, 8]]


def test_data_parallel_max_rows_replicates_the_small_tables() -> None:
    """``sharding.data_parallel_max_rows``: MLPerf DLRM-v2 capped at 4 M rows on 2 GPUs, 100k rows: the 18 tables of
    3 .. 39,060 rows go data_parallel on the dense kernel, the 8 of 405,282 rows and more stay table_wise / fused;
    a table's own sharding types win."""
    base = [
        "model=dlrm_v2",
        "model.row_cap=4000000",
        "device=cuda",
        "sharding.hbm_cap_gb=139.8",
        "sharding.ddr_cap_gb=200",
        "data.batch_size=32768",
        "sharding=table_wise",
    ]
    pi = plan_job(
        [*base, "sharding.data_parallel_max_rows=100000", "+sharding.constraints.t_cat_1.sharding_types=[table_wise]"],
        world_size=2,
    )
    rows = to_config(compose(["model=dlrm_v2", "model.row_cap=4000000"])).model.table_rows
    plan = _by_table(pi)
    dp = sorted((n for n, ps in plan.items() if ps.sharding_type == "data_parallel"), key=lambda n: int(n[6:]))
    assert dp == [f"t_cat_{i}" for i, r in enumerate(rows) if r <= 100000 and i != 1], dp
    assert len(dp) == 17 and max(rows[int(n[6:])] for n in dp) == 20265
    assert {plan[n].compute_kernel for n in dp} == {"dense"} and all(sorted(plan[n].ranks) == [0, 1] for n in dp)
    rest = {n: ps for n, ps in plan.items() if n not in dp}
    assert {(ps.sharding_type, ps.compute_kernel) for ps in rest.values()} == {("table_wise", "fused")}
    assert min(rows[int(n[6:])] for n in rest) == 39060  # t_cat_1, by its own constraint


def test_data_parallel_max_rows_holds_on_one_rank() -> None:
    """On one rank the other tables are table_wise (the layout stock TorchRec gets); the replicated ones stay."""
    rows = to_config(compose(SMALL)).model.table_rows
    plan = _by_table(plan_job([*SMALL, "sharding.data_parallel_max_rows=10"], world_size=1))
    assert {n for n, ps in plan.items() if ps.sharding_type == "data_parallel"} == {
        f"t_cat_{i}" for i, r in enumerate(rows) if r <= 10
    }
    assert {ps.sharding_type for ps in plan.values()} == {"data_parallel", "table_wise"}


def test_pooling_factors_default_to_multi_hot_sizes() -> None:
    cfg = to_config(compose(SMALL + ["+sharding.constraints.t_cat_1.pooling_factors=[2.5]"]))
    model = build_model(cfg.model, dense_device=torch.device("meta"))
    cons = build_constraints(cfg.sharding, tables_of(model), "cpu", {"t_cat_0": 3.0, "t_cat_20": 100.0})
    assert (cons["t_cat_0"].pooling_factors, cons["t_cat_20"].pooling_factors) == ([3.0], [100.0])
    assert cons["t_cat_1"].pooling_factors == [2.5] and cons["t_cat_2"].pooling_factors == [1.0]
    assert set(cons["t_cat_0"].sharding_types) >= {"row_wise", "table_row_wise", "grid_shard"}  # our CPU sharder


def test_mlperf_dlrm_v2_on_8_h200() -> None:
    """The full MLPerf model (204 M rows, 26 tables of dim 128, element-wise Adagrad) on 8 x 139.8 GiB."""
    pi = plan_job(H200, world_size=8)
    plan = _by_table(pi)
    assert len(plan) == 26 and pi.world_size == 8 and pi.hbm_cap_bytes == int(139.8 * GiB)
    hbm = [0] * 8
    area = {}
    for s in pi.shards:
        hbm[s["rank"]] += s["hbm_bytes"]
        area[s["table"]] = area.get(s["table"], 0) + s["sizes"][0] * s["sizes"][1]
    cfg = to_config(compose(H200))
    assert [area[f"t_cat_{i}"] for i in range(26)] == [r * 128 for r in cfg.model.num_embeddings_per_feature]
    weights_and_adagrad = 204_184_588 * 128 * 4 * 2
    assert sum(hbm) >= weights_and_adagrad  # estimates include the element-wise Adagrad state
    assert max(hbm) <= 0.95 * 139.8 * GiB  # within the storage reservation
    # its traffic: 8192 samples per rank, 214 int64 ids each (synthetic data); 24 table_wise bags to their ranks
    # and 2 row_wise bags to all 8; the pooled gradients of 24 x 128 columns back, an all-gather of 2 x 128
    dense = dense_parameters(build_model(cfg.model, dense_device=torch.device("meta")))
    tr = job_traffic(cfg, pi.plan, dense_params=dense, world_size=8, local_world_size=8, batch_size=8192)
    types = {(s["table"], s["sharding_type"]) for s in pi.shards}
    assert sorted(t for _, t in types).count("row_wise") == 2
    assert dense == dense_param_count(cfg.model) == 16_044_545
    for r in range(8):
        sent = {m.tensor + " " + m.stage: m.send_bytes for m in tr.of_rank(r) if m.sharding_type in ("all", "dense")}
        assert sent == {"splits input dist": 8 * 3 * 2 * 8, "dense gradients all-reduce": dense * 4}
        by = [
            sum(m.send_bytes for m in tr.of_rank(r) if m.tensor == t) for t in ("lengths", "values", "pooled gradients")
        ]
        assert by == [(24 + 2 * 8) * 8192 * 4, 214 * 8192 * 8, 8192 * 24 * 128 * 4 + 8192 * 256 * 4]


@pytest.mark.parametrize(
    "overrides,world,local",
    [
        (["sharding=auto"], 2, 2),
        (["sharding=grid_shard", "sharding.min_partition=8"], 4, 2),
        (["sharding=data_parallel"], 2, 2),
        (["sharding=table_row_wise"], 4, 2),
    ],
)
def test_plan_json_round_trip_is_exact(tmp_path: Path, overrides: List[str], world: int, local: int) -> None:
    pi = plan_job([*SMALL, *overrides], world_size=world, local_world_size=local)
    f = tmp_path / "plan.json"
    save_plan(pi, str(f))
    doc = json.loads(f.read_text())
    assert doc["world_size"] == world and len(doc["tables"]) == 26
    cfg = to_config(compose(SMALL))
    tables = tables_of(build_model(cfg.model, dense_device=torch.device("meta")))
    back = load_plan(str(f), tables, world, local, "cpu")
    assert back.plan == pi.plan
    # and through the config key: no planning, the same plan
    again = plan_job(
        [*SMALL, "sharding=table_wise", f"sharding.plan_path={f}"], world_size=world, local_world_size=local
    )
    assert again.plan == pi.plan and again.source == str(f)


def test_plan_path_for_another_job_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "plan.json"
    save_plan(plan_job(SMALL, world_size=2), str(f))
    with pytest.raises(PlanError, match="places tables on 2 ranks but this job has 4"):
        plan_job([*SMALL, f"sharding.plan_path={f}"], world_size=4)
    doc = json.loads(f.read_text())
    doc["tables"] = doc["tables"][1:]
    f.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"tables not in the plan \['t_cat_0'\]"):
        plan_job([*SMALL, f"sharding.plan_path={f}"], world_size=2)
    with pytest.raises(PlanError, match="cannot read"):
        plan_job([*SMALL, f"sharding.plan_path={tmp_path / 'nope.json'}"], world_size=2)


def test_plan_path_keeps_the_offload_cache_settings_and_refuses_other_kernels(tmp_path: Path) -> None:
    """``plan.json`` records placements, not ``CacheParams``: loaded under ``offload=uvm_caching`` the plan gets
    the configured cache (load factor, prefetch_pipeline) again, and under ``offload=uvm`` it is refused."""
    small_cuda = [*SMALL, "device=cuda", "sharding.hbm_cap_gb=10", "sharding.ddr_cap_gb=10", "offload.min_table_rows=1"]
    caching = [*small_cuda, "offload=uvm_caching", "pipeline=prefetch", "offload.cache_load_factor=0.3"]
    f = tmp_path / "plan.json"
    save_plan(plan_job(caching, world_size=1), str(f))
    back = _by_table(plan_job([*caching, f"sharding.plan_path={f}"], world_size=1))
    assert {
        (ps.compute_kernel, ps.cache_params.load_factor, ps.cache_params.prefetch_pipeline) for ps in back.values()
    } == {("fused_uvm_caching", 0.3, True)}
    with pytest.raises(PlanError) as e:
        plan_job([*small_cuda, "offload=uvm", f"sharding.plan_path={f}"], world_size=1)
    assert str(e.value) == (
        f"config key `sharding.plan_path`: table t_cat_0 is fused_uvm_caching in {f}, but offload.* puts it on "
        "fused_uvm; write the plan with the same offload.* keys (python -m dlrm.plan ... out=plan.json), or drop "
        "sharding.plan_path to re-plan"
    )


def test_damaged_or_hand_edited_plan_is_refused_naming_the_file(tmp_path: Path) -> None:
    f = tmp_path / "plan.json"
    save_plan(plan_job([*SMALL, "sharding=row_wise"], world_size=2), str(f))
    good = json.loads(f.read_text())
    key = "config key `sharding.plan_path`"

    def refused(doc) -> str:
        f.write_text(json.dumps(doc))
        with pytest.raises(PlanError) as e:
            plan_job([*SMALL, f"sharding.plan_path={f}"], world_size=2)
        return str(e.value)

    assert refused([1]) == f"{key}: {f} is not a plan.json (dlrm-plan/1); write one with python -m dlrm.plan"
    assert refused({k: v for k, v in good.items() if k != "world_size"}) == (
        f"{key}: {f} is damaged or hand-edited (KeyError: 'world_size'); write it again with python -m dlrm.plan "
        "... out=<file>, or drop sharding.plan_path to re-plan"
    )
    swapped = json.loads(json.dumps(good))
    swapped["tables"][0]["ranks"] = swapped["tables"][0]["ranks"][::-1]
    assert refused(swapped) == (
        f"{key}: table t_cat_0 in {f}: ranks [1, 0] do not list its shards' ranks [0, 1] in order; re-plan for this "
        "model (drop sharding.plan_path)"
    )
    overlap = json.loads(json.dumps(good))  # rows 0-31 on rank 0, and rows 16-47 instead of 32-63 on rank 1
    overlap["tables"][0]["shards"][1]["offsets"] = [16, 0]
    assert refused(overlap) == (
        f"{key}: table t_cat_0 in {f}: shards at rows 0, cols 0 and rows 16, cols 0 overlap; re-plan for this "
        "model (drop sharding.plan_path)"
    )


def test_shipped_balanced_plan_loads_for_its_model_only() -> None:
    """``conf/plans/dlrm_v2_cap4m_2gpu_table_wise.json`` (the hand-balanced 2-GPU plan for the capped MLPerf model):
    it loads for ``model=dlrm_v2 model.row_cap=4000000`` on 2 ranks, every table table_wise, with t_cat_11 and
    t_cat_15 on rank 0 and t_cat_5 and t_cat_12 on rank 1; the uncapped model is refused (shards cover 4 M of
    40 M rows)."""
    path = str(REPO / "conf" / "plans" / "dlrm_v2_cap4m_2gpu_table_wise.json")
    capped = plan_job(["model=dlrm_v2", "model.row_cap=4000000", f"sharding.plan_path={path}"], world_size=2)
    by = _by_table(capped)
    assert {ps.sharding_type for ps in by.values()} == {"table_wise"} and len(by) == 26
    assert [by[f"t_cat_{i}"].ranks for i in (11, 15, 5, 12)] == [[0], [0], [1], [1]]
    with pytest.raises(
        PlanError, match=r"t_cat_0 in .*dlrm_v2_cap4m_2gpu_table_wise.json: its shards cover 512000000 of 5120000000"
    ):
        plan_job(["model=dlrm_v2", f"sharding.plan_path={path}"], world_size=2)


# ------------------------------------------------------------------------------------------- plan-time errors
def test_dim_not_multiple_of_4_for_fused_kernels() -> None:
    dim6 = [*SMALL, "model.embedding_dim=6", "model.dense_arch_layer_sizes=[8,6]"]
    with pytest.raises(
        PlanError,
        match=r"table t_cat_0: embedding_dim 6 is not a multiple of 4.*"
        r"model.embedding_dim.*\(e.g. 8\).*sharding=data_parallel",
    ):
        plan_job([*dim6, "sharding=row_wise"], world_size=2)
    pi = plan_job([*dim6, "sharding=data_parallel"], world_size=2)  # the dense kernel has no such rule
    assert {ps.compute_kernel for ps in _by_table(pi).values()} == {"dense"}


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["sharding=column_wise", "sharding.min_partition=6"], "sharding.min_partition"),
        (["sharding=grid_shard", "sharding.min_partition=32"], "sharding.min_partition"),
        (
            [
                "+sharding.constraints.t_cat_2.sharding_types=[column_wise]",
                "+sharding.constraints.t_cat_2.min_partition=12",
            ],
            "sharding.constraints.t_cat_2.min_partition",
        ),
    ],
)
def test_column_width_that_does_not_divide(overrides: List[str], key: str) -> None:
    with pytest.raises(
        PlanError,
        match=rf"config key `{key}` = \d+ is not a column shard width for "
        r"embedding_dim 16.*\(4, 8, 16\)",
    ):
        plan_job([*SMALL, *overrides], world_size=2)


def test_constraint_naming_an_unknown_table() -> None:
    with pytest.raises(
        PlanError,
        match=r"`sharding.constraints.t_cat_26`: the model has no table 't_cat_26'; "
        r"its tables are t_cat_0 .. t_cat_25",
    ):
        plan_job([*SMALL, "+sharding.constraints.t_cat_26.sharding_types=[row_wise]"], world_size=2)


def test_sharding_type_or_kernel_the_backend_cannot_run() -> None:
    with pytest.raises(
        PlanError,
        match=r"table t_cat_0: config key `sharding.compute_kernel` = \['fused_uvm'\] "
        r"cannot run table_wise tables on cpu \(needs CUDA\)",
    ):
        plan_job([*SMALL, "sharding=table_wise", "sharding.compute_kernel=fused_uvm"], world_size=2)
    # TorchRec's stock sharder refuses row_wise on CPU; the check names the table, the type and what runs.
    cfg = to_config(compose([*SMALL, "+sharding.constraints.t_cat_7.sharding_types=[row_wise]"]))
    tables = tables_of(build_model(cfg.model, dense_device=torch.device("meta")))
    with pytest.raises(
        PlanError,
        match=r"table t_cat_7: config key `sharding.constraints.t_cat_7.sharding_types` "
        r"asks for row_wise, which the cpu backend cannot run \(it runs "
        r"data_parallel, table_wise, column_wise, table_column_wise\)",
    ):
        build_constraints(cfg.sharding, tables, "cpu", sharder=EmbeddingBagCollectionSharder())


def test_table_larger_than_its_memory() -> None:
    # table_wise + fused: a 40 M x 128 table (38 GiB with Adagrad) on 16 GiB GPUs.
    with pytest.raises(
        PlanError,
        match=r"table t_cat_0 \(40,000,000 x 128 fp32 with its optimizer state, 38.15 "
        r"GiB\) does not fit the 15.20 GiB of HBM per rank.*"
        r"sharding_types=\[row_wise\].*more GPUs.*offload=uvm_caching pipeline=prefetch",
    ):
        plan_job(
            [*H200, "sharding=table_wise", "sharding.compute_kernel=fused", "sharding.hbm_cap_gb=16"], world_size=8
        )
    # row_wise fits no table either when the whole model exceeds all ranks: the planner's failure, explained.
    with pytest.raises(
        PlanError,
        match=r"the planner found no placement for 26 tables on 2 ranks \(194.73 GiB of weights and optimizer "
        r"state in all, about 15.20 GiB per rank usable\)\. Together they need at least 13 ranks of this size\. "
        r"Options: use more GPUs.*offload=uvm_caching pipeline=prefetch",
    ):
        plan_job(
            [
                *H200,
                "sharding=row_wise",
                "sharding.hbm_cap_gb=16",
                "sharding.ddr_cap_gb=1",
                "data.global_batch_size=1024",
            ],
            world_size=2,
        )


def test_planner_failure_names_what_does_not_fit() -> None:
    # every table fits one H200 alone (the largest 38.15 GiB), all of them do not: the message says so, not
    # that the largest table is too big
    with pytest.raises(PlanError) as e:
        plan_job([*H200, "sharding.ddr_cap_gb=1"], world_size=1)  # no room in host memory for a UVM kernel
    msg = str(e.value)
    assert msg.startswith(
        "the planner found no placement for 26 tables on 1 rank (194.73 GiB of weights and optimizer state in all, "
        "about 132.81 GiB per rank usable). Together they need at least 2 ranks of this size. Options: use more GPUs"
    )
    assert "does not fit" not in msg
    # the tables fit by size, the batch's buffers do not
    with pytest.raises(
        PlanError,
        match=r"on 1 rank \(0.00 GiB .*\)\. The tables fit by size \(1 x 0.05 GiB\), so the planner's estimate of "
        r"the other memory at batch size 1048576 per rank \(input and output buffers\) does not: lower "
        r"data.batch_size",
    ):
        plan_job(["device=cuda", "sharding.hbm_cap_gb=0.05", "data.batch_size=1048576"], world_size=1)


def test_cuda_planning_without_a_gpu_needs_the_capacity() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: its capacity is used")
    with pytest.raises(PlanError, match=r"`sharding.hbm_cap_gb`: planning for CUDA on a machine without a GPU"):
        plan_job([*SMALL, "device=cuda"], world_size=8)


# ------------------------------------------------------------------------------------------- commands
def test_plan_command_prints_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrm.plan",
            *SMALL,
            "sharding=row_wise",
            "world_size=4",
            "local_world_size=2",
            f"out={out}",
            "--link-gbps",
            "400",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert re.fullmatch(
        r"sharding plan \(planner\) for 4 ranks \(2 per host\) on cpu, fingerprint [0-9a-f]{12}:", lines[0]
    ), lines[0]
    assert lines[1].split() == [
        "table",
        "sharding",
        "type",
        "kernel",
        "ranks",
        "shards",
        "(rows",
        "x",
        "cols)",
        "est.",
        "memory",
        "per",
        "rank",
    ]
    row = next(line for line in lines if line.startswith("t_cat_0 "))
    assert row.split()[:5] == ["t_cat_0", "row_wise", "fused", "0-3", "4x[16,16]"]
    assert sum(line.startswith("  rank ") for line in lines) == 4
    # the traffic table: 256 samples per rank; 26 bags to each of 4 ranks (int32), 214 int64 ids; the reduce-scatter
    # of [1024, 26 x 16] fp32 partial sums, the all-gather of [256, 416]; 117,569 dense gradients. At 400 Gb/s: 3/4
    # of the lengths, ids, reduce-scatter and all-gather and 3/2 of the all-reduce leave each rank, 3.67 MB: 73 us
    i = lines.index(next(line for line in lines if line.startswith("traffic per training step (256 samples")))
    assert lines[i + 3].split()[:2] == ["row_wise", "26"]
    assert lines[i + 4] == "all-reduce: 117,569 dense gradients (fp32)"
    assert lines[i + 5].endswith("their time at 400 Gb/s (50 GB/s, InfiniBand) per link:")
    want = "96 B 104.00 KiB 428.00 KiB 1.62 MiB 416.00 KiB 459.25 KiB 3.00 MiB 3.50 MiB 0.07 ms".split()
    assert [line.split()[1:] for line in lines[i + 8 : i + 12]] == [want] * 4
    assert json.loads(out.read_text())["world_size"] == 4
    bad = subprocess.run(
        [sys.executable, "-m", "dlrm.plan", *SMALL, "+sharding.constraints.t_x.min_partition=4"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "no table 't_x'" in bad.stderr


def test_trainer_prints_and_saves_the_plan_and_reuses_it(tmp_path: Path) -> None:
    common = [
        "trainer.max_steps=2",
        "data.num_train_samples=1024",
        "data.num_val_samples=256",
        "eval.every_n_steps=null",
        "logger.log_every_n_steps=1",
    ]
    d1, d2 = tmp_path / "a", tmp_path / "b"
    p1 = subprocess.run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d1}",
            "sharding=column_wise",
            "sharding.min_partition=8",
            *common,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p1.returncode == 0, p1.stdout + p1.stderr
    # stdout: one line; the plan and traffic tables are in train.log
    assert "sharding plan (planner) for 1 rank: tables 26 column_wise fused; the plan and step-traffic" in p1.stdout
    assert "t_cat_0   column_wise" not in p1.stdout
    log = (d1 / "train.log").read_text()
    assert "deduplicated): one rank, no collectives." in log  # the traffic beside the plan
    assert "t_cat_0   column_wise" in log
    saved = json.loads((d1 / "plan.json").read_text())
    assert {t["sharding_type"] for t in saved["tables"]} == {"column_wise"}
    assert all(s["sizes"][1] == 8 for t in saved["tables"] for s in t["shards"])
    p2 = subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={d2}", f"sharding.plan_path={d1 / 'plan.json'}", *common],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p2.returncode == 0, p2.stdout + p2.stderr
    assert f"sharding plan ({d1 / 'plan.json'})" in p2.stdout
    assert json.loads((d2 / "plan.json").read_text())["tables"] == saved["tables"]
    losses = [
        [r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
        for d in (d1, d2)
    ]
    assert len(losses[0]) == 2 and losses[0] == losses[1]  # same plan, same seed: the same run


@pytest.mark.parametrize("args", [["--link-gbps", "fast"], ["--link-gbps=0"], ["--link-gbps"]])
def test_bad_link_rate_is_one_error_line(args: List[str], capsys: pytest.CaptureFixture) -> None:
    from dlrm.plan import main

    assert main([*SMALL, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --link-gbps: got ") and err.count("\n") == 1 and "Gb/s per direction" in err


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["sharding.name=diagonal"], r"`sharding.name`: got 'diagonal'; choose sharding=auto\|table_wise"),
        (
            ["sharding=row_wise", "sharding.compute_kernel=dense"],
            r"`sharding.compute_kernel`: the dense kernel only runs "
            r"data_parallel",
        ),
        (
            ["sharding=data_parallel", "sharding.compute_kernel=fused"],
            r"`sharding.compute_kernel`: data_parallel tables",
        ),
        (["sharding.compute_kernel=uvm"], r"`sharding.compute_kernel`: got 'uvm'"),
        (
            ["+sharding.constraints.t_cat_0.sharding_types=[rowwise]"],
            r"`sharding.constraints.t_cat_0.sharding_types`: unknown value\(s\) \['rowwise'\]",
        ),
        (
            ["+sharding.constraints.t_cat_0.kernel=[fused]"],
            r"`sharding.constraints.t_cat_0`: unknown field\(s\) \['kernel'\]",
        ),
        (["+sharding.constraints.t_cat_0.min_partition=0"], r"`sharding.constraints.t_cat_0.min_partition`"),
        # wrong types: the constraint dict is untyped, so the schema's types are checked by hand
        (
            ["+sharding.constraints.t_cat_0.min_partition=abc"],
            r"^config key `sharding.constraints.t_cat_0.min_partition`: got 'abc'; give a whole number or null, "
            r"e.g. sharding.constraints.t_cat_0.min_partition=8$",
        ),
        (
            ["+sharding.constraints.t_cat_0.min_partition=true"],
            r"`sharding.constraints.t_cat_0.min_partition`: got True;",
        ),
        (
            ["+sharding.constraints.t_cat_3.pooling_factors=[a]"],
            r"^config key `sharding.constraints.t_cat_3.pooling_factors`: got \['a'\]; give a list of numbers or "
            r"null, e.g. sharding.constraints.t_cat_3.pooling_factors=\[2.0\]$",
        ),
        (
            ["+sharding.constraints.t_cat_0.batch_sizes=[1.5]"],
            r"`sharding.constraints.t_cat_0.batch_sizes`: got \[1.5\]; give a list of whole numbers or null",
        ),
        (
            ["+sharding.constraints.t_cat_0.sharding_types={row_wise:1}"],
            r"`sharding.constraints.t_cat_0.sharding_types`: got \{'row_wise': 1\}; give a list of names or null",
        ),
        (
            ["+sharding.constraints.t_cat_0.sharding_types=rowwise"],
            r"`sharding.constraints.t_cat_0.sharding_types`: unknown value\(s\) \['rowwise'\]",
        ),
    ],
)
def test_bad_sharding_config_names_the_key(overrides: List[str], match: str) -> None:
    from dlrm.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        to_config(compose(overrides))


def test_a_list_constraint_takes_one_bare_value() -> None:
    cfg = to_config(
        compose(
            [
                "+sharding.constraints.t_cat_0.sharding_types=row_wise",
                "+sharding.constraints.t_cat_0.compute_kernels=fused",
                "+sharding.constraints.t_cat_1.pooling_factors=2",
            ]
        )
    )
    c0, c1 = cfg.sharding.constraints["t_cat_0"], cfg.sharding.constraints["t_cat_1"]
    assert (c0.sharding_types, c0.compute_kernels, c0.min_partition) == (["row_wise"], ["fused"], None)
    assert c1.pooling_factors == [2.0] and type(c1.pooling_factors[0]) is float


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["data.batchsize=3"],
            "error: config key `data.batchsize` is not a known setting; the keys of `data` are: "
            + ", ".join(sorted(f.name for f in dataclasses.fields(DataConfig))),
        ),
        (
            ["data.batch_size=abc"],
            "error: Error merging override data.batch_size=abc "
            "(Value 'abc' of type 'str' could not be converted to Integer)",
        ),
        (["world_size=two"], "error: config key `world_size`: got 'two'; give a number of ranks, e.g. world_size=8"),
        # a setting or override with a leading --: Hydra's own message is a LexerNoViableAltException
        (
            ["--world_size=2"],
            "error: --world_size=2: write world_size=2 (settings and overrides take no leading --)",
        ),
        (["--world_size", "2"], "error: --world_size: write world_size=2 (settings and overrides take no leading --)"),
        (
            ["--data.batch_size=8"],
            "error: --data.batch_size=8: write data.batch_size=8 (settings and overrides take no leading --)",
        ),
        (
            ["--sharding", "row_wise"],
            "error: --sharding: write sharding=row_wise (settings and overrides take no leading --)",
        ),
        (["--force"], "error: --force: write force=true (settings and overrides take no leading --)"),
        (
            ["--worldsize"],
            "error: --worldsize: unknown option; the options are --link-gbps R, --step-ms X and --estimate (settings "
            "and overrides are key=value, e.g. world_size=2)",
        ),
        (["--estimate=yes"], "error: --estimate=yes: --estimate takes no value; write --estimate"),
        (["--step-ms", "3"], "error: --step-ms: sets the step time of --estimate; add --estimate, or drop it"),
        # a second value would silently replace the first
        (
            ["out=a.json", "out=b.json"],
            "error: config key `out`: given twice ('a.json', then 'b.json'); give it once",
        ),
        (
            ["world_size=2", "world_size=4"],
            "error: config key `world_size`: given twice ('2', then '4'); give it once",
        ),
        (
            ["--link-gbps", "400", "--link-gbps=3600"],
            "error: --link-gbps: given twice ('400', then '3600'); give it once",
        ),
        (["force=yes"], "error: config key `force`: got 'yes'; give true or false, e.g. force=true"),
        (
            ["+sharding.constraints.t_cat_0.min_partition=abc"],
            "error: config key `sharding.constraints.t_cat_0.min_partition`: got 'abc'; give a whole number or "
            "null, e.g. sharding.constraints.t_cat_0.min_partition=8",
        ),
    ],
)
def test_plan_command_bad_override_is_one_error_line(args: List[str], line: str, capsys: pytest.CaptureFixture) -> None:
    from dlrm.plan import main

    assert main([*SMALL, *args]) == 2
    out = capsys.readouterr()
    assert out.err == line + "\n" and out.out == ""


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["world_size=4", "local_world_size=0"],
            "error: config key `local_world_size`: must be >= 1 and divide world_size=4 (got 0); give the ranks per "
            "host, e.g. local_world_size=8",
        ),
        (
            ["world_size=4", "local_world_size=-1"],
            "error: config key `local_world_size`: must be >= 1 and divide world_size=4 (got -1); give the ranks per "
            "host, e.g. local_world_size=8",
        ),
        (
            ["world_size=4", "local_world_size=3"],
            "error: config key `local_world_size`: must be >= 1 and divide world_size=4 (got 3); give the ranks per "
            "host, e.g. local_world_size=8",
        ),
        (["out="], "error: config key `out`: '': empty; give the plan.json file to write, e.g. out=plan.json"),
        (
            ["out={tmp}/nonexistent/plan.json"],
            "error: config key `out`: '{tmp}/nonexistent/plan.json': no such directory '{tmp}/nonexistent'; give "
            "the plan.json file to write, e.g. out=plan.json",
        ),
        (
            ["out={tmp}"],
            "error: config key `out`: '{tmp}': a directory; give the plan.json file to write, e.g. out=plan.json",
        ),
        pytest.param(
            ["out=/proc/plan.json"],  # os.access passes for root here; the file cannot be created
            "error: config key `out`: '/proc/plan.json': directory '/proc' is not writable; give the plan.json file "
            "to write, e.g. out=plan.json",
            marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc"),
        ),
    ],
)
def test_plan_command_bad_layout_or_out_is_refused_before_planning(
    args: List[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from dlrm.plan import main

    assert main([*SMALL, *(a.format(tmp=tmp_path) for a in args)]) == 2
    out = capsys.readouterr()
    assert out.err == line.format(tmp=tmp_path) + "\n" and out.out == ""


def test_plan_command_refuses_an_existing_out_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing ``out=`` (e.g. the hand-balanced conf/plans/*.json) is refused before planning; ``force=true``
    replaces it."""
    import dlrm.plan
    from dlrm.plan import main

    shipped = REPO / "conf" / "plans" / "dlrm_v2_cap4m_2gpu_table_wise.json"
    f = tmp_path / "p.json"
    f.write_text("{}\n")
    before = shipped.read_bytes()

    def no_planning(*args, **kwargs):
        raise AssertionError("planned before refusing out=")

    with monkeypatch.context() as m:
        m.setattr(dlrm.plan, "_plan_job", no_planning)
        for path in (shipped, f):
            assert main([*SMALL, f"out={path}"]) == 2
            out = capsys.readouterr()
            assert out.err == (
                f"error: config key `out`: {str(path)!r}: already exists; pass another path, or force=true to "
                "overwrite it\n"
            )
            assert out.out == ""
    assert shipped.read_bytes() == before and f.read_text() == "{}\n"
    assert main([*SMALL, f"out={f}", "force=true"]) == 0
    assert json.loads(f.read_text())["world_size"] == 1
    assert main([*SMALL, f"out={tmp_path / 'new.json'}", "force=false"]) == 0  # a new file needs no force


def test_plan_is_the_same_under_every_hash_seed(tmp_path: Path) -> None:
    """TorchRec's enumerator orders a table's options through set intersections, whose order follows
    PYTHONHASHSEED; the planner keeps the first of equal cost. With the deterministic enumerator the same command
    gives the same plan.json (and fingerprint) in processes with different hash seeds (this 2-rank job planned
    row_wise under some seeds and table_row_wise under others with TorchRec's own enumerator)."""
    import os

    docs = []
    for seed in ("0", "2", "7"):
        out = tmp_path / f"plan_{seed}.json"
        p = subprocess.run(
            [sys.executable, "-m", "dlrm.plan", "world_size=2", "data.global_batch_size=256", f"out={out}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert p.returncode == 0, p.stderr[-2000:]
        docs.append(json.loads(out.read_text()))
        assert re.search(r"fingerprint [0-9a-f]{12}:", p.stdout)
    assert docs[0] == docs[1] == docs[2]
    assert re.fullmatch(r"[0-9a-f]{12}", docs[0]["fingerprint"])


def test_help_of_every_command_is_whole_and_says_what_to_run() -> None:
    """train.py's help is the trainer's (groups, examples, where every key is), not Hydra's config dump; the
    preprocessing lists its subcommands; dlrm.export and dlrm.plan print their docstrings whole, unbroken."""
    import dlrm.export
    import dlrm.plan

    def help_of(*cmd: str) -> str:
        p = subprocess.run([sys.executable, *cmd, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and p.stderr == "", p.stderr
        return p.stdout

    train = help_of("train.py")
    assert train.startswith("DLRM-v2 trainer (DLRM + DCNv2 on PyTorch, TorchRec and FBGEMM_GPU).")
    for part in ("Examples:", "experiment: criteo_sample, mlperf_dlrmv2", "docs/configuration.md", "--cfg job"):
        assert part in train
    assert "== Config ==" not in train and "powered by Hydra" not in train
    pre = help_of("data/preprocess_criteo.py")
    assert "\n  multihot   write the MLPerf multi-hot" in pre and "\n  verify     check the files" in pre
    export = help_of("-m", "dlrm.export")
    assert dlrm.export.__doc__.strip() in export
    plan = help_of("-m", "dlrm.plan")
    assert plan == dlrm.plan.__doc__ + "\n"
    assert "device=cuda \\\n        sharding.hbm_cap_gb=139.8 --estimate" in plan  # a continued line, not joined
