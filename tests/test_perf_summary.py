"""docs/performance.md's summary table and plot are what ``bench.perf_summary`` reads from that file's rows.

.venv/bin/python -m pytest tests/test_perf_summary.py -q
"""

from pathlib import Path

import pytest

from bench import perf_summary
from conftest import REPO

DOC = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")


def test_summary_table_is_the_rows_collected() -> None:
    one, two = perf_summary.read_rows(DOC)
    table = perf_summary.markdown(one, two)
    assert table in DOC, "docs/performance.md's summary is out of date: paste `python -m bench.perf_summary`'s table"
    assert DOC.index(table) < DOC.index("## Method")  # at the top, above the tables it summarises
    assert "![Speed against stock TorchRec by batch per GPU](performance_summary.png)" in DOC
    # the 32768 line, cell by cell, from the 1x rows of 77827a9
    assert "| 1, 32768 | 2.14x | 2.22x | 2.08x / 2.16x | 25.806-25.845 / 12.085 / 11.616 |" in table
    assert perf_summary.span("2.11-2.33x") == (2.11, 2.33) and perf_summary.span("2.14x") == (2.14, 2.14)


def test_plot_is_drawn_and_a_missing_row_is_named(tmp_path: Path) -> None:
    one, two = perf_summary.read_rows(DOC)
    png = tmp_path / "speed.png"
    perf_summary.plot(one, two, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (REPO / "docs" / "performance_summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cut = "\n".join(line for line in DOC.splitlines() if not line.startswith("| 8192: `perf=fast`, `graphed`"))
    with pytest.raises(ValueError, match=r"no 1x H200 row '8192: \.\.\.' for graphed"):
        perf_summary.read_rows(cut)
