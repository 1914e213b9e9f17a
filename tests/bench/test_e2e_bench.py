"""The e2e benchmark on CPU: its forced acceptance (drafts from the reference, mismatches on
schedule) and the adapter that puts SGLang's mHC kernels into the layers of "sglang", checked
with a stand-in module computed by our float64 references."""

import inspect

import pytest
import torch

from dsv4spec.bench import e2e
from dsv4spec.bench.e2e import SCHEDULE, W, forced_drafts
from dsv4spec.engine import Request
from dsv4spec.model import preset
from dsv4spec.model.model import Layer, Transformer, init_weights
from dsv4spec.ops import mhc_post_pre_reference, mhc_post_reference, mhc_pre_reference

from ..model.runs import forward_and_draft


def test_forced_drafts_follow_the_reference_with_scheduled_mismatches():
    ref = list(range(100, 140))
    r = Request([1, 2, 3], 50)
    override = forced_drafts({id(r): ref}, vocab_size=1000)
    r.output = ref[:5]
    for k in SCHEDULE:
        drafts = override(r)
        expect = ref[5:5 + W - 1]
        assert len(drafts) == W - 1
        for i, (d, e) in enumerate(zip(drafts, expect)):
            assert (d != e) == (i == k), (k, drafts, expect)
    # past the reference's end: padded, never an index error
    r.output = ref[:39]
    assert len(override(r)) == W - 1


def test_a_mismatch_is_reported_not_raised():
    ref = [[5, 6, 7, 8], [1, 2, 3, 4]]
    assert e2e.compare_tokens([[5, 6], [1, 2, 3]], ref) == {
        "identical_to_greedy": True, "identical_requests": 2, "first_divergence": None}
    assert e2e.compare_tokens([[5, 6, 9], [1, 0, 3]], ref) == {
        "identical_to_greedy": False, "identical_requests": 0, "first_divergence": 1}
    assert e2e.compare_tokens([[5, 6, 7, 8, 9], [1, 2]], ref) == {  # past the reference
        "identical_to_greedy": False, "identical_requests": 1, "first_divergence": 4}


# ---------------------------------------------------------------------------------------------
# SGLang's mHC kernels in the layers: the adapter, its check, the fallback


class FakeSGLangMhc:
    """SGLang 0.5.23's ``mhc.py`` as the adapter sees it: its three functions' signatures,
    dtype asserts and output shapes (``post`` as ``[T, hc, 1]``), computed by our float64
    references on CPU. Stricter than SGLang in two places, to catch a wrong call: ``post``
    must come as SGLang's DSV4 passes it (``[T, hc, 1]``) and the Sinkhorn count as an int."""

    def __init__(self) -> None:
        self.calls = {"mhc_pre": 0, "mhc_fused_post_pre": 0, "mhc_post": 0}

    @staticmethod
    def _pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
             hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps):
        assert residual.dtype == torch.bfloat16 and fn.dtype == torch.float32
        assert isinstance(sinkhorn_repeat, int) and hc_pre_eps == hc_sinkhorn_eps
        if norm_weight is not None:  # SGLang's fused norm reads the weight as bf16
            norm_weight = norm_weight.bfloat16()
        post, comb, layer_input = mhc_pre_reference(
            residual, fn, hc_scale, hc_base, rms_eps=rms_eps, hc_eps=hc_pre_eps,
            sinkhorn_iters=sinkhorn_repeat, post_mult=hc_post_mult_value,
            norm_weight=norm_weight, norm_eps=norm_eps)
        return post.unsqueeze(-1), comb, layer_input

    def mhc_pre(self, residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                hc_post_mult_value, sinkhorn_repeat, n_splits=1, n_splits_pre=32, *,
                norm_weight=None, norm_eps=None):
        self.calls["mhc_pre"] += 1
        return self._pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                         hc_post_mult_value, sinkhorn_repeat, norm_weight, norm_eps)

    def mhc_post(self, x, residual, post_layer_mix, comb_res_mix):
        self.calls["mhc_post"] += 1
        assert post_layer_mix.shape == (*residual.shape[:-1], 1)
        return mhc_post_reference(x, residual, post_layer_mix.squeeze(-1), comb_res_mix)

    def mhc_fused_post_pre(self, x, residual, post_layer_mix, comb_res_mix, fn, hc_scale,
                           hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                           sinkhorn_repeat, n_splits=1, tile_n=1, *, norm_weight=None,
                           norm_eps=None):
        self.calls["mhc_fused_post_pre"] += 1
        assert x.dtype == residual.dtype == torch.bfloat16
        assert post_layer_mix.shape == (*residual.shape[:-1], 1)
        new = mhc_post_reference(x, residual, post_layer_mix.squeeze(-1), comb_res_mix)
        return (new, *self._pre(new, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
                                hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat,
                                norm_weight, norm_eps))


def test_the_stand_in_has_sglangs_own_signatures(sgl_mhc):
    # the adapter tests below hold only while the stand-in takes SGLang's parameters
    for name in ("mhc_pre", "mhc_post", "mhc_fused_post_pre"):
        real = inspect.signature(getattr(sgl_mhc, name)).parameters.values()
        fake = inspect.signature(getattr(FakeSGLangMhc(), name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in fake] == [
            (p.name, p.kind, p.default) for p in real], name


class SwappedOutputs(FakeSGLangMhc):
    """A module whose fused boundary answers in another order (comb before post)."""

    def mhc_fused_post_pre(self, *args, **kwargs):
        new, post, comb, layer_input = super().mhc_fused_post_pre(*args, **kwargs)
        return new, comb, post, layer_input


def boundary_inputs(T=5, H=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hc, mix = 4, 24
    residual = torch.randn(T, hc, H, generator=g).bfloat16()
    params = (torch.randn(mix, hc * H, generator=g) * 0.05, torch.rand(3, generator=g) + 0.5,
              torch.randn(mix, generator=g) * 0.5)
    post, comb, _ = mhc_pre_reference(torch.randn(T, hc, H, generator=g).bfloat16(), *params,
                                      rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20)
    f = torch.randn(T, H, generator=g).bfloat16()
    norm = (torch.rand(H, generator=g) + 0.5).bfloat16()
    return residual, params, post, comb, f, norm


def test_sglang_adapter_takes_and_returns_our_ops_shapes_and_orders():
    residual, params, post, comb, f, norm = boundary_inputs()
    # distinct constants, so a value passed in another position changes the result
    kw = dict(rms_eps=1e-5, hc_eps=1e-3, sinkhorn_iters=7)
    fake = FakeSGLangMhc()
    ops = e2e.SGLangMhc(fake)
    nkw = dict(norm_weight=norm, norm_eps=1e-4)

    got = ops.pre(residual, *params, **kw, **nkw)
    want = mhc_pre_reference(residual, *params, **kw, **nkw)
    assert [t.shape for t in got] == [(5, 4), (5, 4, 4), (5, 32)]
    for a, b in zip(got, want):
        assert torch.equal(a, b)

    got = ops.post_pre(f, residual, post, comb, *params, **kw, **nkw)
    want = mhc_post_pre_reference(f, residual, post, comb, *params, **kw, **nkw)
    assert [t.shape for t in got] == [(5, 4, 32), (5, 4), (5, 4, 4), (5, 32)]
    for a, b in zip(got, want):
        assert torch.equal(a, b)

    got = ops.post(f, residual, post, comb)
    assert torch.equal(got, mhc_post_reference(f, residual, post, comb))
    assert fake.calls == {"mhc_pre": 1, "mhc_fused_post_pre": 1, "mhc_post": 1}


def test_the_check_accepts_the_adapter_and_refuses_a_wrong_order():
    errors = e2e.check_mhc_implementation(e2e.SGLangMhc(FakeSGLangMhc()), 64, device="cpu")
    assert set(errors) == {"pre[0]", "pre[1]", "pre[2]", "post[0]", "post_pre[0]",
                           "post_pre[1]", "post_pre[2]", "post_pre[3]"}
    assert max(errors.values()) < 0.02
    with pytest.raises(RuntimeError, match="post_pre"):
        e2e.check_mhc_implementation(e2e.SGLangMhc(SwappedOutputs()), 64, device="cpu")


def test_sglang_mhc_falls_back_to_ours_when_it_cannot_load_or_run(monkeypatch):
    ops, detail = e2e.sglang_mhc_implementation(64, torch.bfloat16, device="cpu",
                                                load=FakeSGLangMhc)
    assert isinstance(ops, e2e.SGLangMhc) and "max error" in detail
    ops, detail = e2e.sglang_mhc_implementation(64, torch.float32, device="cpu",
                                                load=FakeSGLangMhc)
    assert ops is None and "bf16" in detail

    def missing():
        raise FileNotFoundError("no sglang/kernels/ops/layernorm/mhc.py")

    ops, detail = e2e.sglang_mhc_implementation(64, torch.bfloat16, device="cpu", load=missing)
    assert ops is None and "FileNotFoundError" in detail
    ops, detail = e2e.sglang_mhc_implementation(64, torch.bfloat16, device="cpu",
                                                load=SwappedOutputs)
    assert ops is None and "RuntimeError" in detail

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert e2e.sglang_mhc_implementation(64, torch.bfloat16, load=FakeSGLangMhc) == (
        None, "no CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(e2e.importlib.util, "find_spec", lambda name, *args: None)
    assert e2e.sglang_mhc_implementation(64, torch.bfloat16, load=FakeSGLangMhc) == (
        None, "TileLang is not installed")


def test_the_note_says_which_mhc_ran():
    note = e2e.sglang_mhc_note({"pro-shape": {"used": True, "detail": "SGLang 0.5.23"},
                                "flash-shape": {"used": False, "detail": "no CUDA device"}})
    assert "pro-shape: SGLang's own kernels (SGLang 0.5.23)" in note
    assert "flash-shape: our fused ops (no CUDA device)" in note
    assert e2e.sglang_mhc_note({}) == ""


@pytest.fixture(scope="module")
def bf16_model():
    return init_weights(Transformer(preset("tiny")), seed=4).requires_grad_(False).cast(
        torch.bfloat16)


def run_model(model):
    logits, draft_logits = forward_and_draft(model, seed=5, n=7)
    return logits.double(), draft_logits.double()


def test_every_layer_runs_sglang_mhc_within_the_block_and_its_own_after(bf16_model):
    model = bf16_model
    layers = [m for m in model.modules() if isinstance(m, Layer)]
    assert len(layers) == model.cfg.num_hidden_layers + len(model.mtp)
    marked = object()
    layers[0].mhc_implementation = marked  # a layer's own setting survives the block
    fake = FakeSGLangMhc()
    ops = e2e.SGLangMhc(fake)
    try:
        with pytest.raises(KeyError):  # restored on an error too
            with e2e.use_mhc_implementation(model, ops):
                assert all(m.mhc_implementation is ops for m in layers)
                raise KeyError
        assert layers[0].mhc_implementation is marked
        assert all("mhc_implementation" not in m.__dict__ for m in layers[1:])
    finally:
        del layers[0].mhc_implementation
    assert all(m.mhc_implementation is None for m in layers)

    default = run_model(model)
    with e2e.use_mhc_implementation(model, ops):
        plugged = run_model(model)
    count = len(layers)
    assert fake.calls == {"mhc_pre": count, "mhc_fused_post_pre": count, "mhc_post": count}
    for a, b in zip(plugged, default):
        assert torch.isfinite(a).all()
        # bf16 activations: float64 boundaries vs the default path's fp32, one rounding apart
        assert (a - b).norm() / b.norm() < 3e-2
    with e2e.use_mhc_implementation(model, None):  # None: nothing changes
        assert all(m.mhc_implementation is None for m in layers)
