"""Smoke test of ``bench.pipeline_ab``: 2 gloo processes under torchrun, tiny sizes, every suite; checks the JSON
and markdown it writes (numbers are not asserted: speed is measured on GPUs, see docs/performance.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from conftest import bench_smoke_two_processes


def test_pipeline_ab_smoke_two_processes(tmp_path: Path) -> None:
    data = bench_smoke_two_processes("pipeline_ab", tmp_path, "pipeline_ab.json")
    rows = {(r["config"], r["variant"]): r for r in data["results"]}
    assert data["meta"]["world"] == 2 and data["meta"]["backend"] == "gloo"
    for st in ("table_wise", "row_wise"):
        for v in ("shared", "dedicated"):
            r = rows[(f"{st}/b32", v)]
            assert r["plan"] == [[st, "fused"]], r  # the constraint reached the planner
            ms = r["ms_repeats"]
            assert len(ms) == 2 and min(ms) > 0
            assert (r["ms_min"], r["ms_median"], r["ms_max"]) == (min(ms), statistics.median(ms), max(ms))
    assert ("stock/b32", "shared") in rows
    assert {("hbm/rowwise_adagrad/b32", "shared"), ("hbm/adagrad/b32", "shared")} <= set(rows)
    assert not any(c.startswith("uvm_caching") for c, _ in rows)  # needs CUDA: not built on CPU
    assert [v for c, v in rows if c.startswith("a2a/")] == ["idle"]
    md = (tmp_path / "pipeline_ab.md").read_text()
    assert "| row_wise/b32 | dedicated | 32 |" in md


def test_idle_gaps_splits_host_and_device_waits() -> None:
    """``traces.idle_gaps`` on a hand-made Chrome trace (2 steps, times in us): a gap ended by a kernel
    launched after it began is the host's (blamed on the blocking call inside it, else on the launching frame);
    a gap ended by a kernel queued before it began is a device-side wait; holes under ``min_us`` do not count."""
    from bench import traces

    def k(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "ts": ts,
            "dur": dur,
            "tid": stream,
            "args": {"correlation": corr, "stream": stream},
        }

    def launch(ts: float, dur: float, corr: int) -> dict:
        return {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": ts,
            "dur": dur,
            "tid": 1,
            "args": {"correlation": corr},
        }

    def frame(name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": 1}

    events = [
        k("A", 0, 10, 1),
        launch(-5, 2, 1),
        k("B", 20, 10, 2),
        launch(18, 1, 2),  # launched after the gap 10-20 began: host
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 11, "dur": 6, "tid": 1},
        k("C", 35, 5, 3, stream=9),
        launch(25, 1, 3),  # queued before the gap 30-35: device
        k("D", 38, 10, 4),
        launch(26, 1, 4),  # overlaps C on another stream: no gap
        k("E", 49, 1, 5),
        launch(27, 1, 5),  # a 1 us hole: below min_us
        k("F", 60, 5, 6),
        launch(56, 3, 6),  # gap 50-60, no blocking call: blamed on the launching frame
        frame("train.py(1): step", 0, 100),
        frame("a.py(5): sync_fn", 10.5, 7),
        frame("b.py(9): launch_fn", 55, 4),
        frame("torch/nn/modules/module.py(1): _call_impl", 55.5, 2),  # module plumbing is skipped
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 70},  # not a complete event
    ]
    out = traces.idle_gaps({"traceEvents": events}, steps=2)
    assert out["idle_ms_per_step"] == pytest.approx(25 / 2000)
    assert out["host_ms_per_step"] == pytest.approx(20 / 2000)
    assert out["device_ms_per_step"] == pytest.approx(5 / 2000)
    assert out["busy_ms_per_step"] == pytest.approx(39 / 2000)
    assert out["gaps_per_step"] == 1.5
    assert out["top"] == [
        ("host", "cudaStreamSynchronize in a.py(5): sync_fn", pytest.approx(0.005), 0.5),
        ("host", "launch in b.py(9): launch_fn", pytest.approx(0.005), 0.5),
        ("device", "C (stream 9)", pytest.approx(0.0025), 0.5),
    ]
    # CUDA activity only (no Python frames): the host gaps name the kernel the GPU waited for
    bare = traces.idle_gaps({"traceEvents": [e for e in events if e.get("cat") != "python_function"]}, steps=2)
    assert [label for _, label, _, _ in bare["top"]] == ["cudaStreamSynchronize -> B", "launch -> F", "C (stream 9)"]
    assert bare["idle_ms_per_step"] == out["idle_ms_per_step"]


def test_batch_pool_ids_dtype() -> None:
    """``--ids-dtype int32`` (bench/throughput.py) gives the same ids as int64, in the dtype ``data=criteo_binary``
    loads them in; lengths stay int32."""
    import torch

    from bench import runner
    from dlrm.config import ModelConfig

    mc = ModelConfig(
        name="t",
        embedding_dim=8,
        row_cap=1000,
        multi_hot_sizes=[3] * 26,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[8, 1],
        dcn_num_layers=1,
        dcn_low_rank_dim=4,
    )
    cpu = torch.device("cpu")
    b64 = runner.make_batches(mc, 4, 2, cpu, False, seed=7)
    b32 = runner.make_batches(mc, 4, 2, cpu, False, seed=7, ids_dtype=runner.IDS_DTYPES["int32"])
    for x, y in zip(b64, b32):
        v64, v32 = x.sparse_features.values(), y.sparse_features.values()
        assert (v64.dtype, v32.dtype, y.sparse_features.lengths().dtype) == (torch.int64, torch.int32, torch.int32)
        assert v32.numel() == 4 * 3 * 26 and torch.equal(v32.long(), v64)
        assert torch.equal(x.dense_features, y.dense_features) and torch.equal(x.labels, y.labels)
