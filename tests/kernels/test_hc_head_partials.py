"""The hc_head partials workspace, slot by slot, against float64 sums.

The output test (tests/ops/test_hc_head.py) rounds to x.dtype, which hides errors below about
2^-9 of a dot product; these check the fp32 partials themselves, so a dropped bf16 part of
hc_fn (2^-17 relative) or a Gram term stored in the wrong slot fails here.
"""

import pytest
import torch

from dsv4spec.kernels import hc_head as kernels
from dsv4spec.kernels import hc_head_plan as planner

PAIRS = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def partial_sums(x, hc_fn, rmsnorm, **tiling):
    """The workspace reduced over splits, [T, 8 or 14] float64, after a NaN-poisoned start."""
    launch, ws, cfg = kernels.partials_launch(x, hc_fn, rmsnorm, **tiling)
    ws.fill_(float("nan"))
    launch()
    assert not ws.isnan().any(), "a slot was left unwritten"
    return ws.double().sum(-1), cfg


def exact_sums(x, hc_fn, rmsnorm):
    T, _, H = x.shape
    xd = x.double()
    dots = xd.reshape(T, 4 * H) @ hc_fn.double().T
    gram = torch.einsum("tih,tjh->tij", xd, xd)
    cols = [dots[:, j] for j in range(4)] + [gram[:, i, i] for i in range(4)]
    if rmsnorm:
        cols += [gram[:, i, j] for i, j in PAIRS]
    # the scale each slot's rounding error is measured against: the sum of |terms|
    xa, fa = xd.abs(), hc_fn.double().abs()
    dot_scale = xa.reshape(T, 4 * H) @ fa.T
    gram_scale = torch.einsum("tih,tjh->tij", xa, xa)
    scale = [dot_scale[:, j] for j in range(4)] + [gram_scale[:, i, i] for i in range(4)]
    if rmsnorm:
        scale += [gram_scale[:, i, j] for i, j in PAIRS]
    return torch.stack(cols, 1), torch.stack(scale, 1)


def make(T, H, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 4, H, generator=g).to(torch.bfloat16)
    # hc_fn with a full 24-bit mantissa everywhere (not bf16-representable), so each of its three
    # bf16 parts matters
    hc_fn = torch.randn(4, 4 * H, generator=g, dtype=torch.float64).float() * (4 * H) ** -0.5
    return x, hc_fn


# fp32 sums of a few hundred terms: within 1e-7 of sum(|terms|) (measured: 1.4e-8 for the dots,
# 9e-8 for the Gram sums). hc_fn as hi + mid only, without its lo part: 1.4e-6.
REL_TOL = 3e-7


@pytest.mark.parametrize("rmsnorm,sumsq_dot", [
    pytest.param(False, True, id="hc_head, sum(x^2) from the Gram dot"),
    pytest.param(False, False, id="hc_head, sum(x^2) summed"),
    pytest.param(True, True, id="hc_head+rmsnorm"),  # its Gram sums always come from the dot
])
@pytest.mark.parametrize("T,H,block_t,block_k,num_splits", [
    pytest.param(9, 100, 4, 16, 2, id="T=9 H=100: 3 token blocks, masked chunk and split"),
    pytest.param(2, 48, 4, 32, 1, id="T=2 H=48: one block, half its rows past T"),
])
def test_mma_partials_match_float64(T, H, block_t, block_k, num_splits, rmsnorm, sumsq_dot):
    x, hc_fn = make(T, H)
    got, cfg = partial_sums(x, hc_fn, rmsnorm, mma=True, block_t=block_t, block_k=block_k,
                            num_splits=num_splits, sumsq_dot=sumsq_dot)
    assert cfg.mma and cfg.num_splits == num_splits
    exact, scale = exact_sums(x, hc_fn, rmsnorm)
    err = ((got - exact).abs() / scale).max().item()
    assert err < REL_TOL, err


def test_mma_partials_leave_nothing_past_the_workspace():
    # The workspace sits inside a NaN-poisoned buffer: the kernel writes every slot of its
    # [T, 14, splits] view (masked rows past T included) and nothing around it.
    x, hc_fn = make(5, 64)
    tiling = dict(block_k=16, num_splits=2, block_t=4, mma=True)
    ws_shape = kernels.partials_launch(x, hc_fn, True, **tiling)[1].shape
    n = ws_shape.numel()
    buf = torch.full((n + 64,), float("nan"))
    ws = buf[32:32 + n].view(ws_shape)
    kernels.partials_launch(x, hc_fn, True, ws, **tiling)[0]()
    assert buf[:32].isnan().all() and buf[32 + n:].isnan().all()
    with pytest.raises(ValueError, match="ws must have shape"):
        kernels.partials_launch(x, hc_fn, True, ws[:-1], **tiling)
    assert not ws.isnan().any()


def test_default_plan_mma_pdl_and_eviction_hints(monkeypatch):
    monkeypatch.setattr(planner, "num_sms", lambda device_index: 132)
    monkeypatch.setattr(planner, "supports_pdl", lambda device_index: device_index >= 0)
    planner._plan.cache_clear()

    def plan(T, H, device=0, dtype=torch.bfloat16, **kw):
        return planner._plan(T, H, device, False, None, None, None, dtype=dtype, **kw)[0]

    # tensor cores for bf16 on CUDA from T * H = MMA_MIN_ELEMENTS on
    assert plan(256, 7168).mma and plan(512, 4096).mma
    assert not plan(255, 7168).mma and not plan(256, 4096).mma
    assert not plan(1024, 7168, dtype=torch.float16).mma
    assert not plan(1024, 7168, device=-1).mma  # the interpreter multiplies bf16 as integers
    with pytest.raises(ValueError, match="bfloat16"):
        plan(256, 7168, dtype=torch.float32, mma=True)
    # forced in an interpreter whose bf16 dots are wrong, it is refused, not run
    assert planner.interpreter_multiplies_bf16()  # tests/conftest.py fixed this one
    planner._plan.cache_clear()
    monkeypatch.setattr(planner, "interpreter_multiplies_bf16", lambda: False)
    with pytest.raises(ValueError, match="need a GPU"):
        plan(256, 7168, device=-1, mma=True)
    # the finalize as a dependent launch up to PDL_MAX_TOKENS, never in the interpreter
    assert plan(planner.PDL_MAX_TOKENS, 7168).pdl and not plan(planner.PDL_MAX_TOKENS + 1, 7168).pdl
    assert not plan(1, 7168, device=-1).pdl
    with pytest.raises(ValueError, match="sm_90"):
        plan(1, 7168, device=-1, pdl=True)
    # L2 hints with the tensor-core partials only, unless asked for
    assert plan(1024, 7168).evict_hints and not plan(64, 7168).evict_hints
    assert not plan(1024, 7168, evict_hints=False).evict_hints
    planner._plan.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
@pytest.mark.parametrize("H", [4096, 7168])
def test_gpu_mma_partials_match_float64(H, rmsnorm):
    # The default tensor-core plan at real widths, T a whole and a partial token block past the
    # threshold.
    for T in (planner.MMA_MIN_ELEMENTS // H, 1000):
        x, hc_fn = make(T, H, seed=T)
        x, hc_fn = x.cuda(), hc_fn.cuda()
        got, cfg = partial_sums(x, hc_fn, rmsnorm)
        assert cfg.mma
        exact, scale = exact_sums(x, hc_fn, rmsnorm)
        # The tensor cores' fp32 sums truncate: measured 1.6e-6 for sum(x^2) at T = 1024
        assert ((got - exact).abs() / scale).max().item() < 1e-5
