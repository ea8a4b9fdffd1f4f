"""Evaluation: score a split on all ranks (:meth:`Scorer.score`), and the record and line it is logged as
(:func:`eval_record`, :func:`eval_line`); :meth:`dlrm.trainer.Trainer.evaluate` logs them with the MLPerf events.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from dlrm import data as data_mod
from dlrm.metrics import EvalAccumulator
from dlrm.model import FEATURE_NAMES
from dlrm.process_group import DistInfo

log = logging.getLogger("dlrm.trainer")  # the trainer's evaluation: its lines keep the trainer's logger name


@dataclass
class Scorer:
    """What scores a split: the sharded model (or the pipeline that holds it), this rank's place, the batches.

    Fields:
        model: the DMP (:class:`torchrec.distributed.DistributedModelParallel`).
        pipeline: the training pipeline; one with ``detach`` hands the model back for evaluation, one with
            ``evaluate`` (``pipeline=graphed``) replays a captured forward.
        info: this process's rank, world size and device.
        batch_size: evaluation samples per rank per batch.
        multi_hot: the multi-hot expansion of the ids, or None.
        auc_method: ``exact`` or ``histogram`` (:class:`dlrm.metrics.EvalAccumulator`).
        cache: hold the batches of a split scored with ``cache=True`` on the device after their first pass
            (``eval.cache_on_device``): later passes replay them, reading and building nothing on the host.
    """

    model: Any
    pipeline: Any
    info: DistInfo
    batch_size: int
    multi_hot: Any
    auc_method: str
    cache: bool = False
    _held: Optional[Tuple[Any, List[Tuple[Any, torch.Tensor]]]] = field(default=None, init=False, repr=False)

    def _batches(self, split: data_mod.Split) -> Iterable[Any]:
        """This rank's evaluation batches of ``split`` with their weights (:func:`dlrm.data.eval_batches`)."""
        info = self.info
        return data_mod.eval_batches(
            split,
            batch_size=self.batch_size,
            rank=info.rank,
            world_size=info.world_size,
            feature_names=FEATURE_NAMES,
            multi_hot=self.multi_hot,
        )

    def _cached_batches(self, split: data_mod.Split) -> Iterable[Any]:
        """``split``'s batches from the device cache (``eval.cache_on_device``), or read once and kept there: the
        cache is set only once a pass is complete, so a pass that stops early keeps nothing."""
        if self._held is not None and self._held[0] is split:
            return self._held[1]
        self._held = None  # one split held at a time: the validation split
        return self._fill(split)

    def _fill(self, split: data_mod.Split) -> Iterator[Tuple[Any, torch.Tensor]]:
        device = self.info.device
        pairs: List[Tuple[Any, torch.Tensor]] = []
        for batch, weight in self._batches(split):
            pair = (batch.to(device, non_blocking=True), _weight_to(weight, device))
            pairs.append(pair)
            yield pair
        self._held = (split, pairs)
        log.info(
            "evaluation: %d batches (%.2f GiB) of this split held on %s for the later passes (eval.cache_on_device)",
            len(pairs),
            _nbytes(pairs) / 2**30,
            device,
        )

    def _eval_model(self) -> Any:
        """The model to run evaluation batches through: the pipeline hands it back (its pipelined forwards
        detached) where it can."""
        return self.pipeline.detach() if hasattr(self.pipeline, "detach") else self.model

    @torch.no_grad()
    def score(self, split: data_mod.Split, cache: bool = False) -> Dict[str, Any]:
        """Score ``split`` on all ranks (collective); returns :meth:`dlrm.metrics.EvalAccumulator.compute`'s
        metrics. ``cache`` (with :attr:`cache`): replay ``split``'s batches from the device after its first pass."""
        device = self.info.device
        model = self._eval_model()
        model.eval()
        acc = EvalAccumulator(device, self.auc_method)
        batches = self._cached_batches(split) if cache and self.cache else self._batches(split)
        if hasattr(self.pipeline, "evaluate"):  # pipeline=graphed: replays a captured forward
            outputs = self.pipeline.evaluate(batches)
        else:
            # non-blocking: the loaders build batches in pinned memory, so the copy queues without a host sync
            outputs = ((model(b.to(device, non_blocking=True))[1], w) for b, w in batches)
        for out, weight in outputs:
            weight = _weight_to(weight, device)
            if len(out) > 3:  # skip_batch: rows of a batch with non-finite inputs do not count
                weight = weight * out[3].to(weight.dtype)
            acc.update(out[1], out[2], weight)
        res = acc.compute()
        model.train()  # the pipeline re-attaches its pipelined forwards on the next progress()
        return res

    @torch.no_grad()
    def compile_step(self, split: data_mod.Split) -> None:
        """Run one evaluation batch of ``split`` before training, so that the compiled dense step's evaluation
        graph (another batch size, no autograd) is built here, logged, and not inside the first validation's
        timing."""
        device = self.info.device
        t0 = time.perf_counter()
        # closed here: a prefetching source stops its thread
        with contextlib.closing(iter(self._batches(split))) as batches:
            batch, _ = next(batches)
        model = self._eval_model()
        model.eval()
        model(batch.to(device))
        model.train()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        log.info(
            "evaluation step compiled for batch %d before training (%.1fs)",
            self.batch_size,
            time.perf_counter() - t0,
        )


def _nbytes(pairs: List[Tuple[Any, torch.Tensor]]) -> int:
    """Device bytes of ``(batch, weight)`` pairs: dense features, labels, KJT values, lengths and offsets, weights;
    a tensor that several batches share (a loader's constant lengths) counted once."""
    seen: Dict[int, int] = {}
    for batch, weight in pairs:
        kjt = batch.sparse_features
        for t in (batch.dense_features, batch.labels, kjt.values(), kjt.lengths(), kjt.offsets(), weight):
            seen[t.data_ptr()] = t.nbytes
    return sum(seen.values())


def _weight_to(weight: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch's weights (float32 ``[B]``, on the CPU as :func:`dlrm.data.eval_batches` yields them) on
    ``device``, without a host sync on CUDA: pinned first, as a copy from pageable memory may wait for the stream,
    which would stall every evaluation batch."""
    if device.type != "cuda" or weight.device.type != "cpu":
        return weight.to(device)
    return weight.pin_memory().to(device, non_blocking=True)


def eval_record(kind: str, res: Dict[str, Any], step: int, samples: int, seconds: float) -> Dict[str, Any]:
    """The ``metrics.jsonl`` record of an evaluation: ``step``, ``samples`` (training samples seen), the metrics
    ``res`` as ``<kind>_*``, ``eval_s`` (``seconds``) and ``eval_samples_per_s``; ``<kind>_auc_undefined`` only
    where the AUC is undefined."""
    rec: Dict[str, Any] = {"step": step, "samples": samples}
    rec.update({f"{kind}_{k}": v for k, v in res.items()})
    rec["eval_s"] = seconds
    rec["eval_samples_per_s"] = res["samples"] / max(seconds, 1e-9)
    if res["auc_undefined"] is None:
        del rec[f"{kind}_auc_undefined"]
    return rec


def eval_line(kind: str, res: Dict[str, Any], step: int, total_steps: int, seconds: float) -> str:
    """The line ``train.log`` shows for an evaluation."""
    return (
        f"{kind:<4} {step:>6}/{total_steps} | auc {auc_text(res)} | "
        f"logloss {num_text(res['logloss'], '.5f')} | ne {num_text(res['ne'], '.4f')} | "
        f"acc {num_text(res['accuracy'], '.4f')} | calib {num_text(res['calibration'], '.3f')} | "
        f"{res['samples']:,} samples | {seconds:.1f}s"
    )


def final_line(last_val: Dict[str, Any], step: int, seconds: float) -> str:
    """The run's last line: the final validation record ``last_val`` after ``step`` steps and ``seconds``."""
    return (
        f"final validation AUC {auc_text(last_val, 'val_')} (logloss {num_text(last_val['val_logloss'], '.5f')}, "
        f"{last_val['val_samples']:,} samples) after {step} steps, {seconds:.1f}s"
    )


def num_text(v: float, spec: str) -> str:
    """``v`` formatted, or ``n/a`` for NaN (a metric undefined on this split)."""
    return format(v, spec) if math.isfinite(v) else "n/a"


def auc_text(res: Dict[str, Any], prefix: str = "") -> str:
    """The AUC of an evaluation record for a log line, or ``undefined (<why>)`` (:func:`dlrm.metrics.auc_undefined`)."""
    why = res.get(f"{prefix}auc_undefined")
    return f"undefined ({why})" if why else num_text(res[f"{prefix}auc"], ".4f")
