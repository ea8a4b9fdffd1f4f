"""``bench.preprocess`` on two tiny days: the generated TSV, the byte counts it reports against the files written,
and the Criteo 1TB projection's arithmetic (speed itself is not asserted: it is a property of the host)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from bench import preprocess as BP
from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS
from dlrm.data.preprocess_passes import parse_block

DAYS, ROWS_PER_DAY, WORKERS, CAP = 2, 3000, 2, 1000
# Criteo 1TB: days 0-22 (MLPerf training samples) plus day 23 (validation + test rows)
TB_ROWS = 4_195_197_692 + 89_137_319 + 89_137_318
CAPPED = [min(r, CAP) for r in MLPERF_NUM_EMBEDDINGS]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    root = tmp_path_factory.mktemp("bench_preprocess")
    return root, BP.bench(str(root), DAYS, ROWS_PER_DAY, WORKERS, CAP)


def test_generated_tsv(run: tuple) -> None:
    root, res = run
    total = 0
    for d in range(DAYS):
        data = (root / "tsv" / f"day_{d}").read_bytes()
        total += len(data)
        labels, ints, cats = parse_block(data)  # the preprocessing's vectorised path takes every line
        assert labels.shape == (ROWS_PER_DAY,) and ints.shape == (ROWS_PER_DAY, 13) and cats.shape[1] == 26
        assert (ints[:, BP.NEG_COLUMN] == -1).any() and ints.min() == -1
        fields = [line.split(b"\t") for line in data.split(b"\n")[:-1]]
        assert {len(f) for f in fields} == {40}
        assert {len(c) for f in fields for c in f[14:]} == {0, 8}
    assert res["input"]["bytes"] == total
    assert res["input"]["bytes_per_row"] == total / (DAYS * ROWS_PER_DAY)
    assert 240 < total / (DAYS * ROWS_PER_DAY) < 262  # the first lines of 1TB day_0 average 251 bytes


def test_bytes_per_row_match_the_files(run: tuple) -> None:
    root, res = run
    rows, out = DAYS * ROWS_PER_DAY, root / "bin"
    for kind, dtype, cols in BP.DAY_KINDS + [BP.MULTI_HOT_KIND]:
        sizes = [os.path.getsize(out / f"day_{d}_{kind}.npy") for d in range(DAYS)]
        r = res["outputs"][kind]
        assert r["bytes"] == sum(sizes) and r["files"] == DAYS and r["header_bytes"] == DAYS * 128
        assert r["bytes_per_row"] == (sum(sizes) - DAYS * 128) / rows == np.dtype(dtype).itemsize * cols
        arr = np.load(out / f"day_0_{kind}.npy", mmap_mode="r")
        assert arr.dtype == dtype and arr.size == ROWS_PER_DAY * cols
    tables = out / "multi_hot_tables"
    written = sum(p.stat().st_size for p in tables.iterdir())
    assert res["outputs"]["multi_hot_tables"]["bytes"] == written == BP.tables_bytes(CAPPED, MLPERF_MULTI_HOT_SIZES)
    t20 = np.load(tables / "table_20.npy", mmap_mode="r")
    assert t20.shape == (CAP, 100) and (t20[:, 0] == np.arange(CAP)).all()


def test_projection_arithmetic(run: tuple) -> None:
    _, res = run
    pj, st = res["projection"], res["stages"]
    assert pj["rows"] == TB_ROWS == 4_373_472_329
    for kind, dtype, cols in BP.DAY_KINDS + [BP.MULTI_HOT_KIND]:
        assert pj["disk"][kind] == TB_ROWS * np.dtype(dtype).itemsize * cols + 24 * 128
    assert pj["disk"]["sparse_multi_hot"] == TB_ROWS * 214 * 4 + 24 * 128
    # full-size tables: the int32 data plus one 128-byte header per table with m > 1 plus tables.json
    data = sum(r * m * 4 for r, m in zip(MLPERF_NUM_EMBEDDINGS, MLPERF_MULTI_HOT_SIZES) if m > 1)
    assert 0 < pj["disk"]["multi_hot_tables"] - data - 15 * 128 < 1000
    rows = DAYS * ROWS_PER_DAY
    for stage in ("convert", "materialize"):
        t = pj["time"][stage]
        assert t["seconds"] == pytest.approx(TB_ROWS * st[stage]["seconds"] / rows, rel=1e-12)
        assert t["day_granularity_s"] == pytest.approx(
            math.ceil(24 / WORKERS) * (TB_ROWS / 24) * WORKERS * st[stage]["seconds"] / rows, rel=1e-12
        )
    capped = sum(r * m for r, m in zip(CAPPED, MLPERF_MULTI_HOT_SIZES) if m > 1)
    assert pj["time"]["tables"]["seconds"] == pytest.approx(st["tables"]["seconds"] * data / 4 / capped, rel=1e-12)
    assert pj["parse_read_bytes_per_s"] == pytest.approx(
        res["input"]["bytes_per_row"] * rows / st["convert"]["passes"]["parse"], rel=1e-12
    )
    text = BP.report(res)
    for kind in ("dense", "sparse", "labels", "sparse_multi_hot", "multi_hot_tables"):
        assert f"({pj['disk'][kind]:,} bytes)" in text


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        BP.main(["--days", "1", "--dir", str(tmp_path)])
    assert e.value.code == 2
    assert BP.main(["--rows-per-day", str(10**13), "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: --dir {tmp_path}: the run needs about ") and "--rows-per-day" in err[-1]
    assert not (tmp_path / "tsv").exists()
