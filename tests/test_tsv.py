"""Criteo TSV parsing: transforms, edge cases and errors that name the file and line."""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import KAGGLE_SAMPLE, REPO, TB_SAMPLE, needs_kaggle, needs_tb
from dlrm.data.criteo_tsv import TsvFormatError, hash_to_rows, read_tsv
from dlrm.errors import InputError


def _line(label="0", ints=None, cats=None) -> str:
    ints = ints if ints is not None else [""] * 13
    cats = cats if cats is not None else [""] * 26
    return "\t".join([label, *map(str, ints), *cats])


def _write(tmp_path: Path, text: str, name="x.tsv") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_missing_negative_and_minus_one_become_zero_before_log(tmp_path: Path) -> None:
    ints = ["", "-1", "-3", "0", "1", "9", "", "", "", "", "", "", "1000"]
    cats = ["68fd1e64", ""] + ["0000000a"] * 24
    rows = read_tsv(_write(tmp_path, _line("1", ints, cats) + "\n"))
    assert rows.labels.tolist() == [1]
    expect = [0, 0, 0, 0, math.log(2), math.log(10), 0, 0, 0, 0, 0, 0, math.log(1001)]
    np.testing.assert_allclose(rows.ints[0], expect, rtol=1e-6)
    assert rows.ints.dtype == np.float32
    assert rows.cats[0, 0] == 0x68FD1E64 and rows.cats[0, 1] == 0 and rows.cats[0, 2] == 10


def test_trailing_newline_or_not_and_crlf_parse_the_same(tmp_path: Path) -> None:
    a, b = _line("0", [1] * 13), _line("1", [2] * 13)
    with_nl = read_tsv(_write(tmp_path, f"{a}\n{b}\n", "a.tsv"))
    without = read_tsv(_write(tmp_path, f"{a}\n{b}", "b.tsv"))
    crlf = read_tsv(_write(tmp_path, f"{a}\r\n{b}\r\n", "c.tsv"))
    blank_end = read_tsv(_write(tmp_path, f"{a}\n{b}\n\n", "d.tsv"))
    for r in (without, crlf, blank_end):
        assert r.labels.tolist() == with_nl.labels.tolist() == [0, 1]
        np.testing.assert_array_equal(r.ints, with_nl.ints)


def test_max_rows(tmp_path: Path) -> None:
    p = _write(tmp_path, "".join(_line(str(i % 2)) + "\n" for i in range(5)))
    assert len(read_tsv(p, max_rows=3)) == 3


@pytest.mark.parametrize(
    "text,match",
    [
        (_line() + "\n" + "\t".join(["0"] * 39) + "\n", r"x\.tsv:2: 39 tab-separated fields, expected 40"),
        (_line("0", ["abc"] + [""] * 12) + "\n", r"x\.tsv:1: integer feature I1 is 'abc'"),
        (_line() + "\n" + _line("2") + "\n", r"x\.tsv:2: label '2' is not 0 or 1"),
        (_line("0", None, ["zz"] + [""] * 25) + "\n", r"x\.tsv:1: categorical feature C1 is 'zz'"),
        (_line() + "\n\n" + _line() + "\n", r"x\.tsv:2: blank line"),
        ("", r"x\.tsv: empty file"),
        ("\n", r"x\.tsv: empty file"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(TsvFormatError, match=match):
        read_tsv(_write(tmp_path, text))


@pytest.mark.parametrize("value", [" 7", "7 ", "+5", "1_000", "0x1f", "\u0663"])
def test_integer_outside_criteo_syntax_is_refused(tmp_path: Path, value: str) -> None:
    """Python's int() takes these; a Criteo count is ASCII digits with an optional '-'."""
    with pytest.raises(TsvFormatError) as e:
        read_tsv(_write(tmp_path, _line("0", ["1", "2", value] + [""] * 10) + "\n"))
    assert str(e.value) == (
        f"{tmp_path / 'x.tsv'}:1: integer feature I3 is {value!r}, not an integer (decimal digits with an optional "
        "'-'; leave the field empty for a missing value)"
    )


@pytest.mark.parametrize("value,digits", [("9" * 309, 309), ("-" + "1" * 5000, 5000), ("0" * 5000 + "7" * 400, 400)])
def test_integer_too_long_for_a_float_is_one_line(tmp_path: Path, value: str, digits: int, capsys) -> None:
    """float64 ends at 1.8e308 (309 digits) and Python's int() at 4300 digits: one line, in the reader and the
    checker alike (leading zeros do not count); the largest 309-digit value that fits is read."""
    path = _write(tmp_path, _line() + "\n" + _line("1", ["", "", value] + [""] * 10) + "\n")
    want = (
        f"{path}:2: integer feature I3 has {digits} digits, too large for a float (at most 1.8e308); Criteo "
        "counts are small integers: the line is corrupt, fix or delete it"
    )
    with pytest.raises(TsvFormatError) as e:
        read_tsv(path)
    assert str(e.value) == want
    assert _check_tsv_main()([path]) == 1
    assert capsys.readouterr().err == f"FAIL {want}\n"
    top = str(int(sys.float_info.max))
    ok = read_tsv(_write(tmp_path, _line("0", [top] + [""] * 12) + "\n", "ok.tsv"))
    assert ok.ints[0, 0] == np.float32(math.log1p(sys.float_info.max))


@pytest.mark.parametrize("value", ["0x1f", "1_f", " 1f", "+1f", "-1f", "1ffffffff", "\u0663"])
def test_category_outside_32_bit_hex_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(TsvFormatError) as e:
        read_tsv(_write(tmp_path, _line("0", None, [""] * 6 + [value] + [""] * 19) + "\n"))
    assert str(e.value) == (
        f"{tmp_path / 'x.tsv'}:1: categorical feature C7 is {value!r}, not a 32-bit hex value (leave the field "
        "empty for a missing value)"
    )
    ok = read_tsv(_write(tmp_path, _line("0", None, [""] * 6 + ["00000001f"] + [""] * 19) + "\n", "ok.tsv"))
    assert ok.cats[0, 6] == 0x1F  # leading zeros: still a 32-bit value


def test_missing_path_names_the_config_key(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config key `data.val_path`"):
        read_tsv(str(tmp_path / "nope.tsv"), config_key="data.val_path")


def test_hash_to_rows_is_modulo_per_table() -> None:
    cats = np.array([[7, 7], [2**32 - 1, 5]], dtype=np.int64)
    np.testing.assert_array_equal(hash_to_rows(cats, [3, 10]), [[1, 7], [(2**32 - 1) % 3, 5]])


@needs_kaggle
def test_real_kaggle_sample() -> None:
    rows = read_tsv(str(KAGGLE_SAMPLE))
    assert len(rows) == 10_000
    assert round(float(rows.labels.mean()), 3) == 0.218  # the sample's click rate: 21.8% positives
    assert rows.cats.max() < 2**32 and rows.ints.min() >= 0


@needs_tb
def test_real_terabyte_sample() -> None:
    rows = read_tsv(str(TB_SAMPLE))
    assert len(rows) == 1000 and round(float(rows.labels.mean()), 3) == 0.021


def test_check_tsv_tool(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import REPO

    good = _write(tmp_path, _line("1", [1] * 13) + "\n" + _line("0") + "\n", "good.tsv")
    bad = _write(tmp_path, _line("0") + "\n" + _line("7") + "\n", "bad.tsv")
    ok = subprocess.run(
        [sys.executable, "data/check_tsv.py", good], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0 and "good.tsv: 2 rows, click rate 0.5000" in ok.stdout
    assert "missing I1..I13: 0.50 0.50" in ok.stdout and "missing C1..C26: 1.00" in ok.stdout
    fail = subprocess.run(
        [sys.executable, "data/check_tsv.py", bad], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert fail.returncode == 1 and "bad.tsv:2: label '7' is not 0 or 1" in fail.stderr
    main = _check_tsv_main()
    assert main(["--help"]) == 0 and main([]) == 2  # usage: printed on --help, an error without a file


def test_check_tsv_without_a_file_is_one_error_line(capsys) -> None:
    assert _check_tsv_main()([]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        "error: no file given; usage: python data/check_tsv.py FILE [FILE ...] (plain or gzip Criteo TSV)\n"
    )
    assert _check_tsv_main()(["--bogus", "x.tsv"]) == 2
    out = capsys.readouterr()
    assert out.err == "error: --bogus: unknown option; usage: python data/check_tsv.py FILE [FILE ...]\n"


def _check_tsv_main():
    spec = importlib.util.spec_from_file_location("check_tsv", REPO / "data" / "check_tsv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def _rows_text(n: int) -> str:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-2, 900))) for _ in range(13)]
        cats = ["" if rng.random() < 0.2 else format(int(rng.integers(0, 2**32)), "x") for _ in range(26)]
        lines.append(_line(str(i % 2), ints, cats))
    return "\n".join(lines) + "\n"


def test_gzip_reads_like_the_plain_file_by_name_or_by_magic_bytes(tmp_path: Path, capsys) -> None:
    text = _rows_text(7)
    plain = _write(tmp_path, text, "rows.tsv")
    (tmp_path / "rows.tsv.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "rows_gzip_no_suffix.tsv").write_bytes(gzip.compress(text.encode()))
    want = read_tsv(plain)
    for name in ("rows.tsv.gz", "rows_gzip_no_suffix.tsv"):
        got = read_tsv(str(tmp_path / name))
        np.testing.assert_array_equal(got.labels, want.labels)
        np.testing.assert_array_equal(got.ints, want.ints)
        np.testing.assert_array_equal(got.cats, want.cats)
    assert len(read_tsv(str(tmp_path / "rows.tsv.gz"), max_rows=3)) == 3
    main = _check_tsv_main()
    assert main([plain]) == 0
    plain_report = capsys.readouterr().out.split(": ", 1)[1]
    assert main([str(tmp_path / "rows.tsv.gz")]) == 0
    assert capsys.readouterr().out.split(": ", 1)[1] == plain_report  # rows, click rate and missing shares


def test_truncated_gzip_names_the_file(tmp_path: Path) -> None:
    data = gzip.compress(_rows_text(200).encode())
    (tmp_path / "cut.tsv.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TsvFormatError, match=r"cut\.tsv\.gz: truncated or corrupt gzip stream after line \d+ "):
        read_tsv(str(tmp_path / "cut.tsv.gz"))


def test_other_compressors_a_bom_and_non_files_are_named(tmp_path: Path) -> None:
    import bz2
    import lzma

    text = (_line() + "\n") * 3
    (tmp_path / "x.tsv.xz").write_bytes(lzma.compress(text.encode()))
    (tmp_path / "x.tsv.bz2").write_bytes(bz2.compress(text.encode()))
    for name, kind in (("x.tsv.xz", "xz"), ("x.tsv.bz2", "bzip2")):
        with pytest.raises(TsvFormatError) as e:
            read_tsv(str(tmp_path / name))
        assert str(e.value) == (
            f"{tmp_path / name}: {kind}-compressed; only plain and gzip TSV files are read: decompress it first"
        )
    p = _write(tmp_path, "\ufeff" + text, "bom.tsv")
    with pytest.raises(TsvFormatError) as e:
        read_tsv(p)
    assert str(e.value) == f"{p}:1: the file starts with a UTF-8 byte-order mark; save it without one"
    fifo = tmp_path / "fifo.tsv"
    os.mkfifo(fifo)
    for path in (str(fifo), os.devnull):
        with pytest.raises(InputError) as e:
            read_tsv(path)
        assert str(e.value) == (
            f"config key `data.train_path`: {path!r} is not a regular file (a pipe, device or socket); pass "
            "data.train_path=<path to a Criteo TSV file>"
        )


def test_bytes_that_are_not_utf8_name_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "x.tsv"
    p.write_bytes(_line().encode() + b"\n" + b"\x8b\xff" + _line().encode() + b"\n")
    with pytest.raises(TsvFormatError, match=r"x\.tsv:2: not UTF-8 text \(invalid start byte at byte 0\)"):
        read_tsv(str(p))


def test_a_directory_names_the_config_key_and_the_fix(tmp_path: Path, capsys) -> None:
    d = tmp_path / "criteo"
    d.mkdir()
    with pytest.raises(InputError) as e:
        read_tsv(str(d), config_key="data.val_path")
    assert str(e.value) == (
        f"config key `data.val_path`: {str(d)!r} is a directory, not a file; "
        "pass data.val_path=<a Criteo TSV file in it, plain or gzip>"
    )
    (d / "meta.json").write_text("{}")
    with pytest.raises(InputError) as e:
        read_tsv(str(d))
    assert str(e.value) == (
        f"config key `data.train_path`: {str(d)!r} is a directory, not a file; it holds a preprocessed dataset "
        f"(meta.json): train on it with data=criteo_binary data.dataset_dir={d}"
    )
    # check_tsv: a path that is not a file is a usage error (2), refused before any file is read (a malformed line
    # is the check failing, 1: test_check_tsv_tool)
    good = _write(tmp_path, _line("0") + "\n", "good.tsv")
    assert _check_tsv_main()([good, str(d)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"error: {str(d)!r} is a directory, not a file; pass a Criteo TSV file in it (plain or gzip)\n"
    )
    assert _check_tsv_main()([good, str(tmp_path / "nope.tsv")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"error: no such file {str(tmp_path / 'nope.tsv')!r} (cwd {os.getcwd()}); pass a Criteo TSV file\n"
    )
