# Two commands set everything up on a fresh machine with Python 3.11:
#   make train   creates .venv (pinned CPU stack) when missing, then trains on the embedded default
#   make test    same set-up, then the linter, the format check and the test suite (what .ci/run calls)
# On a GPU host add STACK=gpu (make train STACK=gpu, make test STACK=gpu, make venv STACK=gpu): the CUDA 13.0
# stack verified on H200. STACK=cpu-1.9: the CPU stack of the newest TorchRec (1.9). One .venv holds one stack:
# `make clean` before switching.
#   make integration   as root: a Slurm cluster and the CPU image, started and built by tests/integration
#                      (installs the Debian packages it needs; .ci/run calls it after make test)
# Extra arguments: make train ARGS="trainer.max_steps=100 data.batch_size=512"   make test PYTEST_ARGS="-k tsv"
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STACK ?= cpu
# Extra pip arguments for torch alone on the CPU stack, e.g. a CPU wheel index where the default would fetch a
# CUDA build.
TORCH_PIP_ARGS ?=
# The GPU stack's wheel index for torch and fbgemm-gpu (the Dockerfile's TORCH_INDEX_URL).
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cu130
ARGS ?=
PYTEST_ARGS ?=

# Each stack in install order: torch, its FBGEMM build, torchrec. torchrec goes in last (after requirements.txt)
# and without its declared dependencies (fbgemm-gpu, torchmetrics==1.0.3): they would replace the FBGEMM build
# and the torchmetrics 1.9.0 pin, and pip checks declared pins only on installs that resolve dependencies.
# The GPU pins are the Dockerfile's; tests/test_launch_packaging.py checks every stack against `make -n`.
# STACK=cpu-1.9 (opt-in): the newest TorchRec series on CPU, torch 2.14.1 + fbgemm-gpu-cpu 1.9.0 + torchrec 1.9.2.
# It is not the default: torch 2.14's CPU build is published only on PyTorch's CPU wheel index, and PyPI's torch
# 2.14.1 is the CUDA build, several GB with its CUDA libraries (it runs on CPU too). For the CPU build:
#   make venv STACK=cpu-1.9 TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
STAMPS := $(VENV)/.installed $(VENV)/.installed-gpu $(VENV)/.installed-cpu-1.9
ifeq ($(STACK),cpu)
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0 $(TORCH_PIP_ARGS)
FBGEMM := fbgemm-gpu-cpu==1.8.0
TORCHREC := torchrec==1.8.0
else ifeq ($(STACK),cpu-1.9)
STAMP := $(VENV)/.installed-cpu-1.9
TORCH := torch==2.14.1 $(TORCH_PIP_ARGS)
FBGEMM := fbgemm-gpu-cpu==1.9.0
TORCHREC := torchrec==1.9.2
else ifeq ($(STACK),gpu)
STAMP := $(VENV)/.installed-gpu
TORCH := torch==2.11.0 --index-url $(TORCH_INDEX_URL)
FBGEMM := fbgemm-gpu==1.6.0 --index-url $(TORCH_INDEX_URL)
TORCHREC := torchrec==1.6.1
else
$(error STACK=$(STACK): use STACK=cpu (the default), STACK=gpu or STACK=cpu-1.9)
endif
# the stack a stamp file marks, for the error that refuses to overlay it with another
stack_of = $(if $(filter %/.installed-gpu,$1),GPU,$(if $(filter %/.installed-cpu-1.9,$1),CPU 1.9,CPU))

.PHONY: train test integration venv clean

venv: $(STAMP)

$(STAMP): requirements.txt Makefile
	@$(foreach o,$(filter-out $(STAMP),$(STAMPS)),if [ -e $(o) ]; then echo "error: $(VENV) holds the $(call stack_of,$(o)) stack, not STACK=$(STACK): run make clean first, or install this one beside it with VENV=.venv-$(STACK)" >&2; exit 2; fi;)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $(TORCH)
	$(PIP) install -q $(FBGEMM)
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps $(TORCHREC)
	$(PY) -c "import torch, torchrec, fbgemm_gpu, hydra; print('stack: torch', torch.__version__, '| torchrec', torchrec.__version__, '| GPUs', torch.cuda.device_count())"
	@touch $@

train: venv
	$(PY) train.py $(ARGS)

test: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest $(PYTEST_ARGS)

integration: venv
	$(PY) -m pytest -m integration tests/integration $(PYTEST_ARGS)

# Not outputs/: it holds every run's metrics, logs and checkpoints.
clean:
	rm -rf $(VENV) .pytest_cache
