"""Global AUC and logloss over gloo ranks equal sklearn's on the gathered predictions; the accumulator's update
reads nothing back from the device (sync-free, shape-static: it can run inside a captured CUDA graph)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score
from torch.overrides import TorchFunctionMode

from conftest import run_gloo
from dlrm.metrics import NUM_BUCKETS, AUCHistogram, EvalAccumulator, global_auc

# per rank: (predictions, labels)
HALF_AND_HALF = [([0.2, 0.4], [0, 1]), ([0.6, 0.8], [0, 1])]
UNEVEN = [([0.9, 0.1, 0.35, 0.35], [1, 0, 1, 0]), ([0.35], [1])]
EMPTY_RANK = [([0.3, 0.7, 0.5], [0, 1, 1]), ([], [])]


CASES = {"half_and_half": HALF_AND_HALF, "uneven": UNEVEN, "empty_rank": EMPTY_RANK}


def _auc_worker(rank: int, world: int, cases):
    return {
        name: global_auc(torch.tensor(case[rank][0], dtype=torch.float32), torch.tensor(case[rank][1]))
        for name, case in cases.items()
    }


@pytest.fixture(scope="module")
def two_rank_aucs():
    """One 2-process gloo job scores every case (starting processes dominates the cost)."""
    return run_gloo(2, _auc_worker, CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_global_auc_two_ranks_equals_sklearn(name: str, two_rank_aucs) -> None:
    case = CASES[name]
    got = [r[name] for r in two_rank_aucs]
    p = [x for ps, _ in case for x in ps]
    y = [x for _, ys in case for x in ys]
    want = roc_auc_score(y, p)
    assert got[0] == got[1]  # the same value on every rank
    assert got[0] == pytest.approx(want, abs=1e-7)
    if case is HALF_AND_HALF:
        assert got[0] == pytest.approx(0.75, abs=1e-7)


def _acc_worker(rank: int, world: int, seed: int):
    g = torch.Generator().manual_seed(seed + rank)
    n = 3000 if rank == 0 else 500
    logits = torch.randn(n, generator=g)
    labels = (torch.rand(n, generator=g) < torch.sigmoid(logits)).float()
    weight = torch.ones(n)
    weight[-2:] = 0  # padding rows must not count
    out = {}
    for method in ("exact", "histogram"):
        acc = EvalAccumulator(torch.device("cpu"), method)
        acc.update(logits[:20], labels[:20], weight[:20])
        acc.update(logits[20:], labels[20:], weight[20:])
        out[method] = acc.compute()
    return out, logits[weight > 0], labels[weight > 0]


def test_eval_accumulator_matches_sklearn_and_ignores_padding() -> None:
    out = run_gloo(2, _acc_worker, 7)
    probs = torch.sigmoid(torch.cat([o[1] for o in out])).double().numpy()
    labels = torch.cat([o[2] for o in out]).numpy()
    ctr = labels.mean()
    entropy = -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
    for res_by_method, _, _ in out:
        for method, res in res_by_method.items():
            assert res["samples"] == 2998 + 498
            tol = 1e-7 if method == "exact" else 1e-4
            assert res["auc"] == pytest.approx(roc_auc_score(labels, probs), abs=tol), method
            assert res["logloss"] == pytest.approx(log_loss(labels, probs), rel=1e-6)
            assert res["ne"] == pytest.approx(log_loss(labels, probs) / entropy, rel=1e-6)
            assert res["accuracy"] == pytest.approx(((probs >= 0.5) == labels).mean(), rel=1e-12)
            # float32 sigmoid differs in the last bit between vectorised and scalar paths: rel 1e-6
            assert res["calibration"] == pytest.approx(probs.mean() / ctr, rel=1e-6)
    assert out[0][0] == out[1][0]  # every rank reports the same numbers


@pytest.mark.parametrize("dist_name", ["ctr_3pct", "uniform", "coarse_ties"])
def test_histogram_auc_within_1e4_of_sklearn_on_a_million_rows(dist_name: str) -> None:
    g = np.random.default_rng(0)
    n = 1_000_000
    if dist_name == "ctr_3pct":  # clustered near a small CTR, as on Criteo 1TB
        p = 1 / (1 + np.exp(-g.normal(-3.5, 1.0, n)))
    elif dist_name == "uniform":
        p = g.random(n)
    else:
        p = np.round(g.random(n), 2)
    y = (g.random(n) < p).astype(np.int64)
    p32 = p.astype(np.float32)
    h = AUCHistogram(torch.device("cpu"))
    for chunk in np.array_split(np.arange(n), 7):  # several updates, as in an evaluation loop
        h.update(torch.from_numpy(p32[chunk]), torch.from_numpy(y[chunk]))
    auc = h.compute()
    assert abs(auc - roc_auc_score(y, p32)) <= 1e-4
    assert abs(auc - roc_auc_score(y, p32)) <= h.bound  # its own bound holds on every distribution


def test_histogram_auc_bound_is_half_the_pairs_sharing_a_bucket() -> None:
    """Positives 0.3 and 0.5 against negatives 0.5 and 0.1: one of the 4 pairs shares a bucket, so AUC
    (0 + 1 + 0.5 + 1) / 4 and bound 0.5 / 4; a positive one float32 step above its negative shares its bucket and
    is scored one half where sklearn counts 1, exactly the bound away."""
    h = AUCHistogram(torch.device("cpu"))
    h.update(torch.tensor([0.3, 0.5, 0.5, 0.1]), torch.tensor([1, 1, 0, 0]))
    assert (h.compute(), h.bound) == (0.625, 0.125)
    p = torch.tensor([np.nextafter(np.float32(0.5), np.float32(1)), 0.5], dtype=torch.float32)
    h = AUCHistogram(torch.device("cpu"))
    h.update(p, torch.tensor([1, 0]))
    assert (h.compute(), h.bound, roc_auc_score([1, 0], p.numpy())) == (0.5, 0.5, 1.0)
    acc = EvalAccumulator(torch.device("cpu"), "exact")
    acc.update(torch.logit(p), torch.tensor([1.0, 0.0]))
    assert acc.compute()["auc_bound"] == 0.0


def test_single_class_auc_is_nan() -> None:
    assert math.isnan(global_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1])))


def test_auc_with_ties_single_process() -> None:
    rng = np.random.default_rng(0)
    p = rng.integers(0, 5, 1000) / 4.0  # many ties
    y = rng.integers(0, 2, 1000)
    assert global_auc(torch.tensor(p), torch.tensor(y)) == pytest.approx(roc_auc_score(y, p), abs=1e-6)


# ----------------------------------------------------------------------------- sync-free, shape-static updates
class _HostReads(TorchFunctionMode):
    """Records the calls that make the host wait for the device: a value read back (``item``, ``float()``,
    ``bool()``), or an output whose shape depends on the values (a boolean-mask index, ``nonzero``, ``bincount``,
    ``masked_select``, ``unique``)."""

    READS = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.__bool__,
        torch.Tensor.__float__,
        torch.Tensor.__int__,
        torch.Tensor.nonzero,
        torch.nonzero,
        torch.Tensor.bincount,
        torch.bincount,
        torch.Tensor.masked_select,
        torch.masked_select,
        torch.Tensor.unique,
        torch.unique,
    }

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        index = args[1] if func is torch.Tensor.__getitem__ and len(args) > 1 else None
        masks = index if isinstance(index, tuple) else (index,)
        if func in self.READS or any(isinstance(m, torch.Tensor) and m.dtype == torch.bool for m in masks):
            self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _padded_batches():
    """Three batches of 6 rows, the last 2 of each padding (weight 0) with NaN or infinite logits: the first's
    real rows all positive, the second's all negative, the third's mixed; and the real rows' logits and labels."""
    g = torch.Generator().manual_seed(3)
    batches = []
    for labels in ([1.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 1.0]):
        logits = torch.cat([torch.randn(4, generator=g), torch.tensor([float("nan"), float("inf")])])
        batches.append((logits, torch.tensor(labels + [1.0, 0.0]), torch.tensor([1.0] * 4 + [0.0] * 2)))
    real = [(lg[:4], y[:4]) for lg, y, _ in batches]
    return batches, torch.cat([lg for lg, _ in real]), torch.cat([y for _, y in real])


@pytest.mark.parametrize("method", ["exact", "histogram"])
def test_update_reads_nothing_back_from_the_device(method: str) -> None:
    """No call in an update waits for the device (on CUDA each would be a device-to-host sync per batch)."""
    acc = EvalAccumulator(torch.device("cpu"), method)
    batches, _, _ = _padded_batches()
    with _HostReads() as reads:
        for batch in batches:
            acc.update(*batch)
    assert reads.calls == []


@pytest.mark.parametrize("method", ["exact", "histogram"])
def test_padding_rows_and_one_class_batches_count_as_sklearn(method: str) -> None:
    """Padding rows (NaN and infinite logits, weight 0) do not count; batches of one class each still give the AUC
    of all rows; every metric equals the one of the real rows alone."""
    batches, logits, labels = _padded_batches()
    acc = EvalAccumulator(torch.device("cpu"), method)
    for batch in batches:
        acc.update(*batch)
    res = acc.compute()
    alone = EvalAccumulator(torch.device("cpu"), method)
    alone.update(logits, labels)
    want = alone.compute()
    probs = torch.sigmoid(logits).double().numpy()
    assert res["samples"] == 12 and res["ctr"] == 0.5
    assert res["auc"] == want["auc"] == pytest.approx(roc_auc_score(labels.numpy(), probs), abs=1e-7)
    assert res["logloss"] == pytest.approx(want["logloss"], rel=1e-12)  # the sum's order may differ
    assert res["logloss"] == pytest.approx(log_loss(labels.numpy(), probs), rel=1e-6)  # float32 sigmoid
    assert {k: v for k, v in res.items() if k != "logloss"} == {k: v for k, v in want.items() if k != "logloss"}


def test_one_class_over_all_batches_is_undefined() -> None:
    batches, _, _ = _padded_batches()
    acc = EvalAccumulator(torch.device("cpu"), "histogram")
    acc.update(*batches[0])
    acc.update(*batches[0])
    res = acc.compute()
    assert math.isnan(res["auc"]) and res["auc_undefined"] == "no negative labels among 8 rows"


def test_nan_prediction_raises_at_compute_not_at_update() -> None:
    logits = torch.tensor([0.5, float("nan"), -float("nan"), -1.0])
    acc = EvalAccumulator(torch.device("cpu"), "histogram")
    acc.update(logits, torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    with pytest.raises(RuntimeError, match=r"^histogram AUC: 2 predicted probabilities are NaN"):
        acc.compute()
    h = AUCHistogram(torch.device("cpu"))
    h.update(torch.tensor([0.25, float("nan")]), torch.tensor([1, 0]), torch.tensor([1.0, 0.0]))
    assert h.compute() != h.compute()  # a padding row's NaN is not counted: one class only, NaN AUC


def test_histogram_buckets_are_the_float32_bits_without_the_low_10() -> None:
    """Counts per bucket equal numpy's bincount of the bit patterns >> 10; -0.0 and values past [0, 1] land in
    the end buckets."""
    g = np.random.default_rng(1)
    p = np.concatenate([g.random(5000).astype(np.float32), np.float32([-0.0, 0.0, 1.0, 1.5, -0.5])])
    y = g.integers(0, 2, p.size)
    h = AUCHistogram(torch.device("cpu"))
    h.update(torch.from_numpy(p), torch.from_numpy(y))
    keys = np.clip(p, 0, 1).view(np.int32) >> 10
    keys[p.size - 5] = 0  # -0.0
    assert np.array_equal(h.pos.numpy(), np.bincount(keys[y == 1], minlength=NUM_BUCKETS))
    assert np.array_equal(h.neg.numpy(), np.bincount(keys[y == 0], minlength=NUM_BUCKETS))
    assert int(h.nans[0]) == 0


@pytest.mark.gpu
def test_update_does_not_sync_the_device() -> None:
    """Under torch's sync debug mode ``error`` a device-to-host sync raises; the counts equal the CPU's."""
    dev = torch.device("cuda")
    batches, _, _ = _padded_batches()
    cuda = [tuple(t.to(dev) for t in b) for b in batches]
    accs = {m: EvalAccumulator(dev, m) for m in ("exact", "histogram")}
    for acc in accs.values():
        acc.update(*cuda[0])  # first calls: lazy initialisation outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for acc in accs.values():
            for batch in cuda[1:]:
                acc.update(*batch)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    cpu = EvalAccumulator(torch.device("cpu"), "histogram")
    for lg, y, w in cuda:
        p = torch.sigmoid(lg)
        cpu.hist.update(p.cpu(), y.cpu(), w.cpu())
    accs["histogram"].hist.compute()
    assert torch.equal(accs["histogram"].hist.counts.cpu(), cpu.hist.counts)
    assert accs["exact"].compute()["samples"] == 12


@pytest.mark.gpu
def test_histogram_update_replays_in_a_cuda_graph() -> None:
    """The histogram accumulator's update captured in a CUDA graph and replayed over three batches counts what
    three eager updates count."""
    dev = torch.device("cuda")
    batches, _, _ = _padded_batches()
    static = [t.to(dev) for t in batches[0]]
    graphed, eager = EvalAccumulator(dev, "histogram"), EvalAccumulator(dev, "histogram")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture
        EvalAccumulator(dev, "histogram").update(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.update(*static)
    graphed.sums.zero_()
    graphed.hist.reset()
    for batch in batches:
        for buf, t in zip(static, batch):
            buf.copy_(t)
        graph.replay()
        eager.update(*(t.to(dev) for t in batch))
    assert torch.equal(graphed.sums, eager.sums)
    assert torch.equal(graphed.hist.counts, eager.hist.counts)
    assert graphed.compute() == eager.compute()
