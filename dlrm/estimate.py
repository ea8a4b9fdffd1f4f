"""An estimate of an MLPerf Training DLRM-v2 run on N H200s: one epoch and the time to AUC 0.80275.

``python -m dlrm.plan experiment=mlperf_dlrmv2 ... world_size=8 device=cuda --estimate`` prints it after the plan.
It is arithmetic on measured figures, not a measurement:

- the step's compute: this trainer's ``perf=fast`` step on one H200 at the per-GPU batch (:data:`STEP_MS`,
  ``bench.throughput`` on 2026-12-02, docs/performance.md), linearly interpolated between the
  measured batch sizes, or ``--step-ms`` (your own figure);
- the step's collectives: ``dlrm.traffic``'s time for the plan at the link rates (peak rates, one after another);
  the step lies between compute alone (all of it overlapped) and compute plus collectives (none of it);
- evaluation: 20 per epoch of 89,137,319 rows at :data:`EVAL_SAMPLES_PER_S_PER_GPU` per GPU;
- the time to the target: :data:`EPOCHS_TO_TARGET` epochs, what MLPerf's reference convergence points need at
  global batch 55296-65536.

MLPerf Training facts (training rules, the reference's README): 4,195,197,692 training samples (days 0-22),
89,137,319 evaluation samples, 20 evaluations per epoch, target AUC 0.80275.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

TRAIN_SAMPLES = 4_195_197_692
EVAL_SAMPLES = 89_137_319
EVALS_PER_EPOCH = 20
EPOCHS_TO_TARGET = 0.75
# 1x H200, MLPerf DLRM-v2 with tables capped at 4 M rows, table_wise, perf=fast, batches on the GPU: ms per step
# by (optimizer.sparse_type, pipeline=graphed) and per-GPU batch (docs/performance.md, 2026-12-02, 77827a9)
STEP_MS: Dict[Tuple[str, bool], Dict[int, float]] = {
    ("adagrad", False): {4096: 6.407, 8192: 7.365, 32768: 12.580, 65536: 23.132},
    ("adagrad", True): {4096: 2.197, 8192: 3.598, 32768: 12.110, 65536: 22.619},
    ("rowwise_adagrad", False): {4096: 6.831, 8192: 7.925, 32768: 12.085, 65536: 22.362},
    ("rowwise_adagrad", True): {4096: 2.161, 8192: 3.517, 32768: 11.616, 65536: 21.936},
}
EVAL_SAMPLES_PER_S_PER_GPU = 5.2e6  # train.py's evaluation at batch 32768 on one H200 (6ba4974)
PUBLISHED = "NVIDIA HugeCTR, 8x H200, MLPerf Training v4.0: 3.47 min to the target, 15.1 M samples/s"


@dataclass
class Estimate:
    """Times in seconds; ``*_low`` with the collectives overlapped, ``*_high`` with none of them."""

    world_size: int
    per_gpu_batch: int
    compute_ms: float
    comm_ms: float
    steps_per_epoch: int
    epoch_low: float
    epoch_high: float
    eval_per_epoch: float
    target_low: float
    target_high: float


def step_ms(sparse_type: str, graphed: bool, per_gpu_batch: int) -> float:
    """The measured one-GPU step of :data:`STEP_MS`, linearly interpolated in the batch.

    Raises:
        ValueError: no figure for that optimizer, or a batch outside the measured range.
    """
    points = STEP_MS.get((sparse_type, graphed))
    if points is None:
        raise ValueError(f"no measured step for optimizer.sparse_type={sparse_type}; give --step-ms")
    xs = sorted(points)
    if not xs[0] <= per_gpu_batch <= xs[-1]:
        raise ValueError(f"the per-GPU batch {per_gpu_batch} is outside the measured {xs[0]}-{xs[-1]}; give --step-ms")
    for a, b in zip(xs, xs[1:]):
        if a <= per_gpu_batch <= b:
            f = (per_gpu_batch - a) / (b - a)
            return points[a] + f * (points[b] - points[a])
    return points[xs[0]]


def estimate(global_batch: int, world_size: int, compute_ms: float, comm_ms: float) -> Estimate:
    """The epoch and time-to-target estimate for ``world_size`` GPUs at ``global_batch``, from the per-step
    compute and collective times in ms (module docstring)."""
    steps = -(-TRAIN_SAMPLES // global_batch)  # the trainer's rule too: a last partial batch is one more step
    eval_epoch = EVALS_PER_EPOCH * EVAL_SAMPLES / (world_size * EVAL_SAMPLES_PER_S_PER_GPU)
    lo, hi = steps * compute_ms / 1e3, steps * (compute_ms + comm_ms) / 1e3
    return Estimate(
        world_size=world_size,
        per_gpu_batch=global_batch // world_size,
        compute_ms=compute_ms,
        comm_ms=comm_ms,
        steps_per_epoch=steps,
        epoch_low=lo + eval_epoch,
        epoch_high=hi + eval_epoch,
        eval_per_epoch=eval_epoch,
        target_low=EPOCHS_TO_TARGET * (lo + eval_epoch),
        target_high=EPOCHS_TO_TARGET * (hi + eval_epoch),
    )


def format_estimate(e: Estimate, source: str, published: Optional[str] = PUBLISHED) -> str:
    """The estimate as text, labelled as one, with ``source`` naming where the step's compute came from."""
    rate_lo = e.per_gpu_batch * e.world_size / (e.compute_ms + e.comm_ms) * 1e3
    rate_hi = e.per_gpu_batch * e.world_size / e.compute_ms * 1e3
    lines = [
        f"ESTIMATE (arithmetic on measured figures, not a measurement) for {e.world_size} x H200, "
        f"{e.per_gpu_batch} samples per GPU per step:",
        f"  step: {e.compute_ms:.2f} ms compute ({source}) + up to {e.comm_ms:.2f} ms of collectives = "
        f"{e.compute_ms:.2f}-{e.compute_ms + e.comm_ms:.2f} ms; {rate_lo / 1e6:.1f}-{rate_hi / 1e6:.1f} M "
        "samples/s",
        f"  one epoch ({TRAIN_SAMPLES:,} samples, {e.steps_per_epoch:,} steps, {EVALS_PER_EPOCH} evaluations of "
        f"{EVAL_SAMPLES:,} rows = {e.eval_per_epoch:.0f} s): {e.epoch_low / 60:.1f}-{e.epoch_high / 60:.1f} min",
        f"  to AUC 0.80275 (about {EPOCHS_TO_TARGET} epoch): {e.target_low / 60:.1f}-{e.target_high / 60:.1f} min",
    ]
    if published:
        lines.append(f"  published, for comparison: {published}")
    return "\n".join(lines)
