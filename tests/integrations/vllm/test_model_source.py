"""vLLM 0.33.0's own model code, executed: ``DeepseekV4DecoderLayer.forward`` (every layer of
the target, the MTP block and the DSpark layers) and ``DeepSeekV4MultiTokenPredictor.
compute_logits`` compiled from vLLM's files into the stand-in model modules, on stand-in layers
(attention and FFN as cheap bf16 maps). Before registration they run vLLM's functions; after it,
dsv4spec's ops serve every mHC and hc_head call they make (the measured table extended to the
test width) and the results agree."""

import logging
from types import SimpleNamespace

import torch

from dsv4spec.integrations.vllm import register

from . import standins
from .test_hooks import (
    BF16_TOL,
    HC_EPS,
    HEAD_HC_EPS,
    HEAD_RMS_EPS,
    ITERS,
    NORM_EPS,
    RMS_EPS,
    launches,
    make_inputs,
    measure,
)

H = 128
CHAINED_F32_TOL = dict(rtol=2.0 ** -8, atol=2.0 ** -8)  # one bf16 ulp, relative
MODEL_FILE = "models/deepseek_v4/nvidia/model.py"
MTP_FILE = "models/deepseek_v4/nvidia/mtp.py"


def decoder_layer(t, seed=5):
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter

    def norm():
        return SimpleNamespace(weight=p((1 + 0.25 * torch.randn(H, generator=g)).bfloat16(),
                                        requires_grad=False), variance_epsilon=NORM_EPS)

    return SimpleNamespace(
        attn_norm=norm(), ffn_norm=norm(),
        hc_attn_fn=p(t["fn"], requires_grad=False), hc_attn_scale=p(t["hc_scale"],
                                                                     requires_grad=False),
        hc_attn_base=p(t["hc_base"], requires_grad=False),
        hc_ffn_fn=p(t["fn"].flip(0).contiguous(), requires_grad=False),
        hc_ffn_scale=p(t["hc_scale"].flip(0).contiguous(), requires_grad=False),
        hc_ffn_base=p(t["hc_base"].flip(0).contiguous(), requires_grad=False),
        rms_norm_eps=RMS_EPS, hc_eps=HC_EPS, hc_post_alpha=2.0, hc_sinkhorn_iters=ITERS,
        hc_attn_fn_broadcast=None, use_sequence_parallel=False,
        attn=lambda positions, x, _: (x.float() * 0.5 + 0.1).bfloat16(),
        ffn=lambda x, input_ids, meta: x.flip(-1).contiguous())


def test_vllms_decoder_layer_forward_runs_dsv4spec_ops_after_register(vllm, monkeypatch):
    for op in ("mhc_pre", "mhc_fused_post_pre"):
        measure(monkeypatch, op)
    forward = standins.vllm_method(vllm.model, MODEL_FILE, "DeepseekV4DecoderLayer", "forward")
    T = 2
    t = make_inputs(T, H)
    layer = decoder_layer(t)
    positions = torch.arange(T)

    def first(layer):  # the MTP block / a later pipeline rank: 3-D streams, no residual yet
        return forward(layer, t["residual"], positions, None)

    def later(layer, previous):  # any later layer, on the previous layer's outputs
        x, residual, post, comb = previous
        return forward(layer, x, positions, None, post, comb, residual)

    want_first = first(layer)
    want_later = later(layer, want_first)
    assert launches(vllm).count("big_fuse") == 4, "vLLM's pre and three boundaries ran"
    launches(vllm).clear()
    register()
    got_first, got_later = first(layer), later(layer, want_first)
    assert launches(vllm) == [], "dsv4spec's ops served every mHC call of vLLM's forward"
    # within one forward the sublayers chain (mhc_pre's bf16 input -> attention -> the
    # boundary), so a one-ulp bf16 difference moves the next float32 mixes by about that much
    for got, want in ((got_first, want_first), (got_later, want_later)):
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            tol = BF16_TOL if g.dtype == torch.bfloat16 else CHAINED_F32_TOL
            torch.testing.assert_close(g, w, **tol)


def test_vllms_mtp_compute_logits_runs_dsv4spec_hc_head_after_register(vllm, monkeypatch,
                                                                        caplog):
    measure(monkeypatch, "hc_head")
    T, vocab = 3, 16
    t = make_inputs(T, H)
    g = torch.Generator().manual_seed(7)
    norm_weight = (1 + 0.25 * torch.randn(H, generator=g)).bfloat16()

    def shared_head_rmsnorm(x, weight, eps):  # vLLM's fused Triton RMSNorm, in torch
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
                * weight.float()).bfloat16()

    vllm.mtp._MTP_SHARED_HEAD_RMSNORM_KERNEL = shared_head_rmsnorm
    compute_logits = standins.vllm_method(vllm.mtp, MTP_FILE, "DeepSeekV4MultiTokenPredictor",
                                          "compute_logits")
    layer = SimpleNamespace(
        hc_mult=4, config=SimpleNamespace(hidden_size=H), hc_head_fn=t["head_fn"],
        hc_head_scale=t["head_scale"], hc_head_base=t["head_base"], rms_norm_eps=HEAD_RMS_EPS,
        hc_eps=HEAD_HC_EPS, shared_head=SimpleNamespace(
            norm=SimpleNamespace(weight=norm_weight, variance_epsilon=NORM_EPS),
            head=torch.randn(vocab, H, generator=g).bfloat16()))
    predictor = SimpleNamespace(num_mtp_layers=1, mtp_start_layer_idx=61, layers={"61": layer},
                                logits_processor=lambda head, h: h.float() @ head.float().t())
    flat = t["residual"].flatten(1)  # the MTP forward's output: the flat pre-hc_head streams
    want = compute_logits(predictor, flat)
    assert launches(vllm) == ["hc_head"]
    launches(vllm).clear()
    with caplog.at_level(logging.WARNING):
        register()
    got = compute_logits(predictor, flat)
    assert launches(vllm) == []
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
