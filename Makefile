# Every target does its own setup from a bare Python 3: a venv, torch (the CPU wheel unless a
# CUDA torch is already importable), triton, and this package with its extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Reuse a CUDA torch from the base interpreter (GPU images) instead of installing the CPU wheel.
HAS_CUDA_TORCH := $(shell $(PYTHON) -c 'import torch,sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1 && echo 1)
VENV_FLAGS := $(if $(HAS_CUDA_TORCH),--system-site-packages,)

# SGLang 0.5.23 pins torch 2.14.1, which brings Triton 3.8: the plugin and op tests run there too.
PINS_VENV := .venv-sglang-pins
PINS_PY := $(PINS_VENV)/bin/python

.PHONY: setup demo test test-sglang-pins bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_CUDA_TORCH),,$(PY) -m pip install -q torch==2.13.0)
	$(PY) -c 'import triton' 2>/dev/null || $(PY) -m pip install -q triton==3.6.0
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	$(PY) -m pip install -q orjson psutil pybase64 requests starlette msgspec pydantic pyzmq ipython aiohttp
	touch $@

setup: $(VENV)/.installed

$(PINS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PINS_VENV)
	$(PINS_PY) -m pip install -q --upgrade pip
	$(PINS_PY) -m pip install -q torch==2.14.1
	$(PINS_PY) -m pip install -q -e '.[test]'
	$(PINS_PY) -m pip install -q --no-deps sglang==0.5.23
	touch $@

demo: setup
	$(PY) -m dsv4spec.cli demo

# Kernel tests run in Triton's interpreter on CPU (conftest sets it when no GPU is visible).
test: setup
	$(PY) -m pytest -q -p no:cacheprovider tests

# The plugin and the ops it hooks, in Triton's interpreter, on SGLang 0.5.23's torch and Triton.
test-sglang-pins: $(PINS_VENV)/.installed
	$(PINS_PY) -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
	$(PINS_PY) -m pytest -q -p no:cacheprovider tests/integrations tests/ops tests/kernels

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
	rm -rf $(VENV) $(PINS_VENV) .pytest_cache .hypothesis
