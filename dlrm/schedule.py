"""Learning-rate schedule of the MLPerf DLRM-v2 reference: linear warmup, constant, polynomial decay to a floor.

:func:`lr_at` is the rule; :func:`make_scheduler` applies it to every param group of an optimizer (dense Adagrad
and TorchRec's fused embedding optimizer alike: TorchRec copies ``param_groups[0]["lr"]`` into the TBE at
``zero_grad()``, which the pipeline calls before each backward; ``pipeline=semi_sync`` calls it on the dense
optimizer only, so the config refuses a schedule there) with PyTorch's ``LambdaLR``.

Fixed against the published MLPerf reference versions (``torchrec_dlrm``): the rate never climbs again
after the decay window, warmup reaches the base rate on its last step with no plateau below it, and warmup 0
or 1 are valid.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict

import torch
from torch.optim.lr_scheduler import LambdaLR

from dlrm.config import OptimizerConfig


def lr_at(step: int, base: float, cfg: OptimizerConfig) -> float:
    """The rate for optimizer step ``step`` (0-based).

    - ``step < warmup_steps``: ``base * (step + 1) / warmup_steps``;
    - ``decay_start_step <= step < decay_start_step + decay_steps``:
      ``max(end_lr, base * ((decay_start_step + decay_steps - step) / decay_steps) ** decay_power)``;
    - from ``decay_start_step + decay_steps`` on (when ``decay_steps > 0``): ``end_lr``;
    - otherwise ``base``.
    """
    if step < cfg.warmup_steps:
        return base * (step + 1) / cfg.warmup_steps
    if cfg.decay_steps > 0 and step >= cfg.decay_start_step:
        end = cfg.decay_start_step + cfg.decay_steps
        if step >= end:
            return cfg.end_lr
        return max(cfg.end_lr, base * ((end - step) / cfg.decay_steps) ** cfg.decay_power)
    return base


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig) -> LambdaLR:
    """A ``LambdaLR`` whose factor for group ``g`` at step ``s`` is ``lr_at(s, base_g) / base_g``.

    Call ``scheduler.step()`` after each optimizer step; the rate of step ``s`` is then in every group's
    ``param_groups[g]["lr"]`` before step ``s`` runs.
    """
    bases = [g["lr"] for g in optimizer.param_groups]
    return LambdaLR(optimizer, [lambda s, b=b: lr_at(s, b, cfg) / b for b in bases])


def load_scheduler_state(scheduler: LambdaLR, state: Dict[str, Any]) -> None:
    """Restore a :func:`make_scheduler` schedule from ``state`` (its ``state_dict()`` as a checkpoint saved it).

    With as many param groups as when it was saved this is ``load_state_dict``. Another plan may group the
    parameters differently (data_parallel tables join the dense optimizer's groups on several ranks), which
    ``LambdaLR.load_state_dict`` cannot take; the schedule is a function of the step alone, so it is then replayed to
    the saved step: every group gets ``lr_at(last_epoch, its base)``.
    """
    if len(state.get("base_lrs") or ()) == len(scheduler.base_lrs):
        scheduler.load_state_dict(state)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # LambdaLR.step() before any optimizer.step()
        scheduler.last_epoch = int(state["last_epoch"]) - 1
        scheduler.step()
