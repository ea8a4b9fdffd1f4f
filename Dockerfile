# syntax=docker/dockerfile:1
# Image of the trainer: one Dockerfile, two stacks, picked by build arguments.
#   STACK=gpu (default): CUDA 13.0 on Ubuntu 24.04 (Python 3.12), the stack verified on H200 (torch 2.11.0+cu130,
#     fbgemm-gpu 1.6.0, torchrec 1.6.1: the pins of `make venv STACK=gpu`)
#       docker build -t dlrm-v2:0.1.0 .
#   STACK=cpu: the Makefile's CPU stack (torch 2.13.0+cpu, fbgemm-gpu-cpu 1.8.0, torchrec 1.8.0) on any Debian or
#     Ubuntu base with Python >= 3.10
#       docker build -t dlrm-v2:0.1.0-cpu --build-arg STACK=cpu --build-arg BASE_IMAGE=debian:bookworm-slim .
#   docker run --gpus all --ipc=host dlrm-v2:0.1.0                                    # synthetic default, 1 GPU
#   docker run --gpus all --ipc=host -v /mnt/criteo:/data:ro -v /mnt/runs:/outputs -e DLRM_OUTPUT_ROOT=/outputs \
#       dlrm-v2:0.1.0 torchrun --standalone --nproc_per_node 8 train.py experiment=mlperf_dlrmv2 ...
#   torchx run -s local_docker --workspace "" launch/components.py:trainer --image dlrm-v2:0.1.0 -j 1x8 --gpu 8
# TORCH_INDEX_URL: where torch (and, for gpu, fbgemm-gpu) come from; empty: the stack's index on
# download.pytorch.org (cu130 or cpu), which a mirror can replace.
# Two stages: the builder resolves and installs everything into /opt/venv (pip's cache is a build cache mount,
# build tools stay behind); the runtime stage is the base image (torch's cu130 wheels bring their own CUDA
# libraries as nvidia-* wheels) plus the Python interpreter, the venv and the source.
# tests/test_launch_packaging.py checks these pins against pyproject.toml, requirements.txt and the Makefile.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04

FROM ${BASE_IMAGE} AS builder
ARG STACK=gpu
ARG TORCH_INDEX_URL=
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Order matters: torch (and the CUDA fbgemm-gpu) from their index, then torchrec without its declared
# dependencies (they would pull another torch / fbgemm-gpu build from PyPI over these).
RUN --mount=type=cache,target=/root/.cache/pip set -e; case "$STACK" in \
    gpu) index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu130}; \
         pip install torch==2.11.0 --index-url $index; \
         pip install fbgemm-gpu==1.6.0 --index-url $index; \
         pip install --no-deps torchrec==1.6.1 ;; \
    cpu) index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}; \
         pip install torch==2.13.0 --index-url $index; \
         pip install fbgemm-gpu-cpu==1.8.0; \
         pip install --no-deps torchrec==1.8.0 ;; \
    *) echo "error: build argument STACK=$STACK: use STACK=gpu (CUDA 13.0) or STACK=cpu" >&2; exit 2 ;; \
    esac
WORKDIR /workspace/dlrm
# Dependencies first (pyproject.toml changes less often than the code, so this layer stays cached), with the
# `wandb` extra so that logger=[...,wandb] runs in the image. Unquoted: sh leaves .[wandb] as it is (no file matches).
# pyproject's readme= needs a README.md to install: an empty one here, so that an edit of the README does not
# rebuild this layer (COPY . . below brings the real one).
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip mkdir -p dlrm && touch dlrm/__init__.py README.md \
    && pip install -e .[wandb] && rm -rf dlrm README.md
COPY . .
# Editable: the configs in conf/ are read from /workspace/dlrm, and torchx's workspace patching (COPY . . over
# this directory) takes effect without reinstalling. The check fails the build on a drifted stack, and on a
# CPU stack that pulled a CUDA torch (PyPI's default build).
RUN pip install --no-deps -e . \
    && python -c "import sys, torch; from importlib.metadata import version as v; \
got = tuple(v(p).split('+')[0] for p in ('torch', 'fbgemm-gpu' if sys.argv[1] == 'gpu' else 'fbgemm-gpu-cpu', 'torchrec')); \
want = {'gpu': ('2.11.0', '1.6.0', '1.6.1'), 'cpu': ('2.13.0', '1.8.0', '1.8.0')}[sys.argv[1]]; \
assert got == want, f'stack drifted: torch, fbgemm-gpu, torchrec = {got}, want {want}'; \
assert (torch.version.cuda is None) == (sys.argv[1] == 'cpu'), f'torch {torch.__version__} for STACK={sys.argv[1]}'" \
    "$STACK"

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /workspace/dlrm /workspace/dlrm
WORKDIR /workspace/dlrm
# CMD, not ENTRYPOINT: torchx (local_docker) passes `bash -c "torchrun ... train.py ..."` as the container's
# command, which an ENTRYPOINT would receive as arguments.
CMD ["python", "train.py"]
