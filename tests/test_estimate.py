"""``dlrm.estimate`` and ``python -m dlrm.plan ... --estimate``: the arithmetic by hand, the interpolation, the
CLI block and its errors.

    .venv/bin/python -m pytest -q tests/test_estimate.py
"""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from dlrm import estimate as est
from dlrm.data import steps_per_epoch
from dlrm.plan import main


def test_epoch_and_target_by_hand() -> None:
    e = est.estimate(65536, 8, compute_ms=8.0, comm_ms=1.0)
    # 4,195,197,692 = 64,013 x 65,536 + 41,724: the partial batch is one more step, as the trainer runs it
    assert e.steps_per_epoch == 64014 and e.per_gpu_batch == 8192
    assert e.steps_per_epoch == steps_per_epoch(est.TRAIN_SAMPLES, 65536, 8)
    evals = 20 * 89_137_319 / (8 * 5.84e6)  # 38.16 s of eager evaluation per epoch
    assert e.eval_per_epoch == pytest.approx(evals, rel=1e-12)
    assert e.epoch_low == pytest.approx(64014 * 0.008 + evals, rel=1e-12)
    assert e.epoch_high == pytest.approx(64014 * 0.009 + evals, rel=1e-12)
    assert e.epochs_to_target == 0.7911  # the reference convergence points at global batch 65536
    assert e.target_high == pytest.approx(0.7911 * (64014 * 0.009 + evals), rel=1e-12)
    text = est.format_estimate(e, "given")
    assert text.startswith("ESTIMATE (arithmetic on measured figures, not a measurement) for 8 x H200")
    assert "8.00-9.00 ms" in text and "0.91-1.02 M samples/s per GPU of training time" in text  # 8192 / 9, 8 ms
    assert "to AUC 0.80275 (0.791 epoch" in text and "MLPerf Training v5.0: 3.44 min" in text
    assert "20 evaluations of 89,137,319 rows = 38 s at 5.84 M samples/s per GPU, measured on one H100)" in text
    graphed = est.estimate(65536, 8, compute_ms=8.0, comm_ms=1.0, eval_kind=est.GRAPHED_RANKS)  # captured forward
    assert graphed.eval_per_epoch == pytest.approx(20 * 89_137_319 / (8 * 7.51e6), rel=1e-12)  # 29.67 s
    assert graphed.epoch_low == pytest.approx(64014 * 0.008 + graphed.eval_per_epoch, rel=1e-12)


def test_epochs_to_target_are_the_reference_convergence_points() -> None:
    """:data:`RCP_EPOCHS` are the olympic means of the RCP file of the pinned mlperf-logging, as its rcp_checker.py
    scores them (the lowest and the highest run dropped); between batches they are interpolated linearly."""
    import json
    import os

    import mlperf_logging

    path = os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker", "training_5.1.0")
    with open(os.path.join(path, "rcps_dlrm_dcnv2.json"), encoding="utf-8") as f:
        rcps = json.load(f)
    olympic = {}
    for r in rcps.values():
        runs = sorted(r["Epochs to converge"])[1:-1]
        olympic[r["BS"]] = round(sum(runs) / len(runs), 4)
    assert olympic == est.RCP_EPOCHS
    assert est.epochs_to_target(65536) == 0.7911
    assert est.epochs_to_target(60416) == pytest.approx((0.7615 + 0.7911) / 2, rel=1e-12)  # halfway 55296-65536
    assert (est.epochs_to_target(16384), est.epochs_to_target(262144)) == (0.7071, 0.9583)  # the nearest batch


def test_measured_step_is_interpolated_in_the_batch_and_bounded() -> None:
    assert est.step_ms("adagrad", est.EAGER, 8192) == (7.365, False)
    ms, _ = est.step_ms("adagrad", est.EAGER, 16384)
    assert ms == pytest.approx(7.365 + (12.580 - 7.365) / 3, rel=1e-12)
    with pytest.raises(
        ValueError, match="outside the measured 4096-65536 of perf=fast pipeline=graphed; give --step-ms"
    ):
        est.step_ms("adagrad", est.GRAPHED, 131072)
    with pytest.raises(ValueError, match="no measured step for optimizer.sparse_type=sgd"):
        est.step_ms("sgd", est.EAGER, 8192)


def test_step_kind_picks_the_several_rank_graph_on_several_ranks() -> None:
    assert [est.step_kind(False, 8), est.step_kind(True, 1), est.step_kind(True, 8)] == [
        est.EAGER,
        est.GRAPHED,
        est.GRAPHED_RANKS,
    ]
    assert est.step_ms("adagrad", est.GRAPHED_RANKS, 8192) == (3.684, False)
    assert est.step_ms("rowwise_adagrad", est.GRAPHED_RANKS, 8192) == (3.608, False)
    with pytest.raises(ValueError, match="outside the measured 8192-32768 of perf=fast pipeline=graphed, several"):
        est.step_ms("adagrad", est.GRAPHED_RANKS, 4096)
    # skewed ids where measured (8192), else the uniform ids' figure
    assert est.step_ms("adagrad", est.GRAPHED_RANKS, 8192, skewed=True) == (3.182, True)
    assert est.step_ms("adagrad", est.GRAPHED_RANKS, 32768, skewed=True) == (12.395, False)
    assert est.step_ms("adagrad", est.EAGER, 8192, skewed=True) == (7.365, False)
    assert est.step_source(est.GRAPHED_RANKS, True) == (
        "perf=fast pipeline=graphed, several-rank graph, forced on one H200, skewed ids (--ids criteo), measured"
    )


def test_measured_steps_are_the_performance_md_figures() -> None:
    """``STEP_MS`` restates rows of docs/performance.md; every figure in it must be one there."""
    doc = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    for key, per_batch in [*est.STEP_MS.items(), *est.SKEWED_STEP_MS.items()]:
        for batch, ms in per_batch.items():
            assert re.search(rf"(?<![\d.]){ms:.3f}(?!\d)", doc), (key, batch, ms)


SMALL = ["model=dlrm_v2_small", "world_size=2", "device=cuda", "sharding.hbm_cap_gb=80", "data.global_batch_size=16384"]


def test_plan_cli_prints_the_estimate(capsys: pytest.CaptureFixture) -> None:
    assert main([*SMALL, "perf=fast", "optimizer.sparse_type=adagrad", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATE (arithmetic on measured figures, not a measurement) for 2 x H200, 8192 samples per GPU" in out
    assert "7.37 ms compute (perf=fast on one H200, uniform ids, measured)" in out
    assert main([*SMALL, "--estimate", "--step-ms", "5"]) == 0
    assert "5.00 ms compute (--step-ms)" in capsys.readouterr().out


def test_plan_cli_estimate_errors(capsys: pytest.CaptureFixture) -> None:
    assert main([*SMALL, "--estimate"]) == 2  # perf=fp32: no measured figure
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: --estimate: measured figures are for perf=fast (this config: perf=fp32); give --step-ms"
    )
    assert main([*SMALL, "--estimate", "--step-ms", "x"]) == 2
    assert "error: --step-ms: got 'x'" in capsys.readouterr().err


def test_estimate_uses_the_configured_epoch(tmp_path, capsys: pytest.CaptureFixture) -> None:
    """--estimate counts the epoch of the data the config names (MLPerf's time to the target only for MLPerf's);
    a dataset hashed into other table rows is refused before planning, as the trainer refuses it."""
    import numpy as np

    from dlrm.data import binary_format as B

    assert main([*SMALL, "--estimate", "--step-ms", "5", "data.num_train_samples=100000"]) == 0
    out = capsys.readouterr().out
    assert (
        "  one epoch of the synthetic data (100,000 samples, 7 steps, 20 evaluations of 16,384 rows = 0 s at 5.84 M "
        "samples/s per GPU, measured on one H100): "
        "0.0-0.0 min\n  to AUC 0.80275: not estimated, MLPerf's reference convergence points are for its Criteo 1TB "
        "epoch\n"
    ) in out
    from dlrm.config import ModelConfig

    rows = ModelConfig(row_cap=50).table_rows
    day = (np.zeros((300, 13), np.float32), np.zeros((300, 26), np.int32), np.zeros(300, np.int8))
    B.write_dataset(str(tmp_path / "bin"), [day, day, day], rows)
    binary = [*SMALL, "data=criteo_binary", f"data.dataset_dir={tmp_path / 'bin'}", "--estimate", "--step-ms", "5"]
    assert main([*binary, "model.row_cap=50"]) == 0
    assert (
        f"one epoch of {tmp_path / 'bin'} (600 samples, 1 steps, 20 evaluations of 150 rows" in capsys.readouterr().out
    )
    assert main(binary) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config key `model.num_embeddings_per_feature` / `model.row_cap`: the model's table")
    assert "Traceback" not in err and err.count("\n") == 1


def test_plan_refuses_a_world_size_it_cannot_plan_at_once(capsys: pytest.CaptureFixture) -> None:
    assert main(["world_size=10000"]) == 2
    assert capsys.readouterr().err == (
        "error: config key `world_size`: 10000 ranks is more than this planner plans (1024): TorchRec's planner "
        "copies every rank's state for each of its hundreds of proposals, so its time grows with the world size "
        "(about a minute at 1024, far longer beyond); plan for at most 1024 ranks\n"
    )


def test_plan_cli_estimate_uses_the_graphed_step_that_applies(tmp_path, capsys: pytest.CaptureFixture) -> None:
    """``pipeline=graphed``: the several-rank graph's figure on 2 ranks, the one-rank graph's on one; a plan the
    graph refuses (grid_shard tables on several ranks) is refused as the trainer refuses it; row_wise and
    table_row_wise plans are taken, their whole bags' TBE time added."""
    graphed = ["perf=fast", "pipeline=graphed", "optimizer.sparse_type=adagrad", "--estimate"]
    assert main([*SMALL, "sharding=table_wise", *graphed]) == 0
    out = capsys.readouterr().out
    assert "3.68 ms compute (perf=fast pipeline=graphed, several-rank graph, forced on one H200, uniform ids" in out
    one = [a for a in SMALL if a != "world_size=2" and not a.startswith("data.global")]
    assert main([*one, "data.batch_size=8192", *graphed]) == 0
    assert "3.60 ms compute (perf=fast pipeline=graphed on one H200, uniform ids, measured)" in capsys.readouterr().out
    tsv = tmp_path / "day_0.tsv"  # real Criteo rows in form: label, 13 counts, 26 hashed categories
    tsv.write_text("".join(f"{i % 2}\t" + "\t".join(["1"] * 13 + [f"{i:08x}"] * 26) + "\n" for i in range(64)))
    criteo = ["data=criteo_tsv", f"data.train_path={tsv}", "data.global_batch_size=16384"]
    assert main([*SMALL, *criteo, "sharding=table_wise", *graphed]) == 0  # real Criteo ids: the skewed figure
    assert "3.18 ms compute (perf=fast pipeline=graphed, several-rank graph, forced on one H200, skewed ids" in (
        capsys.readouterr().out
    )
    assert main([*SMALL, "sharding=grid_shard", *graphed]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --estimate: config key `pipeline.name`: pipeline=graphed sends the ids with fixed")
    assert "grid_shard tables send each id to the rank that holds its row" in err
    assert main([*SMALL, "sharding=row_wise", *graphed]) == 0  # taken: whole bags, their TBE time added
    assert "ms of TBE for row_wise tables' whole bags, estimated)" in capsys.readouterr().out
    assert main([*SMALL, "sharding=table_row_wise", *graphed]) == 0  # one host of 2: whole bags on both ranks
    assert "ms of TBE for table_row_wise tables' whole bags, estimated)" in capsys.readouterr().out


def test_whole_bag_tbe_time_of_row_split_tables_in_the_graph() -> None:
    """The several-rank graph looks up row_wise tables' whole bags on every rank: (world - 1) x their share of the
    ids more TBE time; MLPerf's cat_20 and cat_21 (100 + 27 of 214 ids per sample) on 8 ranks at 8192: 4.59 ms.
    table_row_wise tables' on every rank of their host: (local world - 1) x their share."""
    assert est.whole_bag_tbe_ms(8192, 8, 127.0, 214.0) == pytest.approx(1.106 * 7 * 127 / 214)
    assert round(est.whole_bag_tbe_ms(8192, 8, 127.0, 214.0), 2) == 4.59
    assert est.whole_bag_tbe_ms(4096, 2, 1.0, 2.0) == pytest.approx(1.106 / 2 / 2)  # half the batch: scaled
    assert est.whole_bag_tbe_ms(20480, 2, 1.0, 1.0) == pytest.approx((1.106 + 3.863) / 2)  # interpolated
    assert est.whole_bag_tbe_ms(8192, 1, 1.0, 1.0) == est.whole_bag_tbe_ms(8192, 8, 0.0, 1.0) == 0.0
    # table_row_wise: whole bags on the ranks of the table's host, (local_world_size - 1) x their ids more
    assert est.whole_bag_tbe_ms(8192, 16, 0.0, 214.0, 127.0, 8) == pytest.approx(1.106 * 7 * 127 / 214)
    assert est.whole_bag_tbe_ms(8192, 16, 1.0, 4.0, 2.0, 2) == pytest.approx(1.106 * (15 * 1 + 1 * 2) / 4)
    assert est.whole_bag_tbe_ms(8192, 16, 0.0, 1.0, 1.0, 1) == 0.0  # one rank per host: no id looked up twice
