"""``torchrun`` with an exit status that tells a scheduler "preempted, resumable" apart from "failed".

    python -m dlrm.torchrun --standalone --nproc_per_node 8 train.py experiment=mlperf_dlrmv2 ...

Takes exactly ``torchrun``'s arguments and runs ``torch.distributed.run``. The difference is the end of a run
stopped by a signal. On SIGTERM (or SIGINT, SIGHUP, SIGQUIT) torchrun forwards the signal to its workers; the
trainer finishes its step, saves a checkpoint and exits 0. torchrun itself then re-raises the signal as a
``SignalException`` and exits 1 with a traceback, the status of a crash. This launcher prints one line instead and
exits ``128 + signal number`` (143 for SIGTERM), the POSIX status of a process stopped by that signal, so that:

- Kubernetes (torchx ``-s kubernetes``, Volcano): the pod fails with exit code 143 and the job's retry policy
  (``--max_retries``) restarts it; a ``podFailurePolicy`` rule ``onExitCodes: [143]`` with ``action: Ignore``
  keeps preemptions from counting against the retry budget. Exit 0 would have marked the job complete.
- Slurm: a preempted job is requeued by Slurm's own policy (``--requeue``) whatever the status; ``sacct`` shows
  state ``PREEMPTED`` (or ``CANCELLED`` for ``scancel``) with exit code ``143:0`` instead of ``1:0``.
- torchx ``local_cwd`` / ``local_docker``: the app ends ``FAILED`` either way; the status tells the two apart.

A bad argument or config is the other end handled here: every rank prints its ``error:`` line and exits 2 (or is
stopped by torchrun's SIGTERM once the first has exited), and torchrun would add a ``ChildFailedError`` traceback
and exit 1; the launcher exits 2 instead, adding nothing.

A restarted job resumes from the newest complete checkpoint with ``checkpoint.resume=auto`` (the default).
torchrun gives its workers 30 s between the forwarded signal and SIGKILL (``--shutdown-timeout`` where the
installed torch has it); the scheduler's grace period (Kubernetes ``terminationGracePeriodSeconds``, Slurm
``KillWait``) must cover that too, and both must exceed one step plus a checkpoint save.
"""

from __future__ import annotations

import signal
import sys
from typing import List, Optional

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

# The exit status of the trainer's (and the other commands') bad-input errors, after their one `error:` line.
USER_ERROR_STATUS = 2


def exit_status(sig: int) -> int:
    """The POSIX exit status of a process stopped by signal ``sig``: ``128 + sig`` (SIGTERM 15 -> 143)."""
    return 128 + int(sig)


def _bad_nproc(args: List[str]) -> Optional[str]:
    """The value of ``--nproc_per_node`` / ``--nproc-per-node`` in torchrun's own arguments (before the script)
    when it is an integer below 1 (torchrun fails on it with an assertion traceback), else None."""
    for i, a in enumerate(args):
        if a.endswith(".py") or a in ("-m", "--module"):
            return None  # the script: what follows is its own arguments
        name, _, value = a.partition("=")
        if name in ("--nproc_per_node", "--nproc-per-node"):
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            try:
                return value if int(value) < 1 else None
            except ValueError:
                return None  # gpu, cpu, auto, or torchrun's own error
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``); return its status, :func:`exit_status` of the
    signal that stopped it, or :data:`USER_ERROR_STATUS` when a worker exited with it (after its ``error:`` line)
    and every other failed worker did too or was stopped by torchrun's SIGTERM. torchrun's own errors (bad
    arguments, a worker failing otherwise) pass through unchanged.

    Raises:
        ChildFailedError: a worker failed with another status or a signal (torchrun's report of it).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    bad = _bad_nproc(args)
    if bad is not None:
        print(f"error: --nproc_per_node {bad}: give a positive number of processes per node (or gpu, cpu, auto)",
              file=sys.stderr)  # fmt: skip
        return USER_ERROR_STATUS
    try:
        torchrun_main(args)
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        # Once one worker exits, torchrun SIGTERMs the rest: a rank still exiting after its own error line is
        # recorded as killed by SIGTERM (-15), not as exit 2, depending on which rank finished first.
        if USER_ERROR_STATUS in codes and codes <= {USER_ERROR_STATUS, -signal.SIGTERM}:
            return USER_ERROR_STATUS  # the ranks' error lines say it all; torchrun's report would bury them
        raise
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        status = exit_status(e.sigval)
        print(
            f"torchrun: stopped by {name}; the workers were asked to finish the step and save a checkpoint; "
            f"exit status {status} (resume: relaunch with checkpoint.resume=auto)",
            file=sys.stderr,
            flush=True,
        )
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
