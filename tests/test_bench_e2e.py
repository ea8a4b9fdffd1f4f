"""Smoke test of ``bench.e2e`` on CPU: the generated binary dataset, the step benchmark and ``train.py`` on two
sources, each in its own process; checks the JSON and markdown it writes (numbers are not asserted: speed is
measured on GPUs, see docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_e2e_smoke(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.e2e",
            "--smoke",
            "--dir",
            str(tmp_path),
            "--sources",
            "synthetic",
            "binary_on_the_fly",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads((tmp_path / "e2e.json").read_text())
    assert data["step_bench"]["samples_per_s"] > 0
    rows = {r["source"]: r for r in data["results"]}
    assert set(rows) == {"synthetic", "binary_on_the_fly"}
    for r in rows.values():
        assert "error" not in r, r
        assert r["windows"] == 2 and r["samples_per_s"] > 0  # --smoke: 12 steps logged every 4, less the first
        assert r["of_step_bench"] == r["samples_per_s"] / data["step_bench"]["samples_per_s"]
    md = (tmp_path / "e2e.md").read_text()
    assert "| synthetic |" in md and "| binary_on_the_fly |" in md and "step benchmark (fp32)" in md
    # the trainer of the binary source trained on the generated dataset, with its own metrics file
    assert (tmp_path / "train_binary_on_the_fly" / "metrics.jsonl").is_file()
