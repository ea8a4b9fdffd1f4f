"""torchx component for the DLRM-v2 trainer: ``dist.ddp`` with this project's script, NCCL env, mounts and run dir.

    torchx run -s local_cwd launch/components.py:trainer -j 1x2 -- trainer.max_steps=100
    torchx run -s local_docker --workspace "" launch/components.py:trainer --image dlrm-v2:0.1.0 -j 1x8 --gpu 8 \\
        --data /mnt/criteo --outputs /mnt/runs -- experiment=mlperf_dlrmv2 data.dataset_dir=/data/criteo_bin
    torchx run -s kubernetes --workspace "" launch/components.py:trainer --image REGISTRY/dlrm-v2:0.1.0 \\
        -j 2x8 --gpu 8 --data pvc:criteo --outputs pvc:dlrm-runs --max_retries 2 -- experiment=mlperf_dlrmv2 ...
    torchx run -s kubernetes --dryrun --workspace "" launch/components.py:trainer ...   # print the request only

The plain ``torchx run -s local_cwd dist.ddp -j 1x2 --script train.py -- <overrides>`` works too; this component
fills in what every launch of this trainer wants: the script; NCCL settings (``NCCL_NVLS_ENABLE=0``: NVLink
SHARP multicast has hung all-to-alls on some drivers; ``NCCL_DEBUG``); data and output mounts at fixed paths in
the container (``/data`` read-only, ``/outputs``, where each job's run directory ``/outputs/<app id>`` goes, see
``dlrm/cli.py``); and the job's restart budget. Containers only (local_docker, kubernetes): local_cwd and slurm
run on the host's file system and ignore mounts, so there give host paths in the overrides and ``--output_root``.

No ``from __future__ import annotations`` here: torchx reads the parameter annotations to build its CLI.
"""

import re
from typing import Dict, List, Optional

import torchx.specs as specs
from torchx.components.dist import ddp, parse_nnodes

# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers get a fresh TCPStore per restart instead of sharing the
# agent's, whose keys outlive a restart; with it shared, a rank restarted by `torchrun --max_restarts` can read
# a peer's address from the previous attempt and fail to connect (pytorch/pytorch#135712, #167288).
DEFAULT_ENV: Dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "PYTHONUNBUFFERED": "1",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}
# torchrun with a preemption exit status (dlrm/torchrun.py); `python` is the job's interpreter, as for torchrun
LAUNCHER = "python -m dlrm.torchrun"
DATA_DST = "/data"
OUTPUTS_DST = "/outputs"
# The run-name rule of dlrm/cli.py (_NAME_OK), checked here too so a bad name fails at launch, not on the cluster.
RUN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# Per GPU when --cpu / --memMB are not given (torchx parses Optional[int] arguments as strings, so 0 stands for
# "not given"): the README's Kubernetes MLPerf example (96 CPUs and 1,000,000 MB for
# an 8-GPU node), so that the Slurm command beside it gets a GPU node's resources, not a CPU job's 2 CPUs and 8 GB.
CPU_PER_GPU = 12
MEM_MB_PER_GPU = 125_000


def _mount(src: str, dst: str, readonly: bool) -> List[str]:
    """torchx mount options for ``src`` (``pvc:NAME``: a Kubernetes persistent volume claim, else a host path),
    as the list ``specs.parse_mounts`` takes: ``["type=bind", "src=/host", "dst=/data", "readonly"]``."""
    if not src:
        raise ValueError(f"empty mount source for {dst}; give a host directory or pvc:<claim name>")
    kind, _, name = src.partition(":")
    opts = ["type=volume", f"src={name}"] if kind == "pvc" and name else ["type=bind", f"src={src}"]
    return opts + [f"dst={dst}"] + (["readonly"] if readonly else [])


def trainer(
    *overrides: str,
    j: str = "1x2",
    image: str = "dlrm-v2:latest",
    gpu: int = 0,
    cpu: int = 0,
    memMB: int = 0,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    nccl_debug: str = "WARN",
    max_retries: int = 0,
    max_restarts: int = 0,
    data: Optional[str] = None,
    outputs: Optional[str] = None,
    output_root: Optional[str] = None,
    mounts: Optional[List[str]] = None,
    run_name: Optional[str] = None,
    name: str = "dlrm-v2",
) -> specs.AppDef:
    """Train DLRM-v2 on ``j`` = nodes x processes per node (``torchrun`` on each node, one process per GPU).

    Args:
        overrides: Hydra overrides for train.py, e.g. ``model=dlrm_v2 trainer.max_steps=1000``.
        j: ``[min_nodes:]nodes x processes per node``, e.g. ``1x8``, ``2x8`` (processes per node <= gpu).
        image: Docker image for local_docker / kubernetes (built from this repo's Dockerfile); local_cwd runs
            in the current directory and ignores it.
        gpu: GPUs per node (0 on CPU-only machines: gloo instead of NCCL).
        cpu: CPUs per node (0, the default: 2 for a CPU job, :data:`CPU_PER_GPU` per GPU).
        memMB: host memory per node, MB (0, the default: 8192 for a CPU job, :data:`MEM_MB_PER_GPU` per GPU).
        h: a torchx named resource (e.g. ``aws_p5.48xlarge``); overrides cpu, gpu and memMB.
        env: extra environment variables, merged over the defaults (``NCCL_NVLS_ENABLE=0``, ``PYTHONUNBUFFERED=1``,
            ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, and ``NCCL_DEBUG`` from ``nccl_debug``).
        nccl_debug: ``NCCL_DEBUG`` level (``WARN``, ``INFO`` to debug hangs and timeouts, ``""`` to leave unset).
        max_retries: times the scheduler restarts the whole job after a failure; retries write into the same
            run directory (the app id does not change).
        max_restarts: times torchrun restarts all workers of the job in place after a worker fails (torchrun
            ``--max_restarts``; no rescheduling); the restarted workers resume from the newest checkpoint.
        data: mounted read-only at ``/data`` (containers): a host directory, or ``pvc:<claim>`` on kubernetes.
        outputs: mounted at ``/outputs`` (containers), a host directory or ``pvc:<claim>``; each job's run
            directory (``metrics.jsonl``, ``config.yaml``, logs, checkpoints) is ``/outputs/<app id>``.
        output_root: where run directories go, as the job sees it (sets ``DLRM_OUTPUT_ROOT``), e.g. a shared
            file system path on slurm; default ``/outputs`` with ``outputs``, else ``outputs`` in the workdir.
        mounts: more torchx mounts, ``type=bind,src=/host,dst=/job[,readonly]`` or ``type=volume,src=CLAIM,dst=..``.
        run_name: name of the run directory instead of the app id (sets ``DLRM_RUN_NAME``).
        name: job name; the scheduler's app id (and so the run directory) starts with it.

    Raises:
        ValueError: an empty mount source, a ``run_name`` that is not a plain directory name, ``outputs``
            together with a different ``output_root``, a negative ``max_restarts`` or ``max_retries``, a ``j``
            that is not ``[min:]NxP`` or ``P``, or (``gpu`` > 0 without ``h``) more processes per node than ``gpu``.
    """
    if max_restarts < 0:
        raise ValueError(f"--max_restarts={max_restarts} must be >= 0")
    if max_retries < 0:
        raise ValueError(f"--max_retries={max_retries} must be >= 0")
    nproc = parse_nnodes(j)[2]
    # local rank r trains on cuda:<r> (dlrm/process_group.py): past gpu the job would fail on the cluster after
    # scheduling; with h the named resource sets the GPUs, not gpu
    if h is None and 0 < gpu < nproc:
        raise ValueError(
            f"-j {j} runs {nproc} processes per node but --gpu {gpu} gives each node {gpu} GPUs; run at most one "
            f"process per GPU (-j ...x{gpu}) or ask for --gpu {nproc}"
        )
    if cpu <= 0:
        cpu = CPU_PER_GPU * gpu if gpu else 2
    if memMB <= 0:
        memMB = MEM_MB_PER_GPU * gpu if gpu else 8192
    job_env: Dict[str, str] = dict(DEFAULT_ENV)
    if nccl_debug:
        job_env["NCCL_DEBUG"] = nccl_debug
    all_mounts: List[str] = []
    if data is not None:
        all_mounts.extend(_mount(data, DATA_DST, readonly=True))
    if outputs is not None:
        if output_root not in (None, OUTPUTS_DST):
            raise ValueError(f"--outputs mounts at {OUTPUTS_DST}; drop --output_root={output_root} or --outputs")
        all_mounts.extend(_mount(outputs, OUTPUTS_DST, readonly=False))
        output_root = OUTPUTS_DST
    if output_root:
        job_env["DLRM_OUTPUT_ROOT"] = output_root
    if run_name is not None:
        if not RUN_NAME_RE.fullmatch(run_name):
            raise ValueError(
                f"--run_name={run_name!r} is not a plain directory name; use letters, digits, '.', '_' and '-'"
            )
        job_env["DLRM_RUN_NAME"] = run_name
    job_env.update(env or {})
    all_mounts += mounts or []
    app = ddp(
        *overrides,
        script="train.py",
        image=image,
        name=name,
        h=h,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        j=j,
        env=job_env,
        max_retries=max_retries,
        mounts=all_mounts or None,
    )
    # dist.ddp runs `torchrun ...`; run it through dlrm.torchrun instead (the same arguments; a preempted job
    # exits 143, not 1, see dlrm/torchrun.py), and add --max_restarts, which dist.ddp has no parameter for
    role = app.roles[0]
    assert role.args[1].startswith("torchrun "), role.args
    restarts = f"--max_restarts {max_restarts} " if max_restarts else ""
    role.args[1] = f"{LAUNCHER} {restarts}" + role.args[1][len("torchrun ") :]
    return app
