"""DCP writers of a save (per-rank manifest entries, CUDA staging on a stream of its own) and the error of a save
that failed on a full disk (:func:`save_failure`)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter

from dlrm import torchrec_compat as compat
from dlrm.checkpoint.layout import list_checkpoints, step_dir
from dlrm.checkpoint.manifest import crc_threads, file_entry, rank_manifest_path
from dlrm.checkpoint.state_names import flatten_state
from dlrm.rundir import StorageError, free_bytes, is_storage_fault, storage_error


def _dir_bytes(path: str) -> int:
    """Bytes of the files directly in ``path`` (0 if it is absent)."""
    if not os.path.isdir(path):
        return 0
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


def _state_bytes(state: Dict[str, Any]) -> int:
    """Bytes of this rank's tensors in ``state`` (a ``ShardedTensor``: its local shards), about what its save
    writes."""
    total = 0
    for v in flatten_state(state).values():
        if hasattr(v, "local_shards"):
            total += sum(s.tensor.numel() * s.tensor.element_size() for s in v.local_shards())
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


def save_failure(
    root: str, step: int, e: BaseException, is_main: bool, app: Callable[[], Dict[str, Any]]
) -> Optional[StorageError]:
    """The error for the save of ``step`` under ``root`` that failed with ``e`` when the cause is storage (an
    ``ENOSPC``, ``EDQUOT`` or ``EROFS`` on any rank, or fewer bytes free than the save needs: torch's zip writer
    reports a short write as ``RuntimeError: unexpected pos``), else None. For a storage fault rank 0
    (``is_main``) removes the partial ``step_<N>.tmp`` (every rank is past the failed write: DCP gathers its
    outcome from all of them), which gives its space back. The bytes needed are the newest checkpoint's size,
    else this rank's state (``app()``: :func:`dlrm.checkpoint.state.app_state`)."""
    tmp = step_dir(root, step) + ".tmp"
    done = list_checkpoints(root)
    needed = _dir_bytes(done[-1][1]) if done else _state_bytes(app())
    free = free_bytes(root)
    # what was free before this save: what is free now plus what its partial files took
    if not (is_storage_fault(e) or (free is not None and free + _dir_bytes(tmp) < needed)):
        return None  # e.g. a peer rank killed mid-save: its step_<N>.tmp stays for the next start to report
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    kept = (
        f"the earlier checkpoints are intact (newest {os.path.basename(done[-1][1])}): free space there or set "
        f"checkpoint.dir to a larger disk, and launch again to resume from it"
        if done
        else "free space there or set checkpoint.dir to a larger disk"
    )
    return storage_error(tmp, e, needed, kept)


class ManifestWriter(FileSystemWriter):
    """DCP's file writer that, once this rank's data files are written, records their sizes and block checksums
    in ``manifest_rank_<r>.json``; rank 0 merges these into the checkpoint's ``manifest.json``, written last
    (:meth:`Checkpointer._finish`). In an async save this runs on the writer thread, off the training loop."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        fut = super().write_data(plan, planner)
        files = sorted(set(compat.written_files(fut.wait())))
        entries = {name: file_entry(os.path.join(str(self.path), name), threads=crc_threads()) for name in files}
        with open(rank_manifest_path(str(self.path), dist.get_rank() if dist.is_initialized() else 0), "w") as f:
            json.dump(entries, f)
        return fut


class StreamStagedWriter(ManifestWriter):
    """DCP writer whose :meth:`stage` copies CUDA tensors to pinned host memory on a dedicated CUDA stream.

    Why our own: DCP's ``FileSystemWriter(cache_staged_state_dict=True)`` (``BlockingAsyncStager``) copies on
    the current stream and blocks the host per tensor; torch's ``staging.DefaultStager`` (torch >= 2.8) copies
    on its own stream but records no ordering against the training stream in either direction (its copy can
    read weights before this step's update kernels ran, and the next backward can update them mid-copy), which
    the fused TBE optimizer (in-place update inside backward) turns into a torn checkpoint. This uses DCP's
    state-dict helpers (:func:`dlrm.torchrec_compat.create_cpu_state_dict` / ``copy_state_dict``; they handle
    ``ShardedTensor``) and adds the two events.

    Ordering (see :mod:`dlrm.checkpoint`'s docstring): training stream --ready--> staging stream copies --done-->
    training stream (its next kernel) and writer thread (``done.synchronize()`` in :meth:`write_data`).

    Args:
        path: the checkpoint directory (DCP resets it per save through ``checkpoint_id``).
        device: the training device (``cuda:<i>``).
    """

    def __init__(self, path: str, device: torch.device) -> None:
        super().__init__(path)
        self.device = device
        # created on the main thread after the training stream has been used (a stream made earlier could alias
        # the default stream on some set-ups, as DCP's DefaultStager notes)
        self.stream = torch.cuda.Stream(device=device)
        self._cache: Optional[Dict[str, Any]] = None
        self.done: Optional[torch.cuda.Event] = None

    def stage(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        if self._cache is None:  # pinned buffers: allocated once (the layout does not change during a run)
            self._cache = compat.create_cpu_state_dict(state_dict, pin_memory=True)
        train = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(train)
        self.stream.wait_event(ready)
        with torch.cuda.stream(self.stream):
            staged = compat.copy_state_dict(state_dict, self._cache, non_blocking=True)
        self.done = torch.cuda.Event()
        self.done.record(self.stream)
        # GPU-side wait: no host sync. Any memory of state_dict temporaries that the training stream reuses
        # after this point is also ordered after the copies.
        train.wait_event(self.done)
        return staged

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        if self.done is not None:
            self.done.synchronize()  # writer thread: the pinned buffers hold this step's state
        return super().write_data(plan, planner)
