"""RNG states of one process (torch, numpy, python, CUDA), saved in each rank's ``rank_<r>.pt``."""

from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


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
