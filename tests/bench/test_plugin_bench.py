"""``dsv4spec bench plugin`` on CPU: its hook calls run under a runtime context that reports
DeepSeek-V4, so the served-model gate lets the target hook's fast path run; the context is the
benchmark's alone (restored afterwards). The GPU parts (compilation, timing) are stubbed."""

import argparse
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from dsv4spec.bench import common, plugin
from dsv4spec.bench.hc_head import make_inputs
from dsv4spec.integrations.sglang import hc_head as hc_head_hooks
from dsv4spec.integrations.sglang import served_model

CONTEXT = served_model.RUNTIME_CONTEXT_MODULE


@pytest.fixture
def cpu_bench(monkeypatch):
    """The benchmark's GPU calls on the CPU; the target hook's fast path records whether the
    gate saw DeepSeek-V4 and returns its input; returns what the bench wrote and the calls."""
    seen = {"fast": [], "rows": []}

    def target_fast(self, x, hc_fn, hc_scale, hc_base):
        seen["fast"].append(served_model.serves_dsv4())
        return x[:, 0]

    def timing(fns, **kwargs):
        return {what: {"median_us": 1.0, "p20_us": 1.0, "p80_us": 1.0}
                for what in fns if fns[what]() is not None}

    monkeypatch.setattr(hc_head_hooks, "target_hc_head", target_fast)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(plugin, "make_inputs", lambda T, H, dtype, device: make_inputs(
        T, H, dtype, "cpu"))
    monkeypatch.setattr(plugin, "_sglang_fused_hc_head", lambda: None)
    monkeypatch.setattr(common, "environment", lambda: {})
    monkeypatch.setattr(common, "time_eager_side_by_side", timing)
    monkeypatch.setattr(common, "write_results",
                        lambda out, name, record, rows, columns, notes: seen["rows"].extend(rows))
    monkeypatch.setattr(served_model, "_verdicts", {})
    return seen


def _run():
    args = argparse.Namespace(tokens=[1], hidden=[64], compile_hidden=[], out=None)
    return plugin.main(args)


def test_the_bench_hook_runs_as_under_a_dsv4_server_and_the_context_is_restored(
        cpu_bench, monkeypatch):
    monkeypatch.delitem(sys.modules, CONTEXT, raising=False)
    assert _run() == 0  # without the context the hook steps aside: "the hook stepped aside"
    assert cpu_bench["fast"] == [True, True]  # the warm-up call, the timed one
    assert "target hook, nn.Parameter" in {r["what"] for r in cpu_bench["rows"]}
    assert CONTEXT not in sys.modules and served_model._verdicts == {}
    assert not served_model.serves_dsv4()


def test_a_loaded_runtime_context_is_answered_for_the_bench_then_given_back(
        cpu_bench, monkeypatch):
    context = ModuleType(CONTEXT)  # another model's server (or a stand-in's context)
    other = lambda: SimpleNamespace(hf_config=SimpleNamespace(model_type="glm5_next"))  # noqa: E731
    context.process_model_config = other
    context.get_platform = object
    monkeypatch.setitem(sys.modules, CONTEXT, context)
    verdicts = {id(None): (None, False)}  # the other model's, remembered before the bench
    monkeypatch.setattr(served_model, "_verdicts", verdicts)
    assert _run() == 0
    assert cpu_bench["fast"] == [True, True]  # the warm-up call, the timed one
    assert sys.modules[CONTEXT] is context and context.process_model_config is other
    assert context.get_platform is object and served_model._verdicts is verdicts
    assert verdicts == {id(None): (None, False)} and not served_model.serves_dsv4()


def test_serving_dsv4_restores_on_error(monkeypatch):
    monkeypatch.delitem(sys.modules, CONTEXT, raising=False)
    monkeypatch.setattr(served_model, "_verdicts", {})
    with pytest.raises(KeyError), plugin.serving_dsv4():
        assert served_model.serves_dsv4()
        raise KeyError("x")
    assert CONTEXT not in sys.modules and served_model._verdicts == {}
