"""Export a trained run's checkpoint, load it with one call and score its test split with ``python -m dlrm.predict``.

.venv/bin/python -m pytest -q tests/test_predict.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_train_e2e import records, run

DATA = ["data.num_train_samples=2048", "data.num_val_samples=256", "data.num_test_samples=1000", "seed=7"]


def test_predictions_of_the_export_score_the_trainers_test_auc(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The AUC of the written predictions (sklearn) is the test AUC the trainer logged for the same step; an OUT
    that exists and a file that is not a model are one ``error:`` line each, exit 2."""
    from sklearn.metrics import roc_auc_score

    from dlrm.export import main as export_main
    from dlrm.predict import main as predict_main

    d = tmp_path / "run"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            *DATA,
            "data.batch_size=64",
            "trainer.max_steps=12",
            "eval.every_n_steps=null",
            "eval.at_end=true",
            "logger.train_auc=false",
            "checkpoint.every_n_steps=12",
            "checkpoint.async_save=false",
        ]
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (test_auc,) = [r["test_auc"] for r in records(d) if "test_auc" in r]
    model, preds = tmp_path / "model.pt", tmp_path / "preds.tsv"
    assert export_main([str(d / "checkpoints"), str(model)]) == 0
    assert predict_main([str(model), str(preds), *DATA]) == 0
    lines = preds.read_text().splitlines()
    assert lines[0] == "label\tprobability" and len(lines) == 1001
    labels, probs = zip(*((int(a), float(b)) for a, b in (line.split("\t") for line in lines[1:])))
    auc = roc_auc_score(labels, probs)
    # the trainer's AUC (torchmetrics on float32 probabilities) is a float32: equal at that precision
    assert np.float32(auc) == np.float32(test_auc), (auc, test_auc)
    capsys.readouterr()
    assert predict_main([str(model), str(preds), *DATA]) == 2  # OUT exists: kept without --force
    assert "already exists" in capsys.readouterr().err
    assert predict_main([str(preds), str(tmp_path / "p2.tsv"), *DATA]) == 2  # not a model file
    assert capsys.readouterr().err.startswith(f"error: {preds}: cannot be read as a model file")
