"""The check every schema section runs in ``__post_init__``, and the finite-number check of a whole config: each
raises :class:`~dlrm.errors.ConfigError` with the one line a command prints after ``error:``, naming the key."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dlrm.errors import ConfigError


def check(cond: bool, key: str, msg: str) -> None:
    """Raise ``ConfigError("config key `<key>`: <msg>")`` unless ``cond``; ``msg`` says what is wrong and the fix."""
    if not cond:
        raise ConfigError(f"config key `{key}`: {msg}")


def check_finite(obj: Any, prefix: str) -> None:
    """Refuse an infinite or NaN float anywhere in the config (``optimizer.lr=inf`` passes a ``> 0`` check, then
    trains to a non-finite loss or, as ``optimizer.eps=inf``, not at all)."""
    for f in dataclasses.fields(obj):
        v, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            check_finite(v, key + ".")
        for x in v if isinstance(v, (list, tuple)) else [v]:
            check(not isinstance(x, float) or math.isfinite(x), key, f"got {x}; give a finite number")
