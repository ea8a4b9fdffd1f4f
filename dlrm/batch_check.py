"""The check of a batch against the model (:func:`check_batch`): sizes, shapes and keys always, and the values of
lengths and offsets where they are on the CPU; :class:`dlrm.model.DLRMTrainAutocast` runs it on every batch."""

from __future__ import annotations

import collections
from typing import List, Optional, Sequence

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import NUM_DENSE_FEATURES
from dlrm.errors import InputError


class BatchError(InputError):
    """A batch handed to the model does not fit it; the message names the field, the expected sizes and, where
    one is at fault, the feature and sample."""


def _listed(names: Sequence[str], limit: int = 6) -> str:
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])}, ... ({len(names)} in all)"


def _check_keys(keys: List[str], names: List[str]) -> None:
    if keys == names:
        return
    span = ", ".join(names) if len(names) <= 4 else f"{names[0]}, {names[1]}, ..., {names[-1]}"
    expected = f"keys must be the model's {len(names)} features {span}, each once, in that order"
    known, given = set(names), set(keys)
    missing = [n for n in names if n not in given]
    extra = [k for k in keys if k not in known]
    if missing or extra:
        parts = ([f"lacks feature(s) {_listed(missing)}"] if missing else []) + (
            [f"has key(s) the model does not have: {_listed(extra)}"] if extra else []
        )
        raise BatchError(f"batch: sparse_features {' and '.join(parts)}; {expected}")
    repeated = sorted(k for k, c in collections.Counter(keys).items() if c > 1)
    if repeated:
        raise BatchError(f"batch: sparse_features repeats key(s) {_listed(repeated)}; {expected}")
    i = next(i for i, (k, n) in enumerate(zip(keys, names)) if k != n)
    raise BatchError(
        f"batch: sparse_features keys are out of order: key {i} is {keys[i]} where the model has {names[i]}; {expected}"
    )


def _first_negative(steps: torch.Tensor, names: List[str], b: int, what: str) -> None:
    """Raise when ``steps`` (``[F * B]``, feature-major) has a negative entry; ``what`` formats ``{v}`` (the
    entry) and ``{s}`` (its sample) after the feature's name."""
    negative = steps < 0
    if bool(negative.any()):
        i = int(negative.to(torch.uint8).argmax())
        raise BatchError(f"batch: feature {names[i // b]} {what.format(v=int(steps[i]), s=i % b)}")


def check_batch(batch: Batch, feature_names: Sequence[str], num_dense: int = NUM_DENSE_FEATURES) -> None:
    """Check that ``batch`` fits a model over the sparse features ``feature_names`` and ``num_dense`` dense
    features; :meth:`dlrm.model.DLRMTrainAutocast.forward` calls it on every batch (outside TorchRec's fx trace).

    ``B`` is the number of rows of ``dense_features``. Checked always (sizes, shapes and keys: no tensor's
    values are read, so no host-device sync):

    * ``dense_features`` is ``[B, num_dense]``, ``labels`` is ``[B]``;
    * ``sparse_features`` is a ``KeyedJaggedTensor`` whose keys are ``feature_names`` (each once, in order),
      with one batch size for all features, equal to ``B``;
    * its lengths (where given) number ``F * B`` and its offsets (where given) ``F * B + 1``, feature-major.

    Checked only where the lengths or offsets are on the CPU (their values are read: on an accelerator that is
    a host-device sync, so there these checks are skipped; call this on a batch before it is copied to the
    device to have them):

    * lengths are non-negative; offsets start at 0 and never decrease (one list over all features, not one
      per feature);
    * lengths and offsets agree where both are given;
    * ``sum(lengths)`` (or the last offset) equals the number of values.

    Raises:
        BatchError: the first check that fails, naming the field, the expected sizes and the feature.
    """
    names = list(feature_names)
    b = _check_dense_and_labels(batch.dense_features, batch.labels, num_dense)
    kjt = batch.sparse_features
    if not isinstance(kjt, KeyedJaggedTensor):
        raise BatchError(
            f"batch: sparse_features is a {type(kjt).__name__}; expected a torchrec KeyedJaggedTensor with keys "
            f"{_listed(names)}"
        )
    _check_keys(list(kjt.keys()), names)
    _check_sizes(kjt, len(names), b)
    lengths, offsets, values = kjt.lengths_or_none(), kjt.offsets_or_none(), kjt.values()
    lengths = lengths if lengths is not None and lengths.device.type == "cpu" else None
    offsets = offsets if offsets is not None and offsets.device.type == "cpu" else None
    if lengths is not None:
        _first_negative(lengths, names, b, "has a negative length ({v} at sample {s}); lengths must be >= 0")
    if offsets is not None:
        _check_offsets(offsets, lengths, values.numel(), names, b)
    if lengths is not None:
        total = int(lengths.sum())
        if total != values.numel():
            raise BatchError(
                f"batch: sparse_features has {values.numel()} values; its lengths sum to {total} "
                "(sum(lengths) must equal len(values))"
            )


def _check_dense_and_labels(dense: object, labels: object, num_dense: int) -> int:
    """``B``, the rows of ``dense``, once ``dense`` is ``[B, num_dense]`` and ``labels`` is ``[B]``."""
    if not isinstance(dense, torch.Tensor) or dense.dim() != 2 or dense.size(1) != num_dense:
        shape = list(dense.shape) if isinstance(dense, torch.Tensor) else type(dense).__name__
        raise BatchError(
            f"batch: dense_features has shape {shape}; expected [B, {num_dense}] (one row of {num_dense} dense "
            "features per sample)"
        )
    b = dense.size(0)
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (b,):
        shape = list(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise BatchError(
            f"batch: labels has shape {shape}; expected [{b}] (one label per sample: dense_features has {b} rows)"
        )
    return b


def _check_sizes(kjt: KeyedJaggedTensor, f: int, b: int) -> None:
    """The KJT's lengths and offsets number ``f * b`` and ``f * b + 1``, with one batch size ``b`` for all ``f``
    features (sizes only: no values read)."""
    n = f * b
    lengths, offsets = kjt.lengths_or_none(), kjt.offsets_or_none()
    if lengths is None and offsets is None:
        raise BatchError("batch: sparse_features has neither lengths nor offsets")
    if kjt.variable_stride_per_key():
        raise BatchError(
            f"batch: sparse_features has a batch size per feature (variable stride); expected {b} samples for "
            "every feature"
        )
    if lengths is not None and lengths.numel() != n:
        raise BatchError(
            f"batch: sparse_features has {lengths.numel()} lengths; expected {f} features x {b} samples = {n} "
            "(one length per feature and sample, feature-major)"
        )
    if offsets is not None and offsets.numel() != n + 1:
        raise BatchError(
            f"batch: sparse_features has {offsets.numel()} offsets; expected {f} features x {b} samples + 1 = "
            f"{n + 1} (one non-decreasing list over all features, starting at 0)"
        )
    if kjt.stride() != b:
        raise BatchError(
            f"batch: sparse_features has stride {kjt.stride()}; expected {b} (dense_features has {b} rows)"
        )


def _check_offsets(
    offsets: torch.Tensor, lengths: Optional[torch.Tensor], num_values: int, names: List[str], b: int
) -> None:
    """CPU ``offsets`` start at 0, never decrease, agree with ``lengths`` where given, and else end at
    ``num_values``."""
    start = int(offsets[0])
    if start != 0:
        raise BatchError(
            f"batch: sparse_features offsets start at {start}; expected 0 (one non-decreasing list over all features)"
        )
    steps = offsets[1:] - offsets[:-1]
    _first_negative(
        steps,
        names,
        b,
        "has offsets that decrease ({v} at sample {s}); offsets must be one non-decreasing list over all features",
    )
    if lengths is not None:
        differ = steps != lengths
        if bool(differ.any()):
            i = int(differ.to(torch.uint8).argmax())
            raise BatchError(
                f"batch: feature {names[i // b]} has length {int(lengths[i])} at sample {i % b} where its "
                f"offsets differ by {int(steps[i])}; offsets must be 0 followed by the running sum of lengths"
            )
    elif int(offsets[-1]) != num_values:
        raise BatchError(
            f"batch: sparse_features has {num_values} values; its offsets end at {int(offsets[-1])} "
            "(the last offset must equal len(values))"
        )
