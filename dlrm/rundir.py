"""One owner per run directory, and storage faults as one ``error:`` line.

Ownership. Rank 0 of a run holds ``<dir>/owner.lock`` for the run's lifetime, in the run directory and, when
``checkpoint.dir`` lies outside it and the run saves, in the checkpoint directory too. The file records the owner
(host, pid, start time in UTC, the job's identity); liveness is an OS lock on it (``fcntl.lockf``, a POSIX record
lock), which the kernel releases when the process ends in any way, ``kill -9`` included. So at start-up:

- the lock is held by a live process: the launch is refused before it touches anything (no ``.hydra/`` rewrite,
  no removal of an interrupted ``step_<N>.tmp``, no ``config.yaml``, no ``metrics.jsonl`` append), with one
  ``error:`` line naming the owner, exit status 2. A holder of the same job identity (a restart whose previous
  attempt is still exiting) is waited for up to :data:`SAME_JOB_WAIT_S` seconds first.
- the lock is free but the file still names an owner: that run ended without releasing it (killed, node lost). A
  restart of the same job (``torchrun --max-restarts``, torchx ``--max_retries``, a Slurm requeue: the same
  :func:`job_identity`) takes it over with an info line; any other launch with a warning naming the previous owner.
  Both resume from the newest complete checkpoint.
- a clean end (success or a refused start) empties the file; the next launch starts without a warning.

Multi-rank: only rank 0 takes the locks; its verdict is broadcast so that every rank raises the same error
together (no rank waits on a peer that stopped).

Network filesystems: POSIX locks work on NFSv3 (through ``lockd``) and NFSv4 (in the protocol, leased: the lock of
a lost node is released when its lease expires, about 90 s by default). On a filesystem that refuses locks
(``ENOLCK``, e.g. NFS mounted ``nolock``) ownership falls back to the record: a record of this host is alive while
its pid is; a record of another host, not of this job, is taken as alive (it cannot be checked from here) and the
error says to delete ``owner.lock`` if that run is gone.

Storage. :func:`check_writable` refuses at start-up a ``checkpoint.dir`` that saves could not write (read-only
mount, no permission); :func:`storage_error` turns an ``ENOSPC`` / ``EDQUOT`` / ``EROFS`` during a save or a
metrics write into a :class:`StorageError` naming the path, the bytes needed and the bytes free.

Why our own: neither torchrun, torchx, Slurm nor Hydra owns an output directory; DCP writes where it is told.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, Tuple

from dlrm.errors import ConfigError, InputError

LOCK_NAME = "owner.lock"
SAME_JOB_WAIT_S = 30.0  # how long a restart waits for its previous attempt to let go of the lock
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_HELD = {errno.EACCES, errno.EAGAIN}
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")  # this process's start, for the record
_held: Dict[str, "DirLock"] = {}  # realpath -> lock held by this process (POSIX locks do not exclude oneself)


class StorageError(InputError):
    """A write failed for want of space or because the filesystem is read-only; the message names the path, the
    bytes needed and free, and the fix."""


def job_identity(env: Mapping[str, str]) -> Dict[str, str]:
    """What identifies this job across its restarts (empty for a process started by hand).

    Args:
        env: the process environment.

    Returns:
        Any of ``torchx`` (the app id at the end of ``$TORCHX_JOB_ID``), ``slurm`` (``$SLURM_JOB_ID``, kept by a
        requeue), ``torchrun`` (``$TORCHELASTIC_RUN_ID``, kept by ``--max-restarts``; not its placeholder
        ``none``) that are set.
    """
    out = {}
    torchx = env.get("TORCHX_JOB_ID", "").rstrip("/").rpartition("/")[2]
    if torchx:
        out["torchx"] = torchx
    if env.get("SLURM_JOB_ID"):
        out["slurm"] = env["SLURM_JOB_ID"]
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id.strip().lower() not in ("", "none"):
        out["torchrun"] = run_id
    return out


def _same_job(a: Any, b: Dict[str, str]) -> bool:
    """Both name a job and agree on every identity they both have."""
    if not (isinstance(a, dict) and a and b):
        return False
    common = set(a) & set(b)
    return bool(common) and all(a[k] == b[k] for k in common)


def describe(rec: Mapping[str, Any]) -> str:
    """An owner record as ``pid PID on host HOST, started TIME (job ...)``."""
    job = rec.get("job") or {}
    jobs = ", ".join(f"{k} {v}" for k, v in sorted(job.items())) if isinstance(job, dict) else ""
    return f"pid {rec.get('pid', '?')} on host {rec.get('host', '?')}, started {rec.get('start', '?')}" + (
        f" ({jobs})" if jobs else ""
    )


def _read(fd: int) -> Dict[str, Any]:
    try:
        data = os.pread(fd, 65536, 0)
        rec = json.loads(data.decode("utf-8")) if data.strip() else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "start": "? (owner.lock is unreadable)"}
    return rec if isinstance(rec, dict) else {}


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DirLock:
    """Ownership of one directory (:func:`claim`); :meth:`release` empties the record and drops the lock."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory, self.fd = directory, fd
        self.path = os.path.join(directory, LOCK_NAME)
        # (level, message) when a previous owner's record was taken over: the caller logs it once logging is set up
        self.notice: Optional[Tuple[int, str]] = None

    def release(self) -> None:
        """Empty the record (a clean end: the next launch takes the directory without a warning) and unlock."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass  # a full or read-only disk: the lock still goes with the close
        os.close(self.fd)
        self.fd = -1
        _held.pop(os.path.realpath(self.directory), None)


def claim(directory: str, key: str, env: Mapping[str, str]) -> DirLock:
    """Take ownership of ``directory`` (made if absent) for this process, or refuse.

    Args:
        directory: the run directory or the checkpoint directory.
        key: the config key that named it (``hydra.run.dir``, ``checkpoint.dir``), for the messages.
        env: the process environment (:func:`job_identity`).

    Returns:
        The held :class:`DirLock`; keep it for the run's lifetime. Its ``notice`` says whose record it took over:
        an INFO for a restart of the same job, a WARNING for another run that is gone.

    Raises:
        ConfigError: a live run owns ``directory`` (the message names its host, pid, start time and job); the
            directory cannot be made or written (read-only, no permission, a file in its way).
    """
    real = os.path.realpath(directory)
    if real in _held:
        raise ConfigError(_in_use(directory, key, {**_record(env), "pid": os.getpid()}))
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(
            f"config key `{key}`: cannot write {directory} ({e.strerror or e}); give a writable directory"
        ) from None
    me = job_identity(env)
    try:
        prev = _lock(fd, directory, key, me)
        _write(fd, _record(env))
    except BaseException:
        os.close(fd)
        raise
    lock = DirLock(directory, fd)
    _held[real] = lock
    if prev and _same_job(prev.get("job"), me):
        lock.notice = (logging.INFO, f"{directory}: taking over from this job's previous attempt ({describe(prev)})")
    elif prev:
        lock.notice = (
            logging.WARNING,
            f"{directory} was owned by a run that is gone ({describe(prev)}: killed or its node lost); taking it over",
        )
    return lock


def _lock(fd: int, directory: str, key: str, me: Dict[str, str]) -> Dict[str, Any]:
    """Lock ``fd`` (waiting for a restart's previous attempt); return the previous owner's record ({} if none)."""
    deadline = time.monotonic() + SAME_JOB_WAIT_S
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return _read(fd)
        except OSError as e:
            if e.errno in _NO_LOCKS:
                return _by_record(fd, directory, key, me)
            if e.errno not in _HELD:
                raise ConfigError(
                    f"config key `{key}`: cannot lock {os.path.join(directory, LOCK_NAME)} ({e.strerror or e})"
                ) from None
        owner = _read(fd)
        if not _same_job(owner.get("job"), me) or time.monotonic() > deadline:
            raise ConfigError(_in_use(directory, key, owner))
        time.sleep(0.5)


def _by_record(fd: int, directory: str, key: str, me: Dict[str, str]) -> Dict[str, Any]:
    """Ownership on a filesystem without locks: the record decides (module docstring)."""
    owner = _read(fd)
    if not owner or _same_job(owner.get("job"), me):
        return owner
    if owner.get("host") == socket.gethostname() and not _pid_alive(owner.get("pid")):
        return owner
    raise ConfigError(
        _in_use(directory, key, owner)
        + f" (this filesystem has no file locks: if that run is gone, delete {os.path.join(directory, LOCK_NAME)})"
    )


def _in_use(directory: str, key: str, owner: Mapping[str, Any]) -> str:
    return (
        f"config key `{key}`: {directory} is in use by a live run: {describe(owner)}; wait for it to end or stop "
        "it, or give this run another directory"
    )


def _record(env: Mapping[str, str]) -> Dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _started, "job": job_identity(env)}


def _write(fd: int, rec: Dict[str, Any]) -> None:
    data = (json.dumps(rec) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def probe(directory: str, key: str, env: Mapping[str, str]) -> None:
    """Refuse, before Hydra writes ``.hydra/`` there, a launch into ``directory`` while a live run of another job
    holds its lock. Creates and changes nothing (a shared lock, tried and dropped); a directory without
    ``owner.lock``, or a filesystem without locks, passes (:func:`claim` decides later).

    Raises:
        ConfigError: as :func:`claim`.
    """
    if os.path.realpath(directory) in _held:
        return  # closing a second descriptor of the file would drop this process's lock on it
    try:
        fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in _HELD:
                owner = _read(fd)
                if not _same_job(owner.get("job"), job_identity(env)):
                    raise ConfigError(_in_use(directory, key, owner)) from None
    finally:
        os.close(fd)


def _nearest_existing(path: str) -> str:
    """``path`` made absolute, or its nearest ancestor that exists (a directory the run would create)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    return p


def check_writable(path: str, key: str, why: str) -> None:
    """Refuse a directory that this run will write into but cannot: its nearest existing ancestor is read-only
    or not writable by this user (``access(2)``, which also sees a read-only mount). Creates nothing.

    Raises:
        ConfigError: names ``key``, ``path``, the reason and ``why`` (what would have written there).
    """
    probe_at = _nearest_existing(path)
    if not os.path.isdir(probe_at):
        raise ConfigError(f"config key `{key}`: {probe_at} is a file; give a directory")
    if os.access(probe_at, os.W_OK | os.X_OK):
        return
    try:
        ro = os.statvfs(probe_at).f_flag & os.ST_RDONLY
    except OSError:
        ro = False
    what = "is on a read-only filesystem" if ro else "is not writable by this user"
    raise ConfigError(f"config key `{key}`: {path} {what}; {why}")


def make_dir(path: str, what: str, fix: str, error: type = InputError) -> None:
    """``os.makedirs(path, exist_ok=True)``, or one user error for a directory that cannot be made.

    Raises:
        InputError: (or ``error``, a subclass) ``what``, the system's reason and ``fix``.
    """
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise error(f"{what} ({e.strerror or e}); {fix}") from None


def free_bytes(path: str) -> Optional[int]:
    """Bytes free to this user on the filesystem of ``path`` (or of its nearest existing ancestor)."""
    try:
        return shutil.disk_usage(_nearest_existing(path)).free
    except OSError:
        return None


def _causes(e: Optional[BaseException]) -> List[BaseException]:
    """``e``, the exceptions it was raised from, and those of every rank a DCP ``CheckpointException`` gathered
    (its ``failures``: rank -> (exception, traceback))."""
    out: List[BaseException] = []
    todo = [e]
    while todo:
        x = todo.pop()
        if x is None or any(x is y for y in out):
            continue
        out.append(x)
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] for f in failures.values() if isinstance(f, tuple) and f]
    return out


def is_storage_fault(e: BaseException) -> bool:
    """``e`` (or an exception it wraps) is a full disk, an exceeded quota or a read-only filesystem."""
    return any(isinstance(x, OSError) and x.errno in _NO_SPACE | {errno.EROFS} for x in _causes(e))


def storage_error(path: str, e: BaseException, needed: Optional[int], fix: str) -> StorageError:
    """The one-line error for a write to ``path`` that failed with ``e`` for want of space or on a read-only
    filesystem.

    Args:
        path: the file or directory being written.
        e: the failure: an ``OSError`` (its ``strerror`` is the reason) or one that wraps none (torch's zip writer
            reports a short write as ``RuntimeError: ... unexpected pos``): then "No space left on device".
        needed: bytes the write needed (None: unknown).
        fix: what the user does next.
    """
    errs = [x for x in _causes(e) if isinstance(x, OSError) and x.errno is not None]
    reason = (errs[0].strerror if errs else None) or os.strerror(errno.ENOSPC)
    free = free_bytes(path)
    need = f"; needs {needed:,} bytes" if needed is not None else ""
    have = f", {free:,} free" if free is not None else ""
    return StorageError(f"cannot write {path}: {reason}{need}{have}; {fix}")


def claim_run(run_dir: str, checkpoint_root: str, saves: bool, env: Mapping[str, str]) -> List[DirLock]:
    """Own the run directory and, when it lies outside it and the run saves, the checkpoint directory
    (:func:`claim`); check first that saves could be written there (:func:`check_writable`).

    Args:
        run_dir: the run directory (``hydra.run.dir``).
        checkpoint_root: where ``step_<N>/`` go (``checkpoint.dir``, default ``<run_dir>/checkpoints``).
        saves: whether this run can save (``checkpoint.every_n_steps`` > 0 or ``checkpoint.save_on_sigterm``).
        env: the process environment.

    Returns:
        The held locks (release them at the end of the run).

    Raises:
        ConfigError: see :func:`claim` and :func:`check_writable`.
    """
    locks = [claim(run_dir, "hydra.run.dir", env)]
    try:
        if saves:
            check_writable(
                checkpoint_root,
                "checkpoint.dir",
                "give a writable checkpoint.dir, or set checkpoint.every_n_steps=0 checkpoint.save_on_sigterm=false "
                "to train without saving",
            )
            inside = os.path.realpath(checkpoint_root).startswith(os.path.realpath(run_dir) + os.sep)
            if not inside:
                locks.append(claim(checkpoint_root, "checkpoint.dir", env))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks
