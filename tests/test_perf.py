"""Speed levers ``perf.*``: config checks, fp16 tables in the planner, autocast, torch.compile of the
dense side through TorchRec's pipeline, fp16 tables and pooled embeddings on CPU, and bench/throughput.py.

One spawned gloo process (``run_gloo(1, ...)``) trains a tiny model through ``build_training`` in 9 configurations
(fp32; compiled, split and unsplit, narrow and wide; fp16 tables with stochastic and nearest rounding; ``perf=fast``
and its fp32 reference); Inductor compiles five of them. A second runs the throughput benchmark's ``--smoke`` mode.

    .venv/bin/python -m pytest -q tests/test_perf.py
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torchrec.distributed.model_parallel import get_module

from conftest import CUDA_SMALL_RUN, REPO, run_gloo
from dlrm import torchrec_compat as compat
from dlrm.config import compose, to_config
from dlrm.errors import ConfigError
from dlrm.model import FEATURE_NAMES, build_model
from dlrm.process_group import DistInfo
from dlrm.sharding import PlanError, fuse_embedding_optimizer, plan_model, save_plan, tables_of
from dlrm.sharding.constraints import _state_bytes_per_row

BATCH = 16
STEPS = 6
ROWS = 40  # the row cap
DIM = 8
# a tiny DLRM-v2 (26 tables of 40 x 8, 2 ids per sample and feature, one DCN layer): compiles in seconds
TINY = [
    f"model.row_cap={ROWS}",
    f"model.embedding_dim={DIM}",
    f"model.dense_arch_layer_sizes=[16,{DIM}]",
    "model.over_arch_layer_sizes=[16,1]",
    "model.dcn_num_layers=1",
    "model.dcn_low_rank_dim=4",
    f"model.multi_hot_sizes=[{','.join(['2'] * 26)}]",
    "optimizer.lr=0.05",
    f"data.batch_size={BATCH}",
]


# ------------------------------------------------------------------------------------------------------ config
def test_perf_presets_compose() -> None:
    fp32 = to_config(compose([])).perf
    assert (
        fp32.name,
        fp32.embedding_dtype,
        fp32.embedding_output_dtype,
        fp32.autocast,
        fp32.tf32,
        fp32.compile,
        fp32.compile_mode,
    ) == ("fp32", "fp32", "fp32", "none", True, False, "default")
    fast = to_config(compose(["perf=fast"])).perf
    assert (
        fast.name,
        fast.embedding_dtype,
        fast.embedding_output_dtype,
        fast.autocast,
        fast.tf32,
        fast.compile,
        fast.compile_mode,
    ) == ("fast", "fp32", "bf16", "bf16", True, True, "default")
    # bf16 DCN stream, one unsplit graph, 100 MiB DDP buckets
    assert (fast.dcn_residual_dtype, fast.compile_ddp_split, fast.ddp_bucket_cap_mb) == ("autocast", False, 100)
    assert (fp32.dcn_residual_dtype, fp32.compile_ddp_split, fp32.ddp_bucket_cap_mb) == ("fp32", True, 25)
    # the lean output dist (rank blocks) and the all-reduce held behind the backward all-to-all
    assert (fast.lean_output_dist, fast.allreduce_after_output_dist) == (True, True)
    assert (fp32.lean_output_dist, fp32.allreduce_after_output_dist) == (False, False)
    # a lever on top of a preset
    p = to_config(
        compose(["perf=fast", "perf.embedding_dtype=fp16", "perf.compile_mode=max-autotune-no-cudagraphs"])
    ).perf
    assert (p.embedding_dtype, p.compile_mode, p.autocast) == ("fp16", "max-autotune-no-cudagraphs", "bf16")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["perf.embedding_dtype=fp8"], "config key `perf.embedding_dtype`: got 'fp8'; use fp32 or fp16"),
        (
            ["perf.embedding_dtype=bf16"],
            "config key `perf.embedding_dtype`: FBGEMM's TBE trains no bf16 table weights (its CUDA cache set-up "
            "refuses them, its CPU kernels have none); use fp16 (half the memory) or fp32",
        ),
        (
            ["perf.tbe_stochastic_rounding=false"],
            "config key `perf.tbe_stochastic_rounding`: false rounds fp16 table updates to nearest and has no "
            "effect on fp32 tables; add perf.embedding_dtype=fp16, or drop the key",
        ),
        (
            ["perf.embedding_output_dtype=half"],
            "config key `perf.embedding_output_dtype`: got 'half'; use fp32, fp16 or bf16",
        ),
        (["perf.autocast=fp32"], "config key `perf.autocast`: got 'fp32'; use none, bf16 or fp16"),
        (["perf.tbe_bounds_check=off"], "config key `perf.tbe_bounds_check`: got 'off'; use warning, fatal or none"),
        (["perf.allreduce_dtype=int8"], "config key `perf.allreduce_dtype`: got 'int8'; use fp32, fp16 or bf16"),
        (
            ["perf.compile_ddp_split=false"],
            "config key `perf.compile_ddp_split`: splits the compiled dense step and has "
            "no effect while perf.compile=false; add perf.compile=true",
        ),
        (
            ["perf.ddp_bucket_cap_mb=0"],
            "config key `perf.ddp_bucket_cap_mb`: got 0; use a bucket size in MiB >= 1 (25: PyTorch's default)",
        ),
        (
            ["perf.allreduce_after_output_dist=true"],
            "config key `perf.allreduce_after_output_dist`: holds DDP's all-reduce until the lean output dists' "
            "backward all-to-alls are issued; add perf.lean_output_dist=true, or set "
            "perf.allreduce_after_output_dist=false",
        ),
        (
            ["perf=fast", "perf.lean_output_dist=false"],
            "config key `perf.allreduce_after_output_dist`: holds DDP's all-reduce",
        ),
        (
            ["perf=fast", "perf.allreduce_dtype=fp16"],
            "config key `perf.allreduce_after_output_dist`: issues DDP's "
            "fp32 all-reduce (PyTorch's default hook); with perf.allreduce_dtype=fp16 set "
            "perf.allreduce_after_output_dist=false (or use perf.allreduce_dtype=fp32)",
        ),
        (
            ["sharding.data_parallel_max_rows=0"],
            "config key `sharding.data_parallel_max_rows`: must be a positive number of rows, or null (off)",
        ),
        (
            ["sharding.data_parallel_max_rows=1000", "perf.embedding_dtype=fp16"],
            "config key "
            "`sharding.data_parallel_max_rows`: data_parallel tables are stepped by the dense optimizer in fp32, and "
            "perf.embedding_dtype=fp16 gives them half-precision weights; set perf.embedding_dtype=fp32 or "
            "sharding.data_parallel_max_rows=null",
        ),
        (
            ["perf.compile_mode=fast"],
            "config key `perf.compile_mode`: got 'fast'; use one of ('default', 'max-autotune-no-cudagraphs')",
        ),
        (
            ["perf.compile_mode=reduce-overhead"],
            "config key `perf.compile_mode`: reduce-overhead captures CUDA graphs, "
            "which the trainer does not run (not faster on H200: docs/performance.md); use default or "
            "max-autotune-no-cudagraphs",
        ),
        (
            ["perf=fast", "perf.compile_mode=max-autotune"],
            "config key `perf.compile_mode`: max-autotune captures CUDA graphs",
        ),
        (
            ["perf.compile_mode=max-autotune-no-cudagraphs"],
            "config key `perf.compile_mode`: max-autotune-no-cudagraphs "
            "has no effect while perf.compile=false; add perf.compile=true",
        ),
        (
            ["perf.autocast=bf16", "perf.embedding_output_dtype=fp16"],
            "config key `perf.embedding_output_dtype`: fp16 pooled embeddings cannot meet bf16 autocast (autocast's "
            "torch.cat promotion refuses fp16 with bf16); use perf.embedding_output_dtype=bf16 or fp32",
        ),
        (["perf.dcn_residual_dtype=bf16"], "config key `perf.dcn_residual_dtype`: got 'bf16'; use fp32 or autocast"),
        (
            ["perf.dcn_residual_dtype=autocast"],
            "config key `perf.dcn_residual_dtype`: autocast keeps the DCN's residual "
            "stream in the autocast dtype and has no effect while perf.autocast=none; add perf.autocast=bf16, or use "
            "perf.dcn_residual_dtype=fp32",
        ),
        (
            ["perf=fast", "perf.dcn_residual_dtype=autocast", "model.interaction=dot"],
            "config key "
            "`perf.dcn_residual_dtype`: autocast sets the dtype of the DCN cross layers, and model.interaction=dot has "
            "none; use perf.dcn_residual_dtype=fp32 or model.interaction=dcn",
        ),
        (
            ["perf=fast", "perf.embedding_output_dtype=fp16"],  # fast's bf16 autocast
            "config key `perf.embedding_output_dtype`: fp16 pooled embeddings cannot meet bf16 autocast",
        ),
    ],
)
def test_perf_refusals_name_the_key_and_the_fix(overrides: List[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        to_config(compose(overrides))
    assert str(e.value).startswith(message), str(e.value)


def test_fused_params_carry_output_dtype_and_bounds_check() -> None:
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    from dlrm.sharding import fused_params_of

    assert fused_params_of("fp32") is None  # TorchRec's defaults: fp32 output, FBGEMM's WARNING check
    assert fused_params_of("bf16", "none") == {
        "output_dtype": SparseType.BF16,
        "bounds_check_mode": BoundsCheckMode.NONE,
    }
    assert fused_params_of("fp32", "fatal") == {"bounds_check_mode": BoundsCheckMode.FATAL}
    assert fused_params_of("fp32", "warning", False) == {"stochastic_rounding": False}
    fast = to_config(compose(["perf=fast"])).perf
    assert (fast.tbe_bounds_check, to_config(compose([])).perf.tbe_bounds_check) == ("none", "warning")


def test_matching_or_fp32_pooled_dtype_is_accepted_under_autocast() -> None:
    for ac, out in [("fp16", "fp16"), ("fp16", "fp32"), ("bf16", "bf16"), ("bf16", "fp32")]:
        p = to_config(compose([f"perf.autocast={ac}", f"perf.embedding_output_dtype={out}"])).perf
        assert (p.autocast, p.embedding_output_dtype) == (ac, out)


def test_bf16_is_refused_on_cpu_before_building() -> None:
    from dlrm.trainer import build_training

    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")  # refused before any process group is needed
    tail = "(perf=fast is for CUDA: on CPU add perf.embedding_output_dtype=fp32)"
    with pytest.raises(ConfigError) as e:
        build_training(to_config(compose(TINY + ["perf.embedding_output_dtype=bf16"])), info, BATCH)
    assert str(e.value) == (
        "config key `perf.embedding_output_dtype`: FBGEMM's CPU TBE kernels have no bf16; use fp16 or fp32 on "
        f"CPU {tail}"
    )
    # perf=fast on CPU: fp16 pooled embeddings would meet bf16 autocast, so the message names fp32 only
    with pytest.raises(ConfigError) as e:
        build_training(to_config(compose(TINY + ["perf=fast"])), info, BATCH)
    assert str(e.value) == (
        "config key `perf.embedding_output_dtype`: FBGEMM's CPU TBE kernels have no bf16; use "
        f"fp32 on CPU (fp16 too, without bf16 autocast) {tail}"
    )
    cfg = to_config(compose(TINY + ["perf=fast", "perf.embedding_output_dtype=fp32"]))  # the documented CPU form
    assert (cfg.perf.autocast, cfg.perf.compile, cfg.perf.embedding_output_dtype) == ("bf16", True, "fp32")
    with pytest.raises(ConfigError) as e:
        build_training(to_config(compose(TINY + ["perf.allreduce_dtype=bf16"])), info, BATCH)
    assert str(e.value) == (
        "config key `perf.allreduce_dtype`: PyTorch's bf16_compress_hook needs CUDA and NCCL; use fp16 or fp32 on CPU"
    )


def test_perf_is_checked_before_data_is_loaded(tmp_path: Path) -> None:
    """`python train.py perf=fast` on CPU fails at once with the key named (exit 2), not after loading data."""
    import subprocess

    r = subprocess.run(
        [sys.executable, "train.py", "perf=fast", "device=cpu", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: config key `perf.embedding_output_dtype`" in r.stderr + r.stdout
    assert "data synthetic" not in r.stderr + r.stdout  # the data-loading log line never came


# ------------------------------------------------------------------------------------------------------ planner
def _meta_model(overrides: List[str]):
    cfg = to_config(compose(overrides))
    model = build_model(cfg.model, dense_device=torch.device("meta"), perf=cfg.perf)
    fuse_embedding_optimizer(model, cfg.optimizer)
    return cfg, model


def _plan(overrides: List[str], world_size: int = 1, batch: int = 32):
    cfg, model = _meta_model(overrides)
    return plan_model(
        model,
        cfg.sharding,
        world_size=world_size,
        local_world_size=world_size,
        device=torch.device("cpu"),
        batch_size=batch,
        sparse_type=cfg.optimizer.sparse_type,
    )


def test_fp16_tables_count_two_bytes_per_weight() -> None:
    _, model = _meta_model(["model.row_cap=64", "perf.embedding_dtype=fp16"])
    tables = tables_of(model)
    assert len(tables) == 26 and {t.weight_bytes for t in tables} == {2}
    assert model.model.sparse_arch.embedding_bag_collection.embedding_bags["t_cat_0"].weight.dtype == torch.float16
    assert {t.weight_bytes for t in tables_of(_meta_model(["model.row_cap=64"])[1])} == {4}
    # weights at their own width, FBGEMM's optimizer state always fp32: element-wise Adagrad dim floats per row,
    # row-wise Adagrad one float per row
    assert _state_bytes_per_row(16, "adagrad", 2) == 2 * 16 + 4 * 16
    assert _state_bytes_per_row(16, "adagrad", 4) == 4 * 16 + 4 * 16
    assert _state_bytes_per_row(128, "rowwise_adagrad", 2) == 2 * 128 + 4


def test_planner_estimate_of_fp16_tables() -> None:
    """TorchRec's per-shard estimate (weights + optimizer state + I/O buffers) of a table_wise 64 x 16 table,
    fp32 against fp16, on one rank at batch 32."""
    rows, dim, batch = 64, 16, 32
    est = {}
    for dt in ("fp32", "fp16"):
        pi = _plan(["model.row_cap=64", "sharding=table_wise", f"perf.embedding_dtype={dt}"], batch=batch)
        assert {s["sharding_type"] for s in pi.shards} == {"table_wise"} and len(pi.shards) == 26
        est[dt] = {s["table"]: s["ddr_bytes"] for s in pi.shards}
    assert est["fp16"]["t_cat_0"] < est["fp32"]["t_cat_0"]
    # 2 bytes less per weight; TorchRec also scales its Adagrad-state estimate (one value per weight) and the
    # pooled-output buffer (batch x dim, no output_dtype given to the planner) by the weights' element size
    table_rows = to_config(compose(["model.row_cap=64"])).model.table_rows  # 64, or fewer (t_cat_5: 3)
    assert table_rows[0] == rows and table_rows[5] == 3
    diff = {f"t_cat_{i}": r * dim * 2 + r * dim * 2 + batch * dim * 2 for i, r in enumerate(table_rows)}
    assert {t: est["fp32"][t] - est["fp16"][t] for t in est["fp32"]} == diff


def test_fit_check_counts_fp16_weights() -> None:
    """A 40 M x 128 table placed whole with element-wise Adagrad: fp32 needs 40 M x 128 x 8 B = 38.15 GiB, fp16
    40 M x 128 x 6 B = 28.61 GiB (the state stays fp32)."""
    base = [
        "model=dlrm_v2",
        "device=cuda",
        "sharding=table_wise",
        "sharding.compute_kernel=fused",
        "data.global_batch_size=65536",
    ]

    def plan(extra: List[str]):
        cfg, model = _meta_model(base + extra)
        return plan_model(
            model,
            cfg.sharding,
            world_size=8,
            local_world_size=8,
            device=torch.device("cuda"),
            batch_size=8192,
            sparse_type=cfg.optimizer.sparse_type,
        )

    with pytest.raises(
        PlanError,
        match=r"^table t_cat_0 \(40,000,000 x 128 fp32 with its optimizer state, 38.15 GiB\)"
        r" does not fit the 33.25 GiB of HBM per rank",
    ):
        plan(["sharding.hbm_cap_gb=35"])
    pi = plan(["sharding.hbm_cap_gb=35", "perf.embedding_dtype=fp16"])
    assert {(s["sharding_type"], s["compute_kernel"]) for s in pi.shards} == {("table_wise", "fused")}
    with pytest.raises(
        PlanError,
        match=r"^table t_cat_0 \(40,000,000 x 128 fp16 with its optimizer state, "
        r"28.61 GiB\) does not fit the 23.75 GiB of HBM per rank",
    ):
        plan(["sharding.hbm_cap_gb=25", "perf.embedding_dtype=fp16"])


def test_data_parallel_fp16_tables_are_refused(tmp_path: Path) -> None:
    every = ", ".join(sorted(f"t_cat_{i}" for i in range(26)))
    with pytest.raises(PlanError) as e:
        _plan(["model.row_cap=64", "sharding=data_parallel", "perf.embedding_dtype=fp16"], world_size=2)
    assert str(e.value) == (
        f"tables {every} are data_parallel with half-precision weights (perf.embedding_dtype); set "
        "perf.embedding_dtype=fp32, or constrain them to a fused sharding type "
        "(sharding.constraints.<table>.sharding_types=[table_wise])"
    )
    one = ["model.row_cap=64", "sharding=table_wise", "+sharding.constraints.t_cat_5.sharding_types=[data_parallel]"]
    with pytest.raises(
        PlanError,
        match=r"^tables t_cat_5 are data_parallel with half-precision weights "
        r"\(perf.embedding_dtype\)",
    ):
        _plan(one + ["perf.embedding_dtype=fp16"], world_size=2)
    # the same placement with fp32 tables plans; saved, it is refused again when loaded for fp16 tables
    pi = _plan(one, world_size=2)
    assert {s["sharding_type"] for s in pi.shards if s["table"] == "t_cat_5"} == {"data_parallel"}
    save_plan(pi, str(tmp_path / "plan.json"))
    with pytest.raises(PlanError, match=r"^tables t_cat_5 are data_parallel with half-precision weights"):
        _plan(one + ["perf.embedding_dtype=fp16", f"sharding.plan_path={tmp_path / 'plan.json'}"], world_size=2)


def test_auto_sharding_keeps_fp16_tables_off_data_parallel() -> None:
    """With fp32 tables the planner puts the smallest tables (3, 4, 10, 14 rows) data_parallel on 2 CPU ranks;
    with fp16 tables ``sharding=auto`` must not offer it (a data_parallel fp16 table is the PlanError above)."""
    from dlrm.plan import plan_job

    fp32 = plan_job(["model.row_cap=64"], world_size=2)
    assert {s["table"] for s in fp32.shards if s["sharding_type"] == "data_parallel"} == {
        "t_cat_5",
        "t_cat_12",
        "t_cat_16",
        "t_cat_18",
    }
    fp16 = plan_job(["model.row_cap=64", "perf.embedding_dtype=fp16"], world_size=2)
    assert {s["table"] for s in fp16.shards} == {f"t_cat_{i}" for i in range(26)}
    assert not any(s["sharding_type"] == "data_parallel" for s in fp16.shards)


# ------------------------------------------------------------------------------------------------------ autocast
def _batches(n: int, seed: int) -> list:
    """``n`` batches of BATCH samples: 2 ids per sample and feature below its table's rows, random dense and
    labels."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rows = to_config(compose(TINY)).model.table_rows  # 40, or fewer (t_cat_5: 3)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((26 * BATCH,), 2, dtype=torch.int32)
    return [
        Batch(
            dense_features=torch.randn(BATCH, 13, generator=g),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(  # feature-major values
                FEATURE_NAMES, torch.cat([torch.randint(0, r, (BATCH * 2,), generator=g) for r in rows]), lengths
            ),
            labels=torch.randint(0, 2, (BATCH,), generator=g).float(),
        )
        for _ in range(n)
    ]


def test_fp16_autocast_runs_the_dense_side_in_half_and_returns_fp32_logits() -> None:
    cfg = to_config(compose(TINY + ["perf.autocast=fp16"]))
    torch.manual_seed(0)
    amp = build_model(cfg.model, torch.device("cpu"), torch.device("cpu"), perf=cfg.perf)
    ref = build_model(cfg.model, torch.device("cpu"), torch.device("cpu"))
    ref.load_state_dict(amp.state_dict())
    assert (amp.autocast_dtype, amp.device_type, ref.autocast_dtype) == (torch.float16, "cpu", None)
    seen: Dict[str, torch.dtype] = {}
    for name in ("dense_arch", "inter_arch", "over_arch"):
        getattr(amp.model, name).register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o.dtype))
    batch = _batches(1, seed=3)[0]
    loss, (_, logits, _) = amp(batch)
    # the DCN's residual adds the fp32 concat of the dense output with the fp32 pooled embeddings: its matmuls run
    # in fp16, its output is fp32; the MLPs' outputs are fp16
    assert seen == {"dense_arch": torch.float16, "inter_arch": torch.float32, "over_arch": torch.float16}
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32 and logits.shape == (BATCH,)
    ref_loss, (_, ref_logits, _) = ref(batch)
    # the same network in half precision: close to fp32, but not the fp32 result (autocast really ran)
    assert not torch.equal(logits, ref_logits)
    torch.testing.assert_close(logits, ref_logits, atol=5e-3, rtol=0)
    torch.testing.assert_close(loss, ref_loss, atol=2e-3, rtol=0)
    loss.backward()
    assert all(
        p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
        for n, p in amp.model.over_arch.named_parameters()
    )


def test_dcn_residual_in_the_autocast_dtype() -> None:
    """``perf.dcn_residual_dtype=autocast``: the cross layers' stream is bf16 under bf16 autocast and equals a
    hand-written bf16 DCN bit for bit; without autocast it equals TorchRec's LowRankCrossNet bit for bit."""
    from torchrec.modules.crossnet import LowRankCrossNet

    from dlrm.model import AutocastLowRankCrossNet

    layers = TINY + ["model.dcn_num_layers=3"]  # the residual chain through several layers
    cfg = to_config(compose(layers + ["perf.autocast=bf16", "perf.dcn_residual_dtype=autocast"]))
    fp32 = to_config(compose(layers + ["perf.autocast=bf16"]))
    torch.manual_seed(0)
    amp = build_model(cfg.model, torch.device("cpu"), torch.device("cpu"), perf=cfg.perf)
    ref = build_model(fp32.model, torch.device("cpu"), torch.device("cpu"), perf=fp32.perf)
    ref.load_state_dict(amp.state_dict())  # same parameter names: checkpoints of either load into the other
    net, ref_net = amp.model.inter_arch.crossnet, ref.model.inter_arch.crossnet
    assert (type(net), type(ref_net), len(net.bias)) == (AutocastLowRankCrossNet, LowRankCrossNet, 3)
    with torch.no_grad():
        for b in net.bias:
            b.uniform_(-0.5, 0.5)  # TorchRec initialises the bias to zeros
    ref.load_state_dict(amp.state_dict())
    x0 = torch.randn(BATCH, net.V_kernels[0].shape[1], dtype=torch.bfloat16)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref_out = net(x0), ref_net(x0)
    assert (out.dtype, ref_out.dtype) == (torch.bfloat16, torch.float32)  # TorchRec's fp32 bias promotes
    x, bf = x0, torch.bfloat16
    with torch.no_grad():
        for v, w, b in zip(net.V_kernels, net.W_kernels, net.bias):
            x = x0 * (torch.nn.functional.linear(torch.nn.functional.linear(x, v.to(bf)), w.to(bf)) + b.to(bf)) + x
    assert x.dtype == bf and torch.equal(out.detach(), x)
    torch.testing.assert_close(out.float(), ref_out, atol=0.05, rtol=0.02)  # the same layers, rounded to bf16
    assert not torch.equal(out.float(), ref_out)

    xf = torch.randn(BATCH, net.V_kernels[0].shape[1], requires_grad=True)  # no autocast: TorchRec's values
    out, ref_out = net(xf), ref_net(xf)
    assert out.dtype == torch.float32 and torch.equal(out, ref_out)
    g, ref_g = (
        torch.autograd.grad(out.sum(), [xf, *net.parameters()]),
        torch.autograd.grad(ref_out.sum(), [xf, *ref_net.parameters()]),
    )
    assert all(torch.equal(a, b) for a, b in zip(g, ref_g))

    batch = _batches(1, seed=3)[0]  # the whole model: bf16 stream, fp32 logits, fp32 parameter gradients
    loss, (_, logits, _) = amp(batch)
    loss.backward()
    assert logits.dtype == torch.float32 and all(
        p.grad is not None and p.grad.dtype == torch.float32 for p in net.parameters()
    )


# ------------------------------------------------------------------------------------------------------ training
def _full_tables(dmp) -> Dict[str, torch.Tensor]:
    """Every table's whole weight from ``dmp.state_dict()`` (one rank holds every shard)."""
    out = {}
    for k, v in dmp.state_dict().items():
        if "embedding_bags" not in k:
            continue
        name = k.split(".")[-2]
        if hasattr(v, "local_shards"):
            full = torch.empty(v.size(), dtype=v.dtype)
            for sh in v.local_shards():
                (r0, c0), (r, c) = sh.metadata.shard_offsets, sh.metadata.shard_sizes
                full[r0 : r0 + r, c0 : c0 + c] = sh.tensor
            out[name] = full
        else:
            out[name] = v.detach().clone()
    return out


def _train(overrides: List[str], batches: list, base: List[str] = TINY, hooks: Any = None) -> Dict[str, Any]:
    from dlrm.process_group import init_distributed
    from dlrm.trainer import build_training

    cfg = to_config(compose(base + overrides))
    info = init_distributed("cpu")
    torch.manual_seed(0)
    built = build_training(cfg, info, BATCH, hooks=hooks)
    dmp = built.model
    res: Dict[str, Any] = {
        "keys": sorted(dmp.state_dict()),
        "tables0": _full_tables(dmp),
        "plan": sorted({s["sharding_type"] for s in dmp.plan_info.shards}),
    }
    if cfg.perf.embedding_output_dtype != "fp32":
        seen = []
        h = dmp.module.model.sparse_arch.register_forward_hook(  # (values, order): one rank, feature order
            lambda m, i, o: seen.append(o[0].detach().clone())
        )
        with torch.no_grad():
            dmp(batches[0])
        h.remove()
        res["pooled"] = seen[0]
    it = iter(batches)
    losses = []
    while True:
        try:
            losses.append(float(built.pipeline.progress(it)[0].detach()))
        except StopIteration:
            break
    res["losses"] = losses
    res["tables"] = _full_tables(dmp)
    res["opt_state_dtypes"] = sorted(
        {  # the fused Adagrad's per-table momentum, as stored
            str(t.local_shards()[0].tensor.dtype if hasattr(t, "local_shards") else t.dtype)
            for st in dmp.fused_optimizer.state.values()
            for k, t in st.items()
            if "momentum" in k
        }
    )
    res["compiled"] = list(dmp.module.compiled_parts)
    res["setup_compiled"] = built.perf.compiled
    res["bucket_bytes_cap"] = get_module(dmp).bucket_bytes_cap  # DDP's, as TorchRec built it
    res["optimize_ddp"] = compat.dynamo_optimize_ddp()  # what the step compiled under
    res["crossnet"] = type(dmp.module.model.inter_arch.crossnet).__name__
    return res


def _train_worker(rank: int, world: int) -> Dict[str, Any]:
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    batches = _batches(STEPS, seed=7)
    out = {"fp32": _train([], batches)}
    out["compile"] = _train(["perf.compile=true"], batches)
    out["unique_graphs"] = compat.dynamo_count("stats", "unique_graphs")
    # a caller's compile function (dlrm.trainer.BuildHooks) gets the trainer's call and replaces compile_dense
    from dlrm.perf import compile_dense
    from dlrm.trainer import BuildHooks

    calls: List[Any] = []

    def recording(model: Any, mode: str, ddp_split: bool) -> List[str]:
        calls.append((type(model).__name__, mode, ddp_split))
        return compile_dense(model, mode, ddp_split)

    out["one_graph"] = _train(
        ["perf.compile=true", "perf.compile_ddp_split=false", "perf.ddp_bucket_cap_mb=1"],
        batches,
        hooks=BuildHooks(compile_dense=recording),
    )
    out["hook_calls"] = calls
    # an over arch of 1.9 MiB of fp32 weights, so that 1 MiB buckets split the step; pieces counted as the
    # graphs AOTAutograd compiles
    wide = [o for o in TINY if not o.startswith("model.over_arch")] + ["model.over_arch_layer_sizes=[1024,256,1]"]
    for name, split in (("wide_split", "true"), ("wide_one_graph", "false")):
        before = compat.dynamo_count("aot_autograd", "total")
        out[name] = _train(
            ["perf.compile=true", f"perf.compile_ddp_split={split}", "perf.ddp_bucket_cap_mb=1"], batches, base=wide
        )
        out[name]["graphs"] = compat.dynamo_count("aot_autograd", "total") - before
    out["fp16"] = _train(["perf.embedding_dtype=fp16", "perf.embedding_output_dtype=fp16"], batches)
    out["fp16_nearest"] = _train(
        ["perf.embedding_dtype=fp16", "perf.embedding_output_dtype=fp16", "perf.tbe_stochastic_rounding=false"], batches
    )
    # perf=fast as it runs on CPU (fp32 pooled embeddings): bf16 autocast with the bf16 DCN stream, one graph
    out["fast"] = _train(["perf=fast", "perf.embedding_output_dtype=fp32", "model.dcn_num_layers=2"], batches)
    out["fast_ref"] = _train(["model.dcn_num_layers=2"], batches)  # the same network in fp32, eager
    out["batches"] = batches
    return out


@pytest.fixture(scope="module")
def trained() -> Dict[str, Any]:
    return run_gloo(1, _train_worker, timeout=400)[0]


def test_compiled_dense_side_trains_like_eager_through_the_pipeline(trained) -> None:
    eager, comp = trained["fp32"], trained["compile"]
    assert comp["compiled"] == ["model.dense_arch", "model.inter_arch", "model.over_arch", "loss"]
    assert eager["compiled"] == []
    assert trained["unique_graphs"] >= 1  # dynamo really captured the dense step
    assert len(eager["losses"]) == STEPS and all(0.3 < x < 1.2 for x in eager["losses"]), eager["losses"]
    assert len(set(eager["losses"])) == STEPS  # the model trains: every step's loss differs
    torch.testing.assert_close(torch.tensor(comp["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    # compile_dense wraps no module: the same state dict keys (no `_orig_mod.`) and the same tables
    assert comp["keys"] == eager["keys"] and not any("_orig_mod" in k for k in comp["keys"])
    # both start from the same tables; the compiled loss and its fused backward round the gradients differently,
    # and Adagrad's step lr * g / sqrt(sum g^2) carries a small gradient's relative rounding into its update whole,
    # whatever the gradient's size (measured: 1.3e-5 of a 0.13 update, on a row whose accumulator is 1.5e-6), so
    # each table's updates are compared relative to their size
    for t, w in eager["tables"].items():
        start = eager["tables0"][t]
        assert torch.equal(comp["tables0"][t], start), t
        torch.testing.assert_close(comp["tables"][t] - start, w - start, rtol=1e-3, atol=1e-5)


def test_compile_hook_gets_the_trainers_call_and_trains_like_the_trainer(trained) -> None:
    """``BuildHooks.compile_dense`` is called once, as the trainer calls ``dlrm.perf.compile_dense`` (the unwrapped
    model, ``perf.compile_mode``, ``perf.compile_ddp_split``), and what it returns is what the build reports; the
    step trains as the trainer's default compiled step does."""
    assert trained["hook_calls"] == [("DLRMTrainAutocast", "default", False)]
    hooked = trained["one_graph"]
    assert (
        hooked["setup_compiled"]
        == hooked["compiled"]
        == ["model.dense_arch", "model.inter_arch", "model.over_arch", "loss"]
    )
    assert hooked["optimize_ddp"] is False and len(hooked["losses"]) == STEPS
    torch.testing.assert_close(
        torch.tensor(hooked["losses"]), torch.tensor(trained["compile"]["losses"]), rtol=1e-5, atol=0
    )


def test_one_graph_and_bucket_size_keys_reach_dynamo_and_ddp(trained) -> None:
    """``perf.compile_ddp_split=false`` compiles with dynamo's DDPOptimizer off (one graph where the default makes
    one per DDP bucket), ``perf.ddp_bucket_cap_mb`` sets DDP's bucket size, and the step trains as the default
    compiled one does."""
    split, one = trained["compile"], trained["one_graph"]
    assert (split["optimize_ddp"], one["optimize_ddp"]) == (True, False)
    assert (split["bucket_bytes_cap"], one["bucket_bytes_cap"]) == (25 * 2**20, 2**20)
    assert len(one["losses"]) == STEPS
    torch.testing.assert_close(torch.tensor(one["losses"]), torch.tensor(split["losses"]), rtol=1e-5, atol=0)
    # a dense side larger than a bucket: the default splits the compiled step into pieces, the key keeps one
    wide_split, wide_one = trained["wide_split"], trained["wide_one_graph"]
    assert (wide_one["graphs"], wide_one["optimize_ddp"]) == (1, False)
    assert wide_split["graphs"] >= 2 and wide_split["optimize_ddp"], wide_split["graphs"]
    torch.testing.assert_close(torch.tensor(wide_one["losses"]), torch.tensor(wide_split["losses"]), rtol=1e-5, atol=0)


def test_fast_preset_trains_through_the_pipeline_with_the_bf16_dcn_stream(trained) -> None:
    """``perf=fast`` (CPU form) through TorchRec's pipeline, which fx-traces the model: the bf16 cross network,
    one compiled graph, 100 MiB buckets; its losses follow the fp32 run of the same network within bf16 rounding."""
    fast, ref = trained["fast"], trained["fast_ref"]
    assert (fast["crossnet"], ref["crossnet"]) == ("AutocastLowRankCrossNet", "LowRankCrossNet")
    assert (fast["optimize_ddp"], fast["bucket_bytes_cap"]) == (False, 100 * 2**20)
    assert fast["compiled"] == ["model.dense_arch", "model.inter_arch", "model.over_arch", "loss"]
    assert fast["keys"] == ref["keys"]  # same parameter names: checkpoints move between the two
    assert len(fast["losses"]) == STEPS and len(set(fast["losses"])) == STEPS
    diff = (torch.tensor(fast["losses"]) - torch.tensor(ref["losses"])).abs()
    # the first step (same weights) differs by bf16 rounding only (measured 3e-5); later steps drift apart as the
    # bf16 updates compound on this tiny model's lr of 0.05 (measured up to 0.019 by step 6, losses near 0.7)
    assert 0 < diff[0] < 1e-3 and diff.max() < 0.05, diff


def test_fp16_tables_and_pooled_embeddings_on_cpu(trained) -> None:
    r = trained["fp16"]
    assert "data_parallel" not in r["plan"]
    assert len(r["tables0"]) == 26 and {w.dtype for w in r["tables"].values()} == {torch.float16}
    # FBGEMM keeps the Adagrad state in fp32 for fp16 weights
    assert r["opt_state_dtypes"] == ["torch.float32"], r["opt_state_dtypes"]
    # the pooled embeddings are fp16 and are the sums of each sample's two fp16 rows
    pooled, kjt = r["pooled"], trained["batches"][0].sparse_features
    assert pooled.dtype == torch.float16 and pooled.shape == (BATCH, 26, DIM)
    jt = kjt.to_dict()
    expect = torch.stack(
        [r["tables0"][f"t_{f}"].float()[jt[f].values().view(BATCH, 2)].sum(1) for f in FEATURE_NAMES], dim=1
    )
    torch.testing.assert_close(pooled.float(), expect, atol=1e-3, rtol=1e-3)
    # training steps the fp16 weights: finite losses near ln 2 that differ step to step, and exactly the rows
    # looked up in the STEPS batches change (Adagrad's first step moves a row by ~lr, far above fp16 resolution)
    assert len(r["losses"]) == STEPS and len(set(r["losses"])) == STEPS
    assert all(0.3 < x < 1.2 for x in r["losses"]), r["losses"]
    for f in FEATURE_NAMES:
        t = f"t_{f}"
        used = sorted({int(i) for b in trained["batches"] for i in b.sparse_features[f].values()})
        changed = torch.nonzero((r["tables"][t] != r["tables0"][t]).any(1)).flatten().tolist()
        assert changed == used, (t, changed, used)
        assert torch.isfinite(r["tables"][t].float()).all()


def test_nearest_rounding_of_fp16_tables_on_cpu(trained) -> None:
    """FBGEMM's CPU kernels round fp16 updates to nearest whatever ``perf.tbe_stochastic_rounding`` says, so on
    CPU both settings train the same tables bit for bit (on CUDA: the GPU test below)."""
    sr, nearest = trained["fp16"], trained["fp16_nearest"]
    assert nearest["losses"] == sr["losses"] and len(set(sr["losses"])) == STEPS
    for t, w in sr["tables"].items():
        assert torch.equal(nearest["tables"][t], w), t


def _table_shards(dmp: Any) -> List[torch.Tensor]:
    """This rank's table shards as the DMP state dict gives them: views of the live TBE weights (what
    ``dlrm.sharding.seed_tables`` writes through)."""
    return [sh.tensor for k, v in dmp.state_dict().items() if "embedding_bags" in k for sh in v.local_shards()]


@pytest.mark.gpu
def test_fp16_table_updates_round_as_configured_on_cuda(tmp_path) -> None:
    """1 GPU, fp16 tables with every weight set to 2^-6 and table lr 1e-6: each element-wise Adagrad update is at
    most the lr, below half the fp16 spacing at 2^-6 (2^-18 below it, 2^-17 above), so rounded to nearest
    (``perf.tbe_stochastic_rounding=false``) no weight moves; FBGEMM's stochastic rounding moves some (each by
    one fp16 step, with probability update / step)."""
    from dlrm.trainer import Trainer

    moved = {}
    for sr in ("true", "false"):
        cfg = compose(
            [
                *CUDA_SMALL_RUN,
                "data.num_train_samples=8192",
                "optimizer.sparse_lr=1e-6",
                "perf.embedding_dtype=fp16",
                f"perf.tbe_stochastic_rounding={sr}",
            ]
        )
        t = Trainer(cfg, str(tmp_path / sr))
        t.setup()
        try:
            shards = _table_shards(t.model)
            assert len(shards) == 26 and {w.dtype for w in shards} == {torch.float16}
            for w in shards:
                w.fill_(2.0**-6)
            it = t._train_iter()
            for _ in range(4):
                t.pipeline.progress(it)
            torch.cuda.synchronize()
            moved[sr] = sum(int((w != 2.0**-6).sum()) for w in _table_shards(t.model))
        finally:
            t.close()
    assert moved["false"] == 0, moved
    assert moved["true"] > 1000, moved


# ------------------------------------------------------------------------------------------------------ bench
def _bench_worker(rank: int, world: int, out: str) -> List[Dict[str, Any]]:
    from bench import throughput

    torch.set_num_threads(1)
    return throughput.main(
        [
            "--smoke",
            "--variants",
            "stock",
            "stock_elementwise",
            "fp32",
            "fp16_tables",
            "--profile",
            "fp32",
            "--out",
            out,
            "--ids-dtype",
            "int32",
        ]
    )


def test_throughput_smoke_one_process(tmp_path: Path) -> None:
    rows = run_gloo(1, _bench_worker, str(tmp_path), timeout=300)[0]
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert data["results"] == json.loads(json.dumps(rows, default=str))
    assert data["meta"]["world"] == 1 and data["meta"]["smoke"] is True and data["meta"]["ids_dtype"] == "int32"
    # the stock variants run first and again last (drift check)
    order = ["stock", "stock_elementwise", "fp32", "fp16_tables", "stock", "stock_elementwise"]
    assert [r["config"] for r in data["results"]] == order
    for r in data["results"]:
        assert "error" not in r, r
        ms = r["ms_repeats"]
        assert r["batch_per_rank"] == 32 and len(ms) == 2 and min(ms) > 0
        assert (r["ms_min"], r["ms_median"], r["ms_max"]) == (min(ms), statistics.median(ms), max(ms))
        assert r["samples_per_s"] == pytest.approx(32 * 1000.0 / r["ms_median"])
        assert 0.0 < r["last_loss"] < 5.0
        assert 0 < r["host_ms_per_step"] < 10 * r["ms_max"], r  # median host time to issue one step
    by = {r["config"]: r for r in data["results"]}
    # stock is TorchRec's own model; the trainer variants are the trainer's
    assert (by["stock"]["model"], by["stock"]["sparse_arch"]) == ("torchrec.models.dlrm.DLRMTrain", "SparseArch")
    assert (by["fp32"]["model"], by["fp32"]["sparse_arch"]) == ("dlrm.model.DLRMTrainAutocast", "ZeroCopySparseArch")
    assert by["fp16_tables"]["overrides"] == ["perf.embedding_dtype=fp16"]
    assert all(t != "data_parallel" for t, _ in by["fp16_tables"]["plan"])
    # --profile on CPU: no device kernels, so no GPU busy or idle time, and the host syncs are listed
    gaps = by["fp32"]["idle_gaps"]
    assert (gaps["busy_ms_per_step"], gaps["idle_ms_per_step"], gaps["top"]) == (0.0, 0.0, [])
    assert "breakdown_ms_per_step" in by["fp32"] and "idle_gaps" not in by["fp16_tables"]
    md = (tmp_path / "throughput.md").read_text()
    assert "| fp16_tables | perf.embedding_dtype=fp16 | 32 |" in md and "; KJT ids int32)" in md.splitlines()[0]
    # ratios: each stock variant's first and last run over the row's ms/step, a range where they differ
    cells = next(ln for ln in md.splitlines() if ln.startswith("| fp32 |")).split(" | ")
    for col, kind in ((7, "stock"), (8, "stock_elementwise")):
        lo, hi = sorted(r["ms_median"] / by["fp32"]["ms_median"] for r in data["results"] if r["config"] == kind)
        want = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"
        assert cells[col] == want, (col, cells)


def test_plan_that_forgets_fp32_adagrad_state_of_fp16_tables_is_refused() -> None:
    """TorchRec's planner sizes the element-wise Adagrad state of fp16 tables in fp16 (2 bytes per weight) while
    FBGEMM keeps it in fp32: the plan below fits by TorchRec's count and would not fit on the GPU."""
    base = [
        "model=dlrm_v2",
        "device=cuda",
        "sharding=table_wise",
        "data.global_batch_size=65536",
        "perf.embedding_dtype=fp16",
        "sharding.hbm_cap_gb=25",
    ]

    def plan(extra: List[str]):
        cfg, model = _meta_model(base + extra)
        return plan_model(
            model,
            cfg.sharding,
            world_size=8,
            local_world_size=8,
            device=torch.device("cuda"),
            batch_size=8192,
            sparse_type=cfg.optimizer.sparse_type,
        )

    with pytest.raises(PlanError) as e:
        plan([])
    msg = str(e.value)
    # the rank holds a 40 M x 128 table (40e6 x 128 x 2 B = 9.54 GiB of state missing) plus small ones
    import re

    m = re.search(
        r"^rank \d+ would need ([\d.]+) GiB of HBM, above the 23.75 GiB usable: the plan counted "
        r"([\d.]+) GiB, .*\(([\d.]+) GiB more than TorchRec's planner counts\)\. Re-plan with "
        r"sharding.storage_reservation=0\.(\d\d)",
        msg,
    )
    assert m, msg
    need, counted, extra = (float(m.group(i)) for i in (1, 2, 3))
    assert 9.54 <= extra < 9.6 and abs(need - counted - extra) <= 0.011 and need > 23.75
    # row-wise Adagrad keeps one float per row and is counted right: the same placement plans
    pi = plan(["optimizer.sparse_type=rowwise_adagrad"])
    assert {s["sharding_type"] for s in pi.shards} == {"table_wise"}


def _alternate_worker(rank: int, world: int, out: str) -> List[Dict[str, Any]]:
    from bench import throughput

    torch.set_num_threads(1)
    return throughput.main(
        [
            "--smoke",
            "--alternate",
            "--sharding",
            "table_wise",
            "--variants",
            "fp32",
            "fast_torchrec_sparse_arch",
            "fast_bounds_check",
            "--out",
            out,
        ]
    )


def test_throughput_alternating_and_hooked_variants(tmp_path: Path) -> None:
    """2 gloo ranks, table_wise: ``--alternate`` interleaves the repeats of variants built together; the ``HOOKS``
    variant really runs with TorchRec's ``SparseArch`` (a copy into feature order before the dense step) and only
    it does; it and the bounds check train exactly like ``perf=fast``, whose pooled embeddings come out of feature
    order on 2 ranks and are reordered inside the dense step (bitwise-equal last loss)."""
    rows = run_gloo(2, _alternate_worker, str(tmp_path), timeout=600)[0]
    by = {r["config"]: r for r in rows}
    assert [r["config"] for r in rows] == ["fp32", "fast_torchrec_sparse_arch", "fast_bounds_check"]
    for r in rows:
        assert "error" not in r, r
        assert r["order"] == "alternating" and len(r["ms_repeats"]) == 2 and min(r["ms_repeats"]) > 0, r
    assert by["fp32"]["sparse_arch"] == "ZeroCopySparseArch" == by["fast_bounds_check"]["sparse_arch"]
    assert by["fast_torchrec_sparse_arch"]["sparse_arch"] == "SparseArch"
    assert by["fp32"]["compiled"] == []
    assert by["fast_bounds_check"]["compiled"] == ["model.dense_arch", "model.inter_arch", "model.over_arch", "loss"]
    assert json.loads((tmp_path / "throughput.json").read_text())["meta"]["alternate"] is True
    assert by["fast_bounds_check"]["last_loss"] == by["fast_torchrec_sparse_arch"]["last_loss"]


def test_throughput_probe_arguments_are_checked() -> None:
    """``--probe`` takes host:MS or gpu:MS; anything else stops at argument parsing, before any build."""
    from bench import throughput

    assert throughput.parse_args(["--probe", "host:0.5", "gpu:1"]).probe == ["host:0.5", "gpu:1"]
    for bad in ("host:x", "cpu:1", "gpu:0", "host"):
        with pytest.raises(SystemExit):
            throughput.parse_args(["--probe", bad])


def test_every_bench_variant_composes() -> None:
    """Every ``bench.throughput`` variant's overrides compose and validate on top of its base model (the balanced
    plan's file is read only at build time), and every ``HOOKS`` entry names a variant."""
    from bench import throughput

    for name, overrides in throughput.LEVERS.items():
        cfg = to_config(compose(throughput.BASE + ["sharding=table_wise"] + overrides + ["data.batch_size=8192"]))
        assert cfg.model.name == "dlrm_v2", name
    assert set(throughput.HOOKS) <= set(throughput.LEVERS)
    assert (REPO / throughput.BALANCED_PLAN).is_file()


# ------------------------------------------------------------------------------------------ all-reduce dtype


def _reduced_grads(info: Any, dtype: str, rank: int) -> Dict[str, Any]:
    """One step of a table_wise DMP on the gloo ranks: the DDP-reduced dense gradients (``backward``), then each
    rank's local ones from the same graph (``autograd.grad``, which leaves ``.grad`` and DDP's buckets alone)."""
    import torch.distributed as dist

    from dlrm import data as D
    from dlrm.sharding import shard

    cfg = to_config(compose(TINY + ["sharding=table_wise", f"perf.allreduce_dtype={dtype}"]))
    torch.manual_seed(0)
    model = build_model(cfg.model, dense_device=torch.device("cpu"))
    pooling = {f"t_{f}": 2.0 for f in FEATURE_NAMES}
    dmp, _ = shard(model, info, cfg.sharding, cfg.optimizer, BATCH, pooling, allreduce_dtype=dtype)
    g = torch.Generator().manual_seed(rank)
    n = BATCH
    ids = torch.stack([torch.randint(0, r, (n,), generator=g) for r in cfg.model.table_rows], 1)
    split = D.Split(torch.rand(n, 13, generator=g), ids, (torch.rand(n, generator=g) < 0.3).float(), "train")
    batch = D.to_batch(
        split, torch.arange(n), FEATURE_NAMES, D.MultiHot(cfg.model.table_rows, cfg.model.multi_hot_sizes)
    )
    names = [n for n, p in dmp.named_parameters() if "embedding_bags" not in n and p.requires_grad]
    params = [dict(dmp.named_parameters())[n] for n in names]
    loss, _ = dmp(batch)
    loss.backward(retain_graph=True)
    reduced = torch.cat([p.grad.reshape(-1) for p in params])
    local = torch.autograd.grad(loss, params)
    flat = torch.cat([x.reshape(-1) for x in local])
    both = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(both, flat)
    ddp = get_module(dmp)  # DMP's DDP wrapper
    hook = compat.ddp_comm_hook_name(ddp)
    return {"locals": both, "reduced": reduced, "hook": hook, "ddp_group": ddp.process_group}


def _allreduce_worker(rank: int, world: int, dtype: str) -> Dict[str, Any]:
    import torch.distributed as dist

    from dlrm.process_group import init_distributed

    info = init_distributed("cpu")
    out = _reduced_grads(info, dtype, rank)
    out["on_default_group"] = out.pop("ddp_group") is dist.group.WORLD
    return out


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_allreduce_dtype_sets_the_ddp_gradient_precision(dtype: str) -> None:
    """``perf.allreduce_dtype``: fp32 averages the ranks' dense gradients in fp32; fp16 gives exactly what
    PyTorch's ``fp16_compress_hook`` computes (each rank's gradient rounded to fp16 and halved, summed in fp16,
    copied back into the fp32 gradient), which differs from the fp32 average. (bf16 takes the same TorchRec
    path with ``bf16_compress_hook``, which PyTorch runs on NCCL only.)"""
    r0, r1 = run_gloo(2, _allreduce_worker, dtype, timeout=300)
    g0, g1 = r0["locals"]
    assert not torch.equal(g0, g1)  # the ranks saw different batches
    fp32_mean = (g0 + g1) / 2
    for r in (r0, r1):
        if dtype == "fp32":
            assert r["hook"] in (None, "", "builtin_allreduce"), r["hook"]
            torch.testing.assert_close(r["reduced"], fp32_mean, rtol=1e-6, atol=1e-9)
        else:
            assert "fp16_compress_hook" in str(r["hook"]), r["hook"]
            expected = (g0.half() / 2 + g1.half() / 2).float()
            assert torch.equal(r["reduced"], expected)
            assert not torch.equal(r["reduced"], fp32_mean)
        assert r["on_default_group"]


# ------------------------------------------------------------------------------------------- TBE bounds check


def _bounds_worker(rank: int, world: int, mode: str) -> str:
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dlrm.process_group import init_distributed
    from dlrm.sharding import fused_params_of, shard

    info = init_distributed("cpu")
    cfg = to_config(compose(TINY + ["sharding=table_wise", f"perf.tbe_bounds_check={mode}"]))
    model = build_model(cfg.model, dense_device=torch.device("cpu"))
    dmp, _ = shard(
        model,
        info,
        cfg.sharding,
        cfg.optimizer,
        4,
        {f"t_{f}": 1.0 for f in FEATURE_NAMES},
        fused_params=fused_params_of("fp32", cfg.perf.tbe_bounds_check),
    )
    values = torch.zeros(26 * 4, dtype=torch.long)
    values[0] = 10 * ROWS  # out of range for table t_cat_0
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURE_NAMES, values=values, lengths=torch.ones(26 * 4, dtype=torch.int32)
    )
    try:
        loss, _ = dmp(Batch(dense_features=torch.rand(4, 13), sparse_features=kjt, labels=torch.zeros(4)))
        return f"loss {float(loss):.4f}"
    except RuntimeError as e:
        return f"RuntimeError: {str(e).splitlines()[0]}"


def _bounds_modes(rank: int, world: int) -> List[str]:
    return [_bounds_worker(rank, world, mode) for mode in ("warning", "fatal")]


def test_tbe_bounds_check_on_an_out_of_range_id() -> None:
    """``perf.tbe_bounds_check``: FBGEMM's default ``warning`` looks the bad id up as row 0 and the step goes on;
    ``fatal`` fails the step. (``none``, which ``perf=fast`` uses, skips the check: only for in-range ids.)"""
    warning, fatal = run_gloo(1, _bounds_modes)[0]
    assert warning.startswith("loss ") and 0.0 < float(warning.split()[1]) < 5.0, warning
    assert fatal.startswith("RuntimeError: Expected idx < num_rows"), fatal


# ----------------------------------------------------------------------------------- switches that would do nothing
def test_lean_output_dist_that_finds_no_output_dist_is_refused() -> None:
    """``perf.lean_output_dist`` on several ranks with table_wise tables, where no TorchRec output dist is found to
    switch (a TorchRec that builds them differently), fails naming the key instead of silently running TorchRec's."""
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    from dlrm.config import PerfConfig
    from dlrm.perf import apply_perf

    class Wrapped(torch.nn.Module):  # a DMP stand-in: .module is the train model, no sharded module inside
        def __init__(self) -> None:
            super().__init__()
            self.module = build_model(to_config(compose(TINY)).model, dense_device=torch.device("cpu"))

    plan = ShardingPlan(
        {
            "model.sparse_arch.embedding_bag_collection": EmbeddingModuleShardingPlan(
                {"t_cat_0": ParameterSharding(sharding_type="table_wise", compute_kernel="fused", ranks=[0])}
            )
        }
    )
    with pytest.raises(RuntimeError) as e:
        apply_perf(Wrapped(), plan, PerfConfig(lean_output_dist=True), world_size=2)
    assert str(e.value).startswith(
        "perf.lean_output_dist: the plan has table_wise tables on 2 ranks, but no "
        "TorchRec output dist sending their pooled embeddings was found to switch"
    )
    with pytest.raises(RuntimeError, match="perf.allreduce_after_output_dist: the sharded model has no DDP module"):
        apply_perf(Wrapped(), plan, PerfConfig(lean_output_dist=True, allreduce_after_output_dist=True), 2)
    # a plan with nothing to switch (row_wise: a reduce-scatter) is no error: there is nothing to do
    rw = ShardingPlan(
        {
            "model.sparse_arch.embedding_bag_collection": EmbeddingModuleShardingPlan(
                {"t_cat_0": ParameterSharding(sharding_type="row_wise", compute_kernel="fused", ranks=[0, 1])}
            )
        }
    )
    assert apply_perf(Wrapped(), rw, PerfConfig(lean_output_dist=True), world_size=2).lean_output_dists == 0


def test_dedicated_input_dist_group_without_a_sharded_module_is_refused() -> None:
    from dlrm.comms import use_group_for_input_dist

    with pytest.raises(
        RuntimeError,
        match="pipeline.input_dist_group=dedicated: the model holds no TorchRec "
        "sharded module whose input dist could move",
    ):
        use_group_for_input_dist(torch.nn.Linear(1, 1), None)  # type: ignore[arg-type]
