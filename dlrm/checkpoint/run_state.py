"""The run's progress and facts a checkpoint records besides the model, optimizers and lr schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dlrm.config import Config
from dlrm.metrics import MetricWindow


@dataclass
class TrainState:
    """The run's progress that a checkpoint holds besides the model, the optimizers and the lr schedule.

    ``step`` is also the data position: every loader resumes at the batch of this step (the batch order is a
    function of the step, the global batch and ``seed``).
    """

    step: int = 0  # optimizer steps done
    samples_seen: int = 0  # training samples over all ranks
    window: Optional[MetricWindow] = None  # the training-metric window not yet logged
    target_auc_reached: Optional[float] = None  # the validation AUC that met eval.target_auc and ended the run


@dataclass
class RunFacts:
    """What ``meta.json`` records about the run; a resume checks the global batch, the steps per epoch and the data
    settings against it (:func:`check_resume`)."""

    global_batch: int
    steps_per_epoch: int
    total_steps: int  # the last step of this run (a periodic save also falls on it)
    plan: Any  # the dlrm.sharding.PlanInfo (saved as plan.json beside the checkpoint)
    config: Config
