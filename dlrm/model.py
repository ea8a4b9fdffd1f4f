"""Model builders: TorchRec's ``DLRM_DCN`` (DLRM-v2) or ``DLRM`` (dot interaction) over a multi-hot
``EmbeddingBagCollection``, wrapped in ``DLRMTrain`` (BCE-with-logits loss).

Tables are created on the meta device so that DMP materialises each shard only on its owning rank (a 104.5 GB
MLPerf model never exists whole on one host); ``dense_device`` holds the MLPs.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torchrec import EmbeddingBagCollection
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


def build_model(cfg: ModelConfig, dense_device: Optional[torch.device] = None,
                table_device: torch.device = torch.device("meta")) -> DLRMTrain:
    """Build the unsharded model.

    Args:
        cfg: model config.
        dense_device: device of the MLP / interaction parameters (default CPU).
        table_device: device of the embedding tables; ``meta`` (default) for DMP, ``cpu`` for an unsharded
            reference model in tests.

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
    return DLRMTrain(net)
