"""Plots and a summary table from one or more run directories (their ``metrics.jsonl``).

    python -m dlrm.report outputs/2026-11-30/10-00-00 outputs/2026-11-30/11-00-00 --out compare.png

Draws one PNG with six panels, every run overlaid: training loss, validation AUC, validation logloss and
windowed training AUC against samples seen, throughput (samples/s, all ranks) and learning rate. Prints a
table: steps, samples, final and best validation AUC, test AUC, median samples/s, wall time (over every segment of
a run resumed after a stop; the steps a resumed run replayed count once), then, for two runs or more, the config
keys whose values differ between them (from each run's ``config.yaml``). Without ``--out`` the PNG goes to
``<first run dir>/report.png``. A path that is not a run directory, or a damaged ``metrics.jsonl``: one ``error:``
line naming it, exit status 2, before anything is drawn.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

from dlrm.errors import InputError
from dlrm.loggers import apply_resume

FIX = "pass a run directory of train.py (its hydra.run.dir)"


def load_run(run_dir: str) -> List[Dict[str, Any]]:
    """The records of ``<run_dir>/metrics.jsonl``, one per step: a resume marker (``"event": "resume"``, kept)
    drops the records of the steps after its ``step`` that a killed run had logged and the resumed run replays.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory, or has no metrics.jsonl (the message names the path).
        InputError: a line of metrics.jsonl is not a JSON record (the message names file and line).
    """
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{run_dir!r}: no such directory (cwd {os.getcwd()}); {FIX}")
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{run_dir!r}: no metrics.jsonl; {FIX}")
    out: List[Dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            if not isinstance(rec, dict):
                raise InputError(
                    f"{path}:{lineno}: not a JSON record (a run killed while writing leaves half a line); delete or "
                    "repair that line"
                )
            out = apply_resume(out, rec)
    return out


def flat_config(run_dir: str) -> Optional[Dict[str, Any]]:
    """The run's ``config.yaml`` (what train.py resolved) as ``{"section.key": value}``, lists as their text; None
    where the run has none (a run refused before it trained)."""
    from omegaconf import OmegaConf

    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        return None
    out: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = json.dumps(node) if isinstance(node, list) else node

    walk(OmegaConf.to_container(OmegaConf.load(path)), "")
    return out


def config_diff(configs: Dict[str, Optional[Dict[str, Any]]]) -> List[str]:
    """Lines naming each config key whose value differs between the runs, ``key: run=value, run=value``, sorted by
    key (a key a run lacks shows as ``-``); a run without ``config.yaml`` is named on a line of its own."""
    have = {n: c for n, c in configs.items() if c is not None}
    lines = [f"{n}: no config.yaml to compare" for n, c in configs.items() if c is None]
    keys = sorted({k for c in have.values() for k in c})
    for k in keys:
        vals = [c.get(k, "-") for c in have.values()]
        if any(v != vals[0] for v in vals):
            lines.append(f"  {k}: " + ", ".join(f"{n}={v}" for n, v in zip(have, vals)))
    return lines


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def summarize(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``steps``, ``samples``, ``final_auc``, ``best_auc``, ``test_auc``, ``median_samples_per_s``, ``wall_s``
    (training seconds over all segments of a resumed run) (None where the run has no such record); ``undefined``:
    ``{"val"|"test": why}`` where the last evaluation of that split logged its AUC as undefined (``<kind>_auc``
    null beside ``<kind>_auc_undefined``, a split of one class)."""
    train = [r for r in records if "loss" in r]
    undefined = {}
    for kind in ("val", "test"):
        last = [r for r in records if f"{kind}_auc" in r][-1:]
        if last and last[0].get(f"{kind}_auc_undefined"):
            undefined[kind] = last[0][f"{kind}_auc_undefined"]
    vals = [_num(r["val_auc"]) for r in records if "val_auc" in r]
    vals = [v for v in vals if v is not None]
    tests = [_num(r["test_auc"]) for r in records if "test_auc" in r]
    speeds = [s for s in (_num(r.get("samples_per_s")) for r in train) if s is not None]
    return {
        "steps": max((r["step"] for r in records if "step" in r), default=None),
        "samples": max((r.get("samples", 0) for r in records), default=None),
        "final_auc": vals[-1] if vals else None,
        "best_auc": max(vals) if vals else None,
        "test_auc": tests[-1] if tests else None,
        "median_samples_per_s": statistics.median(speeds) if speeds else None,
        "wall_s": _wall_s(records) if train else None,
        "undefined": undefined,
    }


def _wall_s(records: List[Dict[str, Any]]) -> float:
    """Training seconds over every segment of a run resumed after a stop: each resume marker's
    ``previous_segment_s`` plus the last ``time_s`` of the segment after the last marker."""
    total, last = 0.0, 0.0
    for r in records:
        if r.get("event") == "resume":
            total, last = total + (_num(r.get("previous_segment_s")) or 0.0), 0.0
        elif "loss" in r:
            last = max(last, _num(r.get("time_s")) or 0.0)
    return total + last


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else v if isinstance(v, str) else format(v, spec)


def table(runs: Dict[str, List[Dict[str, Any]]]) -> str:
    """The summary table as aligned text, one row per run; an AUC logged as undefined shows as ``undefined``, with
    the reason on a line below the table."""
    head = ["run", "steps", "samples", "final AUC", "best AUC", "test AUC", "samples/s (median)", "wall s"]
    rows = [head]
    notes = []
    for name, recs in runs.items():
        s = summarize(recs)
        for kind, why in s["undefined"].items():
            notes.append(f"{name}: {'validation' if kind == 'val' else 'test'} AUC undefined ({why})")
        if "val" in s["undefined"]:
            s["final_auc"] = "undefined"
        if "test" in s["undefined"]:
            s["test_auc"] = "undefined"
        rows.append(
            [
                name,
                _fmt(s["steps"], "d"),
                _fmt(s["samples"], ",d"),
                _fmt(s["final_auc"], ".4f"),
                _fmt(s["best_auc"], ".4f"),
                _fmt(s["test_auc"], ".4f"),
                _fmt(s["median_samples_per_s"], ",.0f"),
                _fmt(s["wall_s"], ".1f"),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        + notes
    )


def plot(runs: Dict[str, List[Dict[str, Any]]], out: str) -> None:
    """Write the six-panel PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("loss", "training loss", "loss"),
        ("val_auc", "validation AUC", "val_auc"),
        ("val_logloss", "validation logloss", "val_logloss"),
        ("train_auc", "training AUC (window)", "train_auc"),
        ("samples_per_s", "samples/s (all ranks)", "samples_per_s"),
        ("lr", "learning rate", "lr"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, title, _) in zip(axes.flat, panels):
        for name, recs in runs.items():
            pts = [(r.get("samples", 0), _num(r[key])) for r in recs if key in r]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o" if len(pts) < 30 else None,
                    markersize=3,
                    label=name,
                )
        ax.set_title(title)
        ax.set_xlabel("samples seen")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dlrm.report RUN_DIR... [--out PNG]``: write the plots, print the table; returns 0, or 2 after one
    ``error:`` line for a path that is not a run directory, a damaged ``metrics.jsonl`` or a missing ``--out``
    directory."""
    ap = argparse.ArgumentParser(prog="python -m dlrm.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", help="run directories (hydra.run.dir of train.py)")
    ap.add_argument("--out", help="PNG path (default: <first run dir>/report.png)")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(args.run_dirs[0], "report.png")
    runs: Dict[str, List[Dict[str, Any]]] = {}
    try:
        for d in args.run_dirs:
            name = os.path.basename(os.path.normpath(d)) or d
            while name in runs:  # two runs with the same leaf name
                name += "'"
            runs[name] = load_run(d)
        if args.out and not os.path.isdir(os.path.dirname(args.out) or "."):
            raise FileNotFoundError(
                f"--out {args.out!r}: no such directory {os.path.dirname(args.out)!r}; create it or pass another path"
            )
    except (FileNotFoundError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot(runs, out)
    print(table(runs))
    if len(runs) > 1:
        diff = config_diff({name: flat_config(d) for name, d in zip(runs, args.run_dirs)})
        print("\n".join(["config keys that differ:", *diff]) if diff else "config keys that differ: none")
    print(f"plots: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
