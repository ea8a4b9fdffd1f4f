"""Smoke test of bench/pipeline_ab.py: 2 gloo processes under torchrun, tiny sizes, every suite; checks the JSON
and markdown it writes (numbers are not asserted: speed is measured on GPUs, see docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def test_pipeline_ab_smoke_two_processes(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "bench/pipeline_ab.py",
                        "--smoke", "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    data = json.loads((tmp_path / "pipeline_ab.json").read_text())
    rows = {(r["config"], r["variant"]): r for r in data["results"]}
    assert data["meta"]["world"] == 2 and data["meta"]["backend"] == "gloo"
    for st in ("table_wise", "row_wise"):
        for v in ("shared", "dedicated"):
            r = rows[(f"{st}/b32", v)]
            assert r["plan"] == [[st, "fused"]], r  # the constraint reached the planner
            assert len(r["ms_repeats"]) == 2 and all(t > 0 for t in r["ms_repeats"])
            assert r["ms_min"] <= r["ms_median"] <= r["ms_max"]
    assert ("stock/b32", "shared") in rows
    assert {("hbm/rowwise_adagrad/b32", "shared"), ("hbm/adagrad/b32", "shared")} <= set(rows)
    assert not any(c.startswith("uvm_caching") for c, _ in rows)  # needs CUDA: not built on CPU
    assert [v for c, v in rows if c.startswith("a2a/")] == ["idle"]
    md = (tmp_path / "pipeline_ab.md").read_text()
    assert "| row_wise/b32 | dedicated | 32 |" in md
