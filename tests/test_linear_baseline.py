"""data/linear_baseline.py: the trainer's rows and hashed ids, and sklearn's fit and AUC of them."""

from __future__ import annotations

import collections
import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.preprocessing import OneHotEncoder

from conftest import KAGGLE_SAMPLE, REPO, needs_kaggle
from dlrm.config import compose, to_config

spec = importlib.util.spec_from_file_location("linear_baseline", REPO / "data" / "linear_baseline.py")
lb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lb)


def _reference_features(path: Path, table_rows, n_train: int, min_count: int):
    """The documented features, computed from the file by hand: ``log(max(x, 0) + 1)`` in float32 (missing: 0),
    ``int(hex, 16) % rows`` (missing: 0), ids seen fewer than ``min_count`` times in training as 0, one-hot by
    sklearn over the ids seen in training."""
    labels, dense, ids = [], [], []
    for line in path.read_text().splitlines():
        f = line.split("\t")
        labels.append(int(f[0]))
        dense.append([math.log1p(max(int(v), 0)) if v else 0.0 for v in f[1:14]])
        ids.append([int(v, 16) % r if v else 0 for v, r in zip(f[14:], table_rows)])
    y, ids = np.array(labels), np.array(ids)
    for t in range(ids.shape[1]):
        counts = collections.Counter(ids[:n_train, t].tolist())
        ids[:, t] = [v if counts[v] >= min_count else 0 for v in ids[:, t].tolist()]
    dense = np.array(dense).astype(np.float32).astype(np.float64)
    enc = OneHotEncoder(handle_unknown="ignore").fit(ids[:n_train])

    def x(s: slice) -> sp.csr_matrix:
        return sp.hstack([sp.csr_matrix(dense[s]), enc.transform(ids[s])], format="csr")

    return x(slice(0, n_train)), y[:n_train], x(slice(n_train, None)), y[n_train:]


@needs_kaggle
def test_real_rows_match_the_trainer_split_and_sklearn(capsys: pytest.CaptureFixture) -> None:
    """Rows 1-8,000 train, 8,001-10,000 validate, with the recipe's table rows; C chosen by 2-fold CV over two
    values; every printed AUC equals sklearn's on matrices built here from the file."""
    cfg = to_config(compose(["experiment=criteo_sample", "data.train_path=x.tsv"]))
    assert cfg.data.min_id_count == 3
    x_tr, y_tr, x_va, y_va = lb.load_features([f"data.train_path={KAGGLE_SAMPLE}"])
    r_tr, ry_tr, r_va, ry_va = _reference_features(KAGGLE_SAMPLE, cfg.model.table_rows, 8000, 3)
    assert x_tr.shape == r_tr.shape and x_va.shape == r_va.shape == (2000, r_tr.shape[1])
    assert (x_tr != r_tr).nnz == 0 and (x_va != r_va).nnz == 0
    np.testing.assert_array_equal(y_tr, ry_tr)
    np.testing.assert_array_equal(y_va, ry_va)

    cs = [0.01, 0.1]
    assert lb.main([f"data.train_path={KAGGLE_SAMPLE}", "--Cs", *map(str, cs), "--folds", "2"]) == 0
    out = capsys.readouterr().out
    assert "8,000 training rows, 2,000 validation rows" in out
    cv = StratifiedKFold(n_splits=2, shuffle=True, random_state=0)
    ref = [
        cross_val_score(LogisticRegression(C=c, solver="newton-cg"), r_tr, ry_tr, scoring="roc_auc", cv=cv).mean()
        for c in cs
    ]
    printed = [float(v) for v in re.findall(r"2-fold CV AUC of the training rows (\S+)", out)]
    assert printed == [round(v, 4) for v in ref]
    best = cs[int(np.argmax(ref))]
    auc = roc_auc_score(
        ry_va, LogisticRegression(C=best, solver="newton-cg").fit(r_tr, ry_tr).predict_proba(r_va)[:, 1]
    )
    assert f"validation AUC {auc:.4f} (C={best:.4g}, by 2-fold CV of the training rows;" in out


def test_columns_of_unseen_rows_change_no_prediction() -> None:
    """Leaving out the columns of table rows no training row uses gives the predictions of the full one-hot."""
    g = np.random.default_rng(0)
    rows = [5, 400, 3]
    ids = np.stack([g.integers(0, r, 300) for r in rows], axis=1)
    dense = g.random((300, 13)).astype(np.float32)
    y = (g.random(300) < 0.3).astype(np.int64)
    x_tr, x_va = lb.design_matrices((dense[:200], ids[:200]), (dense[200:], ids[200:]), rows)
    assert x_tr.shape[1] == 13 + len({(t, i) for t in range(3) for i in ids[:200, t]}) < 13 + sum(rows)
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])

    def full(s: slice) -> sp.csr_matrix:
        n = ids[s].shape[0]
        onehot = sp.csr_matrix(
            (np.ones(n * 3), (np.repeat(np.arange(n), 3), (ids[s] + offsets).ravel())), (n, sum(rows))
        )
        return sp.hstack([sp.csr_matrix(dense[s].astype(np.float64)), onehot], format="csr")

    compact = lb.make_model(0.1).fit(x_tr, y[:200]).predict_proba(x_va)[:, 1]
    whole = lb.make_model(0.1).fit(full(slice(0, 200)), y[:200]).predict_proba(full(slice(200, None)))[:, 1]
    np.testing.assert_allclose(compact, whole, atol=1e-5)


def test_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert lb.main([f"data.train_path={tmp_path / 'missing.tsv'}", "--C", "0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: config key `data.train_path`: no such file"), err
    assert lb.main(["data=criteo_binary", "data.dataset_dir=d", "data.min_id_count=0"]) == 2
    assert "error: config key `data.name`: the baseline reads rows held in memory" in capsys.readouterr().err
    assert lb.main(["data.max_rows=many"]) == 2  # Hydra's error, with the OmegaConf cause that says what is wrong
    assert capsys.readouterr().err == (
        "error: Error merging override data.max_rows=many (Value 'many' of type 'str' could not be converted to "
        "Integer)\n"
    )


def _tsv(path: Path, labels) -> Path:
    """Criteo-shaped lines with the given labels (dense counts and hex ids drawn at random)."""
    g = np.random.default_rng(0)
    lines = []
    for y in labels:
        ints = [str(int(v)) for v in g.integers(0, 50, 13)]
        cats = [format(int(v), "x") for v in g.integers(0, 2**32, 26)]
        lines.append("\t".join([str(int(y))] + ints + cats))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "labels,args,line",
    [
        (
            [0] * 200,
            ["--C", "0.03"],
            "config key `data.train_path`: the 160 training rows of '{path}' all have label 0; the logistic "
            "regression needs clicks (1) and non-clicks (0): give more rows (a larger data.max_rows, if set) or "
            "another file",
        ),
        (
            [0, 1] * 80 + [1] * 40,
            ["--C", "0.03"],
            "config key `data.train_path`: the 40 validation rows of '{path}' (rows 161-200) all have label 1; the "
            "validation AUC needs clicks (1) and non-clicks (0): give data.val_path, or more rows (data.max_rows, "
            "data.val_fraction)",
        ),
        (
            [1] * 10 + [0] * 150 + [0, 1] * 20,
            ["--folds", "11", "--Cs", "0.03"],
            "--folds 11: the training rows hold 10 clicks and 150 non-clicks, and stratified 11-fold "
            "cross-validation needs at least 11 of each; give --folds 10 or fewer, or --C <value> to skip the "
            "cross-validation",
        ),
        (
            [0, 1] * 100,
            ["--folds", "5000", "--Cs", "0.03"],
            "--folds 5000: the training rows hold 80 clicks and 80 non-clicks, and stratified 5000-fold "
            "cross-validation needs at least 5000 of each; give --folds 80 or fewer, or --C <value> to skip the "
            "cross-validation",
        ),
        ([0, 1] * 100, ["--folds", "1"], "--folds 1: give 2 or more folds (default 5)"),
        ([0, 1] * 100, ["--C", "-1"], "--C -1: give a positive C (the inverse L2 strength)"),
    ],
)
def test_labels_and_folds_it_cannot_use_are_one_error_line(
    labels, args, line: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Rows of one label (no fit, no AUC) and more folds than the rarer label's training rows are refused before
    any fit, naming the rows' source or --folds."""
    path = _tsv(tmp_path / "t.tsv", labels)
    assert lb.main([f"data.train_path={path}", *args]) == 2
    assert capsys.readouterr().err == f"error: {line.format(path=path)}\n"


def test_one_label_validation_file_names_data_val_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    train, val = _tsv(tmp_path / "t.tsv", [0, 1] * 50), _tsv(tmp_path / "v.tsv", [0] * 30)
    assert lb.main([f"data.train_path={train}", f"data.val_path={val}", "--C", "0.03"]) == 2
    assert capsys.readouterr().err == (
        f"error: config key `data.val_path`: the 30 rows of '{val}' all have label 0; the validation AUC needs "
        "clicks (1) and non-clicks (0): give another file\n"
    )
