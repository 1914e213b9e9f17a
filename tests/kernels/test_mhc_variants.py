"""The mHC kernels' tiling variants against the float64-backed reference: the finalize's split
sums as independent reductions or as tiles, fn loaded before everything else, the Sinkhorn at
1, 2 and 20 passes, the tensor-core partials, and calls that fill and then reuse a workspace."""

import pytest
import torch

from dsv4spec.kernels.mhc import mhc_post_pre_triton, mhc_pre_triton
from dsv4spec.ops import mhc_post_pre_reference, mhc_pre_reference
from tests.ops.test_mhc import (
    EPS,
    assert_boundary_close,
    assert_close,
    assert_pre_close,
    make_inputs,
)

VARIANTS = [
    pytest.param({"vector_sums": True}, id="vector sums"),
    pytest.param({"vector_sums": False}, id="tile sums"),
    pytest.param({"vector_sums": True, "prefetch_fn": True}, id="vector sums, fn first"),
    pytest.param({"prefetch_fn": True, "block_k": 16}, id="tile sums, fn first, 16-wide"),
]


def _pre_and_boundary(T, H, dtype, rmsnorm, iters, eps, **tiling):
    x, fn, sc, base, nw, f = make_inputs(T, H, dtype, seed=T + H)
    kw = {**eps, "sinkhorn_iters": iters}
    if rmsnorm:
        kw.update(norm_weight=nw, norm_eps=1e-6)
    args = (eps["rms_eps"], eps["hc_eps"], iters, 2.0, kw.get("norm_weight"),
            1e-6 if rmsnorm else 0.0)
    got = mhc_pre_triton(x, fn, sc, base, *args, **tiling)
    assert_pre_close(got, mhc_pre_reference(x, fn, sc, base, **kw), dtype, 2)
    post, comb, _ = got
    fused = mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *args, **tiling)
    ref = mhc_post_pre_reference(f, x, post, comb, fn, sc, base, **kw)
    assert_close(fused[0], ref[0], dtype, what="residual'")
    assert_pre_close(fused[1:], ref[1:], dtype, 2)


@pytest.mark.parametrize("tiling", VARIANTS)
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["plain", "rmsnorm"])
def test_finalize_and_partials_variants(tiling, rmsnorm):
    _pre_and_boundary(3, 100, torch.bfloat16, rmsnorm, 20, EPS, **tiling)


@pytest.mark.parametrize("iters", [1, 2, 20])
@pytest.mark.parametrize("vector_sums", [False, True], ids=["tile sums", "vector sums"])
def test_sinkhorn_passes(iters, vector_sums):
    _pre_and_boundary(2, 40, torch.float32, True, iters, {"rms_eps": 0.25, "hc_eps": 1.0},
                      vector_sums=vector_sums)


@pytest.mark.parametrize("tiling", [
    pytest.param({"mma": True, "block_k": 32}, id="16 tokens, 32-wide chunks, one per split"),
    pytest.param({"mma": True, "block_k": 16, "num_splits": 2, "block_t": 32},
                 id="32 tokens, 16-wide chunks, 4 per split"),
    pytest.param({"mma": True, "token_rows": True, "presplit": True, "block_t": 16,
                  "block_k": 32}, id="token rows, fn split first, one chunk per split"),
    pytest.param({"mma": True, "token_rows": True, "presplit": False, "block_t": 16,
                  "block_k": 16, "num_splits": 2},
                 id="token rows, fn split per chunk, 4 per split"),
])
@pytest.mark.parametrize("rmsnorm", [False, True], ids=["plain", "rmsnorm"])
def test_tensor_core_partials(tiling, rmsnorm):
    # 17 tokens: a second token block almost all past T; H = 100 leaves masked chunk tails
    _pre_and_boundary(17, 100, torch.bfloat16, rmsnorm, 20, EPS, **tiling)


def test_prefill_defaults():
    # the planner's own tiling from MMA_MIN_TOKENS: mhc_pre's token rows with fn split first and
    # the wide finalize blocks (one 2048-wide block, mostly masked, at H = 100), the boundary's
    # rows (t, i); 130 tokens leave a second token block almost all past T
    from dsv4spec.kernels import mhc as K

    cfg = K.plan(130, 100, -1, dtype=torch.bfloat16)
    assert cfg.mma and cfg.token_rows and cfg.presplit and cfg.block_h == 2048
    _pre_and_boundary(130, 100, torch.bfloat16, True, 20, EPS)


def test_tensor_core_partials_planned_for_bf16_prefill_only():
    from dsv4spec.kernels import mhc as K

    assert K.plan(K.MMA_MIN_TOKENS, 7168, -1, dtype=torch.bfloat16).mma
    assert not K.plan(K.MMA_MIN_TOKENS - 1, 7168, -1, dtype=torch.bfloat16).mma
    assert not K.plan(4096, 7168, -1, dtype=torch.float32).mma


def test_pre_plans_token_rows_and_the_boundary_rows_t_i_then_token_rows():
    from dsv4spec.kernels import mhc as K

    pre = K.plan(4096, 7168, -1, dtype=torch.bfloat16)
    assert pre.token_rows and pre.presplit and pre.chunks_per_split > 1
    for T in (K.MMA_MIN_TOKENS, K.BOUNDARY_TOKEN_ROWS_MIN_TOKENS - 1):
        boundary = K.plan(T, 7168, -1, dtype=torch.bfloat16, boundary=True)
        assert boundary.mma and not boundary.token_rows and not boundary.presplit
    for T in (K.BOUNDARY_TOKEN_ROWS_MIN_TOKENS, 4096):  # fn split per chunk: no split launch
        boundary = K.plan(T, 7168, -1, dtype=torch.bfloat16, boundary=True)
        assert boundary.mma and boundary.token_rows and not boundary.presplit
        assert (boundary.block_k, boundary.stages) == (16, 3)


def test_pre_finalize_takes_wide_blocks_up_to_its_bound():
    from dsv4spec.kernels import mhc as K

    assert K.plan(256, 7168, -1, dtype=torch.bfloat16).block_h == 2048
    assert K.plan(1024, 4096, -1, dtype=torch.bfloat16).block_h == 2048
    assert K.plan(1024, 7168, -1, dtype=torch.bfloat16).block_h == 512
    assert K.plan(K.MMA_MIN_TOKENS, 7168, -1, dtype=torch.bfloat16).block_h == 1024
    assert K.plan(256, 7168, -1, dtype=torch.bfloat16, boundary=True).block_h == 512


@pytest.mark.gpu
@pytest.mark.parametrize("tiling", [
    pytest.param({}, id="defaults"),
    pytest.param({"wait": True, "pdl": True, "vector_sums": True}, id="dependent partials"),
    pytest.param({"wait": False, "vector_sums": False}, id="first generation"),
])
def test_gpu_decode_paths_back_to_back(tiling):
    # calls chained on one stream, each reading the previous call's outputs: a dependent launch
    # that read its inputs before the previous launch finished would show here. Each boundary
    # as assert_boundary_close checks it: its new residual within an ulp of the float64 post of
    # its inputs (a post or comb read before the previous finalize wrote it, or a residual read
    # before it was written, is far off), and its pre against the float64 pre of that residual
    # (a pre of the old residual, or of a half-written new one, is far off). Not the pre of the
    # reference's own residual: where the fp32 mix lands on a bf16 rounding tie the kernel's
    # residual takes the other neighbour, and how the compiler contracts the mix into fmas
    # decides which elements do (Triton 3.6 and 3.8 differ in one of them per thread here).
    x, fn, sc, base, nw, f = make_inputs(4, 7168, torch.bfloat16, "cuda", seed=4)
    args = (EPS["rms_eps"], EPS["hc_eps"], 20, 2.0, nw, 1e-6)
    post, comb, _ = mhc_pre_triton(x, fn, sc, base, *args, **tiling)
    kw = {**EPS, "sinkhorn_iters": 20, "norm_weight": nw, "norm_eps": 1e-6}
    for _ in range(3):
        fused = mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *args, **tiling)
        assert_boundary_close(fused, f, x, post, comb, fn, sc, base, kw, 2)
        x, post, comb, f = fused  # the next boundary's sublayer output: this one's input


def test_boundary_check_catches_a_stale_or_partly_written_residual():
    # what test_gpu_decode_paths_back_to_back rests on, without a GPU: assert_boundary_close
    # rejects a boundary whose pre is of the previous residual, whose residual is partly the
    # previous one (a launch that read or wrote too early) or whose post and comb are stale
    x, fn, sc, base, nw, f = make_inputs(4, 7168, torch.bfloat16, seed=4)
    kw = {**EPS, "sinkhorn_iters": 20, "norm_weight": nw, "norm_eps": 1e-6}
    post, comb, _ = mhc_pre_reference(x, fn, sc, base, **kw)
    good = mhc_post_pre_reference(f, x, post, comb, fn, sc, base, **kw)
    assert_boundary_close(good, f, x, post, comb, fn, sc, base, kw, 2)
    stale_pre = (good[0], *mhc_pre_reference(x, fn, sc, base, **kw))
    half = good[0].clone()
    half[:, :, : 7168 // 2] = x[:, :, : 7168 // 2]
    cases = {"pre of the old residual": stale_pre,
             "half-written residual": (half, *good[1:]),
             "stale post and comb": (good[0], post, comb, good[3])}
    for what, bad in cases.items():
        with pytest.raises(AssertionError):
            assert_boundary_close(bad, f, x, post, comb, fn, sc, base, kw, 2)
            pytest.fail(what)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [128, 300, 4096])
def test_gpu_tensor_core_partials(T):
    _pre_and_boundary_on("cuda", T, 7168, seed=T)
    # the second call of a shape launches the cached kernels directly (fn's split included)
    _pre_and_boundary_on("cuda", T, 7168, seed=T + 1)


def _pre_and_boundary_on(device, T, H, seed, **tiling):
    # the boundary's pre against the float64 pre of its own new residual (assert_boundary_close):
    # where the fp32 mix lands on a bf16 rounding tie the residual takes the other neighbour,
    # and the reference's own residual would charge the pre with that step (~1e-5 of post)
    x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16, device, seed=seed)
    kw = {**EPS, "sinkhorn_iters": 20, "norm_weight": nw, "norm_eps": 1e-6}
    args = (EPS["rms_eps"], EPS["hc_eps"], 20, 2.0, nw, 1e-6)
    got = mhc_pre_triton(x, fn, sc, base, *args, **tiling)
    assert_pre_close(got, mhc_pre_reference(x, fn, sc, base, **kw), torch.bfloat16, 2)
    fused = mhc_post_pre_triton(f, x, got[0], got[1], fn, sc, base, *args, **tiling)
    assert_boundary_close(fused, f, x, got[0], got[1], fn, sc, base, kw, 2)


def test_presplit_is_never_planned_at_one_64_wide_chunk_per_split():
    # the tiling that gave wrong sums on the H200 (docs/design.md, mHC, tensor-core partials)
    from dsv4spec.kernels import mhc as K

    cfg = K.plan(4096, 7168, -1, dtype=torch.bfloat16, block_k=64, num_splits=112, presplit=True)
    assert cfg.chunks_per_split == 1 and cfg.token_rows and not cfg.presplit
    cfg = K.plan(4096, 7168, -1, dtype=torch.bfloat16, block_k=32, num_splits=224, presplit=True)
    assert cfg.chunks_per_split == 1 and cfg.presplit


@pytest.mark.parametrize("version,block_t", [("3.6.0", 8), ("3.8.0", 4), ("3.8.1+git0a1b2c", 4),
                                             ("4.0.0", 4)])
@pytest.mark.parametrize("H", [4096, 7168])
def test_boundary_tiles_9_to_16_tokens_by_triton_release(version, block_t, H, monkeypatch):
    # from SMALL_BLOCKS_FROM_TRITON the boundary's partials at 9-16 tokens take 4-token blocks;
    # everything else (other T, mhc_pre, Triton 3.6) keeps its tiling
    import triton

    from dsv4spec.kernels import mhc as K

    def tiles(T, boundary=True):
        return K._config(T, H, 132, device_index=0, dtype=torch.bfloat16, boundary=boundary)

    monkeypatch.setattr(K, "supports_pdl", lambda device_index: True)  # an H200's answer
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    before = {T: tiles(T) for T in range(1, 33)}
    pre = {T: tiles(T, boundary=False) for T in range(1, 33)}
    monkeypatch.setattr(triton, "__version__", version)
    assert K.triton_release() == tuple(int(v) for v in version.split(".")[:2])
    for T in range(1, 33):
        cfg = tiles(T)
        if 8 < T <= 16:
            assert cfg == before[T]._replace(block_t=block_t), T
            assert before[T].block_t == 8 and cfg.num_splits == before[T].num_splits
        else:
            assert cfg == before[T], T
        assert tiles(T, boundary=False) == pre[T], T
