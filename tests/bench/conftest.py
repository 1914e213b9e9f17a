"""Fixtures the benchmark tests share."""

import sys

import pytest

from dsv4spec.bench import sglang_mhc
from dsv4spec.integrations.sglang.source import sglang_root


def ours_to_drop(name: str) -> bool:
    """The stand-ins and SGLang's loaded files (not torch's lazily imported modules)."""
    return name == "sglang" or name.startswith(("sglang.", "_dsv4spec_sglang_"))


@pytest.fixture
def sgl_mhc():
    """SGLang's own mhc.py over the stand-ins (its TileLang stays unloaded); sys.modules
    restored afterwards."""
    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed (`make setup` installs sglang==0.5.23)")
    before = set(sys.modules)
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n == "sglang" or n.startswith(
        "sglang.")}
    try:
        yield sglang_mhc.load_sglang_mhc()
    finally:
        for name in set(sys.modules) - before:
            if ours_to_drop(name):
                del sys.modules[name]
        sys.modules.update(saved)
