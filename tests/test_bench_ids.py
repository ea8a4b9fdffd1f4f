"""``bench.ids``: the skewed id generator draws the power law its fit assumes (the fit recovers a known exponent,
distinct counts match their expectation), ids stay in range, bags are the MLPerf expansion of the 1-hot id, the
stored exponents are the fit of the real Criteo rows and reproduce their repeat rates, and each benchmark takes
``--ids``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import torch

from bench import ids, runner
from conftest import KAGGLE_SAMPLE, TB_SAMPLE, needs_kaggle, needs_tb, run_gloo
from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS, ModelConfig
from dlrm.data import MultiHot


def _draw(rows: int, s: float, n: int, seed: int) -> np.ndarray:
    return ids.PowerLawIds([rows], [s]).draw(0, n, torch.Generator().manual_seed(seed)).numpy()


@pytest.mark.parametrize(
    "rows,s,n,tol",
    [(40_000_000, 1.27, 5000, 0.03), (4_000_000, 0.95, 5000, 0.03), (7424, 1.39, 1000, 0.05), (63, 3.12, 2000, 0.4)],
)
def test_fit_recovers_the_exponent_of_generated_ids(rows: int, s: float, n: int, tol: float) -> None:
    """The fit of ``n`` generated ids lands within ``tol`` of the exponent they were drawn with (the spread of the
    fit over 20 seeds is 3-8 times smaller: 0.003-0.012 for the first three, 0.17 for the 63-row table)."""
    x = _draw(rows, s, n, seed=1)
    assert abs(ids.fit_exponent(rows, n, len(np.unique(x))) - s) <= tol


@pytest.mark.parametrize("rows,s", [(40_000_000, 1.27), (7424, 1.39), (63, 3.12), (3, 8.6), (1000, 0.0)])
def test_distinct_ids_match_the_expectation_the_fit_uses(rows: int, s: float) -> None:
    n, k = 1000, 40
    seen = np.array([len(np.unique(_draw(rows, s, n, seed))) for seed in range(k)])
    # within 2%, or 4 standard errors of the mean where the count itself is small (the 3-row table: 2 +- 0.4)
    tol = max(0.02 * ids.expected_distinct(rows, s, n), 4 * seen.std() / np.sqrt(k))
    assert abs(seen.mean() - ids.expected_distinct(rows, s, n)) <= tol
    if s == 0.0:  # exponent 0 is uniform
        assert ids.expected_distinct(rows, s, n) == pytest.approx(rows * (1 - (1 - 1 / rows) ** n), rel=1e-9)


def test_ids_in_range_ranks_scattered() -> None:
    for rows in (1, 3, 1000, 40_000_000):
        x = _draw(rows, 1.2, 20000, seed=0)
        assert x.dtype == np.int64 and x.min() >= 0 and x.max() < rows
    x = _draw(1000, 1.2, 20000, seed=0)
    counts = np.bincount(x, minlength=1000)
    # rank k is row (SCATTER * k) % rows: a bijection, the most frequent rank 0 at row 0, rank 1 at row 761
    assert len(np.unique((np.arange(1000) * ids.SCATTER) % 1000)) == 1000
    assert np.argsort(counts)[::-1][:2].tolist() == [0, ids.SCATTER % 1000] == [0, 761]
    starts, widths = ids.rank_grid(40_000_000)
    assert starts[0] == 0 and (starts[1:] == starts[:-1] + widths[:-1]).all() and starts[-1] + widths[-1] == 40_000_000
    assert len(starts) < 6000


def test_bags_are_the_mlperf_expansion_of_the_one_hot_id() -> None:
    rows = [min(r, 5000) for r in MLPERF_NUM_EMBEDDINGS]
    sizes = list(MLPERF_MULTI_HOT_SIZES)
    b = 512
    v = ids.skewed_values(rows, sizes, "criteo", b, torch.Generator().manual_seed(3))
    assert v.dtype == torch.int64 and v.numel() == b * sum(sizes)
    again = ids.skewed_values(rows, sizes, "criteo", b, torch.Generator().manual_seed(3))
    assert torch.equal(v, again)  # a seed gives the same batch
    mh = MultiHot(rows, sizes, 0)  # the trainer's MLPerf expansion (seed 0)
    one_hot = ids.PowerLawIds(rows, ids.EXPONENTS["criteo"][1])
    g = torch.Generator().manual_seed(3)
    at = 0
    for t, (r, m) in enumerate(zip(rows, sizes)):
        bags = v[at : at + b * m].reshape(b, m)
        at += b * m
        first = one_hot.draw(t, b, g)
        assert torch.equal(bags[:, 0], first) and int(bags.min()) >= 0 and int(bags.max()) < r
        if m > 1:
            assert torch.equal(bags, mh.tables[t][first].long())
            # a repeated 1-hot id repeats its whole bag
            u, inv = torch.unique(first, return_inverse=True)
            assert len(u) < b
            for k in range(len(u)):
                same = bags[inv == k]
                assert (same == same[0]).all()


def _fit_and_repeat_rates(path: Path, dist: str) -> None:
    fit = ids.fit_file(str(path))
    assert tuple(r["s"] for r in fit) == ids.EXPONENTS[dist][1]  # the stored table is this file's fit
    # ids drawn with the fitted exponents repeat as often as the real rows (mean of 10 samples of the same size)
    n = fit[0]["n"]
    for r in fit:
        if r["rows"] < 1000 or r["s"] in (0.0, ids.MAX_EXPONENT):
            continue  # small tables: the sample covers them; their exponent is weakly determined
        draws = _draw(r["rows"], r["s"], 10 * n, seed=r["table"]).reshape(10, n)
        sim = np.mean([1 - len(np.unique(x)) / n for x in draws])
        assert sim == pytest.approx(r["repeat_rate"], abs=0.03), r


@needs_tb
def test_criteo_1tb_fit_and_repeat_rates() -> None:
    _fit_and_repeat_rates(TB_SAMPLE, "criteo")


@needs_kaggle
def test_criteo_kaggle_fit_and_repeat_rates() -> None:
    _fit_and_repeat_rates(KAGGLE_SAMPLE, "criteo_kaggle")


def test_fit_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="5 distinct rows among 4 ids"):
        ids.fit_exponent(100, 4, 5)
    assert ids.fit_exponent(3, 1000, 3) == 0.0  # every row seen: no skew can be told apart from none


def test_batch_pool_of_skewed_ids() -> None:
    """``make_batches(ids="criteo")`` (every benchmark's pool): the same KJT layout as uniform ids, ids in range,
    and far fewer distinct rows in the big tables."""
    mc = ModelConfig(row_cap=20000, multi_hot_sizes=list(MLPERF_MULTI_HOT_SIZES))
    cpu = torch.device("cpu")
    sk = runner.make_batches(mc, 256, 1, cpu, False, seed=7, ids="criteo", ids_dtype=torch.int32)[0].sparse_features
    un = runner.make_batches(mc, 256, 1, cpu, False, seed=7)[0].sparse_features
    assert sk.values().dtype == torch.int32 and torch.equal(sk.lengths(), un.lengths())
    for t, (key, r) in enumerate(zip(sk.keys(), mc.table_rows)):
        a, u = sk[key].values(), un[key].values()
        assert int(a.min()) >= 0 and int(a.max()) < r
        if r == 20000 and mc.multi_hot_sizes[t] > 1:
            assert len(torch.unique(a)) < 0.8 * len(torch.unique(u)), key


def _throughput_worker(rank: int, world: int, out: str) -> List[Dict[str, Any]]:
    from bench import throughput

    torch.set_num_threads(1)
    return throughput.main(["--smoke", "--variants", "fp32", "--ids", "criteo", "--out", out])


def test_throughput_takes_ids(tmp_path: Path) -> None:
    rows = run_gloo(1, _throughput_worker, str(tmp_path), timeout=300)[0]
    assert [r["config"] for r in rows] == ["fp32"] and "error" not in rows[0] and rows[0]["ms_median"] > 0
    assert json.loads((tmp_path / "throughput.json").read_text())["meta"]["ids"] == "criteo"
    assert "; KJT ids int64, criteo)" in (tmp_path / "throughput.md").read_text().splitlines()[0]


def test_e2e_passes_ids_to_the_step_benchmark_and_the_dataset(tmp_path: Path, monkeypatch: Any) -> None:
    """``bench.e2e --ids criteo``: the generated dataset's 1-hot ids are skewed (regenerated when the distribution
    changes) and the step benchmark runs with ``--ids criteo``."""
    from bench import e2e, loader
    from dlrm.data import binary_format

    cmds: List[List[str]] = []

    def step(args: Any) -> Dict[str, Any]:
        cmds.append(["--ids", args.ids])
        return {"samples_per_s": 1.0, "step_ms": 1.0}

    monkeypatch.setattr(e2e, "run_step_bench", step)
    monkeypatch.setattr(e2e, "run_trainer", lambda source, args: {"source": source, "error": "not run"})
    e2e.main(["--smoke", "--dir", str(tmp_path), "--ids", "criteo", "--sources", "synthetic"])
    assert cmds == [["--ids", "criteo"]]
    assert (tmp_path / "ids.txt").read_text() == "criteo\n"
    sparse = np.load(tmp_path / "day_0_sparse.npy")
    meta = binary_format.read_dataset_meta(str(tmp_path))
    big = [t for t, r in enumerate(meta["table_rows"]) if r == 1000]
    s = ids.EXPONENTS["criteo"][1]
    for t in big:  # uniform would see about 870 of the 1000 rows in 2048 ids
        assert len(np.unique(sparse[:, t])) == pytest.approx(ids.expected_distinct(1000, s[t], len(sparse)), rel=0.1)
    loader.generate(str(tmp_path), 4096, 1000, "uniform")
    assert (tmp_path / "ids.txt").read_text() == "uniform\n"
    sparse = np.load(tmp_path / "day_0_sparse.npy")
    assert all(len(np.unique(sparse[:, t])) > 800 for t in big)


def test_fit_cli_prints_the_table_and_refuses_a_bad_file(tmp_path: Path, capsys: Any) -> None:
    f = tmp_path / "rows.tsv"
    cats = ["\t".join(format(i * 7 + t, "x") for t in range(26)) for i in range(50)]
    f.write_text("".join(f"0{chr(9) * 13}\t{c}\n" for c in cats))
    fit = ids.main(["--fit", str(f)])
    big = [r for r in fit if r["rows"] >= 1000]  # 50 different categories, no repeats: no skew
    assert len(big) == 17 and all((r["distinct"], r["repeat_rate"], r["s"]) == (50, 0.0, 0.0) for r in big)
    assert "| C1 | 40000000 | 50 | 50 | 0.000 | 0.000 |" in capsys.readouterr().out
    f.write_text("0\t1\n")
    with pytest.raises(SystemExit) as e:
        ids.main(["--fit", str(f)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {f}:1: 2 tab-separated fields, expected 40")
