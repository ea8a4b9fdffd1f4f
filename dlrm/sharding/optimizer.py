"""The optimizers of a sharded model: the embedding optimizer fused into the TBE backward, and the optimizer of every
parameter DMP leaves to autograd (the MLPs and data_parallel tables)."""

from __future__ import annotations

from typing import List, Tuple

import torch
import torchrec.optim as trec_optim
from torchrec.distributed import DistributedModelParallel
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrm.config import OptimizerConfig


def fuse_embedding_optimizer(model: torch.nn.Module, opt: OptimizerConfig) -> None:
    """Attach the embedding optimizer to every table weight, to be fused into backward by DMP.

    ``adagrad`` maps to FBGEMM EXACT_ADAGRAD (element-wise, the MLPerf rule), ``rowwise_adagrad`` to
    EXACT_ROWWISE_ADAGRAD. eps comes from the config (MLPerf: 1e-8); the accumulator starts at 0. The planner
    reads the optimizer class off the weights to estimate optimizer-state memory.
    """
    cls = torch.optim.Adagrad if opt.sparse_type == "adagrad" else trec_optim.RowWiseAdagrad
    params = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    kwargs = {"lr": opt.embedding_lr, "eps": opt.eps}
    apply_optimizer_in_backward(cls, params, kwargs)


def dense_params(model: DistributedModelParallel) -> dict:
    """Parameters not updated in backward by a fused optimizer (the MLPs, and data_parallel tables)."""
    return dict(in_backward_optimizer_filter(model.named_parameters()))


def dense_optimizer(model: DistributedModelParallel, opt: OptimizerConfig) -> KeyedOptimizer:
    """The optimizer of every parameter not fused into backward.

    The MLPs get Adagrad(``optimizer.lr``). data_parallel tables, which DMP trains with all-reduced gradients
    rather than a fused TBE optimizer, get the embedding optimizer (``optimizer.sparse_type``,
    ``optimizer.sparse_lr``) that fused tables get, so every placement trains the same model.
    """
    params = dense_params(model)
    tables = {n: p for n, p in params.items() if "embedding_bags" in n}
    mlp = {n: p for n, p in params.items() if n not in tables}
    table_cls = torch.optim.Adagrad if opt.sparse_type == "adagrad" else trec_optim.RowWiseAdagrad
    parts: List[Tuple[str, KeyedOptimizer]] = []
    if mlp:
        parts.append(("dense", KeyedOptimizerWrapper(mlp, lambda ps: torch.optim.Adagrad(ps, lr=opt.lr, eps=opt.eps))))
    if tables:
        parts.append(
            ("dp_tables", KeyedOptimizerWrapper(tables, lambda ps: table_cls(ps, lr=opt.embedding_lr, eps=opt.eps)))
        )
    return parts[0][1] if len(parts) == 1 else CombinedOptimizer(parts)
