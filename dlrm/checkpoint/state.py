"""The state DCP saves and loads in place (:func:`app_state`) and the load that checks every entry
(:func:`load_app_state`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dlrm.checkpoint.layout import META
from dlrm.checkpoint.reader import CheckpointError, load_dcp, read_checkpoint_meta, read_dcp_metadata
from dlrm.checkpoint.resume_checks import model_mismatch
from dlrm.checkpoint.state_names import TABLE_MARKER, dp_table_steps, earlier_names, flatten_state, optimizer_state


def app_state(model: torch.nn.Module, optimizer: Any) -> Dict[str, Any]:
    """What DCP saves and loads in place: ``{"model": model.state_dict(), "optim": optimizer_state(...)}``.

    The tensors are the live ones (``ShardedTensor`` views of the TBE weights and momentum for sharded tables),
    so a DCP load writes straight into the model and optimizer.
    """
    sd = model.state_dict()
    return {"model": sd, "optim": optimizer_state(sd, optimizer)}


def _global_shape(v: Any) -> Optional[Tuple[int, ...]]:
    return tuple(v.size()) if isinstance(v, torch.Tensor) else None


@dataclass
class LoadReport:
    """What a load restored: every entry of the model and the optimizers (anything else is an error).
    ``translated``: entries read from the names of checkpoints written before the layout was world-size
    independent."""

    path: str
    restored: List[str] = field(default_factory=list)
    translated: List[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the log: how many entries were restored (and how many were translated)."""
        extra = f" ({len(self.translated)} from the earlier layout's names)" if self.translated else ""
        return f"all {len(self.restored)} model and optimizer entries restored{extra}"


def load_app_state(
    path: str,
    model: torch.nn.Module,
    optimizer: Any,
    process_group: Optional[dist.ProcessGroup] = None,
    model_config: Any = None,
) -> LoadReport:
    """Load model and optimizer state from a DCP checkpoint into the live (possibly differently sharded) model.

    Every entry of the checkpoint is consumed and every entry of the model and optimizer restored, with equal
    global shapes (:func:`optimizer_state` names the optimizer's entries the same for every world size and plan;
    checkpoints of the earlier, layout-dependent names are translated). The only saved entries not read are a
    data_parallel table's dense Adagrad ``step`` (the MLPs' ``step`` is copied into it, which is its value).

    Args:
        model_config: this run's ``ModelConfig`` (a dataclass or dict), compared with the checkpoint's
            ``meta.json`` ``config.model`` to name the config key behind a model mismatch.

    Raises:
        CheckpointError: the model's entries differ from the checkpoint's (names the first and the config key
            behind it); an optimizer entry is missing or of another shape (e.g. row-wise Adagrad momentum
            ``[rows]`` of a row_wise table into a column_wise one, ``[rows x column shards]``; names the entry
            and the table); the checkpoint's metadata or data cannot be read.
    """
    md = read_dcp_metadata(path)
    shape = {k: tuple(m.size) if isinstance(m, TensorStorageMetadata) else None for k, m in md.items()}
    target = app_state(model, optimizer)
    _check_model(path, shape, target["model"], model_config)
    match = _match_optimizer(target["optim"], shape)
    report = LoadReport(path)
    ranks = _agree_on_optimizer(path, shape, match, report, process_group)
    state = {"model": target["model"], "optim": match.optim}
    load_dcp(state, path, "give another checkpoint.resume (auto takes the newest intact one)", process_group)
    _fill_reshaped(match.reshaped)
    steps, mlp_step = dp_table_steps(target["model"], optimizer)
    if mlp_step is not None:
        for s in steps:
            s.copy_(mlp_step)
    report.restored = sorted(flatten_state(target, ""))
    if ranks > 1:
        names: List[Any] = [None] * ranks
        dist.all_gather_object(names, report.restored, group=process_group)
        report.restored = sorted({k for restored in names for k in restored})
    return report


def _check_model(path: str, shape: Dict[str, Any], model_sd: Dict[str, Any], model_config: Any) -> None:
    """Raise a :class:`CheckpointError` naming the first difference between the checkpoint's model entries
    (``shape``: DCP name -> global shape) and ``model_sd``'s, and the config key behind it."""
    was = None
    if os.path.isfile(os.path.join(path, META)):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            was = read_checkpoint_meta(path)["config"].get("model")
    now = dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config) else model_config
    live_model = {k: _global_shape(v) for k, v in flatten_state(model_sd).items()}
    saved_model = {k[len("model.") :]: s for k, s in shape.items() if k.startswith("model.")}
    why = model_mismatch(saved_model, live_model, was, now)
    if why is not None:
        raise CheckpointError(f"checkpoint {path}: model {why}")


@dataclass
class _OptimizerMatch:
    """Where each of this rank's optimizer entries is read from.

    ``optim``: saved name (without ``optim.``) -> the live tensor it loads into; ``reshaped``: (whole tensor read,
    ``ShardedTensor`` it goes into); ``translated``: entries read from the earlier layout's names; ``problem``:
    why the first entry that cannot be read cannot (the rest are not matched), else None.
    """

    optim: Dict[str, Any] = field(default_factory=dict)
    reshaped: List[Tuple[torch.Tensor, Any]] = field(default_factory=list)
    translated: List[str] = field(default_factory=list)
    problem: Optional[str] = None


def _match_optimizer(target_optim: Dict[str, Dict[str, Any]], shape: Dict[str, Any]) -> _OptimizerMatch:
    """Match every live optimizer entry (``target_optim``, :func:`optimizer_state`) to a saved one of ``shape``
    (DCP name -> global shape), under its name or one of the earlier layout's (:func:`earlier_names`)."""
    match = _OptimizerMatch()
    for fqn, sname, v in ((f, n, t) for f, states in target_optim.items() for n, t in states.items()):
        key = f"optim.{fqn}.{sname}"
        src = key if key in shape else next((n for n in earlier_names(fqn, sname) if n in shape), None)
        live = _global_shape(v)
        if src is None:
            match.problem = (
                f"optimizer entry {key!r} is not in it (its optimizer was another one); resume with the "
                "optimizer.* settings of its meta.json, or start fresh in a new checkpoint.dir"
            )
            break
        if shape[src] != live:
            # earlier layout: a data_parallel table's torchrec RowWiseAdagrad `sum` [rows, 1] for TBE's [rows]
            if isinstance(v, torch.Tensor) and math.prod(live or ()) == math.prod(shape[src] or ()):
                if type(v) is torch.Tensor:  # plain: a view loads in place
                    v = v.view(shape[src])
                else:  # sharded: read whole, then copied into this rank's shards
                    whole = torch.empty(shape[src], dtype=v.dtype)
                    match.reshaped.append((whole, v))
                    v = whole
            else:
                table = fqn.split(".")[-2] if TABLE_MARKER in fqn else fqn
                match.problem = (
                    f"optimizer entry {key!r} has shape {shape[src]} there and {live} here: {table}'s optimizer "
                    "state does not carry over to this plan (row-wise Adagrad keeps one value per row of each "
                    "column shard); resume with the sharding plan it was saved with (its plan.json), or one that "
                    f"gives {table} a sharding type with its number of column shards"
                )
                break
        if src != key:
            match.translated.append(key)
        match.optim[src[len("optim.") :]] = v
    return match


def _agree_on_optimizer(
    path: str,
    shape: Dict[str, Any],
    match: _OptimizerMatch,
    report: LoadReport,
    process_group: Optional[dist.ProcessGroup],
) -> int:
    """Judge every rank's :class:`_OptimizerMatch` together (a rank holds optimizer state only for the tables it
    has shards of: the union decides), record the translated entries in ``report`` and return the number of
    ranks (collective on ``process_group`` when it has more than one).

    Raises:
        CheckpointError: a rank's ``problem``, or a saved optimizer entry that no rank reads.
    """
    mine = (match.problem, sorted(match.optim), match.translated)
    parts: List[Any] = [mine]
    if dist.is_initialized() and dist.get_world_size(process_group) > 1:
        parts = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(parts, mine, group=process_group)
    problem = next((p for p, _, _ in parts if p is not None), None)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path}: {problem}")
    read = {k for _, names, _ in parts for k in names}
    report.translated = sorted({k for _, _, translated in parts for k in translated})
    left = sorted(
        k
        for k in shape
        if k.startswith("optim.")
        and k[len("optim.") :] not in read
        and not (k.endswith(".step") and TABLE_MARKER in k)  # a data_parallel table's step: the MLPs' (load_app_state)
    )
    if left:
        raise CheckpointError(
            f"checkpoint {path}: its optimizer entry {left[0]!r} has no place in this run's optimizer (it was "
            "written with other optimizer.* settings); resume with the settings of its meta.json, or start "
            "fresh in a new checkpoint.dir"
        )
    return len(parts)


def _fill_reshaped(reshaped: List[Tuple[torch.Tensor, Any]]) -> None:
    """Copy each whole tensor read into this rank's shards of the ``ShardedTensor`` it belongs to."""
    for whole, sharded in reshaped:
        flat = whole.reshape(tuple(sharded.size()))
        for shard in sharded.local_shards():
            md = shard.metadata
            shard.tensor.copy_(flat[tuple(slice(o, o + n) for o, n in zip(md.shard_offsets, md.shard_sizes))])
