"""Export a sharded checkpoint as one unsharded state dict for inference (no process group needed)::

    python -m dlrm.export runs/a/checkpoints/step_200 model.pt    # a step_<N> directory
    python -m dlrm.export runs/a/checkpoints model.pt             # or the newest complete one under a directory
    python -m dlrm.export runs/a/checkpoints model.pt --force     # replace an existing model.pt

``model.pt`` is ``torch.save`` of a plain ``{name: tensor}`` dict with the keys of the unsharded
``DLRMTrain`` that ``dlrm.model.build_model`` returns; load it with::

    model = build_model(cfg.model, table_device=torch.device("cpu"))
    model.load_state_dict(torch.load("model.pt"))

The model config the checkpoint was trained with is in ``<checkpoint>/meta.json`` (``config.model``).
Every table is gathered whole into host memory, so the host needs the model's full size in RAM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Dict, Optional, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dlrm.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    resolve_checkpoint,
    unreadable_data,
    verify_checkpoint,
)
from dlrm.config import output_file_problem


def _checkpoint_dir(path: str) -> str:
    """``path`` if it holds DCP's ``.metadata``, else the newest complete ``step_<N>`` under it."""
    return path if os.path.isfile(os.path.join(path, ".metadata")) else resolve_checkpoint(path)


def full_state_dict(path: str, prefix: str = "") -> Dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint whose name starts with ``prefix``, unsharded, on the CPU.

    Returns names with ``prefix`` removed.

    Raises:
        FileNotFoundError: ``path`` holds no complete checkpoint.
        CheckpointError: the checkpoint does not match its manifest (names the file), or cannot be read.
    """
    path = _checkpoint_dir(path)
    err = verify_checkpoint(path)
    if err is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: {err}")
    try:
        meta = FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - a damaged .metadata fails in many ways; name the checkpoint
        raise CheckpointError(f"checkpoint {path}: .metadata is unreadable ({type(e).__name__})") from e
    sd = {
        k: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for k, md in meta.items()
        if k.startswith(prefix) and isinstance(md, TensorStorageMetadata)
    }
    try:
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - e.g. a truncated .distcp that no manifest covers
        raise unreadable_data(path, e, "restore the file, or export another checkpoint") from e
    return {k[len(prefix) :]: v for k, v in sd.items()}


def export(checkpoint: str, out: str) -> Dict[str, torch.Tensor]:
    """Write the model part of ``checkpoint`` unsharded to ``out``; returns the state dict.

    Raises:
        FileNotFoundError / CheckpointError: as :func:`full_state_dict`.
        OSError / RuntimeError: ``out`` cannot be written (``torch.save``: a missing directory is a RuntimeError).
    """
    sd = full_state_dict(checkpoint, "model.")
    torch.save(sd, out)
    return sd


def _run_checkpoints(path: str) -> Optional[str]:
    """The checkpoint directory of ``path`` when ``path`` is a run directory whose checkpoints are complete: the
    ``checkpoint.dir`` of its ``config.yaml``, else ``<path>/checkpoints``; None otherwise."""
    from omegaconf import OmegaConf

    dirs = []
    try:
        configured = OmegaConf.select(OmegaConf.load(os.path.join(path, "config.yaml")), "checkpoint.dir")
    except Exception:  # noqa: BLE001 - no config.yaml, or not one of a run: only the default place is tried
        configured = None
    if isinstance(configured, str) and configured:
        dirs.append(configured)
    dirs.append(os.path.join(path, "checkpoints"))
    return next((d for d in dirs if latest_checkpoint(d) is not None), None)


def _out_problem(out: str, force: bool) -> Optional[str]:
    """The ``error:`` line for an ``OUT`` that cannot or must not be written, or None."""
    why = output_file_problem(out, overwrite=force)
    if why is None:
        return None
    if why.startswith("no such directory"):
        fix = "create it or pass another path"
    elif why == "already exists":
        fix = "pass another path, or --force to overwrite it"
    elif why.endswith("not writable"):
        fix = "pass another path"
    else:
        fix = "give the path of the .pt file to write"
    return f"error: OUT {out!r}: {why}; {fix}"


def _save_error(e: BaseException) -> str:
    """``torch.save``'s failure as a few words: an OSError's reason, or the RuntimeError of torch's zip writer
    without its ``[enforce fail at ...]`` source location."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split())
    return re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", text) or type(e).__name__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dlrm.export CHECKPOINT OUT [--force]``; returns the exit status: 0, or 2 after one ``error:`` line
    on stderr when ``CHECKPOINT`` holds no complete checkpoint or a damaged one (a run directory is answered with
    its checkpoint directory), when ``OUT`` is empty, a directory, in a directory that does not exist or cannot be
    written, or exists without ``--force`` (all checked before any table is gathered), or when writing ``OUT``
    fails (a partial file it created is removed)."""
    ap = argparse.ArgumentParser(
        prog="python -m dlrm.export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "checkpoint", help="a step_<N> checkpoint directory, or a directory of them (the newest complete one)"
    )
    ap.add_argument("out", help="output .pt file (a plain state dict)")
    ap.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    args = ap.parse_args(argv)
    line = _out_problem(args.out, args.force)
    if line is not None:
        print(line, file=sys.stderr)
        return 2
    try:
        path = _checkpoint_dir(args.checkpoint)
        sd = full_state_dict(path, "model.")
    except FileNotFoundError as e:
        found = _run_checkpoints(args.checkpoint) if os.path.isdir(args.checkpoint) else None
        fix = f"; it is a run directory: give its checkpoint directory {found!r} (or a step_<N> in it)" if found else ""
        print(f"error: {e}{fix}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    existed = os.path.exists(args.out)
    try:
        torch.save(sd, args.out)
    except (OSError, RuntimeError) as e:  # torch.save reports most write failures as a RuntimeError
        if not existed and os.path.isfile(args.out):
            with contextlib.suppress(OSError):
                os.remove(args.out)  # a truncated .pt that torch.load would fail on later
        print(f"error: OUT {args.out!r}: cannot be written ({_save_error(e)}); pass another path", file=sys.stderr)
        return 2
    n = sum(v.numel() for v in sd.values())
    print(f"exported {path}: {len(sd)} tensors, {n / 1e6:.2f} M parameters -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
