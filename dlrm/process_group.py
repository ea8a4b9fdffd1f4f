"""Process group and device set-up for single-process, ``torchrun`` and ``torchx dist.ddp`` launches.

The launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) decides the layout; a plain ``python train.py`` becomes a world of one over an in-process store
(no port: a port probed free can be taken by another process before the store listens on it).
Backend: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Mapping, Tuple

import torch
import torch.distributed as dist

from dlrm.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job (:func:`init_distributed`): global ``rank``, ``world_size``, ``local_rank``
    and ``local_world_size`` (ranks on this host), ``device``, and ``backend`` (``nccl`` on CUDA, else ``gloo``)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """Rank 0: the rank that writes the run's files."""
        return self.rank == 0


def resolve_device(name: str, local_rank: int) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` to a concrete device: ``cuda:<LOCAL_RANK>``, or ``cuda:0`` where the
    launcher shows each process one GPU (``CUDA_VISIBLE_DEVICES`` per task, as Slurm's ``--gpus-per-task=1``).

    Raises:
        ConfigError: ``cuda`` without a GPU; several GPUs visible but fewer than the local ranks (two ranks would
            share one; with one visible GPU each process is taken to have its own, and NCCL refuses a shared one).
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("config key `device`: device=cuda but no CUDA device is visible; use device=cpu")
        n = torch.cuda.device_count()
        if n > 1 and local_rank >= n:
            raise ConfigError(
                f"environment: LOCAL_RANK={local_rank} but this process sees {n} GPUs (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); launch at most {n} processes per host, or "
                "show each process its own GPU"
            )
        dev = torch.device("cuda", 0 if n == 1 else local_rank)
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def _warn_shared_store_restarts(rank: int) -> None:
    """torchrun ``--max-restarts`` with the agent's shared TCPStore (the default): the store's keys outlive a
    restart, so a restarted rank can read a peer's address of the previous attempt and fail with ``Gloo
    connectFullMesh failed ... Connection refused`` (NCCL: ``socketPollConnect ... Connection refused``).
    pytorch/pytorch#135712, #167288. The fix is in the launcher's environment, so here only a warning."""
    if (
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0
        and rank == 0
    ):
        warnings.warn(
            "torchrun --max-restarts with the shared rendezvous store: a restarted worker may fail to "
            "connect to its peers (pytorch/pytorch#135712); export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "before torchrun (the torchx component launch/components.py:trainer sets it)",
            stacklevel=3,
        )


def launch_env(env: Mapping[str, str]) -> Tuple[int, int, int, int]:
    """``(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)`` as the launcher set them (defaults: one process; the
    local world size defaults to the world size).

    Raises:
        ConfigError: a variable that is not a whole number, ``WORLD_SIZE`` or ``LOCAL_WORLD_SIZE`` below 1, a rank
            outside its world, or a world size that is not a multiple of the local one: set by hand, such a job
            would wait for ranks that never come.
    """
    rank, world, local_rank = (
        env_int(env, "RANK", "0"),
        env_int(env, "WORLD_SIZE", "1"),
        env_int(env, "LOCAL_RANK", "0"),
    )
    local_world = env_int(env, "LOCAL_WORLD_SIZE", str(world))
    fix = "launch with torchrun or torchx (they set all four), or unset them for one process"
    for name, size in (("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", local_world)):
        if size < 1:
            raise ConfigError(f"environment: {name}={size} must be at least 1; {fix}")
    if not 0 <= rank < world:
        raise ConfigError(f"environment: RANK={rank} is outside WORLD_SIZE={world} (ranks 0-{world - 1}); {fix}")
    if not 0 <= local_rank < local_world:
        raise ConfigError(
            f"environment: LOCAL_RANK={local_rank} is outside LOCAL_WORLD_SIZE={local_world} "
            f"(ranks 0-{local_world - 1}); {fix}"
        )
    if world % local_world:
        raise ConfigError(
            f"environment: WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world} (ranks per "
            f"host); {fix}"
        )
    return rank, world, local_rank, local_world


def env_int(env: Mapping[str, str], name: str, default: str) -> int:
    """The launch variable ``name`` of ``env`` (``default`` when unset) as an int.

    Raises:
        ConfigError: it is not a whole number.
    """
    value = env.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            f"environment: {name}={value!r} is not a whole number; launch with torchrun or torchx, or unset {name}"
        ) from None


def init_distributed(device_name: str = "auto") -> DistInfo:
    """Initialise the default process group (idempotent) and pick this rank's device (:func:`resolve_device`)
    from the launcher's environment (module docstring).

    Args:
        device_name: the config's ``device`` (``auto`` | ``cpu`` | ``cuda``).

    Returns:
        This rank's :class:`DistInfo` (backend ``nccl`` on CUDA, ``gloo`` on CPU).

    Raises:
        ConfigError: see :func:`resolve_device` and :func:`launch_env`; ``WORLD_SIZE`` > 1 without ``MASTER_ADDR``.
    """
    rank, world, local_rank, local_world = launch_env(os.environ)
    device = resolve_device(device_name, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        _warn_shared_store_restarts(rank)
        store = None
        if "MASTER_ADDR" not in os.environ:
            if world != 1:
                raise ConfigError(
                    f"environment: WORLD_SIZE={world} but MASTER_ADDR is unset, so the ranks cannot meet; launch "
                    "with torchrun or torchx (they set both), or unset WORLD_SIZE for one process"
                )
            store = dist.HashStore()
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world,
            store=store,
            device_id=device if device.type == "cuda" else None,
        )
    return DistInfo(rank, world, local_rank, local_world, device, backend)


def shutdown(barrier: bool = True) -> None:
    """Destroy the default process group.

    Args:
        barrier: first wait until every rank gets here, so that no rank tears down its gloo/NCCL pairs while a
            peer still has traffic in flight to it (seen with gloo as ``terminate called without an active
            exception`` at exit). Only on the success path: after a failure a peer may never arrive.
    """
    if dist.is_available() and dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
