"""Which checkpoint a run resumes from: ``checkpoint.resume`` (auto, none or a path), verified against its manifest."""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, List, Optional

import torch.distributed as dist

from dlrm.checkpoint.layout import STEP_RE, TMP_RE, list_checkpoints, resolve_checkpoint
from dlrm.checkpoint.manifest import verify_checkpoint
from dlrm.checkpoint.reader import CheckpointError
from dlrm.config import CheckpointConfig
from dlrm.errors import ConfigError
from dlrm.process_group import DistInfo

log = logging.getLogger(__name__)


def _remove_interrupted(root: str) -> None:
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        if TMP_RE.match(name):
            log.warning(
                "ignoring incomplete checkpoint %s (its save was interrupted); removing it", os.path.join(root, name)
            )
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _everyone(obj: Any) -> List[Any]:
    """``obj`` of every rank (one rank: ``[obj]``); collective on the default group."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def choose_checkpoint(cfg: CheckpointConfig, root: str, info: DistInfo) -> Optional[str]:
    """The checkpoint to resume from, verified against its manifest (collective: every rank calls it; each
    checks its share of the blocks, :func:`verify_checkpoint`).

    ``checkpoint.resume=auto``: the newest complete checkpoint under ``root`` that is intact; a damaged one is
    logged, naming the file, and the previous one is tried. ``none``: None, in a ``root`` without checkpoints. A
    path: that checkpoint, which must be intact and, when it lies in ``root``, the newest there. Interrupted saves
    (``step_<N>.tmp``) are removed first.

    Raises:
        ConfigError: ``checkpoint.resume`` names no checkpoint, or an older one of ``root``, or is ``none`` where
            ``root`` holds checkpoints: this run's saves would go beside the newer ones of the abandoned run,
            ``checkpoint.keep_last`` would prune the oldest (the one resumed from, or this run's first) and a
            restart with ``resume=auto`` would take the abandoned run's newest.
        CheckpointError: the named checkpoint is damaged, or every checkpoint under ``root`` is.
    """
    box: List[Any] = [None]
    if info.is_main:
        _remove_interrupted(root)
        if cfg.resume == "none":
            found = list_checkpoints(root)
            box[0] = (
                f"config key `checkpoint.resume`: none, but {root} holds {os.path.basename(found[-1][1])} of an "
                "earlier run; set checkpoint.dir=<a new directory> (or hydra.run.dir) to start fresh, leave "
                "checkpoint.resume=auto to continue it, or move its checkpoints aside"
                if found
                else []
            )
        elif cfg.resume == "auto":
            box[0] = [p for _, p in reversed(list_checkpoints(root))]
        else:
            try:
                box[0] = [resolve_checkpoint(cfg.resume)]
            except FileNotFoundError as e:
                box[0] = f"config key `checkpoint.resume`: {e}; give a step_<N> directory, auto or none"
            else:
                newer = _newer_in_root(box[0][0], root)
                if newer is not None:
                    old = os.path.basename(box[0][0])
                    box[0] = (
                        f"config key `checkpoint.resume`: {root} holds {newer}, newer than {old}; set "
                        f"checkpoint.dir=<a new directory> to branch from {old}, or move the newer checkpoints aside"
                    )
    if dist.is_initialized() and info.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise ConfigError(box[0])
    candidates: List[str] = box[0]
    for path in candidates:
        t0 = time.perf_counter()
        errors = [
            e
            for e in _everyone(verify_checkpoint(path, info.rank, info.world_size, cfg.verify == "full"))
            if e is not None
        ]
        if not errors:
            log.info(
                "checkpoint %s verified against its manifest (%s) in %.1fs", path, cfg.verify, time.perf_counter() - t0
            )
            return path
        line = f"checkpoint {path} is damaged: {errors[0]}"
        if cfg.resume != "auto":
            raise CheckpointError(f"{line}; give another checkpoint.resume (auto takes the newest intact one)")
        log.warning("%s; trying the previous checkpoint", line)
    if candidates:
        raise CheckpointError(
            f"every checkpoint in {root} is damaged (see the warnings above); move them aside, "
            "or set checkpoint.dir=<a new directory> to start fresh"
        )
    log.info("checkpoint: none in %s; starting fresh", root)
    return None


def _newer_in_root(path: str, root: str) -> Optional[str]:
    """The name of the newest checkpoint in ``root`` when ``path`` is an older one of ``root``, else None."""
    if os.path.realpath(os.path.dirname(os.path.normpath(path))) != os.path.realpath(root):
        return None
    step = int(STEP_RE.match(os.path.basename(os.path.normpath(path))).group(1))  # type: ignore[union-attr]
    later = [s for s, _ in list_checkpoints(root) if s > step]
    return f"step_{later[-1]}" if later else None
