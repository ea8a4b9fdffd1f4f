"""Rank layout of training and evaluation batches, shared by every source.

Global batch ``i`` is rows ``[i*G, (i+1)*G)`` (``G`` = global batch) and rank ``r`` takes the ``r``-th contiguous
block of it, so the sequence of global batches, and hence the math, does not depend on the world size when
``data.global_batch_size`` is fixed. Evaluation splits the rows into one contiguous share per rank.
"""

from __future__ import annotations

import math
from typing import List, Tuple


def train_plan(n_rows: int, global_batch: int, world_size: int) -> List[Tuple[int, int]]:
    """``(start, per_rank_size)`` of every global batch of a training epoch.

    Full global batches give each rank ``global_batch // world_size`` rows. The last partial global batch of
    ``R`` rows is trained too, each rank taking ``R // world_size`` rows (so all ranks step together); its
    ``R % world_size`` leftover rows, fewer than the world size, are not used.
    """
    per_rank = global_batch // world_size
    plan = []
    for start in range(0, n_rows, global_batch):
        rows = min(global_batch, n_rows - start)
        size = per_rank if rows == global_batch else rows // world_size
        if size > 0:
            plan.append((start, size))
    return plan


def steps_per_epoch(n_rows: int, global_batch: int, world_size: int) -> int:
    """Training steps in one epoch of ``n_rows`` rows: ``ceil(n_rows / global_batch)``, the last partial global
    batch included, except when it has fewer rows than ``world_size`` (:func:`train_plan`); 0 when ``n_rows <
    world_size``."""
    return len(train_plan(n_rows, global_batch, world_size))


def eval_spans(n: int, batch_size: int, rank: int, world_size: int) -> Tuple[int, List[Tuple[int, int]]]:
    """The evaluation layout of :func:`dlrm.data.eval_batches` for a split of ``n`` rows: ``(batch size, [(start,
    real rows), ...])`` of this rank's batches. Rows split into ``world_size`` contiguous shares (sizes differ by
    at most one); every rank gets as many batches as the longest share needs, of ``batch_size`` rows or the
    longest share's when that is fewer (no batch of mostly padding); ``real`` may be 0 past the end of a short
    share."""
    bounds = [n * r // world_size for r in range(world_size + 1)]
    lo, hi = bounds[rank], bounds[rank + 1]
    longest = max(bounds[r + 1] - bounds[r] for r in range(world_size))
    batch_size = max(1, min(batch_size, longest))
    starts = [lo + i * batch_size for i in range(math.ceil(longest / batch_size))]
    return batch_size, [(start, max(0, min(batch_size, hi - start))) for start in starts]
