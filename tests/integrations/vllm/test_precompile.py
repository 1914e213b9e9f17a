"""What the hooks compile ahead, and where: every variant the mHC hooks may launch at the first
eager call of a (device, width, signature), hc_head's only where its table serves; and on a GPU
no table serves, vLLM's own function back in place after the first call."""

import pytest
import torch

from dsv4spec.integrations.hooks import INTERPRETER_ARCHITECTURE, STEP_ASIDE
from dsv4spec.integrations.mhc_precompile import Signature
from dsv4spec.integrations.vllm import hc_head as hc_head_hooks
from dsv4spec.integrations.vllm import mhc as mhc_hooks
from dsv4spec.integrations.vllm import plugin, register

from .conftest import NAMES
from .test_hooks import (
    CALLERS,
    REUSE,
    TABLE,
    _op_in_this_version,  # noqa: F401 - autouse: REUSE on 0.34.0 only
    assert_like,
    call_args,
    hooked,
    launches,
    make_inputs,
    measure,
    original,
)

MHC_OPS = ("mhc_pre", "mhc_post", "mhc_fused_post_pre", REUSE)
H = 128


@pytest.fixture
def compiles(monkeypatch):
    """The mHC precompiles asked for, recorded (the interpreter compiles nothing)."""
    calls = []
    monkeypatch.setattr(mhc_hooks, "precompile_mhc",
                        lambda op, tokens, H, index, sig, logger: calls.append(
                            (op, tuple(tokens), H, index, sig)))
    return calls


def _signature(op):
    if op == "mhc_post":
        return Signature(torch.bfloat16, fast_math=False)
    return Signature(torch.bfloat16, torch.float32, torch.float32, torch.float32, torch.bfloat16,
                     20, False)


@pytest.mark.parametrize("op", MHC_OPS)
def test_first_eager_call_compiles_every_served_count_once(vllm, monkeypatch, compiles, op):
    """The first eager call compiles what the table serves at this width (1-64 here) whatever
    its own count; later calls, other counts included, compile nothing more."""
    measure(monkeypatch, op, spans=((1, 64),))
    register()
    for T in (3, 5, 3):
        args, kwargs = call_args(op, make_inputs(T))
        hooked(vllm, op)(*args, **kwargs)
    assert compiles == [(TABLE[op], tuple(range(1, 65)), H, -1, _signature(op))]


@pytest.mark.parametrize("op", ["mhc_post", "mhc_fused_post_pre"])
def test_nothing_is_compiled_inside_a_capture(vllm, monkeypatch, compiles, op):
    measure(monkeypatch, op)
    capturing = [True]
    monkeypatch.setattr(mhc_hooks, "_capturing", lambda index: capturing[0])
    register()
    args, kwargs = call_args(op, make_inputs(2))
    hooked(vllm, op)(*args, **kwargs)
    assert compiles == []
    capturing[0] = False
    hooked(vllm, op)(*args, **kwargs)
    assert len(compiles) == 1


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_fused_post_pre"])
def test_an_unmeasured_width_compiles_nothing(vllm, compiles, op):
    register()
    args, kwargs = call_args(op, make_inputs(2))
    hooked(vllm, op)(*args, **kwargs)
    assert compiles == []


def test_deep_gemm_limits_what_is_compiled(vllm, monkeypatch, compiles):
    """Where vLLM runs DeepGEMM, mhc_pre is never ours (nothing compiled) and the boundary only
    up to 32 tokens."""
    for op in ("mhc_pre", "mhc_fused_post_pre"):
        measure(monkeypatch, op, spans=((1, 64),))
    monkeypatch.setattr(mhc_hooks, "_deep_gemm", True)
    register()
    for op in ("mhc_pre", "mhc_fused_post_pre"):
        args, kwargs = call_args(op, make_inputs(2))
        hooked(vllm, op)(*args, **kwargs)
    assert [(op, tokens) for op, tokens, *_ in compiles] == [
        ("mhc_fused_post_pre", tuple(range(1, 33)))]


@pytest.fixture
def hc_head_on_gpu(monkeypatch):
    """hc_head's preparation as on CUDA device 0 of the given architecture (nothing launched:
    the precompiles are recorded)."""
    calls = []
    monkeypatch.setattr(hc_head_hooks, "precompile_hc_head",
                        lambda H, dtype, index, logger: calls.append((H, dtype, index)))
    monkeypatch.setattr(hc_head_hooks, "stream_capturing", lambda index: False)
    monkeypatch.setattr(hc_head_hooks.torch.Tensor, "get_device", lambda self: 0)

    def on(architecture):
        monkeypatch.setattr(hc_head_hooks, "gpu_architecture", lambda index: architecture)
        return calls

    return on


@pytest.mark.parametrize("architecture,measured", [
    ((10, 0), True), ((9, 0), False)], ids=["sm_100: no table", "sm_90: width not measured"])
def test_hc_head_compiles_nothing_where_no_table_serves(vllm, monkeypatch, hc_head_on_gpu,
                                                        architecture, measured):
    if measured:
        measure(monkeypatch, "hc_head")
    calls = hc_head_on_gpu(architecture)
    args, _ = call_args("hc_head", make_inputs(2))
    assert hc_head_hooks.fast_hc_head(*args) is STEP_ASIDE
    assert calls == []


def test_hc_head_compiles_nothing_in_batch_invariant_mode(vllm, monkeypatch, hc_head_on_gpu):
    measure(monkeypatch, "hc_head")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    calls = hc_head_on_gpu(INTERPRETER_ARCHITECTURE)
    args, _ = call_args("hc_head", make_inputs(2))
    assert hc_head_hooks.fast_hc_head(*args) is STEP_ASIDE
    assert calls == []


def test_hc_head_compiles_where_its_table_serves(vllm, monkeypatch, hc_head_on_gpu):
    measure(monkeypatch, "hc_head")
    calls = hc_head_on_gpu(INTERPRETER_ARCHITECTURE)
    x = make_inputs(2)["residual"]
    assert hc_head_hooks._prepared(x) == INTERPRETER_ARCHITECTURE
    assert hc_head_hooks._prepared(x) == INTERPRETER_ARCHITECTURE
    assert calls == [(H, torch.bfloat16, 0)]


OPS = ("hc_head", *MHC_OPS)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("gpus", [[(10, 0)], [None], [(10, 0), (10, 0)]],
                         ids=["B200", "ROCm", "two B200"])
def test_no_table_for_any_gpu_puts_vllms_function_back(vllm, monkeypatch, op, gpus):
    """After a hook's first call in a process whose GPUs no table serves, the modules call
    vLLM's function again (no per-call decision left), with vLLM's result; modules imported
    later are not patched for it."""
    measure(monkeypatch, op)  # the interpreter's sm_90 is served, but this process has no sm_90
    monkeypatch.setattr(mhc_hooks, "visible_architectures", lambda: list(gpus))
    register()
    guard = plugin.installed()[op]
    fast = []
    monkeypatch.setattr(guard, "fast", lambda *a, **k: fast.append(1) or STEP_ASIDE)
    args, kwargs = call_args(op, make_inputs(2))
    want = original(vllm, op)(*args, **kwargs)
    got = hooked(vllm, op)(*args, **kwargs)
    assert_like(got, want)
    assert fast == [], "not even a decision per call"
    for where in CALLERS[op]:
        assert hooked(vllm, op, where) is original(vllm, op), where
    assert not any(target.endswith(NAMES[op]) for target in plugin._patch(vllm.model))


@pytest.mark.parametrize("gpus", [[(9, 0), (10, 0)], None], ids=["H200 + B200", "no CUDA"])
def test_a_served_gpu_keeps_the_hooks(vllm, monkeypatch, gpus):
    """One GPU of the process that a table serves keeps every hook (the other GPUs' calls step
    aside per call, as before); so does a process without CUDA (the interpreter)."""
    monkeypatch.setattr(mhc_hooks, "visible_architectures", lambda: gpus)
    register()
    for op in OPS:
        if not hasattr(vllm.model, NAMES[op]):
            continue
        measure(monkeypatch, op)
        args, kwargs = call_args(op, make_inputs(2))
        hooked(vllm, op)(*args, **kwargs)
        assert not launches(vllm), f"dsv4spec's op served {op}"
        for where in CALLERS[op]:
            assert plugin.is_hooked(hooked(vllm, op, where)), (op, where)
        assert plugin._settled[op] is True


def test_process_served_reads_the_tables():
    assert mhc_hooks.process_served("mhc_pre")[0] is True  # no CUDA here: undecided, served
    for op in ("hc_head", "mhc_pre", "mhc_post", "mhc_fused_post_pre"):
        assert mhc_hooks.table_spans(op, INTERPRETER_ARCHITECTURE)  # sm_90.json
        assert mhc_hooks.table_spans(op, (10, 0)) == []
        assert mhc_hooks.table_spans(op, None) == []
