"""The vLLM hooks' capture detection on CUDA device 0, the counts a table serves only in a
graph (compiled at the first eager call all the same), and a failure to tell whether a table
serves this process's GPUs (the hooks stay and decide per call)."""

import logging

import pytest

from dsv4spec.integrations.hooks import INTERPRETER_ARCHITECTURE, STEP_ASIDE
from dsv4spec.integrations.vllm import mhc as mhc_hooks
from dsv4spec.integrations.vllm import plugin, register

from .test_hooks import CALLERS, call_args, hooked, make_inputs, measure
from .test_precompile import compiles  # noqa: F401 - the fixture

LOGGER = "dsv4spec.integrations.vllm"


@pytest.fixture
def on_cuda_0(monkeypatch):
    """The mHC hooks as on CUDA device 0 (an sm_90 stand-in; ours recorded, never launched):
    ``capturing[0]`` says whether its stream is being captured."""
    capturing = [False]
    monkeypatch.setattr(mhc_hooks.torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(mhc_hooks, "gpu_architecture", lambda index: INTERPRETER_ARCHITECTURE)
    monkeypatch.setattr(mhc_hooks, "stream_capturing",
                        lambda index: index == 0 and capturing[0])
    monkeypatch.setattr(mhc_hooks, "mhc_post", lambda *a, **k: "ours")
    return capturing


def test_a_capture_on_cuda_0_is_a_capture(vllm, monkeypatch, on_cuda_0,
                                          compiles):  # noqa: F811
    """Device 0 is a device like any other: inside its capture nothing is compiled and the
    graph table decides (here: vLLM's); eagerly the eager table (ours), compiled first."""
    measure(monkeypatch, "mhc_post", modes=("eager",))
    args, kwargs = call_args("mhc_post", make_inputs(2))
    on_cuda_0[0] = True
    assert mhc_hooks.fast_mhc_post(*args, **kwargs) is STEP_ASIDE
    assert compiles == []
    on_cuda_0[0] = False
    assert mhc_hooks.fast_mhc_post(*args, **kwargs) == "ours"
    assert [(op, index) for op, _, _, index, _ in compiles] == [("mhc_post", 0)]


def test_the_cpu_never_asks_cuda_whether_it_captures(monkeypatch):
    asked = []
    monkeypatch.setattr(mhc_hooks, "stream_capturing", lambda index: asked.append(index) or True)
    assert mhc_hooks._capturing(-1) is False and asked == []
    assert mhc_hooks._capturing(0) is True and asked == [0]


def test_counts_served_only_in_a_graph_are_compiled_at_the_first_eager_call(
        vllm, monkeypatch, compiles):  # noqa: F811
    """A capture launches only what was compiled before it: the eager call before the capture
    compiles the counts the graph table serves, though its eager table serves none."""
    measure(monkeypatch, "mhc_post", modes=("graph",), spans=((1, 8),))
    register()
    args, kwargs = call_args("mhc_post", make_inputs(2))
    hooked(vllm, "mhc_post")(*args, **kwargs)
    assert [(op, tokens) for op, tokens, *_ in compiles] == [("mhc_post", tuple(range(1, 9)))]
    assert mhc_hooks.served_tokens("mhc_post", 128, INTERPRETER_ARCHITECTURE, False) == [
        *range(1, 9)]


@pytest.mark.parametrize("op", ["mhc_post", "hc_head"])
def test_a_failure_to_tell_whether_a_table_serves_keeps_the_hooks(vllm, monkeypatch, caplog,
                                                                  op):
    """CUDA failing to list the GPUs at a hook's first call: the hook stays in every module it
    patched (its per-call checks decide), with one warning; vLLM's function is not put back."""
    def no_gpus():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(mhc_hooks, "visible_architectures", no_gpus)
    register()
    args, kwargs = call_args(op, make_inputs(2))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hooked(vllm, op)(*args, **kwargs)
    assert plugin._settled[op] is True
    for where in CALLERS[op]:
        assert plugin.is_hooked(hooked(vllm, op, where)), where
    assert [r for r in caplog.records if "could not tell" in r.getMessage()]
