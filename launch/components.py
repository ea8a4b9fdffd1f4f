"""torchx component for the DLRM-v2 trainer: ``dist.ddp`` with this project's script, defaults and NCCL env.

    torchx run -s local_cwd launch/components.py:trainer -j 1x2 -- trainer.max_steps=100
    torchx run -s local_docker launch/components.py:trainer --image dlrm-v2:latest -j 1x8 --gpu 8 -- model=dlrm_v2

The plain ``torchx run -s local_cwd dist.ddp -j 1x2 --script train.py -- <overrides>`` works too; this component
only fills in what every launch of this trainer wants (the script, a job name, ``NCCL_NVLS_ENABLE=0`` since
NVLink SHARP multicast has hung all-to-alls on some drivers, unbuffered output).
"""


from typing import Dict, List, Optional

import torchx.specs as specs
from torchx.components.dist import ddp

DEFAULT_ENV: Dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"}


def trainer(
    *overrides: str,
    j: str = "1x2",
    image: str = ".",
    gpu: int = 0,
    cpu: int = 2,
    memMB: int = 8192,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
    name: str = "dlrm-v2",
) -> specs.AppDef:
    """Train DLRM-v2 on ``j`` = nodes x processes per node.

    Args:
        overrides: Hydra overrides for train.py, e.g. ``model=dlrm_v2 trainer.max_steps=1000``.
        j: nodes x processes per node, e.g. ``1x8`` (one process per GPU on GPU hosts).
        image: the image (a directory for local_cwd, a Docker image for local_docker/kubernetes).
        gpu: GPUs per node (0 on CPU-only machines).
        cpu: CPUs per node.
        memMB: host memory per node, MB.
        h: a named resource (overrides cpu/gpu/memMB).
        env: extra environment variables (merged over the NCCL defaults).
        max_retries: restarts of the whole job after a failure.
        mounts: volume mounts for data and checkpoints, in torchx's ``type=bind,src=...,dst=...`` form.
        name: job name.
    """
    return ddp(
        *overrides,
        script="train.py",
        image=image,
        name=name,
        h=h,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        j=j,
        env={**DEFAULT_ENV, **(env or {})},
        max_retries=max_retries,
        mounts=mounts,
    )
