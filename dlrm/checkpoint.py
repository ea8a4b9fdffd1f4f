"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): periodic async save, exact resume, SIGTERM.

Keys: ``checkpoint.every_n_steps``, ``checkpoint.keep_last``, ``checkpoint.dir``, ``checkpoint.resume``,
``checkpoint.async_save``, ``checkpoint.save_on_sigterm`` (``dlrm/config.py``, ``CheckpointConfig``)::

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
(``FileSystemWriter.stage``). On CUDA (:class:`_StreamStagedWriter`) the device-to-host copies run on a staging
stream of their own into pinned buffers allocated at the first save and reused: the staging stream first waits
for an event recorded on the training stream (so it copies this step's weights), and the training stream waits
for the copies' completion event before its next kernel, because the next backward updates the TBE weights and
optimizer state in place (fused optimizer) and the dense optimizer step updates the MLPs in place. The host
never blocks on the copy; the writer thread waits for the completion event before it reads the buffers.

Preemption: SIGTERM sets a flag; at the end of the current step every rank agrees on it (a 1-int all-reduce on
its own gloo group when world > 1), saves synchronously, and the run exits with status 0. The next start with
the same ``checkpoint.dir`` resumes. Under ``torchrun --max-restarts K`` (with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, see ``dlrm/dist.py``; torchx: ``launch/components.py:trainer
--max_restarts K``) a rank killed outright leads to a restart of all ranks, which resume from the newest complete
checkpoint; a scheduler retry (torchx ``--max_retries``) relaunches the job, which resumes the same way.

Why our own module: DCP does the sharded I/O and resharding; what the run needs around it (atomic directories,
retention, the run's step / data position / RNG / metric window, layout reports on reshard, SIGTERM) is specific
to this trainer. It takes that state explicitly (:class:`TrainState`, :class:`RunFacts`, the model, optimizer and
scheduler), not the trainer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import threading
import time
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf
from torch.distributed.checkpoint import CheckpointException, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from dlrm import torchrec_compat as compat
from dlrm.config import CheckpointConfig, Config
from dlrm.dist import DistInfo
from dlrm.errors import ConfigError, InputError
from dlrm.metrics import MetricWindow
from dlrm.rundir import StorageError, free_bytes, is_storage_fault, storage_error
from dlrm.schedule import load_scheduler_state
from dlrm.sharding import plan_fingerprint, plan_rows, save_plan

log = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step_(\d+)$")
_TMP_RE = re.compile(r"^step_(\d+)\.tmp$")
META = "meta.json"
MANIFEST = "manifest.json"  # written last: every file of the checkpoint, its size and block checksums
PLAN = "plan.json"  # the plan the checkpoint was trained with (a resume on the same layout reuses it)

# Test hook (tests/test_checkpoint.py): "STEP:RANK" makes that rank SIGKILL itself right after writing its DCP
# data of the save at STEP, before the save completes; only in a first attempt (TORCHELASTIC_RESTART_COUNT 0).
TEST_KILL_DURING_SAVE_ENV = "DLRM_TEST_KILL_DURING_SAVE"


# ------------------------------------------------------------------------------------------- directory layout
def step_dir(root: str, step: int) -> str:
    """Path of the checkpoint of optimizer step ``step`` under ``root``: ``<root>/step_<step>`` (not checked)."""
    return os.path.join(root, f"step_{step}")


def is_complete(path: str) -> bool:
    """A finished checkpoint: named ``step_<N>`` with DCP's ``.metadata`` and our ``meta.json``."""
    return (
        bool(_STEP_RE.match(os.path.basename(os.path.normpath(path))))
        and os.path.isfile(os.path.join(path, ".metadata"))
        and os.path.isfile(os.path.join(path, META))
    )


def list_checkpoints(root: str) -> List[Tuple[int, str]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first (``[]`` if ``root`` is absent)."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m and is_complete(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def latest_checkpoint(root: str) -> Optional[str]:
    """The complete checkpoint of the highest step under ``root`` (:func:`list_checkpoints`), or None if there is
    none; its files are not verified (:func:`verify_checkpoint`)."""
    ckpts = list_checkpoints(root)
    return ckpts[-1][1] if ckpts else None


def resolve_checkpoint(path: str) -> str:
    """``path`` itself if it is a complete checkpoint, else the newest complete one under it.

    Raises:
        FileNotFoundError: neither; the message says what is there.
    """
    if is_complete(path):
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    why = (
        "does not exist"
        if not os.path.exists(path)
        else (
            "is an incomplete save (a *.tmp directory)"
            if path.rstrip("/").endswith(".tmp")
            else "is neither a step_<N> checkpoint (with .metadata and meta.json) nor a directory holding one"
        )
    )
    raise FileNotFoundError(f"checkpoint {path!r} {why}")


def read_meta(path: str) -> Dict[str, Any]:
    """The parsed ``meta.json`` of the checkpoint directory ``path`` (UTF-8 JSON).

    Raises:
        FileNotFoundError: ``path`` has no ``meta.json``.
        json.JSONDecodeError: ``meta.json`` is not valid JSON (a ``ValueError``).
        UnicodeDecodeError: ``meta.json`` is not UTF-8 (a ``ValueError``).

    :meth:`Checkpointer.resume` turns each of these into a :class:`CheckpointError` naming the checkpoint.
    """
    with open(os.path.join(path, META), encoding="utf-8") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------- manifest
class CheckpointError(InputError):
    """A checkpoint that cannot be used: damaged (a file missing, truncated or altered) or unreadable. The message
    names the checkpoint and the file."""


MANIFEST_FORMAT = "dlrm-checkpoint-manifest/1"
BLOCK = 64 * 2**20  # bytes per checksum block: blocks are verified in parallel, across ranks and threads


def _block_crcs(path: str, start: int = 0, stop: Optional[int] = None) -> List[int]:
    """crc32 of each ``BLOCK`` of ``path`` from block ``start`` to ``stop`` (zlib releases the GIL: threads run
    in parallel)."""
    out = []
    with open(path, "rb") as f:
        f.seek(start * BLOCK)
        i = start
        while stop is None or i < stop:
            data = f.read(BLOCK)
            if not data:
                break
            out.append(zlib.crc32(data))
            i += 1
    return out


def file_entry(path: str, threads: int = 1) -> Dict[str, Any]:
    """The manifest entry of one file: its size in bytes and the crc32 of each ``BLOCK``."""
    size = os.path.getsize(path)
    n = max(1, -(-size // BLOCK))
    if threads <= 1 or n == 1:
        return {"size": size, "crc32": _block_crcs(path)}
    with ThreadPoolExecutor(max_workers=threads) as pool:
        parts = pool.map(lambda i: _block_crcs(path, i, i + 1), range(n))
        return {"size": size, "crc32": [c for p in parts for c in p]}


def write_manifest(path: str) -> Dict[str, Any]:
    """Merge the ranks' ``manifest_rank_<r>.json`` (their data files) with entries for the small files (DCP's
    ``.metadata``, ``meta.json``, ``plan.json``, every ``rank_<r>.pt``) into ``manifest.json``, written last (to a
    temporary name, then renamed), and remove the parts. Returns the manifest."""
    files: Dict[str, Any] = {}
    for name in sorted(os.listdir(path)):
        if name.startswith("manifest_rank_") and name.endswith(".json"):
            with open(os.path.join(path, name), encoding="utf-8") as f:
                files.update(json.load(f))
    for name in sorted(os.listdir(path)):
        if name not in files and not name.startswith("manifest") and os.path.isfile(os.path.join(path, name)):
            files[name] = file_entry(os.path.join(path, name))
    manifest = {"format": MANIFEST_FORMAT, "block_bytes": BLOCK, "files": files}
    with open(os.path.join(path, MANIFEST + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(path, MANIFEST + ".tmp"), os.path.join(path, MANIFEST))
    for name in os.listdir(path):
        if name.startswith("manifest_rank_"):
            os.remove(os.path.join(path, name))
    return manifest


def _rank_manifest(path: str, rank: int) -> str:
    return os.path.join(path, f"manifest_rank_{rank}.json")


def _threads() -> int:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(8, (os.cpu_count() or 1) // local))


def verify_checkpoint(path: str, rank: int = 0, world: int = 1, full: bool = True) -> Optional[str]:
    """Check this rank's share of a checkpoint's files against its manifest.

    Every rank checks that every file exists with its recorded size (cheap); the checksums are read by one rank
    per block, blocks dealt out over ``world`` ranks and a few threads each, so a job reads each byte once. With
    ``full=False`` only the sizes are checked.

    Returns:
        None when this rank's share is intact, or ``path`` is a bare DCP checkpoint (``.metadata`` without this
        trainer's ``meta.json``, e.g. a ``dcp.save`` of one's own), which has no manifest; else one line naming the
        file and what is wrong.
    """
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        if not os.path.isfile(os.path.join(path, META)):
            return None
        return f"{MANIFEST} is missing (every save writes one: the checkpoint was copied or written incompletely)"
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    try:  # a damaged manifest or a file that vanishes mid-check is a verdict, so every rank reaches the gather
        return _verify_files(path, files, rank, world, full)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} does not describe the files ({type(e).__name__}: {e})"


def _verify_files(path: str, files: Dict[str, Any], rank: int, world: int, full: bool) -> Optional[str]:
    for name, entry in sorted(files.items()):
        fpath = os.path.join(path, name)
        if not os.path.isfile(fpath):
            return f"{name} is missing"
        size = os.path.getsize(fpath)
        if size != entry["size"]:
            return f"{name} has {size:,} bytes where the manifest records {entry['size']:,}"
    if not full:
        return None
    blocks = [(name, i, crc) for name, entry in sorted(files.items()) for i, crc in enumerate(entry["crc32"])]
    mine = blocks[rank::world]

    def check(item: Tuple[str, int, int]) -> Optional[str]:
        name, i, crc = item
        got = _block_crcs(os.path.join(path, name), i, i + 1)
        if got != [crc]:
            return f"{name} differs from its manifest checksum at bytes {i * BLOCK:,}-{(i + 1) * BLOCK - 1:,}"
        return None

    with ThreadPoolExecutor(max_workers=_threads()) as pool:
        for err in pool.map(check, mine):
            if err is not None:
                return err
    return None


def unreadable_data(path: str, e: BaseException, fix: str) -> CheckpointError:
    """The error for a DCP load of checkpoint ``path`` that failed with ``e``, naming its first cause and ``fix``.
    DCP reports a failed read as a ``CheckpointException``, a ``BaseException`` (not an ``Exception``) whose text
    is every rank's traceback; the first rank's exception is named instead."""
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return CheckpointError(f"checkpoint {path}: its data cannot be read ({type(e).__name__}: {text}); {fix}")


# ------------------------------------------------------------------------------------------------ app state
def app_state(model: torch.nn.Module, optimizer: Any) -> Dict[str, Any]:
    """What DCP saves and loads in place: ``{"model": model.state_dict(), "optim": optimizer_state(...)}``.

    The tensors are the live ones (``ShardedTensor`` views of the TBE weights and momentum for sharded tables),
    so a DCP load writes straight into the model and optimizer.
    """
    sd = model.state_dict()
    return {"model": sd, "optim": optimizer_state(sd, optimizer)}


_TABLE = "embedding_bags."  # in the name of every table's weight (the rule dlrm.sharding.dense_optimizer uses)


def _model_key(key: str, names: Any) -> str:
    """``key`` without the prefix a ``CombinedOptimizer`` puts before a part's parameter names (``dense.``,
    ``dp_tables.``): the longest tail of ``key`` that is a model state-dict key, else ``key``."""
    parts = key.split(".")
    for i in range(len(parts)):
        tail = ".".join(parts[i:])
        if tail in names:
            return tail
    return key


def optimizer_state(model_sd: Dict[str, Any], optimizer: Any) -> Dict[str, Dict[str, Any]]:
    """The optimizer state as a checkpoint holds it, the same for every world size and plan:
    ``{parameter FQN: {state name: live tensor}}``.

    - Keys are the model's parameter FQNs (TorchRec ``KeyedOptimizer`` keys without the prefix that a
      ``CombinedOptimizer`` of named parts adds, which depends on whether the plan has ``data_parallel`` tables).
    - A table's Adagrad state is ``<table>.momentum1`` in the fused TBE's shape (``adagrad``: ``[rows, dim]``,
      ``rowwise_adagrad``: ``[rows]``), also for a ``data_parallel`` table, whose dense Adagrad ``sum`` it views
      (``[rows, dim]``, or ``[rows, 1]`` viewed as ``[rows]``): the values are the same sums of squared
      gradients, so a table moving between a fused sharding and ``data_parallel`` keeps its state.
    - A ``data_parallel`` table's Adagrad ``step`` is left out: TBE keeps none, and it equals the MLPs' ``step``
      (one optimizer steps both every step), which :func:`load_app_state` copies into it.

    Args:
        model_sd: ``model.state_dict()`` (its keys and shapes decide the names).
        optimizer: a TorchRec ``KeyedOptimizer`` (``state_dict()["state"]`` keyed by parameter name).
    """
    out: Dict[str, Dict[str, Any]] = {}
    for key, states in optimizer.state_dict()["state"].items():
        fqn = _model_key(key, model_sd)
        table = fqn.split(".")[-2] if _TABLE in fqn else None
        for sname, v in states.items():
            if table is not None and "." not in sname:  # the dense optimizer's state of a data_parallel table
                if sname == "step":
                    continue
                if sname == "sum":
                    sname = f"{table}.momentum1"
                    if fqn in model_sd and isinstance(v, torch.Tensor) and v.shape != model_sd[fqn].shape:
                        v = v.view(-1)  # torchrec RowWiseAdagrad's [rows, 1]: TBE's row-wise momentum is [rows]
            out.setdefault(fqn, {})[sname] = v
    return out


def _dp_table_steps(model_sd: Dict[str, Any], optimizer: Any) -> Tuple[List[torch.Tensor], Optional[torch.Tensor]]:
    """The ``step`` tensors of the data_parallel tables' dense Adagrad, and one MLP parameter's ``step``."""
    tables, mlp = [], None
    for key, states in optimizer.state_dict()["state"].items():
        step = states.get("step")
        if isinstance(step, torch.Tensor):
            if _TABLE in _model_key(key, model_sd):
                tables.append(step)
            elif mlp is None:
                mlp = step
    return tables, mlp


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """DCP's fully-qualified names: nested dict keys joined with ``.``."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _global_shape(v: Any) -> Optional[Tuple[int, ...]]:
    return tuple(v.size()) if isinstance(v, torch.Tensor) else None


# Model config keys that decide the entries of each part of the model, in the order they are named.
_CONFIG_KEYS_OF = (
    ("embedding_bags.", ("num_embeddings_per_feature", "row_cap", "embedding_dim")),
    ("dense_arch.", ("dense_arch_layer_sizes", "dense_buckets", "embedding_dim")),
    ("inter_arch.", ("interaction", "dcn_num_layers", "dcn_low_rank_dim", "embedding_dim")),
    ("over_arch.", ("over_arch_layer_sizes", "interaction", "embedding_dim")),
)


def config_key_behind(entry: str, was: Any, now: Any) -> Optional[str]:
    """The ``model.*`` config key that makes state-dict ``entry`` differ between a checkpoint's model config
    ``was`` (its ``meta.json`` ``config.model``) and this run's ``now`` (dicts), as ``"model.<key> was X in the
    checkpoint's config, is Y now"``; None when the configs agree (or either is unknown)."""
    if not isinstance(was, dict) or not isinstance(now, dict):
        return None
    first = [keys for part, keys in _CONFIG_KEYS_OF if part in entry]
    order = [*(first[0] if first else ()), *now]
    for key in order:
        if key in now and was.get(key) != now[key]:
            old, new = _as_override(was.get(key)), _as_override(now[key])
            return f"model.{key} was {old} in the checkpoint's config (meta.json), is {new} now"
    return None


def model_mismatch(
    saved: Dict[str, Tuple[int, ...]], live: Dict[str, Tuple[int, ...]], was: Any = None, now: Any = None
) -> Optional[str]:
    """The first difference between a checkpoint's model entries and a model's, as one clause naming the entry
    and the config key behind it (:func:`config_key_behind`), or None when both have the same keys with the same
    shapes.

    Args:
        saved / live: state-dict key -> global shape, of the checkpoint and of the model.
        was / now: the checkpoint's and the run's model config (dicts), to name the key; None: not named.
    """
    for key in sorted(set(saved) | set(live)):
        if key not in live:
            why = f"entry {key!r} of the checkpoint has no place in this model"
        elif key not in saved:
            why = f"this model's entry {key!r} is not in the checkpoint"
        elif saved[key] != live[key]:
            why = f"entry {key!r} has shape {saved[key]} in the checkpoint and {live[key]} in this model"
        else:
            continue
        behind = config_key_behind(key, was, now)
        return (
            f"{why}: {behind}; set it back (the checkpoint's meta.json `config.model` holds its model config)"
            if behind
            else f"{why}: it was written by another model (compare the checkpoint's meta.json `config.model` with "
            "this model's config)"
        )
    return None


@dataclass
class LoadReport:
    """What a load restored: every entry of the model and the optimizers (anything else is an error).
    ``translated``: entries read from the names of checkpoints written before the layout was world-size
    independent."""

    path: str
    restored: List[str] = field(default_factory=list)
    translated: List[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the log: how many entries were restored (and how many were translated)."""
        extra = f" ({len(self.translated)} from the earlier layout's names)" if self.translated else ""
        return f"all {len(self.restored)} model and optimizer entries restored{extra}"


def _earlier_names(fqn: str, sname: str) -> List[str]:
    """Where a checkpoint of the earlier layout holds optimizer entry ``fqn``/``sname``: the MLPs' and a
    data_parallel table's dense Adagrad state under ``CombinedOptimizer`` prefixes, a table's momentum as the
    dense Adagrad ``sum`` of a data_parallel table."""
    names = [f"optim.{p}.{fqn}.{sname}" for p in ("dense", "dp_tables")]
    if sname.endswith(".momentum1"):
        names += [f"optim.dp_tables.{fqn}.sum", f"optim.{fqn}.sum"]
    return names


def load_app_state(
    path: str,
    model: torch.nn.Module,
    optimizer: Any,
    process_group: Optional[dist.ProcessGroup] = None,
    model_config: Any = None,
) -> LoadReport:
    """Load model and optimizer state from a DCP checkpoint into the live (possibly differently sharded) model.

    Every entry of the checkpoint is consumed and every entry of the model and optimizer restored, with equal
    global shapes (:func:`optimizer_state` names the optimizer's entries the same for every world size and plan;
    checkpoints of the earlier, layout-dependent names are translated). The only saved entries not read are a
    data_parallel table's dense Adagrad ``step`` (the MLPs' ``step`` is copied into it, which is its value).

    Args:
        model_config: this run's ``ModelConfig`` (a dataclass or dict), compared with the checkpoint's
            ``meta.json`` ``config.model`` to name the config key behind a model mismatch.

    Raises:
        CheckpointError: the model's entries differ from the checkpoint's (names the first and the config key
            behind it); an optimizer entry is missing or of another shape (e.g. row-wise Adagrad momentum
            ``[rows]`` of a row_wise table into a column_wise one, ``[rows x column shards]``; names the entry
            and the table); the checkpoint's metadata or data cannot be read.
    """
    try:
        meta = FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - a damaged .metadata fails in many ways; name the checkpoint
        raise CheckpointError(f"checkpoint {path}: .metadata is unreadable ({type(e).__name__})") from e
    shape = {k: tuple(md.size) if isinstance(md, TensorStorageMetadata) else None for k, md in meta.items()}
    target = app_state(model, optimizer)
    was = None
    if os.path.isfile(os.path.join(path, META)):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            was = read_meta(path)["config"].get("model")
    now = dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config) else model_config
    live_model = {k: _global_shape(v) for k, v in _flatten(target["model"]).items()}
    saved_model = {k[len("model.") :]: s for k, s in shape.items() if k.startswith("model.")}
    why = model_mismatch(saved_model, live_model, was, now)
    if why is not None:
        raise CheckpointError(f"checkpoint {path}: model {why}")
    report = LoadReport(path)
    optim: Dict[str, Any] = {}  # saved name (without "optim.") -> the live tensor it loads into
    problem: Optional[str] = None
    reshaped: List[Tuple[torch.Tensor, Any]] = []  # (whole tensor read, ShardedTensor it goes into)
    for fqn, sname, v in ((f, n, t) for f, states in target["optim"].items() for n, t in states.items()):
        key = f"optim.{fqn}.{sname}"
        src = key if key in meta else next((n for n in _earlier_names(fqn, sname) if n in meta), None)
        live = _global_shape(v)
        if src is None:
            problem = (
                f"optimizer entry {key!r} is not in it (its optimizer was another one); resume with the "
                "optimizer.* settings of its meta.json, or start fresh in a new checkpoint.dir"
            )
            break
        if shape[src] != live:
            # earlier layout: a data_parallel table's torchrec RowWiseAdagrad `sum` [rows, 1] for TBE's [rows]
            if isinstance(v, torch.Tensor) and math.prod(live or ()) == math.prod(shape[src] or ()):
                if type(v) is torch.Tensor:  # plain: a view loads in place
                    v = v.view(shape[src])
                else:  # sharded: read whole, then copied into this rank's shards
                    whole = torch.empty(shape[src], dtype=v.dtype)
                    reshaped.append((whole, v))
                    v = whole
            else:
                table = fqn.split(".")[-2] if _TABLE in fqn else fqn
                problem = (
                    f"optimizer entry {key!r} has shape {shape[src]} there and {live} here: {table}'s optimizer "
                    "state does not carry over to this plan (row-wise Adagrad keeps one value per row of each "
                    "column shard); resume with the sharding plan it was saved with (its plan.json), or one that "
                    f"gives {table} a sharding type with its number of column shards"
                )
                break
        if src != key:
            report.translated.append(key)
        optim[src[len("optim.") :]] = v
    # a rank holds optimizer state only for the tables it has shards of: every rank judges the union
    parts: List[Any] = [(problem, sorted(optim), report.translated)]
    if dist.is_initialized() and dist.get_world_size(process_group) > 1:
        parts = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(parts, (problem, sorted(optim), report.translated), group=process_group)
    problem = next((p for p, _, _ in parts if p is not None), None)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path}: {problem}")
    read = {k for _, names, _ in parts for k in names}
    report.translated = sorted({k for _, _, translated in parts for k in translated})
    left = sorted(
        k
        for k in shape
        if k.startswith("optim.")
        and k[len("optim.") :] not in read
        and not (k.endswith(".step") and _TABLE in k)  # a data_parallel table's step: the MLPs' (see above)
    )
    if left:
        raise CheckpointError(
            f"checkpoint {path}: its optimizer entry {left[0]!r} has no place in this run's optimizer (it was "
            "written with other optimizer.* settings); resume with the settings of its meta.json, or start "
            "fresh in a new checkpoint.dir"
        )
    state = {"model": target["model"], "optim": optim}
    try:
        dcp.load(state, checkpoint_id=path, process_group=process_group)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - e.g. a .distcp damaged after verification
        raise unreadable_data(path, e, "give another checkpoint.resume (auto takes the newest intact one)") from e
    for whole, sharded in reshaped:
        flat = whole.reshape(tuple(sharded.size()))
        for shard in sharded.local_shards():
            md = shard.metadata
            shard.tensor.copy_(flat[tuple(slice(o, o + n) for o, n in zip(md.shard_offsets, md.shard_sizes))])
    steps, mlp_step = _dp_table_steps(target["model"], optimizer)
    if mlp_step is not None:
        for s in steps:
            s.copy_(mlp_step)
    report.restored = sorted(_flatten(target, ""))
    if len(parts) > 1:
        names: List[Any] = [None] * len(parts)
        dist.all_gather_object(names, report.restored, group=process_group)
        report.restored = sorted({k for restored in names for k in restored})
    return report


def _dir_bytes(path: str) -> int:
    """Bytes of the files directly in ``path`` (0 if it is absent)."""
    if not os.path.isdir(path):
        return 0
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


def _state_bytes(state: Dict[str, Any]) -> int:
    """Bytes of this rank's tensors in ``state`` (a ``ShardedTensor``: its local shards), about what its save
    writes."""
    total = 0
    for v in _flatten(state).values():
        if hasattr(v, "local_shards"):
            total += sum(s.tensor.numel() * s.tensor.element_size() for s in v.local_shards())
        elif isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


# ------------------------------------------------------------------------------------------------- rng state
def rng_state() -> Dict[str, Any]:
    """This process's RNG states, for ``rank_<r>.pt``: ``torch`` (CPU generator, uint8 tensor), ``numpy``
    (``np.random.get_state()`` tuple), ``python`` (``random.getstate()``) and, where CUDA is available, ``cuda``
    (one uint8 tensor per visible device)."""
    st: Dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Dict[str, Any]) -> None:
    """Restore the RNG states of :func:`rng_state`. ``cuda`` is restored only when present and CUDA is available
    (a checkpoint written on CPU leaves the CUDA generators as they are); the ``i``-th saved CUDA state goes to
    visible device ``i``.

    Raises:
        KeyError: ``st`` lacks ``torch``, ``numpy`` or ``python``.
    """
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


class _ManifestWriter(FileSystemWriter):
    """DCP's file writer that, once this rank's data files are written, records their sizes and block checksums
    in ``manifest_rank_<r>.json``; rank 0 merges these into the checkpoint's ``manifest.json``, written last
    (:meth:`Checkpointer._finish`). In an async save this runs on the writer thread, off the training loop."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        fut = super().write_data(plan, planner)
        files = sorted(set(compat.written_files(fut.wait())))
        entries = {name: file_entry(os.path.join(str(self.path), name), threads=_threads()) for name in files}
        with open(_rank_manifest(str(self.path), dist.get_rank() if dist.is_initialized() else 0), "w") as f:
            json.dump(entries, f)
        return fut


class _StreamStagedWriter(_ManifestWriter):
    """DCP writer whose :meth:`stage` copies CUDA tensors to pinned host memory on a dedicated CUDA stream.

    Why our own: DCP's ``FileSystemWriter(cache_staged_state_dict=True)`` (``BlockingAsyncStager``) copies on
    the current stream and blocks the host per tensor; torch's ``staging.DefaultStager`` (torch >= 2.8) copies
    on its own stream but records no ordering against the training stream in either direction (its copy can
    read weights before this step's update kernels ran, and the next backward can update them mid-copy), which
    the fused TBE optimizer (in-place update inside backward) turns into a torn checkpoint. This uses DCP's
    state-dict helpers (:func:`dlrm.torchrec_compat.create_cpu_state_dict` / ``copy_state_dict``; they handle
    ``ShardedTensor``) and adds the two events.

    Ordering (see the module docstring): training stream --ready--> staging stream copies --done--> training
    stream (its next kernel) and writer thread (``done.synchronize()`` in :meth:`write_data`).

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


class _KillAfterWrite(_ManifestWriter):
    """Test hook (:data:`TEST_KILL_DURING_SAVE_ENV`): SIGKILL this process once its shard files are written."""

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        fut = super().write_data(plan, planner)
        fut.wait()
        log.warning("test hook %s: killing rank %s mid-save", TEST_KILL_DURING_SAVE_ENV, os.environ.get("RANK"))
        os.kill(os.getpid(), signal.SIGKILL)
        return fut


# ------------------------------------------------------------------------------------------------- resume
def checkpoint_root(cfg: CheckpointConfig, run_dir: str) -> str:
    """Where the run's ``step_<N>/`` checkpoints go: ``checkpoint.dir``, else ``<run_dir>/checkpoints``."""
    return os.path.abspath(cfg.dir or os.path.join(run_dir, "checkpoints"))


def _remove_interrupted(root: str) -> None:
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        if _TMP_RE.match(name):
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
    step = int(_STEP_RE.match(os.path.basename(os.path.normpath(path))).group(1))  # type: ignore[union-attr]
    later = [s for s, _ in list_checkpoints(root) if s > step]
    return f"step_{later[-1]}" if later else None


def planning_inputs(cfg: Config, global_batch: int) -> Dict[str, Any]:
    """What the plan is a function of, besides the world layout: the model, ``sharding.*`` (but a given
    ``plan_path``), ``offload.*``, the table dtype, the embedding optimizer, the global batch and the bag sizes;
    JSON-normalised, as ``meta.json`` stores it."""
    sharding = dataclasses.asdict(cfg.sharding)
    sharding.pop("plan_path")
    doc = {
        "model": dataclasses.asdict(cfg.model),
        "sharding": sharding,
        "offload": dataclasses.asdict(cfg.offload),
        "embedding_dtype": cfg.perf.embedding_dtype,
        "sparse_type": cfg.optimizer.sparse_type,
        "global_batch": global_batch,
        "multi_hot": cfg.data.multi_hot,
    }
    return json.loads(json.dumps(doc, default=str))


def saved_plan(path: str, info: DistInfo, inputs: Dict[str, Any]) -> Optional[str]:
    """The ``plan.json`` saved with checkpoint ``path`` when this job has the layout it was planned for (world
    size, ranks per host, device type) and the same :func:`planning_inputs`, else None (logged: the job plans
    anew; a ``plan.json`` or ``meta.json`` that cannot be read or lacks those fields is a warning)."""
    plan = os.path.join(path, PLAN)
    if not os.path.isfile(plan):
        return None
    try:
        with open(plan, encoding="utf-8") as f:
            doc = json.load(f)
        had = (doc["world_size"], doc["local_world_size"], doc["compute_device"])
        planning = read_meta(path).get("planning")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning(
            "checkpoint %s: %s or %s is unreadable or incomplete (%s: %s); planning anew",
            path,
            PLAN,
            META,
            type(e).__name__,
            e,
        )
        return None
    now = (info.world_size, info.local_world_size, info.device.type)
    if had != now:
        log.info(
            "checkpoint %s was planned for %s ranks (%s per host) on %s and this job has %d (%d per host) on "
            "%s: planning anew",
            path,
            *had,
            *now,
        )
        return None
    if planning != inputs:
        log.info("checkpoint %s was planned for another model, sharding, offload or batch config: planning anew", path)
        return None
    log.info("resuming into the plan saved with %s (fingerprint %s)", path, doc.get("fingerprint", "?"))
    return plan


# ----------------------------------------------------------------------------------------------- checkpointer
@dataclass
class TrainState:
    """The run's progress that a checkpoint holds besides the model, the optimizers and the lr schedule.

    ``step`` is also the data position: every loader resumes at the batch of this step (the batch order is a
    function of the step, the global batch and ``seed``).
    """

    step: int = 0  # optimizer steps done
    samples_seen: int = 0  # training samples over all ranks
    window: Optional[MetricWindow] = None  # the training-metric window not yet logged
    target_auc_reached: Optional[float] = None  # the validation AUC that met eval.target_auc and ended the run


@dataclass
class RunFacts:
    """What ``meta.json`` records about the run; a resume checks the global batch, the steps per epoch and the data
    settings against it (:func:`check_resume`)."""

    global_batch: int
    steps_per_epoch: int
    total_steps: int  # the last step of this run (a periodic save also falls on it)
    plan: Any  # the dlrm.sharding.PlanInfo (saved as plan.json beside the checkpoint)
    config: Config


# What a resume reads from meta.json, with its JSON type.
_RESUME_KEYS: Tuple[Tuple[str, type], ...] = (
    ("step", int),
    ("samples", int),
    ("world_size", int),
    ("global_batch", int),
    ("steps_per_epoch", int),
    ("scheduler", dict),
    ("config", dict),
)
# data.* keys that decide which rows step N trains on, per data.name (besides data.name, max_rows and shuffle).
_ROW_KEYS: Dict[str, Tuple[str, ...]] = {
    "synthetic": ("num_train_samples", "num_val_samples", "num_test_samples", "teacher_seed", "teacher_dim"),
    # paths and the validation split (val_path, val_fraction) are not compared: a dataset may move between a save
    # and the resume, and a training split of another size fails the steps-per-epoch check
}


def _as_override(v: Any) -> str:
    return json.dumps(v) if v is None or isinstance(v, bool) else str(v)


def check_resume(path: str, meta: Any, run: RunFacts) -> None:
    """Refuse to resume from checkpoint ``path`` (``meta``: its parsed ``meta.json``) a run it does not continue.

    The data position is the step count (:class:`TrainState`), so the resumed run must cut the same rows into the
    same batches: the same data source and rows (``data.name``, ``data.max_rows``, the synthetic sizes and
    teacher), ``data.shuffle`` (and, shuffled, ``seed``), global batch and steps per epoch. Paths are not compared
    (a dataset may have moved); a training split of another size changes the steps per epoch.

    Raises:
        CheckpointError: ``meta.json`` lacks a key the resume reads, or holds it with another type (it is damaged).
        ConfigError: one of those settings differs; the message names the key and the checkpoint's value.
    """
    for key, kind in _RESUME_KEYS:
        value = meta.get(key) if isinstance(meta, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(
                f"checkpoint {path}: {META} lacks `{key}` (or it is not a JSON {'object' if kind is dict else 'int'})"
                "; it is damaged: give another checkpoint.resume (auto takes the newest intact one)"
            )
    was, seed = meta["config"].get("data"), meta["config"].get("seed")
    if not isinstance(was, dict) or not isinstance(seed, int):
        raise CheckpointError(
            f"checkpoint {path}: {META} lacks `config.data` or `config.seed`; it is damaged: give another "
            "checkpoint.resume (auto takes the newest intact one)"
        )
    data, step = run.config.data, meta["step"]
    opt = meta["config"].get("optimizer")
    was_type = opt.get("sparse_type") if isinstance(opt, dict) else None
    if was_type is not None and was_type != run.config.optimizer.sparse_type:
        raise ConfigError(
            f"config key `optimizer.sparse_type`: checkpoint {path} was trained with optimizer.sparse_type="
            f"{was_type}, this run has {run.config.optimizer.sparse_type}; the tables' optimizer state would start "
            f"fresh: set optimizer.sparse_type={was_type}, or checkpoint.resume=none in a new checkpoint.dir"
        )
    for key in ("name", "max_rows", "shuffle", *_ROW_KEYS.get(data.name, ())):
        if was.get(key) != getattr(data, key):
            raise ConfigError(
                f"config key `data.{key}`: checkpoint {path} was trained with data.{key}="
                f"{_as_override(was.get(key))}, this run has {_as_override(getattr(data, key))}; its step {step} "
                f"would point at other rows: set data.{key}={_as_override(was.get(key))}, or checkpoint.resume=none "
                "in a new checkpoint.dir to start fresh"
            )
    if data.shuffle and seed != run.config.seed:
        raise ConfigError(
            f"config key `seed`: checkpoint {path} shuffled its rows with seed={seed}, this run has "
            f"{run.config.seed}; set seed={seed} so the shuffled order carries over, or checkpoint.resume=none in "
            "a new checkpoint.dir"
        )
    if meta["global_batch"] != run.global_batch:
        raise ConfigError(
            f"config key `data.global_batch_size`: checkpoint {path} was trained with a global batch of "
            f"{meta['global_batch']} ({meta['world_size']} ranks), this run has {run.global_batch}; "
            f"set data.global_batch_size={meta['global_batch']} so the data position carries over"
        )
    if meta["steps_per_epoch"] != run.steps_per_epoch:
        raise ConfigError(
            f"config key `data`: checkpoint {path} was trained at {meta['steps_per_epoch']} steps per epoch on "
            f"{meta['world_size']} ranks, this run has {run.steps_per_epoch}: its training split has another size, "
            "or this world size drops a last partial batch (fewer rows than ranks) that the other kept; resume on "
            f"{meta['world_size']} ranks with the data settings of its meta.json `config.data`, or "
            "checkpoint.resume=none in a new checkpoint.dir"
        )


class Checkpointer:
    """The checkpoint policy: resume at set-up, periodic async saves, SIGTERM, retention.

    Construct on every rank after the process group exists (it creates two gloo groups collectively).

    Args:
        cfg: the ``checkpoint`` config.
        run_dir: the run directory (``checkpoint.dir`` defaults to ``<run_dir>/checkpoints``).
        info: this rank's layout.
        model: the DMP model (its state dict: every table shard and the dense parameters).
        optimizer: the combined fused and dense optimizer.
        scheduler: the lr scheduler.
        run: the run's batch, steps, plan and config (:class:`RunFacts`).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_dir: str,
        info: DistInfo,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any,
        run: RunFacts,
    ) -> None:
        self.cfg = cfg
        self.info = info
        self.model, self.optimizer, self.scheduler, self.run = model, optimizer, scheduler, run
        # TorchRec's state dicts are ShardedTensors; DCP warns about that on every access
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*deprecating ShardedTensor")
        self.root = checkpoint_root(cfg, run_dir)
        # Saves run collectives from a background thread; a group of their own keeps them apart from training's.
        self.pg = dist.new_group(backend="gloo")
        self.sig_pg = dist.new_group(backend="gloo") if info.world_size > 1 else None
        self._writer: Optional[FileSystemWriter] = None
        self._pending: Optional[Tuple[Any, int, str]] = None  # (future, step, tmp dir)
        self.last_saved_step = -1
        self.preempted = False
        self.preempt_message: Optional[str] = None
        self.save_seconds: List[float] = []  # time the training loop spent in each save (async: staging)
        self.resumed_from: Optional[str] = None
        self.report: Optional[LoadReport] = None
        self._sigterm = False
        self._prev_handler: Any = None
        if cfg.save_on_sigterm and threading.current_thread() is threading.main_thread():
            self._prev_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        del signum, frame
        self._sigterm = True

    # -------------------------------------------------------------------------------------------- resume
    def resume(self, state: TrainState, path: Optional[str]) -> Optional[str]:
        """Restore the model, optimizers, lr schedule and ``state`` (step, samples, RNG, metric window) from the
        checkpoint ``path`` (:func:`choose_checkpoint`'s choice; None: a fresh start). Returns ``path``.

        Raises:
            ConfigError: the checkpoint was trained on other data settings, global batch or steps per epoch
                (:func:`check_resume`: the data position would not match).
            CheckpointError: the checkpoint cannot be read, its ``meta.json`` is damaged, it holds another
                model, or optimizer state that does not carry over to this plan (:func:`load_app_state`).
        """
        if path is None:
            return None
        t0 = time.perf_counter()
        try:
            meta = read_meta(path)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {path}: {META} is unreadable ({type(e).__name__}: {e})") from e
        check_resume(path, meta, self.run)
        report = load_app_state(path, self.model, self.optimizer, self.pg, self.run.config.model)
        load_scheduler_state(self.scheduler, meta["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        state.step = self.last_saved_step = int(meta["step"])
        state.samples_seen = int(meta["samples"])
        state.target_auc_reached = meta.get("target_auc_reached")  # absent in checkpoints of earlier versions
        rank_file = os.path.join(path, f"rank_{self.info.rank}.pt")
        if meta["world_size"] == self.info.world_size and os.path.isfile(rank_file):
            extra = torch.load(rank_file, weights_only=False)
            set_rng_state(extra["rng"])
            if state.window is not None:
                state.window.load_state_dict(extra.get("window"))
        else:
            log.warning(
                "checkpoint %s was written by %d ranks, this run has %d: RNG states and the unlogged "
                "metric window are not restored (model, optimizer, schedule and data position are)",
                path,
                meta["world_size"],
                self.info.world_size,
            )
        log.info("checkpoint load: %s", report.summary())
        log.info(
            "resumed from %s at step %d (%d samples seen), %.1fs",
            path,
            state.step,
            state.samples_seen,
            time.perf_counter() - t0,
        )
        self.resumed_from, self.report = path, report
        return path

    # ---------------------------------------------------------------------------------------------- save
    def after_step(self, state: TrainState, before_save: Optional[Callable[[], None]] = None) -> bool:
        """Call at the end of every training step. Saves when due; on SIGTERM saves and returns True (the
        caller leaves the loop, logs :attr:`preempt_message`, and the run ends with status 0). ``before_save``
        runs on every rank before either save (the trainer's check for a diverged loss: it raises, and nothing
        is written)."""
        self._poll()
        sigterm = self.cfg.save_on_sigterm and self._agree_sigterm()
        every = self.cfg.every_n_steps
        due = bool(every) and (state.step % every == 0 or state.step == self.run.total_steps)
        if (sigterm or due) and before_save is not None:
            before_save()
        if sigterm:
            self.save(state, block=True)
            self.preempted = True
            self.preempt_message = (
                f"SIGTERM: finished step {state.step}, saved {step_dir(self.root, state.step)}; exiting with status "
                f"0. Start again with the same checkpoint.dir ({self.root}) to resume"
            )
            log.warning(self.preempt_message)
            return True
        if due:
            self.save(state, block=not self.cfg.async_save)
        return False

    def at_end(self, state: TrainState) -> None:
        """After the loop: save the last step if checkpointing is on and it is not saved yet (early stop)."""
        if self.cfg.every_n_steps and not self.preempted and self.last_saved_step != state.step:
            self.save(state, block=not self.cfg.async_save)

    def _agree_sigterm(self) -> bool:
        if self.sig_pg is None:
            return self._sigterm
        flag = torch.tensor([1 if self._sigterm else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.sig_pg)
        return bool(flag.item())

    def save(self, state: TrainState, block: bool = False) -> str:
        """Write a checkpoint of the current step (collective: every rank calls it at the same step).

        The previous async save is waited for first. With ``block=False`` this returns once the state is staged
        in host memory; the files appear as ``step_<N>/`` when the background write has finished.

        Raises:
            dlrm.rundir.StorageError: the disk of ``checkpoint.dir`` is full (or over quota, or read-only): the
                message names ``step_<N>.tmp``, the bytes needed and free; the partial save is removed and the
                earlier checkpoints are left as they were (:meth:`_failed`).
            OSError: ``checkpoint.dir`` cannot be created or written for another reason (permissions).
            torch.distributed.checkpoint.CheckpointException: DCP's write failed on a rank (it wraps that rank's
                error). With ``block=False`` a failure of the background write surfaces from the next
                :meth:`wait` (which :meth:`save` and :meth:`close` call).
        """
        self.wait()
        try:
            return self._save(state, block)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - only a storage fault is translated
            err = self._failed(state.step, e)
            if err is None:
                raise
            raise err from e

    def _failed(self, step: int, e: BaseException) -> Optional[StorageError]:
        """The error for the save of ``step`` that failed with ``e`` when the cause is storage (an ``ENOSPC``,
        ``EDQUOT`` or ``EROFS`` on any rank, or fewer bytes free than the save needs: torch's zip writer reports
        a short write as ``RuntimeError: unexpected pos``), else None. For a storage fault rank 0 removes the
        partial ``step_<N>.tmp`` (every rank is past the failed write: DCP gathers its outcome from all of them),
        which gives its space back. The bytes needed are the newest checkpoint's size, else this rank's state."""
        tmp = step_dir(self.root, step) + ".tmp"
        done = list_checkpoints(self.root)
        needed = _dir_bytes(done[-1][1]) if done else _state_bytes(app_state(self.model, self.optimizer))
        free = free_bytes(self.root)
        # what was free before this save: what is free now plus what its partial files took
        if not (is_storage_fault(e) or (free is not None and free + _dir_bytes(tmp) < needed)):
            return None  # e.g. a peer rank killed mid-save: its step_<N>.tmp stays for the next start to report
        if self.info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = (
            f"the earlier checkpoints are intact (newest {os.path.basename(done[-1][1])}): free space there or set "
            f"checkpoint.dir to a larger disk, and launch again to resume from it"
            if done
            else "free space there or set checkpoint.dir to a larger disk"
        )
        return storage_error(tmp, e, needed, kept)

    def _save(self, state: TrainState, block: bool) -> str:
        step = state.step
        final, tmp = step_dir(self.root, step), step_dir(self.root, step) + ".tmp"
        t0 = time.perf_counter()
        os.makedirs(tmp, exist_ok=True)
        window = state.window.state_dict() if state.window is not None else None
        torch.save({"rng": rng_state(), "window": window}, os.path.join(tmp, f"rank_{self.info.rank}.pt"))
        if self.info.is_main:
            meta = {
                "step": step,
                "samples": state.samples_seen,
                "target_auc_reached": state.target_auc_reached,
                "world_size": self.info.world_size,
                "global_batch": self.run.global_batch,
                "steps_per_epoch": self.run.steps_per_epoch,
                "scheduler": self.scheduler.state_dict(),
                "time": time.time(),
                "plan": [list(r) for r in plan_rows(self.run.plan.plan)],
                "plan_fingerprint": plan_fingerprint(self.run.plan),
                "planning": planning_inputs(self.run.config, self.run.global_batch),
                "config": OmegaConf.to_container(OmegaConf.structured(self.run.config)),
                "versions": {"torch": torch.__version__},
            }
            with open(os.path.join(tmp, META), "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1, default=str)
            save_plan(self.run.plan, os.path.join(tmp, PLAN))
        app = app_state(self.model, self.optimizer)
        writer = self._make_writer(step, tmp)
        if block:
            dcp.save(app, storage_writer=writer, checkpoint_id=tmp, process_group=self.pg)
            self._finish(step, tmp)
            log.info("checkpoint %s saved in %.2fs", final, time.perf_counter() - t0)
        else:
            fut = dcp.async_save(app, storage_writer=writer, checkpoint_id=tmp, process_group=self.pg)
            self._pending = (fut, step, tmp)
            log.info("checkpoint step %d staged in %.2fs; writing in the background", step, time.perf_counter() - t0)
        self.last_saved_step = step
        self.save_seconds.append(time.perf_counter() - t0)
        return final

    def _make_writer(self, step: int, tmp: str) -> FileSystemWriter:
        hook = os.environ.get(TEST_KILL_DURING_SAVE_ENV)
        if hook and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            s, r = (int(x) for x in hook.split(":"))
            if s == step and r == self.info.rank:
                return _KillAfterWrite(tmp)
        if self._writer is None:  # reused so that its pinned staging buffers (CUDA) are reused
            self._writer = (
                _StreamStagedWriter(tmp, self.info.device) if self.info.device.type == "cuda" else _ManifestWriter(tmp)
            )  # CPU: DCP's own staging copy, a fresh one per save
        return self._writer

    def _poll(self) -> None:
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the pending async save (if any) has finished, then publish it.

        Raises:
            dlrm.rundir.StorageError: as :meth:`save`; other failures of the background write as they were.
        """
        if self._pending is None:
            return
        fut, step, tmp = self._pending
        self._pending = None
        t0 = time.perf_counter()
        try:
            fut.result()
            self._finish(step, tmp)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - only a storage fault is translated
            err = self._failed(step, e)
            if err is None:
                raise
            raise err from e
        log.info("checkpoint %s written (waited %.2fs)", step_dir(self.root, step), time.perf_counter() - t0)

    def _finish(self, step: int, tmp: str) -> None:
        """Rank 0: write the manifest, publish ``step_<N>.tmp`` as ``step_<N>`` and prune old checkpoints. DCP's
        save has returned, so every rank's data and its ``manifest_rank_<r>.json`` are on disk."""
        if not self.info.is_main:
            return
        write_manifest(tmp)
        final = step_dir(self.root, step)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        keep = self.cfg.keep_last
        if keep:
            for _, old in list_checkpoints(self.root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Wait for the last async save; restore the previous SIGTERM handler."""
        try:
            self.wait()
        finally:
            if self._prev_handler is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._prev_handler)
                self._prev_handler = None
