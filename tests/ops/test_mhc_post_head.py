"""The model tail op (dsv4spec/ops/mhc_post_head.py): the Triton path in the interpreter against
a float64 reference and against mhc_post then hc_head, poisoned outputs, bad input; GPU checks."""

import pytest
import torch

from dsv4spec.kernels.mhc import TAIL_FUSED_MAX_TOKENS, mhc_post_head_triton
from dsv4spec.ops import (
    hc_head_reference,
    mhc_post,
    mhc_post_head,
    mhc_post_head_reference,
    mhc_post_reference,
    mhc_pre_reference,
)
from tests.ops.test_mhc import EPS, ITERS, assert_close, make_inputs

SHAPES = [
    pytest.param(1, 8, id="T=1 H=8"),
    pytest.param(3, 40, id="T=3 H=40 masked tails"),
    pytest.param(9, 100, id="T=9 H=100 two token blocks"),
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
HEAD_EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}


def tail_inputs(T, H, dtype, device="cpu", seed=0):
    """The last layer's f, streams, post and comb (from a reference pre), and hc_head's and the
    final norm's parameters."""
    x, fn, sc, base, nw, f = make_inputs(T, H, dtype, device, seed=seed)
    post, comb, _ = mhc_pre_reference(x, fn, sc, base, **EPS, sinkhorn_iters=ITERS)
    g = torch.Generator().manual_seed(seed + 1)
    hc_fn = (torch.randn(4, 4 * H, generator=g) * (4 * H) ** -0.5).to(device)
    hc_scale = (torch.rand(1, generator=g) + 0.5).to(device)
    hc_base = torch.randn(4, generator=g).to(device)
    return f, x, post.contiguous(), comb.contiguous(), hc_fn, hc_scale, hc_base, nw


def float64_tail(f, x, post, comb, hc_fn, hc_scale, hc_base, nw, norm_eps, hc_eps, final_eps):
    """Written out in float64 apart from the ops: the new streams rounded to x.dtype, then
    :func:`float64_head` of those."""
    new = mhc_post_reference(f, x, post, comb)
    return new, float64_head(new, hc_fn, hc_scale, hc_base, nw, norm_eps, hc_eps, final_eps)


def float64_head(new, hc_fn, hc_scale, hc_base, nw, norm_eps, hc_eps, final_eps):
    """The hidden state of the streams ``new`` in float64, rounded to their dtype, then its
    RMSNorm, rounded. The hidden state is checked against this of the op's own streams (checked
    to 1 ulp on their own): a stream value one ulp off at a rounding tie moves a hidden value
    that cancels across the 4 streams by many of its ulps."""
    T, hc, H = new.shape
    xd = new.double().reshape(T, hc * H)
    r = torch.rsqrt(xd.square().mean(-1, keepdim=True) + norm_eps)
    w = torch.sigmoid((xd @ hc_fn.double().T) * r * hc_scale.double() + hc_base.double()) + hc_eps
    y = (w.unsqueeze(-1) * xd.view(T, hc, H)).sum(1)
    if nw is not None:
        y = y.to(new.dtype).double()
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + final_eps) * nw.double()
    return y.to(new.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", SHAPES)
@pytest.mark.parametrize("norm", [False, True], ids=["hc_head", "hc_head+norm"])
def test_triton_matches_float64(T, H, dtype, norm):
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(T, H, dtype)
    nw = nw if norm else None
    new, y = mhc_post_head(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS, norm_weight=nw,
                           final_norm_eps=1e-6 if norm else None, impl="triton")
    ref_new, ref_y = float64_tail(f, x, post, comb, hc_fn, sc, base, nw, 1e-6, 1e-6, 1e-6)
    assert new.dtype == y.dtype == dtype
    assert_close(new, ref_new, dtype, what="residual'")
    if dtype is not torch.float32:
        ref_y = float64_head(new, hc_fn, sc, base, nw, 1e-6, 1e-6, 1e-6)
    assert_close(y, ref_y, dtype, 2 if norm else 1, what="hidden")


@pytest.mark.parametrize("eps", [{"norm_eps": 0.25, "hc_eps": 1.0}, {"norm_eps": 1.0,
                                                                   "hc_eps": 0.25}],
                         ids=["norm_eps=0.25 hc_eps=1", "norm_eps=1 hc_eps=0.25"])
def test_triton_at_large_eps(eps):
    # each epsilon moves the output well past the tolerance, so a dropped one fails
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(3, 40, torch.float32)
    _, y = mhc_post_head(f, x, post, comb, hc_fn, sc, base, **eps, norm_weight=nw,
                         final_norm_eps=0.5, impl="triton")
    _, ref = float64_tail(f, x, post, comb, hc_fn, sc, base, nw, eps["norm_eps"], eps["hc_eps"],
                          0.5)
    assert_close(y, ref, what="hidden")


def test_reference_is_mhc_post_then_hc_head():
    f, x, post, comb, hc_fn, sc, base, _ = tail_inputs(3, 40, torch.bfloat16)
    new, y = mhc_post_head_reference(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS)
    assert torch.equal(new, mhc_post_reference(f, x, post, comb))
    assert torch.equal(y, hc_head_reference(new, hc_fn, sc, base, **HEAD_EPS))


def test_streams_are_mhc_posts_bit_for_bit():
    # the same mix, rounded the same way: the MTP draft reads these streams
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(9, 100, torch.bfloat16)
    new, _ = mhc_post_head(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS, norm_weight=nw,
                           final_norm_eps=1e-6, impl="triton")
    assert torch.equal(new, mhc_post(f, x, post, comb, impl="triton"))


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["fp32 weight",
                                                                               "bf16 weight"])
@pytest.mark.parametrize("final_eps", [1e-6, 0.5], ids=["one epsilon", "own final epsilon"])
def test_above_the_fused_bound_the_tail_is_post_then_hc_head(monkeypatch, final_eps,
                                                             weight_dtype):
    """Above TAIL_FUSED_MAX_TOKENS the tail is mhc_post then hc_head's own launches, bit for bit,
    into the given outputs; with a final-norm epsilon other than hc_head's it stays fused (hc_head
    normalises with its own), and both match float64."""
    from dsv4spec.kernels import mhc as K
    from dsv4spec.kernels.hc_head import hc_head_triton

    monkeypatch.setattr(K, "TAIL_FUSED_MAX_TOKENS", 2)  # small grids for the interpreter
    heads = []
    monkeypatch.setattr(K, "hc_head_triton", lambda *a, **kw: heads.append(a) or
                        hc_head_triton(*a, **kw))
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(5, 40, torch.float32)
    nw = nw.to(weight_dtype)  # the model passes its norm's weight in the streams' dtype
    new, y = torch.full_like(x, float("nan")), torch.full((5, 40), float("nan"))
    mhc_post_head_triton(f, x, post, comb, hc_fn, sc, base, 1e-6, 1e-6, nw, final_eps,
                         out=(new, y))
    ref_new, ref_y = float64_tail(f, x, post, comb, hc_fn, sc, base, nw, 1e-6, 1e-6, final_eps)
    assert_close(new, ref_new, what="residual'")
    assert_close(y, ref_y, what="hidden")
    sequence = hc_head_triton(mhc_post(f, x, post, comb, impl="triton"), hc_fn, sc, base, 1e-6,
                              1e-6, nw.float())
    assert len(heads) == (1 if final_eps == 1e-6 else 0)
    if heads:
        assert torch.equal(y, sequence)


@pytest.mark.parametrize("norm", [False, True], ids=["hc_head", "hc_head+norm"])
def test_poisoned_outputs_are_written_whole_and_nothing_around_them(norm):
    T, H = 3, 40
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(T, H, torch.float32)
    guard = 16
    new_buf = torch.full((T * 4 * H + 2 * guard,), float("nan"))
    hid_buf = torch.full((T * H + 2 * guard,), float("nan"))
    new = new_buf[guard:-guard].view(T, 4, H)
    hidden = hid_buf[guard:-guard].view(T, H)
    inputs = [t.clone() for t in (f, x, post, comb, hc_fn, sc, base, nw)]
    mhc_post_head_triton(f, x, post, comb, hc_fn, sc, base, 1e-6, 1e-6,
                         nw if norm else None, 1e-6, out=(new, hidden))
    assert not new.isnan().any() and not hidden.isnan().any()
    assert new_buf[:guard].isnan().all() and new_buf[-guard:].isnan().all()
    assert hid_buf[:guard].isnan().all() and hid_buf[-guard:].isnan().all()
    for before, after in zip(inputs, (f, x, post, comb, hc_fn, sc, base, nw)):
        assert torch.equal(before, after)  # inputs untouched


@pytest.mark.parametrize("impl", ["auto", "reference", "triton"])
def test_empty_input(impl):
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(0, 8, torch.bfloat16)
    new, y = mhc_post_head(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS, impl=impl)
    assert new.shape == (0, 4, 8) and y.shape == (0, 8)


def _bad(name):
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(2, 8, torch.float32)
    kw = dict(f=f, residual=x, post=post, comb=comb, hc_fn=hc_fn, hc_scale=sc, hc_base=base,
              norm_eps=1e-6, hc_eps=1e-6, norm_weight=nw, final_norm_eps=1e-6)
    bad = {"hc_fn": hc_fn[:, :-1], "hc_scale": torch.ones(3), "hc_base": base.double(),
           "norm_weight": nw[:-1], "final_norm_eps": -1.0, "norm_eps": "1e-6",
           "post": post.double(), "f": f[:1]}
    kw[name] = bad[name]
    return kw


@pytest.mark.parametrize("name", ["hc_fn", "hc_scale", "hc_base", "norm_weight",
                                  "final_norm_eps", "norm_eps", "post", "f"])
def test_bad_input_names_the_argument(name):
    kw = _bad(name)
    with pytest.raises((ValueError, TypeError), match=name):
        mhc_post_head(**kw, impl="triton")


def test_norm_weight_needs_final_norm_eps():
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(2, 8, torch.float32)
    with pytest.raises(ValueError, match="final_norm_eps"):
        mhc_post_head(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS, norm_weight=nw)


def test_registered_custom_op_traces_under_torch_compile():
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(3, 40, torch.float32)

    def tail(f, x):
        return mhc_post_head(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS, norm_weight=nw,
                             final_norm_eps=1e-6)

    eager = tail(f, x)
    compiled = torch.compile(tail, fullgraph=True)(f, x)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


GPU_WIDTHS = [pytest.param(4096, id="H=4096 DSV4-Flash"), pytest.param(7168, id="H=7168 DSV4-Pro")]


@pytest.mark.gpu
@pytest.mark.parametrize("H", GPU_WIDTHS)
@pytest.mark.parametrize("T", [1, 4, 32, 300])
def test_gpu_matches_float64_in_two_launches(H, T):
    from dsv4spec.timing import count_kernels

    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(T, H, torch.bfloat16, "cuda")

    def tail():
        return mhc_post_head(f, x, post, comb, hc_fn, sc, base, **HEAD_EPS, norm_weight=nw,
                             final_norm_eps=1e-6)

    new, y = tail()
    ref_new, _ = float64_tail(f, x, post, comb, hc_fn, sc, base, nw, 1e-6, 1e-6, 1e-6)
    assert_close(new, ref_new, torch.bfloat16, what="residual'")
    assert_close(y, float64_head(new, hc_fn, sc, base, nw, 1e-6, 1e-6, 1e-6), torch.bfloat16, 2,
                 what="hidden")
    assert count_kernels(tail) == (2 if T <= TAIL_FUSED_MAX_TOKENS else 3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tail()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(captured[0], mhc_post_reference(f, x, post, comb), torch.bfloat16,
                 what="replayed residual'")
    assert_close(captured[1], float64_head(captured[0], hc_fn, sc, base, nw, 1e-6, 1e-6, 1e-6),
                 torch.bfloat16, 2, what="replayed hidden")
