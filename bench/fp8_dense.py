"""FP8 matrix products for the dense step (torchao float8 training) against the bf16 step of ``perf=fast`` (issue 9).

    # H200 (needs CUDA sm89+ and torchao; torchao 0.17.0 is the release built for torch 2.11)
    pip install torchao==0.17.0
    python bench/fp8_dense.py --batch-size 32768 --recipes bf16 tensorwise rowwise rowwise_with_gw_hp
    # CPU smoke test (the bf16 path only, tiny sizes; numbers meaningless), with the venv of `make`
    .venv/bin/python bench/fp8_dense.py --smoke

What is timed: the trainer's dense step (``DLRMTrainAutocast.dense_step`` of the MLPerf DLRM-v2 model: dense arch,
DCN interaction, over arch and BCE loss, bf16 autocast, compiled as one graph by ``dlrm.model.compile_dense``), its
backward, and the dense Adagrad step, on fixed random inputs (dense features ``[B, 13]``, pooled embeddings
``[B, 26, 128]`` bf16 with ``requires_grad``, labels). No TorchRec lookup, no DDP, no collectives: this isolates the
matrix products the FP8 lever would change (4.6 ms of the 12.9 ms 1-GPU step at batch 32768; docs/benchmarks.md).
So there is no stock-TorchRec row: the baseline is the ``bf16`` recipe (today's ``perf=fast`` numerics), timed in
the same process, first and last. Without DDP the step compiles unsplit, where the trainer's is split at DDP's
gradient buckets (``perf.compile_ddp_split``).

Recipes (torchao ``Float8LinearConfig.from_recipe_name``): ``tensorwise`` (one scale per tensor, cuBLAS),
``rowwise`` (a scale per row, CUTLASS), ``rowwise_with_gw_hp`` (rowwise, weight gradients in bf16). Every
``nn.Linear`` whose in and out features are multiples of 16 is swapped for torchao's ``Float8Linear``
(``convert_to_float8_training``); the DCN's low-rank products (TorchRec's ``LowRankCrossNet`` calls ``F.linear``
on parameter lists, which the swap does not reach) go through torchao's float8 matmul autograd function, with the
same config. That function is not a public torchao API; this benchmark is the only user, and the trainer has no
FP8 mode (measured slower: docs/benchmarks.md, sixth session).

Output: one line per recipe (ms per step: median, min, max of ``--repeats`` repeats of ``--steps`` steps after
``--warmup``), and ``fp8_dense.json`` under ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlrm.config import ModelConfig, PerfConfig  # noqa: E402
from dlrm.model import DENSE_MODULES, build_model, compile_dense  # noqa: E402

RECIPES = ("bf16", "tensorwise", "rowwise", "rowwise_with_gw_hp")


def _float8_crossnet_forward(cfg: Any, linear_mm_config: Any) -> Any:
    """A ``LowRankCrossNet.forward`` whose two products per layer run in float8 (``x0 * (W(V x) + b) + x``)."""
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

    def forward(self: torch.nn.Module, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x0.dtype
        for v, w, b in zip(self.V_kernels, self.W_kernels, self.bias):
            xv = matmul_with_hp_or_float8_args.apply(x.to(dtype), v.t(), linear_mm_config, cfg)
            xw = matmul_with_hp_or_float8_args.apply(xv.to(dtype), w.t(), linear_mm_config, cfg)
            x = x0 * (xw + b) + x
        return x

    return forward


def to_float8(train_model: torch.nn.Module, recipe: str) -> int:
    """Swap the dense side of ``train_model`` (a :class:`dlrm.model.DLRMTrainAutocast`) to float8 ``recipe``;
    returns how many matrix products per forward now run in float8.

    Raises:
        ImportError: torchao is not installed (``pip install torchao``).
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    cfg = Float8LinearConfig.from_recipe_name(recipe)
    n = 0

    def keep(m: torch.nn.Module, fqn: str) -> bool:
        nonlocal n
        ok = isinstance(m, torch.nn.Linear) and m.in_features % 16 == 0 and m.out_features % 16 == 0
        n += ok
        return ok

    net = train_model.model
    convert_to_float8_training(net.dense_arch, module_filter_fn=keep, config=cfg)
    convert_to_float8_training(net.over_arch, module_filter_fn=keep, config=cfg)
    crossnet = getattr(net.inter_arch, "crossnet", None)
    if crossnet is not None and hasattr(crossnet, "V_kernels"):
        device = crossnet.V_kernels[0].device
        mm_config = Float8Linear.from_float(
            torch.nn.Linear(16, 16, bias=False, device=device), config=cfg
        ).linear_mm_config
        crossnet.forward = types.MethodType(_float8_crossnet_forward(cfg, mm_config), crossnet)
        n += 2 * len(crossnet.V_kernels)
    return n


def time_recipe(
    recipe: str,
    model_cfg: ModelConfig,
    batch: int,
    device: torch.device,
    steps: int,
    warmup: int,
    repeats: int,
    seed: int = 0,
    compile: bool = True,
) -> Dict[str, Any]:
    """Build, compile (``compile``: as ``perf.compile``) and time one recipe; returns ``{"recipe", "ms_repeats",
    "ms_median", "fp8_products", "first_loss"}`` (``first_loss``: the first step's float loss, before any
    update; the same model and inputs for a given ``seed``)."""
    torch.manual_seed(seed)
    perf = PerfConfig(autocast="bf16", embedding_output_dtype="bf16", compile=True)
    model = build_model(model_cfg, dense_device=device, perf=perf)
    for name in DENSE_MODULES:  # DMP moves what DLRM_DCN builds on the CPU (the DCN kernels) in the trainer
        getattr(model.model, name).to(device)
    n8 = 0 if recipe == "bf16" else to_float8(model, recipe)
    if compile:
        compile_dense(model)
    params = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    opt = torch.optim.Adagrad(params, lr=0.005)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    dense = torch.randn(batch, 13, generator=g).to(device)
    emb = (
        (torch.randn(batch, len(model_cfg.table_rows), model_cfg.embedding_dim, generator=g) * 0.05)
        .to(device=device, dtype=torch.bfloat16)
        .requires_grad_(True)
    )
    labels = (torch.rand(batch, generator=g) < 0.25).to(device=device, dtype=torch.int64)
    step = model.compiled_step or model.dense_step
    first: Optional[float] = None

    def one() -> None:
        nonlocal first
        loss = step(dense, emb, labels, None)[0]
        if first is None:
            first = float(loss.detach())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        emb.grad = None

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        one()
    sync()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                one()
            end.record()
            sync()
            times.append(start.elapsed_time(end) / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                one()
            times.append((time.perf_counter() - t0) * 1e3 / steps)
    return {
        "recipe": recipe,
        "ms_repeats": times,
        "ms_median": statistics.median(times),
        "fp8_products": n8,
        "first_loss": first,
    }


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32768)
    p.add_argument("--recipes", nargs="+", default=None, choices=RECIPES, help="default: all (--smoke: bf16)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model and batch, bf16 only")
    p.add_argument("--out", default=None, help="folder for fp8_dense.json")
    args = p.parse_args(argv)
    from dlrm.config import compose, to_config

    if args.smoke:
        cfg = to_config(compose(["model=dlrm_v2_small"]))
        device, batch, recipes, steps, warmup, repeats = torch.device("cpu"), 64, args.recipes or ["bf16"], 2, 1, 2
    else:
        cfg = to_config(compose(["model=dlrm_v2", "model.row_cap=1000"]))  # tables unused: the step starts pooled
        device, batch, recipes = torch.device("cuda"), args.batch_size, args.recipes or list(RECIPES)
        steps, warmup, repeats = args.steps, args.warmup, args.repeats
    if device.type != "cuda" and any(r != "bf16" for r in recipes):
        raise SystemExit("float8 recipes need CUDA (torch._scaled_mm on sm89+); on CPU use --recipes bf16")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    order = recipes + (["bf16"] if recipes[0] == "bf16" and len(recipes) > 1 else [])  # the baseline last too
    rows = []
    for r in order:
        row = time_recipe(r, cfg.model, batch, device, steps, warmup, repeats)
        rows.append(row)
        print(
            f"{r:20s} b{batch}: {row['ms_median']:.3f} ms/step ({min(row['ms_repeats']):.3f}-"
            f"{max(row['ms_repeats']):.3f}), {row['fp8_products']} float8 products, first loss "
            f"{row['first_loss']:.6f}",
            flush=True,
        )
        torch._dynamo.reset()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fp8_dense.json"), "w") as f:
            json.dump({"batch": batch, "device": str(device), "results": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
