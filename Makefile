# Every target does its own setup from a bare Python 3, in two layers of one venv: what the
# commands need (torch, the CPU wheel unless a CUDA torch is already importable; triton; this
# package), which is all `make demo` installs, then for the tests and benchmarks the package's
# extras and SGLang's wheel.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Reuse a CUDA torch from the base interpreter (GPU images) instead of installing the CPU wheel.
HAS_CUDA_TORCH := $(shell $(PYTHON) -c 'import torch,sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1 && echo 1)
VENV_FLAGS := $(if $(HAS_CUDA_TORCH),--system-site-packages,)

# SGLang 0.5.23 pins torch 2.14.1, which brings Triton 3.8: the plugin and op tests run there too.
PINS_VENV := .venv-sglang-pins
PINS_PY := $(PINS_VENV)/bin/python
# The sources of the vLLM versions the plugin supports, for its tests (each runs on every version)
# and benchmarks (0.33.0's): each wheel (336 and 239 MB, CUDA-only, pinned to torch 2.14.0) is
# downloaded once into VLLM_WHEELS and only the files they read are unpacked into the ignored
# .vllm-src/<version>/ (about 2 MB each); no wheel is ever installed. vLLM's torch pin needs no
# third environment: torch 2.14.0 and 2.14.1 both require triton~=3.8.0, so the pins venv runs
# the same Triton (the interpreter every kernel test runs in) on a patch release of the same
# torch, whose fixes change none of the ATen ops the plugin and its ops call.
VLLM_VERSIONS := 0.33.0 0.34.0
VLLM_SRC := .vllm-src
VLLM_WHEELS ?= $(HOME)/.cache/dsv4spec/wheels
VLLM_UNPACKED := $(VLLM_VERSIONS:%=$(VLLM_SRC)/%/.unpacked)

.PHONY: setup demo test test-sglang-pins bench lint clean

# The commands' layer: no extras, no engine.
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_CUDA_TORCH),,$(PY) -m pip install -q torch==2.13.0)
	$(PY) -c 'import triton' 2>/dev/null || $(PY) -m pip install -q triton==3.6.0
	$(PY) -m pip install -q -e .
	touch $@

# Order-only on the commands' layer: a venv set up before the layers were split is completed,
# not rebuilt.
$(VENV)/.installed: pyproject.toml | $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m pip install -q orjson psutil pybase64 requests starlette msgspec pydantic pyzmq ipython aiohttp
	# Last and without its dependencies: pip checks what is installed only when it resolves
	# dependencies, so SGLang's unmet pins (torch 2.14.1, ...) print no resolver ERROR.
	$(PY) -m pip install -q --no-deps sglang==0.5.23
	touch $@

$(VLLM_SRC)/%/.unpacked: src/dsv4spec/integrations/vllm/source.py | $(VENV)/.installed
	ls $(VLLM_WHEELS)/vllm-$*-*.whl >/dev/null 2>&1 || \
		$(PY) -m pip download -q --no-deps vllm==$* -d $(VLLM_WHEELS)
	rm -rf $(VLLM_SRC)/$*
	$(PY) -m dsv4spec.integrations.vllm.source $(VLLM_WHEELS)/vllm-$*-*.whl $(VLLM_SRC)/$*
	touch $@

setup: $(VENV)/.installed $(VLLM_UNPACKED)

$(PINS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PINS_VENV)
	$(PINS_PY) -m pip install -q --upgrade pip
	$(PINS_PY) -m pip install -q torch==2.14.1
	$(PINS_PY) -m pip install -q -e '.[test]'
	$(PINS_PY) -m pip install -q --no-deps sglang==0.5.23
	touch $@

demo: $(VENV)/.runtime
	$(PY) -m dsv4spec.cli demo

# Kernel tests run in Triton's interpreter on CPU (conftest sets it when no GPU is visible); the
# 25 slowest are listed at the end.
test: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# The plugins and the ops they hook, in Triton's interpreter, on SGLang 0.5.23's torch and Triton
# (which cover vLLM 0.33.0's and 0.34.0's, see VLLM_VERSIONS). The vLLM plugin's tests run here on
# the newest vLLM's source only: both versions pin the same torch, and `make test` runs both.
test-sglang-pins: $(PINS_VENV)/.installed $(VLLM_UNPACKED)
	$(PINS_PY) -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
	DSV4SPEC_VLLM_SRC=$(CURDIR)/$(VLLM_SRC)/$(lastword $(VLLM_VERSIONS)) \
		$(PINS_PY) -m pytest -q -p no:cacheprovider tests/integrations tests/ops tests/kernels

bench: setup
	$(PY) -m dsv4spec.cli bench cleanup --out benchmarks/results/cleanup
	$(PY) -m dsv4spec.cli bench hc-head --out benchmarks/results/hc_head
	$(PY) -m dsv4spec.cli bench eager-cost --out benchmarks/results/eager_cost
	$(PY) -m dsv4spec.cli bench model-step --out benchmarks/results/model_step
	$(PY) -m dsv4spec.cli bench e2e --out benchmarks/results/e2e

lint: setup
	$(PY) -m pip install -q ruff
	$(PY) -m ruff check src tests scripts

clean:
	rm -rf $(VENV) $(PINS_VENV) $(VLLM_SRC) .pytest_cache .hypothesis
