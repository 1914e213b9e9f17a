"""The vLLM hooks at the edges of their rules: installing anyway over a function this vLLM does
not define, nothing watched with every hook off, an unreadable batch-invariant setting, DeepGEMM
learnt after the first call, a capture of a variant never compiled, a float64 comb, the largest
precompiled hc_head count, and hc_head's graph table inside a capture."""

import logging
import sys

import pytest

from dsv4spec.integrations.hooks import INTERPRETER_ARCHITECTURE, STEP_ASIDE
from dsv4spec.integrations.vllm import hc_head as hc_head_hooks
from dsv4spec.integrations.vllm import mhc as mhc_hooks
from dsv4spec.integrations.vllm import plugin, register

from .test_hooks import call_args, hooked, launches, make_inputs, measure
from .test_precompile import compiles, hc_head_on_gpu  # noqa: F401 - the fixtures

LOGGER = "dsv4spec.integrations.vllm"


def test_allow_untested_installs_nothing_where_vllm_lacks_the_function(vllm, monkeypatch,
                                                                       caplog):
    """``DSV4SPEC_VLLM_ALLOW_UNTESTED=1`` installs hooks whose source changed; a function this
    vLLM does not define (0.33.0: the reuse_residual boundary) is no such hook: nothing is
    attempted, nothing is skipped with a warning."""
    monkeypatch.setenv(plugin.ALLOW_UNTESTED, "1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    assert not [r for r in caplog.records if "hook skipped" in r.getMessage()]
    absent = [name for name, v in plugin.verdicts(vllm.model).items() if v.absent]
    for name in absent:
        attr = next(h.attr for h in plugin.HOOKS if h.name == name)
        assert not any(hasattr(module, attr) for module in vllm.models.values())


def test_every_hook_off_watches_no_module(vllm, monkeypatch):
    monkeypatch.setenv(plugin.MASTER_SWITCH, "0")
    for name in plugin.MODEL_MODULES:  # not imported yet (the fixture restores them)
        del sys.modules[name]
    assert register() == []
    assert plugin._watcher.pending == set() and plugin._watcher not in sys.meta_path


@pytest.mark.parametrize("value", ["yes", "true", "on"])
def test_an_unreadable_batch_invariant_setting_counts_as_on(monkeypatch, value):
    """vLLM reads VLLM_BATCH_INVARIANT as an integer and would refuse to start on these: the
    hooks never guess in their own favour."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", value)
    assert mhc_hooks.vllm_batch_invariant() is True
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert mhc_hooks.vllm_batch_invariant() is False


def test_deep_gemm_learnt_after_the_first_call_compiles_the_counts_it_frees(vllm, monkeypatch,
                                                                           compiles):  # noqa: F811
    """Before vLLM loads its DeepGEMM module the boundary counts DeepGEMM as in use (ours up to
    32 tokens); once vLLM says it does not run DeepGEMM, the next eager call compiles the rest of
    the counts the table serves."""
    measure(monkeypatch, "mhc_fused_post_pre", spans=((1, 64),))
    register()
    args, kwargs = call_args("mhc_fused_post_pre", make_inputs(2))
    module = sys.modules.pop("vllm.utils.deep_gemm")
    try:
        hooked(vllm, "mhc_fused_post_pre")(*args, **kwargs)
    finally:
        sys.modules["vllm.utils.deep_gemm"] = module
    monkeypatch.setattr(module, "is_deep_gemm_supported", lambda: False)
    hooked(vllm, "mhc_fused_post_pre")(*args, **kwargs)
    hooked(vllm, "mhc_fused_post_pre")(*args, **kwargs)
    assert [tokens for _, tokens, *_ in compiles] == [tuple(range(1, 33)), tuple(range(1, 65))]


def test_a_capture_runs_ours_only_with_the_norm_compiled_eagerly(vllm, monkeypatch):
    """mhc_pre with and without the fused RMSNorm are different kernels: a shape compiled
    eagerly without the norm weight does not let a captured call with it run ours."""
    measure(monkeypatch, "mhc_pre", modes=("graph",))
    monkeypatch.setattr(mhc_hooks, "_deep_gemm", False)
    capturing = [False]
    monkeypatch.setattr(mhc_hooks, "_capturing", lambda index: capturing[0])
    register()
    t = make_inputs(2)
    fn = hooked(vllm, "mhc_pre")
    args, plain = call_args("mhc_pre", t, norm=False)
    fn(*args, **plain)  # eager: vLLM's serves, ours (no norm) compiled on the side
    assert mhc_hooks._compiled
    launches(vllm).clear()
    capturing[0] = True
    args, normed = call_args("mhc_pre", t)
    fn(*args, **normed)
    assert launches(vllm), "never compiled with the norm: vLLM's kernels are captured"
    launches(vllm).clear()
    fn(*args, **plain)
    assert not launches(vllm), "compiled without the norm: ours is captured"


@pytest.mark.parametrize("op", ["mhc_post", "mhc_fused_post_pre"])
def test_a_comb_of_another_dtype_steps_aside_before_the_op(vllm, monkeypatch, caplog, op):
    """vLLM's kernels take float32 mixes only: another comb dtype is not a call the hook covers
    (vLLM's function serves it, no warning), not one the op is asked to refuse."""
    measure(monkeypatch, op)
    asked = []
    name = "mhc_post" if op == "mhc_post" else "mhc_post_pre"
    monkeypatch.setattr(mhc_hooks, name, lambda *a, **k: asked.append(1))
    t = make_inputs(2)
    t["comb"] = t["comb"].double()
    args, kwargs = call_args(op, t)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert getattr(mhc_hooks, f"fast_{op}")(*args, **kwargs) is STEP_ASIDE
    assert asked == [] and not caplog.records


def test_hc_head_serves_up_to_the_largest_precompiled_count(vllm, monkeypatch):
    monkeypatch.setattr(hc_head_hooks, "PRECOMPILE_MAX_TOKENS", 3)
    measure(monkeypatch, "hc_head")
    monkeypatch.setattr(hc_head_hooks, "hc_head", lambda *a, **k: "ours")
    for T, served in ((3, True), (4, False)):
        args, _ = call_args("hc_head", make_inputs(T))
        assert (hc_head_hooks.fast_hc_head(*args) == "ours") is served, T


def test_hc_head_decides_a_captured_call_from_the_graph_table(vllm, monkeypatch,
                                                             hc_head_on_gpu):  # noqa: F811
    measure(monkeypatch, "hc_head", modes=("eager",))
    hc_head_on_gpu(INTERPRETER_ARCHITECTURE)
    capturing = [False]
    monkeypatch.setattr(hc_head_hooks, "stream_capturing", lambda index: capturing[0])
    monkeypatch.setattr(hc_head_hooks, "hc_head", lambda *a, **k: "ours")
    args, _ = call_args("hc_head", make_inputs(2))
    assert hc_head_hooks.fast_hc_head(*args) == "ours"  # eager: the eager table serves
    capturing[0] = True
    assert hc_head_hooks.fast_hc_head(*args) is STEP_ASIDE  # the graph table does not
