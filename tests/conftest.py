import os

import pytest
import torch

from dsv4spec.usage import use_cpu_threads

# As the dsv4spec command does: no more threads than the CPUs this process may use.
use_cpu_threads()

# CI has no GPU: run Triton kernels in the interpreter on CPU tensors. Must be set before any
# @triton.jit function is defined, i.e. before dsv4spec's kernels are imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpret_bf16_dots_as_floats() -> None:
    """Triton 3.6's interpreter keeps bf16 as uint16 and multiplies those bit patterns in
    ``tl.dot``. Convert bf16 operands to fp32 first: what the tensor cores compute (exact
    products, fp32 sums), so the tensor-core kernels can be checked on the CPU."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "bf16_as_floats", False):
        return
    original = builder.create_dot

    def as_float(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        data = interpreter._convert_float(h.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, as_float(a), as_float(b), d, input_precision, max_num_imprecise_acc)

    create_dot.bf16_as_floats = True
    builder.create_dot = create_dot


if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    _interpret_bf16_dots_as_floats()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded():
    # Tests that draw from the global RNG see the same numbers whatever ran before them.
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _tables_stack(monkeypatch):
    # The plugins' tests decide from the packaged tables measured under Triton 3.6, whichever
    # Triton runs them (3.6 here, 3.8 in the pins environment); the stack rule itself is tested
    # with explicit stacks (tests/integrations/test_tables.py).
    from dsv4spec.integrations import tables

    monkeypatch.setattr(tables, "running_stack", lambda: "3.6")
