"""Global AUC and logloss over gloo ranks equal sklearn's on the gathered predictions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from conftest import run_gloo
from dlrm.metrics import AUCHistogram, EvalAccumulator, global_auc

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
