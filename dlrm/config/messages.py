"""Hydra's and OmegaConf's errors as the one line a command prints after ``error:`` (``dlrm/cli.py``, the plan,
predict and linear-baseline commands), naming the key and the fix."""

from __future__ import annotations

import re

from dlrm.config.compose import GROUPS, group_options, unknown_key_error


def error_line(e: BaseException) -> str:
    """``e`` as the one line a command prints after ``error:``: runs of whitespace collapsed (Hydra's messages
    span lines); a Hydra override error whose cause is an OmegaConf one gets that cause's first line, which says
    what is wrong with the value (``Error merging override data.batch_size=abc (Value 'abc' of type 'str' could
    not be converted to Integer)``). A misspelt key is named with the keys its section has: Hydra's advice to
    add it with ``+`` would only meet :func:`unknown_key_error` next."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    misspelt = re.match(r"Could not override '([\w.]+)'", str(e)) if isinstance(e, HydraException) else None
    unknown = unknown_key_error(misspelt.group(1)) if misspelt else None
    if unknown is not None:
        return str(unknown)
    text = " ".join(str(e).split()).split(" Config search path:")[0]  # Hydra appends its search path
    missing = re.search(r"Could not load '(\w+)/([^']+)'", text)  # an unknown entry of a list group (logger=[...])
    if missing and missing.group(1) in GROUPS:
        group = missing.group(1)
        return f"{text} Available options in '{group}': {' '.join(group_options(group))}"
    cause = e.__cause__
    if isinstance(e, HydraException) and isinstance(cause, OmegaConfBaseException) and str(cause).strip():
        text += f" ({str(cause).strip().splitlines()[0].strip()})"
    return text
