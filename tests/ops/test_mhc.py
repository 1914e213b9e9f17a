import ast
import importlib.util

import pytest
import torch

from dsv4spec.kernels.mhc import mhc_post_pre_triton, mhc_post_triton, mhc_pre_triton
from dsv4spec.model.mhc import hc_post, hc_pre
from dsv4spec.ops import (
    mhc_post,
    mhc_post_pre,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre,
    mhc_pre_reference,
)
from dsv4spec.ops.checked_params import CheckedParams

MHC_OPS = importlib.import_module("dsv4spec.ops.mhc")


@pytest.fixture(autouse=True)
def _own_checked_params(monkeypatch):
    """Each test starts with an empty remembered-parameter cache: whether a call takes the
    remembered check must not depend on the tests that ran before it."""
    monkeypatch.setattr(MHC_OPS, "_CHECKED_PARAMS", CheckedParams(MHC_OPS.CHECKED_PARAMS_LIMIT))


ITERS = 20
EPS = {"rms_eps": 1e-6, "hc_eps": 1e-6}
# At DSV4's 1e-6 dropping an epsilon stays inside the tolerance; these make each term visible
# (mean(x^2) ~ 1, so rms_eps 0.25 moves r by ~10%; hc_eps 1.0 moves each pre weight by 1 and
# dominates the Sinkhorn's denominators).
EPS_SETS = [
    pytest.param(EPS, id="eps=1e-6 (DSV4)"),
    pytest.param({"rms_eps": 0.25, "hc_eps": 1.0}, id="rms_eps=0.25 hc_eps=1"),
    pytest.param({"rms_eps": 1.0, "hc_eps": 0.25}, id="rms_eps=1 hc_eps=0.25"),
]
# Interpreter-sized; every H leaves masked tails of the 16..64-wide chunks and the H-blocks.
SHAPES = [
    pytest.param(1, 8, id="T=1 H=8 one token"),
    pytest.param(3, 40, id="T=3 H=40 not a power of two"),
    pytest.param(9, 100, id="T=9 H=100 odd width, two token blocks"),
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# fp32 outputs (post, comb, fp32 streams): max|diff| / max|ref| < 1e-5 against float64. Half
# types are rounded from an fp32 value ~1e-7 off the float64 truth: 1 ulp (2 after the RMSNorm,
# which carries a rounding of y into its own).
FP32_RTOL = 1e-5


def make_inputs(T, H, dtype, device="cpu", hc=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = (2 + hc) * hc
    x = torch.randn(T, hc, H, generator=g).to(device=device, dtype=dtype)
    # std 1/sqrt(hc*H): the 24 logits are ~N(0, 1) at every width, no sigmoid saturates
    fn = (torch.randn(n, hc * H, generator=g) * (hc * H) ** -0.5).to(device)
    scale = (torch.rand(3, generator=g) + 0.5).to(device)
    base = torch.randn(n, generator=g).to(device)
    norm_weight = (torch.rand(H, generator=g) + 0.5).to(device)
    f = torch.randn(T, H, generator=g).to(device=device, dtype=dtype)
    return x, fn, scale, base, norm_weight, f


def pre_float64(x, fn, scale, base, rms_eps, hc_eps, iters, post_mult=2.0):
    # An independent float64 formulation: per-stream einsum, element loops for the Sinkhorn.
    T, hc, H = x.shape
    xd = x.double()
    r = 1.0 / torch.sqrt((xd**2).sum((1, 2)) / (hc * H) + rms_eps)
    m = torch.einsum("tih,kih->tk", xd, fn.double().view(-1, hc, H)) * r[:, None]
    s, b = scale.double(), base.double()
    pre = 1.0 / (1.0 + torch.exp(-(m[:, :hc] * s[0] + b[:hc]))) + hc_eps
    post = post_mult / (1.0 + torch.exp(-(m[:, hc:2 * hc] * s[1] + b[hc:2 * hc])))
    c = (m[:, 2 * hc:] * s[2] + b[2 * hc:]).view(T, hc, hc)
    c = torch.exp(c - c.amax(-1, keepdim=True))
    c = c / c.sum(-1, keepdim=True) + hc_eps
    c = c / (c.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + hc_eps)
        c = c / (c.sum(-2, keepdim=True) + hc_eps)
    y = torch.einsum("ti,tih->th", pre, xd)
    return post, c, y


def ulp(v, dtype):
    exp = torch.floor(torch.log2(v.abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.finfo(dtype).eps * torch.exp2(exp)


def assert_close(actual, expected, dtype=None, ulps=1, what=""):
    """fp32: max|diff| / max|expected| < 1e-5; half types: |diff| <= ulps of the output dtype."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    dtype = dtype or actual.dtype
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    scale = e.abs().max().clamp_min(1e-30)
    if dtype in (torch.float32, torch.float64):
        bad = diff > FP32_RTOL * scale
    else:
        bad = diff > ulps * ulp(torch.maximum(a.abs(), e.abs()), dtype) + 1e-6 * scale
    bad |= a.isnan() != e.isnan()
    if bad.any():
        worst = diff.nan_to_num(float("inf")).flatten().argsort(descending=True)[:5]
        pairs = [(a.flatten()[i].item(), e.flatten()[i].item()) for i in worst]
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements out of tolerance; rel error "
            f"{(diff.max() / scale).item():.3g}; worst (actual, expected): {pairs}")


def assert_pre_close(got, ref, dtype, ulps=1):
    post, comb, y = got
    assert post.dtype == comb.dtype == torch.float32 and y.dtype == dtype
    assert_close(post, ref[0], what="post")
    assert_close(comb, ref[1], what="comb")
    assert_close(y, ref[2], dtype, ulps, what="layer_input")


# ---------------------------------------------------------------------------------------------
# References


@pytest.mark.parametrize("eps", EPS_SETS)
@pytest.mark.parametrize("T,H", SHAPES)
def test_reference_matches_float64(T, H, eps):
    x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16)
    post64, comb64, y64 = pre_float64(x, fn, sc, base, eps["rms_eps"], eps["hc_eps"], ITERS)
    post, comb, y = mhc_pre_reference(x, fn, sc, base, **eps, sinkhorn_iters=ITERS)
    assert_close(post, post64, what="post")
    assert_close(comb, comb64, what="comb")
    assert_close(y, y64, torch.bfloat16, what="layer_input")
    # the sublayer RMSNorm of the rounded y, in float64
    yd = y.double()
    normed = yd / torch.sqrt(yd.square().mean(-1, keepdim=True) + 0.5) * nw.double()
    got = mhc_pre_reference(x, fn, sc, base, **eps, sinkhorn_iters=ITERS, norm_weight=nw,
                            norm_eps=0.5)[2]
    assert_close(got, normed, torch.bfloat16, what="normed")
    # post_mult scales post only
    post3 = mhc_pre_reference(x, fn, sc, base, **eps, sinkhorn_iters=ITERS, post_mult=3.0)[0]
    assert_close(post3, post64 * 1.5, what="post_mult")


def test_reference_matches_the_model_and_its_post():
    """model/mhc.py (the semantics) in float64 parameters agrees with the references."""
    x, fn, sc, base, _, f = make_inputs(3, 40, torch.float32)
    y, post, comb = hc_pre(x.double(), fn.double(), sc.double(), base.double(), norm_eps=0.25,
                           hc_eps=1.0, sinkhorn_iters=ITERS)
    ref = mhc_pre_reference(x.double(), fn.double(), sc.double(), base.double(), rms_eps=0.25,
                            hc_eps=1.0, sinkhorn_iters=ITERS)
    torch.testing.assert_close(ref, (post, comb, y), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mhc_post_reference(f, x, post.float(), comb.float()),
                               hc_post(f, x, post.float(), comb.float()), rtol=1e-6, atol=1e-6)


def test_post_reference_applies_comb_transposed():
    T, H = 2, 5
    x = torch.randn(T, 4, H)
    comb = torch.zeros(T, 4, 4)
    comb[:, 0, 2] = 1.0  # stream 0 goes to stream 2
    post = torch.zeros(T, 4)
    out = mhc_post_reference(torch.randn(T, H), x, post, comb)
    assert torch.equal(out[:, 2], x[:, 0]) and not out[:, 0].any()


# ---------------------------------------------------------------------------------------------
# Triton (interpreter on CPU)


@pytest.mark.parametrize("rmsnorm", [False, True], ids=["mhc_pre", "mhc_pre+rmsnorm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", SHAPES)
def test_triton_pre_matches_reference(T, H, dtype, rmsnorm):
    x, fn, sc, base, nw, _ = make_inputs(T, H, dtype, seed=T)
    kw = {**EPS, "sinkhorn_iters": ITERS}
    if rmsnorm:
        kw.update(norm_weight=nw.to(dtype), norm_eps=1e-6)  # the model's serving weight dtype
    got = mhc_pre(x, fn, sc, base, **kw, impl="triton")
    assert_pre_close(got, mhc_pre_reference(x, fn, sc, base, **kw), dtype, 2 if rmsnorm else 1)


@pytest.mark.parametrize("eps", EPS_SETS)
def test_triton_pre_at_large_eps(eps):
    x, fn, sc, base, nw, _ = make_inputs(5, 100, torch.float32)
    kw = {**eps, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": eps["rms_eps"]}
    assert_pre_close(mhc_pre(x, fn, sc, base, **kw, impl="triton"),
                     mhc_pre_reference(x, fn, sc, base, **kw), torch.float32)


# The plain pre's tiling is the same code with the Gram sums off; other tests cover it.
@pytest.mark.parametrize("rmsnorm,dtype", [
    pytest.param(True, torch.bfloat16, id="pre+rmsnorm bf16"),
    pytest.param(True, torch.float32, id="pre+rmsnorm fp32"),
])
def test_triton_tiling_loops_and_masked_splits(rmsnorm, dtype):
    # 16-wide chunks: 7 over H=100, 2 splits of 4 (the last partly past H); 32-wide H-blocks
    # with a masked tail; two 16-token tiles, the second partly past T.
    x, fn, sc, base, nw, f = make_inputs(17, 100, dtype)
    kw = {**EPS, "sinkhorn_iters": ITERS}
    if rmsnorm:
        kw.update(norm_weight=nw, norm_eps=1e-6)
    tiling = {"block_k": 16, "num_splits": 2, "block_h": 32, "block_t": 16}
    got = mhc_pre_triton(x, fn, sc, base, EPS["rms_eps"], EPS["hc_eps"], ITERS, 2.0,
                         kw.get("norm_weight"), 1e-6, **tiling)
    assert_pre_close(got, mhc_pre_reference(x, fn, sc, base, **kw), dtype, 2)
    post, comb, _ = got
    got = mhc_post_pre_triton(f, x, post, comb, fn, sc, base, EPS["rms_eps"], EPS["hc_eps"],
                              ITERS, 2.0, kw.get("norm_weight"), 1e-6, **tiling)
    ref = mhc_post_pre_reference(f, x, post, comb, fn, sc, base, **kw)
    assert_close(got[0], ref[0], dtype, what="residual'")
    assert_pre_close(got[1:], ref[1:], dtype, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", SHAPES)
def test_triton_post_matches_reference(T, H, dtype):
    x, fn, sc, base, _, f = make_inputs(T, H, dtype, seed=T)
    post, comb, _ = mhc_pre_reference(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    out = mhc_post(f, x, post, comb, impl="triton")
    assert out.dtype == dtype
    assert_close(out, mhc_post_reference(f, x, post, comb), dtype, what="residual'")
    out = mhc_post_triton(f, x, post, comb, block_h=16)  # several H-blocks, a masked tail
    assert_close(out, mhc_post_reference(f, x, post, comb), dtype, what="residual' block_h=16")


E2, E3 = ({"rms_eps": 0.25, "hc_eps": 1.0}, {"rms_eps": 1.0, "hc_eps": 0.25})


@pytest.mark.parametrize("T,H,rmsnorm,eps", [
    pytest.param(1, 8, True, E2, id="T=1 H=8 +rmsnorm rms_eps=0.25 hc_eps=1"),
    pytest.param(3, 40, False, EPS, id="T=3 H=40 eps=1e-6"),
    pytest.param(3, 40, True, E3, id="T=3 H=40 +rmsnorm rms_eps=1 hc_eps=0.25"),
    pytest.param(9, 100, True, EPS, id="T=9 H=100 +rmsnorm eps=1e-6"),
    pytest.param(9, 100, False, E2, id="T=9 H=100 rms_eps=0.25 hc_eps=1"),
])
def test_fused_boundary_matches_post_then_pre(T, H, rmsnorm, eps):
    x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16, seed=T)
    kw = {**eps, "sinkhorn_iters": ITERS}
    if rmsnorm:
        kw.update(norm_weight=nw, norm_eps=1e-6)
    post, comb, _ = mhc_pre(x, fn * 0.5, sc, base, **kw)  # the finishing layer's weights
    fused = mhc_post_pre(f, x, post, comb, fn, sc, base, **kw, impl="triton")
    new = mhc_post(f, x, post, comb, impl="triton")
    # both round the same fp32 sums to bf16 (the sums' order may differ: 1 ulp)
    assert_close(fused[0], new, torch.bfloat16, what="fused vs post: residual'")
    ref = mhc_post_pre_reference(f, x, post, comb, fn, sc, base, **kw)
    assert_close(fused[0], ref[0], torch.bfloat16, what="residual'")
    assert_pre_close(fused[1:], ref[1:], torch.bfloat16, 2 if rmsnorm else 1)
    if torch.equal(fused[0], new):
        assert_pre_close(fused[1:], mhc_pre(new, fn, sc, base, **kw, impl="triton"),
                         torch.bfloat16, 1)


def test_comb_is_doubly_stochastic():
    x, fn, sc, base, _, _ = make_inputs(9, 100, torch.bfloat16)
    post, comb, _ = mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS, impl="triton")
    ones = torch.ones(9, 4)
    # The last pass normalises the columns; 20 passes leave the rows a few 1e-3 off (so does
    # the float64 reference: the row sums agree with its to 1e-6).
    torch.testing.assert_close(comb.sum(-2), ones, atol=1e-5, rtol=0)
    torch.testing.assert_close(comb.sum(-1), ones, atol=1e-2, rtol=0)
    ref = mhc_pre_reference(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS)[1]
    torch.testing.assert_close(comb.sum(-1), ref.sum(-1), atol=1e-6, rtol=0)
    assert (comb > 0).all() and ((post > 0) & (post < 2)).all()


def test_padding_rows_stay_finite_and_independent():
    """Rows of zeros (a padded CUDA-graph batch) give finite outputs, and the real rows do not
    depend on what the padding holds."""
    x, fn, sc, base, nw, f = make_inputs(6, 40, torch.bfloat16)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
    padded = x.clone()
    padded[4:] = 0
    got = mhc_pre(padded, fn, sc, base, **kw, impl="triton")
    assert all(t.isfinite().all() for t in got)
    assert_pre_close(got, mhc_pre_reference(padded, fn, sc, base, **kw), torch.bfloat16, 2)
    other = padded.clone()
    other[4:] = 7.0
    again = mhc_pre(other, fn, sc, base, **kw, impl="triton")
    for a, b in zip(got, again):
        assert torch.equal(a[:4], b[:4])


def _guarded(shape, dtype, band=37):
    # a view in the middle of a NaN-poisoned buffer; the band leaves it unaligned for bf16
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + 2 * band,), float("nan"), dtype=dtype)
    return buf, buf[band:band + n].view(shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_written_exactly_within_guard_bands(dtype):
    T, H = 5, 100
    x, fn, sc, base, nw, f = make_inputs(T, H, dtype)
    inputs = [t.clone() for t in (x, fn, sc, base, nw, f)]
    f32 = torch.float32
    bufs, outs = zip(*(_guarded(s, d) for s, d in (((T, 4), f32), ((T, 4, 4), f32),
                                                     ((T, H), dtype))))
    mhc_pre_triton(x, fn, sc, base, 1e-6, 1e-6, ITERS, 2.0, nw, 1e-6, out=outs)
    post, comb = outs[0].clone(), outs[1].clone()
    bufs2, outs2 = zip(*(_guarded(s, d) for s, d in (((T, 4, H), dtype), ((T, 4), f32),
                                                       ((T, 4, 4), f32), ((T, H), dtype))))
    mhc_post_pre_triton(f, x, post, comb, fn, sc, base, 1e-6, 1e-6, ITERS, 2.0, None, 0.0,
                        out=outs2)
    buf3, out3 = _guarded((T, 4, H), dtype)
    mhc_post_triton(f, x, post, comb, out=out3)
    for buf, out in zip(bufs + bufs2 + (buf3,), outs + outs2 + (out3,)):
        assert not out.isnan().any(), "an output element was not written"
        assert buf.isnan().sum() == buf.numel() - out.numel(), "a guard band was written"
    for before, after in zip(inputs, (x, fn, sc, base, nw, f)):
        assert torch.equal(before, after), "an input was written"
    ref = mhc_post_pre_reference(f, x, post, comb, fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    assert_close(outs2[0], ref[0], dtype, what="residual'")
    assert_pre_close(outs2[1:], ref[1:], dtype)


def test_reused_workspace_is_overwritten_every_call(monkeypatch):
    from dsv4spec.kernels import mhc as kernels
    from dsv4spec.kernels.workspace import WorkspaceCache

    monkeypatch.setattr(kernels, "WORKSPACES", WorkspaceCache())
    x, fn, sc, base, nw, _ = make_inputs(3, 100, torch.bfloat16)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
    first = mhc_pre(x, fn, sc, base, **kw, impl="triton")
    (ws,) = kernels.WORKSPACES.buffers()
    mhc_pre(x * 2, fn, sc, base, **kw, impl="triton")
    ws.fill_(float("nan"))
    again = mhc_pre(x, fn, sc, base, **kw, impl="triton")
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert kernels.WORKSPACES.buffers() == [ws]


def _sglang_sinkhorn_kernel(tmp_path):
    """SGLang 0.5.23's own Triton Sinkhorn (``_hc_split_sinkhorn_triton_kernel``), cut out of its
    mhc.py by the AST (the file imports CUDA-only sglang modules) and loaded from a file."""
    from dsv4spec.integrations.sglang.source import sglang_file

    try:
        source = sglang_file("kernels/ops/layernorm/mhc.py").read_text()
    except FileNotFoundError as err:
        pytest.skip(f"SGLang's source not found: {err}")
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name == "_hc_split_sinkhorn_triton_kernel")
    path = tmp_path / "sglang_sinkhorn.py"
    # the segment starts at ``def`` (decorators are not part of it)
    path.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                    + ast.get_source_segment(source, node))
    spec = importlib.util.spec_from_file_location("_sglang_sinkhorn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._hc_split_sinkhorn_triton_kernel


@pytest.mark.parametrize("eps", EPS_SETS)
def test_matches_sglang_triton_sinkhorn(eps, tmp_path):
    """A second reference: SGLang's Triton port of its Sinkhorn kernel, fed the logits
    ``(xf @ fn.T) * r`` in fp32, gives our pre weights, post and comb."""
    kernel = _sglang_sinkhorn_kernel(tmp_path)
    T, H = 5, 40
    x, fn, sc, base, _, _ = make_inputs(T, H, torch.float32)
    xf = x.reshape(T, 4 * H)
    mixes = (xf @ fn.T) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps["rms_eps"])
    pre, post, comb = torch.empty(T, 4), torch.empty(T, 4), torch.empty(T, 4, 4)
    kernel[(T,)](mixes.contiguous(), sc, base, pre, post, comb, T, HC=4, MIX_HC=24,
                 SINKHORN_ITERS=ITERS, EPS=eps["hc_eps"], BLOCK=4)
    ours = mhc_pre(x, fn, sc, base, **eps, sinkhorn_iters=ITERS, impl="triton")
    assert_close(ours[0], post, what="post vs SGLang")
    assert_close(ours[1], comb, what="comb vs SGLang")
    assert_close(ours[2], torch.einsum("ti,tih->th", pre, x), what="layer_input vs SGLang pre")


# ---------------------------------------------------------------------------------------------
# Dispatch, tracing, validation


def test_auto_is_triton_in_the_interpreter(monkeypatch):
    import importlib

    ops_mhc = importlib.import_module("dsv4spec.ops.mhc")
    calls = []
    for name in ("mhc_pre_triton", "mhc_post_triton", "mhc_post_pre_triton"):
        real = getattr(ops_mhc, name)
        monkeypatch.setattr(ops_mhc, name,
                            lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    x, fn, sc, base, _, f = make_inputs(2, 40, torch.bfloat16)
    post, comb, _ = mhc_pre(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    mhc_post(f, x, post, comb)
    mhc_post_pre(f, x, post, comb, fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    assert calls == ["mhc_pre_triton", "mhc_post_triton", "mhc_post_pre_triton"]


def test_other_hc_mult_auto_takes_the_reference_and_triton_refuses():
    x, fn, sc, base, _, f = make_inputs(3, 16, torch.float32, hc=2)
    kw = {**EPS, "sinkhorn_iters": ITERS}
    got = mhc_pre(x, fn, sc, base, **kw)
    ref = mhc_pre_reference(x, fn, sc, base, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    assert torch.equal(mhc_post(f, x, got[0], got[1]), mhc_post_reference(f, x, got[0], got[1]))
    for call in (lambda: mhc_pre(x, fn, sc, base, **kw, impl="triton"),
                 lambda: mhc_post(f, x, got[0], got[1], impl="triton"),
                 lambda: mhc_post_pre(f, x, got[0], got[1], fn, sc, base, **kw, impl="triton")):
        with pytest.raises(ValueError, match="hc_mult"):
            call()


@pytest.mark.parametrize("impl", ["auto", "reference", "triton"])
def test_empty_input(impl):
    _, fn, sc, base, nw, _ = make_inputs(1, 40, torch.bfloat16)
    x = torch.empty(0, 4, 40, dtype=torch.bfloat16)
    f = torch.empty(0, 40, dtype=torch.bfloat16)
    post, comb = torch.empty(0, 4), torch.empty(0, 4, 4)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6, "impl": impl}
    p, c, y = mhc_pre(x, fn, sc, base, **kw)
    assert (p.shape, c.shape, y.shape) == ((0, 4), (0, 4, 4), (0, 40))
    assert mhc_post(f, x, post, comb, impl=impl).shape == (0, 4, 40)
    outs = mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)
    assert [o.shape for o in outs] == [(0, 4, 40), (0, 4), (0, 4, 4), (0, 40)]
    assert outs[0].dtype == outs[3].dtype == torch.bfloat16


def test_registered_custom_ops_trace_under_torch_compile():
    x, fn, sc, base, nw, f = make_inputs(3, 40, torch.float32)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6, "impl": "triton"}

    def step(x, f):
        post, comb, y = mhc_pre(x, fn, sc, base, **kw)
        return mhc_post(f, x, post, comb, impl="triton"), mhc_post_pre(f, x, post, comb, fn, sc,
                                                                       base, **kw)

    traced = torch.compile(step, backend="aot_eager", fullgraph=True)(x, f)
    eager = step(x, f)
    assert torch.equal(traced[0], eager[0])
    assert all(torch.equal(a, b) for a, b in zip(traced[1], eager[1]))
    tu = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.dsv4spec.mhc_pre.default,
                          (x, fn, sc, base, nw, 1e-6, 1e-6, ITERS, 2.0, 1e-6), test_utils=tu)
    post, comb = eager[1][1], eager[1][2]
    torch.library.opcheck(torch.ops.dsv4spec.mhc_post.default, (f, x, post, comb), test_utils=tu)
    torch.library.opcheck(torch.ops.dsv4spec.mhc_post_pre.default,
                          (f, x, post, comb, fn, sc, base, None, 1e-6, 1e-6, ITERS, 2.0, 0.0),
                          test_utils=tu)


def _pre_args(**changes):
    x, fn, sc, base, nw, _ = make_inputs(2, 8, torch.float32)
    args = {"residual": x, "fn": fn, "hc_scale": sc, "hc_base": base, "rms_eps": 1e-6,
            "hc_eps": 1e-6, "sinkhorn_iters": ITERS, "post_mult": 2.0, "norm_weight": nw,
            "norm_eps": 1e-6, "impl": "auto"}
    args.update(changes)
    return args


PRE_VALIDATION = [
    pytest.param(_pre_args(residual=[1.0]), TypeError, "residual", id="residual not a tensor"),
    pytest.param(_pre_args(residual=torch.randn(2, 32)), ValueError, "residual",
                 id="residual 2-D"),
    pytest.param(_pre_args(residual=torch.ones(2, 4, 8, dtype=torch.int32)), ValueError,
                 "residual", id="residual int32"),
    pytest.param(_pre_args(residual=torch.randn(2, 8, 4).transpose(1, 2)), ValueError,
                 "residual", id="residual non-contiguous"),
    pytest.param(_pre_args(residual=torch.randn(2, 4, 0)), ValueError, "residual", id="H=0"),
    pytest.param(_pre_args(fn="w"), TypeError, "fn", id="fn not a tensor"),
    pytest.param(_pre_args(fn=torch.randn(16, 32)), ValueError, "fn", id="fn shape"),
    pytest.param(_pre_args(fn=torch.randn(24, 32, dtype=torch.bfloat16)), ValueError, "fn",
                 id="fn bf16"),
    pytest.param(_pre_args(fn=torch.randn(32, 24).T), ValueError, "fn", id="fn non-contiguous"),
    pytest.param(_pre_args(fn=torch.randn(24, 32, device="meta")), ValueError, "fn",
                 id="fn other device"),
    pytest.param(_pre_args(hc_scale=torch.rand(1)), ValueError, "hc_scale", id="hc_scale [1]"),
    pytest.param(_pre_args(hc_base=torch.rand(4)), ValueError, "hc_base", id="hc_base shape"),
    pytest.param(_pre_args(norm_weight=torch.rand(9)), ValueError, "norm_weight",
                 id="norm_weight shape"),
    pytest.param(_pre_args(norm_weight=torch.rand(8, dtype=torch.float64)), ValueError,
                 "norm_weight", id="norm_weight float64"),
    pytest.param(_pre_args(norm_eps=None), ValueError, "norm_eps", id="norm_weight without eps"),
    pytest.param(_pre_args(rms_eps=-1.0), ValueError, "rms_eps", id="rms_eps negative"),
    pytest.param(_pre_args(hc_eps=None), ValueError, "hc_eps", id="hc_eps None"),
    pytest.param(_pre_args(sinkhorn_iters=0), ValueError, "sinkhorn_iters", id="iters 0"),
    pytest.param(_pre_args(sinkhorn_iters=2.0), ValueError, "sinkhorn_iters", id="iters float"),
    pytest.param(_pre_args(post_mult="2"), ValueError, "post_mult", id="post_mult str"),
    pytest.param(_pre_args(impl="cuda"), ValueError, "impl", id="impl unknown"),
]


@pytest.mark.parametrize("args,exc,name", PRE_VALIDATION)
def test_pre_validation(args, exc, name):
    with pytest.raises(exc, match=name):
        mhc_pre(args.pop("residual"), args.pop("fn"), args.pop("hc_scale"), args.pop("hc_base"),
                **args)


def _post_args(**changes):
    x, _, _, _, _, f = make_inputs(2, 8, torch.bfloat16)
    args = {"f": f, "residual": x, "post": torch.rand(2, 4), "comb": torch.rand(2, 4, 4)}
    args.update(changes)
    return args


POST_VALIDATION = [
    pytest.param(_post_args(f=None), TypeError, "f", id="f None"),
    pytest.param(_post_args(f=torch.randn(2, 8)), ValueError, "f", id="f fp32 for bf16 streams"),
    pytest.param(_post_args(f=torch.randn(3, 8, dtype=torch.bfloat16)), ValueError, "f",
                 id="f shape"),
    pytest.param(_post_args(post=torch.rand(2, 4, 1)), ValueError, "post", id="post [T, hc, 1]"),
    pytest.param(_post_args(post=torch.rand(2, 4, dtype=torch.bfloat16)), ValueError, "post",
                 id="post bf16"),
    pytest.param(_post_args(comb=torch.rand(2, 4, 4).transpose(1, 2)), ValueError, "comb",
                 id="comb non-contiguous"),
    pytest.param(_post_args(comb=torch.rand(2, 16)), ValueError, "comb", id="comb flat"),
    pytest.param(_post_args(residual=torch.randn(2, 4, 8).half()), ValueError, "f",
                 id="residual fp16, f bf16"),
]


@pytest.mark.parametrize("args,exc,name", POST_VALIDATION)
def test_post_validation_before_any_write(args, exc, name):
    x, fn, sc, base, _, _ = make_inputs(2, 8, torch.float32)
    residual = args["residual"]
    before = residual.clone()
    with pytest.raises(exc, match=name):
        mhc_post(**args)
    with pytest.raises(exc, match=name):
        mhc_post_pre(*args.values(), fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    assert torch.equal(residual, before)


def test_checked_parameters_are_checked_again_after_new_storage():
    x, fn, sc, base, nw, _ = make_inputs(2, 8, torch.float32)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6, "impl": "triton"}
    for name, tensor, bad in (("fn", fn, torch.randn(24, 16)),
                              ("hc_base", base, torch.rand(24, dtype=torch.float64)),
                              ("norm_weight", nw, torch.rand(9))):
        mhc_pre(x, fn, sc, base, **kw)  # remembered (a refused weight's entry is dropped)
        assert len(MHC_OPS._CHECKED_PARAMS) == 1, "the remembered check is what this tests"
        good = tensor.data
        tensor.data = bad
        with pytest.raises(ValueError, match=name):
            mhc_pre(x, fn, sc, base, **kw)
        tensor.data = good
    kw.pop("impl")
    assert_pre_close(mhc_pre(x, fn, sc, base, **kw), mhc_pre_reference(x, fn, sc, base, **kw),
                     torch.float32)


def test_eager_call_skips_the_library_op_but_tracing_uses_it():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, fn, sc, base, _, _ = make_inputs(3, 40, torch.bfloat16)
    kw = {**EPS, "sinkhorn_iters": ITERS, "impl": "triton"}
    eager = mhc_pre(x, fn, sc, base, **kw)
    with Passthrough():
        traced = mhc_pre(x, fn, sc, base, **kw)
    assert "dsv4spec.mhc_pre.default" in seen
    assert all(torch.equal(a, b) for a, b in zip(eager, traced))


# ---------------------------------------------------------------------------------------------
# GPU: real widths, bf16, eager vs graph replay, launches per call

GPU_WIDTHS = [pytest.param(4096, id="H=4096 DSV4-Flash"), pytest.param(7168, id="H=7168 DSV4-Pro")]
GPU_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]


def assert_boundary_close(fused, f, x, post, comb, fn, sc, base, kw, ulps):
    """The fused boundary's new residual within an ulp of the float64 post, and its pre against
    the float64 pre of that same residual: where the fp32 mix lands within rounding of a bf16
    tie, the residual takes the other neighbour (1 ulp), and the next layer's logits see that
    step (~1e-5 of post at H = 7168), so comparing with a pre of the reference's own residual
    would charge the pre with the post's rounding."""
    ref = mhc_post_reference(f, x, post, comb)
    assert_close(fused[0], ref, torch.bfloat16, what="residual'")
    assert_pre_close(fused[1:], mhc_pre_reference(fused[0], fn, sc, base, **kw),
                     torch.bfloat16, ulps)


@pytest.mark.gpu
@pytest.mark.parametrize("H", GPU_WIDTHS)
def test_gpu_matches_reference(H):
    for T in GPU_TOKENS:
        x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
        for norm in (None, nw):
            kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": norm, "norm_eps": 1e-6}
            ulps = 1 if norm is None else 2
            got = mhc_pre(x, fn, sc, base, **kw)
            assert_pre_close(got, mhc_pre_reference(x, fn, sc, base, **kw), torch.bfloat16, ulps)
            fused = mhc_post_pre(f, x, got[0], got[1], fn, sc, base, **kw)
            assert_boundary_close(fused, f, x, got[0], got[1], fn, sc, base, kw, ulps)


@pytest.mark.gpu
@pytest.mark.parametrize("H", GPU_WIDTHS)
def test_gpu_cuda_graph_replay(H):
    for T in (1, 4, 32, 256):
        x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
        kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
        post, comb, _ = mhc_pre(x, fn, sc, base, **kw)

        def call():
            return mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        for seed in (1, 2):
            x.copy_(make_inputs(T, H, torch.bfloat16, "cuda", seed=100 * seed + T)[0])
            graph.replay()
            torch.cuda.synchronize()
            assert_boundary_close(out, f, x, post, comb, fn, sc, base, kw, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [4, 256])
def test_gpu_kernels_per_call(T):
    from dsv4spec.kernels import mhc as K
    from dsv4spec.timing import count_kernels

    x, fn, sc, base, nw, f = make_inputs(T, 7168, torch.bfloat16, "cuda")
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
    post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
    # from MMA_MIN_TOKENS bf16 tokens fn is split into bf16 parts by a launch of its own
    assert count_kernels(lambda: mhc_pre(x, fn, sc, base, **kw)) == (3 if T >= K.MMA_MIN_TOKENS
                                                                     else 2)
    assert count_kernels(lambda: mhc_post(f, x, post, comb)) == 1
    assert count_kernels(lambda: mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)) == 2


@pytest.mark.parametrize("H", [4096, 7168])
def test_one_compiled_partials_and_finalize_serve_every_batch_up_to_the_invariant_bound(H,
                                                                                    monkeypatch):
    """What the GPU test above rests on, checked without a GPU: every T up to the bound gets
    the same tiling (so the same constexprs and warps), and T is not a specialisation key (1 and
    multiples of 16 would otherwise compile their own binaries)."""
    from dsv4spec.kernels import mhc as K

    monkeypatch.setattr(K, "supports_pdl", lambda device_index: True)  # an H200's answer
    assert K.INVARIANT_MAX_TOKENS >= 4  # one request's decode and verify of 3 drafts
    plans = {K._config(T, H, 132, device_index=0) for T in range(1, K.INVARIANT_MAX_TOKENS + 1)}
    assert len(plans) == 1
    assert K._config(K.INVARIANT_MAX_TOKENS + 1, H, 132, device_index=0) not in plans
    for kernel in (K._mhc_partials_kernel, K._mhc_finalize_kernel):
        # a JITFunction, or under TRITON_INTERPRET=1 an InterpretedFunction keeping jit's kwargs
        options = getattr(kernel, "kwargs", None) or {"do_not_specialize": kernel.do_not_specialize}
        assert list(options["do_not_specialize"]) == ["T"]


@pytest.mark.gpu
@pytest.mark.parametrize("H", GPU_WIDTHS)
def test_gpu_a_token_alone_equals_the_same_token_in_a_batch(H):
    """Batch invariance up to INVARIANT_MAX_TOKENS: decode (one token) and the verify of its
    drafts must give a token the same mixes bit for bit, or speculative decoding in bf16 parts
    from greedy decoding (benchmarks/results/mhc/batch_invariance.json measured it parting with
    per-T tilings)."""
    from dsv4spec.kernels.mhc import INVARIANT_MAX_TOKENS as T
    x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16, "cuda", seed=H)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
    post, comb, _ = mhc_pre(x, fn, sc, base, **kw)

    def pre(i, n):  # tokens i .. i + n - 1
        return mhc_pre(x[i:i + n].contiguous(), fn, sc, base, **kw)

    def boundary(i, n):
        rows = slice(i, i + n)
        return mhc_post_pre(f[rows].contiguous(), x[rows].contiguous(), post[rows].contiguous(),
                            comb[rows].contiguous(), fn, sc, base, **kw)

    for op in (pre, boundary):
        alone = [op(i, 1) for i in range(T)]
        for n in range(2, T + 1):
            batch = op(0, n)
            for i in range(n):
                for k, (a, b) in enumerate(zip(alone[i], batch)):
                    assert torch.equal(a[0], b[i]), (op.__name__, n, i, k)
