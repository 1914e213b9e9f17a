"""LaunchCache: the first launch per key goes through Triton, later ones straight to the C launcher.

The direct path needs CUDA; here a stand-in kernel records what each path receives, so the
argument layout of each Triton release's C launcher (pointer addresses first, then every bound
scalar and constexpr, in signature order) is checked on CPU. The GPU tests in tests/ops check the
real kernels bit for bit against Triton's own dispatch under each release.
"""

import types

import pytest
import torch
import triton

import dsv4spec.kernels.launch as launch
from dsv4spec.kernels.launch import LaunchCache, alignment_key


class FakeLauncher:
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, False
    # Triton 3.8's generic launcher: one annotation per parameter (constexprs included)
    arg_annotations, kernel_signature = ("a",) * 5, b"sig"

    def __init__(self, log):
        self.log = log

    def launch(self, *args):
        self.log.append(("direct", args))


class FakeCompiled:
    function, packed_metadata = "fn", "meta"
    # Triton 3.6's launcher is generated from this: one argument per entry
    src = types.SimpleNamespace(signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                           "eps": "fp32", "BLOCK": "constexpr"})

    def __init__(self, log):
        self.run = FakeLauncher(log)


class FakeKernel:
    arg_names = ["x_ptr", "y_ptr", "n", "eps", "BLOCK"]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launcher(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log)
        return launcher


@pytest.fixture
def cuda_like(monkeypatch):
    # the stand-in launcher takes Triton 3.6's arguments, whatever Triton runs the tests
    monkeypatch.setattr(LaunchCache, "enabled", True)
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: "per_signature")
    monkeypatch.setattr(launch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1234, raising=False)


def test_first_launch_through_triton_then_direct_with_addresses(cuda_like):
    kernel, x, y = FakeKernel(), torch.arange(8.0), torch.arange(4.0)
    cache = LaunchCache(kernel)
    assert cache.get("k") is None
    cache.launch("k", (2, 3, 1), (x, y, 8, 0.5), {"BLOCK": 4}, num_warps=1)
    assert kernel.log == [("triton", (2, 3, 1), (x, y, 8, 0.5), {"BLOCK": 4, "num_warps": 1})]
    direct = cache.get("k")
    direct(111, 222)
    direct(333, 444)
    head = (2, 3, 1, 1234, "fn", False, False, None, None, "meta", None, None, None)
    assert kernel.log[1:] == [("direct", (*head, 111, 222, 8, 0.5, 4)),
                              ("direct", (*head, 333, 444, 8, 0.5, 4))]
    assert cache.direct_launches == 2 and len(cache) == 1 and direct.num_pointers == 2


def test_triton_38_layout_passes_the_arguments_as_one_tuple(cuda_like, monkeypatch):
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: "generic")
    kernel, x, y = FakeKernel(), torch.arange(8.0), torch.arange(4.0)
    cache = LaunchCache(kernel)
    cache.launch("k", (2, 3, 1), (x, y, 8, 0.5), {"BLOCK": 4}, num_warps=1)
    cache.get("k")(111, 222)
    head = (2, 3, 1, 1234, "fn", False, False, "meta", None, None, None, None, None,
            ("a",) * 5, b"sig")
    assert kernel.log[1:] == [("direct", (*head, (111, 222, 8, 0.5, 4)))]


def with_compiled(compiled):
    """A stand-in kernel whose launches return ``compiled``."""
    returns_compiled = {"arg_names": FakeKernel.arg_names,
                        "__getitem__": lambda self, g: lambda *a, **k: compiled}
    return type("K", (), returns_compiled)()


def test_triton_38_layout_with_scratch_uses_the_launchers_call(cuda_like, monkeypatch):
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: "generic")
    calls = []

    class Launcher(FakeLauncher):
        def __call__(self, *args):
            calls.append(args)

    kernel, x = FakeKernel(), torch.arange(8.0)
    compiled = FakeCompiled(kernel.log)
    compiled.run = Launcher(kernel.log)
    compiled.run.global_scratch_size = 64
    cache = LaunchCache(with_compiled(compiled))
    cache.launch("k", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, num_warps=1)
    cache.get("k")(5, 6)
    assert kernel.log == []  # never the C launcher directly
    assert calls == [(1, 1, 1, 1234, "fn", "meta", None, None, None, 5, 6, 8, 0.5, 4)]


@pytest.mark.parametrize("layout", ["generic", "per_signature"])
def test_a_launcher_reading_another_count_of_arguments_is_never_bound(cuda_like, monkeypatch,
                                                                      layout):
    """Triton 3.8's generic C launcher reads one argument per annotation, unchecked; Triton
    3.6's was generated from the source's signature: where either counts other than the kernel's
    parameters (a tensor descriptor, a tuple, another release's launcher), no direct launch is
    bound, not even through the launcher's ``__call__`` (it passes the same arguments on), and
    every call goes through ``kernel[grid](...)``."""
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: layout)
    signature = dict(FakeCompiled.src.signature)
    fewer = dict(list(signature.items())[:4])
    for launcher_attrs, src_signature in (
            ({"arg_annotations": ("a",) * 4}, signature),
            ({"arg_annotations": ("a",) * 6}, signature),
            ({"arg_annotations": None}, signature),
            ({}, fewer),
            ({}, {**fewer, "BLOCK": "tensordesc<fp32[4]>"}),
            ({}, {**fewer, "BLOCK": ("i32", "i32")}),
            ({}, None)):
        if bool(launcher_attrs) != (layout == "generic"):
            continue
        kernel, x = FakeKernel(), torch.arange(8.0)
        compiled = FakeCompiled(kernel.log)
        for attr, value in launcher_attrs.items():
            setattr(compiled.run, attr, value)
        compiled.src = types.SimpleNamespace(signature=src_signature)
        cache = LaunchCache(with_compiled(compiled))
        cache.launch("k", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, num_warps=1)
        assert cache.get("k") is None and len(cache) == 0, (launcher_attrs, src_signature)


def test_the_sanitizers_annotation_is_the_one_the_launchers_call_appends(cuda_like,
                                                                         monkeypatch):
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: "generic")
    kernel, x = FakeKernel(), torch.arange(8.0)
    compiled = FakeCompiled(kernel.log)
    compiled.run.gsan_enabled, compiled.run.arg_annotations = True, ("a",) * 6
    calls = []
    compiled.run.__class__ = type("Launcher", (FakeLauncher,),
                                  {"__call__": lambda self, *args: calls.append(args)})
    cache = LaunchCache(with_compiled(compiled))
    cache.launch("k", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, num_warps=1)
    cache.get("k")(5, 6)
    assert kernel.log == [] and calls == [(1, 1, 1, 1234, "fn", "meta", None, None, None, 5, 6,
                                           8, 0.5, 4)]


def test_other_key_and_disabled_cache_have_no_direct_launch(cuda_like, monkeypatch):
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    cache.launch("a", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, 1)
    assert cache.get("b") is None
    monkeypatch.setattr(LaunchCache, "enabled", False)
    assert cache.get("a") is None


def test_interpreter_and_launch_hooks_never_cache(monkeypatch):
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    cache.launch("a", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, 1)  # TRITON_INTERPRET=1 in CI
    assert len(cache) == 0
    monkeypatch.setattr(launch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(launch, "_hooks_installed", lambda: True)
    cache.launch("a", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, 1)
    assert len(cache) == 0 and [e[0] for e in kernel.log] == ["triton"] * 2


def test_pointer_after_a_scalar_is_not_cached(cuda_like):
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    cache.launch("a", (1, 1, 1), (x, 8, x, 0.5), {"BLOCK": 4}, 1)
    assert cache.get("a") is None


def test_argument_layout_must_match_the_signature(cuda_like):
    cache = LaunchCache(FakeKernel())
    with pytest.raises(AssertionError, match="BLOCK"):
        cache.launch("a", (1, 1, 1), (torch.zeros(1), torch.zeros(1), 8),
                     {"BLOCK": 4, "eps": 0.5}, 1)


def test_direct_launch_only_on_the_triton_releases_it_was_tested_with():
    assert launch.direct_launch_supported("3.6.0")
    assert launch.direct_launch_layout("3.6.0") == "per_signature"
    assert launch.direct_launch_layout("3.8.0") == "generic"
    # patch releases, pre-releases and local builds near a validated release are not it
    for other in ("3.5.1", "3.7.0", "3.8.1", "3.9.0", "4.0.0", "3.8.0rc1", "3.6.0+git1234",
                  "3.8.0+gitabc"):
        assert not launch.direct_launch_supported(other), other
    assert LaunchCache.enabled == launch.direct_launch_supported()


@pytest.mark.parametrize("version, holds", [("3.6.0", True), ("3.8.0", True), ("3.8.1", False),
                                            ("3.8.0+gitabc", False), ("3.9.0", False)])
def test_the_direct_launch_holds_for_the_imported_tritons_release(monkeypatch, version, holds):
    monkeypatch.setattr(triton, "__version__", version)
    assert launch.direct_launch_supported() is holds


def test_disabled_context_restores_the_previous_setting(monkeypatch):
    for start in (True, False):
        monkeypatch.setattr(LaunchCache, "enabled", start)
        with LaunchCache.disabled():
            assert LaunchCache.enabled is False
        assert LaunchCache.enabled is start


def test_untested_triton_launches_through_triton_only(cuda_like, monkeypatch):
    assert not launch.DIRECT_LAUNCH_LAYOUTS.get("3.9.0")
    monkeypatch.setattr(LaunchCache, "enabled", False)  # what an import under 3.9.0 sets
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    for _ in range(2):
        cache.launch("a", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, 1)
    assert cache.get("a") is None and len(cache) == 0
    assert [e[0] for e in kernel.log] == ["triton"] * 2


def test_alignment_key():
    assert alignment_key(0x1000, 0x2010, 0) == -1  # all aligned
    assert alignment_key(0x1000, 0x1004, 0x3008, 0x4010) == 0b1001
    assert alignment_key(0x1004) == 0


def test_our_kernels_pass_arguments_in_signature_order(monkeypatch):
    """Every launch of the real kernels (here in the interpreter) matches its signature and puts
    its pointers first."""
    from dsv4spec.ops import C128DraftCleanup, clear_unaccepted_c128_draft_states, hc_head

    seen = []
    real = LaunchCache.launch

    def spy(self, key, grid, args, constexprs, num_warps, **options):
        names = self.kernel.arg_names
        pointers = [isinstance(a, torch.Tensor) for a in args]
        seen.append(names[:len(args)] + list(constexprs) == names
                    and pointers == sorted(pointers, reverse=True))
        return real(self, key, grid, args, constexprs, num_warps, **options)

    monkeypatch.setattr(LaunchCache, "launch", spy)
    states = [torch.randn(9, 6) for _ in range(2)]
    idx, seq, acc = torch.tensor([0]), torch.tensor([2]), torch.tensor([1])
    C128DraftCleanup(states, ring_size=4).clear(idx, seq, acc, num_draft_tokens=3)
    clear_unaccepted_c128_draft_states(states[0], idx, seq, acc, ring_size=4, num_draft_tokens=3)
    x = torch.randn(2, 4, 8)
    hc_head(x, torch.randn(4, 32), torch.rand(1), torch.rand(4), norm_eps=1e-6, hc_eps=1e-6,
            impl="triton")
    assert seen == [True] * 4
