"""What a resume checks before it loads: that the checkpoint's data settings, batch and steps per epoch continue
this run (:func:`check_resume`), and the first difference between its model and this one (:func:`model_mismatch`).
Each refusal is one line naming the config key and the fix."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

from dlrm.checkpoint.layout import META
from dlrm.checkpoint.reader import CheckpointError
from dlrm.checkpoint.run_state import RunFacts
from dlrm.errors import ConfigError

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
