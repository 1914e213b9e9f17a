"""The mHC benchmark's CPU-checkable parts: SGLang's mhc.py loaded by path over the stand-ins,
the signatures it is called with, bytes, inputs, output naming, the wide table and the plot."""

import inspect
import sys

import pytest
import torch

from dsv4spec.bench import mhc as bench
from dsv4spec.bench import sglang_mhc
from dsv4spec.integrations.sglang.source import sglang_root

from .conftest import ours_to_drop


def test_loader_finds_the_functions_with_their_signatures(sgl_mhc):
    params = {f: list(inspect.signature(getattr(sgl_mhc, f)).parameters)
              for f in ("mhc_pre", "mhc_post", "mhc_fused_post_pre")}
    assert params["mhc_pre"] == [
        "residual", "fn", "hc_scale", "hc_base", "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps",
        "hc_post_mult_value", "sinkhorn_repeat", "n_splits", "n_splits_pre", "norm_weight",
        "norm_eps"]
    assert params["mhc_post"] == ["x", "residual", "post_layer_mix", "comb_res_mix"]
    assert params["mhc_fused_post_pre"] == [
        "x", "residual", "post_layer_mix", "comb_res_mix", "fn", "hc_scale", "hc_base",
        "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat",
        "n_splits", "tile_n", "norm_weight", "norm_eps"]
    kw_only = inspect.signature(sgl_mhc.mhc_fused_post_pre).parameters["norm_weight"].kind
    assert kw_only is inspect.Parameter.KEYWORD_ONLY
    # the module is SGLang's own file, and its TileLang stays a lazy proxy until a kernel runs
    assert sgl_mhc.__file__.endswith("sglang/kernels/ops/layernorm/mhc.py")
    assert sgl_mhc._real_tilelang is None


def test_stubs_answer_as_sglang_defaults_with_deepgemm_off(sgl_mhc, monkeypatch):
    envs = sys.modules["sglang.srt.environ"].envs
    assert sys.modules["sglang.srt.environ"].__file__.endswith("sglang/srt/environ.py")
    assert envs.SGLANG_OPT_USE_TILELANG_MHC_PRE.get()
    assert envs.SGLANG_OPT_USE_TILELANG_MHC_POST.get()
    assert envs.SGLANG_OPT_FUSE_MHC_POST_PRE.get()
    assert envs.SGLANG_OPT_DEEPGEMM_HC_PRENORM.get()  # SGLang's default ...
    assert not sgl_mhc._use_deep_gemm_hc_prenorm()  # ... but DeepGEMM is not there
    assert sgl_mhc._use_tilelang_mhc_pre() and sgl_mhc._use_tilelang_mhc_post()
    assert not sgl_mhc._use_aiter_mhc() and not sgl_mhc._is_hip
    assert not sgl_mhc.is_dsa_prefill_cp_interleave()
    with sgl_mhc.use_symmetric_memory(sgl_mhc.get_parallel().tp_group, disabled=False):
        pass
    # an environment override reaches SGLang's own flag, as in a server
    monkeypatch.setenv("SGLANG_OPT_USE_TILELANG_MHC_PRE", "0")
    assert not sgl_mhc._use_tilelang_mhc_pre()
    # the stand-ins are empty packages: the real sglang is never imported through them
    with pytest.raises(ImportError):
        __import__("sglang.srt.models.deepseek_v4")


def test_install_stubs_keeps_existing_modules():
    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed")
    before = set(sys.modules)
    saved = {n: sys.modules.pop(n) for n in list(sys.modules)
             if n == "sglang" or n.startswith("sglang.")}
    mine = type(sys)("sglang.srt.utils")
    sys.modules["sglang.srt.utils"] = mine
    try:
        added = sglang_mhc.install_stubs()
        assert "sglang.srt.utils" not in added and sys.modules["sglang.srt.utils"] is mine
        assert not hasattr(mine, "is_hip")
        assert "sglang.srt.runtime_context" in added and "sglang.srt.environ" in added
    finally:
        for name in set(sys.modules) - before:
            if ours_to_drop(name):
                del sys.modules[name]
        sys.modules.update(saved)


def test_sglang_torch_fallbacks_agree_with_our_reference(sgl_mhc):
    """SGLang's own torch fallbacks (same file) and the model's reference: same layouts."""
    T, H = 3, 256
    inp = bench.make_inputs(T, H, seed=0, device="cpu")
    post, comb, y = sgl_mhc._mhc_pre_torch(inp["residual"], inp["fn"], inp["scale"], inp["base"],
                                           bench.RMS_EPS, bench.HC_EPS, bench.HC_EPS,
                                           bench.POST_MULT, bench.SINKHORN_ITERS)
    ours = bench.canonical("pre", bench.torch_pre(inp["residual"], inp, norm=False), T, H)
    theirs = bench.canonical("pre", (post, comb, y), T, H)
    for name in ("post", "comb"):
        torch.testing.assert_close(theirs[name], ours[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(theirs["input"].float(), ours["input"].float(), rtol=2**-7,
                               atol=1e-2)
    out = sgl_mhc._mhc_post_torch(inp["f"], inp["residual"], inp["post3"], inp["comb"])
    ref = bench.torch_provider("post", inp, norm=False)()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-2)


def test_sglang_provider_calls_match_the_signatures():
    calls = []

    class Peer:
        def __getattr__(self, name):
            fn = lambda *a, **k: calls.append((name, a, k))  # noqa: E731
            return fn

    inp = bench.make_inputs(2, 128, seed=1, device="cpu")
    for op in bench.OPS:
        bench.sglang_provider(Peer(), op, inp, norm=True)()
    (pre, pre_a, pre_k), (post, post_a, _), (fused, fused_a, fused_k) = calls
    assert (pre, post, fused) == ("mhc_pre", "mhc_post", "mhc_fused_post_pre")
    assert pre_a[4:] == (bench.RMS_EPS, bench.HC_EPS, bench.HC_EPS, 2.0, 20)
    assert fused_a[2].shape == (2, 4, 1) and fused_a[7:] == pre_a[4:]
    assert pre_k == fused_k == {"norm_weight": inp["norm_weight"], "norm_eps": bench.NORM_EPS}
    assert post_a[2].shape == (2, 4)


def test_ours_provider_binds_by_name_and_refuses_unknown_parameters():
    inp = bench.make_inputs(2, 128, seed=2, device="cpu")

    def mhc_pre(residual, fn, hc_scale, hc_base, *, rms_eps, hc_eps, sinkhorn_iters,
                post_mult=2.0, norm_weight=None, norm_eps=None):
        return locals()

    got = bench.ours_provider(mhc_pre, "pre", inp, norm=True)()
    assert got["residual"] is inp["residual"] and got["hc_base"] is inp["base"]
    assert got["sinkhorn_iters"] == 20 and got["norm_weight"] is inp["norm_weight"]
    assert bench.ours_provider(mhc_pre, "pre", inp, norm=False)()["norm_weight"] is None

    def odd(residual, mystery):
        return None

    with pytest.raises(TypeError, match="mystery"):
        bench.ours_provider(odd, "pre", inp, norm=True)


def test_canonical_names_outputs_in_any_order_and_layout():
    T, H = 3, 64
    r, p, c, y = (torch.randn(T, 4, H), torch.randn(T, 4, 1), torch.randn(T, 4, 4),
                  torch.randn(T, H))
    named = bench.canonical("post_pre", (c, y, p, r), T, H)
    assert named["post"].shape == (T, 4) and torch.equal(named["post"], p[..., 0])
    assert torch.equal(named["comb"], c) and torch.equal(named["residual"], r)
    assert torch.equal(named["input"], y)
    assert set(bench.canonical("post", r, T, H)) == {"residual"}
    with pytest.raises(RuntimeError):
        bench.canonical("post_pre", (r, y), T, H)


def test_reference_post_pre_is_post_then_pre():
    inp = bench.make_inputs(2, 128, seed=3, device="cpu")
    residual, post, comb, y = bench.torch_provider("post_pre", inp, norm=True)()
    torch.testing.assert_close(residual, bench.torch_provider("post", inp, True)())
    p2, c2, y2 = bench.torch_pre(residual, inp, norm=True)
    assert torch.equal(post, p2) and torch.equal(comb, c2) and torch.equal(y, y2)
    # comb is doubly stochastic, post in (0, 2)
    torch.testing.assert_close(inp["comb"].sum(-2), torch.ones(2, 4), atol=1e-4, rtol=0)
    assert (inp["post"] > 0).all() and (inp["post"] < 2).all()


def test_errors_and_check():
    ref = {"input": torch.tensor([1.0, -2.0])}
    errs = bench.max_errors({"input": torch.tensor([1.0, -2.02])}, ref)
    assert errs["input"] == pytest.approx(0.01)
    bench.check("x", errs)
    with pytest.raises(RuntimeError):
        bench.check("x", {"input": float("nan")})
    with pytest.raises(RuntimeError):
        bench.check("x", {"input": 0.05})


def test_bytes_moved():
    T, H = 4, 7168
    params = 24 * 4 * H * 4 + 27 * 4 + H * 2
    mixes = T * 20 * 4
    assert bench.bytes_moved("pre", T, H) == T * 4 * H * 2 + params + mixes + T * H * 2
    assert bench.bytes_moved("post", T, H) == T * H * 2 + 2 * T * 4 * H * 2 + mixes
    assert bench.bytes_moved("post_pre", T, H) == (
        bench.bytes_moved("post", T, H) + params + mixes + T * H * 2)
    assert bench.bytes_moved("pre", T, H) - bench.bytes_moved("pre", T, H, norm=False) == H * 2


def test_sglang_kernels_follow_its_thresholds():
    assert sglang_mhc.sglang_kernels("post_pre", 32, 7168).startswith("fma")
    assert sglang_mhc.sglang_kernels("post_pre", 33, 7168).startswith("post+gemm")
    assert sglang_mhc.sglang_kernels("pre", 2048, 4096).startswith("splitk")
    assert sglang_mhc.sglang_kernels("pre", 4096, 4096).startswith("gemm_sqrsum")
    assert sglang_mhc.sglang_kernels("post", 256, 7168) == "post(h_blocks=7)"
    assert sglang_mhc.sglang_kernels("post", 1024, 4096) == "post(h_blocks=1)"
    assert set(sglang_mhc.CALL_SITES) == {"mhc_pre", "mhc_post", "mhc_fused_post_pre"}


def _rows():
    rows = []
    for op in bench.OPS:
        for T in (1, 64):
            for p, g, e in (("sglang", 10.0, 40.0), ("ours", 5.0, 10.0), ("torch", 50.0, 400.0)):
                rows.append({"op": op, "H": 7168, "T": T, "provider": p, "graph_us": g * T ** .5,
                             "eager_us": e, "floor_us": 2.0})
    return rows


def test_wide_rows_and_plot(tmp_path):
    wide = bench.wide_rows(_rows())
    assert len(wide) == 6
    w = wide[0]
    assert w["ours_vs_sglang_graph"] == pytest.approx(2) and w["ours_vs_sglang_eager"] == 4
    assert w["ours_pct_floor"] == pytest.approx(40) and w["sglang_kernels"].startswith("splitk")
    assert set(bench.COLUMNS) >= {k for k in w if k in bench.COLUMNS}
    pytest.importorskip("matplotlib")
    path = tmp_path / "mhc.png"
    assert bench.plot(_rows(), path)
    assert path.stat().st_size > 0


def test_cli_registers_the_benchmark():
    from dsv4spec import cli

    assert cli.BENCHMARKS["mhc"] == "mhc"
