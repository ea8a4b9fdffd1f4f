"""Logistic-regression baseline on the trainer's own rows and features: the bar a DLRM recipe should clear.

    python data/linear_baseline.py data.train_path=train_head10k.tsv            # C by cross-validation
    python data/linear_baseline.py data.train_path=train_head10k.tsv --C 0.03   # a fixed C
    python data/linear_baseline.py data.train_path=train_head10k.tsv data.max_rows=6400 model.row_cap=500

Arguments are the trainer's Hydra overrides, after ``experiment=criteo_sample`` unless they name an experiment
(``experiment=<name>``, or ``~experiment`` for none), so the rows are the ones ``python train.py`` with the same
overrides trains and validates on: the splits come from ``dlrm.data.load_splits`` (``data.train_path``,
``data.val_fraction``, ``data.max_rows``, ``data.val_path``).
The features are the trainer's: the 13 dense features as it transforms them (``log(x + 1)``, missing or negative:
0) and a one-hot column per table row for the 26 categorical ones, each hashed to its table id as the trainer
does (``int(hex, 16) % rows``, the rows after ``model.row_cap``; the ids ``data.min_id_count`` finds rare in
training, 3 in the recipe, on row 0). Rows that no training row uses get no column
(:func:`design_matrices`). With ``data.multi_hot=true`` the columns are still the 1-hot ids, not the MLPerf
expansion's extra ids (a fixed function of them).

The model is scikit-learn's ``LogisticRegression``: an L2 penalty on the weights, an unpenalised intercept.
Without ``--C``, the inverse penalty C is chosen on the training rows alone, by the mean ``roc_auc_score`` of a
stratified k-fold cross-validation (``--folds``, shuffled with seed 0) over ``--Cs``; the validation rows are
scored once, by the model refitted on every training row. Prints each C's cross-validation AUC, then
``validation AUC <auc>``: ``sklearn.metrics.roc_auc_score``, as the trainer's exact ``val_auc`` (ties count one
half). A bad override, file or row, training or validation rows of one label, or more ``--folds`` than training
rows of the rarer label: one ``error:`` line naming it, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np

try:
    import scipy.sparse as sp
    import sklearn  # noqa: F401
except ImportError:  # scikit-learn (and scipy with it) comes with requirements.txt and the dev extra only
    print(
        "error: data/linear_baseline.py needs scikit-learn: pip install scikit-learn==1.9.1 (or the dev extra, "
        "pip install -e '.[dev]')",
        file=sys.stderr,
    )
    sys.exit(2)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlrm.config import DataConfig, compose, error_line, to_config  # noqa: E402
from dlrm.errors import ConfigError, InputError  # noqa: E402

# Candidate C values, 10^-3 .. 10^1 in steps of 10^0.5: from "the prior dominates" to "barely regularised".
DEFAULT_CS = [float(c) for c in np.logspace(-3, 1, 9)]


def design_matrices(
    train: Tuple[np.ndarray, np.ndarray], val: Tuple[np.ndarray, np.ndarray], table_rows: Sequence[int]
) -> Tuple[sp.csr_matrix, sp.csr_matrix]:
    """The trainer's features of the training and validation rows as sparse matrices.

    Args:
        train, val: ``(dense, ids)`` of each split: ``dense`` float ``[N, 13]``, the transformed dense features
            (``Split.dense``); ``ids`` int64 ``[N, T]``, one row id per table, ``0 <= ids[:, t] < table_rows[t]``
            (``Split.ids``).
        table_rows: rows of each of the ``T`` tables.

    Returns:
        float64 CSR ``[N, 13 + K]`` for each split: ``dense``, then a one-hot column for each of the ``K``
        (table, row) pairs that occur in the training rows. A pair never seen in training gets no column: its
        L2-penalised weight would be 0 at the optimum, so the fit and the scores equal those with a column for
        every table row, at a size that does not grow with ``model.row_cap``.

    Raises:
        ValueError: an id is outside its table, or ``ids`` has not one column per table.
    """
    rows = np.asarray(table_rows, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])

    def keys(ids: np.ndarray) -> np.ndarray:
        if ids.shape[1] != rows.shape[0]:
            raise ValueError(f"{ids.shape[1]} id columns but {rows.shape[0]} tables")
        if ids.size and ((ids < 0).any() or (ids >= rows[None, :]).any()):
            raise ValueError("an id is outside its table's rows")
        return ids + offsets[None, :]

    vocab = np.unique(keys(train[1]))

    def matrix(dense: np.ndarray, ids: np.ndarray) -> sp.csr_matrix:
        k = keys(ids)
        col = np.minimum(np.searchsorted(vocab, k), len(vocab) - 1)
        seen = vocab[col] == k
        r = np.broadcast_to(np.arange(k.shape[0])[:, None], k.shape)
        onehot = sp.csr_matrix(
            (np.ones(int(seen.sum())), (r[seen], col[seen])), shape=(k.shape[0], len(vocab)), dtype=np.float64
        )
        return sp.hstack([sp.csr_matrix(np.asarray(dense, dtype=np.float64)), onehot], format="csr")

    return matrix(*train), matrix(*val)


def _load(overrides: Sequence[str]) -> Tuple[DataConfig, sp.csr_matrix, np.ndarray, sp.csr_matrix, np.ndarray]:
    """The data config and :func:`load_features`' matrices and labels (raises as it does)."""
    from dlrm.data import Split, load_splits

    args = list(overrides)
    if not any(a.lstrip("+~").partition("=")[0] == "experiment" for a in args):  # experiment=..., ~experiment
        args.insert(0, "experiment=criteo_sample")
    cfg = to_config(compose(args))
    if cfg.data.name == "criteo_binary":
        raise ConfigError(
            "config key `data.name`: the baseline reads rows held in memory; use data=criteo_tsv "
            "data.train_path=<file> (data.max_rows caps the rows)"
        )
    train, val, _ = load_splits(cfg.data, cfg.model, cfg.seed)
    assert isinstance(train, Split) and isinstance(val, Split)
    x_tr, x_va = design_matrices(
        (train.dense.numpy(), train.ids.numpy()), (val.dense.numpy(), val.ids.numpy()), cfg.model.table_rows
    )
    return cfg.data, x_tr, train.labels.numpy().astype(np.int64), x_va, val.labels.numpy().astype(np.int64)


def load_features(overrides: Sequence[str]) -> Tuple[sp.csr_matrix, np.ndarray, sp.csr_matrix, np.ndarray]:
    """``(X_train, y_train, X_val, y_val)`` of the run that ``python train.py <overrides>`` would do.

    ``X_*`` are :func:`design_matrices` outputs, ``y_*`` int64 ``[N]`` labels 0/1.

    Raises:
        ConfigError: a bad override, or ``data=criteo_binary`` (not held in memory; use ``data=criteo_tsv``).
        InputError, FileNotFoundError: as ``python train.py`` raises them for the data files.
    """
    return _load(overrides)[1:]


def check_labels(data: DataConfig, y_tr: np.ndarray, y_va: np.ndarray, folds: Optional[int]) -> None:
    """Refuse labels the fit, the cross-validation or the AUC cannot use: training or validation rows of one
    label (no model to fit; AUC undefined), or more folds than the training rows of the rarer label (stratified
    k-fold puts at least one of each label in every fold). ``folds`` None: no cross-validation (``--C`` given).

    Raises:
        InputError: naming the rows' source (config key) or ``--folds``, and the fix.
    """
    n_tr, n_va = len(y_tr), len(y_va)
    if data.name == "criteo_tsv":
        train_src = f"config key `data.train_path`: the {n_tr:,} training rows of {data.train_path!r}"
        if data.val_path:
            val_src, val_fix = f"config key `data.val_path`: the {n_va:,} rows of {data.val_path!r}", "another file"
        else:
            val_src = (
                f"config key `data.train_path`: the {n_va:,} validation rows of {data.train_path!r} "
                f"(rows {n_tr + 1:,}-{n_tr + n_va:,})"
            )
            val_fix = "data.val_path, or more rows (data.max_rows, data.val_fraction)"
        train_fix = "more rows (a larger data.max_rows, if set) or another file"
    else:
        train_src = f"config key `data.name` ({data.name}): the {n_tr:,} training rows"
        val_src = f"config key `data.name` ({data.name}): the {n_va:,} validation rows"
        train_fix = val_fix = "more rows"
    for src, y, what, fix in (
        (train_src, y_tr, "the logistic regression needs", train_fix),
        (val_src, y_va, "the validation AUC needs", val_fix),
    ):
        if y.size and y.min() == y.max():
            raise InputError(f"{src} all have label {int(y[0])}; {what} clicks (1) and non-clicks (0): give {fix}")
    rare = min(int(y_tr.sum()), n_tr - int(y_tr.sum()))
    if folds is not None and folds > rare:
        raise InputError(
            f"--folds {folds}: the training rows hold {int(y_tr.sum()):,} clicks and {n_tr - int(y_tr.sum()):,} "
            f"non-clicks, and stratified {folds}-fold cross-validation needs at least {folds} of each; give --folds "
            + (f"{rare} or fewer" if rare >= 2 else "2 and more rows")
            + ", or --C <value> to skip the cross-validation"
        )


def make_model(c: float):
    """An unfitted ``LogisticRegression(C=c)``: L2 on the weights, unpenalised intercept. newton-cg: on
    these one-hot columns beside unscaled dense features it converges in about 10 iterations where lbfgs takes
    hundreds."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, solver="newton-cg", max_iter=1000)


def cv_auc(x: sp.csr_matrix, y: np.ndarray, cs: Sequence[float], folds: int) -> List[float]:
    """Mean ``roc_auc_score`` over stratified ``folds``-fold cross-validation (shuffled, seed 0) of each C."""
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=0)
    return [float(cross_val_score(make_model(c), x, y, scoring="roc_auc", cv=split).mean()) for c in cs]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python data/linear_baseline.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="the trainer's Hydra overrides")
    p.add_argument("--C", type=float, default=None, help="inverse L2 strength (default: chosen by cross-validation)")
    p.add_argument("--Cs", type=float, nargs="+", default=DEFAULT_CS, help="candidate C values (default: 1e-3 .. 10)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds of the training rows (default: 5)")
    args = p.parse_intermixed_args(argv)
    bad = None
    if args.C is not None and args.C <= 0:
        bad = f"--C {args.C:g}: give a positive C (the inverse L2 strength)"
    elif min(args.Cs) <= 0:
        bad = f"--Cs {' '.join(f'{c:g}' for c in args.Cs)}: give positive C values"
    elif args.folds < 2:
        bad = f"--folds {args.folds}: give 2 or more folds (default 5)"
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from sklearn.metrics import roc_auc_score

    t0 = time.perf_counter()
    try:
        data, x_tr, y_tr, x_va, y_va = _load(args.overrides)
        check_labels(data, y_tr, y_va, args.folds if args.C is None else None)
    except (InputError, FileNotFoundError, ValueError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 2
    print(f"{x_tr.shape[0]:,} training rows, {x_va.shape[0]:,} validation rows, {x_tr.shape[1]:,} columns")
    c, how = args.C, "given"
    if c is None:
        scores = cv_auc(x_tr, y_tr, args.Cs, args.folds)
        for ci, score in zip(args.Cs, scores):
            print(f"C={ci:<8.4g} {args.folds}-fold CV AUC of the training rows {score:.4f}")
        c, how = args.Cs[int(np.argmax(scores))], f"by {args.folds}-fold CV of the training rows"
    model = make_model(c).fit(x_tr, y_tr)
    auc = roc_auc_score(y_va, model.predict_proba(x_va)[:, 1])
    print(f"validation AUC {auc:.4f} (C={c:.4g}, {how}; {time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
