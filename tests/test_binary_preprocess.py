"""data/preprocess_criteo.py: parsing equals the criteo_tsv rules, both dense transforms, gzip and Kaggle
layouts, resumable per day, parallel = serial, checksums, and bad input naming file and line."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest

from conftest import KAGGLE_SAMPLE, REPO, TB_SAMPLE, needs_kaggle, needs_tb
from dlrm.config import MLPERF_NUM_EMBEDDINGS
from dlrm.data import binary_format as BF
from dlrm.data import preprocess as P
from dlrm.data import preprocess_passes as PP
from dlrm.data.criteo_tsv import TsvFormatError, hash_to_rows, read_tsv

ROWS = [
    1000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    1000,
    3000,
    4000,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    1000,
    1000,
    1000,
    5000,
    12973,
    108,
    36,
]


def gen_tsv(path: Path, n: int, seed: int, missing: float = 0.2) -> None:
    """Criteo-shaped lines: counts with negatives, missing fields, 1-8 digit lower-case hex."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        ints = ["" if rng.random() < missing else str(int(rng.integers(-3, 5000))) for _ in range(13)]
        cats = ["" if rng.random() < missing else format(int(rng.integers(0, 2**32)), "x") for _ in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.25))] + ints + cats))
    path.write_text("\n".join(lines) + "\n")


def convert(
    out: Path, inputs: List[Path], transform: str = "log1p", workers: int = 1, layout: str = "terabyte", **kw
) -> dict:
    days = list(range(len(inputs))) if layout == "terabyte" else []
    return P.preprocess(
        out=str(out),
        layout=layout,
        inputs=[str(p) for p in inputs],
        days=days,
        table_rows=ROWS,
        transform=transform,
        workers=workers,
        block_bytes=kw.pop("block_bytes", 64 << 10),
        **kw,
    )


def load_day(out: Path, d: int):
    return (
        np.load(out / f"day_{d}_dense.npy"),
        np.load(out / f"day_{d}_sparse.npy"),
        np.load(out / f"day_{d}_labels.npy"),
    )


def raw_ints(path: Path) -> np.ndarray:
    """Reference: the raw counts (negatives kept, missing 0) by plain Python, as torchrec's tsv_to_npys reads."""
    rows = [[int(v or "0") for v in line.split("\t")[1:14]] for line in path.read_text().splitlines() if line]
    return np.asarray(rows, dtype=np.int64)


@pytest.fixture(scope="module")
def days3(tmp_path_factory) -> List[Path]:
    d = tmp_path_factory.mktemp("tsv")
    paths = []
    for k, n in enumerate((1500, 1200, 901)):
        gen_tsv(d / f"day_{k}", n, seed=k)
        paths.append(d / f"day_{k}")
    return paths


def test_log1p_dataset_equals_criteo_tsv_reader(tmp_path: Path, days3: List[Path]) -> None:
    meta = convert(tmp_path / "out", days3, "log1p")
    assert meta["dense_transform"] == "log1p" and meta["dense_min"] is None
    for d, path in enumerate(days3):
        ref = read_tsv(str(path))
        dense, sparse, labels = load_day(tmp_path / "out", d)
        assert dense.dtype == np.float32 and sparse.dtype == np.int32 and labels.shape == (len(ref), 1)
        np.testing.assert_array_equal(dense, ref.ints)  # bitwise
        np.testing.assert_array_equal(sparse, hash_to_rows(ref.cats, ROWS))
        np.testing.assert_array_equal(labels[:, 0], ref.labels)
        assert meta["days"][d]["rows"] == len(ref)


def test_mlperf_transform_m_from_training_days_only(tmp_path: Path, days3: List[Path]) -> None:
    # the evaluation day (last) holds a smaller value than any training day: it must not move m
    eval_day = tmp_path / "day_2"
    lines = days3[2].read_text().splitlines()
    f = lines[0].split("\t")
    f[3] = "-40"
    lines[0] = "\t".join(f)
    eval_day.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        P.PreprocessError,
        match=r"day_2:1: integer feature I3 is -40, below m = -3 .* "
        r"pass --dense-min -40",
    ):
        convert(tmp_path / "bad", days3[:2] + [eval_day], "mlperf")
    meta = convert(tmp_path / "out", days3, "mlperf")
    train_raw = np.concatenate([raw_ints(p) for p in days3[:2]])
    m = int(train_raw.min())
    assert meta["dense_min"] == m == -3 and meta["dense_min_source"] == "days 0-1 (training)"
    on_disk = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert on_disk["dense_min"] == m and on_disk["dense_transform"] == "mlperf"
    for d, path in enumerate(days3):
        raw = raw_ints(path).astype(np.int32)
        # torchrec BinaryCriteoUtils.tsv_to_npys arithmetic, with the training minimum instead of the file's
        want = np.log(raw - np.int32(m - 2), dtype=np.float32)
        np.testing.assert_array_equal(load_day(tmp_path / "out", d)[0], want)
    # per-file m would differ: the evaluation day's own minimum is not the training minimum
    assert meta["days"][2]["dense_min"] != m
    fixed = convert(tmp_path / "fixed", days3[:2] + [eval_day], "mlperf", dense_min=-40)
    assert fixed["dense_min"] == -40 and fixed["dense_min_source"] == "given"
    assert load_day(tmp_path / "fixed", 2)[0][0, 2] == np.log(np.float32(2))


def test_gzip_and_plain_give_identical_files(tmp_path: Path, days3: List[Path]) -> None:
    gz = []
    for p in days3:
        q = tmp_path / (p.name + ".gz")
        q.write_bytes(gzip.compress(p.read_bytes()))
        gz.append(q)
    a = convert(tmp_path / "plain", days3, "mlperf")
    b = convert(tmp_path / "gz", gz, "mlperf")
    assert [d["files"] for d in a["days"]] == [d["files"] for d in b["days"]]


def test_parallel_equals_serial_and_resume_redoes_only_unfinished_days(tmp_path: Path, days3: List[Path]) -> None:
    out = tmp_path / "out"
    a = convert(tmp_path / "serial", days3, "mlperf", workers=1)
    b = convert(out, days3, "mlperf", workers=2)
    assert [d["files"] for d in a["days"]] == [d["files"] for d in b["days"]]
    assert P.verify(str(out)) == []
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("day_*.npy")}
    # a run killed in day 1: its markers are gone and a partial file is left behind
    (out / "day_1.parse.json").unlink()
    (out / "day_1.dense.json").unlink()
    (out / "day_1_sparse.npy.partial").write_bytes(b"garbage")
    c = convert(out, days3, "mlperf", workers=2)
    assert [d["files"] for d in c["days"]] == [d["files"] for d in a["days"]]
    changed = {p.name for p in out.glob("day_*.npy") if p.stat().st_mtime_ns != mtimes[p.name]}
    assert changed == {"day_1_dense.npy", "day_1_sparse.npy", "day_1_labels.npy"}
    # checksums catch a flipped byte
    p = out / "day_0_sparse.npy"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 1
    p.write_bytes(bytes(raw))
    assert P.verify(str(out)) == [str(p)]


@pytest.mark.parametrize("kind,marker", [("dense", "dense"), ("sparse", "parse")])
def test_truncated_day_file_is_rebuilt_by_following_the_message(
    tmp_path: Path, days3: List[Path], kind: str, marker: str
) -> None:
    out = tmp_path / "out"
    convert(out, days3[:2])
    good = (out / f"day_1_{kind}.npy").read_bytes()
    (out / f"day_1_{kind}.npy").write_bytes(good[:200])
    with pytest.raises(BF.BinaryFormatError) as e:
        BF.open_npy(str(out / f"day_1_{kind}.npy"), *((np.float32, 13) if kind == "dense" else (np.int32, 26)))
    assert str(e.value).endswith(
        f"delete {out / f'day_1.{marker}.json'} and re-run data/preprocess_criteo.py "
        "(it redoes only that pass of day 1)"
    )
    (out / f"day_1.{marker}.json").unlink()
    convert(out, days3[:2])  # a re-run without the deletion would skip the day
    assert (out / f"day_1_{kind}.npy").read_bytes() == good
    assert P.verify(str(out)) == []


def test_re_preprocessing_into_other_table_sizes_drops_the_stale_multi_hot(tmp_path: Path, days3: List[Path]) -> None:
    """A re-run with the same table sizes keeps the materialized multi-hot as it is; one into other sizes (the same
    rows per day, other ids) drops its record and deletes its days, and materializing again gives the bags of the
    new ids from the expansion tables of the new sizes."""
    from dlrm.data import binary_format as BF
    from dlrm.data import multihot as MH

    out, sizes = tmp_path / "out", [2, 3] * 13
    convert(out, days3)
    P.multihot(out=str(out), sizes=sizes, seed=0, materialize=True, workers=1)
    built = {p.name: p.read_bytes() for p in out.glob("day_*_sparse_multi_hot.npy")}
    assert len(built) == 3 and convert(out, days3)["multi_hot"]["materialized"] is True
    assert {p.name: p.read_bytes() for p in out.glob("day_*_sparse_multi_hot.npy")} == built
    assert P.verify(str(out)) == []
    half = [max(1, r // 2) for r in ROWS]
    other = dict(
        out=str(out),
        layout="terabyte",
        inputs=[str(p) for p in days3],
        days=[0, 1, 2],
        table_rows=half,
        transform="log1p",
        workers=1,
        block_bytes=64 << 10,
    )
    with pytest.raises(P.PreprocessError, match=r"holds a dataset built with other options \(table rows were"):
        P.preprocess(**other)
    meta = P.preprocess(**other, overwrite=True)
    assert meta["multi_hot"] is None and BF.read_dataset_meta(str(out))["multi_hot"] is None
    assert not list(out.glob("day_*_sparse_multi_hot.npy")) and not list(out.glob("day_*.multihot.json"))
    assert P.verify(str(out)) == []
    P.multihot(out=str(out), sizes=sizes, seed=0, materialize=True, workers=1)
    tables = MH.build_tables(half, sizes, seed=0)
    for d in range(3):
        ids = np.load(out / f"day_{d}_sparse.npy")
        want = np.concatenate([tables[t][ids[:, t]].reshape(-1) for t in range(26)])
        np.testing.assert_array_equal(np.load(out / f"day_{d}_sparse_multi_hot.npy"), want)


def test_rebuild_with_other_options_is_refused_unless_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A finished dataset is not replaced by a run with other options: one error line naming --out, each option
    with its old and new value, and the fix; meta.json and the day files stay as they were. The same options
    resume (nothing redone); --overwrite rebuilds."""
    for k, n in enumerate((120, 100, 80)):
        gen_tsv(tmp_path / f"day_{k}", n, seed=k)
    out = tmp_path / "out"
    base = ["--layout", "terabyte", "--input-dir", str(tmp_path), "--days", "0-2", "--out", str(out), "--workers", "0"]
    cli = _cli()
    assert cli.main([*base, "--row-cap", "2000"]) == 0
    capsys.readouterr()
    kept = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    assert cli.main([*base, "--dense-transform", "log1p"]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {out} holds a dataset built with other options (table rows were --row-cap 2000, now "
        "--table-rows mlperf; --dense-transform was mlperf, now log1p), which this run would replace; give another "
        "--out, or add --overwrite to rebuild it there\n"
    )
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == kept
    assert cli.main([*base, "--row-cap", "2000"]) == 0  # the same options: every day skipped, files untouched
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("day_*")} == {
        n: t for n, (_, t) in kept.items() if n.startswith("day_")
    }
    assert cli.main([*base, "--dense-transform", "log1p", "--overwrite"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dense_transform"] == "log1p" and meta["table_rows"] == MLPERF_NUM_EMBEDDINGS
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "--overwrite" in capsys.readouterr().out


def test_other_days_inputs_and_m_are_named(tmp_path: Path, days3: List[Path]) -> None:
    out = tmp_path / "out"
    convert(out, days3, "mlperf", dense_min=-7)
    (tmp_path / "elsewhere").mkdir()
    moved = [tmp_path / "elsewhere" / p.name for p in days3]
    for src, dst in zip(days3, moved):
        shutil.copy(src, dst)
    fix = "which this run would replace; give another --out, or add --overwrite to rebuild it there"
    cases = [
        (dict(inputs=days3[:2]), "--days was 0-2, now 0-1"),
        (dict(inputs=moved), f"--input-dir was {days3[0].parent}, now {moved[0].parent}"),
        (dict(dense_min=-9), "--dense-min was -7, now -9"),
        (dict(dense_min=None), "--dense-min was -7, now not given"),
        (dict(layout="kaggle", inputs=days3[:1]), "--layout was terabyte, now kaggle"),
    ]
    for kw, what in cases:
        kw = {"dense_min": -7, **kw}
        with pytest.raises(P.PreprocessError) as e:
            convert(out, kw.pop("inputs", days3), "mlperf", **kw)
        assert str(e.value) == f"--out {out} holds a dataset built with other options ({what}), {fix}"
    assert convert(out, days3, "mlperf", dense_min=-7)["dense_min"] == -7  # unchanged options: resumes


def test_out_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for k in range(2):
        gen_tsv(tmp_path / f"day_{k}", 20, seed=k)
    (tmp_path / "out").write_text("keep me")
    args = ["--layout", "terabyte", "--input-dir", str(tmp_path), "--days", "0-1", "--workers", "0", "--out"]
    assert _cli().main([*args, str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {tmp_path / 'out'}: a file, not a directory; give a directory (a new one, or a dataset to "
        "resume)\n"
    )
    assert _cli().main([*args, str(tmp_path / "out" / "bin")]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {tmp_path / 'out' / 'bin'}: cannot create it (Not a directory); give a directory you can write\n"
    )
    assert (tmp_path / "out").read_text() == "keep me"


def test_kaggle_file_shorter_than_seven_days(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Fewer lines than days: the count and the rule, before anything is written; a day of blank lines only: its
    lines."""
    src = tmp_path / "k5.tsv"
    gen_tsv(src, 5, seed=1)
    args = ["--layout", "kaggle", "--input", str(src), "--workers", "0", "--out", str(tmp_path / "out")]
    assert _cli().main(args) == 2
    assert capsys.readouterr().err == (
        f"error: --input {src}: 5 lines, fewer than the 7 days --layout kaggle cuts it into (day k: lines N*k//7+1 "
        ".. N*(k+1)//7); give a file of at least 7 rows\n"
    )
    assert not (tmp_path / "out").exists()
    gen_tsv(src, 7, seed=1)
    src.write_text(src.read_text() + "\n" * 7)  # 14 lines: 2 a day, days 4-6 blank
    assert _cli().main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"error: {src}: lines 9-10 (Kaggle day 4) are all blank; delete the blank lines"


def test_kaggle_layout_cuts_seven_days(tmp_path: Path) -> None:
    src = tmp_path / "train.txt"
    gen_tsv(src, 1003, seed=7)
    meta = convert(tmp_path / "out", [src], "log1p", layout="kaggle", workers=2)
    rows = [d["rows"] for d in meta["days"]]
    assert rows == [1003 * (k + 1) // 7 - 1003 * k // 7 for k in range(7)]
    ref = read_tsv(str(src))
    dense = np.concatenate([load_day(tmp_path / "out", d)[0] for d in range(7)])
    sparse = np.concatenate([load_day(tmp_path / "out", d)[1] for d in range(7)])
    np.testing.assert_array_equal(dense, ref.ints)
    np.testing.assert_array_equal(sparse, hash_to_rows(ref.cats, ROWS))
    gz = tmp_path / "train.txt.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    meta_gz = convert(tmp_path / "out_gz", [gz], "log1p", layout="kaggle", workers=1)
    assert [d["files"] for d in meta_gz["days"]] == [d["files"] for d in meta["days"]]


def test_unusual_but_valid_lines_follow_criteo_tsv_rules(tmp_path: Path) -> None:
    """Upper-case hex, '007', 9-digit hex with a leading zero, CRLF endings and trailing blank lines take the
    line-by-line path and give read_tsv's values."""
    src = tmp_path / "day_0"
    gen_tsv(src, 50, seed=3)
    lines = src.read_text().splitlines()
    f = lines[5].split("\t")
    f[1], f[20], f[21] = "007", "ABCDEF12", "0abcdef12"
    lines[5] = "\t".join(f)
    lines[7] += "\r"
    src.write_text("\n".join(lines) + "\n\n\n")
    gen_tsv(tmp_path / "day_1", 20, seed=4)
    convert(tmp_path / "out", [src, tmp_path / "day_1"], "log1p")
    ref = read_tsv(str(src))
    dense, sparse, _ = load_day(tmp_path / "out", 0)
    np.testing.assert_array_equal(dense, ref.ints)
    np.testing.assert_array_equal(sparse, hash_to_rows(ref.cats, ROWS))
    assert sparse[5, 6] == 0xABCDEF12 % ROWS[6] and sparse[5, 7] == 0xABCDEF12 % ROWS[7]


def test_fast_parser_equals_line_parser(days3: List[Path]) -> None:
    buf = days3[0].read_bytes()
    fast = PP.parse_block(buf)
    slow = PP.parse_block_slow(buf, "x", 1, {})
    assert fast is not None
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)


@needs_kaggle
@needs_tb
def test_real_samples_parse_like_read_tsv(tmp_path: Path) -> None:
    for path in (KAGGLE_SAMPLE, TB_SAMPLE):
        buf = path.read_bytes()
        fast = PP.parse_block(buf)
        assert fast is not None, "the fast path should take real Criteo lines"
        ref = read_tsv(str(path))
        np.testing.assert_array_equal(fast[0], ref.labels)
        np.testing.assert_array_equal(np.log1p(np.maximum(fast[1], 0).astype(np.float64)).astype(np.float32), ref.ints)
        np.testing.assert_array_equal(fast[2], ref.cats)
    # Kaggle head and 1TB head train, 1TB head evaluates, MLPerf transform with m from the training days
    for k, src in enumerate((KAGGLE_SAMPLE, TB_SAMPLE, TB_SAMPLE)):
        shutil.copy(src, tmp_path / f"day_{k}")
    meta = convert(tmp_path / "out", [tmp_path / f"day_{k}" for k in range(3)], "mlperf", workers=2)
    m = int(min(raw_ints(KAGGLE_SAMPLE).min(), raw_ints(TB_SAMPLE).min()))
    assert meta["dense_min"] == m and [d["rows"] for d in meta["days"]] == [10000, 1000, 1000]
    np.testing.assert_array_equal(load_day(tmp_path / "out", 1)[0], load_day(tmp_path / "out", 2)[0])
    want = np.log(raw_ints(TB_SAMPLE).astype(np.int32) - np.int32(m - 2), dtype=np.float32)
    np.testing.assert_array_equal(load_day(tmp_path / "out", 2)[0], want)
    # the other way round, the evaluation rows hold a count below the training minimum: a clear error
    shutil.copy(KAGGLE_SAMPLE, tmp_path / "day_2")
    with pytest.raises(P.PreprocessError, match=r"day_2:\d+: integer feature I\d+ is -\d, below m = -\d"):
        convert(tmp_path / "rev", [tmp_path / f"day_{k}" for k in (1, 1, 2)], "mlperf")


# ------------------------------------------------------------------------------------------------ bad input
def _two_days(tmp_path: Path, bad: str, gz: bool = False) -> List[Path]:
    gen_tsv(tmp_path / "day_0", 300, seed=1)
    lines = (tmp_path / "day_0").read_text().splitlines()
    good = tmp_path / "day_1"
    gen_tsv(good, 200, seed=2)
    if bad == "truncated":
        data = ("\n".join(lines) + "\n").encode()
        cut = data[: len(data) - 37]  # the last line loses its end
        (tmp_path / "day_0").write_bytes(gzip.compress(cut)[:-20] if gz else cut)
    elif bad == "hex":
        f = lines[123].split("\t")
        f[30] = "xyz"
        lines[123] = "\t".join(f)
        (tmp_path / "day_0").write_text("\n".join(lines) + "\n")
    return [tmp_path / "day_0", good]


def test_truncated_plain_file_names_file_and_line(tmp_path: Path) -> None:
    inputs = _two_days(tmp_path, "truncated")
    with pytest.raises(TsvFormatError, match=r"day_0:300: \d+ tab-separated fields, expected 40"):
        convert(tmp_path / "out", inputs)
    assert not (tmp_path / "out" / "day_0.parse.json").exists()


def test_truncated_gzip_names_file(tmp_path: Path) -> None:
    inputs = _two_days(tmp_path, "truncated", gz=True)
    with pytest.raises(P.PreprocessError, match=r"day_0: truncated or corrupt gzip stream after line \d+"):
        convert(tmp_path / "out", inputs)


def test_bad_hex_names_file_and_line_like_criteo_tsv(tmp_path: Path) -> None:
    inputs = _two_days(tmp_path, "hex")
    with pytest.raises(TsvFormatError) as e:
        convert(tmp_path / "out", inputs, workers=2)
    with pytest.raises(TsvFormatError) as ref:
        read_tsv(str(inputs[0]))
    assert str(e.value) == str(ref.value) and ":124: categorical feature C17 is 'xyz'" in str(e.value)


def test_cli_end_to_end_and_exit_codes(tmp_path: Path, capsys) -> None:
    gen_tsv(tmp_path / "day_0", 100, seed=1)
    (tmp_path / "day_1.gz").write_bytes(gzip.compress((tmp_path / "day_0").read_bytes()))
    args = [
        "--layout",
        "terabyte",
        "--input-dir",
        str(tmp_path),
        "--days",
        "0-1",
        "--out",
        str(tmp_path / "out"),
        "--row-cap",
        "500",
        "--workers",
        "1",
    ]
    p = subprocess.run(
        [sys.executable, "data/preprocess_criteo.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert "2 days, 200 rows; dense log(x - m + 2), missing x = 0, m = " in p.stdout
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert max(meta["table_rows"]) == 500 and meta["table_rows"][5] == 3
    cli = _cli()
    assert cli.main(["verify", "--out", str(tmp_path / "out")]) == 0
    assert "all files match" in capsys.readouterr().out
    labels = tmp_path / "out" / "day_1_labels.npy"
    kept = labels.read_bytes()
    labels.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    assert cli.main(["verify", "--out", str(tmp_path / "out")]) == 1  # a finding about the files, not bad input
    assert capsys.readouterr().err == f"MISMATCH {labels}\n"
    labels.write_bytes(kept)
    os.remove(tmp_path / "day_0")
    assert cli.main(args) == 2  # bad input: one error line, as the trainer's (PreprocessError is an InputError)
    want = f"error: --input-dir {tmp_path}: no day_0 or day_0.gz; download it or pass --days\n"
    assert capsys.readouterr().err == want


def _cli():
    sys.path.insert(0, str(REPO / "data"))
    try:
        import preprocess_criteo
    finally:
        sys.path.pop(0)
    return preprocess_criteo


DAYS_FIX = "give days as a range or a list, e.g. --days 0-23 or --days 0,1,23"
SIZES_FIX = "give 26 comma-separated positive whole numbers (one per table, C1..C26)"
TB = ["--layout", "terabyte", "--input-dir", "{dir}", "--out", "{out}"]
ZERO_ROWS = ",".join(["9"] * 25 + ["0"])


@pytest.mark.parametrize(
    "args,line",
    [
        ([*TB, "--days", "0-x"], f"--days '0-x' is not a day number or a range; {DAYS_FIX}"),
        ([*TB, "--days", "0,x,2"], f"--days '0,x,2': 'x' is not a day number or a range; {DAYS_FIX}"),
        ([*TB, "--days", "5-3"], f"--days '5-3' is not a range from a low to a high day; {DAYS_FIX}"),
        ([*TB, "--days", "0-2,1"], "--days '0-2,1': day(s) [1] given more than once; give each day once"),
        ([*TB, "--table-rows", "10,20"], f"--table-rows '10,20': {SIZES_FIX}, or --table-rows mlperf"),
        ([*TB, "--table-rows", ZERO_ROWS], f"--table-rows '{ZERO_ROWS}': {SIZES_FIX}, or --table-rows mlperf"),
        (["multihot", "--out", "{out}", "--sizes", "1,a"], f"--sizes '1,a': {SIZES_FIX}, or --sizes mlperf"),
        (
            ["verify", "--out", "{out}"],
            "--out: no such directory '{out}' (cwd {cwd}); pass --out <the directory data/preprocess_criteo.py "
            "wrote, holding meta.json>",
        ),
        (
            ["--layout", "kaggle", "--input", "train.txt", "--out", "{out}"],
            "--input 'train.txt': no such file (cwd {cwd}); pass Kaggle's train.txt (plain or gzip)",
        ),
        (
            [*TB, "--days", "0"],
            "--days 0: only day 0; give at least 2 days, the training days and then the last day for "
            "validation/test, e.g. --days 0-1",
        ),
        (
            [*TB, "--days", "3-3"],
            "--days 3-3: only day 3; give at least 2 days, the training days and then the last day for "
            "validation/test, e.g. --days 3-4",
        ),
        (
            [*TB, "--workers", "-2"],
            "--workers -2: give a number of processes >= 1 (0 or 1: one day after another in this process)",
        ),
        (
            ["multihot", "--out", "{out}", "--seed", "-1"],
            "--seed -1: give a seed from 0 to 2**32 - 1 = 4294967295 (the MLPerf reference uses 0)",
        ),
        (
            ["multihot", "--out", "{out}", "--seed", "4294967296"],
            "--seed 4294967296: give a seed from 0 to 2**32 - 1 = 4294967295 (the MLPerf reference uses 0)",
        ),
        ([*TB, "--block-mb", "0"], "--block-mb 0: give a block size in MiB >= 1 (default 8)"),
        ([*TB, "--block-mb", "-4"], "--block-mb -4: give a block size in MiB >= 1 (default 8)"),
        ([*TB, "--row-cap", "0"], "--row-cap 0: give a positive number of rows, or leave it out"),
        ([*TB, "--row-cap", "-5"], "--row-cap -5: give a positive number of rows, or leave it out"),
        (
            ["--layout", "kaggle", "--input", "t.txt", "--days", "0-6", "--out", "{out}"],
            "--days 0-6: --layout kaggle cuts train.txt into 7 days itself; drop --days",
        ),
        (
            ["--layout", "kaggle", "--input", "t.txt", "--input-dir", "{dir}", "--out", "{out}"],
            "--input-dir {dir}: --layout kaggle reads one file, --input train.txt; drop --input-dir",
        ),
        (
            [*TB, "--input", "t.txt"],
            "--input t.txt: --layout terabyte reads the day files in --input-dir; drop --input",
        ),
        (
            [*TB, "--dense-transform", "log1p", "--dense-min", "-3"],
            "--dense-min -3: only the mlperf transform log(x - m + 2) has an m; drop --dense-min, or use "
            "--dense-transform mlperf",
        ),
    ],
)
def test_cli_bad_input_is_one_error_line_exit_2(
    args: List[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    where = dict(dir=str(tmp_path), out=str(tmp_path / "out"), cwd=os.getcwd())
    assert _cli().main([a.format(**where) for a in args]) == 2
    assert capsys.readouterr().err == f"error: {line.format(**where)}\n"
    assert not (tmp_path / "out").exists()  # refused before anything is written
