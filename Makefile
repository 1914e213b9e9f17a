# Every target does its own setup from a bare Python 3: a venv, torch (the CPU wheel unless a
# CUDA torch is already importable), triton, and this package with its extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Reuse a CUDA torch from the base interpreter (GPU images) instead of installing the CPU wheel.
HAS_CUDA_TORCH := $(shell $(PYTHON) -c 'import torch,sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1 && echo 1)
VENV_FLAGS := $(if $(HAS_CUDA_TORCH),--system-site-packages,)

.PHONY: setup demo test bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_CUDA_TORCH),,$(PY) -m pip install -q torch==2.13.0)
	$(PY) -c 'import triton' 2>/dev/null || $(PY) -m pip install -q triton==3.6.0
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m dsv4spec.cli demo

# Kernel tests run in Triton's interpreter on CPU (conftest sets it when no GPU is visible).
test: setup
	$(PY) -m pytest -q -p no:cacheprovider tests

bench: setup
	$(PY) -m dsv4spec.cli bench cleanup --out benchmarks/results
	$(PY) -m dsv4spec.cli bench hc-head --out benchmarks/results
	$(PY) -m dsv4spec.cli bench eager-cost --out benchmarks/results
	$(PY) -m dsv4spec.cli bench model-step --out benchmarks/results
	$(PY) -m dsv4spec.cli bench e2e --out benchmarks/results

lint: setup
	$(PY) -m pip install -q ruff
	$(PY) -m ruff check src tests scripts

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
