"""Reading a checkpoint: its ``meta.json``, DCP's ``.metadata`` and data, and the error for a checkpoint that cannot be
used."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader

from dlrm.checkpoint.layout import META
from dlrm.errors import InputError


def read_checkpoint_meta(path: str) -> Dict[str, Any]:
    """The parsed ``meta.json`` of the checkpoint directory ``path`` (UTF-8 JSON).

    Raises:
        FileNotFoundError: ``path`` has no ``meta.json``.
        json.JSONDecodeError: ``meta.json`` is not valid JSON (a ``ValueError``).
        UnicodeDecodeError: ``meta.json`` is not UTF-8 (a ``ValueError``).

    :meth:`Checkpointer.resume` turns each of these into a :class:`CheckpointError` naming the checkpoint.
    """
    with open(os.path.join(path, META), encoding="utf-8") as f:
        return json.load(f)


class CheckpointError(InputError):
    """A checkpoint that cannot be used: damaged (a file missing, truncated or altered) or unreadable. The message
    names the checkpoint and the file."""


def read_dcp_metadata(path: str) -> Dict[str, Any]:
    """DCP's ``.metadata`` of checkpoint ``path``: its ``state_dict_metadata``, fully-qualified name ->
    ``TensorStorageMetadata`` (global ``size``, ``properties.dtype``) or ``BytesStorageMetadata``.

    Raises:
        CheckpointError: ``.metadata`` is missing or unreadable (names the checkpoint).
    """
    try:
        return FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - a damaged .metadata fails in many ways; name the checkpoint
        raise CheckpointError(f"checkpoint {path}: .metadata is unreadable ({type(e).__name__})") from e


def unreadable_data(path: str, e: BaseException, fix: str) -> CheckpointError:
    """The error for a DCP load of checkpoint ``path`` that failed with ``e``, naming its first cause and ``fix``.
    DCP reports a failed read as a ``CheckpointException``, a ``BaseException`` (not an ``Exception``) whose text
    is every rank's traceback; the first rank's exception is named instead."""
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return CheckpointError(f"checkpoint {path}: its data cannot be read ({type(e).__name__}: {text}); {fix}")


def load_dcp(
    state: Dict[str, Any], path: str, fix: str, process_group: Optional[dist.ProcessGroup] = None, no_dist: bool = False
) -> None:
    """``dcp.load`` of checkpoint ``path`` into ``state`` (in place; ``process_group`` and ``no_dist`` as DCP's).

    Raises:
        CheckpointError: the data cannot be read (e.g. a ``.distcp`` damaged after verification, or one no
            manifest covers); names the checkpoint, the first cause and ``fix`` (:func:`unreadable_data`).
    """
    try:
        with warnings.catch_warnings():
            # one process without a process group loads the whole checkpoint, as meant (export, predict); DCP
            # warns on every such load that it assumes so
            warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized")
            dcp.load(state, checkpoint_id=path, process_group=process_group, no_dist=no_dist)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP fails in many ways; name the checkpoint
        raise unreadable_data(path, e, fix) from e
