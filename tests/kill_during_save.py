"""``train.py`` with one rank SIGKILLed in the middle of a save (tests/test_checkpoint.py: a restart resumes)::

    torchrun --nproc_per_node 2 --max-restarts 1 tests/kill_during_save.py STEP:RANK [train.py overrides ...]

Rank ``RANK`` kills itself right after writing its DCP data of the save at step ``STEP``, before the save
completes (no ``manifest.json``, the directory still ``step_<STEP>.tmp``); only in the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0), so the restarted workers run through.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's dlrm, as train.py imports it

import torch.distributed as dist  # noqa: E402

from dlrm.checkpoint.writers import ManifestWriter  # noqa: E402
from dlrm.cli import main  # noqa: E402


def kill_after_write(step: int, rank: int) -> None:
    """Make every ``ManifestWriter`` (the CPU and CUDA savers' base) of rank ``rank`` SIGKILL the process once its
    data files of the save at ``step`` are written."""
    write_data = ManifestWriter.write_data

    def write_then_kill(self, plan, planner):  # type: ignore[no-untyped-def]
        fut = write_data(self, plan, planner)
        me = dist.get_rank() if dist.is_initialized() else 0
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first and me == rank and os.path.basename(str(self.path)) == f"step_{step}.tmp":
            fut.wait()
            print(f"kill_during_save: killing rank {me} mid-save", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return fut

    ManifestWriter.write_data = write_then_kill  # type: ignore[method-assign]


if __name__ == "__main__":
    at_step, at_rank = (int(x) for x in sys.argv.pop(1).split(":"))
    kill_after_write(at_step, at_rank)
    main()
