import os

import pytest
import torch

# CI has no GPU: run Triton kernels in the interpreter on CPU tensors. Must be set before any
# @triton.jit function is defined, i.e. before dsv4spec's kernels are imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
