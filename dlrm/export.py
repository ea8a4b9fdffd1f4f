"""Export a sharded checkpoint as one unsharded model file for inference (no process group needed)::

    python -m dlrm.export runs/a/checkpoints/step_200 model.pt    # a step_<N> directory
    python -m dlrm.export runs/a/checkpoints model.pt             # or the newest complete one under a directory
    python -m dlrm.export runs/a/checkpoints model.pt --force     # replace an existing model.pt

``model.pt`` is ``torch.save`` of ``{"format": "dlrm-export/1", "model_config": {...}, "state_dict": {...}}``:
the model config the checkpoint was trained with (its ``meta.json`` ``config.model``) and the tensors of the
unsharded ``DLRMTrain`` that ``dlrm.model.build_model`` returns for it. One call loads it into a ready model::

    from dlrm.export import load_model
    model = load_model("model.pt")     # DLRMTrain on the CPU, eval mode; score with python -m dlrm.predict

The export refuses a checkpoint whose tensors are not those of the model its config describes, naming the first
entry that differs. Every table is gathered whole into host memory, so the host needs the model's full size in RAM.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pickle
import re
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from omegaconf import OmegaConf
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dlrm.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_dcp,
    model_mismatch,
    read_checkpoint_meta,
    read_dcp_metadata,
    resolve_checkpoint,
    verify_checkpoint,
)
from dlrm.config import ModelConfig
from dlrm.errors import InputError
from dlrm.writable import output_file_problem, report_unwritable

FORMAT = "dlrm-export/1"


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
    meta = read_dcp_metadata(path)
    sd = {
        k: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for k, md in meta.items()
        if k.startswith(prefix) and isinstance(md, TensorStorageMetadata)
    }
    load_dcp(sd, path, "restore the file, or export another checkpoint", no_dist=True)
    return {k[len(prefix) :]: v for k, v in sd.items()}


def _model_config(d: Any, where: str) -> ModelConfig:
    """``ModelConfig`` from the dict ``d`` (a ``meta.json`` ``config.model``), its ``__post_init__`` checks run.

    Raises:
        CheckpointError: ``d`` is not a model config (names ``where``).
    """
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), d))  # type: ignore[return-value]
    except Exception as e:  # noqa: BLE001 - OmegaConf's and __post_init__'s errors: a damaged or foreign config
        raise CheckpointError(f"{where}: `config.model` is not a model config ({type(e).__name__}: {e})") from e


def _shapes(sd: Dict[str, torch.Tensor]) -> Dict[str, Tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


def model_for(path: str, sd: Dict[str, torch.Tensor]) -> Optional[Dict[str, Any]]:
    """The model config of checkpoint ``path`` (its ``meta.json`` ``config.model``), checked against ``sd``, the
    checkpoint's model tensors: the model it describes has exactly these keys with these shapes. None for a bare
    DCP checkpoint (no ``meta.json``: :func:`load_model` then needs the model config).

    Raises:
        CheckpointError: ``meta.json`` is missing, unreadable or holds no model config; or the tensors differ from
            that model (names the first entry that differs).
    """
    from dlrm.model import build_model

    if not os.path.isfile(os.path.join(path, "meta.json")):
        return None
    try:
        d = read_checkpoint_meta(path)["config"]["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"checkpoint {path}: meta.json holds no `config.model` ({type(e).__name__}: {e}); the export needs "
            "the model config the checkpoint was trained with"
        ) from e
    model = build_model(_model_config(d, f"checkpoint {path}: meta.json"), dense_device=torch.device("meta"))
    why = model_mismatch(_shapes(sd), _shapes(model.state_dict()))
    if why is not None:
        raise CheckpointError(f"checkpoint {path}: model {why}")
    return OmegaConf.to_container(OmegaConf.structured(_model_config(d, path)))  # type: ignore[return-value]


def export(checkpoint: str, out: str) -> Dict[str, Any]:
    """Write the model of ``checkpoint`` unsharded to ``out`` (the format of the module docstring); returns what
    was written.

    Raises:
        FileNotFoundError / CheckpointError: as :func:`full_state_dict` and :func:`model_for`.
        OSError / RuntimeError: ``out`` cannot be written (``torch.save``: a missing directory is a RuntimeError).
    """
    path = _checkpoint_dir(checkpoint)
    sd = full_state_dict(path, "model.")
    doc = {"format": FORMAT, "model_config": model_for(path, sd), "state_dict": sd}
    torch.save(doc, out)
    return doc


def load_model(path: str, model_config: Optional[Any] = None) -> torch.nn.Module:
    """The model of an exported file ``path`` (:func:`export`), ready to score: ``DLRMTrain`` on the CPU in eval
    mode, float32, its ``ModelConfig`` as ``model.model_config``. ``model(batch)`` returns ``(loss, (loss, logits,
    labels))``, logits float32 ``[batch]``; ``torch.sigmoid(logits)`` is the click probability.

    Args:
        path: the ``.pt`` file ``python -m dlrm.export`` wrote.
        model_config: a ``ModelConfig`` (or dict) the file must match; None: the file's own.

    Raises:
        InputError: ``path`` is not a file of this format (names it).
        CheckpointError: its tensors differ from ``model_config`` (names the first entry and the config key).
    """
    from dlrm.model import build_model

    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        why = (
            "not a torch.save file"  # torch's own text runs to several lines about weights_only
            if isinstance(e, pickle.UnpicklingError)
            else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        )
        raise InputError(f"{path}: cannot be read as a model file ({why})") from e
    if not (isinstance(doc, dict) and doc.get("format") == FORMAT):
        raise InputError(f"{path}: not a model file of `python -m dlrm.export` (format {FORMAT}); export it again")
    was = doc["model_config"]
    now = model_config if model_config is not None else was
    if now is None:
        raise InputError(f"{path}: exported from a checkpoint without meta.json; pass its model_config")
    if dataclasses.is_dataclass(now):
        now = OmegaConf.to_container(OmegaConf.structured(now))
    cfg = _model_config(now, path)
    model = build_model(cfg, dense_device=torch.device("cpu"), table_device=torch.device("cpu"))
    why = model_mismatch(_shapes(doc["state_dict"]), _shapes(model.state_dict()), was, now)
    if why is not None:
        raise CheckpointError(f"{path}: model {why}")
    model.load_state_dict(doc["state_dict"])
    model.model_config = cfg  # what dlrm.predict reads the data for (table sizes, multi-hot)
    return model.eval()


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
    ap.add_argument("out", help="output .pt file (model config and state dict: load it with dlrm.export.load_model)")
    ap.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    args = ap.parse_args(argv)
    line = _out_problem(args.out, args.force)
    if line is not None:
        print(line, file=sys.stderr)
        return 2
    try:
        path = _checkpoint_dir(args.checkpoint)
        sd = full_state_dict(path, "model.")
        doc = {"format": FORMAT, "model_config": model_for(path, sd), "state_dict": sd}
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
        torch.save(doc, args.out)
    except (OSError, RuntimeError) as e:  # torch.save reports most write failures as a RuntimeError
        if not existed and os.path.isfile(args.out):
            with contextlib.suppress(OSError):
                os.remove(args.out)  # a truncated .pt that torch.load would fail on later
        return report_unwritable("OUT", args.out, _save_error(e))
    n = sum(v.numel() for v in sd.values())
    print(f"exported {path}: {len(sd)} tensors, {n / 1e6:.2f} M parameters -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
