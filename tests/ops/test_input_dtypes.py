"""Each op's accepted input dtypes, both sides of each: the streams in bfloat16, float16 or
float32 (float64 refused) and each op's outputs off float64 there, ``f`` in the streams' dtype,
the mixes and the learned mixing parameters in float32 only, and a norm weight in float32 or the
streams' dtype."""

import importlib

import pytest
import torch

from dsv4spec.ops import (
    hc_head,
    hc_head_rmsnorm,
    mhc_post,
    mhc_post_head,
    mhc_post_pre,
    mhc_post_reference,
    mhc_pre,
)
from dsv4spec.ops.checked_params import CheckedParams

from .test_hc_head import hc_head_float64
from .test_mhc import EPS, FP32_RTOL, ITERS, make_inputs, pre_float64
from .test_mhc_post_head import float64_head, tail_inputs

STREAMS = [torch.bfloat16, torch.float16, torch.float32]
KW = {**EPS, "sinkhorn_iters": ITERS, "impl": "reference"}
# Relative error ||out - ref|| / ||ref|| off float64, by the output's dtype: float32 as the ops'
# other tests allow; a half type's output is one rounding of an fp32 value (at most half an ulp,
# 2^-8 relative in bfloat16, 2^-11 in float16; 1.9e-3 and 2.4e-4 at most on these inputs).
RTOL = {torch.float32: FP32_RTOL, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.fixture(autouse=True)
def _own_checked_params(monkeypatch):
    for name in ("dsv4spec.ops.mhc", "dsv4spec.ops.hc_head"):
        ops = importlib.import_module(name)
        monkeypatch.setattr(ops, "_CHECKED_PARAMS", CheckedParams(ops.CHECKED_PARAMS_LIMIT))


def assert_near_float64(out, ref, dtype, what):
    assert out.dtype == dtype, (what, out.dtype)
    ref = ref.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= RTOL[dtype], f"{what}: {err:.3g} off float64 (tolerance {RTOL[dtype]:g})"


@pytest.mark.parametrize("impl", ["reference", "triton"], ids=["torch path", "kernels"])
@pytest.mark.parametrize("dtype", STREAMS)
def test_every_op_takes_streams_of_each_half_and_float32_and_matches_float64(dtype, impl):
    """A dtype accepted is a dtype computed right: each output against the float64 references of
    the ops' own tests, on both paths; the boundary's given output starts poisoned (NaN), so a
    value it leaves unwritten fails too."""
    f32 = torch.float32
    x, fn, sc, base, _, f = make_inputs(2, 8, dtype)
    kw = {**KW, "impl": impl}
    post, comb, y = mhc_pre(x, fn, sc, base, **kw)
    for out, ref, out_dtype, what in zip(
            (post, comb, y), pre_float64(x, fn, sc, base, EPS["rms_eps"], EPS["hc_eps"], ITERS),
            (f32, f32, dtype), ("mhc_pre post", "mhc_pre comb", "mhc_pre layer_input")):
        assert_near_float64(out, ref, out_dtype, what)
    new64 = mhc_post_reference(f.double(), x.double(), post, comb)
    assert_near_float64(mhc_post(f, x, post, comb, impl=impl), new64, dtype, "mhc_post")

    residual_out = torch.full_like(x, float("nan"))
    new, *pre = mhc_post_pre(f, x, post, comb, fn, sc, base, **kw, residual_out=residual_out)
    assert new.data_ptr() == residual_out.data_ptr()
    assert_near_float64(new, new64, dtype, "mhc_post_pre residual'")
    # the next layer's pre reads the new streams as stored, rounded to their dtype
    for out, ref, out_dtype, what in zip(
            pre, pre_float64(new, fn, sc, base, EPS["rms_eps"], EPS["hc_eps"], ITERS),
            (f32, f32, dtype), ("mhc_post_pre post'", "mhc_post_pre comb'",
                                "mhc_post_pre layer_input")):
        assert_near_float64(out, ref, out_dtype, what)

    _, _, _, _, hc_fn, hc_scale, hc_base, _ = tail_inputs(2, 8, dtype)
    head = {"norm_eps": 1e-6, "hc_eps": 1e-6}
    new, hidden = mhc_post_head(f, x, post, comb, hc_fn, hc_scale, hc_base, **head, impl=impl)
    assert_near_float64(new, new64, dtype, "mhc_post_head residual'")
    assert_near_float64(hidden, float64_head(new.double(), hc_fn, hc_scale, hc_base, None,
                                             1e-6, 1e-6, None), dtype, "mhc_post_head hidden")
    y = hc_head(x, hc_fn, hc_scale, hc_base, **head,
                impl="eager" if impl == "reference" else impl)
    assert_near_float64(y, hc_head_float64(x, hc_fn, hc_scale, hc_base, **head), dtype,
                        "hc_head")


def test_float64_streams_are_refused_by_every_op():
    x, fn, sc, base, nw, f = make_inputs(2, 8, torch.float64)
    post, comb = torch.rand(2, 4), torch.rand(2, 4, 4)
    _, _, _, _, hc_fn, hc_scale, hc_base, _ = tail_inputs(2, 8, torch.float32)
    for call in (lambda: mhc_pre(x, fn, sc, base, **KW),
                 lambda: mhc_post(f, x, post, comb),
                 lambda: mhc_post_pre(f, x, post, comb, fn, sc, base, **KW)):
        with pytest.raises(ValueError, match="residual"):
            call()
    with pytest.raises(ValueError, match="x must be"):
        hc_head(x, hc_fn, hc_scale, hc_base, norm_eps=1e-6, hc_eps=1e-6, impl="eager")


@pytest.mark.parametrize("f_dtype", [torch.float32, torch.float16])
def test_f_must_have_the_streams_dtype(f_dtype):
    x, fn, sc, base, _, f = make_inputs(2, 8, torch.bfloat16)
    post, comb = torch.rand(2, 4), torch.rand(2, 4, 4)
    with pytest.raises(ValueError, match="f must be"):
        mhc_post(f.to(f_dtype), x, post, comb)
    with pytest.raises(ValueError, match="f must be"):
        mhc_post_pre(f.to(f_dtype), x, post, comb, fn, sc, base, **KW)


@pytest.mark.parametrize("name", ["fn", "hc_scale", "hc_base"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_mhcs_learned_parameters_are_float32_only(name, dtype):
    x, fn, sc, base, _, _ = make_inputs(2, 8, torch.bfloat16)
    params = {"fn": fn, "hc_scale": sc, "hc_base": base}
    params[name] = params[name].to(dtype)
    with pytest.raises(ValueError, match=name):
        mhc_pre(x, params["fn"], params["hc_scale"], params["hc_base"], **KW)


@pytest.mark.parametrize("name", ["hc_fn", "hc_scale", "hc_base", "norm_weight"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_hc_heads_parameters_are_float32_only(name, dtype):
    _, x, _, _, hc_fn, hc_scale, hc_base, nw = tail_inputs(2, 8, torch.bfloat16)
    params = {"hc_fn": hc_fn, "hc_scale": hc_scale, "hc_base": hc_base, "norm_weight": nw}
    hc_head_rmsnorm(x, *params.values(), norm_eps=1e-6, hc_eps=1e-6, impl="eager")
    params[name] = params[name].to(dtype)
    with pytest.raises(ValueError, match=name):
        hc_head_rmsnorm(x, *params.values(), norm_eps=1e-6, hc_eps=1e-6, impl="eager")


@pytest.mark.parametrize("dtype", STREAMS)
def test_a_norm_weight_in_the_streams_dtype_or_float32_is_taken(dtype):
    x, fn, sc, base, nw, f = make_inputs(2, 8, dtype)
    _, _, post, comb, hc_fn, hc_scale, hc_base, _ = tail_inputs(2, 8, dtype)
    for weight in {nw.float(), nw.to(dtype)}:
        mhc_pre(x, fn, sc, base, **KW, norm_weight=weight, norm_eps=1e-6)
        mhc_post_head(f, x, post, comb, hc_fn, hc_scale, hc_base, norm_eps=1e-6, hc_eps=1e-6,
                      norm_weight=weight, final_norm_eps=1e-6)
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(ValueError, match="norm_weight"):
        mhc_post_head(f, x, post, comb, hc_fn, hc_scale, hc_base, norm_eps=1e-6, hc_eps=1e-6,
                      norm_weight=nw.to(other), final_norm_eps=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_the_mixes_are_float32_only(dtype):
    x, fn, sc, base, _, f = make_inputs(2, 8, dtype if dtype != torch.float64 else torch.float32)
    post, comb = torch.rand(2, 4), torch.rand(2, 4, 4)
    with pytest.raises(ValueError, match="post"):
        mhc_post(f, x, post.to(dtype), comb)
    with pytest.raises(ValueError, match="comb"):
        mhc_post(f, x, post, comb.to(dtype))
