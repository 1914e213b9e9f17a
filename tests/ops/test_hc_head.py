import importlib

import pytest
import torch

from dsv4spec.capture import capture_mode
from dsv4spec.kernels.hc_head import hc_head_triton
from dsv4spec.ops.checked_params import CheckedParams
from dsv4spec.ops.hc_head import (
    hc_head,
    hc_head_reference,
    hc_head_rmsnorm,
    hc_head_rmsnorm_reference,
)

EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}
# At DSV4's 1e-6 dropping either epsilon stays inside the tolerance; these make each term visible
# (mean(x^2) ~ 1, so norm_eps 0.25 moves r by ~10%; hc_eps 1.0 moves each weight by 1).
EPS_SETS = [
    pytest.param(EPS, id="eps=1e-6 (DSV4)"),
    pytest.param({"norm_eps": 0.25, "hc_eps": 1.0}, id="norm_eps=0.25 hc_eps=1"),
    pytest.param({"norm_eps": 1.0, "hc_eps": 0.25}, id="norm_eps=1 hc_eps=0.25"),
]

# Small grids for the interpreter; every H is checked against masked tails of the 64/128-wide
# chunks and the H-blocks.
SHAPES = [
    pytest.param(1, 8, id="T=1 H=8 one token"),
    pytest.param(3, 40, id="T=3 H=40 not a power of two"),
    pytest.param(3, 100, id="T=3 H=100 odd width, masked tail"),
    pytest.param(17, 100, id="T=17 H=100 three token blocks"),
]
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]
HC_HEAD_OPS = importlib.import_module("dsv4spec.ops.hc_head")  # the name is also the op's


@pytest.fixture(autouse=True)
def _own_checked_params(monkeypatch):
    """Each test starts with an empty remembered-parameter cache: whether a call takes the
    remembered check (and so which branch a test exercises) must not depend on the tests that ran
    before it."""
    monkeypatch.setattr(HC_HEAD_OPS, "_CHECKED_PARAMS",
                        CheckedParams(HC_HEAD_OPS.CHECKED_PARAMS_LIMIT))


# fp32 output: relative error (max |diff| / max |ref|) below 1e-5. Half-precision outputs are
# rounded from an fp32 y that differs from the float64 truth by ~1e-7 relative, so they may land
# one ulp apart at a rounding boundary: 1 ulp of the output dtype.
FP32_RTOL = 1e-5


def make_inputs(T, H, dtype, device="cpu", hc=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, hc, H, generator=g).to(device=device, dtype=dtype)
    # std 1/sqrt(hc*H): the logits m are ~N(0, 1) at every width, so no sigmoid saturates.
    hc_fn = (torch.randn(hc, hc * H, generator=g) * (hc * H) ** -0.5).to(device)
    hc_scale = (torch.rand(1, generator=g) + 0.5).to(device)
    hc_base = torch.randn(hc, generator=g).to(device)
    norm_weight = (torch.rand(H, generator=g) + 0.5).to(device)
    return x, hc_fn, hc_scale, hc_base, norm_weight


def hc_head_float64(x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps):
    # An independent float64 formulation: per-stream einsum instead of the flattened matmul.
    T, hc, H = x.shape
    xd = x.double()
    r = 1.0 / torch.sqrt((xd**2).sum((1, 2)) / (hc * H) + norm_eps)
    m = torch.einsum("tih,jih->tj", xd, hc_fn.double().view(hc, hc, H)) * r[:, None]
    w = 1.0 / (1.0 + torch.exp(-(m * hc_scale.double() + hc_base.double()))) + hc_eps
    return torch.einsum("ti,tih->th", w, xd)


def rmsnorm_float64(y, weight, eps):
    yd = y.double()
    return yd / torch.sqrt((yd**2).mean(-1, keepdim=True) + eps) * weight.double()


def ulp(v, dtype):
    exp = torch.floor(torch.log2(v.abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.finfo(dtype).eps * torch.exp2(exp)


def assert_close(actual, expected, dtype, ulps=1):
    """fp32: max|diff| / max|expected| < 1e-5; half types: |diff| <= ulps of the output dtype."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    scale = e.abs().max().clamp_min(1e-30)
    if dtype == torch.float32:
        bad = diff > FP32_RTOL * scale
    else:
        # One ulp of the larger of the two: two roundings of nearly equal fp32 values that
        # straddle a power of two land one ulp (of the upper binade) apart.
        bad = diff > ulps * ulp(torch.maximum(a.abs(), e.abs()), dtype) + 1e-6 * scale
    if bad.any():
        worst = diff.flatten().argsort(descending=True)[:5]
        pairs = [(a.flatten()[i].item(), e.flatten()[i].item()) for i in worst]
        raise AssertionError(
            f"{int(bad.sum())}/{bad.numel()} elements out of tolerance; rel error "
            f"{(diff.max() / scale).item():.3g}; worst (actual, expected): {pairs}"
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", SHAPES)
def test_reference_matches_float64(T, H, dtype):
    x, fn, sc, base, nw = make_inputs(T, H, dtype)
    y64 = hc_head_float64(x, fn, sc, base, **EPS)
    y = hc_head_reference(x, fn, sc, base, **EPS)
    assert y.dtype == dtype
    assert_close(y, y64, dtype)
    # The composition: y rounded to x.dtype, then the RMSNorm in float64.
    out64 = rmsnorm_float64(y, nw, EPS["norm_eps"])
    assert_close(hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS), out64, dtype)


@pytest.mark.parametrize("eps", EPS_SETS)
def test_reference_matches_float64_at_large_eps(eps):
    x, fn, sc, base, nw = make_inputs(3, 40, torch.float32)
    assert_close(hc_head_reference(x, fn, sc, base, **eps), hc_head_float64(x, fn, sc, base, **eps),
                 torch.float32)
    y = hc_head_reference(x, fn, sc, base, **eps)
    assert_close(hc_head_rmsnorm_reference(x, fn, sc, base, nw, **eps),
                 rmsnorm_float64(y, nw, eps["norm_eps"]), torch.float32)


@pytest.mark.parametrize("eps", EPS_SETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", SHAPES)
def test_triton_matches_reference(T, H, dtype, eps):
    x, fn, sc, base, _ = make_inputs(T, H, dtype)
    y = hc_head(x, fn, sc, base, **eps, impl="triton")
    assert y.dtype == dtype
    assert_close(y, hc_head_reference(x, fn, sc, base, **eps), dtype)


@pytest.mark.parametrize("eps", EPS_SETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", SHAPES)
def test_triton_rmsnorm_matches_reference(T, H, dtype, eps):
    x, fn, sc, base, nw = make_inputs(T, H, dtype)
    out = hc_head_rmsnorm(x, fn, sc, base, nw, **eps, impl="triton")
    # Half types: y may round one ulp apart (see FP32_RTOL), which the norm carries into the
    # output before its own rounding: 2 ulps.
    assert_close(out, hc_head_rmsnorm_reference(x, fn, sc, base, nw, **eps), dtype, ulps=2)


def test_eager_call_skips_the_library_op_but_tracing_uses_it(monkeypatch):
    """A plain eager call launches the kernels directly; under a dispatch mode (as in tracing)
    the call goes through the registered op. Both give the same result."""
    import importlib

    from torch.utils._python_dispatch import TorchDispatchMode

    # (dsv4spec.ops re-exports the function hc_head, which shadows the module attribute)
    ops_hc_head = importlib.import_module("dsv4spec.ops.hc_head")
    calls = []
    real = ops_hc_head.hc_head_triton
    monkeypatch.setattr(ops_hc_head, "hc_head_triton",
                        lambda *a, **k: calls.append("direct") or real(*a, **k))
    x, fn, sc, base, _ = make_inputs(3, 40, torch.bfloat16)
    y = hc_head(x, fn, sc, base, **EPS, impl="triton")
    assert calls == ["direct"]

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    with Passthrough():
        y_op = hc_head(x, fn, sc, base, **EPS, impl="triton")
    # the mode sees the op, whose body then launches the kernels
    assert calls[1:] == ["dsv4spec.hc_head.default", "direct"], calls
    assert torch.equal(y, y_op)
    x.requires_grad_(True)
    assert not ops_hc_head._direct_call_ok(x)


@pytest.mark.parametrize("partials_2d", [False, True], ids=["per-chunk sums", "2-D sums"])
@pytest.mark.parametrize("eps", EPS_SETS)
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
def test_triton_tiling_loops_and_masked_splits(rmsnorm, eps, partials_2d):
    # 16-wide chunks: 7 chunks over H=100, 2 splits of 4 chunks (the last one partly past H),
    # 4 H-blocks of 32 with a masked tail; 4-token blocks, the second one partly past T.
    x, fn, sc, base, nw = make_inputs(5, 100, torch.float32)
    nw = nw if rmsnorm else None
    out = hc_head_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"], nw, block_k=16,
                         num_splits=2, block_h=32, partials_2d=partials_2d, block_t=4)
    if rmsnorm:
        ref = hc_head_rmsnorm_reference(x, fn, sc, base, nw, **eps)
    else:
        ref = hc_head_reference(x, fn, sc, base, **eps)
    assert_close(out, ref, torch.float32)


def test_2d_partials_are_the_default_for_the_norm_at_large_t_only():
    from dsv4spec.kernels.hc_head_plan import _plan

    assert _plan(1024, 7168, -1, True, None, None, None)[0].partials_2d
    assert not _plan(1024, 7168, -1, False, None, None, None)[0].partials_2d
    assert not _plan(256, 7168, -1, True, None, None, None)[0].partials_2d
    assert not _plan(1024, 4096, -1, True, None, None, None)[0].partials_2d
    assert _plan(4096, 4096, -1, True, None, None, None)[0].partials_2d


@pytest.mark.parametrize("eps", EPS_SETS)
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
def test_mma_partials_in_bf16_match_reference(rmsnorm, eps):
    # The tensor-core partials through the finalize: 3 token blocks (the last partly past T), 2
    # splits over 7 chunks (the last partly past H). tests/kernels/test_hc_head_partials.py
    # checks the partials themselves.
    x, fn, sc, base, nw = make_inputs(9, 100, torch.bfloat16)
    nw = nw if rmsnorm else None
    out = hc_head_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"], nw, block_k=16,
                         num_splits=2, block_h=32, block_t=4, mma=True)
    if rmsnorm:
        assert_close(out, hc_head_rmsnorm_reference(x, fn, sc, base, nw, **eps), torch.bfloat16, 2)
    else:
        assert_close(out, hc_head_reference(x, fn, sc, base, **eps), torch.bfloat16)


@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
def test_2d_partials_in_bf16_match_reference(rmsnorm):
    x, fn, sc, base, nw = make_inputs(9, 100, torch.bfloat16)
    nw = nw if rmsnorm else None
    out = hc_head_triton(x, fn, sc, base, 1e-6, 1e-6, nw, block_k=32, partials_2d=True)
    if rmsnorm:
        assert_close(out, hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS), torch.bfloat16, 2)
    else:
        assert_close(out, hc_head_reference(x, fn, sc, base, **EPS), torch.bfloat16)


def test_auto_is_triton_in_the_interpreter_and_keeps_leading_dims():
    x, fn, sc, base, nw = make_inputs(6, 40, torch.bfloat16)
    x = x.view(2, 3, 4, 40)
    y = hc_head(x, fn, sc, base, **EPS)
    assert y.shape == (2, 3, 40)
    assert torch.equal(y, hc_head(x, fn, sc, base, **EPS, impl="triton"))
    assert_close(y, hc_head_reference(x, fn, sc, base, **EPS), torch.bfloat16)
    out = hc_head_rmsnorm(x, fn, sc, base, nw, **EPS)
    assert out.shape == (2, 3, 40)


def test_auto_falls_back_to_reference_for_other_hc_mult():
    x, fn, sc, base, _ = make_inputs(3, 16, torch.float32, hc=2)
    assert torch.equal(hc_head(x, fn, sc, base, **EPS), hc_head_reference(x, fn, sc, base, **EPS))


@pytest.mark.parametrize("impl", ["auto", "eager", "compiled", "triton"])
@pytest.mark.parametrize("shape", [
    pytest.param((0, 4, 40), id="T=0 empty"),
    pytest.param((2, 0, 4, 40), id="empty leading dims"),
])
def test_empty_input(shape, impl):
    _, fn, sc, base, nw = make_inputs(1, 40, torch.bfloat16)
    x = torch.empty(shape, dtype=torch.bfloat16)
    with capture_mode(allow_cpu=True):  # "compiled" must stay eager for empty input
        y = hc_head(x, fn, sc, base, **EPS, impl=impl)
        out = hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl=impl)
    assert y.shape == out.shape == (*shape[:-2], 40)
    assert y.dtype == out.dtype == torch.bfloat16


def test_registered_custom_ops_trace_under_torch_compile():
    x, fn, sc, base, nw = make_inputs(3, 40, torch.float32)

    def f(x):
        return hc_head(x, fn, sc, base, **EPS, impl="triton"), hc_head_rmsnorm(
            x, fn, sc, base, nw, **EPS, impl="triton")

    y, out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(y, hc_head(x, fn, sc, base, **EPS, impl="triton"))
    assert torch.equal(out, hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton"))
    torch.library.opcheck(torch.ops.dsv4spec.hc_head.default, (x, fn, sc, base, 1e-6, 1e-6),
                          test_utils=("test_schema", "test_faketensor"))


def _bad(**changes):
    x, fn, sc, base, nw = make_inputs(2, 8, torch.float32)
    args = {"x": x, "hc_fn": fn, "hc_scale": sc, "hc_base": base, "norm_weight": nw,
            "norm_eps": 1e-6, "hc_eps": 1e-6, "impl": "auto"}
    args.update(changes)
    return args


VALIDATION = [
    pytest.param(_bad(x=[1.0]), TypeError, "x", id="x not a tensor"),
    pytest.param(_bad(x=torch.randn(8)), ValueError, "x", id="x 1-D"),
    pytest.param(_bad(x=torch.ones(2, 4, 8, dtype=torch.int32)), ValueError, "x", id="x int32"),
    pytest.param(_bad(x=torch.randn(2, 8, 4).transpose(1, 2)), ValueError, "x",
                 id="x non-contiguous"),
    pytest.param(_bad(x=torch.randn(2, 4, 0)), ValueError, "x", id="x H=0"),
    pytest.param(_bad(hc_fn="w"), TypeError, "hc_fn", id="hc_fn not a tensor"),
    pytest.param(_bad(hc_fn=torch.randn(4, 8)), ValueError, "hc_fn", id="hc_fn shape"),
    pytest.param(_bad(hc_fn=torch.randn(4, 32, dtype=torch.bfloat16)), ValueError, "hc_fn",
                 id="hc_fn bf16"),
    pytest.param(_bad(hc_fn=torch.randn(32, 4).T), ValueError, "hc_fn",
                 id="hc_fn non-contiguous"),
    pytest.param(_bad(hc_fn=torch.randn(4, 32, device="meta")), ValueError, "hc_fn",
                 id="hc_fn other device"),
    pytest.param(_bad(hc_scale=torch.rand(())), ValueError, "hc_scale", id="hc_scale 0-D"),
    pytest.param(_bad(hc_base=torch.rand(3)), ValueError, "hc_base", id="hc_base shape"),
    pytest.param(_bad(norm_weight=torch.rand(9)), ValueError, "norm_weight",
                 id="norm_weight shape"),
    pytest.param(_bad(norm_eps=-1.0), ValueError, "norm_eps", id="norm_eps negative"),
    pytest.param(_bad(hc_eps=None), ValueError, "hc_eps", id="hc_eps None"),
    pytest.param(_bad(impl="cuda"), ValueError, "impl", id="impl unknown"),
    pytest.param(_bad(x=torch.randn(2, 2, 8), hc_fn=torch.randn(2, 16), hc_base=torch.rand(2),
                      impl="triton"), ValueError, "hc_mult", id="triton needs hc_mult 4"),
]


@pytest.mark.parametrize("args,exc,name", VALIDATION)
def test_validation(args, exc, name):
    with pytest.raises(exc, match=name):
        hc_head_rmsnorm(args.pop("x"), args.pop("hc_fn"), args.pop("hc_scale"),
                        args.pop("hc_base"), args.pop("norm_weight"), **args)


def test_validation_without_norm_weight():
    args = _bad(hc_base=torch.rand(5))
    del args["norm_weight"]
    with pytest.raises(ValueError, match="hc_base"):
        hc_head(args.pop("x"), args.pop("hc_fn"), args.pop("hc_scale"), args.pop("hc_base"),
                **args)


def test_checked_parameters_are_checked_again_after_new_storage():
    """The parameter checks are remembered per tensor: a weight given new storage of the wrong
    shape or dtype (``param.data = ...``) must still be refused, naming it, before any launch."""
    x, fn, sc, base, nw = make_inputs(2, 8, torch.float32)
    for name, tensor, bad in (("hc_fn", fn, torch.randn(4, 16)),
                              ("hc_base", base, torch.rand(4, dtype=torch.float64)),
                              ("norm_weight", nw, torch.rand(9))):
        # remembered (a refused weight's entry is dropped)
        hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton")
        assert len(HC_HEAD_OPS._CHECKED_PARAMS) == 1, "the remembered check is what this tests"
        good = tensor.data
        tensor.data = bad
        with pytest.raises(ValueError, match=name):
            hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton")
        tensor.data = good
    assert_close(hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton"),
                 hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS), torch.float32)


def test_checked_parameters_are_per_tensor():
    """A call with other parameter tensors (another layer) is checked on its own."""
    x, fn, sc, base, nw = make_inputs(2, 8, torch.float32)
    hc_head(x, fn, sc, base, **EPS, impl="triton")
    with pytest.raises(ValueError, match="hc_scale"):
        hc_head(x, fn, torch.rand(2), base, **EPS, impl="triton")


@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
def test_reused_workspace_is_overwritten_every_call(rmsnorm, monkeypatch):
    """Eager calls reuse one partials workspace per (stream, shape); every slot the finalize
    reads is rewritten by each call, so a poisoned workspace and another input in between do not
    change a result."""
    from dsv4spec.kernels import hc_head as kernels

    monkeypatch.setattr(kernels, "WORKSPACES", kernels.WorkspaceCache())
    x, fn, sc, base, nw = make_inputs(3, 100, torch.bfloat16)
    nw = nw if rmsnorm else None
    first = hc_head_triton(x, fn, sc, base, 1e-6, 1e-6, norm_weight=nw)
    workspaces = kernels.WORKSPACES.buffers()
    assert len(workspaces) == 1  # that shape's workspace, kept
    hc_head_triton(x * 2, fn, sc, base, 1e-6, 1e-6, norm_weight=nw)
    workspaces[0].fill_(float("nan"))
    again = hc_head_triton(x, fn, sc, base, 1e-6, 1e-6, norm_weight=nw)
    assert torch.equal(again, first)
    assert kernels.WORKSPACES.buffers() == workspaces


# ---------------------------------------------------------------------------------------------
# GPU: real widths, bf16, eager vs Triton vs replay from a CUDA graph.

GPU_WIDTHS = [pytest.param(4096, id="H=4096 DSV4-Flash"), pytest.param(7168, id="H=7168 DSV4-Pro")]
GPU_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]


@pytest.mark.gpu
@pytest.mark.parametrize("H", GPU_WIDTHS)
def test_gpu_triton_matches_reference(H):
    for T in GPU_TOKENS:
        x, fn, sc, base, nw = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
        assert_close(hc_head(x, fn, sc, base, **EPS, impl="triton"),
                     hc_head_reference(x, fn, sc, base, **EPS), torch.bfloat16)
        assert_close(hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton"),
                     hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS), torch.bfloat16, 2)


def _capture(fn):
    # Warm up (and compile) under capture_mode() on a side stream, then capture, as runners do.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), capture_mode():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with capture_mode(), torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
@pytest.mark.parametrize("impl", ["compiled", "triton"])
@pytest.mark.parametrize("H", GPU_WIDTHS)
def test_gpu_cuda_graph_replay(H, impl, rmsnorm):
    # Inductor compiles once per T (dynamic=False): a subset here keeps the GPU run short; the
    # hc-head benchmark captures and refchecks the compiled path at every T of GPU_TOKENS.
    for T in (GPU_TOKENS if impl == "triton" else (1, 4, 256)):
        x, fn, sc, base, nw = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
        if rmsnorm:
            def call():
                return hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl=impl)
            ref_fn, ulps = lambda: hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS), 2
        else:
            def call():
                return hc_head(x, fn, sc, base, **EPS, impl=impl)
            ref_fn, ulps = lambda: hc_head_reference(x, fn, sc, base, **EPS), 1
        graph, out = _capture(call)
        for seed in (1, 2):  # new data in the static input, replay, compare with eager
            x.copy_(make_inputs(T, H, torch.bfloat16, "cuda", seed=1000 * seed + T)[0])
            graph.replay()
            torch.cuda.synchronize()
            assert_close(out, ref_fn(), torch.bfloat16, ulps)


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
@pytest.mark.parametrize("H", GPU_WIDTHS)
def test_gpu_a_token_alone_equals_the_same_token_in_a_batch(H, rmsnorm):
    """Batch invariance up to INVARIANT_MAX_TOKENS: the draft's and the target's hc_head give a
    token the same bits alone (decode) as inside the verify of its drafts, or speculative
    decoding in bf16 parts from greedy decoding (benchmarks/results/hc_head/batch_invariance.json
    measured per-T tilings parting)."""
    from dsv4spec.kernels.hc_head_plan import INVARIANT_MAX_TOKENS as T
    x, fn, sc, base, nw = make_inputs(T, H, torch.bfloat16, "cuda", seed=H)

    def head(i, n):  # tokens i .. i + n - 1
        rows = x[i:i + n].contiguous()
        if rmsnorm:
            return hc_head_rmsnorm(rows, fn, sc, base, nw, **EPS, impl="triton")
        return hc_head(rows, fn, sc, base, **EPS, impl="triton")

    alone = [head(i, 1) for i in range(T)]
    for n in range(2, T + 1):
        batch = head(0, n)
        for i in range(n):
            assert torch.equal(alone[i][0], batch[i]), (n, i)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [4, 256])
def test_gpu_kernels_per_call(T):
    from dsv4spec.bench.common import count_kernels

    x, fn, sc, base, nw = make_inputs(T, 7168, torch.bfloat16, "cuda")

    def compiled():
        with capture_mode():
            return hc_head(x, fn, sc, base, **EPS, impl="compiled")

    compiled()  # compile outside the profiled calls
    eager = count_kernels(lambda: hc_head(x, fn, sc, base, **EPS, impl="eager"))
    n_compiled = count_kernels(compiled)
    n_triton = count_kernels(lambda: hc_head(x, fn, sc, base, **EPS, impl="triton"))
    n_fused_norm = count_kernels(lambda: hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton"))
    assert n_triton <= 2 and n_fused_norm <= 2, (n_triton, n_fused_norm)
    assert count_kernels(lambda: torch.ops.dsv4spec.hc_head(x, fn, sc, base, 1e-6, 1e-6)) <= 2
    assert n_compiled < eager, (n_compiled, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
def test_gpu_cached_launch_equals_triton_dispatch(rmsnorm):
    """The cached compiled kernels (direct launches) give bit-identical output to Triton's own
    dispatch, across T, widths, an unaligned x view and large epsilons."""
    from dsv4spec.kernels.hc_head import _FINALIZE, _PARTIALS, _PARTIALS_MMA
    from dsv4spec.kernels.launch import LaunchCache

    def launches():
        return sum(c.direct_launches for c in (_PARTIALS, _PARTIALS_MMA, _FINALIZE))

    for H in (4096, 7168):
        for T in (1, 4, 64, 1024):
            for eps in ({"norm_eps": 1e-6, "hc_eps": 1e-6}, {"norm_eps": 0.25, "hc_eps": 1.0}):
                x, fn, sc, base, nw = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
                if T in (4, 1024):  # a view 2 bytes past an aligned address
                    x = torch.cat([x.flatten(), x.new_zeros(1)])[1:].view(T, 4, H)
                nw = nw if rmsnorm else None

                def call():
                    if nw is None:
                        return hc_head(x, fn, sc, base, **eps, impl="triton")
                    return hc_head_rmsnorm(x, fn, sc, base, nw, **eps, impl="triton")

                with LaunchCache.disabled():
                    expected = call()
                call()  # fills the cache
                direct = launches()
                out = call()
                assert launches() == direct + 2
                torch.cuda.synchronize()
                assert torch.equal(out, expected), (H, T, eps)


@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
@pytest.mark.parametrize("bad", [
    pytest.param(lambda: torch.zeros(1, dtype=torch.float64), id="float64"),
    pytest.param(lambda: torch.rand(2), id="shape 2"),
])
def test_checked_hc_scale_is_checked_again_after_new_storage(rmsnorm, bad):
    """hc_scale is remembered like the other weights; new storage of the wrong dtype or shape
    must be refused, naming it, instead of launching on it."""
    x, fn, sc, base, nw = make_inputs(2, 8, torch.float32)

    def call():
        if rmsnorm:
            return hc_head_rmsnorm(x, fn, sc, base, nw, **EPS, impl="triton")
        return hc_head(x, fn, sc, base, **EPS, impl="triton")

    call()  # remembered
    assert len(HC_HEAD_OPS._CHECKED_PARAMS) == 1, "the remembered check is what this tests"
    good = sc.data
    sc.data = bad()
    with pytest.raises(ValueError, match="hc_scale"):
        call()
    sc.data = good
    expected = (hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS) if rmsnorm
                else hc_head_reference(x, fn, sc, base, **EPS))
    assert_close(call(), expected, torch.float32)


@pytest.mark.parametrize("rmsnorm", [False, True], ids=["hc_head", "hc_head+rmsnorm"])
def test_parameters_take_the_remembered_check_and_match_plain_tensors(rmsnorm, monkeypatch):
    """A model holds its weights as nn.Parameter (SGLang does): they take the fast remembered
    check, not the full one, and give the same bits as plain tensors."""
    hc_head_ops = importlib.import_module("dsv4spec.ops.hc_head")  # the name is also the op's
    full_checks = []
    real_check = hc_head_ops._check_hc_head_inputs
    monkeypatch.setattr(hc_head_ops, "_check_hc_head_inputs",
                        lambda *a: full_checks.append(a) or real_check(*a))
    monkeypatch.setattr(hc_head_ops, "_CHECKED_PARAMS",
                        CheckedParams(hc_head_ops.CHECKED_PARAMS_LIMIT))
    x, fn, sc, base, nw = make_inputs(3, 64, torch.bfloat16)
    weights = (fn, sc, base, nw) if rmsnorm else (fn, sc, base)
    params = [torch.nn.Parameter(t.clone(), requires_grad=False) for t in weights]
    op = hc_head_rmsnorm if rmsnorm else hc_head
    for _ in range(2):
        ours = op(x, *params, norm_eps=1e-6, hc_eps=1e-6, impl="triton")
    assert full_checks == [] and len(hc_head_ops._CHECKED_PARAMS) == 1
    assert torch.equal(ours, op(x, *weights, norm_eps=1e-6, hc_eps=1e-6, impl="triton"))
