"""``mhc_post_pre(..., residual_out=...)``: the new residual written into a given tensor, in place
over ``residual`` as vLLM 0.34.0's reuse_residual boundary does above 32 tokens."""

import pytest
import torch

from dsv4spec.ops import mhc_post_pre

from .test_mhc import EPS, ITERS, make_inputs

# Interpreter-sized: a masked tail of the chunks; 33 tokens, vLLM's first in-place count.
SHAPES = [pytest.param(3, 40, id="T=3 H=40"), pytest.param(33, 40, id="T=33 H=40")]
# Every partials kernel the boundary plans on the GPU: CUDA cores (33-127 tokens), tensor cores
# with (t, i) rows (128-511), tensor cores with token rows (from 512), and their switches.
GPU_TOKENS = (33, 64, 65, 127, 128, 256, 511, 512, 1024, 4096)


def boundary_args(T, H, dtype, device="cpu", seed=0):
    x, fn, sc, base, nw, f = make_inputs(T, H, dtype, device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    post = (2 * torch.rand(T, 4, generator=g)).to(device)
    comb = torch.softmax(torch.randn(T, 4, 4, generator=g), -1).to(device)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
    return (f, x, post, comb, fn, sc, base), kw


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("T,H", SHAPES)
def test_in_place_gives_the_bits_of_a_new_residual(T, H, dtype, impl):
    args, kw = boundary_args(T, H, dtype)
    want = mhc_post_pre(*args, **kw, impl=impl)
    residual = args[1].clone()
    got = mhc_post_pre(args[0], residual, *args[2:], **kw, impl=impl, residual_out=residual)
    assert got[0].data_ptr() == residual.data_ptr() and got[0].shape == residual.shape
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


@pytest.mark.parametrize("T,H", SHAPES)
def test_a_separate_residual_out_is_written_and_residual_is_not(T, H):
    args, kw = boundary_args(T, H, torch.bfloat16)
    before = args[1].clone()
    out = torch.full_like(args[1], float("nan"))
    got = mhc_post_pre(*args, **kw, impl="triton", residual_out=out)
    assert got[0] is out and torch.equal(args[1], before)
    assert torch.equal(out, mhc_post_pre(*args, **kw, impl="triton")[0])


@pytest.mark.parametrize("case", ["shape", "dtype", "non-contiguous", "not a tensor",
                                  "overlaps residual"])
def test_a_residual_out_that_does_not_fit_is_refused_before_any_write(case):
    args, kw = boundary_args(3, 8, torch.bfloat16)
    storage = torch.randn(2 * args[1].numel()).bfloat16()
    residual = storage[:args[1].numel()].view(args[1].shape)
    residual.copy_(args[1])
    out = {"shape": lambda: torch.zeros(3, 4, 4, dtype=torch.bfloat16),
           "dtype": lambda: torch.zeros(3, 4, 8),
           "non-contiguous": lambda: torch.zeros(8, 4, 3, dtype=torch.bfloat16).transpose(0, 2),
           "not a tensor": lambda: [0.0],
           "overlaps residual": lambda: storage[5:5 + residual.numel()].view(residual.shape)}[
        case]()
    before = storage.clone()
    exc = TypeError if case == "not a tensor" else ValueError
    with pytest.raises(exc, match="residual_out"):
        mhc_post_pre(args[0], residual, *args[2:], **kw, impl="triton", residual_out=out)
    assert torch.equal(storage, before)


def test_in_place_on_cuda_is_refused_before_any_write_until_proven(monkeypatch):
    """Until the GPU test below has passed, residual_out=residual on a CUDA tensor is refused
    with a ValueError naming residual_out, before any launch (checked on a stand-in whose
    ``is_cuda`` is true: the refusal reads nothing else of the device)."""
    from dsv4spec.ops import mhc as mhc_ops

    assert mhc_ops.IN_PLACE_ON_CUDA is False
    args, kw = boundary_args(3, 40, torch.bfloat16)
    residual = args[1].clone()
    before = residual.clone()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    with pytest.raises(ValueError, match="residual_out: residual itself .* not yet proven on CUDA"):
        mhc_post_pre(args[0], residual, *args[2:], **kw, impl="triton", residual_out=residual)
    monkeypatch.undo()
    assert torch.equal(residual, before)


@pytest.mark.gpu
@pytest.mark.parametrize("H", [4096, 7168])
def test_gpu_in_place_gives_the_bits_of_a_new_residual(H, monkeypatch):
    """On the GPU, where another program or thread could read a slice after its new value was
    stored: each partials kernel reads a slice of the four streams and stores it back from the
    same threads, so in place is exact (bit for bit the out-of-place result). The proof
    ``IN_PLACE_ON_CUDA`` waits for."""
    from dsv4spec.ops import mhc as mhc_ops

    monkeypatch.setattr(mhc_ops, "IN_PLACE_ON_CUDA", True)
    for T in GPU_TOKENS:
        args, kw = boundary_args(T, H, torch.bfloat16, "cuda", seed=T)
        want = mhc_post_pre(*args, **kw)
        for _ in range(3):
            residual = args[1].clone()
            got = mhc_post_pre(args[0], residual, *args[2:], **kw, residual_out=residual)
            torch.cuda.synchronize()
            assert got[0].data_ptr() == residual.data_ptr()
            for i, (g, w) in enumerate(zip(got, want)):
                assert torch.equal(g, w), (T, i)
