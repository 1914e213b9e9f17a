"""The mHC hooks' precompile: the launches it compiles are those the launchers make, at every
plan, and one count per plan loses no variant of any token count."""

import pytest
import torch

from dsv4spec.integrations import mhc_precompile as M
from dsv4spec.kernels import mhc as K
from dsv4spec.kernels.launch import LaunchCache
from dsv4spec.ops import mhc_post, mhc_post_pre, mhc_pre

TOKENS = range(1, 4097)  # every count up to the H200 tables' largest mHC count, both widths
WIDTHS = (4096, 7168)


@pytest.fixture
def h200_plans(monkeypatch):
    """The planner as on an H200 (132 SMs, programmatic dependent launches, tensor cores from
    128 bf16 tokens), also for the interpreter's device -1; its cache emptied around the test."""
    monkeypatch.setattr(K, "supports_pdl", lambda device_index: True)
    monkeypatch.setattr(K, "num_sms", lambda device_index: 132)
    monkeypatch.setattr(K, "interpreter_multiplies_bf16", lambda: True)
    K.plan.cache_clear()
    yield
    K.plan.cache_clear()


def _described(args):
    return tuple(("ptr", a.dtype) if hasattr(a, "data_ptr") else
                 "float" if isinstance(a, float) else a for a in args)


def _as_compiled(cache, grid, args, constexprs, options):
    return cache.kernel, grid, _described(args), tuple(constexprs.items()), \
        tuple(sorted(options.items()))


@pytest.fixture
def recorded(monkeypatch):
    """The launches the launchers make, recorded instead of run."""
    seen = []

    def launch(self, key, grid, args, constexprs, num_warps, num_stages=None, launch_pdl=False):
        options = {"num_warps": num_warps}
        if num_stages is not None:
            options["num_stages"] = num_stages
        if launch_pdl:
            options["launch_pdl"] = True
        seen.append(_as_compiled(self, grid, args, constexprs, options))

    monkeypatch.setattr(LaunchCache, "launch", launch)
    monkeypatch.setattr(LaunchCache, "get", lambda self, key: None)
    monkeypatch.setattr(K, "_DIRECT", {})
    return seen


def _run(op, T, H):
    """``op`` at T tokens as the vLLM hooks call it (bf16 streams, bf16 norm weight)."""
    bf, f32 = torch.bfloat16, torch.float32
    residual = torch.empty((T, 4, H), dtype=bf)
    x = torch.empty((T, H), dtype=bf)
    post, comb = torch.empty((T, 4), dtype=f32), torch.empty((T, 4, 4), dtype=f32)
    if op == "mhc_post":
        return mhc_post(x, residual, post, comb, impl="triton")
    fn = torch.zeros((24, 4 * H), dtype=f32)
    scale, base = torch.ones(3, dtype=f32), torch.zeros(24, dtype=f32)
    kwargs = dict(rms_eps=1e-6, hc_eps=1e-6, sinkhorn_iters=20, post_mult=2.0,
                  norm_weight=torch.ones(H, dtype=bf), norm_eps=1e-6, impl="triton")
    if op == "mhc_pre":
        return mhc_pre(residual, fn, scale, base, **kwargs)
    return mhc_post_pre(x, residual, post, comb, fn, scale, base, **kwargs)


@pytest.mark.parametrize("H", WIDTHS)
@pytest.mark.parametrize("op", M.OPS)
def test_the_precompiled_launches_are_the_launchers(h200_plans, recorded, op, H):
    """At one count of every plan (the counts the precompile compiles at), the launches it
    builds are those the op makes: kernel, grid, pointer dtypes, integer arguments, constexprs
    and options (the interpreter's device -1 planned as an H200, its math not CUDA's)."""
    sig = M.Signature(fast_math=False)
    for T in M.variant_tokens(op, TOKENS, H, -1, sig):
        recorded.clear()
        _run(op, T, H)
        assert recorded == [_as_compiled(*launch) for launch in M.launches(op, T, H, -1, sig)], \
            (op, T, H)


@pytest.mark.parametrize("H", WIDTHS)
@pytest.mark.parametrize("op", M.OPS)
def test_one_count_per_plan_compiles_every_variant(h200_plans, op, H):
    """The variants compiled at one count per plan are every variant any count launches."""
    every = {M.variant(launch) for T in TOKENS for launch in M.launches(op, T, H, 0)}
    tokens = M.variant_tokens(op, TOKENS, H, 0)
    assert M.variants(op, TOKENS, H, 0) == every
    plans = {(M.plan_of(op, T, H, 0), T == 1, T % 16 == 0) for T in TOKENS}
    assert len(tokens) <= len(plans) < len(TOKENS) // 10


def test_a_served_range_compiles_only_its_plans(h200_plans):
    """Counts the table does not serve compile nothing: the boundary up to 32 tokens (vLLM's
    DeepGEMM above) needs the plans of 1-32 alone."""
    small = M.variant_tokens("mhc_fused_post_pre", range(1, 33), 7168, 0)
    assert small == [T for T in M.variant_tokens("mhc_fused_post_pre", TOKENS, 7168, 0)
                     if T <= 32]


def test_the_interpreter_compiles_nothing(h200_plans, monkeypatch):
    calls = []
    monkeypatch.setattr(M, "variant_tokens", lambda *a: calls.append(a) or [])
    assert M.precompile("mhc_pre", TOKENS, 7168, -1) == 0
    assert M.precompile_mhc("mhc_pre", list(TOKENS), 7168, -1, M.Signature(), None) == 0
    assert calls == []


def test_spans_of():
    assert M.spans_of([1, 2, 3, 5, 9, 10]) == "1-3, 5, 9-10"
    assert M.spans_of([]) == ""


def test_the_vllm_doc_states_the_counts(h200_plans):
    """docs/vllm.md gives the H200's variant counts per width, as the code counts them."""
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
    readme = " ".join(doc.read_text().split())
    counts = {H: {op: len(M.variants(op, TOKENS, H, 0)) for op in M.OPS} for H in WIDTHS}
    pro, flash = counts[7168], counts[4096]
    assert (f"{sum(pro.values())} variants at H = 7168 (mhc_pre {pro['mhc_pre']}, the boundary "
            f"{pro['mhc_fused_post_pre']}, mhc_post {pro['mhc_post']}) and "
            f"{sum(flash.values())} at H = 4096 ({flash['mhc_pre']}, "
            f"{flash['mhc_fused_post_pre']}, {flash['mhc_post']})") in readme
    deep_gemm = {len(M.variants("mhc_fused_post_pre", range(1, 33), H, 0) | M.variants(
        "mhc_post", TOKENS, H, 0)) for H in WIDTHS}
    assert deep_gemm == {13} and "13 with DeepGEMM on" in readme
