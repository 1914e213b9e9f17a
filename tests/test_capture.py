import threading

import pytest
import torch

import dsv4spec.capture as capture
from dsv4spec.capture import (
    CaptureCompiled,
    capture_mode,
    compile_in_capture_mode,
    is_capture_mode,
    stream_capturing,
)
from dsv4spec.ops.hc_head import (
    _hc_head_compiled,
    _hc_head_rmsnorm_compiled,
    hc_head,
    hc_head_reference,
    hc_head_rmsnorm,
    hc_head_rmsnorm_reference,
)

EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}


# One module-level function per test: Dynamo caches compiled code per code object, so functions
# shared between tests would hide compilations from each other's counters.
@compile_in_capture_mode
def _eager_only(x):
    return x * 2


@compile_in_capture_mode(dynamic=False)
def _per_size(x, scale: float):
    return torch.sigmoid(x * scale + 1.0).sum(-1)


@compile_in_capture_mode(dynamic=False)
def _guarded(x):
    return x + 1


def test_capture_mode_nests_and_restores():
    assert not is_capture_mode()
    with capture_mode():
        assert is_capture_mode()
        with capture_mode(allow_cpu=True):
            assert capture._STATE.get().allow_cpu
        assert is_capture_mode() and not capture._STATE.get().allow_cpu
    assert not is_capture_mode()
    with pytest.raises(KeyError), capture_mode():
        raise KeyError
    assert not is_capture_mode()


def test_capture_mode_is_per_thread():
    seen = []
    with capture_mode():
        t = threading.Thread(target=lambda: seen.append(is_capture_mode()))
        t.start()
        t.join()
    assert seen == [False]


def test_stream_capturing_is_safe_without_cuda():
    if not torch.cuda.is_available():
        assert stream_capturing() is False
    else:
        assert stream_capturing() is torch.cuda.is_current_stream_capturing()


def test_decorator_forms():
    assert isinstance(_eager_only, CaptureCompiled) and isinstance(_per_size, CaptureCompiled)
    assert _per_size.compile_kwargs == {"fullgraph": True, "dynamic": False}
    assert _eager_only.__name__ == "_eager_only"


def test_eager_outside_capture_mode_and_for_cpu_empty_or_tensorless_inputs():
    _eager_only.reset_counters()
    x = torch.randn(4)
    assert torch.equal(_eager_only(x), x * 2)  # outside capture mode
    with capture_mode():  # CPU tensor without the opt-in
        _eager_only(x)
    with capture_mode(allow_cpu=True):
        _eager_only(torch.empty(0))  # empty
        _eager_only(x=torch.empty(0, 3))  # empty, passed by keyword
    assert (_eager_only.eager_calls, _eager_only.compiled_calls) == (4, 0)
    assert _eager_only.compilations == 0 and _eager_only._compiled is None  # nothing compiled


def test_thirteen_sizes_all_run_compiled_code():
    # dynamic=False compiles one graph per size; past Dynamo's default recompile limit (8) the
    # 9th size would silently run eagerly. Each size must bring its own new graph, and a second
    # pass over the sizes must compile nothing more.
    _per_size.reset_counters()
    sizes = range(1, 14)
    with capture_mode(allow_cpu=True):
        for n in sizes:
            x = torch.randn(n, 8)
            torch.testing.assert_close(_per_size(x, 0.5), torch.sigmoid(x * 0.5 + 1.0).sum(-1))
        assert _per_size.compilations == len(sizes)
        for n in sizes:
            _per_size(torch.randn(n, 8), 0.5)
    assert _per_size.compilations == len(sizes)
    assert (_per_size.compiled_calls, _per_size.eager_calls) == (2 * len(sizes), 0)


def test_new_signature_during_stream_capture_raises(monkeypatch):
    _guarded.reset_counters()
    x = torch.randn(3, 5)
    with capture_mode(allow_cpu=True):
        _guarded(x)  # the warm-up compiles
        monkeypatch.setattr(capture, "stream_capturing", lambda: True)
        y = torch.randn(3, 5)
        torch.testing.assert_close(_guarded(y), y + 1)  # seen signature: no error
        for unseen in (torch.randn(4, 5), torch.randn(3, 5, dtype=torch.float64),
                       torch.randn(5, 3).T):
            with pytest.raises(RuntimeError, match="warm-up"):
                _guarded(unseen)
    assert _guarded.compilations == 1 and _guarded.compiled_calls == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_hc_head_on_cpu_matches_reference(dtype):
    g = torch.Generator().manual_seed(0)
    H = 40
    x = torch.randn(3, 4, H, generator=g).to(dtype)
    fn = torch.randn(4, 4 * H, generator=g) * 0.2
    sc, base, nw = torch.rand(1, generator=g) + 0.5, torch.randn(4, generator=g), torch.rand(H)
    _hc_head_compiled.reset_counters()
    _hc_head_rmsnorm_compiled.reset_counters()
    assert torch.equal(hc_head(x, fn, sc, base, **EPS, impl="compiled"),
                       hc_head_reference(x, fn, sc, base, **EPS))  # outside: eager
    with capture_mode(allow_cpu=True):
        y = hc_head(x, fn, sc, base, **EPS, impl="compiled")
        out = hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="compiled")
    assert _hc_head_compiled.compiled_calls == 1 and _hc_head_compiled.eager_calls == 1
    assert _hc_head_rmsnorm_compiled.compiled_calls == 1
    # Inductor may reorder the fp32 reductions: fp32 to 1e-5, half types within one ulp.
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-5}
    torch.testing.assert_close(y, hc_head_reference(x, fn, sc, base, **EPS), **tol)
    torch.testing.assert_close(out, hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS), **tol)
