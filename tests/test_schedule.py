"""The MLPerf-shaped lr schedule: warmup, constant, polynomial decay to a floor that it never leaves."""

from __future__ import annotations

import pytest
import torch

from dlrm.config import OptimizerConfig
from dlrm.schedule import load_scheduler_state, lr_at, make_scheduler


def _cfg(**kw) -> OptimizerConfig:
    return OptimizerConfig(lr=1.0, **kw)


def test_decay_reaches_the_floor_and_stays_there() -> None:
    cfg = _cfg(warmup_steps=0, decay_start_step=10, decay_steps=10)
    rates = [lr_at(s, 1.0, cfg) for s in range(40)]
    assert rates[:10] == [1.0] * 10
    assert rates[10] == 1.0 and rates[15] == pytest.approx(0.25) and rates[19] == pytest.approx(0.01)
    assert all(a > b for a, b in zip(rates[10:20], rates[11:21]))  # strictly decaying
    assert rates[20:] == [cfg.end_lr] * 20  # from step 20 on: the floor, no climbing back


def test_warmup_four_steps_reaches_base_without_plateau() -> None:
    cfg = _cfg(warmup_steps=4)
    assert [lr_at(s, 1.0, cfg) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("warmup", [0, 1])
def test_warmup_zero_and_one(warmup: int) -> None:
    cfg = _cfg(warmup_steps=warmup, decay_start_step=2, decay_steps=2)
    assert [lr_at(s, 1.0, cfg) for s in range(5)] == [1.0, 1.0, 1.0, 0.25, cfg.end_lr]


def test_scheduler_drives_every_param_group_with_its_own_base() -> None:
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adagrad([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 0.5}])
    sched = make_scheduler(opt, OptimizerConfig(lr=1.0, warmup_steps=2, decay_start_step=2, decay_steps=2))
    seen = []
    for _ in range(5):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert seen == [[0.5, 0.25], [1.0, 0.5], [1.0, 0.5], [0.25, 0.125], [1e-7, 1e-7]]


def test_decay_inside_warmup_is_refused() -> None:
    from dlrm.errors import ConfigError

    with pytest.raises(ConfigError, match="optimizer.decay_start_step"):
        OptimizerConfig(warmup_steps=10, decay_start_step=5, decay_steps=5)


def test_a_schedule_saved_with_other_param_groups_is_replayed_to_its_step() -> None:
    """A checkpoint of a plan with two groups (tables, MLPs) resumed under one with three (data_parallel tables in
    the dense optimizer): each group gets the rate of the saved step for its own base; same groups: as saved."""
    cfg = OptimizerConfig(lr=0.5, warmup_steps=8)
    p = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    saved_opt = torch.optim.SGD([{"params": [p[0]], "lr": 0.5}, {"params": [p[1]], "lr": 0.1}])
    saved = make_scheduler(saved_opt, cfg)
    for _ in range(5):
        saved_opt.step()
        saved.step()
    state = saved.state_dict()
    groups = [{"params": [p[0]], "lr": 0.5}, {"params": [p[1]], "lr": 0.1}, {"params": [p[2]], "lr": 0.5}]
    opt = torch.optim.SGD(groups)
    sched = make_scheduler(opt, cfg)
    load_scheduler_state(sched, state)
    want = [lr_at(5, b, cfg) for b in (0.5, 0.1, 0.5)]
    assert sched.last_epoch == 5 and sched.get_last_lr() == want == [g["lr"] for g in opt.param_groups]
    same = make_scheduler(torch.optim.SGD([{"params": [p[0]], "lr": 0.5}, {"params": [p[1]], "lr": 0.1}]), cfg)
    load_scheduler_state(same, state)
    assert same.state_dict() == state
