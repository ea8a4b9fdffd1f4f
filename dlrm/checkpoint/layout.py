"""Where checkpoints live: ``<root>/step_<N>/`` directories, the names of their files, which are complete.

A save writes ``step_<N>.tmp/`` and renames it to ``step_<N>/`` once complete; only a ``step_<N>`` directory
holding DCP's ``.metadata`` and ``meta.json`` counts as a checkpoint (:func:`is_complete`).
"""

from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

from dlrm.config import CheckpointConfig

STEP_RE = re.compile(r"^step_(\d+)$")
TMP_RE = re.compile(r"^step_(\d+)\.tmp$")
META = "meta.json"
MANIFEST = "manifest.json"  # written last: every file of the checkpoint, its size and block checksums
PLAN = "plan.json"  # the plan the checkpoint was trained with (a resume on the same layout reuses it)


def step_dir(root: str, step: int) -> str:
    """Path of the checkpoint of optimizer step ``step`` under ``root``: ``<root>/step_<step>`` (not checked)."""
    return os.path.join(root, f"step_{step}")


def is_complete(path: str) -> bool:
    """A finished checkpoint: named ``step_<N>`` with DCP's ``.metadata`` and our ``meta.json``."""
    return (
        bool(STEP_RE.match(os.path.basename(os.path.normpath(path))))
        and os.path.isfile(os.path.join(path, ".metadata"))
        and os.path.isfile(os.path.join(path, META))
    )


def list_checkpoints(root: str) -> List[Tuple[int, str]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first (``[]`` if ``root`` is absent)."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = STEP_RE.match(name)
        if m and is_complete(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def latest_checkpoint(root: str) -> Optional[str]:
    """The complete checkpoint of the highest step under ``root`` (:func:`list_checkpoints`), or None if there is
    none; its files are not verified (:func:`verify_checkpoint`)."""
    ckpts = list_checkpoints(root)
    return ckpts[-1][1] if ckpts else None


def resolve_checkpoint(path: str) -> str:
    """``path`` itself if it is a complete checkpoint, else the newest complete one under it.

    Raises:
        FileNotFoundError: neither; the message says what is there.
    """
    if is_complete(path):
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    why = (
        "does not exist"
        if not os.path.exists(path)
        else (
            "is an incomplete save (a *.tmp directory)"
            if path.rstrip("/").endswith(".tmp")
            else "is neither a step_<N> checkpoint (with .metadata and meta.json) nor a directory holding one"
        )
    )
    raise FileNotFoundError(f"checkpoint {path!r} {why}")


def checkpoint_root(cfg: CheckpointConfig, run_dir: str) -> str:
    """Where the run's ``step_<N>/`` checkpoints go: ``checkpoint.dir``, else ``<run_dir>/checkpoints``."""
    return os.path.abspath(cfg.dir or os.path.join(run_dir, "checkpoints"))
