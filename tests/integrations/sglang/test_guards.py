"""What keeps a serving SGLang up whatever dsv4spec's hooks meet.

Each hook's fast path is made to raise (a runtime error, an attribute error, a Triton compilation
error): SGLang's original must run with the same arguments and give its own result, one WARNING
with the traceback must be logged, and the hook must stay off afterwards. The hc_head hooks step
aside on ROCm, on unmeasured architectures, under SGLang's deterministic or batch-invariant mode
and under ``torch.compile``. The rollback hook takes SGLang's own index dtypes; the hc_head hooks
take ``nn.Parameter`` weights on their fast path.
"""

import ast
import logging
import sys
import types

import pytest
import torch
from triton.compiler.errors import CompilationError

from dsv4spec.integrations.hooks import STEP_ASIDE, GuardedHook
from dsv4spec.integrations.sglang import hc_head as hooks
from dsv4spec.integrations.sglang import rollback
from dsv4spec.ops import C128DraftCleanup, hc_head_reference

from . import standins
from .conftest import DRAFT, ROLLBACK, TARGET
from .test_hc_head import EPS, HC_EPS, NORM_EPS, SM90, assert_matches, make_inputs
from .test_rollback import BATCH, batch, check, kv_pool

LOGGER = "dsv4spec.integrations.sglang"


def compilation_error():
    return CompilationError("def kernel(): ...", ast.parse("x").body[0], "injected")


FAULTS = [
    pytest.param(lambda: RuntimeError("CUDA error: an illegal memory access"), id="RuntimeError"),
    pytest.param(lambda: AttributeError("'NoneType' object has no attribute 'launch'"),
                 id="AttributeError"),
    pytest.param(compilation_error, id="CompilationError"),
]


@pytest.fixture
def measured_table(monkeypatch):
    """A target table entry for the small test width (the interpreter stands in for sm_90)."""
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["eager"], 40, ((1, 8),))


def failure_records(caplog):
    return [r for r in caplog.records if "hook failed" in r.getMessage()]


def raising(make_error, calls):
    def fail(*args, **kwargs):
        calls.append(1)
        raise make_error()
    return fail


def hooked_model(sgl, which):
    """The stand-in draft or target model (large, distinct epsilons) and its hook target."""
    if which == "draft":
        return sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS), DRAFT
    return sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS), TARGET


def installed_hook(sgl, target) -> GuardedHook:
    hooks_ = [entry[1] for entry in sgl.registry._hooks[target]]
    assert len(hooks_) == 1 and isinstance(hooks_[0], GuardedHook)
    return hooks_[0]


@pytest.mark.parametrize("make_error", FAULTS)
@pytest.mark.parametrize("which", ["draft", "target"])
def test_hc_head_hook_failure_runs_sglang_and_switches_the_hook_off(
        sgl, monkeypatch, caplog, measured_table, make_error, which):
    calls = []
    monkeypatch.setattr(hooks, "hc_head", raising(make_error, calls))
    sgl.install()
    model, target = hooked_model(sgl, which)
    inputs = make_inputs(3, 40, torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = model.hc_head(*inputs)
        second = model.hc_head(*inputs)
    original = sgl.originals[target]
    assert calls == [1], "the op ran once, then the hook stayed off"
    assert original.calls == 2
    expected = original.__wrapped__(model, *inputs)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    records = failure_records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert records[0].exc_info is not None and records[0].exc_info[0] is type(make_error())
    assert not installed_hook(sgl, target).enabled


@pytest.mark.parametrize("make_error", FAULTS)
@pytest.mark.parametrize("where", ["clear", "build"])
def test_rollback_hook_failure_runs_sglang_and_switches_the_hook_off(
        sgl, monkeypatch, caplog, make_error, where):
    calls = []
    if where == "clear":
        monkeypatch.setattr(C128DraftCleanup, "clear", raising(make_error, calls))
    else:
        monkeypatch.setattr(rollback, "C128DraftCleanup", raising(make_error, calls))
    sgl.install()
    pool = kv_pool(sgl)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        check(pool, *batch())  # SGLang's loop: the right rows, bit for bit
        check(pool, *batch(([1], [3], [2])))
    assert calls == [1]
    assert sgl.originals[ROLLBACK].calls == 2
    assert len(failure_records(caplog)) == 1
    assert not installed_hook(sgl, ROLLBACK).enabled


def test_errors_of_sglang_original_propagate_and_leave_the_hook_on():
    """The original's own exceptions are SGLang's: not swallowed, not blamed on the hook."""
    hook = GuardedHook("test", lambda x: STEP_ASIDE, logging.getLogger(LOGGER), "SGLang")

    def original(x):
        raise KeyError("sglang's own")

    with pytest.raises(KeyError):
        hook(original, 1)
    assert hook.enabled


def test_keyboard_interrupt_is_not_swallowed():
    def fast(x):
        raise KeyboardInterrupt

    hook = GuardedHook("test", fast, logging.getLogger(LOGGER))
    with pytest.raises(KeyboardInterrupt):
        hook(lambda x: x, 1)


def test_sglang_index_dtypes_take_the_fused_path(sgl):
    """SGLang passes req_pool_indices and seq_lens as int64, accept_lens as int32."""
    sgl.install()
    pool = kv_pool(sgl)
    idx, seq, _ = batch()
    acc = torch.tensor(BATCH[2], dtype=torch.int32, device=idx.device)
    check(pool, idx, seq, acc)
    assert sgl.originals[ROLLBACK].calls == 0


@pytest.mark.parametrize("which", ["draft", "target"])
def test_parameter_weights_take_the_fast_path(sgl, measured_table, which):
    sgl.install()
    model, target = hooked_model(sgl, which)
    x, *weights = make_inputs(3, 40, torch.bfloat16)
    params = [torch.nn.Parameter(w, requires_grad=False) for w in weights]
    y = model.hc_head(x, *params)
    assert sgl.originals[target].calls == 0
    assert_matches(y, hc_head_reference(x, *weights, **EPS), "Parameters vs reference")


def deterministic_sglang(monkeypatch, batch_invariant: bool, deterministic: bool):
    invariant = types.ModuleType("sglang.srt.batch_invariant_ops")
    invariant.is_batch_invariant_mode_enabled = lambda: batch_invariant
    context = types.ModuleType("sglang.srt.runtime_context")
    flags = types.SimpleNamespace(
        deterministic=types.SimpleNamespace(enable_deterministic_inference=deterministic))
    context.get_exec = lambda: flags
    standins.serve_model(context)  # DeepSeek-V4: only the mode makes the hooks step aside
    monkeypatch.setitem(sys.modules, invariant.__name__, invariant)
    monkeypatch.setitem(sys.modules, context.__name__, context)
    monkeypatch.setattr(hooks, "_deterministic", None)


STEP_ASIDE_CASES = [
    pytest.param(lambda mp: mp.setattr(hooks, "on_rocm", lambda: True), id="ROCm"),
    pytest.param(lambda mp: mp.setattr(hooks, "_architecture", lambda x: (10, 0)),
                 id="unmeasured architecture"),
    pytest.param(lambda mp: deterministic_sglang(mp, True, False), id="batch-invariant mode"),
    pytest.param(lambda mp: deterministic_sglang(mp, False, True), id="deterministic inference"),
]


@pytest.mark.parametrize("setup", STEP_ASIDE_CASES)
@pytest.mark.parametrize("which", ["draft", "target"])
def test_hc_head_hooks_step_aside(sgl, monkeypatch, measured_table, setup, which):
    setup(monkeypatch)
    sgl.install()
    model, target = hooked_model(sgl, which)
    inputs = make_inputs(3, 40, torch.bfloat16)
    y = model.hc_head(*inputs)
    assert sgl.originals[target].calls == 1
    assert torch.equal(y, sgl.originals[target].__wrapped__(model, *inputs))
    assert installed_hook(sgl, target).enabled  # stepping aside is not a failure


def test_deterministic_verdict_waits_for_sglang_to_publish_it(monkeypatch):
    context = types.ModuleType("sglang.srt.runtime_context")

    def unpublished():
        raise ValueError("exec not published")

    context.get_exec = unpublished
    monkeypatch.setitem(sys.modules, context.__name__, context)
    monkeypatch.delitem(sys.modules, "sglang.srt.batch_invariant_ops", raising=False)
    monkeypatch.setattr(hooks, "_deterministic", None)
    assert hooks.sglang_deterministic() is False and hooks._deterministic is None
    deterministic_sglang(monkeypatch, False, True)
    assert hooks.sglang_deterministic() is True and hooks._deterministic is True


def test_deterministic_verdict_follows_each_published_engine(monkeypatch):
    """An engine rebuilt in the same process publishes new server arguments: the deterministic
    verdict is read again for them (a deterministic engine after a plain one steps aside)."""
    deterministic_sglang(monkeypatch, False, False)
    context = sys.modules["sglang.srt.runtime_context"]
    flags = types.SimpleNamespace(
        deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    context.get_exec = lambda: flags
    context._CONTEXT = types.SimpleNamespace(_server_args=object())
    assert hooks.sglang_deterministic() is False
    flags.deterministic.enable_deterministic_inference = True  # read once per publish
    assert hooks.sglang_deterministic() is False
    context._CONTEXT._server_args = object()  # a new engine published its arguments
    assert hooks.sglang_deterministic() is True
    assert hooks.sglang_deterministic() is True


def test_rollback_steps_aside_on_rocm(sgl, monkeypatch):
    monkeypatch.setattr(rollback, "on_rocm", lambda: True)
    sgl.install()
    pool = kv_pool(sgl)
    check(pool, *batch())
    assert sgl.originals[ROLLBACK].calls == 1


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "graph breaks allowed"])
def test_target_hook_under_torch_compile_matches_eager(measured_table, dsv4_served, fullgraph):
    """SGLang's --enable-torch-compile traces the target's forward, hook included: it traces
    (fullgraph too) and gives the eager result (SGLang's path, which it steps aside to)."""
    torch._dynamo.reset()
    hook = hooks.make_target_hook()
    model = types.SimpleNamespace(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    x, hc_fn, hc_scale, hc_base = make_inputs(3, 40, torch.float32)

    def sglang_hc_head(self, x, hc_fn, hc_scale, hc_base):  # SGLang's torch path, as a stand-in
        return hc_head_reference(x, hc_fn, hc_scale, hc_base, norm_eps=self.norm_eps,
                                 hc_eps=self.hc_eps)

    def forward(x):
        return hook(sglang_hc_head, model, x * 1.5, hc_fn, hc_scale, hc_base).sum(-1)

    compiled = torch.compile(forward, backend="aot_eager", fullgraph=fullgraph)
    eager = forward(x)
    assert_matches(compiled(x), eager, "compiled vs eager")
    assert hook.enabled
    torch._dynamo.reset()
