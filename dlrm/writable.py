"""Whether a command may write its output file (``python -m dlrm.plan``'s plan.json, ``python -m dlrm.export``'s
model, ``python -m dlrm.predict``'s predictions), checked before any work so that a bad path is one ``error:`` line
and not a traceback after minutes of loading."""

from __future__ import annotations

import os
import sys
from typing import Optional


def output_file_problem(path: str, overwrite: bool = False) -> Optional[str]:
    """Why ``path`` cannot name a file for a command to write: ``empty``, ``a directory``, ``no such directory
    '<dir>'``, ``already exists`` (unless ``overwrite``: a file is not replaced by accident), ``directory '<dir>' is
    not writable`` or ``the file is not writable``; None when it can. The command lines check their output path
    with it before any work."""
    if not path:
        return "empty"
    if os.path.isdir(path):
        return "a directory"
    where = os.path.dirname(path) or "."
    if not os.path.isdir(where):
        return f"no such directory {where!r}"
    exists = os.path.exists(path)
    if exists and not overwrite:
        return "already exists"
    if not (os.access(where, os.W_OK) and can_write(path)):
        return "the file is not writable" if exists else f"directory {where!r} is not writable"
    return None


def can_write(path: str) -> bool:
    """Whether ``path`` opens for writing, tried without changing it: a new file is created and removed again, an
    existing one is opened without truncating. ``os.access`` alone passes for root where nothing can be created
    (``/proc``, a read-only mount). Non-blocking, so that a FIFO without a reader fails instead of hanging."""
    exists = os.path.exists(path)
    flags = os.O_WRONLY | os.O_NONBLOCK | (0 if exists else os.O_CREAT | os.O_EXCL)
    try:
        os.close(os.open(path, flags, 0o644))
        if not exists:
            os.remove(path)
    except OSError:
        return False
    return True


def report_unwritable(label: str, path: str, reason: object) -> int:
    """Print a command's one ``error:`` line for an output file ``path`` that could not be written, on stderr;
    returns the exit status for it, 2.

    Args:
        label: how the command line names the file (``OUT``, ``config key `out`:``).
        reason: why, in the system's words (an ``OSError``'s ``strerror``).
    """
    print(f"error: {label} {path!r}: cannot be written ({reason}); pass another path", file=sys.stderr)
    return 2
