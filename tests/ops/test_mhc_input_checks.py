"""The mHC ops' input checks where the first checks leave gaps: epsilons of 0, a norm weight of
the other half type, comb's dtype, per-call arguments beside parameters already checked (and the
bound on how many are remembered), and calls that need gradients."""

import importlib

import pytest
import torch

from dsv4spec.ops import mhc_post, mhc_post_head, mhc_post_pre, mhc_pre
from dsv4spec.ops.checked_params import CheckedParams

from .test_mhc import EPS, ITERS, make_inputs
from .test_mhc_post_head import tail_inputs

MHC_OPS = importlib.import_module("dsv4spec.ops.mhc")


@pytest.fixture(autouse=True)
def _own_checked_params(monkeypatch):
    monkeypatch.setattr(MHC_OPS, "_CHECKED_PARAMS", CheckedParams(MHC_OPS.CHECKED_PARAMS_LIMIT))


def test_epsilons_of_zero_are_accepted():
    x, fn, sc, base, nw, f = make_inputs(2, 8, torch.float32)
    kw = {"rms_eps": 0.0, "hc_eps": 0.0, "sinkhorn_iters": ITERS, "norm_weight": nw,
          "norm_eps": 0.0, "impl": "reference"}
    post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
    mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)
    _, x2, post2, comb2, hc_fn, hc_scale, hc_base, _ = tail_inputs(2, 8, torch.float32)
    mhc_post_head(f, x2, post2, comb2, hc_fn, hc_scale, hc_base, norm_eps=1e-6, hc_eps=1e-6,
                  norm_weight=nw, final_norm_eps=0.0, impl="reference")


def test_a_norm_weight_of_the_other_half_type_is_refused():
    x, fn, sc, base, nw, _ = make_inputs(2, 8, torch.float16)
    for weight in (nw.to(torch.bfloat16), nw.double()):
        with pytest.raises(ValueError, match="norm_weight"):
            mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS, norm_weight=weight,
                    norm_eps=1e-6, impl="reference")
    for weight in (nw.half(), nw.float()):
        mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS, norm_weight=weight, norm_eps=1e-6,
                impl="reference")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_comb_must_be_float32(dtype):
    x, fn, sc, base, _, f = make_inputs(2, 8, torch.bfloat16)
    post, comb = torch.rand(2, 4), torch.rand(2, 4, 4, dtype=dtype)
    with pytest.raises(ValueError, match="comb"):
        mhc_post(f, x, post, comb)
    with pytest.raises(ValueError, match="comb"):
        mhc_post_pre(f, x, post, comb, fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    _, _, _, _, hc_fn, hc_scale, hc_base, _ = tail_inputs(2, 8, torch.bfloat16)
    with pytest.raises(ValueError, match="comb"):
        mhc_post_head(f, x, post, comb, hc_fn, hc_scale, hc_base, norm_eps=1e-6, hc_eps=1e-6)


@pytest.mark.parametrize("change,name", [
    pytest.param({"norm_eps": None}, "norm_eps", id="norm weight without its epsilon"),
    pytest.param({"sinkhorn_iters": 0}, "sinkhorn_iters", id="no Sinkhorn pass"),
])
def test_per_call_arguments_are_checked_beside_remembered_parameters(change, name):
    x, fn, sc, base, nw, _ = make_inputs(2, 8, torch.float32)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6,
          "impl": "reference"}
    mhc_pre(x, fn, sc, base, **kw)
    assert len(MHC_OPS._CHECKED_PARAMS) == 1, "the parameters are remembered"
    with pytest.raises(ValueError, match=name):
        mhc_pre(x, fn, sc, base, **{**kw, **change})


def test_remembered_parameters_are_checked_again_for_streams_of_another_dtype():
    """A bf16 norm weight checked beside bf16 streams is refused beside fp16 streams."""
    x, fn, sc, base, nw, _ = make_inputs(2, 8, torch.bfloat16)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw.to(torch.bfloat16),
          "norm_eps": 1e-6, "impl": "reference"}
    mhc_pre(x, fn, sc, base, **kw)
    with pytest.raises(ValueError, match="norm_weight"):
        mhc_pre(x.half(), fn, sc, base, **kw)


def test_at_most_the_limit_of_parameters_is_remembered():
    x, _, _, _, _, _ = make_inputs(1, 8, torch.float32)
    alive = []  # the models stay alive: their entries are dropped by the limit alone
    for seed in range(MHC_OPS.CHECKED_PARAMS_LIMIT + 3):
        _, fn, sc, base, _, _ = make_inputs(1, 8, torch.float32, seed=seed)
        alive.append((fn, sc, base))
        mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=1, impl="reference")
    assert len(MHC_OPS._CHECKED_PARAMS) == MHC_OPS.CHECKED_PARAMS_LIMIT


def test_a_call_that_needs_gradients_goes_through_the_registered_op():
    """The kernels have no backward: a call needing gradients runs the ``torch.library`` op, so
    autograd names it rather than losing the graph silently."""
    x, fn, sc, base, _, _ = make_inputs(2, 8, torch.float32)
    fn.requires_grad_()
    _, _, y = mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=1, impl="triton")
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="dsv4spec.mhc_pre"):
        y.sum().backward()
    with torch.no_grad():
        assert not mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=1, impl="triton")[2].requires_grad
