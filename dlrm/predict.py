"""Score a split with an exported model (``python -m dlrm.export``) and write one prediction per row::

    python -m dlrm.predict model.pt preds.tsv data=criteo_tsv data.train_path=train.txt data.test_path=test.txt
    python -m dlrm.predict model.pt preds.tsv --split val data=criteo_binary data.dataset_dir=/data/bin

The data is described with the training's config keys (``data.*``, ``seed``; Hydra overrides as for
``train.py``), so the split is cut, hashed and transformed exactly as the training cut it; the model config
comes from the model file. ``OUT`` is a TSV with a header line ``label<TAB>probability`` and one line per row of
the split, in order: the row's label (0 or 1) and the predicted click probability (``sigmoid(logit)``, float32
written with 9 significant digits, so it reads back exactly). Its AUC (``sklearn.metrics.roc_auc_score``) is the
trainer's ``test_auc`` (``val_auc``) of the same model and split. Runs on the CPU, one process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Optional, Sequence

import torch

from dlrm.config import compose, error_line, to_config
from dlrm.errors import InputError
from dlrm.writable import output_file_problem, report_unwritable


def predict(model: torch.nn.Module, split, batch_size: int, multi_hot) -> tuple:  # type: ignore[no-untyped-def]
    """Labels and probabilities of every row of ``split`` in order: two float32 tensors ``[rows]``.

    ``model`` is a ``DLRMTrain`` (:func:`dlrm.export.load_model`); ``split`` one of
    :func:`dlrm.data.load_splits`; ``multi_hot`` :func:`dlrm.data.make_multi_hot`'s expander (None: one-hot).
    """
    from dlrm import data as data_mod
    from dlrm.model import FEATURE_NAMES

    labels, probs = [], []
    with torch.no_grad():
        for batch, weight in data_mod.eval_batches(
            split, batch_size=batch_size, rank=0, world_size=1, feature_names=FEATURE_NAMES, multi_hot=multi_hot
        ):
            _, out = model(batch)
            keep = weight > 0  # padding of the last batch
            probs.append(torch.sigmoid(out[1].detach().float().reshape(-1))[keep])  # as the trainer's evaluation
            labels.append(out[2].detach().float().reshape(-1)[keep])
    return torch.cat(labels), torch.cat(probs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dlrm.predict MODEL OUT [--split test|val|train] [--batch-size N] [OVERRIDES...]``; returns the
    exit status: 0, or 2 after one ``error:`` line on stderr when ``OUT`` cannot or must not be written (checked
    first), ``MODEL`` is not a model file of ``dlrm.export``, the overrides do not compose, the data cannot be
    read, or the split is empty (``data.num_test_samples=0`` / no test file)."""
    ap = argparse.ArgumentParser(
        prog="python -m dlrm.predict",
        description="Score a split with a model file of python -m dlrm.export; write its label and probability "
        "per row (TSV). The data is described as for train.py (data.* and seed overrides).",
    )
    ap.add_argument("model", help="a model file written by python -m dlrm.export")
    ap.add_argument("out", help="the predictions TSV to write (label, probability)")
    ap.add_argument("--split", choices=("test", "val", "train"), default="test", help="split to score (test)")
    ap.add_argument("--batch-size", type=int, default=8192, help="rows per forward (default 8192)")
    ap.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    ap.add_argument("overrides", nargs="*", help="data.* and seed, as given to train.py for the training")
    args = ap.parse_args(argv)
    if args.batch_size < 1:
        print(f"error: --batch-size {args.batch_size}: give a number of rows >= 1", file=sys.stderr)
        return 2
    why = output_file_problem(args.out, overwrite=args.force)
    if why is not None:
        print(f"error: OUT {args.out!r}: {why}; pass another path (or --force)", file=sys.stderr)
        return 2
    try:
        from dlrm import data as data_mod
        from dlrm.cli import check_overrides
        from dlrm.export import load_model

        check_overrides(args.overrides)  # a misspelt key or a bad value: one line
        model = load_model(args.model)
        cfg = to_config(compose(list(args.overrides)))
        cfg.model = model.model_config  # type: ignore[assignment]
        splits = dict(zip(("train", "val", "test"), data_mod.load_splits(cfg.data, cfg.model, cfg.seed)))
        split = splits[args.split]
        if split is None or len(split) == 0:
            raise InputError(f"the {args.split} split is empty; give data.* keys that make one (e.g. a test file)")
        labels, probs = predict(model, split, args.batch_size, data_mod.make_multi_hot(cfg.data, cfg.model))
    except (InputError, FileNotFoundError) as e:
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 2
    tmp = args.out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("label\tprobability\n")
            for y, p in zip(labels.tolist(), probs.tolist()):
                f.write(f"{int(y)}\t{p:.9g}\n")
        os.replace(tmp, args.out)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        return report_unwritable("OUT", args.out, e.strerror)
    print(f"{args.model}: {len(probs):,} {args.split} rows scored -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
