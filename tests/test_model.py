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
    split = D.Split(
        torch.rand(n, 13, generator=g),
        torch.randint(0, 3, (n, 26), generator=g),
        torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0]),
        "train",
    )
    mh = D.MultiHot(cfg.table_rows, cfg.multi_hot_sizes) if multi_hot else None
    batch = D.to_batch(split, torch.arange(n), FEATURE_NAMES, mh)
    loss, (loss_d, logits, labels) = model(batch)
    assert logits.shape == (n,) and logits.dtype == torch.float32
    assert loss.shape == () and torch.isfinite(loss)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    assert torch.allclose(loss_d, expected)
    tables = model.model.sparse_arch.embedding_bag_collection.embedding_bags
    assert len(tables) == 26 and tables["t_cat_0"].weight.shape == (64, cfg.embedding_dim)


def test_skip_nonfinite_zeroes_the_update_of_a_bad_batch_and_keeps_good_ones() -> None:
    from torchrec.models.dlrm import DLRMTrain

    cfg = to_config(compose(["model.row_cap=16"])).model
    torch.manual_seed(0)
    skip = build_model(cfg, torch.device("cpu"), torch.device("cpu"), skip_nonfinite=True)
    torch.manual_seed(0)
    plain = build_model(cfg, torch.device("cpu"), torch.device("cpu"))
    assert isinstance(plain, DLRMTrain) and plain.autocast_dtype is None
    g = torch.Generator().manual_seed(1)
    split = D.Split(
        torch.rand(4, 13, generator=g),
        torch.randint(0, 3, (4, 26), generator=g),
        torch.tensor([0.0, 1.0, 0.0, 1.0]),
        "train",
    )
    good = D.to_batch(split, torch.arange(4), FEATURE_NAMES, None)
    # a good batch: the same loss and gradients as torchrec's DLRMTrain
    l1, (_, logits1, _, ok1) = skip(good)
    l2, (_, logits2, _) = plain(good)
    l3, (_, logits3, _) = DLRMTrain(plain.model)(good)  # torchrec's own loss on the same network
    assert bool(ok1) and torch.equal(l1, l2) and torch.equal(logits1, logits2)
    assert torch.equal(l2, l3) and torch.equal(logits2, logits3)
    l1.backward()
    l2.backward()
    for (n, a), (_, b) in zip(skip.named_parameters(), plain.named_parameters()):
        assert torch.equal(a.grad, b.grad), n
    skip.zero_grad(set_to_none=False)
    # a batch with a NaN feature and an out-of-range label: zero loss and zero (finite) gradients
    split.dense[2, 5] = float("nan")
    split.labels[1] = 2.0
    bad = D.to_batch(split, torch.arange(4), FEATURE_NAMES, None)
    loss, (_, logits, _, ok) = skip(bad)
    assert not bool(ok) and float(loss.detach()) == 0.0 and torch.isfinite(logits).all()
    loss.backward()
    assert all(torch.count_nonzero(p.grad) == 0 for p in skip.parameters() if p.grad is not None)


@pytest.mark.parametrize("in_key_order", [False, True])
@pytest.mark.parametrize("permute", [False, True])
def test_zero_copy_sparse_arch_equals_torchrec_sparse_arch(permute: bool, in_key_order: bool) -> None:
    """The pooled embeddings (and the table gradients) equal TorchRec's SparseArch bit for bit, whether the
    KeyedTensor comes in feature order (returned as a view, no copy) or in another order (a sharded EBC's output
    over several ranks: reordered by a gather, no concatenation; with ``in_key_order=True`` returned as the view
    plus the order, reordered by ``to_feature_order``, as the dense step does)."""
    from torchrec import KeyedJaggedTensor, KeyedTensor
    from torchrec.models.dlrm import SparseArch

    from dlrm.model import ZeroCopySparseArch, to_feature_order

    cfg = to_config(compose(["model.row_cap=50"])).model
    torch.manual_seed(0)
    ebc = build_model(cfg, torch.device("cpu"), torch.device("cpu")).model.sparse_arch.embedding_bag_collection

    class Permuted(torch.nn.Module):
        """The EBC, with its output KeyedTensor's keys in reversed order."""

        def __init__(self) -> None:
            super().__init__()
            self.ebc = ebc

        def embedding_bag_configs(self):  # what SparseArch reads at construction
            return ebc.embedding_bag_configs()

        def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
            d = self.ebc(kjt).to_dict()
            keys = list(reversed(list(d)))
            return KeyedTensor.from_tensor_list(keys, [d[k] for k in keys])

    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4, (26 * 5,), generator=g)
    kjt = KeyedJaggedTensor(
        keys=FEATURE_NAMES, values=torch.randint(0, 3, (int(lengths.sum()),), generator=g), lengths=lengths
    )
    module = Permuted() if permute else ebc
    ours, ref = ZeroCopySparseArch(module), SparseArch(module)
    from unittest import mock

    ref(kjt)  # the KJT caches its per-key splits on first use (one torch.cat): not part of the count
    cats = []
    real_cat = torch.cat
    if in_key_order:
        values, order = ours(kjt, in_key_order=True)
        assert (order is None) == (not permute)
        if permute:  # the view in the KeyedTensor's (reversed) key order
            assert torch.equal(values.flip(1), ref(kjt)) and order[0].tolist() == list(range(25, -1, -1))
    with mock.patch("torch.cat", side_effect=lambda *x, **k: cats.append(1) or real_cat(*x, **k)):
        if in_key_order:
            values, order = ours(kjt, in_key_order=True)
            a = to_feature_order(values, order)
        else:
            a = ours(kjt)
        n_ours = len(cats)
        b = ref(kjt)
        n_ref = len(cats) - n_ours
    assert a.shape == (5, 26, cfg.embedding_dim) and torch.equal(a, b)
    # SparseArch's own concatenation is skipped (a view, or one gather)
    assert n_ours == n_ref - 1, (n_ours, n_ref)
    w = torch.randn(a.shape, generator=g)
    (a * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in ebc.named_parameters()}
    ebc.zero_grad()
    (b * w).sum().backward()
    for n, p in ebc.named_parameters():
        assert torch.equal(grads[n], p.grad), n
