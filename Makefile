# Two commands set everything up on a fresh machine with Python 3.11:
#   make train   creates .venv (pinned CPU stack) when missing, then trains on the embedded default
#   make test    same set-up, then the linter, the format check and the test suite (what .ci/run calls)
#   make integration   as root: a Slurm cluster and the CPU image, started and built by tests/integration
#                      (installs the Debian packages it needs; .ci/run calls it after make test)
# Extra arguments: make train ARGS="model=dlrm_v2 trainer.max_steps=100"   make test PYTEST_ARGS="-k tsv"
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Extra pip arguments for torch alone, e.g. a CPU wheel index where the default would fetch a CUDA build.
TORCH_PIP_ARGS ?=
ARGS ?=
PYTEST_ARGS ?=

.PHONY: train test integration venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PIP) install -q fbgemm-gpu-cpu==1.8.0
	$(PIP) install -q -r requirements.txt
	@# last and without its declared deps (the CUDA fbgemm-gpu, an older torchmetrics pin): the CPU build of
	@# fbgemm-gpu above serves it, and torchmetrics 1.9.0 is what the GPU image has too
	$(PIP) install -q --no-deps torchrec==1.8.0
	$(PY) -c "import torch, torchrec, fbgemm_gpu, hydra; print('stack: torch', torch.__version__, '| torchrec', torchrec.__version__)"
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
