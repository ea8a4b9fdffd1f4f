"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): periodic async save, exact resume, SIGTERM.

Keys: ``checkpoint.every_n_steps``, ``checkpoint.keep_last``, ``checkpoint.dir``, ``checkpoint.resume``,
``checkpoint.async_save``, ``checkpoint.save_on_sigterm`` (``dlrm/config/schema.py``, ``CheckpointConfig``)::

    python train.py hydra.run.dir=runs/a checkpoint.every_n_steps=100            # saves runs/a/checkpoints/step_N
    python train.py hydra.run.dir=runs/a checkpoint.every_n_steps=100            # again: resumes (resume=auto)
    python train.py checkpoint.resume=runs/a/checkpoints/step_200 ...            # from one given checkpoint
    python -m dlrm.export runs/a/checkpoints/step_200 model.pt                   # unsharded, for inference

Layout of one checkpoint ``<dir>/step_<N>/``:

- DCP files (``.metadata`` plus one ``__<rank>_0.distcp`` per rank) of ``{"model": DMP state_dict,
  "optim": optimizer state}``: embedding tables as ``ShardedTensor`` for every sharding type (replicated
  ``data_parallel`` tables are written once), the MLPs, every table's Adagrad state as TBE ``momentum1`` (also
  a ``data_parallel`` table's, whose dense Adagrad ``sum`` it is) and the MLPs' dense Adagrad state (``sum``,
  ``step``), all under parameter names that do not depend on the world size or plan (:func:`optimizer_state`).
  DCP reshards on load, so a checkpoint written by one world size and plan loads into another, every entry
  restored or the load refused (:func:`load_app_state`).
- ``meta.json`` (rank 0): step, samples seen, world size, global batch, LR scheduler state, the plan, what the
  plan was made from (:func:`planning_inputs`), the resolved config.
- ``plan.json`` (rank 0): the sharding plan (:func:`dlrm.sharding.save_plan`); a resume with the same world
  layout and planning inputs loads into it instead of planning anew.
- ``rank_<r>.pt`` (each rank): RNG states (torch, numpy, python, CUDA) and the unlogged training-metric window
  (:class:`dlrm.metrics.MetricWindow`).
  They are per rank and small, and DCP requires every rank to load the same keys, so they live beside it.
- ``manifest.json`` (rank 0, written last): every other file's size and CRC-32 per 64 MiB block. Before a
  resume or an export the ranks check it together (``checkpoint.verify``: ``full`` reads every byte once over
  the job, ``size`` only sizes, :func:`verify_checkpoint`); ``resume=auto`` falls back to the previous
  checkpoint when the newest is damaged, a given ``resume=<path>`` fails with one line naming the file.

Atomicity: a save writes into ``step_<N>.tmp/``; rank 0 renames it to ``step_<N>/`` once DCP's save has finished
on every rank (DCP's final gather of all ranks' write results precedes rank 0's ``.metadata`` write, so rank 0's
save returning means every rank's data is on disk). Readers only consider ``step_<N>`` directories that hold
``.metadata`` and ``meta.json``; a leftover ``*.tmp`` (a save interrupted by a crash) is reported and removed
at the next start.

Async save: the state is staged in host memory, then DCP writes it from a background thread while training
continues; the next save waits for the previous one. The save's collectives run on a dedicated gloo process
group, so they never interleave with the training's collectives. On CPU, staging is DCP's own copy
(``FileSystemWriter.stage``). On CUDA (:class:`~dlrm.checkpoint.writers.StreamStagedWriter`) the device-to-host
copies run on a staging stream of their own into pinned buffers allocated at the first save and reused: the
staging stream first waits for an event recorded on the training stream (so it copies this step's weights), and
the training stream waits for the copies' completion event before its next kernel, because the next backward
updates the TBE weights and optimizer state in place (fused optimizer) and the dense optimizer step updates the
MLPs in place. The host never blocks on the copy; the writer thread waits for the completion event before it
reads the buffers.

Preemption: SIGTERM sets a flag; at the end of the current step every rank agrees on it (a 1-int all-reduce on
its own gloo group when world > 1), saves synchronously, and the run exits with status 0. The next start with
the same ``checkpoint.dir`` resumes. Under ``torchrun --max-restarts K`` (with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, see ``dlrm/process_group.py``; torchx: ``launch/components.py:trainer
--max_restarts K``) a rank killed outright leads to a restart of all ranks, which resume from the newest complete
checkpoint; a scheduler retry (torchx ``--max_retries``) relaunches the job, which resumes the same way.

Why our own package: DCP does the sharded I/O and resharding; what the run needs around it (atomic directories,
retention, the run's step / data position / RNG / metric window, layout reports on reshard, SIGTERM) is specific
to this trainer. It takes that state explicitly (:class:`TrainState`, :class:`RunFacts`, the model, optimizer and
scheduler), not the trainer.

Modules, one job each: :mod:`~dlrm.checkpoint.layout` (``step_<N>`` directories, file names, completeness),
:mod:`~dlrm.checkpoint.reader` (``meta.json``, :class:`CheckpointError`), :mod:`~dlrm.checkpoint.manifest` (block
checksums, verification), :mod:`~dlrm.checkpoint.rng` (RNG states), :mod:`~dlrm.checkpoint.state_names`
(world-size independent optimizer names, the earlier layout's), :mod:`~dlrm.checkpoint.state` (what DCP saves and
loads, :func:`load_app_state`), :mod:`~dlrm.checkpoint.resume_checks` (refusals before a load),
:mod:`~dlrm.checkpoint.selection` (which checkpoint to resume from), :mod:`~dlrm.checkpoint.plan_reuse` (the saved
plan), :mod:`~dlrm.checkpoint.writers` (DCP writers, a save failed on a full disk),
:mod:`~dlrm.checkpoint.run_state` (:class:`TrainState`, :class:`RunFacts`) and
:mod:`~dlrm.checkpoint.checkpointer` (:class:`Checkpointer`).
"""

from dlrm.checkpoint.checkpointer import Checkpointer
from dlrm.checkpoint.layout import (
    MANIFEST,
    META,
    PLAN,
    checkpoint_root,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
    resolve_checkpoint,
    step_dir,
)
from dlrm.checkpoint.manifest import BLOCK, file_entry, verify_checkpoint, write_manifest
from dlrm.checkpoint.plan_reuse import planning_inputs, saved_plan
from dlrm.checkpoint.reader import CheckpointError, load_dcp, read_checkpoint_meta, read_dcp_metadata
from dlrm.checkpoint.resume_checks import check_resume, config_key_behind, model_mismatch
from dlrm.checkpoint.rng import rng_state, set_rng_state
from dlrm.checkpoint.run_state import RunFacts, TrainState
from dlrm.checkpoint.selection import choose_checkpoint
from dlrm.checkpoint.state import LoadReport, app_state, load_app_state
from dlrm.checkpoint.state_names import optimizer_state

__all__ = [
    "BLOCK",
    "MANIFEST",
    "META",
    "PLAN",
    "CheckpointError",
    "Checkpointer",
    "LoadReport",
    "RunFacts",
    "TrainState",
    "app_state",
    "check_resume",
    "checkpoint_root",
    "choose_checkpoint",
    "config_key_behind",
    "file_entry",
    "is_complete",
    "latest_checkpoint",
    "list_checkpoints",
    "load_app_state",
    "load_dcp",
    "model_mismatch",
    "optimizer_state",
    "planning_inputs",
    "read_checkpoint_meta",
    "read_dcp_metadata",
    "resolve_checkpoint",
    "rng_state",
    "saved_plan",
    "set_rng_state",
    "step_dir",
    "verify_checkpoint",
    "write_manifest",
]
