"""Evaluation cadence, early stop at a target AUC, test split, sinks (TensorBoard, wandb offline, MLPerf mllog),
the report CLI, non-finite losses and evaluation splits smaller than the world size; end-to-end through train.py."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_train_e2e import BIN, ENV, one_error_line, records, run

import dlrm.data as D
from conftest import REPO
from dlrm.config import OptimizerConfig, compose, to_config
from dlrm.schedule import lr_at

SMALL = [
    "data.num_train_samples=4096",
    "data.num_val_samples=1024",
    "data.num_test_samples=512",
    "logger.log_every_n_steps=2",
]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    """One run with every sink on, an MLPerf-style eval cadence and an lr schedule."""
    d = tmp_path_factory.mktemp("full") / "run"
    p = subprocess.run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            *SMALL,
            "logger=[stdout,jsonl,tensorboard,wandb,mlperf]",
            "logger.stdout.progress_bar=true",
            "eval.every_n_steps=null",
            "eval.per_epoch=4",
            "optimizer.warmup_steps=4",
            "optimizer.decay_start_step=8",
            "optimizer.decay_steps=4",
        ],
        cwd=REPO,
        env={**ENV, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    (d / "stdout.txt").write_text(p.stdout + p.stderr)
    return d


def test_eval_cadence_test_split_and_metrics(full_run: Path) -> None:
    recs = records(full_run)
    vals = [r for r in recs if "val_auc" in r]
    assert [r["step"] for r in vals] == [4, 8, 12, 16]  # 16 steps/epoch, 4 evaluations per epoch
    tests = [r for r in recs if "test_auc" in r]
    assert len(tests) == 1 and tests[0]["step"] == 16 and tests[0]["test_samples"] == 512
    v = vals[-1]
    cfg = to_config(compose(SMALL))
    ctr = float(D.load_synthetic(cfg.data, cfg.model.table_rows, cfg.seed)[1].labels.mean())
    entropy = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))  # NE's denominator: the CTR's log loss
    assert v["val_ctr"] == pytest.approx(ctr, rel=1e-6)
    assert v["val_ne"] == pytest.approx(v["val_logloss"] / entropy, rel=1e-6)
    assert 0 < v["val_accuracy"] < 1 and v["val_calibration"] > 0
    train = [r for r in recs if "loss" in r]
    assert [r["step"] for r in train] == list(range(2, 17, 2))
    for key in ("train_auc", "samples_per_s", "samples_per_s_per_rank", "step_ms", "peak_mem_gb"):
        assert train[-1][key] > 0, key
    opt = OptimizerConfig(lr=0.01, warmup_steps=4, decay_start_step=8, decay_steps=4)
    assert [r["lr"] for r in train] == pytest.approx([lr_at(r["step"] - 1, 0.01, opt) for r in train])
    out = (full_run / "stdout.txt").read_text()
    assert re.search(r"\d+/16 \[", out), "no tqdm progress bar in the output"
    assert "final validation AUC" in out


def test_tensorboard_and_wandb_offline_files(full_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(full_run / "tensorboard"))
    ev.Reload()
    aucs = [e.value for e in ev.Scalars("val/val_auc")]
    jsonl = [r["val_auc"] for r in records(full_run) if "val_auc" in r]
    assert aucs == pytest.approx(jsonl)
    assert glob.glob(str(full_run / "wandb" / "offline-run-*" / "*.wandb"))


def _mllog(log: Path) -> list:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]


def _compliance_check(log: Path, cwd: Path, toy_closed: bool = False) -> None:
    """Run MLPerf's compliance checker on ``log``; it must pass, or with ``toy_closed`` (a closed-division log of
    toy data) fail exactly the two checks toy data cannot meet: ``eval_samples`` and the AUC target."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_logging.compliance_checker",
            "--usage",
            "training",
            "--ruleset",
            "5.1.0",
            str(log),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
        cwd=cwd,
    )  # the checker writes compliance_checker.log into its cwd
    out = p.stdout + p.stderr
    if not toy_closed:
        assert p.returncode == 0 and "SUCCESS" in out, out
        return
    failed = set(re.findall(r"CHECK for '(\w+)' failed", out)) | set(re.findall(r"Failed checks for (\w+) :", out))
    assert "closed_dlrm_dcnv2.yaml" in out and failed == {"eval_samples", "eval_accuracy"}, out
    assert "eval_samples' failed in line" in out and "v['value'] >= 0.80275" in out, out


def test_mlperf_log_passes_the_compliance_checker(full_run: Path, tmp_path: Path) -> None:
    lines = _mllog(full_run / "mlperf.log")
    evals = [e for e in lines if e["key"] == "eval_accuracy"]
    assert [e["metadata"]["epoch_num"] for e in evals] == [0.25, 0.5, 0.75, 1.0]
    assert {e["key"] for e in lines} >= {
        "run_start",
        "run_stop",
        "submission_benchmark",
        "global_batch_size",
        "opt_adagrad_epsilon",
        "eval_samples",
    }
    _compliance_check(full_run / "mlperf.log", tmp_path)


def test_mlperf_log_records_the_tables_own_learning_rate(tmp_path: Path) -> None:
    """``sparse_lr`` adds ``opt_sparse_base_learning_rate``; without it the key is absent (the tables train at
    ``opt_base_learning_rate``)."""
    from mlperf_logging import mllog

    from dlrm.config import MlperfSink
    from dlrm.mlperf_log import MlperfLogger

    hp = dict(global_batch=64, seed=7, lr=0.004, eps=1e-8, warmup=0, decay_start=0, decay_steps=0, train_samples=640)
    shared = mllog.get_mllogger().logger  # each MlperfLogger adds a file handler to mllog's one logger
    before = list(shared.handlers)
    for name, sparse_lr in (("with.log", 0.02), ("without.log", None)):
        try:
            MlperfLogger(str(tmp_path), MlperfSink(enabled=True, file=name), is_main=True).hyperparameters(
                **hp, eval_samples=64, sparse_lr=sparse_lr
            )
        finally:
            for h in [h for h in shared.handlers if h not in before]:
                shared.removeHandler(h)
                h.close()
    got = {n: {e["key"]: e["value"] for e in _mllog(tmp_path / n)} for n in ("with.log", "without.log")}
    want = {
        "seed": 7,
        "global_batch_size": 64,
        "gradient_accumulation_steps": 1,
        "opt_name": "adagrad",
        "opt_base_learning_rate": 0.004,
        "opt_adagrad_learning_rate_decay": 0,
        "opt_weight_decay": 0,
        "opt_adagrad_initial_accumulator_value": 0,
        "opt_adagrad_epsilon": 1e-8,
        "opt_learning_rate_warmup_steps": 0,
        "opt_learning_rate_decay_start_step": 0,
        "opt_learning_rate_decay_steps": 0,
        "train_samples": 640,
        "eval_samples": 64,
    }
    assert got == {"with.log": {**want, "opt_sparse_base_learning_rate": 0.02}, "without.log": want}


def _fit_in_process(tmp_path: Path, *overrides: str, rows: int) -> Any:
    """Train the small synthetic model in this process on ``rows`` rows at global batch 128 (256 validation rows,
    metrics.jsonl only) and return the closed trainer."""
    from dlrm.trainer import Trainer

    base = [f"data.num_train_samples={rows}", "data.num_val_samples=256", "data.global_batch_size=128"]
    t = Trainer(compose([*base, "logger=[jsonl]", *overrides]), str(tmp_path))
    try:
        t.fit()
    finally:
        t.close()
    return t


def test_mlperf_timed_run_ends_before_the_final_checkpoint_and_test_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mllog brackets: ``eval_start`` before each validation's AUC is computed, ``eval_stop`` after it, and
    ``run_stop`` as training ends, before the final checkpoint and the test split (untimed, as in the MLPerf
    reference); the per-epoch cadence is the reference's floor(rows / (global batch * per_epoch))."""
    from dlrm.checkpoint import Checkpointer
    from dlrm.metrics import EvalAccumulator
    from dlrm.mlperf_log import MlperfLogger

    calls: list = []

    def record(cls: type, name: str, label: str) -> None:
        orig = getattr(cls, name)

        def wrapped(self: object, *a: object, **k: object) -> object:
            calls.append(label)
            return orig(self, *a, **k)

        monkeypatch.setattr(cls, name, wrapped)

    record(MlperfLogger, "eval_start", "eval_start")
    record(MlperfLogger, "eval", "eval_stop")
    record(MlperfLogger, "run_stop", "run_stop")
    record(EvalAccumulator, "compute", "auc")
    record(Checkpointer, "at_end", "checkpoint")
    # 1000 rows at global batch 128: 8 steps (the last partial), validations every 1000 // (128 * 2) = 3 steps
    t = _fit_in_process(
        tmp_path,
        "data.num_test_samples=128",
        "eval.every_n_steps=null",
        "eval.per_epoch=2",
        "eval.at_end=false",
        rows=1000,
    )
    val = [r["step"] for r in t.history if "val_auc" in r]
    assert (t.total_steps, t.eval_every, val) == (8, 3, [3, 6])
    assert calls == ["eval_start", "auc", "eval_stop"] * 2 + ["run_stop", "checkpoint", "auc"]


@pytest.mark.parametrize("bound, stop", [(0.005, 2), (0.02, 6)])
def test_target_auc_counts_the_histogram_bound(
    bound: float, stop: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation AUC of 0.81 with target 0.8 stops the run only when 0.81 minus its error bound is still at
    the target: at the first validation with bound 0.005, never with 0.02."""
    from dlrm.metrics import EvalAccumulator

    fixed = dict(
        auc=0.81, auc_undefined=None, auc_bound=bound, logloss=0.5, ne=0.9, accuracy=0.75, calibration=1.0, ctr=0.25
    )
    monkeypatch.setattr(EvalAccumulator, "compute", lambda self: {**fixed, "samples": 256})
    t = _fit_in_process(tmp_path, "eval.every_n_steps=2", "eval.target_auc=0.8", rows=768)
    assert t.step == stop and [r["val_auc_bound"] for r in t.history if "val_auc" in r] == [bound] * (stop // 2)


def test_mlperf_recipe_at_toy_size_passes_the_compliance_checker(tmp_path: Path) -> None:
    """``experiment=mlperf_dlrmv2`` as it is (the full DLRM-v2 dense side, MLPerf multi-hot, element-wise Adagrad,
    20 evaluations per epoch, its loggers) on a generated binary dataset with tables capped at 64 rows and a
    global batch of 64, so 20 steps an epoch: the first 5 steps (the full-size dense side takes seconds a step on
    2 cores), an evaluation after each (1/20 epoch apart), and a closed-division ``mlperf.log`` that passes every
    check of the closed rules but the two toy data cannot (the evaluation rows and the AUC target)."""
    import numpy as np

    from dlrm.config import MLPERF_MULTI_HOT_SIZES, MLPERF_NUM_EMBEDDINGS
    from dlrm.data import binary_format as BF
    from dlrm.data import preprocess as P

    root, run_dir = tmp_path / "criteo_bin", tmp_path / "run"
    rows = [min(r, 64) for r in MLPERF_NUM_EMBEDDINGS]  # the model's tables at model.row_cap=64
    g = np.random.default_rng(0)
    days = []
    for n in (640, 640, 128):  # two training days, the last day: 64 validate, 64 test
        ids = np.stack([g.integers(0, r, n) for r in rows], axis=1).astype(np.int32)
        days.append(
            (np.log1p(g.exponential(20.0, (n, 13))).astype(np.float32), ids, (g.random(n) < 0.25).astype(np.int32))
        )
    BF.write_dataset(str(root), days, rows)
    P.multihot(out=str(root), sizes=MLPERF_MULTI_HOT_SIZES, seed=0, materialize=True, workers=1)
    p = run(
        [
            sys.executable,
            "train.py",
            "experiment=mlperf_dlrmv2",
            f"data.dataset_dir={root}",
            f"hydra.run.dir={run_dir}",
            "model.row_cap=64",
            "data.global_batch_size=64",
            "trainer.max_steps=5",
            "device=cpu",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = _mllog(run_dir / "mlperf.log")
    evals = [e for e in lines if e["key"] == "eval_accuracy"]
    assert [e["metadata"]["epoch_num"] for e in evals] == [pytest.approx(k / 20) for k in range(1, 6)]
    batch = [e["value"] for e in lines if e["key"] == "global_batch_size"]
    eps = [e["value"] for e in lines if e["key"] == "opt_adagrad_epsilon"]
    assert batch == [64] and eps == [1e-8]
    keys = {e["key"]: e["value"] for e in lines}
    assert keys["submission_division"] == "closed" and keys["seed"] == 0
    _compliance_check(run_dir / "mlperf.log", tmp_path, toy_closed=True)


def test_report_cli(full_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.png"
    p = run([sys.executable, "-m", "dlrm.report", str(full_run), str(full_run), "--out", str(out)])
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    final = [r["val_auc"] for r in records(full_run) if "val_auc" in r][-1]
    rows = [line for line in p.stdout.splitlines() if line.startswith("run")]
    assert len(rows) == 3 and f"{final:.4f}" in rows[1]  # header + two runs
    assert "config keys that differ: none\n" in p.stdout  # the same run twice


def test_report_names_the_config_keys_that_differ(tmp_path: Path) -> None:
    """Two runs' config.yaml: every key whose value differs, with each run's value; a run refused before it wrote
    one is named."""
    from dlrm.report import config_diff, flat_config

    for name, lr, sizes in (("a", 0.01, "[64, 32]"), ("b", 0.02, "[64, 16]"), ("c", 0.01, "[64, 32]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(
            f"optimizer:\n  lr: {lr}\n  eps: 1.0e-08\nmodel:\n  dense_arch_layer_sizes: {sizes}\n"
            + ("seed: 1\n" if name == "c" else "")
        )
    (tmp_path / "d").mkdir()
    got = config_diff({n: flat_config(str(tmp_path / n)) for n in "abcd"})
    assert got == [
        "d: no config.yaml to compare",
        "  model.dense_arch_layer_sizes: a=[64, 32], b=[64, 16], c=[64, 32]",
        "  optimizer.lr: a=0.01, b=0.02, c=0.01",
        "  seed: a=-, b=-, c=1",
    ]


def test_report_bad_path_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Every run directory (and --out's directory) is checked before anything is drawn."""
    from dlrm.report import main

    fix = "pass a run directory of train.py (its hydra.run.dir)"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    typo = str(tmp_path / "rnu")
    assert main([typo]) == 2
    assert capsys.readouterr().err == f"error: {typo!r}: no such directory (cwd {Path.cwd()}); {fix}\n"
    assert main([str(run_dir)]) == 2
    assert capsys.readouterr().err == f"error: {str(run_dir)!r}: no metrics.jsonl; {fix}\n"
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
    assert main([str(run_dir)]) == 2
    assert capsys.readouterr().err == (
        f"error: {run_dir / 'metrics.jsonl'}:2: not a JSON record (a run killed while writing leaves half a line); "
        "delete or repair that line\n"
    )
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    out = str(tmp_path / "plots" / "r.png")
    assert main([str(run_dir), "--out", out]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {out!r}: no such directory {str(tmp_path / 'plots')!r}; create it or pass another path\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["run"] and [p.name for p in run_dir.iterdir()] == ["metrics.jsonl"]


def test_target_auc_stops_training_early(tmp_path: Path) -> None:
    d = tmp_path / "run"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            *SMALL,
            "eval.every_n_steps=2",
            "eval.target_auc=0.6",
            "logger=[stdout,jsonl,mlperf]",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(d)
    hit = [r for r in recs if r.get("target_reached")]
    assert len(hit) == 1 and hit[0]["step"] < 16
    vals = [r for r in recs if "val_auc" in r]
    assert vals[-1]["val_auc"] >= 0.6 and all(v["val_auc"] < 0.6 for v in vals[:-1])
    assert vals[-1]["step"] == hit[0]["step"] and hit[0]["samples"] == hit[0]["step"] * 256
    assert "target AUC 0.6 reached" in p.stdout
    assert '"status": "success"' in (d / "mlperf.log").read_text()


def test_nonfinite_loss_stops_with_step_position_and_saves_no_diverged_checkpoint(tmp_path: Path) -> None:
    """A checkpoint every step and a log window of 8: the divergence is caught before the first save after it
    (not at the window's end), so no checkpoint is saved after a step whose loss was not finite; one `error:`
    line, exit 1."""
    d = tmp_path / "run"
    small = [o for o in SMALL if not o.startswith("logger.log_every_n_steps")]
    overrides = ["logger.log_every_n_steps=8", "checkpoint.every_n_steps=1", "checkpoint.async_save=false"]
    p = run([sys.executable, "train.py", f"hydra.run.dir={d}", *small, *overrides, "optimizer.lr=1e30"])
    line = one_error_line(p, "non-finite training loss", status=1)
    m = re.search(
        r"non-finite training loss at step (\d+) \(rank 0 batch: epoch 0 batch (\d+): "
        r"synthetic train rows (\d+)-(\d+)\); last finite metrics: (.*)",
        line,
    )
    assert m, line
    step, batch, lo, hi = (int(x) for x in m.groups()[:4])
    assert batch == step - 1 and (lo, hi) == ((step - 1) * 256, step * 256 - 1)
    assert step < 8  # found by the check before a save, inside the first log window
    saved = sorted(int(x.name.split("_")[1]) for x in (d / "checkpoints").glob("step_*"))
    assert saved == list(range(max(1, step - 2), step)), saved  # the last good steps (keep_last 2), none after


def test_target_auc_reached_on_the_last_step_ends_the_run(tmp_path: Path) -> None:
    """The final evaluation reaches the target at step 7, inside a log window of 5: the run logs that window
    once, scores the test split and ends with the MLPerf log's success."""
    d = tmp_path / "run"
    small = [o for o in SMALL if not o.startswith("logger.log_every_n_steps")]
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            *small,
            "logger.log_every_n_steps=5",
            "trainer.max_steps=7",
            "eval.target_auc=0.501",
            "logger=[stdout,jsonl,mlperf]",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(d)
    assert [r["step"] for r in recs if "loss" in r and "val_auc" not in r] == [5, 7]
    assert [r["step"] for r in recs if r.get("target_reached")] == [7]
    assert any("test_auc" in r for r in recs)
    assert '"status": "success"' in (d / "mlperf.log").read_text()


def test_eval_split_smaller_than_world_size(tmp_path: Path) -> None:
    d = tmp_path / "run"
    p = run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc_per_node",
            "2",
            "train.py",
            f"hydra.run.dir={d}",
            "data.num_train_samples=2048",
            "data.num_val_samples=1",
            "data.num_test_samples=0",
            "logger.log_every_n_steps=4",
        ],
        timeout=240,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    vals = [r for r in records(d) if "val_samples" in r]
    assert vals[-1]["val_samples"] == 1 and vals[-1]["val_auc"] is None  # one row: one class, AUC undefined


def test_profile_window_beyond_the_last_step_is_refused(tmp_path: Path) -> None:
    p = run(
        [sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}", *SMALL, "profile=true", "trainer.max_steps=5"]
    )
    one_error_line(
        p,
        "^"
        + re.escape(
            "error: config key `profile_steps`: profile=true records steps 12-16, but this run trains 5; lower "
            "profile_wait_steps / profile_steps, or train longer"
        )
        + "$",
    )


DENSE_LABELS = ("## dense_arch ##", "## inter_arch ##", "## over_arch ##")
COMPILED_LABEL = "## dense step (compiled): dense_arch + inter_arch + over_arch + loss ##"


@pytest.mark.parametrize("compiled", [False, True])
def test_profile_writes_a_labelled_trace_of_the_chosen_steps(tmp_path: Path, compiled: bool) -> None:
    """Eager: one range per dense module. ``perf.compile``: the modules and the loss run as one compiled graph,
    so one range around that graph instead (hooks inside it would not show)."""
    d = tmp_path / "run"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            "profile=true",
            "profile_wait_steps=2",
            "profile_steps=3",
            "trainer.max_steps=8",
            "eval.every_n_steps=null",
            "data.num_train_samples=4096",
            "data.num_val_samples=256",
            "data.num_test_samples=0",
            "logger.log_every_n_steps=4",
        ]
        + (["perf.compile=true"] if compiled else [])
    )
    assert p.returncode == 0, p.stdout + p.stderr
    trace = json.loads((d / "profile" / "trace_rank0.pt.trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    # steps 1-2 wait, 3 warms up, 4-6 are recorded
    assert {n for n in names if n.startswith("## train_step")} == {f"## train_step {i} ##" for i in (4, 5, 6)}
    assert "## sparse_arch: lookup + output dist ##" in names
    for label in DENSE_LABELS:
        assert (label in names) is not compiled, label
    assert (COMPILED_LABEL in names) is compiled
    assert any(n.startswith("## start_sparse_data_dist") for n in names)  # TorchRec's input-dist range
    assert any(n.startswith("## optimizer") for n in names)


def test_auc_of_a_one_class_split_is_undefined_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A validation split of negatives only and a test split of positives only: each evaluation line, the final
    summary, metrics.jsonl (``null`` beside ``<kind>_auc_undefined``) and dlrm.report say why, never ``nan``."""
    from dlrm.report import main as report_main

    def rows(labels: str) -> str:
        return "".join(
            "\t".join([y, str(i % 7)] + [""] * 12 + [f"{i % 5:x}"] * 26) + "\n" for i, y in enumerate(labels)
        )

    for name, labels in (("train", "01" * 64), ("val", "0" * 48), ("test", "1" * 40)):
        (tmp_path / f"{name}.tsv").write_text(rows(labels))
    d = tmp_path / "run"
    p = run(
        [
            sys.executable,
            "train.py",
            f"hydra.run.dir={d}",
            "experiment=criteo_sample",
            *(f"data.{k}_path={tmp_path / k}.tsv" for k in ("train", "val", "test")),
            "data.min_id_count=0",
            "trainer.max_steps=2",
            "eval.every_n_steps=null",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    recs = records(d)
    val = next(r for r in recs if "val_auc" in r)
    test = next(r for r in recs if "test_auc" in r)
    assert (val["val_auc"], val["val_auc_undefined"]) == (None, "no positive labels among 48 rows")
    assert (test["test_auc"], test["test_auc_undefined"]) == (None, "no negative labels among 40 rows")
    assert (val["val_ne"], val["val_calibration"], test["test_ne"]) == (None, None, None)  # no positives / entropy 0
    evals = [line for line in p.stdout.splitlines() if line.startswith(("val ", "test ", "final "))]
    assert [re.sub(r"\| [0-9.]+s$|, [0-9.]+s$", "", line) for line in evals] == [
        f"val       2/2 | auc undefined (no positive labels among 48 rows) | logloss {val['val_logloss']:.5f} | "
        f"ne n/a | acc {val['val_accuracy']:.4f} | calib n/a | 48 samples ",
        f"test      2/2 | auc undefined (no negative labels among 40 rows) | logloss {test['test_logloss']:.5f} | "
        f"ne n/a | acc {test['test_accuracy']:.4f} | calib {test['test_calibration']:.3f} | 40 samples ",
        f"final validation AUC undefined (no positive labels among 48 rows) (logloss {val['val_logloss']:.5f}, 48 "
        "samples) after 2 steps",
    ], p.stdout
    assert "nan" not in p.stdout.lower() and "NaN" not in (d / "metrics.jsonl").read_text()
    assert report_main([str(d), "--out", str(tmp_path / "r.png")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[3:6] == ["undefined", "-", "undefined"]
    assert table[2:4] == [
        "run: validation AUC undefined (no positive labels among 48 rows)",
        "run: test AUC undefined (no negative labels among 40 rows)",
    ]


def test_relaunch_after_the_target_auc_is_a_no_op(tmp_path: Path) -> None:
    """A run that stopped at eval.target_auc, relaunched: nothing is trained and no checkpoint is added, as after
    trainer.max_steps (metrics.jsonl gains only the resume marker); with a higher target it trains on."""
    from dlrm.trainer import Trainer

    base = [
        *SMALL,
        "data.num_test_samples=0",
        "eval.every_n_steps=2",
        "eval.target_auc=0.6",
        "checkpoint.every_n_steps=100",
        "checkpoint.async_save=false",
        "logger=[jsonl]",
    ]

    def fit(extra: list) -> Trainer:
        t = Trainer(compose(base + extra), str(tmp_path))
        try:
            t.fit()
        finally:
            t.close()
        return t

    first = fit([])
    stop = first.step
    assert 0 < stop < first.total_steps and first.state.target_auc_reached >= 0.6
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [f"step_{stop}"]
    kept = (tmp_path / "metrics.jsonl").read_text()
    again = fit([])
    assert again.step == stop and again.target_met_before
    now = (tmp_path / "metrics.jsonl").read_text()
    added = [json.loads(line) for line in now[len(kept) :].splitlines()]
    assert now.startswith(kept) and [(r["event"], r["step"], r["superseded"]) for r in added] == [("resume", stop, 0)]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [f"step_{stop}"]
    higher = fit(["eval.target_auc=0.99", "trainer.max_steps=" + str(stop + 2)])
    assert higher.step == stop + 2 and not higher.target_met_before


def test_mlperf_log_lines_go_to_their_file_only(tmp_path: Path) -> None:
    """mllog's own logger also prints every line to stdout: the trainer's writes mlperf.log alone."""
    code = (
        "import sys; from dlrm.config import MlperfSink; from dlrm.mlperf_log import MlperfLogger; "
        "m = MlperfLogger(sys.argv[1], MlperfSink(enabled=True), is_main=True); m.init_start(); m.run_start()"
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0 and (p.stdout, p.stderr) == ("", ""), p.stdout + p.stderr
    assert [e["key"] for e in _mllog(tmp_path / "mlperf.log")][:3] == [
        "cache_clear",
        "init_start",
        "submission_benchmark",
    ]


def test_step_lines_end_with_an_eta(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """ETA = wall time per step so far x steps left: at step 2 of 4 it is the time so far, at the end 0."""
    import datetime

    from dlrm.trainer import Trainer

    base = ["data.num_train_samples=1024", "data.num_val_samples=256", "data.num_test_samples=0"]
    t = Trainer(
        compose([*base, "trainer.max_steps=4", "logger.log_every_n_steps=2", "eval.every_n_steps=null"]), str(tmp_path)
    )
    try:
        t.fit()
    finally:
        t.close()
    recs = [r for r in records(tmp_path) if "loss" in r]
    assert [r["eta_s"] for r in recs] == [recs[0]["time_s"], 0.0]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.rsplit(" | ", 1)[1] for line in lines] == [
        f"eta {datetime.timedelta(seconds=round(r['eta_s']))}" for r in recs
    ]


def test_start_up_is_short_and_library_warnings_are_quiet(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """On 2 ranks: one plan line on stdout (the tables in train.log), no TorchRec topology warning and no torch
    deprecation warning per evaluation; logger.verbose=true prints the tables on stdout too."""
    from dlrm.trainer import Trainer

    small = ["data.num_train_samples=2048", "data.num_val_samples=512", "data.num_test_samples=0"]
    d = tmp_path / "run"
    p = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "train.py", f"hydra.run.dir={d}", *small]
        + ["trainer.max_steps=4", "eval.every_n_steps=2", "logger.log_every_n_steps=2"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout + p.stderr
    assert "Warning" not in out and "deprecated" not in out and "the job will fail" not in out, out
    assert "sharding plan (planner) for 2 ranks: tables 22 row_wise fused, 4 data_parallel dense; the plan" in out
    assert "shards (rows x cols)" not in out and "bytes each rank hands each collective" not in out
    log = (d / "train.log").read_text()
    assert "shards (rows x cols)" in log and "bytes each rank hands each collective" in log
    assert "TopologyFactory" not in log
    t = Trainer(compose([*small, "trainer.max_steps=1", "logger.verbose=true"]), str(tmp_path / "verbose"))
    try:
        t.setup()
    finally:
        t.close()
    assert "shards (rows x cols)" in capsys.readouterr().out


def test_gpu_stack_notices_are_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """The GPU stack's import-time and per-step library notices (seen on torch 2.11 + fbgemm-gpu 1.6.0 + torchrec
    1.6.1) print nothing; other warnings still do."""
    import logging
    import warnings

    import dlrm  # noqa: F401  (its import installs the root-logger filter)
    from dlrm.loggers import quiet_known_warnings

    with caplog.at_level(logging.WARNING):
        logging.warning("\n   _fbgemm_torch_compat_table has no entry for 1.6.0 of FBGEMM;\n   cannot determine")
        logging.warning("FBGEMM_GPU version is 1.6.0, which is not guaranteed to be compatible")
    assert [r.getMessage() for r in caplog.records] == [
        "FBGEMM_GPU version is 1.6.0, which is not guaranteed to be compatible"
    ]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_known_warnings()
        warnings.warn(
            "`_get_pg_default_device` will be deprecated, it only stays for backward-compatibility", stacklevel=1
        )
        warnings.warn("TBE B200 optimization: device_major=9, feature_enabled=0, segment_length=1024", stacklevel=1)
        warnings.warn("something else", stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]
