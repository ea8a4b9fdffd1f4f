"""Model builders: output shapes of every preset on CPU (unsharded)."""

from __future__ import annotations

import pytest
import torch

from dlrm import data as D
from dlrm.config import compose, to_config
from dlrm.model import FEATURE_NAMES, build_model


@pytest.mark.parametrize("preset", ["dlrm_v2", "dlrm_v2_small", "dlrm"])
@pytest.mark.parametrize("multi_hot", [True, False])
def test_output_shapes(preset: str, multi_hot: bool) -> None:
    cfg = to_config(compose([f"model={preset}", "model.row_cap=64"])).model
    torch.manual_seed(0)
    model = build_model(cfg, dense_device=torch.device("cpu"), table_device=torch.device("cpu"))
    n = 5
    g = torch.Generator().manual_seed(1)
    split = D.Split(torch.rand(n, 13, generator=g), torch.randint(0, 3, (n, 26), generator=g),
                    torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0]), "train")
    mh = D.MultiHot(cfg.table_rows, cfg.multi_hot_sizes) if multi_hot else None
    batch = D.to_batch(split, torch.arange(n), FEATURE_NAMES, mh)
    loss, (loss_d, logits, labels) = model(batch)
    assert logits.shape == (n,) and logits.dtype == torch.float32
    assert loss.shape == () and torch.isfinite(loss)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    assert torch.allclose(loss_d, expected)
    tables = model.model.sparse_arch.embedding_bag_collection.embedding_bags
    assert len(tables) == 26 and tables["t_cat_0"].weight.shape == (64, cfg.embedding_dim)
