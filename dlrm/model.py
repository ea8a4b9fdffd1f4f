"""Model builders: TorchRec's ``DLRM_DCN`` (DLRM-v2) or ``DLRM`` (dot interaction) over a multi-hot
``EmbeddingBagCollection``, wrapped in ``DLRMTrain`` (BCE-with-logits loss).

Tables are created on the meta device so that DMP materialises each shard only on its owning rank (a 104.5 GB
MLPerf model never exists whole on one host); ``dense_device`` holds the MLPs.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torchrec import EmbeddingBagCollection
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dlrm.config import NUM_DENSE_FEATURES, ModelConfig

# Criteo's categorical columns C1..C26; one KJT key and one table ("t_cat_i") per feature, as torchrec's
# Criteo dataset names them.
FEATURE_NAMES: List[str] = [f"cat_{i}" for i in range(26)]


def table_configs(cfg: ModelConfig) -> List[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per sparse feature: rows from ``cfg.table_rows``, sum pooling."""
    return [
        EmbeddingBagConfig(
            name=f"t_{name}",
            embedding_dim=cfg.embedding_dim,
            num_embeddings=rows,
            feature_names=[name],
        )
        for name, rows in zip(FEATURE_NAMES, cfg.table_rows)
    ]


class DLRMTrainSkipNonFinite(DLRMTrain):
    """``DLRMTrain`` that drops batches with non-finite inputs without a host sync (``trainer.on_nonfinite=
    skip_batch``).

    A batch whose dense features or labels hold NaN/inf, or whose labels are not 0/1, has its loss multiplied by
    0 on the device; its inputs are zeroed first so that no NaN reaches the gradients. Zero gradients leave
    Adagrad's weights and accumulators (dense and fused TBE alike) unchanged, so the batch is skipped on this
    rank while every rank still runs the same collectives.

    Returns ``(loss, (loss, logits, labels, ok))`` with ``ok`` a bool scalar tensor (False: batch skipped).
    """

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        dense, labels = batch.dense_features, batch.labels.float()
        ok = torch.isfinite(dense).all() & ((labels == 0) | (labels == 1)).all()
        dense = torch.where(torch.isfinite(dense), dense, torch.zeros_like(dense))
        labels = torch.where((labels == 0) | (labels == 1), labels, torch.zeros_like(labels))
        logits = self.model(dense, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(logits, labels) * ok.to(logits.dtype)
        return loss, (loss.detach(), logits.detach(), labels.detach(), ok.detach())


def build_model(cfg: ModelConfig, dense_device: Optional[torch.device] = None,
                table_device: torch.device = torch.device("meta"), skip_nonfinite: bool = False) -> DLRMTrain:
    """Build the unsharded model.

    Args:
        cfg: model config.
        dense_device: device of the MLP / interaction parameters (default CPU).
        table_device: device of the embedding tables; ``meta`` (default) for DMP, ``cpu`` for an unsharded
            reference model in tests.
        skip_nonfinite: wrap in :class:`DLRMTrainSkipNonFinite` instead of ``DLRMTrain``.

    Returns:
        ``DLRMTrain`` whose ``forward(batch)`` returns ``(loss, (loss, logits, labels))``; logits are float32
        of shape ``[batch]``.
    """
    ebc = EmbeddingBagCollection(tables=table_configs(cfg), device=table_device)
    if cfg.interaction == "dcn":
        net: DLRM = DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=NUM_DENSE_FEATURES,
            dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
            over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
            dcn_num_layers=cfg.dcn_num_layers,
            dcn_low_rank_dim=cfg.dcn_low_rank_dim,
            dense_device=dense_device,
        )
    else:
        net = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=NUM_DENSE_FEATURES,
            dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
            over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
            dense_device=dense_device,
        )
    return DLRMTrainSkipNonFinite(net) if skip_nonfinite else DLRMTrain(net)
