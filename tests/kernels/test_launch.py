"""LaunchCache: first launch per key through Triton, later ones straight to the compiled kernel.

The direct path needs CUDA; here a stand-in kernel records what each path receives, so the
argument layout (runtime arguments as device addresses, then the constexprs, in signature order)
is checked on CPU. The GPU tests in tests/ops check the real kernels bit for bit.
"""

import pytest
import torch

import dsv4spec.kernels.launch as launch
from dsv4spec.kernels.launch import LaunchCache, alignment_key


class FakeCompiled:
    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "meta"

    def run(self, *args):
        self.log.append(("direct", args))


class FakeKernel:
    arg_names = ["x_ptr", "n", "BLOCK"]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launcher(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log)
        return launcher


@pytest.fixture
def cuda_like(monkeypatch):
    monkeypatch.setattr(launch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1234, raising=False)


def test_first_launch_compiles_then_direct_with_addresses(cuda_like):
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    for _ in range(3):
        cache.launch(("k", 8), (2, 1, 1), (x, 8), {"BLOCK": 4}, num_warps=1)
    assert kernel.log[0] == ("triton", (2, 1, 1), (x, 8), {"BLOCK": 4, "num_warps": 1})
    direct = (2, 1, 1, 1234, "fn", "meta", None, None, None, x.data_ptr(), 8, 4)
    assert kernel.log[1:] == [("direct", direct)] * 2
    assert cache.direct_launches == 2 and len(cache) == 1


def test_new_key_and_disabled_cache_go_through_triton(cuda_like, monkeypatch):
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    cache.launch("a", (1, 1, 1), (x, 8), {"BLOCK": 4}, 1)
    cache.launch("b", (1, 1, 1), (x, 16), {"BLOCK": 4}, 1)
    monkeypatch.setattr(LaunchCache, "enabled", False)
    cache.launch("a", (1, 1, 1), (x, 8), {"BLOCK": 4}, 1)
    assert [entry[0] for entry in kernel.log] == ["triton"] * 3


def test_interpreter_and_launch_hooks_never_cache(monkeypatch):
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    cache.launch("a", (1, 1, 1), (x, 8), {"BLOCK": 4}, 1)  # TRITON_INTERPRET=1 in CI
    assert len(cache) == 0
    monkeypatch.setattr(launch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(launch, "_hooks_installed", lambda: True)
    cache.launch("a", (1, 1, 1), (x, 8), {"BLOCK": 4}, 1)
    assert len(cache) == 0 and [e[0] for e in kernel.log] == ["triton"] * 2


def test_argument_layout_must_match_the_signature(cuda_like):
    cache = LaunchCache(FakeKernel())
    with pytest.raises(AssertionError, match="BLOCK"):
        cache.launch("a", (1, 1, 1), (torch.zeros(1),), {"BLOCK": 4, "n": 1}, 1)


def test_alignment_key():
    base = torch.zeros(16)
    assert alignment_key(base, base[1:], None, base[4:]) == 0b1001


def test_our_kernels_pass_arguments_in_signature_order(monkeypatch):
    """Every launch of the real kernels (here in the interpreter) matches its signature."""
    from dsv4spec.ops import C128DraftCleanup, clear_unaccepted_c128_draft_states, hc_head

    seen = []
    real = LaunchCache.launch

    def spy(self, key, grid, args, constexprs, num_warps):
        names = self.kernel.arg_names
        seen.append(names[:len(args)] + list(constexprs) == names)
        return real(self, key, grid, args, constexprs, num_warps)

    monkeypatch.setattr(LaunchCache, "launch", spy)
    states = [torch.randn(9, 6) for _ in range(2)]
    idx, seq, acc = torch.tensor([0]), torch.tensor([2]), torch.tensor([1])
    C128DraftCleanup(states, ring_size=4).clear(idx, seq, acc, num_draft_tokens=3)
    clear_unaccepted_c128_draft_states(states[0], idx, seq, acc, ring_size=4, num_draft_tokens=3)
    x = torch.randn(2, 4, 8)
    hc_head(x, torch.randn(4, 32), torch.rand(1), torch.rand(4), norm_eps=1e-6, hc_eps=1e-6,
            impl="triton")
    assert seen == [True] * 4
