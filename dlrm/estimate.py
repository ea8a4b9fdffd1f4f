"""An estimate of an MLPerf Training DLRM-v2 run on N H200s: one epoch and the time to AUC 0.80275.

``python -m dlrm.plan experiment=mlperf_dlrmv2 ... world_size=8 device=cuda --estimate`` prints it after the plan.
It is arithmetic on measured figures, not a measurement:

- the step's compute: this trainer's ``perf=fast`` step on one H200 at the per-GPU batch (:data:`STEP_MS`,
  ``bench.throughput``, docs/performance.md), linearly interpolated between the measured batch sizes, or
  ``--step-ms`` (your own figure). The kind of step (:func:`step_kind`): eager; ``pipeline=graphed`` on one rank;
  or, on several ranks, the several-rank graph (ids all-to-all with fixed splits and the dense all-reduce inside
  it), measured forced on one H200, plus the TBE lookups of row_wise and table_row_wise tables' whole bags
  (:func:`whole_bag_tbe_ms`).
  With real Criteo data (``data=criteo_binary`` or ``criteo_tsv``) the figure
  measured on skewed ids (``--ids criteo``, :data:`SKEWED_STEP_MS`) where there is one, else the uniform ids' (the
  TBE's worst case);
- the step's collectives: ``dlrm.traffic``'s time for the plan at the link rates (peak rates, one after another);
  the step lies between compute alone (all of it overlapped) and compute plus collectives (none of it);
- evaluation: 20 per epoch of 89,137,319 rows at :data:`EVAL_SAMPLES_PER_S_PER_GPU` per GPU, the kind of step's
  (the eager forward, or ``pipeline=graphed``'s captured one);
- the time to the target: the epochs MLPerf's reference convergence points (RCPs) need at the run's global batch
  (:func:`epochs_to_target`).

MLPerf Training facts: 4,195,197,692 training samples (days 0-22), 20 evaluations per epoch (the reference's
README); 89,137,319 evaluation samples and the target AUC 0.80275 (the compliance checker's
``closed_dlrm_dcnv2.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

TRAIN_SAMPLES = 4_195_197_692
EVAL_SAMPLES = 89_137_319
EVALS_PER_EPOCH = 20
# Olympic mean (the lowest and highest dropped, as rcp_checker.py scores them) of the epochs to AUC 0.80275 of
# each global batch's reference runs: mlperf-logging 4.1.68, rcp_checker/training_5.1.0/rcps_dlrm_dcnv2.json
# (training_6.0.0 holds the same)
RCP_EPOCHS: Dict[int, float] = {
    32768: 0.7071,
    55296: 0.7615,
    65536: 0.7911,
    102400: 0.8906,
    135168: 0.9279,
    160000: 0.9583,
}
EAGER, GRAPHED, GRAPHED_RANKS = "eager", "graphed", "graphed_ranks"  # the kinds of step (step_kind)
STEP_KINDS = {
    EAGER: "perf=fast",
    GRAPHED: "perf=fast pipeline=graphed",
    GRAPHED_RANKS: "perf=fast pipeline=graphed, several-rank graph",
}
# 1x H200, MLPerf DLRM-v2 with tables capped at 4 M rows, table_wise, perf=fast, batches on the GPU, uniform ids:
# ms per step by (optimizer.sparse_type, kind of step) and per-GPU batch (docs/performance.md): eager and graphed
# 2026-12-02, 77827a9; the several-rank graph forced on one rank (fast_graphed[_elementwise]_ids_all_to_all)
# 2026-12-04, 6a747ce at 8192, b63c7cf at 32768
STEP_MS: Dict[Tuple[str, str], Dict[int, float]] = {
    ("adagrad", EAGER): {4096: 6.407, 8192: 7.365, 32768: 12.580, 65536: 23.132},
    ("adagrad", GRAPHED): {4096: 2.197, 8192: 3.598, 32768: 12.110, 65536: 22.619},
    ("adagrad", GRAPHED_RANKS): {8192: 3.684, 32768: 12.395},
    ("rowwise_adagrad", EAGER): {4096: 6.831, 8192: 7.925, 32768: 12.085, 65536: 22.362},
    ("rowwise_adagrad", GRAPHED): {4096: 2.161, 8192: 3.517, 32768: 11.616, 65536: 21.936},
    ("rowwise_adagrad", GRAPHED_RANKS): {8192: 3.608},
}
# the same on skewed ids (bench.throughput --ids criteo, bench/ids.py; docs/performance.md, 2026-12-04, c3d3a68)
SKEWED_STEP_MS: Dict[Tuple[str, str], Dict[int, float]] = {
    ("adagrad", GRAPHED_RANKS): {8192: 3.182},
    ("rowwise_adagrad", GRAPHED): {8192: 3.102},
}
# the data sets of real Criteo ids (heavy-tailed: SKEWED_STEP_MS applies)
CRITEO_DATA = ("criteo_binary", "criteo_tsv")
# train.py's evaluation by kind of step (docs/performance.md, 2026-12-05, 81a89b8): data=synthetic built on the
# GPU, 4,194,304 rows at eval.batch_size=32768, histogram AUC, the run's second (warm) evaluation, on one H100: the
# eager forward (pipeline=sparse_dist) and the captured one (pipeline=graphed). An H200 has the same SMs and faster
# HBM. The several-rank graph's forward, forced on one rank, evaluates as fast as the one-rank graph's
# (bench.eval_throughput --ids-all-to-all: 8.04 against 8.01 M samples/s at 32768).
EVAL_SAMPLES_PER_S_PER_GPU: Dict[str, float] = {EAGER: 5.84e6, GRAPHED: 7.51e6, GRAPHED_RANKS: 7.51e6}
# MLPerf Training v5.0 results, HPE-Cray-XD670-H200-SXM5-141GB_n1_24.09 dlrm_dcnv2: the olympic mean of its 10
# runs; per GPU, 3200 steps of 65536 samples between two evaluations in 11.8 s of training, over 8 GPUs
PUBLISHED = (
    "NVIDIA HugeCTR on HPE Cray XD670 (8x H200), MLPerf Training v5.0: 3.44 min to the target; about 2.2 M "
    "samples/s per GPU of training time"
)


@dataclass
class Estimate:
    """Times in seconds; ``*_low`` with the collectives overlapped, ``*_high`` with none of them."""

    world_size: int
    per_gpu_batch: int
    compute_ms: float
    comm_ms: float
    steps_per_epoch: int
    train_samples: int
    eval_samples: int
    epoch_low: float
    epoch_high: float
    eval_per_epoch: float
    eval_rate: float  # evaluation samples/s per GPU
    epochs_to_target: float
    target_low: float
    target_high: float


def step_kind(graphed: bool, world_size: int) -> str:
    """The measured step that stands for a run: :data:`EAGER` without ``pipeline=graphed``; with it
    :data:`GRAPHED` on one rank and :data:`GRAPHED_RANKS` on several (the caller checks that the run's plan is
    one the graph takes: :func:`dlrm.graphed.check_graphed`)."""
    if not graphed:
        return EAGER
    return GRAPHED if world_size == 1 else GRAPHED_RANKS


def step_ms(sparse_type: str, kind: str, per_gpu_batch: int, skewed: bool = False) -> Tuple[float, bool]:
    """The measured one-GPU step of ``kind`` (:func:`step_kind`), linearly interpolated in the batch:
    ``(ms, on skewed ids)``. With ``skewed`` (real Criteo ids) the :data:`SKEWED_STEP_MS` figure where the batch
    lies within its measured ones, else the uniform ids' of :data:`STEP_MS`.

    Raises:
        ValueError: no figure for that optimizer and kind, or a batch outside the measured range.
    """
    points = SKEWED_STEP_MS.get((sparse_type, kind)) if skewed else None
    if points and min(points) <= per_gpu_batch <= max(points):
        return _interpolate(points, per_gpu_batch), True
    points = STEP_MS.get((sparse_type, kind))
    if points is None:
        raise ValueError(f"no measured step for optimizer.sparse_type={sparse_type}; give --step-ms")
    lo, hi = min(points), max(points)
    if not lo <= per_gpu_batch <= hi:
        what = f" of {STEP_KINDS[kind]}" if kind != EAGER else ""
        raise ValueError(f"the per-GPU batch {per_gpu_batch} is outside the measured {lo}-{hi}{what}; give --step-ms")
    return _interpolate(points, per_gpu_batch), False


# 1x H200, perf=fast pipeline=graphed, element-wise Adagrad, uniform ids: the TBE's forward lookup plus its
# backward with the fused optimizer, GPU ms per step by per-GPU batch (docs/performance.md, "Where the time goes")
TBE_MS: Dict[int, float] = {8192: 0.228 + 0.878, 32768: 0.847 + 3.016}


def whole_bag_tbe_ms(
    per_gpu_batch: int,
    world_size: int,
    row_wise_ids: float,
    all_ids: float,
    table_row_wise_ids: float = 0.0,
    local_world_size: int = 1,
) -> float:
    """The TBE time the several-rank graph adds for tables split by rows: it looks up row_wise tables' whole bags
    of every rank on every rank (weight 0 outside the rank's rows), ``world_size - 1`` times their ids more than
    TorchRec's row routing, and table_row_wise tables' on every rank of the table's host, ``local_world_size - 1``
    times their ids more (per rank on average), taken as that share of :data:`TBE_MS` (linear in the ids; the
    batch's figure interpolated, scaled by the batch outside the measured ones). ``row_wise_ids`` /
    ``table_row_wise_ids`` / ``all_ids``: ids per sample of the row_wise tables / the table_row_wise tables / every
    table. Milliseconds."""
    more = (world_size - 1) * row_wise_ids + (local_world_size - 1) * table_row_wise_ids
    if world_size <= 1 or more <= 0 or all_ids <= 0:
        return 0.0
    lo, hi = min(TBE_MS), max(TBE_MS)
    if per_gpu_batch < lo or per_gpu_batch > hi:
        edge = lo if per_gpu_batch < lo else hi
        tbe = TBE_MS[edge] * per_gpu_batch / edge
    else:
        tbe = _interpolate(TBE_MS, per_gpu_batch)
    return tbe * more / all_ids


def step_source(kind: str, skewed: bool) -> str:
    """How :func:`format_estimate` names a measured step of ``kind``, on skewed or uniform ids."""
    ids = "skewed ids (--ids criteo)" if skewed else "uniform ids"
    forced = ", forced on" if kind == GRAPHED_RANKS else " on"
    return f"{STEP_KINDS[kind]}{forced} one H200, {ids}, measured"


def epochs_to_target(global_batch: int) -> float:
    """Epochs to AUC 0.80275 at ``global_batch``: :data:`RCP_EPOCHS` linearly interpolated in the batch, as
    rcp_checker.py interpolates between reference batches (0.7911 at 65536); below or above the reference batches,
    the nearest one's figure."""
    lo, hi = min(RCP_EPOCHS), max(RCP_EPOCHS)
    return _interpolate(RCP_EPOCHS, min(max(global_batch, lo), hi))


def _interpolate(points: Dict[int, float], x: int) -> float:
    """``points`` (batch -> figure) linearly interpolated at ``x``, which lies within their batches."""
    xs = sorted(points)
    for a, b in zip(xs, xs[1:]):
        if a <= x <= b:
            return points[a] + (x - a) / (b - a) * (points[b] - points[a])
    return points[xs[0]]  # a single point


def estimate(
    global_batch: int,
    world_size: int,
    compute_ms: float,
    comm_ms: float,
    train_samples: int = TRAIN_SAMPLES,
    eval_samples: int = EVAL_SAMPLES,
    eval_kind: str = EAGER,
) -> Estimate:
    """The epoch and time-to-target estimate for ``world_size`` GPUs at ``global_batch``, from the per-step
    compute and collective times in ms (module docstring); one epoch is ``train_samples`` training rows with
    :data:`EVALS_PER_EPOCH` evaluations of ``eval_samples`` rows (default: MLPerf's Criteo 1TB), at the evaluation
    rate of the kind of step ``eval_kind`` (:data:`EVAL_SAMPLES_PER_S_PER_GPU`)."""
    steps = -(-train_samples // global_batch)  # the trainer's rule too: a last partial batch is one more step
    eval_rate = EVAL_SAMPLES_PER_S_PER_GPU[eval_kind]
    eval_epoch = EVALS_PER_EPOCH * eval_samples / (world_size * eval_rate)
    lo, hi = steps * compute_ms / 1e3, steps * (compute_ms + comm_ms) / 1e3
    epochs = epochs_to_target(global_batch)
    return Estimate(
        world_size=world_size,
        per_gpu_batch=global_batch // world_size,
        compute_ms=compute_ms,
        comm_ms=comm_ms,
        steps_per_epoch=steps,
        train_samples=train_samples,
        eval_samples=eval_samples,
        epoch_low=lo + eval_epoch,
        epoch_high=hi + eval_epoch,
        eval_per_epoch=eval_epoch,
        eval_rate=eval_rate,
        epochs_to_target=epochs,
        target_low=epochs * (lo + eval_epoch),
        target_high=epochs * (hi + eval_epoch),
    )


def format_estimate(
    e: Estimate, source: str, published: Optional[str] = PUBLISHED, dataset: str = "MLPerf's Criteo 1TB"
) -> str:
    """The estimate as text, labelled as one, with ``source`` naming where the step's compute came from and
    ``dataset`` where the epoch's rows did. The time to the target is MLPerf's, so only for its dataset."""
    mlperf = (e.train_samples, e.eval_samples) == (TRAIN_SAMPLES, EVAL_SAMPLES)
    rate_lo = e.per_gpu_batch / (e.compute_ms + e.comm_ms) * 1e3  # per GPU, training time only
    rate_hi = e.per_gpu_batch / e.compute_ms * 1e3
    lines = [
        f"ESTIMATE (arithmetic on measured figures, not a measurement) for {e.world_size} x H200, "
        f"{e.per_gpu_batch} samples per GPU per step:",
        f"  step: {e.compute_ms:.2f} ms compute ({source}) + up to {e.comm_ms:.2f} ms of collectives = "
        f"{e.compute_ms:.2f}-{e.compute_ms + e.comm_ms:.2f} ms; {rate_lo / 1e6:.2f}-{rate_hi / 1e6:.2f} M "
        "samples/s per GPU of training time",
        f"  one epoch of {dataset} ({e.train_samples:,} samples, {e.steps_per_epoch:,} steps, {EVALS_PER_EPOCH} "
        f"evaluations of {e.eval_samples:,} rows = {e.eval_per_epoch:.0f} s at {e.eval_rate / 1e6:.2f} M "
        f"samples/s per GPU, measured on one H100): {e.epoch_low / 60:.1f}-{e.epoch_high / 60:.1f} min",
        f"  to AUC 0.80275 ({e.epochs_to_target:.3f} epoch, MLPerf's reference convergence points at global batch "
        f"{e.per_gpu_batch * e.world_size}): {e.target_low / 60:.1f}-{e.target_high / 60:.1f} min"
        if mlperf
        else "  to AUC 0.80275: not estimated, MLPerf's reference convergence points are for its Criteo 1TB epoch",
    ]
    if published:
        lines.append(f"  published, for comparison: {published}")
    return "\n".join(lines)
