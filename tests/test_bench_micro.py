"""Smoke tests of the two micro-benchmarks of issue 9 on CPU (numbers are not asserted: speed is measured on GPUs,
docs/benchmarks.md): ``bench/fp8_dense.py`` (the trainer's dense step; float8 recipes need CUDA and torchao) and
``bench/nccl_all_to_all.py`` (2 gloo processes; the copy-engine cases need NCCL)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, bench_smoke_two_processes

sys.path.insert(0, str(REPO / "bench"))


def test_fp8_dense_times_the_trainers_compiled_dense_step() -> None:
    import fp8_dense

    from dlrm.config import compose, to_config

    rows = fp8_dense.main(["--smoke"])
    assert [r["recipe"] for r in rows] == ["bf16"] and rows[0]["fp8_products"] == 0
    assert len(rows[0]["ms_repeats"]) == 2 and all(t > 0 for t in rows[0]["ms_repeats"])
    # the timed step is the trainer's dense step: compiled, its first loss is the eager one on the same inputs
    cfg = to_config(compose(["model=dlrm_v2_small"]))
    eager = fp8_dense.time_recipe("bf16", cfg.model, 64, torch.device("cpu"), 1, 0, 1, compile=False)
    assert eager["first_loss"] == pytest.approx(rows[0]["first_loss"], rel=1e-3)  # bf16 autocast, fused or not
    assert 0.3 < eager["first_loss"] < 1.2


def test_fp8_dense_refuses_float8_off_cuda() -> None:
    import fp8_dense

    if torch.cuda.is_available():
        pytest.skip("the refusal is for CPU-only machines")
    with pytest.raises(SystemExit) as e:
        fp8_dense.main(["--smoke", "--recipes", "bf16", "tensorwise"])
    assert str(e.value) == "float8 recipes need CUDA (torch._scaled_mm on sm89+); on CPU use --recipes bf16"


def test_fp8_dense_swaps_every_dense_product() -> None:
    """With torchao installed (not in requirements.txt: the trainer has no FP8 mode), the MLPerf model's 12 products
    (over arch 4, dense arch 2 (the 13-wide input layer and the 1-wide logit stay), DCN 3 layers x 2) go float8,
    and the emulated step still gives a finite loss and gradients."""
    pytest.importorskip("torchao", reason="torchao is optional: pip install torchao to run this check")
    import dataclasses

    import fp8_dense
    from torchao.float8 import Float8LinearConfig

    from dlrm.config import compose, to_config
    from dlrm.model import build_model

    cfg = to_config(compose(["model=dlrm_v2", "model.row_cap=100"]))
    model = build_model(cfg.model, dense_device=torch.device("cpu"))
    recipe = Float8LinearConfig.from_recipe_name
    emulated = staticmethod(lambda r: dataclasses.replace(recipe(r), emulate=True))  # CPU: no float8 matmul
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Float8LinearConfig, "from_recipe_name", emulated)
        assert fp8_dense.to_float8(model, "tensorwise") == 12
    emb = torch.randn(8, 26, 128, requires_grad=True)
    loss = model.dense_step(torch.randn(8, 13), emb, torch.randint(0, 2, (8,)))[0]
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(emb.grad).all() and emb.grad.abs().sum() > 0


def test_nccl_all_to_all_smoke_two_processes(tmp_path: Path) -> None:
    data = bench_smoke_two_processes("nccl_all_to_all.py", tmp_path, "nccl_all_to_all.json")
    assert data["meta"]["backend"] == "gloo" and data["meta"]["world"] == 2
    assert data["meta"]["bytes_per_destination"] == 8 * 16 * 2  # batch x dims x bf16
    assert [r["case"] for r in data["results"]] == ["sm", "sm_splits"]  # copy-engine cases need NCCL
    assert all(r["correct"] and r["a2a_ms"] > 0 for r in data["results"]), data["results"]
