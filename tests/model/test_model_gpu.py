"""GPU: the pro-shape model's decode and verify steps replayed from a CUDA graph equal eager."""

import pytest
import torch

from dsv4spec.capture import capture_mode


@pytest.mark.gpu
@pytest.mark.parametrize("W", [pytest.param(1, id="decode"), pytest.param(4, id="verify")])
def test_gpu_pro_shape_graph_replay_equals_eager(W):
    from dsv4spec.model.build import build_model

    model = build_model("pro-shape", device="cuda", dtype=torch.bfloat16)
    bs, context = 3, 150  # crosses a ratio-128 block end and many ratio-4 ones
    state = model.new_state(num_slots=4, max_seq_len=256, max_num_draft_tokens=4)
    g = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.tensor([3, 0, 1], device="cuda")
    starts = torch.zeros(bs, dtype=torch.long, device="cuda")
    prompt = torch.randint(0, model.cfg.vocab_size, (bs, context), device="cuda", generator=g)
    model(prompt, state, slots, starts, starts + torch.tensor([150, 131, 127], device="cuda"))
    starts = torch.tensor([150, 131, 127], device="cuda")
    toks = torch.randint(0, model.cfg.vocab_size, (bs, W), device="cuda", generator=g)
    lengths = torch.tensor([W, W, 1], device="cuda")  # the last row: padding beyond 1 token

    def step():
        return model(toks, state, slots, starts, lengths)[0]

    with capture_mode():
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
    for seed in (1, 2):  # new tokens in the static input: replay vs eager
        toks.copy_(torch.randint(0, model.cfg.vocab_size, (bs, W), device="cuda",
                                 generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        with capture_mode():  # the same kernels (mHC Inductor-compiled), launched eagerly
            same_kernels = step()
        plain = step()  # mHC eager: other fp32 rounding, amplified over 61 random bf16 layers
        for b, n in enumerate(lengths.tolist()):
            a = out[b, :n].float()
            assert torch.isfinite(a).all()
            e = same_kernels[b, :n].float()
            assert (a - e).norm() / e.norm() < 1e-3, (b, seed, "replay vs eager, same kernels")
            e = plain[b, :n].float()
            assert (a - e).norm() / e.norm() < 5e-2, (b, seed, "replay vs plain eager")


def flash_shape_verify(dtype):
    """The flash-shape model after a 40-token prompt for 2 requests: a call that runs the verify
    of 4 new tokens each, returning the model's (logits, streams)."""
    from dsv4spec.model.build import build_model

    model = build_model("flash-shape", device="cuda", dtype=dtype)
    bs, W, context = 2, 4, 40
    state = model.new_state(num_slots=bs, max_seq_len=64, max_num_draft_tokens=4)
    g = torch.Generator(device="cuda").manual_seed(0)
    slots = torch.arange(bs, device="cuda")
    zeros = torch.zeros(bs, dtype=torch.long, device="cuda")
    prompt = torch.randint(0, model.cfg.vocab_size, (bs, context), device="cuda", generator=g)
    model(prompt, state, slots, zeros, zeros + context)
    toks = torch.randint(0, model.cfg.vocab_size, (bs, W), device="cuda", generator=g)
    return lambda: model(toks, state, slots, zeros + context, zeros + W)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [pytest.param(torch.float32, 1e-4, id="fp32"),
                                       pytest.param(torch.bfloat16, 5e-2, id="bf16")])
def test_gpu_fused_mhc_ops_match_hc_pre_and_hc_post(dtype, tol):
    # The layers cross their boundaries through mhc_pre / mhc_post_pre / mhc_post on CUDA; the
    # same step through the pure hc_pre / hc_post (and the separate RMSNorms) gives the same
    # logits to the dtype's rounding, amplified over the random layers.
    from dsv4spec.model.model import Layer
    from dsv4spec.timing import count_kernels

    forward = flash_shape_verify(dtype)

    def step():
        return forward()[0].float()

    try:
        Layer.mhc_ops = False
        plain, plain_kernels = step(), count_kernels(step)
        Layer.mhc_ops = True
        fused, fused_kernels = step(), count_kernels(step)
    finally:
        Layer.mhc_ops = True
    assert torch.isfinite(fused).all()
    assert (fused - plain).norm() / plain.norm() < tol
    assert fused_kernels < plain_kernels


@pytest.mark.gpu
def test_gpu_fused_tail_matches_the_separate_post_hc_head_and_norm():
    # The target's last post, hc_head and final norm as one mhc_post_head (2 launches) give the
    # separate ops' logits to bf16 rounding, with fewer kernels per step.
    from dsv4spec.model.model import Transformer
    from dsv4spec.timing import count_kernels

    forward = flash_shape_verify(torch.bfloat16)

    def step():
        logits, streams = forward()
        return logits.float(), streams

    try:
        Transformer.fused_tail = False
        (separate, separate_streams), separate_kernels = step(), count_kernels(step)
        Transformer.fused_tail = True
        (fused, fused_streams), fused_kernels = step(), count_kernels(step)
    finally:
        Transformer.fused_tail = True
    assert torch.isfinite(fused).all()
    assert torch.equal(fused_streams, separate_streams)  # the post's bits, as mhc_post's
    assert (fused - separate).norm() / separate.norm() < 1e-2
    assert fused_kernels < separate_kernels, (fused_kernels, separate_kernels)
