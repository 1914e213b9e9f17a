"""When LaunchCache binds a direct launch, at the edges of each condition: a launch hook set as a
plain function or added to the exit chain, Triton 3.8's sanitizer, an annotation count above the
parameters', and Triton 3.6's launcher with scratch buffers to allocate."""

import pytest
import torch
from triton import knobs

import dsv4spec.kernels.launch as launch
from dsv4spec.kernels.launch import LaunchCache

from .test_launch import FakeCompiled, FakeKernel, FakeLauncher
from .test_launch import cuda_like as cuda_like  # noqa: F401 (a fixture)


def launched_with(launcher_attrs: dict) -> tuple[list, list] | None:
    """(the C launcher's calls, the launcher's own ``__call__`` calls) of one cached launch made
    with a launcher of these attributes (the layout: the one the test set); None where nothing
    was bound (Triton's ``kernel[grid](...)`` launches every call)."""
    calls = []

    class Launcher(FakeLauncher):
        def __call__(self, *args):
            calls.append(args)

    kernel = FakeKernel()
    compiled = FakeCompiled(kernel.log)
    compiled.run = Launcher(kernel.log)
    for attr, value in launcher_attrs.items():
        setattr(compiled.run, attr, value)
    returns_compiled = {"arg_names": FakeKernel.arg_names,
                        "__getitem__": lambda self, g: lambda *a, **k: compiled}
    cache = LaunchCache(type("K", (), returns_compiled)())
    x = torch.arange(8.0)
    cache.launch("k", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, num_warps=1)
    if cache.get("k") is None:
        return None
    cache.get("k")(5, 6)
    return kernel.log, calls


@pytest.mark.parametrize("hook", ["launch_enter_hook", "launch_exit_hook"])
def test_a_hook_set_as_a_plain_function_keeps_launches_through_triton(cuda_like, monkeypatch,
                                                                      hook):
    """Older code sets ``knobs.runtime.launch_enter_hook = fn`` (no HookChain): still a hook."""
    assert not launch._hooks_installed()  # the empty chains Triton starts with
    monkeypatch.setattr(knobs.runtime, hook, lambda *args: None)
    assert launch._hooks_installed()
    kernel, x = FakeKernel(), torch.arange(8.0)
    cache = LaunchCache(kernel)
    cache.launch("a", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, 1)
    assert cache.get("a") is None and len(cache) == 0


def test_a_hook_added_to_the_exit_chain_keeps_launches_through_triton(cuda_like):
    def hook(*args):
        return None

    knobs.runtime.launch_exit_hook.add(hook)
    try:
        assert launch._hooks_installed()
        kernel, x = FakeKernel(), torch.arange(8.0)
        cache = LaunchCache(kernel)
        cache.launch("a", (1, 1, 1), (x, x, 8, 0.5), {"BLOCK": 4}, 1)
        assert cache.get("a") is None
    finally:
        knobs.runtime.launch_exit_hook.remove(hook)
    assert not launch._hooks_installed()


@pytest.mark.parametrize("attrs", [
    # the sanitizer's annotation is the one more that the launcher's __call__ appends itself
    pytest.param({"gsan_enabled": True, "arg_annotations": ("a",) * 6}, id="sanitizer"),
    pytest.param({"profile_scratch_size": 32}, id="profile scratch"),
])
def test_triton_38_launches_through_the_launchers_call_with_the_sanitizer_or_scratch(
        cuda_like, monkeypatch, attrs):
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: "generic")
    assert launched_with({})[0][0][0] == "direct"  # the control: bound directly
    direct, through_call = launched_with(attrs)
    assert direct == []
    assert through_call == [(1, 1, 1, 1234, "fn", "meta", None, None, None, 5, 6, 8, 0.5, 4)]


@pytest.mark.parametrize("attrs", [
    pytest.param({"arg_annotations": ("a",) * 6}, id="one annotation more than parameters"),
    pytest.param({"arg_annotations": ("a",) * 4}, id="one annotation fewer"),
    pytest.param({"gsan_enabled": True}, id="sanitizer without its annotation"),
])
def test_triton_38_binds_nothing_where_the_annotations_do_not_count_the_parameters(
        cuda_like, monkeypatch, attrs):
    monkeypatch.setattr(launch, "direct_launch_layout", lambda *version: "generic")
    assert launched_with({})[0][0][0] == "direct"  # the control: bound directly
    assert launched_with(attrs) is None
