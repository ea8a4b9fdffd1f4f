"""Model builders: output shapes of every preset on CPU (unsharded), and the checks of the batches the model takes."""

from __future__ import annotations

import re

import pytest
import torch

from dlrm import data as D
from dlrm.config import compose, to_config
from dlrm.model import FEATURE_NAMES, BucketedDenseArch, build_model


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


def test_dense_buckets_are_exact_one_hots_clamped_at_both_ends() -> None:
    nan = float("nan")
    x = torch.tensor([[-1.0, 0.49], [0.5, 1.0], [1.49, 9.0], [0.0, nan]])
    # width 0.5, 3 buckets: floor(x / 0.5) clamped to [0, 2]; a NaN feature sets no bucket
    expected = torch.tensor(
        [
            [-1.0, 0.49, 1, 0, 0, 1, 0, 0],
            [0.5, 1.0, 0, 1, 0, 0, 0, 1],
            [1.49, 9.0, 0, 0, 1, 0, 0, 1],
            [0.0, nan, 1, 0, 0, 0, 0, 0],
        ]
    )
    got = BucketedDenseArch(2, [4], num_buckets=3, width=0.5).buckets(x)
    assert got.dtype == torch.float32 and torch.equal(got.nan_to_num(-7.0), expected.nan_to_num(-7.0))
    # the default width 1.0: bucket floor(x), the last one also taking everything above it
    x = torch.tensor([[0.0, 0.999, 1.0, 14.99, 15.0, 40.0, -0.5]]).T
    ones = BucketedDenseArch(1, [4], num_buckets=16).buckets(x)[:, 1:].argwhere()
    assert ones.tolist() == [[0, 0], [1, 0], [2, 1], [3, 14], [4, 15], [5, 15], [6, 0]]


@pytest.mark.parametrize("interaction", ["dcn", "dot"])
def test_dense_buckets_widen_the_first_bottom_layer_and_keep_every_name(interaction: str) -> None:
    base = ["model.row_cap=16", f"model.interaction={interaction}"]
    torch.manual_seed(0)
    plain = build_model(to_config(compose(base)).model, torch.device("cpu"), torch.device("cpu"))
    torch.manual_seed(0)
    cfg = to_config(compose([*base, "model.dense_buckets=16"])).model
    bucketed = build_model(cfg, torch.device("cpu"), torch.device("cpu"))
    first = next(m for m in bucketed.model.dense_arch.modules() if isinstance(m, torch.nn.Linear))
    assert isinstance(bucketed.model.dense_arch, BucketedDenseArch) and first.weight.shape == (64, 13 * (1 + 16))
    a, b = dict(plain.named_parameters()), dict(bucketed.named_parameters())
    first_name = next(n for n in b if n.startswith("model.dense_arch.model."))
    assert list(a) == list(b) and b[first_name] is first.weight and a[first_name].shape == (64, 13)
    for n in a:  # the bucketed arch is built after the network: every other module starts as without buckets
        assert a[n].shape == b[n].shape or b[n] is first.weight, n
        assert n.startswith("model.dense_arch.") or torch.equal(a[n], b[n]), n
    g = torch.Generator().manual_seed(1)
    split = D.Split(
        torch.rand(4, 13, generator=g) * 5,
        torch.randint(0, 3, (4, 26), generator=g),
        torch.tensor([0.0, 1, 0, 1]),
        "train",
    )
    loss, (_, logits, _) = bucketed(D.to_batch(split, torch.arange(4), FEATURE_NAMES, None))
    loss.backward()
    assert logits.shape == (4,) and torch.count_nonzero(first.weight.grad[:, 13:]) > 0


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


B = 3  # samples of the hand-built batches below
ONES = torch.ones(26 * B, dtype=torch.int32)


def _kjt(lengths=None, offsets=None, keys=FEATURE_NAMES, n_values=None, **kw):
    """A KJT over ``keys`` with zero ids: ``n_values`` of them, else as many as the lengths (or offsets) say."""
    from torchrec import KeyedJaggedTensor

    if n_values is None:
        n_values = int(lengths.clamp(min=0).sum()) if lengths is not None else int(offsets[-1])
    values = torch.zeros(n_values, dtype=torch.int64)
    return KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths, offsets=offsets, **kw)


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=lengths.dtype), lengths.cumsum(0).to(lengths.dtype)])


def _batch(sparse, b: int = B, dense=None, labels=None):
    from torchrec.datasets.utils import Batch

    return Batch(
        dense_features=torch.rand(b, 13) if dense is None else dense,
        sparse_features=sparse,
        labels=torch.tensor([0.0, 1.0, 1.0, 0.0][:b]) if labels is None else labels,
    )


def _with(i: int, v: int, base: torch.Tensor = ONES) -> torch.Tensor:
    out = base.clone()
    out[i] = v
    return out


KEYS_EXPECTED = "keys must be the model's 26 features cat_0, cat_1, ..., cat_25, each once, in that order"
SWAPPED = FEATURE_NAMES[:3] + ["cat_4", "cat_3"] + FEATURE_NAMES[5:]
BAD_BATCHES = {
    "lengths_count": (
        lambda: _batch(_kjt(torch.ones(79, dtype=torch.int32))),
        "batch: sparse_features has 79 lengths; expected 26 features x 3 samples = 78 "
        "(one length per feature and sample, feature-major)",
    ),
    "lengths_for_another_batch_size": (
        lambda: _batch(_kjt(ONES), b=4),
        "batch: sparse_features has 78 lengths; expected 26 features x 4 samples = 104",
    ),
    "offsets_per_feature_concatenated": (
        lambda: _batch(_kjt(offsets=torch.arange(B + 1).repeat(26), n_values=B)),
        "batch: sparse_features has 104 offsets; expected 26 features x 3 samples + 1 = 79 "
        "(one non-decreasing list over all features, starting at 0)",
    ),
    "offsets_decrease": (
        lambda: _batch(_kjt(offsets=_offsets(_with(4 * B + 2, -3)))),
        "batch: feature cat_4 has offsets that decrease (-3 at sample 2); offsets must be one non-decreasing list "
        "over all features",
    ),
    "offsets_start": (
        lambda: _batch(_kjt(offsets=_offsets(ONES) + 5)),
        "batch: sparse_features offsets start at 5; expected 0",
    ),
    "offsets_end": (
        lambda: _batch(_kjt(offsets=_offsets(ONES), n_values=80)),
        "batch: sparse_features has 80 values; its offsets end at 78 (the last offset must equal len(values))",
    ),
    "negative_length": (
        lambda: _batch(_kjt(_with(4 * B + 2, -3))),
        "batch: feature cat_4 has a negative length (-3 at sample 2); lengths must be >= 0",
    ),
    "lengths_sum": (
        lambda: _batch(_kjt(ONES, n_values=77)),
        "batch: sparse_features has 77 values; its lengths sum to 78 (sum(lengths) must equal len(values))",
    ),
    "lengths_and_offsets_disagree": (
        lambda: _batch(_kjt(ONES, offsets=_offsets(_with(5, 2)))),
        "batch: feature cat_1 has length 1 at sample 2 where its offsets differ by 2; offsets must be 0 followed "
        "by the running sum of lengths",
    ),
    "stride": (
        lambda: _batch(_kjt(ONES, stride=4)),
        "batch: sparse_features has stride 4; expected 3 (dense_features has 3 rows)",
    ),
    "missing_key": (
        lambda: _batch(_kjt(ONES[: 25 * B], keys=FEATURE_NAMES[:25])),
        f"batch: sparse_features lacks feature(s) cat_25; {KEYS_EXPECTED}",
    ),
    "extra_key": (
        lambda: _batch(_kjt(torch.ones(27 * B, dtype=torch.int32), keys=FEATURE_NAMES + ["cat_26"])),
        f"batch: sparse_features has key(s) the model does not have: cat_26; {KEYS_EXPECTED}",
    ),
    "renamed_key": (
        lambda: _batch(_kjt(ONES, keys=FEATURE_NAMES[:3] + ["C4"] + FEATURE_NAMES[4:])),
        f"batch: sparse_features lacks feature(s) cat_3 and has key(s) the model does not have: C4; {KEYS_EXPECTED}",
    ),
    "repeated_key": (
        lambda: _batch(_kjt(torch.ones(27 * B, dtype=torch.int32), keys=FEATURE_NAMES + ["cat_0"])),
        f"batch: sparse_features repeats key(s) cat_0; {KEYS_EXPECTED}",
    ),
    "keys_out_of_order": (
        lambda: _batch(_kjt(ONES, keys=SWAPPED)),
        f"batch: sparse_features keys are out of order: key 3 is cat_4 where the model has cat_3; {KEYS_EXPECTED}",
    ),
    "dense_columns": (
        lambda: _batch(_kjt(ONES), dense=torch.rand(B, 12)),
        "batch: dense_features has shape [3, 12]; expected [B, 13] (one row of 13 dense features per sample)",
    ),
    "dense_flat": (
        lambda: _batch(_kjt(ONES), dense=torch.rand(B * 13)),
        "batch: dense_features has shape [39]; expected [B, 13]",
    ),
    "labels_length": (
        lambda: _batch(_kjt(ONES), labels=torch.zeros(4)),
        "batch: labels has shape [4]; expected [3] (one label per sample: dense_features has 3 rows)",
    ),
    "labels_column": (
        lambda: _batch(_kjt(ONES), labels=torch.zeros(B, 1)),
        "batch: labels has shape [3, 1]; expected [3]",
    ),
    "sparse_not_a_kjt": (
        lambda: _batch({"cat_0": torch.zeros(B)}),
        "batch: sparse_features is a dict; expected a torchrec KeyedJaggedTensor",
    ),
}


@pytest.fixture(scope="module")
def tiny_model():
    cfg = to_config(compose(["model.row_cap=16"])).model
    torch.manual_seed(0)
    return build_model(cfg, dense_device=torch.device("cpu"), table_device=torch.device("cpu"))


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_bad_batch_names_what_is_wrong(tiny_model, case: str) -> None:
    from dlrm.errors import InputError
    from dlrm.model import BatchError

    make, expected = BAD_BATCHES[case]
    with pytest.raises(BatchError) as e:
        tiny_model(make())
    assert isinstance(e.value, InputError) and isinstance(e.value, ValueError)
    assert str(e.value).startswith(expected), str(e.value)


def test_skip_nonfinite_model_checks_batches_too() -> None:
    from dlrm.model import BatchError

    cfg = to_config(compose(["model.row_cap=16"])).model
    model = build_model(cfg, torch.device("cpu"), torch.device("cpu"), skip_nonfinite=True)
    make, expected = BAD_BATCHES["lengths_count"]
    with pytest.raises(BatchError, match="^" + re.escape(expected)):
        model(make())
    _, (_, _, _, ok) = model(_batch(_kjt(ONES)))
    assert bool(ok)


def _variable_bags() -> torch.Tensor:
    """Lengths 0..3 per feature and sample: some bags empty."""
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(0, 4, (26 * B,), generator=g, dtype=torch.int32)
    lengths[0] = 0
    return lengths


@pytest.mark.parametrize("given", ["lengths", "offsets", "both"])
def test_good_hand_built_batch_trains_one_step(given: str) -> None:
    from torchrec import KeyedJaggedTensor

    cfg = to_config(compose(["model.row_cap=16"])).model
    torch.manual_seed(0)
    model = build_model(cfg, dense_device=torch.device("cpu"), table_device=torch.device("cpu"))
    lengths = _variable_bags()
    g = torch.Generator().manual_seed(6)
    values = torch.randint(0, min(cfg.table_rows), (int(lengths.sum()),), generator=g)
    kw = {
        "lengths": dict(lengths=lengths),
        "offsets": dict(offsets=_offsets(lengths)),
        "both": dict(lengths=lengths, offsets=_offsets(lengths), stride=B),
    }[given]
    batch = _batch(KeyedJaggedTensor(keys=FEATURE_NAMES, values=values, **kw), dense=torch.rand(B, 13, generator=g))
    reference = _batch(
        KeyedJaggedTensor(keys=FEATURE_NAMES, values=values, lengths=lengths), dense=batch.dense_features
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss, (_, logits, _) = model(batch)
    assert torch.isfinite(loss) and logits.shape == (B,)
    with torch.no_grad():
        assert torch.equal(model(reference)[0], loss.detach())
    loss.backward()
    opt.step()
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert "model.sparse_arch.embedding_bag_collection.embedding_bags.t_cat_1.weight" in changed
    assert any(n.startswith("model.over_arch") for n in changed)
    assert torch.isfinite(model(batch)[0])


def test_batch_value_checks_need_no_values_off_the_cpu() -> None:
    """On tensors whose values cannot be read (meta here, as a CUDA tensor's cannot without a sync) only sizes,
    shapes and keys are checked."""
    from torchrec import KeyedJaggedTensor

    from dlrm.model import BatchError, check_batch

    meta = torch.device("meta")

    def batch(n_lengths: int, n_values: int):
        kjt = KeyedJaggedTensor(
            keys=FEATURE_NAMES,
            values=torch.empty(n_values, dtype=torch.int64, device=meta),
            lengths=torch.empty(n_lengths, dtype=torch.int32, device=meta),
        )
        return _batch(kjt, dense=torch.empty(B, 13, device=meta), labels=torch.empty(B, device=meta))

    check_batch(batch(26 * B, 5), FEATURE_NAMES)  # sum(lengths) unknown without reading them: not checked
    with pytest.raises(BatchError, match="^batch: sparse_features has 79 lengths; expected 26 features x 3"):
        check_batch(batch(79, 5), FEATURE_NAMES)


def test_batch_checks_are_skipped_while_fx_tracing(tiny_model) -> None:
    from unittest import mock

    def refuse(*args, **kwargs):
        raise AssertionError("checked while tracing")

    with (
        mock.patch("dlrm.model.compat.is_fx_tracing", return_value=True),
        mock.patch("dlrm.model.check_batch", side_effect=refuse),
    ):
        loss, _ = tiny_model(_batch(_kjt(ONES)))
    assert torch.isfinite(loss)


@pytest.mark.parametrize("multi_hot", [False, True])
def test_loader_batches_pass_the_checks(multi_hot: bool) -> None:
    from dlrm.model import check_batch

    cfg = to_config(compose(["model.row_cap=64"])).model
    g = torch.Generator().manual_seed(2)
    n = 7
    split = D.Split(torch.rand(n, 13, generator=g), torch.randint(0, 3, (n, 26), generator=g), torch.ones(n), "train")
    mh = D.MultiHot(cfg.table_rows, cfg.multi_hot_sizes) if multi_hot else None
    batches = list(
        D.train_batches(
            split,
            global_batch=4,
            rank=0,
            world_size=1,
            epochs=1,
            max_steps=None,
            feature_names=FEATURE_NAMES,
            multi_hot=mh,
            shuffle=True,
            seed=0,
        )
    )
    batches += [
        b
        for b, _ in D.eval_batches(split, batch_size=4, rank=1, world_size=2, feature_names=FEATURE_NAMES, multi_hot=mh)
    ]
    assert [len(b.labels) for b in batches] == [4, 3, 4]
    for batch in batches:
        check_batch(batch, FEATURE_NAMES)
