"""Evaluation metrics over all ranks: exact ROC AUC and logloss.

``global_auc`` gathers every rank's predictions (uneven sizes, including empty ranks, via torchmetrics'
``gather_all_tensors``) and scores them with torchmetrics' exact ``binary_auroc``, which equals
``sklearn.metrics.roc_auc_score`` (ties count one half). Every rank computes on the same gathered tensors, so
every rank gets the same value. Memory is O(total evaluation rows) per rank: fine up to tens of millions of rows;
MLPerf-sized evaluation (89 M rows) needs the bounded method of issue 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import torch
import torch.distributed as dist
from torchmetrics.functional.classification import binary_auroc
from torchmetrics.utilities.distributed import gather_all_tensors


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def global_auc(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact ROC AUC of the predictions of all ranks together.

    Args:
        preds: float ``[n]`` scores (probabilities or logits) of this rank; ``n`` may differ per rank, or be 0.
        labels: ``[n]`` 0/1 labels.

    Returns:
        The AUC, identical on every rank; NaN when the gathered labels hold only one class.
    """
    preds = preds.detach().float().reshape(-1)
    labels = labels.detach().reshape(-1).long()
    if _dist_on():
        preds = torch.cat(gather_all_tensors(preds))
        labels = torch.cat(gather_all_tensors(labels))
    if labels.numel() == 0 or labels.min() == labels.max():
        return float("nan")
    return float(binary_auroc(preds, labels))


@dataclass
class EvalAccumulator:
    """Collects one rank's evaluation outputs; :meth:`compute` reduces over all ranks.

    Only rows with weight > 0 count (eval batches are padded so every rank runs the same number of steps).
    """

    preds: List[torch.Tensor] = field(default_factory=list)
    labels: List[torch.Tensor] = field(default_factory=list)

    def update(self, logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> None:
        keep = weight.to(logits.device) > 0
        self.preds.append(torch.sigmoid(logits.detach().float()[keep]))
        self.labels.append(labels.detach().float()[keep])

    def compute(self, device: torch.device) -> Dict[str, float]:
        """``{"auc", "logloss", "samples"}`` over all ranks (the same on every rank).

        logloss is the mean binary cross-entropy of the predicted probabilities, in nats.
        """
        preds = torch.cat(self.preds).to(device) if self.preds else torch.zeros(0, device=device)
        labels = torch.cat(self.labels).to(device) if self.labels else torch.zeros(0, device=device)
        sums = torch.stack([
            torch.nn.functional.binary_cross_entropy(preds.double(), labels.double(), reduction="sum")
            if preds.numel() else torch.zeros((), dtype=torch.float64, device=device),
            torch.tensor(float(preds.numel()), dtype=torch.float64, device=device),
        ])
        if _dist_on():
            dist.all_reduce(sums)
        n = float(sums[1])
        return {
            "auc": global_auc(preds, labels),
            "logloss": float(sums[0]) / n if n else float("nan"),
            "samples": int(n),
        }
