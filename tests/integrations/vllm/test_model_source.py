"""Each supported vLLM's own model code, executed: ``DeepseekV4DecoderLayer.forward`` (every
layer of the target, the MTP block and the DSpark layers), ``DeepseekV4Model.forward`` (the
target's layers in a row: on 0.34.0 with ``reuse_residual=True``, so through
``mhc_fused_post_pre_tilelang_reuse_residual``) and ``DeepSeekV4MultiTokenPredictor.
compute_logits`` compiled from vLLM's files into the stand-in model modules, on stand-in layers
(attention and FFN as cheap bf16 maps). Before registration they run vLLM's functions; after it,
dsv4spec's ops serve every mHC and hc_head call they make (the measured table extended to the
test width) and the results agree."""

import logging
from itertools import islice
from types import SimpleNamespace

import pytest
import torch

from dsv4spec.integrations.vllm import plugin, register

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


class _Layer:
    """A stand-in decoder layer whose call runs vLLM's own ``DeepseekV4DecoderLayer.forward``."""

    def __init__(self, forward, parts):
        self.forward = forward
        self.__dict__.update(vars(parts))

    def __call__(self, *args, **kwargs):
        return self.forward(self, *args, **kwargs)


@pytest.mark.parametrize("T", [2, 33], ids=["T=2 fused kernel", "T=33 post+GEMM"])
def test_vllms_model_forward_runs_dsv4spec_ops_at_every_boundary_after_register(
        vllm, monkeypatch, vllm_source, T):
    """``DeepseekV4Model.forward`` on a later pipeline rank (the streams come in as
    ``intermediate_tensors``): the first layer's mhc_pre and boundaries, the later layers'
    boundaries (0.34.0: ``reuse_residual=True``, vLLM's post + GEMM path then writes the
    residual in place above 32 tokens), the final mhc_post and hc_head. After registration
    dsv4spec's ops serve every one of them, and the results agree with vLLM's."""
    for op in ("mhc_pre", "mhc_fused_post_pre", "mhc_post", "hc_head"):
        measure(monkeypatch, op)
    forward = standins.vllm_method(vllm.model, MODEL_FILE, "DeepseekV4DecoderLayer", "forward")
    model_forward = standins.vllm_method(vllm.model, MODEL_FILE, "DeepseekV4Model", "forward")
    monkeypatch.setattr(vllm.model, "islice", islice, raising=False)
    monkeypatch.setattr(vllm.model, "get_pp_group", lambda: SimpleNamespace(
        is_first_rank=False, is_last_rank=True), raising=False)
    t = make_inputs(T, H)
    layers = [_Layer(forward, decoder_layer(t, seed=5 + i)) for i in range(2)]
    g = torch.Generator().manual_seed(11)
    norm_weight = (1 + 0.25 * torch.randn(H, generator=g)).bfloat16()

    def norm(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + NORM_EPS)
                * norm_weight.float()).bfloat16()

    model = SimpleNamespace(
        layers=layers, start_layer=0, end_layer=len(layers), aux_hidden_state_layers=(),
        use_native_mega_moe=False, use_sequence_parallel=False, _mtp_hidden_buffer=None,
        collect_remote_aux_hidden_states=lambda intermediate: [],
        hc_head_fn=t["head_fn"], hc_head_scale=t["head_scale"], hc_head_base=t["head_base"],
        rms_norm_eps=HEAD_RMS_EPS, hc_eps=HEAD_HC_EPS, norm=norm)
    positions = torch.arange(T)
    reuse = "reuse_residual=True" in str(vllm_source_of_model_forward())

    def run():
        streams = t["residual"].clone()  # the previous rank's output, which this rank owns
        out = model_forward(model, None, positions, {"hidden_states": streams})
        return out, streams

    (want, streams), calls = run(), list(launches(vllm))
    assert calls.count("big_fuse") == 2 * len(layers), "vLLM's pre and boundaries ran"
    assert calls[-1] == "hc_head"
    launches(vllm).clear()
    register()
    served = {}
    for name, guard in plugin.installed().items():  # count the calls each hook receives
        monkeypatch.setattr(guard, "fast", _counting(guard.fast, served, name))
    got, streams = run()
    assert launches(vllm) == [], "dsv4spec's ops served every mHC and hc_head call"
    boundaries = 2 * len(layers) - 1
    # 0.34.0: the first layer starts from residual = x (not handed over), so its one boundary
    # keeps mhc_fused_post_pre_tilelang; every later one is the reuse_residual boundary
    assert served == ({"mhc_pre": 1, "mhc_fused_post_pre": 1, "mhc_post": 1, "hc_head": 1,
                       "mhc_fused_post_pre_reuse_residual": boundaries - 1} if reuse else
                      {"mhc_pre": 1, "mhc_fused_post_pre": boundaries, "mhc_post": 1,
                       "hc_head": 1})
    assert torch.equal(streams, t["residual"]), "the first layer never overwrites its input"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)


def _counting(fast, served, name):
    def counted(*args, **kwargs):
        served[name] = served.get(name, 0) + 1
        return fast(*args, **kwargs)

    return counted


def vllm_source_of_model_forward():
    import ast

    tree = ast.parse(standins.vllm_file(MODEL_FILE).read_text())
    node = next(n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "DeepseekV4Model"
                for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    return ast.unparse(node)
