"""Optimizer state under names that do not depend on the world size or plan, and the names of the earlier,
layout-dependent checkpoints they are read from."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

TABLE_MARKER = "embedding_bags."  # in the name of every table's weight (the rule dlrm.sharding.dense_optimizer uses)


def _model_key(key: str, names: Any) -> str:
    """``key`` without the prefix a ``CombinedOptimizer`` puts before a part's parameter names (``dense.``,
    ``dp_tables.``): the longest tail of ``key`` that is a model state-dict key, else ``key``."""
    parts = key.split(".")
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        if tail in names:
            return tail
    return key


def optimizer_state(model_sd: Dict[str, Any], optimizer: Any) -> Dict[str, Dict[str, Any]]:
    """The optimizer state as a checkpoint holds it, the same for every world size and plan:
    ``{parameter FQN: {state name: live tensor}}``.

    - Keys are the model's parameter FQNs (TorchRec ``KeyedOptimizer`` keys without the prefix that a
      ``CombinedOptimizer`` of named parts adds, which depends on whether the plan has ``data_parallel`` tables).
    - A table's Adagrad state is ``<table>.momentum1`` in the fused TBE's shape (``adagrad``: ``[rows, dim]``,
      ``rowwise_adagrad``: ``[rows]``), also for a ``data_parallel`` table, whose dense Adagrad ``sum`` it views
      (``[rows, dim]``, or ``[rows, 1]`` viewed as ``[rows]``): the values are the same sums of squared
      gradients, so a table moving between a fused sharding and ``data_parallel`` keeps its state.
    - A ``data_parallel`` table's Adagrad ``step`` is left out: TBE keeps none, and it equals the MLPs' ``step``
      (one optimizer steps both every step), which :func:`load_app_state` copies into it.

    Args:
        model_sd: ``model.state_dict()`` (its keys and shapes decide the names).
        optimizer: a TorchRec ``KeyedOptimizer`` (``state_dict()["state"]`` keyed by parameter name).
    """
    out: Dict[str, Dict[str, Any]] = {}
    for key, states in optimizer.state_dict()["state"].items():
        fqn = _model_key(key, model_sd)
        table = fqn.split(".")[-2] if TABLE_MARKER in fqn else None
        for sname, v in states.items():
            if table is not None and "." not in sname:  # the dense optimizer's state of a data_parallel table
                if sname == "step":
                    continue
                if sname == "sum":
                    sname = f"{table}.momentum1"
                    if fqn in model_sd and isinstance(v, torch.Tensor) and v.shape != model_sd[fqn].shape:
                        v = v.view(-1)  # torchrec RowWiseAdagrad's [rows, 1]: TBE's row-wise momentum is [rows]
            out.setdefault(fqn, {})[sname] = v
    return out


def dp_table_steps(model_sd: Dict[str, Any], optimizer: Any) -> Tuple[List[torch.Tensor], Optional[torch.Tensor]]:
    """The ``step`` tensors of the data_parallel tables' dense Adagrad, and one MLP parameter's ``step``."""
    tables, mlp = [], None
    for key, states in optimizer.state_dict()["state"].items():
        step = states.get("step")
        if isinstance(step, torch.Tensor):
            if TABLE_MARKER in _model_key(key, model_sd):
                tables.append(step)
            elif mlp is None:
                mlp = step
    return tables, mlp


def flatten_state(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """DCP's fully-qualified names: nested dict keys joined with ``.``."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_state(v, key + "."))
        else:
            out[key] = v
    return out


def earlier_names(fqn: str, sname: str) -> List[str]:
    """Where a checkpoint of the earlier layout holds optimizer entry ``fqn``/``sname``: the MLPs' and a
    data_parallel table's dense Adagrad state under ``CombinedOptimizer`` prefixes, a table's momentum as the
    dense Adagrad ``sum`` of a data_parallel table."""
    names = [f"optim.{p}.{fqn}.{sname}" for p in ("dense", "dp_tables")]
    if sname.endswith(".momentum1"):
        names += [f"optim.dp_tables.{fqn}.sum", f"optim.{fqn}.sum"]
    return names
