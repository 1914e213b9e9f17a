"""The mHC Triton ops with ``post_mult`` other than DSV4's 2: the post weights are
``post_mult * sigmoid(...)``, in the kernel as in the reference (an independent float64 formula
here), and the value passed is the one used, for ``mhc_pre`` and the fused boundary alike."""

import pytest
import torch

from dsv4spec.ops import mhc_post_pre, mhc_post_pre_reference, mhc_pre, mhc_pre_reference

ITERS = 3
EPS = {"rms_eps": 0.25, "hc_eps": 0.5}
# 2.0 (DSV4) is the default; each other value is far enough from it that a kernel using 2 instead
# moves every post weight by at least 0.5 * sigmoid, far beyond the tolerance.
POST_MULTS = [pytest.param(0.5, id="post_mult=0.5"), pytest.param(1.0, id="post_mult=1"),
              pytest.param(3.25, id="post_mult=3.25")]
SHAPES = [pytest.param(1, 8, id="T=1 H=8"), pytest.param(3, 40, id="T=3 H=40 odd width")]
FP32_RTOL = 1e-5
# the Triton kernels on CUDA where present, else in the interpreter on the CPU (tests/conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(T, H, hc=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = (2 + hc) * hc
    t = {
        "x": torch.randn(T, hc, H, generator=g),
        "fn": torch.randn(n, hc * H, generator=g) * (hc * H) ** -0.5,
        "scale": torch.rand(3, generator=g) + 0.5,
        "base": torch.randn(n, generator=g),
        "f": torch.randn(T, H, generator=g),
        "post": torch.rand(T, hc, generator=g) * 2,
        "comb": torch.rand(T, hc, hc, generator=g),
    }
    return {k: v.to(DEVICE) for k, v in t.items()}


def post_float64(x, fn, scale, base, rms_eps, post_mult):
    """post_j = post_mult * sigmoid(m_{4 + j} * scale[1] + base[4 + j]), m = (xf @ fn.T) * r."""
    T, hc, H = x.shape
    xd = x.double().reshape(T, hc * H)
    r = torch.rsqrt((xd**2).mean(-1, keepdim=True) + rms_eps)
    m = (xd @ fn.double().T) * r
    return post_mult * torch.sigmoid(m[:, hc:2 * hc] * scale[1].double()
                                     + base[hc:2 * hc].double())


def assert_close(actual, expected, what):
    bound = FP32_RTOL * expected.abs().max().item() + 1e-7
    worst = (actual.double() - expected.double()).abs().max().item()
    assert worst <= bound, f"{what}: max |diff| {worst} > {bound}"


@pytest.mark.parametrize("post_mult", POST_MULTS)
@pytest.mark.parametrize("T, H", SHAPES)
def test_mhc_pre_triton_uses_post_mult(T, H, post_mult):
    t = make_inputs(T, H)
    weights = (t["fn"], t["scale"], t["base"])
    post, comb, y = mhc_pre(t["x"], *weights, **EPS, sinkhorn_iters=ITERS, post_mult=post_mult,
                            impl="triton")
    want = post_float64(t["x"], *weights, EPS["rms_eps"], post_mult)
    assert_close(post, want, "post vs float64")
    ref = mhc_pre_reference(t["x"].double(), *(w.double() for w in weights), **EPS,
                            sinkhorn_iters=ITERS, post_mult=post_mult)
    for name, a, e in zip(("post", "comb", "layer_input"), (post, comb, y), ref):
        assert_close(a, e, f"{name} vs reference")


@pytest.mark.parametrize("post_mult", POST_MULTS)
@pytest.mark.parametrize("T, H", SHAPES)
def test_mhc_post_pre_triton_uses_post_mult(T, H, post_mult):
    t = make_inputs(T, H)
    weights = (t["fn"], t["scale"], t["base"])
    new, post, comb, y = mhc_post_pre(t["f"], t["x"], t["post"], t["comb"], *weights, **EPS,
                                      sinkhorn_iters=ITERS, post_mult=post_mult, impl="triton")
    ref = mhc_post_pre_reference(t["f"].double(), t["x"].double(), t["post"].double(),
                                 t["comb"].double(), *(w.double() for w in weights), **EPS,
                                 sinkhorn_iters=ITERS, post_mult=post_mult)
    assert_close(post, post_float64(ref[0], *weights, EPS["rms_eps"], post_mult),
                 "post vs float64 of the new streams")
    for name, a, e in zip(("residual", "post", "comb", "layer_input"), (new, post, comb, y), ref):
        assert_close(a, e, f"{name} vs reference")


def test_default_post_mult_is_dsv4s():
    t = make_inputs(2, 8)
    weights = (t["fn"], t["scale"], t["base"])
    post, _, _ = mhc_pre(t["x"], *weights, **EPS, sinkhorn_iters=ITERS, impl="triton")
    assert_close(post, post_float64(t["x"], *weights, EPS["rms_eps"], 2.0), "post, default")
