"""mHC against its formulas (docs/design.md), written independently in float64 (per-stream sums
and explicit loops)."""

import pytest
import torch

from dsv4spec.capture import capture_mode
from dsv4spec.model.mhc import hc_post, hc_post_captured, hc_pre, hc_pre_captured

HC = 4


def params(H, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    n = (2 + HC) * HC
    fn = (torch.randn(n, HC * H, generator=g) * (HC * H) ** -0.5).to(dtype)
    scale = (torch.rand(3, generator=g) + 0.5).to(dtype)
    base = torch.randn(n, generator=g).to(dtype)
    return fn, scale, base


def hc_pre_float64(x, fn, scale, base, norm_eps, hc_eps, iters):
    T, hc, H = x.shape
    xd = x.double()
    r = 1 / torch.sqrt((xd**2).sum((1, 2)) / (hc * H) + norm_eps)
    m = torch.einsum("tih,nih->tn", xd, fn.double().view(-1, hc, H)) * r[:, None]
    sig = lambda v: 1 / (1 + torch.exp(-v))  # noqa: E731
    pre = sig(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * sig(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    logits = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(T, hc, hc)
    comb = torch.empty_like(logits)
    for t in range(T):
        c = torch.exp(logits[t] - logits[t].max(1, keepdim=True).values)
        c = c / c.sum(1, keepdim=True) + hc_eps
        c = c / (c.sum(0, keepdim=True) + hc_eps)
        for _ in range(iters - 1):
            c = c / (c.sum(1, keepdim=True) + hc_eps)
            c = c / (c.sum(0, keepdim=True) + hc_eps)
        comb[t] = c
    y = sum(pre[:, i, None] * xd[:, i] for i in range(hc))
    return y, post, comb


@pytest.mark.parametrize("eps", [(1e-6, 1e-6), (0.25, 0.1)], ids=["DSV4 eps", "large eps"])
@pytest.mark.parametrize("T,H", [(1, 8), (5, 24)])
def test_hc_pre_matches_float64(T, H, eps):
    x = torch.randn(T, HC, H, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
    fn, scale, base = params(H)
    y, post, comb = hc_pre(x, fn, scale, base, norm_eps=eps[0], hc_eps=eps[1], sinkhorn_iters=20)
    y64, post64, comb64 = hc_pre_float64(x, fn, scale, base, *eps, 20)
    # float64 parameters: hc_pre computes in float64, so only summation order differs
    torch.testing.assert_close(y, y64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(post, post64, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(comb, comb64, rtol=1e-12, atol=1e-12)
    # float32 parameters (DSV4): within float32 rounding
    y32, post32, comb32 = hc_pre(x.float(), *(p.float() for p in (fn, scale, base)),
                                 norm_eps=eps[0], hc_eps=eps[1], sinkhorn_iters=20)
    torch.testing.assert_close(y32.double(), y64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comb32.double(), comb64, rtol=1e-5, atol=1e-6)


def test_sinkhorn_gives_a_doubly_stochastic_comb():
    # DSV4's scales (logits ~ N(0, 1) times scale <= 1.5): 20 iterations reach 1e-5. Fixed data:
    # for rare steep logits 20 iterations leave the rows ~3e-5 off (the columns stay exact).
    x = torch.randn(6, HC, 32, generator=torch.Generator().manual_seed(5))
    fn, scale, base = params(32, seed=1, dtype=torch.float32)
    _, post, comb = hc_pre(x, fn, scale, base, norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20)
    ones = torch.ones(6, HC)
    torch.testing.assert_close(comb.sum(-1), ones, rtol=0, atol=1e-5)
    torch.testing.assert_close(comb.sum(-2), ones, rtol=0, atol=1e-5)
    assert (comb > 0).all() and ((post > 0) & (post < 2)).all()


def test_hc_post_applies_comb_transposed():
    T, H = 3, 5
    x = torch.randn(T, HC, H, dtype=torch.float64)
    f = torch.randn(T, H, dtype=torch.float64)
    post = torch.rand(T, HC, dtype=torch.float64) * 2
    comb = torch.rand(T, HC, HC, dtype=torch.float64)
    out = hc_post(f, x, post, comb)
    for t in range(T):
        for j in range(HC):
            expected = post[t, j] * f[t] + sum(comb[t, i, j] * x[t, i] for i in range(HC))
            torch.testing.assert_close(out[t, j], expected)


def test_bf16_streams_stay_bf16():
    x = torch.randn(2, HC, 16).bfloat16()
    fn, scale, base = params(16, dtype=torch.float32)
    y, post, comb = hc_pre(x, fn, scale, base, norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20)
    assert y.dtype == torch.bfloat16 and post.dtype == comb.dtype == torch.float32
    assert hc_post(y, x, post, comb).dtype == torch.bfloat16


def test_captured_versions_share_one_graph_across_layers():
    """Two layers' parameters (different tensors, same shapes) compile once and match eager."""
    x = torch.randn(3, HC, 16)
    layers = [params(16, seed=s, dtype=torch.float32) for s in (1, 2)]
    kw = dict(norm_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20)
    before = hc_pre_captured.compilations
    with capture_mode(allow_cpu=True):
        outs = [hc_pre_captured(x, *p, **kw) for p in layers]
        mixed = hc_post_captured(outs[0][0], x, outs[0][1], outs[0][2])
    assert hc_pre_captured.compilations - before == 1
    for p, out in zip(layers, outs):
        for a, b in zip(out, hc_pre(x, *p, **kw)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mixed, hc_post(outs[0][0], x, outs[0][1], outs[0][2]))
