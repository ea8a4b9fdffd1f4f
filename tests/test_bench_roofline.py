"""``bench.roofline``: the products it times are the model's, its count of the TBE's distinct rows matches a
simulation, and the CPU smoke run reports every part (speed itself is measured on GPUs: docs/performance.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench import roofline
from dlrm.config import compose, to_config


def test_layers_are_the_mlperf_models_and_count_its_flop() -> None:
    m = to_config(compose(roofline.MLPERF)).model
    shapes = [(k, n) for _, k, n in roofline.layers(m)]
    dcn = [(3456, 512), (512, 3456)] * 3
    assert shapes == [(13, 512), (512, 256), (256, 128), *dcn, (3456, 1024), (1024, 1024), (1024, 512), (512, 256),
                      (256, 1)]  # fmt: skip
    # forward, input gradient and weight gradient: 6 B k n FLOP a layer; sum of k n: 16,030,464
    assert sum(6 * 32768 * k * n for k, n in shapes) == 16_030_464 * 6 * 32768 == 3_151_717_466_112


@pytest.mark.parametrize("rows,hot,batch", [(1000, 3, 500), (50, 2, 40), (4, 1, 4), (1, 5, 3)])
def test_distinct_rows_match_a_simulation_of_uniform_ids(rows: int, hot: int, batch: int) -> None:
    tables = f"model.num_embeddings_per_feature=[{','.join([str(rows)] * 26)}]"
    hots = f"model.multi_hot_sizes=[{','.join([str(hot)] * 26)}]"
    m = to_config(compose([*roofline.SMOKE, tables, hots, "model.row_cap=null"])).model
    t = roofline.tables(m, batch)
    expected = rows * (1 - (1 - 1 / rows) ** (hot * batch))  # each row missed by all hot * batch ids
    assert t["distinct_rows"] == pytest.approx(26 * expected, rel=1e-12)
    assert t["ids"] == 26 * hot * batch
    g = np.random.default_rng(0)
    seen = np.mean([len(np.unique(g.integers(0, rows, hot * batch))) for _ in range(4000)])
    assert seen == pytest.approx(expected, rel=0.01)
    dim = m.embedding_dim  # fp32 weights and state read and written per distinct row, a bf16 gradient row per id
    assert t["backward_bytes"] == pytest.approx(t["distinct_rows"] * 16 * dim + t["ids"] * 2 * dim)
    assert t["forward_bytes"] == pytest.approx(t["distinct_rows"] * 4 * dim + batch * 26 * 2 * dim)


def test_smoke_run_reports_every_part() -> None:
    out = roofline.main(["--smoke", "--reps", "1"])
    assert out["device"] == "cpu" and out["batch"] == 64
    assert [r["layer"] for r in out["products"]["layers"]][3:5] == ["dcn.0.V", "dcn.0.W"]
    assert all(len(r["ms"]) == 3 and min(r["ms"]) > 0 for r in out["products"]["layers"])
    assert out["copy"]["bytes"] == 8 * 2**20 and out["copy"]["gb_per_s"] > 0
    assert out["dcn"]["in_features"] == 16 * 27 and out["dcn"]["ms"] > 0


@pytest.mark.parametrize("rows,hot,batch,s", [(1000, 3, 500, 1.27), (50000, 7, 2000, 1.05), (63, 1, 300, 3.12),
                                              (4000, 100, 200, 1.3)])  # fmt: skip
def test_distinct_rows_of_skewed_ids_match_a_simulation(rows: int, hot: int, batch: int, s: float) -> None:
    """``--ids criteo``: power-law 1-hot ids, each bag the MLPerf expansion of its 1-hot id (bench.ids)."""
    from bench import ids
    from dlrm.data.multihot import build_tables

    expected = ids.expected_rows(rows, s, hot, batch)
    draw = ids.PowerLawIds([rows], [s])
    g = torch.Generator().manual_seed(0)
    seen = []
    for seed in range(12):  # a fresh expansion table now and then: the count is an expectation over them too
        table = build_tables([rows], [hot], seed=seed)[0]
        for _ in range(5):
            one = draw.draw(0, batch, g).numpy()
            seen.append(len(np.unique(one if table is None else table[one])))
    assert np.mean(seen) == pytest.approx(expected, rel=0.015)
    assert expected < ids.expected_rows(rows, None, hot, batch)  # fewer rows than uniform ids touch


def test_tables_follow_the_id_distribution() -> None:
    from bench import ids

    m = to_config(compose(roofline.MLPERF)).model
    uni, sk = roofline.tables(m, 32768), roofline.tables(m, 32768, "criteo")
    s = ids.EXPONENTS["criteo"][1]
    want = sum(ids.expected_rows(r, e, h, 32768) for r, e, h in zip(m.table_rows, s, m.multi_hot_sizes))
    assert sk["distinct_rows"] == pytest.approx(want, rel=1e-12) and sk["ids"] == uni["ids"] == 32768 * 214
    # the figures docs/performance.md's method gives
    assert [round(t["distinct_rows"] / 1e6, 2) for t in (sk, uni)] == [0.72, 4.38]
    assert [round(t["backward_bytes"] / 1e9, 2) for t in (sk, uni)] == [3.27, 10.76]
    out = roofline.main(["--smoke", "--reps", "1", "--ids", "criteo"])
    assert out["ids"] == "criteo" and out["tables"] == roofline.tables(to_config(compose(roofline.SMOKE)).model, 64,
                                                                       "criteo")  # fmt: skip
