"""Fused mHC boundary ops for hc_mult = 4: ``mhc_pre``, ``mhc_post`` and ``mhc_post_pre``.

``mhc_pre`` is 2 launches (3 from ``MMA_MIN_TOKENS`` bf16 tokens, below). Launch 1 (partials),
grid = token blocks x K-splits, on CUDA cores in fp32: each program reads BLOCK_T tokens over one
BLOCK_K-wide range of h (at T <= 32 one chunk per program: ~every SM reads one slice of ``fn``
once) for the 4 streams and the matching
columns of all 24 rows of ``fn``, accumulates the products as FMAs into one [BLOCK_T, 32,
BLOCK_K] tile (rows padded to 32) and reduces it once at the end; it writes, per token, fp32
partial sums: the 24 dot products ``xf @ fn.T``, the diagonal of the streams' Gram matrix
``G_ij = sum_h x_i[h] x_j[h]`` (its trace is ``sum(xf^2)``) and, with the sublayer RMSNorm, the 6
off-diagonal entries. fp32 FMAs and a split-K tree keep the dots ~1e-7 off float64. Launch 2
(finalize), grid = tokens x (1 + H-blocks), one warp each: the first program of a token reduces
the partials that ``post`` and ``comb`` need and runs the sigmoids and the Sinkhorn on 16
scalars in registers; the others reduce only r's and the pre weights' (and the Gram sums) and
write their H-block of ``y = sum_i pre_i x_i``. The RMSNorm's ``sum_h y^2 = w^T G w`` is known
before any y is formed, so the norm costs 6 more reductions, not another pass. Where the time
goes, launch by launch: docs/design.md (mHC) and benchmarks/results/mhc/mhc_probe.json.

``mhc_post_pre`` (one layer boundary) is the same 2 launches: launch 1 first forms its slice of
the new residual ``x'_j = post_j f + sum_i comb[i, j] x_i``, rounds it to the stream dtype, stores
it and accumulates the partials from those rounded values (what a separate post then pre sees).
``mhc_post`` alone is one launch over (tokens, H-blocks), elementwise with 20 scalar weights.
The model tail (``mhc_post_head_triton``: the last layer's post, hc_head and the final norm) is
the boundary's 2 launches over hc_head's 4 rows up to ``TAIL_FUSED_MAX_TOKENS``, and
``mhc_post`` then hc_head's own launches above.

Batch invariance: up to ``INVARIANT_MAX_TOKENS`` tokens one tiling, and T not specialised, so a
token gets the same bits alone (decode) as inside the verify of its drafts; above, the tiling
follows T (docs/design.md, mHC, batch invariance).

Second generation (defaults from benchmarks/results/mhc/mhc_sweep.json): up to
``WAIT_MAX_TOKENS`` the partials are themselves a programmatic dependent launch that loads its fn
columns (a weight) before it waits for the previous kernel, and the finalize lets the next launch
start at once; the finalize's split sums are independent one-axis reductions where the splits
are many; ``mhc_post`` is a dependent launch. From ``MMA_MIN_TOKENS`` bf16 tokens the partials run
on tensor cores (fn in three bf16 parts); post and comb stay within 1e-5 of float64 relative to
their largest value, as on CUDA cores (the GPU tests at 128-4096 tokens). ``mhc_pre``'s take
tokens as the tile's rows, each stream's tile times its own columns of fn, which a launch of its
own first splits into bf16 parts (``_split_fn_kernel``); the boundary's take rows (t, i) against
every stream's columns and keep a quarter of the products, and from
``BOUNDARY_TOKEN_ROWS_MIN_TOKENS`` token rows too, the new residual formed in registers as the
row tile (fn split per chunk): its mix is written as explicit fmas so that the copy the tensor
cores read and the copy stored carry the same bits (docs/design.md, mHC).

Bytes (bf16, H = 7168, T = 4): ``fn`` is 24 x 28672 fp32 = 2.75 MB, a different tensor per layer,
so it dominates; the partials spread it over 112 programs (one HBM round trip for the whole
GPU). x is 229 KB, the boundary's new residual another 229 KB written and read back from L2.
On sm_90+ up to ``PDL_MAX_TOKENS`` tokens the finalize is a programmatic dependent launch: it
loads x and its parameters while the partials run, and lets the next launch start before its own
wait (``FINALIZE_EARLY_RELEASE``: why that is safe).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice

from dsv4spec.kernels import on_rocm
from dsv4spec.kernels.device import (
    cdiv,
    interpreter_multiplies_bf16,
    load_pre_params,
    load_streams,
    mix_rstd,
    next_power_of_2,
    num_sms,
    round_to,
    split_bf16x3,
    store_token_grams,
    supports_pdl,
)
from dsv4spec.kernels.hc_head import hc_head_triton
from dsv4spec.kernels.launch import LaunchCache, alignment_key
from dsv4spec.kernels.workspace import WorkspaceCache

HC = 4
NMIX = (2 + HC) * HC  # 24 rows of fn: pre 0-3, post 4-7, comb 8-23
SLOT_DIAG = NMIX  # ws slots 24-27: diagonal of G; 28-33: (01, 02, 03, 12, 13, 23)
# The finalize as a programmatic dependent launch up to this many tokens (hc_head's bound)
PDL_MAX_TOKENS = 16
# The partials as a programmatic dependent launch that loads fn before it waits, up to this many
# tokens (with PDL)
WAIT_MAX_TOKENS = 8
# mhc_post as a programmatic dependent launch on sm_90+: 0.2-2.6 us faster at every measured T
# (benchmarks/results/mhc/mhc_sweep.json)
POST_PDL = True
# The finalize (a programmatic dependent launch) lets the next launch start before its own wait.
# Safe for any dependent that reads earlier launches' output only after its wait: launch 1 starts
# releasing only once everything before the op has ended (it releases after its own wait, or is
# an ordinary launch), so what may still run when a dependent starts is launch 1 alone, and every
# finalize program waits for launch 1, so the dependent's wait covers it
# (tests/kernels/test_pdl_order.py). Releasing after the wait instead cost 0.0071-0.199 us per layer
# at 1-8 tokens with a PDL kernel between boundaries, under Triton 3.6 and 3.8
# (benchmarks/results/pdl/pdl_order_triton3.6.md, pdl_order_triton3.8.md).
FINALIZE_EARLY_RELEASE = True
# Up to this many tokens one tiling and, T not specialised, one compiled partials and finalize: a
# token then gets the same bits alone as in a batch (a decode step and the verify of its drafts
# agree). Per-T tilings and T == 1 specialised gave 28-99 of the 2-32-token batches' outputs
# other bits than alone; one tiling gave none, at +0.5 us at T = 1 and no cost at 2-4
# (benchmarks/results/mhc/batch_invariance.json).
INVARIANT_MAX_TOKENS = 4
# The model tail (mhc_post_head_triton) fused up to this many tokens; above, mhc_post then
# hc_head's own launches: at H = 7168 the fused 2 launches were 1.3-3.5 us faster at 1-192
# tokens and 0.9 us slower at 256, 30 us at 1024 (benchmarks/results/mhc/mhc_post_head.json)
TAIL_FUSED_MAX_TOKENS = 192
# bf16 streams from this many tokens: the partials on tensor cores (at 64 tokens the CUDA-core
# partials are as fast or faster, at 256 the tensor cores 1.2-1.5x: mhc_sweep.json)
MMA_MIN_TOKENS = 128
# The boundary's tensor-core partials with tokens as rows from this many tokens: 1.08-1.53x the
# (t, i) rows at 512-4096 tokens, both widths (mhc_boundary_token_rows_fma.json; with 32-wide
# chunks 0.96x at 256: mhc_large_t.json), and as close to the float64 pre of their own residual
# once _mix is explicit fmas
BOUNDARY_TOKEN_ROWS_MIN_TOKENS = 512
# mhc_pre's finalize in 2048-wide H-blocks from 129 tokens up to this many elements of T x H,
# 512 above: 28.8 -> 26.1 us at 256 tokens (H = 7168), 44.7 -> 41.6 at 1024 (H = 4096)
# (benchmarks/results/mhc/mhc_streams_k.json, the default rows)
WIDE_FINALIZE_MAX_ELEMENTS = 1024 * 4096
# Triton from this major.minor: the boundary's CUDA-core partials at 9-16 tokens in 4-token
# blocks (T = 4's tile, twice the programs) instead of 8-token blocks. Triton 3.8 compiles the
# 8-token tile with 4 warps to other code than 3.6 (221 vs 204 registers, 688 vs 564 shuffles),
# the 4-token tile alike (127 vs 123 registers): benchmarks/results/logs/triton38_mhc_ptx.txt.
# On the H200 under 3.8 (fp32 norm weight, results/triton38/mhc_triton38_ab.md) the 4-token
# blocks took 7.87 vs 8.46 us at 16 tokens, H = 4096, and 9.49 vs 9.03 at 7168; the 3.8 tables
# were measured with them. They do not remove the 16-token slowdown that bench stack and tune
# measure under 3.8 with their inputs (a bf16 norm weight, as DSV4's; 13.7 vs 9.0 us at
# H = 7168, results/triton38/stack_triton3.6_vs_3.8.md), whose cause is not found yet: the 3.8
# tables give the boundary at 9-16 tokens (H = 7168) to the engine's kernel.
SMALL_BLOCKS_FROM_TRITON = (3, 8)


def triton_release(version: str | None = None) -> tuple[int, int]:
    """Triton's (major, minor), of ``version`` or of the one imported."""
    major, minor = (version or triton.__version__).split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@triton.jit
def _mix(p, c0, c1, c2, c3, fv, x0, x1, x2, x3, DTYPE: tl.constexpr, FMA: tl.constexpr):
    # x'_j = post_j f + sum_i comb[i, j] x_i, rounded to the stream dtype (then exact in fp32);
    # the same expression in the boundary's partials and in mhc_post. FMA writes it as explicit
    # fmas: a kernel that holds the mix in two register layouts (the token-row partials: the
    # tensor cores' operand and the store's) computes it twice, and left to the compiler each
    # copy was contracted its own way, so the stored residual and the dotted one differed in
    # bits. Elsewhere (the (t, i) partials, mhc_post) the compiler's own contraction (as many
    # fmas, another order of them and of the loads) measured faster: the boundary at 32 tokens
    # 12.6 vs 13.6 us (benchmarks/results/mhc/mhc_mix_ab.md).
    if FMA:
        v = tl.fma(c3, x3, tl.fma(c2, x2, tl.fma(c1, x1, c0 * x0)))
        return round_to(tl.fma(p, fv, v), DTYPE)
    else:
        return round_to(p * fv + (c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3), DTYPE)


@triton.jit
def _load_mixes(post_ptr, comb_ptr, t, mask):
    # the previous layer's post [4] and comb [4, 4] of tokens t, each weight shaped as t
    pp = post_ptr + t * 4
    cp = comb_ptr + t * 16
    return (tl.load(pp, mask=mask, other=0.0), tl.load(pp + 1, mask=mask, other=0.0),
            tl.load(pp + 2, mask=mask, other=0.0), tl.load(pp + 3, mask=mask, other=0.0),
            tl.load(cp, mask=mask, other=0.0), tl.load(cp + 1, mask=mask, other=0.0),
            tl.load(cp + 2, mask=mask, other=0.0), tl.load(cp + 3, mask=mask, other=0.0),
            tl.load(cp + 4, mask=mask, other=0.0), tl.load(cp + 5, mask=mask, other=0.0),
            tl.load(cp + 6, mask=mask, other=0.0), tl.load(cp + 7, mask=mask, other=0.0),
            tl.load(cp + 8, mask=mask, other=0.0), tl.load(cp + 9, mask=mask, other=0.0),
            tl.load(cp + 10, mask=mask, other=0.0), tl.load(cp + 11, mask=mask, other=0.0),
            tl.load(cp + 12, mask=mask, other=0.0), tl.load(cp + 13, mask=mask, other=0.0),
            tl.load(cp + 14, mask=mask, other=0.0), tl.load(cp + 15, mask=mask, other=0.0))


@triton.jit
def _store_new_residual(xnew_ptr, offs, H, mask, mixes, fv, x0, x1, x2, x3, FMA: tl.constexpr):
    # the 4 streams x'_j (_mix of fp32 x_i, f and _load_mixes' 20 weights), stored at
    # offs + j * H; returned in the stream dtype: the partials kernels' POST
    (p0, p1, p2, p3, c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30,
     c31, c32, c33) = mixes
    dt = xnew_ptr.dtype.element_ty
    n0 = _mix(p0, c00, c10, c20, c30, fv, x0, x1, x2, x3, dt, FMA)
    n1 = _mix(p1, c01, c11, c21, c31, fv, x0, x1, x2, x3, dt, FMA)
    n2 = _mix(p2, c02, c12, c22, c32, fv, x0, x1, x2, x3, dt, FMA)
    n3 = _mix(p3, c03, c13, c23, c33, fv, x0, x1, x2, x3, dt, FMA)
    tl.store(xnew_ptr + offs, n0, mask=mask)
    tl.store(xnew_ptr + offs + H, n1, mask=mask)
    tl.store(xnew_ptr + offs + 2 * H, n2, mask=mask)
    tl.store(xnew_ptr + offs + 3 * H, n3, mask=mask)
    return n0, n1, n2, n3


@triton.jit(do_not_specialize=["T"])  # one binary for every T of a tiling: INVARIANT_MAX_TOKENS
def _mhc_partials_kernel(
    x_ptr, f_ptr, post_ptr, comb_ptr, xnew_ptr, fn_ptr, ws_ptr,
    T, H, NUM_SPLITS, stride_fn, stride_wt, stride_wk,
    POST: tl.constexpr, GRAM: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, PREFETCH_FN: tl.constexpr,
    WAIT: tl.constexpr, NROWS: tl.constexpr, ROWS_PAD: tl.constexpr,
):
    if PDL and not WAIT:  # let the finalize start now: it loads what it can, then waits
        gdc_launch_dependents()
    # Every tensor is 3-D [token, row of fn, h] from its pointers on, so broadcasting x against
    # fn needs no layout conversion; the 24 dots accumulate as FMAs into one [BLOCK_T, 32,
    # BLOCK_K] tile and cross threads once, in a single reduction at the end (a reduction per
    # row and chunk cost a barrier each: 34 per program).
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    offs_t = (pid // NUM_SPLITS) * BLOCK_T + tl.arange(0, BLOCK_T)
    t3 = offs_t[:, None, None]
    mask_t3 = t3 < T
    # NROWS rows of fn (24: the boundary's pre, post and comb; 4: hc_head's), padded to ROWS_PAD
    r3 = tl.arange(0, ROWS_PAD)[None, :, None]
    fn_rows = fn_ptr + r3 * stride_fn
    mask_r3 = r3 < NROWS
    if PREFETCH_FN:  # one chunk per split: its fn columns (a weight) before anything else
        hp = (split * BLOCK_K + tl.arange(0, BLOCK_K))[None, None, :]
        fp = fn_rows + hp
        fpmask = mask_r3 & (hp < H)
        fa0 = tl.load(fp, mask=fpmask, other=0.0)
        fa1 = tl.load(fp + H, mask=fpmask, other=0.0)
        fa2 = tl.load(fp + 2 * H, mask=fpmask, other=0.0)
        fa3 = tl.load(fp + 3 * H, mask=fpmask, other=0.0)
    if WAIT:  # a programmatic dependent launch: every input but fn and every write waits here
        gdc_wait()
        if PDL:  # after the wait, so the finalize's early loads of x never see it half-written
            gdc_launch_dependents()
    if POST:  # the previous layer's post and comb, per token: [BLOCK_T, 1, 1]
        mixes = _load_mixes(post_ptr, comb_ptr, t3, mask_t3)
    acc = tl.zeros([BLOCK_T, ROWS_PAD, BLOCK_K], dtype=tl.float32)
    g00 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g11 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g22 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g33 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g01 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g02 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g03 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g12 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g13 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    g23 = tl.zeros([BLOCK_T, 1, BLOCK_K], dtype=tl.float32)
    for c in range(0, CHUNKS_PER_SPLIT):
        h3 = ((split * CHUNKS_PER_SPLIT + c) * BLOCK_K + tl.arange(0, BLOCK_K))[None, None, :]
        mask_h3 = h3 < H
        mask = mask_t3 & mask_h3
        offs = t3 * (4 * H) + h3
        x0 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(x_ptr + offs + H, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + offs + 2 * H, mask=mask, other=0.0).to(tl.float32)
        x3 = tl.load(x_ptr + offs + 3 * H, mask=mask, other=0.0).to(tl.float32)
        if POST:
            fv = tl.load(f_ptr + t3 * H + h3, mask=mask, other=0.0).to(tl.float32)
            n0, n1, n2, n3 = _store_new_residual(xnew_ptr, offs, H, mask, mixes, fv, x0, x1,
                                                 x2, x3, False)
            x0 = n0.to(tl.float32)
            x1 = n1.to(tl.float32)
            x2 = n2.to(tl.float32)
            x3 = n3.to(tl.float32)
        if PREFETCH_FN:
            acc += x0 * fa0 + x1 * fa1 + x2 * fa2 + x3 * fa3
        else:
            fmask = mask_r3 & mask_h3
            f = fn_rows + h3
            acc += (x0 * tl.load(f, mask=fmask, other=0.0)
                    + x1 * tl.load(f + H, mask=fmask, other=0.0)
                    + x2 * tl.load(f + 2 * H, mask=fmask, other=0.0)
                    + x3 * tl.load(f + 3 * H, mask=fmask, other=0.0))
        g00 += x0 * x0
        g11 += x1 * x1
        g22 += x2 * x2
        g33 += x3 * x3
        if GRAM:
            g01 += x0 * x1
            g02 += x0 * x2
            g03 += x0 * x3
            g12 += x1 * x2
            g13 += x1 * x3
            g23 += x2 * x3
    # ws[t, slot, split]: slots 0..NROWS-1 the dots, then the diagonal of G (4), then its upper
    # half (6)
    ws = ws_ptr + t3 * stride_wt + split
    tl.store(ws + r3 * stride_wk, tl.sum(acc, axis=2)[:, :, None], mask=mask_t3 & mask_r3)
    tl.store(ws + (NROWS + 0) * stride_wk, tl.sum(g00, axis=2)[:, :, None], mask=mask_t3)
    tl.store(ws + (NROWS + 1) * stride_wk, tl.sum(g11, axis=2)[:, :, None], mask=mask_t3)
    tl.store(ws + (NROWS + 2) * stride_wk, tl.sum(g22, axis=2)[:, :, None], mask=mask_t3)
    tl.store(ws + (NROWS + 3) * stride_wk, tl.sum(g33, axis=2)[:, :, None], mask=mask_t3)
    if GRAM:
        tl.store(ws + (NROWS + 4) * stride_wk, tl.sum(g01, axis=2)[:, :, None], mask=mask_t3)
        tl.store(ws + (NROWS + 5) * stride_wk, tl.sum(g02, axis=2)[:, :, None], mask=mask_t3)
        tl.store(ws + (NROWS + 6) * stride_wk, tl.sum(g03, axis=2)[:, :, None], mask=mask_t3)
        tl.store(ws + (NROWS + 7) * stride_wk, tl.sum(g12, axis=2)[:, :, None], mask=mask_t3)
        tl.store(ws + (NROWS + 8) * stride_wk, tl.sum(g13, axis=2)[:, :, None], mask=mask_t3)
        tl.store(ws + (NROWS + 9) * stride_wk, tl.sum(g23, axis=2)[:, :, None], mask=mask_t3)


@triton.jit
def _fn_columns(fn_ptr, stride_fn, offs_h, mask_h, J0: tl.constexpr, H):
    # fn's rows J0..J0+7 by stream as a [BLOCK_K, 32] tile, column c = (j - J0, i) holding
    # fn[j, i * H + h], in three bf16 parts: hi + mid + lo carry fp32's 24 bits, so bf16 x times
    # each part is exact and the tensor cores add in fp32
    offs_c = tl.arange(0, 32)
    f = tl.load(fn_ptr + (J0 + offs_c[None, :] // 4) * stride_fn + (offs_c[None, :] % 4) * H
                + offs_h[:, None], mask=mask_h[:, None], other=0.0)
    return split_bf16x3(f)


@triton.jit
def _stream_dots(acc, ROWS: tl.constexpr, BLOCK_T: tl.constexpr):
    # [ROWS, 32] products of rows (t, i) with columns (j, i') -> the [BLOCK_T, 8] dots: keep
    # i' = i, sum over i
    offs_r = tl.arange(0, ROWS)
    offs_c = tl.arange(0, 32)
    same = (offs_c[None, :] % 4) == (offs_r[:, None] % 4)
    mix = tl.sum(tl.reshape(tl.where(same, acc, 0.0), [ROWS, 8, 4]), axis=2)
    return tl.sum(tl.reshape(mix, [BLOCK_T, 4, 8]), axis=1)


@triton.jit
def _mhc_partials_mma_kernel(
    x_ptr, f_ptr, post_ptr, comb_ptr, xnew_ptr, fn_ptr, ws_ptr,
    T, H, NUM_SPLITS, stride_fn, stride_wt, stride_wk,
    POST: tl.constexpr, GRAM: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # Launch 1 on tensor cores for bf16 streams (prefill sizes), arranged as hc_head's: a tile
    # of 4 * BLOCK_T rows r = (t, i) of x times [BLOCK_K, 32] tiles of fn whose column (j, i')
    # holds fn[j, i' * H + h] (three tiles for the 24 rows), in three bf16 parts; the columns
    # with i' = i are stream i's share of dot j. Each chunk's products start from zero
    # (smallest part first) and the chunks add up in fp32 registers. The tile times its own
    # transpose gives the Gram sums. With POST the program first forms its slice of the new
    # residual with CUDA cores, stores it and reads it back as the row tile (after a barrier:
    # the rows cross threads). Same workspace slots as _mhc_partials_kernel.
    ROWS: tl.constexpr = 4 * BLOCK_T
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    t0 = (pid // NUM_SPLITS) * BLOCK_T
    offs_r = tl.arange(0, ROWS)
    offs_t = t0 + offs_r // 4
    mask_r = offs_t < T
    rows = offs_t * (4 * H) + (offs_r % 4) * H  # element offsets of rows (t, i)
    if POST:  # 2-D [BLOCK_T, 1] per-token weights and [BLOCK_T, BLOCK_K] stream tiles
        tt = (t0 + tl.arange(0, BLOCK_T))[:, None]
        mt = tt < T
        mixes = _load_mixes(post_ptr, comb_ptr, tt, mt)
    acc0 = tl.zeros([ROWS, 32], dtype=tl.float32)
    acc1 = tl.zeros([ROWS, 32], dtype=tl.float32)
    acc2 = tl.zeros([ROWS, 32], dtype=tl.float32)
    gram = tl.zeros([ROWS, ROWS], dtype=tl.float32)
    for c in range(0, CHUNKS_PER_SPLIT):
        offs_h = (split * CHUNKS_PER_SPLIT + c) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        if POST:
            hh = offs_h[None, :]
            m2 = mt & (hh < H)
            o2 = tt * (4 * H) + hh
            fv = tl.load(f_ptr + tt * H + hh, mask=m2, other=0.0).to(tl.float32)
            y0 = tl.load(x_ptr + o2, mask=m2, other=0.0).to(tl.float32)
            y1 = tl.load(x_ptr + o2 + H, mask=m2, other=0.0).to(tl.float32)
            y2 = tl.load(x_ptr + o2 + 2 * H, mask=m2, other=0.0).to(tl.float32)
            y3 = tl.load(x_ptr + o2 + 3 * H, mask=m2, other=0.0).to(tl.float32)
            _store_new_residual(xnew_ptr, o2, H, m2, mixes, fv, y0, y1, y2, y3, False)
            tl.debug_barrier()
            xt = tl.load(xnew_ptr + rows[:, None] + offs_h[None, :],
                         mask=mask_r[:, None] & mask_h[None, :], other=0.0)
        else:
            xt = tl.load(x_ptr + rows[:, None] + offs_h[None, :],
                         mask=mask_r[:, None] & mask_h[None, :], other=0.0)
        hi, mid, lo = _fn_columns(fn_ptr, stride_fn, offs_h, mask_h, 0, H)
        acc0 += tl.dot(xt, hi, tl.dot(xt, mid, tl.dot(xt, lo)))
        hi, mid, lo = _fn_columns(fn_ptr, stride_fn, offs_h, mask_h, 8, H)
        acc1 += tl.dot(xt, hi, tl.dot(xt, mid, tl.dot(xt, lo)))
        hi, mid, lo = _fn_columns(fn_ptr, stride_fn, offs_h, mask_h, 16, H)
        acc2 += tl.dot(xt, hi, tl.dot(xt, mid, tl.dot(xt, lo)))
        gram += tl.dot(xt, tl.trans(xt))
    # ws[t, slot, split]: dots 0-23, diagonal of G 24-27, its upper half 28-33
    tb = t0 + tl.arange(0, BLOCK_T)
    jj = tl.arange(0, 8)
    wt = ws_ptr + tb[:, None] * stride_wt + split + jj[None, :] * stride_wk
    mask_tb = (tb < T)[:, None]
    tl.store(wt, _stream_dots(acc0, ROWS, BLOCK_T), mask=mask_tb)
    tl.store(wt + 8 * stride_wk, _stream_dots(acc1, ROWS, BLOCK_T), mask=mask_tb)
    tl.store(wt + 16 * stride_wk, _stream_dots(acc2, ROWS, BLOCK_T), mask=mask_tb)
    store_token_grams(ws_ptr + offs_t * stride_wt + split, stride_wk, gram, mask_r, ROWS, BLOCK_T,
                      24, 28, GRAM)


@triton.jit
def _split_fn_kernel(fn_ptr, parts_ptr, C, stride_fn, BLOCK_C: tl.constexpr):
    # fn [24, C] fp32 -> parts [3, C, 32] bf16 (hi, mid, lo; rows 24-31 zero): each [BLOCK_K,
    # 32] tile the token-row partials read is then contiguous and needs no splitting
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_j = tl.arange(0, 32)
    mask_c = offs_c < C
    f = tl.load(fn_ptr + offs_j[None, :] * stride_fn + offs_c[:, None],
                mask=(offs_j[None, :] < 24) & mask_c[:, None], other=0.0)
    hi, mid, lo = split_bf16x3(f)
    out = parts_ptr + offs_c[:, None] * 32 + offs_j[None, :]
    tl.store(out, hi, mask=mask_c[:, None])
    tl.store(out + C * 32, mid, mask=mask_c[:, None])
    tl.store(out + 2 * C * 32, lo, mask=mask_c[:, None])


@triton.jit
def _token_row_dots(acc, xt, fn_ptr, stride_fn, offs_h, mask_h, STREAM: tl.constexpr, H,
                    PRESPLIT: tl.constexpr):
    # stream STREAM's share of the 24 dots for a [BLOCK_T, BLOCK_K] tile of tokens: xt times the
    # [BLOCK_K, 32] tile fn[j, STREAM * H + h] (rows j >= 24 zero) in three bf16 parts, smallest
    # first, from zero; the chunk's sum then adds to acc in fp32 registers. PRESPLIT: fn_ptr is
    # _split_fn_kernel's parts
    offs_j = tl.arange(0, 32)
    if PRESPLIT:
        p = fn_ptr + (STREAM * H + offs_h[:, None]) * 32 + offs_j[None, :]
        m = mask_h[:, None]
        hi = tl.load(p, mask=m, other=0.0)
        mid = tl.load(p + 4 * H * 32, mask=m, other=0.0)
        lo = tl.load(p + 8 * H * 32, mask=m, other=0.0)
    else:
        f = tl.load(fn_ptr + offs_j[None, :] * stride_fn + STREAM * H + offs_h[:, None],
                    mask=(offs_j[None, :] < 24) & mask_h[:, None], other=0.0)
        hi, mid, lo = split_bf16x3(f)
    return acc + tl.dot(xt, hi, tl.dot(xt, mid, tl.dot(xt, lo)))


@triton.jit
def _token_grams_zero(BLOCK_T: tl.constexpr):
    # the token-row kernels' 10 Gram sums per token, from zero (see _token_grams_add)
    z = tl.zeros([BLOCK_T], dtype=tl.float32)
    return z, z, z, z, z, z, z, z, z, z


@triton.jit
def _token_grams_add(g00, g11, g22, g33, g01, g02, g03, g12, g13, g23, x0, x1, x2, x3,
                     GRAM: tl.constexpr):
    # the token-row kernels' Gram sums [BLOCK_T] plus a chunk's: the 4 streams' [BLOCK_T,
    # BLOCK_K] tiles, one row sum per entry (the diagonal, and with GRAM its upper half)
    f0 = x0.to(tl.float32)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    f3 = x3.to(tl.float32)
    g00 += tl.sum(f0 * f0, axis=1)
    g11 += tl.sum(f1 * f1, axis=1)
    g22 += tl.sum(f2 * f2, axis=1)
    g33 += tl.sum(f3 * f3, axis=1)
    if GRAM:
        g01 += tl.sum(f0 * f1, axis=1)
        g02 += tl.sum(f0 * f2, axis=1)
        g03 += tl.sum(f0 * f3, axis=1)
        g12 += tl.sum(f1 * f2, axis=1)
        g13 += tl.sum(f1 * f3, axis=1)
        g23 += tl.sum(f2 * f3, axis=1)
    return g00, g11, g22, g33, g01, g02, g03, g12, g13, g23


@triton.jit
def _store_token_partials(ws_ptr, offs_t, T, split, stride_wt, stride_wk, acc, g00, g11, g22,
                          g33, g01, g02, g03, g12, g13, g23, GRAM: tl.constexpr):
    # ws[t, slot, split] of the token-row kernels: the dots acc [BLOCK_T, 32] (columns 0-23) to
    # slots 0-23, the diagonal of G to 24-27, its upper half to 28-33
    jj = tl.arange(0, 32)[None, :]
    ws = ws_ptr + offs_t * stride_wt + split
    mask_t = offs_t < T
    tl.store(ws[:, None] + jj * stride_wk, acc, mask=mask_t[:, None] & (jj < 24))
    tl.store(ws + 24 * stride_wk, g00, mask=mask_t)
    tl.store(ws + 25 * stride_wk, g11, mask=mask_t)
    tl.store(ws + 26 * stride_wk, g22, mask=mask_t)
    tl.store(ws + 27 * stride_wk, g33, mask=mask_t)
    if GRAM:
        tl.store(ws + 28 * stride_wk, g01, mask=mask_t)
        tl.store(ws + 29 * stride_wk, g02, mask=mask_t)
        tl.store(ws + 30 * stride_wk, g03, mask=mask_t)
        tl.store(ws + 31 * stride_wk, g12, mask=mask_t)
        tl.store(ws + 32 * stride_wk, g13, mask=mask_t)
        tl.store(ws + 33 * stride_wk, g23, mask=mask_t)


@triton.jit
def _mhc_partials_token_mma_kernel(
    x_ptr, f_ptr, post_ptr, comb_ptr, xnew_ptr, fn_ptr, ws_ptr,
    T, H, NUM_SPLITS, stride_fn, stride_wt, stride_wk,
    POST: tl.constexpr, GRAM: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, PRESPLIT: tl.constexpr,
):
    # Launch 1 on tensor cores with tokens as rows: per chunk of h, the 4 streams' [BLOCK_T,
    # BLOCK_K] tiles each times its stream's [BLOCK_K, 32] tile of fn (24 rows, in three bf16
    # parts), so every product the tensor cores form is one the dots need (rows (t, i) against
    # columns (j, i'), _mhc_partials_mma_kernel, keep a quarter). The Gram sums come from the
    # same tiles on CUDA cores, one row sum per entry and chunk. With POST the new residual is
    # formed in registers, stored, and is itself the row tile (no barrier, no read back). Same
    # workspace slots as _mhc_partials_kernel.
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    offs_t = (pid // NUM_SPLITS) * BLOCK_T + tl.arange(0, BLOCK_T)
    tt = offs_t[:, None]
    mt = tt < T
    if POST:
        mixes = _load_mixes(post_ptr, comb_ptr, tt, mt)
    acc = tl.zeros([BLOCK_T, 32], dtype=tl.float32)
    g00, g11, g22, g33, g01, g02, g03, g12, g13, g23 = _token_grams_zero(BLOCK_T)
    for c in range(0, CHUNKS_PER_SPLIT):
        offs_h = (split * CHUNKS_PER_SPLIT + c) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        hh = offs_h[None, :]
        m2 = mt & (hh < H)
        o2 = tt * (4 * H) + hh
        x0 = tl.load(x_ptr + o2, mask=m2, other=0.0)
        x1 = tl.load(x_ptr + o2 + H, mask=m2, other=0.0)
        x2 = tl.load(x_ptr + o2 + 2 * H, mask=m2, other=0.0)
        x3 = tl.load(x_ptr + o2 + 3 * H, mask=m2, other=0.0)
        if POST:
            fv = tl.load(f_ptr + tt * H + hh, mask=m2, other=0.0).to(tl.float32)
            x0, x1, x2, x3 = _store_new_residual(xnew_ptr, o2, H, m2, mixes, fv,
                                                 x0.to(tl.float32), x1.to(tl.float32),
                                                 x2.to(tl.float32), x3.to(tl.float32), True)
        acc = _token_row_dots(acc, x0, fn_ptr, stride_fn, offs_h, mask_h, 0, H, PRESPLIT)
        acc = _token_row_dots(acc, x1, fn_ptr, stride_fn, offs_h, mask_h, 1, H, PRESPLIT)
        acc = _token_row_dots(acc, x2, fn_ptr, stride_fn, offs_h, mask_h, 2, H, PRESPLIT)
        acc = _token_row_dots(acc, x3, fn_ptr, stride_fn, offs_h, mask_h, 3, H, PRESPLIT)
        g00, g11, g22, g33, g01, g02, g03, g12, g13, g23 = _token_grams_add(
            g00, g11, g22, g33, g01, g02, g03, g12, g13, g23, x0, x1, x2, x3, GRAM)
    _store_token_partials(ws_ptr, offs_t, T, split, stride_wt, stride_wk, acc, g00, g11, g22,
                          g33, g01, g02, g03, g12, g13, g23, GRAM)


@triton.jit
def _tile4(ws_ptr, SLOT: tl.constexpr, stride_wk, offs_s, mask_s, N: tl.constexpr):
    # slots SLOT..SLOT+N-1 (N <= 4) of every split: one [4, BLOCK_S] load. The finalize loads all
    # its tiles before it reduces any: a warp issues in order, so a load placed after a
    # reduction waits for the reduction's own load, and the L2 round trips add up.
    k = tl.arange(0, 4)
    return tl.load(ws_ptr + (SLOT + k)[:, None] * stride_wk + offs_s[None, :],
                   mask=(k < N)[:, None] & mask_s[None, :], other=0.0)


@triton.jit
def _sum4(tile):
    # a [4, BLOCK_S] tile summed over the splits: 4 scalars
    k = tl.arange(0, 4)
    v = tl.sum(tile, axis=1)
    return (tl.sum(tl.where(k == 0, v, 0.0), axis=0), tl.sum(tl.where(k == 1, v, 0.0), axis=0),
            tl.sum(tl.where(k == 2, v, 0.0), axis=0), tl.sum(tl.where(k == 3, v, 0.0), axis=0))


@triton.jit
def _normalise(a, b, c, d, eps):
    # one row or column divided by (its sum + eps); an approximate reciprocal (2 ulp) and four
    # products instead of four IEEE divisions
    inv = tl.fdiv(1.0, a + b + c + d + eps, ieee_rounding=False)
    return a * inv, b * inv, c * inv, d * inv


@triton.jit
def _inverse4(a, b, c, d, FAST_MATH: tl.constexpr):
    if FAST_MATH:
        return (libdevice.fast_dividef(1.0, a), libdevice.fast_dividef(1.0, b),
                libdevice.fast_dividef(1.0, c), libdevice.fast_dividef(1.0, d))
    else:
        return 1.0 / a, 1.0 / b, 1.0 / c, 1.0 / d


@triton.jit
def _softmax_row(l0, l1, l2, l3, r, s2, base_ptr, SLOT: tl.constexpr, eps):
    l0 = l0 * r * s2 + tl.load(base_ptr + SLOT)
    l1 = l1 * r * s2 + tl.load(base_ptr + SLOT + 1)
    l2 = l2 * r * s2 + tl.load(base_ptr + SLOT + 2)
    l3 = l3 * r * s2 + tl.load(base_ptr + SLOT + 3)
    m = tl.maximum(tl.maximum(l0, l1), tl.maximum(l2, l3))
    e0, e1, e2, e3 = _normalise(tl.exp(l0 - m), tl.exp(l1 - m), tl.exp(l2 - m), tl.exp(l3 - m),
                                0.0)
    return e0 + eps, e1 + eps, e2 + eps, e3 + eps


@triton.jit
def _store4(ptr, a, b, c, d):
    tl.store(ptr, a)
    tl.store(ptr + 1, b)
    tl.store(ptr + 2, c)
    tl.store(ptr + 3, d)


@triton.jit
def _rstd_of_streams(g00, g11, g22, g33, H, rms_eps):
    return 1.0 / tl.sqrt((g00 + g11 + g22 + g33) / (4 * H) + rms_eps)


@triton.jit
def _rows4(ws_ptr, SLOT: tl.constexpr, stride_wk, offs_s, mask_s, N: tl.constexpr):
    # slots SLOT..SLOT+N-1 (N <= 4) of every split as four [BLOCK_S] vectors (zeros past N)
    p = ws_ptr + SLOT * stride_wk + offs_s
    return (tl.load(p, mask=mask_s, other=0.0),
            tl.load(p + stride_wk, mask=mask_s & (N > 1), other=0.0),
            tl.load(p + 2 * stride_wk, mask=mask_s & (N > 2), other=0.0),
            tl.load(p + 3 * stride_wk, mask=mask_s & (N > 3), other=0.0))


@triton.jit
def _sum_rows4(a, b, c, d):
    # four independent one-axis sums: with one warp each is in-thread adds and five shuffles,
    # and nothing orders them, so they overlap (a [4, BLOCK_S] tile's sum, then four masked
    # sums of the result, is five reductions in a chain)
    return tl.sum(a, axis=0), tl.sum(b, axis=0), tl.sum(c, axis=0), tl.sum(d, axis=0)


@triton.jit
def _layer_input_block(
    x_ptr, ws, scale_ptr, base_ptr, weight_ptr, out_ptr, t, hblock, H, offs_s, mask_s, stride_wk,
    rms_eps, hc_eps, norm_eps, SLOT_D: tl.constexpr, RMSNORM: tl.constexpr,
    X_EARLY: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr, VECTOR_SUMS: tl.constexpr,
    EARLY_RELEASE: tl.constexpr,
):
    # One H-block of token t's layer input sum_i w_i x_i (then its RMSNorm), the pre weights w
    # from the dots in slots 0-3 and the Gram sums from slot SLOT_D on: the finalize's programs
    # but the first, and every program of the model tail's hc_head
    offs_h = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    xr = x_ptr + t * (4 * H) + offs_h
    # Loads that do not depend on launch 1 first (with PDL they overlap its tail). The
    # fused boundary's x is launch 1's output: it is loaded after the wait.
    if X_EARLY:
        x0, x1, x2, x3 = load_streams(xr, H, mask_h, "")
    s0, b0, b1, b2, b3 = load_pre_params(scale_ptr, base_ptr)
    if RMSNORM:
        nw = tl.load(weight_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
        if not EARLY_RELEASE:
            gdc_launch_dependents()
    if not X_EARLY:
        x0, x1, x2, x3 = load_streams(xr, H, mask_h, "")
    if VECTOR_SUMS:
        d0, d1, d2, d3 = _rows4(ws, SLOT_D, stride_wk, offs_s, mask_s, 4)
        p0, p1, p2, p3 = _rows4(ws, 0, stride_wk, offs_s, mask_s, 4)
        if RMSNORM:
            u0, u1, u2, u3 = _rows4(ws, SLOT_D + 4, stride_wk, offs_s, mask_s, 4)
            v0, v1, v2, v3 = _rows4(ws, SLOT_D + 8, stride_wk, offs_s, mask_s, 2)
        g00, g11, g22, g33 = _sum_rows4(d0, d1, d2, d3)
        l0, l1, l2, l3 = _sum_rows4(p0, p1, p2, p3)
        if RMSNORM:
            g01, g02, g03, g12 = _sum_rows4(u0, u1, u2, u3)
            g13, g23, unused_a, unused_b = _sum_rows4(v0, v1, v2, v3)
    else:
        diag = _tile4(ws, SLOT_D, stride_wk, offs_s, mask_s, 4)
        pre = _tile4(ws, 0, stride_wk, offs_s, mask_s, 4)
        if RMSNORM:
            gram = _tile4(ws, SLOT_D + 4, stride_wk, offs_s, mask_s, 4)
            gram_tail = _tile4(ws, SLOT_D + 8, stride_wk, offs_s, mask_s, 2)
        g00, g11, g22, g33 = _sum4(diag)
        l0, l1, l2, l3 = _sum4(pre)
        if RMSNORM:
            g01, g02, g03, g12 = _sum4(gram)
            g13, g23, unused_a, unused_b = _sum4(gram_tail)
    r = _rstd_of_streams(g00, g11, g22, g33, H, rms_eps)
    w0 = tl.sigmoid(l0 * r * s0 + b0) + hc_eps
    w1 = tl.sigmoid(l1 * r * s0 + b1) + hc_eps
    w2 = tl.sigmoid(l2 * r * s0 + b2) + hc_eps
    w3 = tl.sigmoid(l3 * r * s0 + b3) + hc_eps
    y = round_to(w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3, out_ptr.dtype.element_ty)
    if RMSNORM:
        rstd = mix_rstd(w0, w1, w2, w3, g00, g11, g22, g33, g01, g02, g03, g12, g13, g23, H,
                        norm_eps)
        y = round_to(y.to(tl.float32) * rstd * nw, out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * H + offs_h, y, mask=mask_h)


@triton.jit(do_not_specialize=["T"])  # one binary for every T of a tiling: INVARIANT_MAX_TOKENS
def _mhc_finalize_kernel(
    x_ptr, ws_ptr, scale_ptr, base_ptr, weight_ptr, post_ptr, comb_ptr, out_ptr,
    T, H, NUM_SPLITS, NUM_HBLOCKS, rms_eps, hc_eps, norm_eps, post_mult, stride_wt, stride_wk,
    SINKHORN_ITERS: tl.constexpr, RMSNORM: tl.constexpr, X_EARLY: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr, FAST_MATH: tl.constexpr,
    VECTOR_SUMS: tl.constexpr, HEAD: tl.constexpr, SLOT_D: tl.constexpr,
    EARLY_RELEASE: tl.constexpr,
):
    # 1 + NUM_HBLOCKS programs per token: q = 0 writes post and comb, q >= 1 the H-block q - 1
    # of layer_input (with HEAD, NUM_HBLOCKS: the H-block q). Each reduces only the partials it
    # needs, so no program runs the ~24 reductions, the Sinkhorn and a collapse one after the
    # other.
    pid = tl.program_id(0).to(tl.int64)
    # HEAD (the model tail's hc_head): only the layer-input programs, no post and comb
    if HEAD:
        per_token = NUM_HBLOCKS
    else:
        per_token = NUM_HBLOCKS + 1
    # Last token first: launch 1 read x in token order, so its newest rows are still in L2.
    t = T - 1 - pid // per_token
    q = pid % per_token
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    ws = ws_ptr + t * stride_wt
    if PDL and EARLY_RELEASE:  # the next launch may start now (FINALIZE_EARLY_RELEASE)
        gdc_launch_dependents()
    if HEAD:
        _layer_input_block(x_ptr, ws, scale_ptr, base_ptr, weight_ptr, out_ptr, t, q, H, offs_s,
                           mask_s, stride_wk, rms_eps, hc_eps, norm_eps, SLOT_D, RMSNORM,
                           X_EARLY, BLOCK_H, PDL, VECTOR_SUMS, EARLY_RELEASE)
    elif q == 0:
        s1 = tl.load(scale_ptr + 1)
        s2 = tl.load(scale_ptr + 2)
        if PDL:
            gdc_wait()
            if not EARLY_RELEASE:
                gdc_launch_dependents()
        # every load issued before any reduction (a warp issues in order)
        if VECTOR_SUMS:
            qd0, qd1, qd2, qd3 = _rows4(ws, SLOT_D, stride_wk, offs_s, mask_s, 4)
            qp0, qp1, qp2, qp3 = _rows4(ws, 4, stride_wk, offs_s, mask_s, 4)
            qa0, qa1, qa2, qa3 = _rows4(ws, 8, stride_wk, offs_s, mask_s, 4)
            qb0, qb1, qb2, qb3 = _rows4(ws, 12, stride_wk, offs_s, mask_s, 4)
            qe0, qe1, qe2, qe3 = _rows4(ws, 16, stride_wk, offs_s, mask_s, 4)
            qh0, qh1, qh2, qh3 = _rows4(ws, 20, stride_wk, offs_s, mask_s, 4)
            g00, g11, g22, g33 = _sum_rows4(qd0, qd1, qd2, qd3)
            l0, l1, l2, l3 = _sum_rows4(qp0, qp1, qp2, qp3)
            m00, m01, m02, m03 = _sum_rows4(qa0, qa1, qa2, qa3)
            m10, m11, m12, m13 = _sum_rows4(qb0, qb1, qb2, qb3)
            m20, m21, m22, m23 = _sum_rows4(qe0, qe1, qe2, qe3)
            m30, m31, m32, m33 = _sum_rows4(qh0, qh1, qh2, qh3)
        else:
            diag = _tile4(ws, SLOT_D, stride_wk, offs_s, mask_s, 4)
            post = _tile4(ws, 4, stride_wk, offs_s, mask_s, 4)
            row0 = _tile4(ws, 8, stride_wk, offs_s, mask_s, 4)
            row1 = _tile4(ws, 12, stride_wk, offs_s, mask_s, 4)
            row2 = _tile4(ws, 16, stride_wk, offs_s, mask_s, 4)
            row3 = _tile4(ws, 20, stride_wk, offs_s, mask_s, 4)
            g00, g11, g22, g33 = _sum4(diag)
            l0, l1, l2, l3 = _sum4(post)
            m00, m01, m02, m03 = _sum4(row0)
            m10, m11, m12, m13 = _sum4(row1)
            m20, m21, m22, m23 = _sum4(row2)
            m30, m31, m32, m33 = _sum4(row3)
        r = _rstd_of_streams(g00, g11, g22, g33, H, rms_eps)
        pp = post_ptr + t * 4
        tl.store(pp, post_mult * tl.sigmoid(l0 * r * s1 + tl.load(base_ptr + 4)))
        tl.store(pp + 1, post_mult * tl.sigmoid(l1 * r * s1 + tl.load(base_ptr + 5)))
        tl.store(pp + 2, post_mult * tl.sigmoid(l2 * r * s1 + tl.load(base_ptr + 6)))
        tl.store(pp + 3, post_mult * tl.sigmoid(l3 * r * s1 + tl.load(base_ptr + 7)))
        # 16 scalars per thread, no cross-thread traffic: 4 x 4 tensors cost a shuffle or a
        # barrier per reduction, 80 of them in 20 passes
        c00, c01, c02, c03 = _softmax_row(m00, m01, m02, m03, r, s2, base_ptr, 8, hc_eps)
        c10, c11, c12, c13 = _softmax_row(m10, m11, m12, m13, r, s2, base_ptr, 12, hc_eps)
        c20, c21, c22, c23 = _softmax_row(m20, m21, m22, m23, r, s2, base_ptr, 16, hc_eps)
        c30, c31, c32, c33 = _softmax_row(m30, m31, m32, m33, r, s2, base_ptr, 20, hc_eps)
        c00, c10, c20, c30 = _normalise(c00, c10, c20, c30, hc_eps)
        c01, c11, c21, c31 = _normalise(c01, c11, c21, c31, hc_eps)
        c02, c12, c22, c32 = _normalise(c02, c12, c22, c32, hc_eps)
        c03, c13, c23, c33 = _normalise(c03, c13, c23, c33, hc_eps)
        # 19 more passes. Each half is a chain of dependent steps (sum, reciprocal, scale) on 16
        # scalars: the sums as trees and, on the GPU, an approximate reciprocal (div.approx,
        # 2 ulp) keep the chain short; four reciprocals per call, as the interpreter pays
        # milliseconds per nested jit call.
        for _ in range(SINKHORN_ITERS - 1):
            i0, i1, i2, i3 = _inverse4((c00 + c01) + (c02 + c03) + hc_eps,
                                       (c10 + c11) + (c12 + c13) + hc_eps,
                                       (c20 + c21) + (c22 + c23) + hc_eps,
                                       (c30 + c31) + (c32 + c33) + hc_eps, FAST_MATH)
            c00 *= i0
            c01 *= i0
            c02 *= i0
            c03 *= i0
            c10 *= i1
            c11 *= i1
            c12 *= i1
            c13 *= i1
            c20 *= i2
            c21 *= i2
            c22 *= i2
            c23 *= i2
            c30 *= i3
            c31 *= i3
            c32 *= i3
            c33 *= i3
            i0, i1, i2, i3 = _inverse4((c00 + c10) + (c20 + c30) + hc_eps,
                                       (c01 + c11) + (c21 + c31) + hc_eps,
                                       (c02 + c12) + (c22 + c32) + hc_eps,
                                       (c03 + c13) + (c23 + c33) + hc_eps, FAST_MATH)
            c00 *= i0
            c10 *= i0
            c20 *= i0
            c30 *= i0
            c01 *= i1
            c11 *= i1
            c21 *= i1
            c31 *= i1
            c02 *= i2
            c12 *= i2
            c22 *= i2
            c32 *= i2
            c03 *= i3
            c13 *= i3
            c23 *= i3
            c33 *= i3
        cp = comb_ptr + t * 16
        _store4(cp, c00, c01, c02, c03)
        _store4(cp + 4, c10, c11, c12, c13)
        _store4(cp + 8, c20, c21, c22, c23)
        _store4(cp + 12, c30, c31, c32, c33)
    else:
        _layer_input_block(x_ptr, ws, scale_ptr, base_ptr, weight_ptr, out_ptr, t, q - 1, H, offs_s,
                           mask_s, stride_wk, rms_eps, hc_eps, norm_eps, SLOT_D, RMSNORM,
                           X_EARLY, BLOCK_H, PDL, VECTOR_SUMS, EARLY_RELEASE)


@triton.jit
def _mhc_post_kernel(
    f_ptr, x_ptr, post_ptr, comb_ptr, out_ptr,
    H, NUM_HBLOCKS,
    BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    # elementwise over one token's H-block: out[j] = post_j f + sum_i comb[i, j] x_i, the 20
    # weights as scalars (no cross-thread traffic)
    if PDL:  # a programmatic dependent launch: it starts while the sublayer's last kernel ends
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0).to(tl.int64)
    t = pid // NUM_HBLOCKS
    offs_h = (pid % NUM_HBLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    xr = x_ptr + t * (4 * H) + offs_h
    x0 = tl.load(xr, mask=mask_h, other=0.0).to(tl.float32)
    x1 = tl.load(xr + H, mask=mask_h, other=0.0).to(tl.float32)
    x2 = tl.load(xr + 2 * H, mask=mask_h, other=0.0).to(tl.float32)
    x3 = tl.load(xr + 3 * H, mask=mask_h, other=0.0).to(tl.float32)
    fv = tl.load(f_ptr + t * H + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    pp = post_ptr + t * 4
    cp = comb_ptr + t * 16
    dt = out_ptr.dtype.element_ty
    o = out_ptr + t * (4 * H) + offs_h
    # the mix as the boundary's (t, i) partials write it, so that below
    # BOUNDARY_TOKEN_ROWS_MIN_TOKENS the two compile the same expression (the fmas written out
    # were 2.00 vs 2.14 us at 64 tokens x 4096, a tie elsewhere: mhc_mix_ab.md)
    tl.store(o, _mix(tl.load(pp), tl.load(cp), tl.load(cp + 4), tl.load(cp + 8),
                     tl.load(cp + 12), fv, x0, x1, x2, x3, dt, False),
             mask=mask_h)
    tl.store(o + H, _mix(tl.load(pp + 1), tl.load(cp + 1), tl.load(cp + 5), tl.load(cp + 9),
                         tl.load(cp + 13), fv, x0, x1, x2, x3, dt, False),
             mask=mask_h)
    tl.store(o + 2 * H, _mix(tl.load(pp + 2), tl.load(cp + 2), tl.load(cp + 6), tl.load(cp + 10),
                             tl.load(cp + 14), fv, x0, x1, x2, x3, dt, False),
             mask=mask_h)
    tl.store(o + 3 * H, _mix(tl.load(pp + 3), tl.load(cp + 3), tl.load(cp + 7), tl.load(cp + 11),
                             tl.load(cp + 15), fv, x0, x1, x2, x3, dt, False),
             mask=mask_h)


class _Config(NamedTuple):
    block_t: int
    block_k: int
    chunks_per_split: int
    num_splits: int
    block_h: int
    partials_warps: int
    finalize_warps: int
    pdl: bool
    # the partials as a programmatic dependent launch too, loading fn before they wait (needs
    # one chunk per split, and pdl)
    wait: bool = False
    # the finalize's split sums as independent one-axis reductions (else [4, splits] tiles)
    vector_sums: bool = False
    # the partials load their fn columns first (with wait: before they wait)
    prefetch_fn: bool = False
    # the partials on tensor cores (bf16 streams)
    mma: bool = False
    # with mma: tokens as the tile's rows (_mhc_partials_token_mma_kernel), else rows (t, i)
    token_rows: bool = False
    # the partials' software-pipeline stages (None: Triton's default)
    stages: int | None = None
    # with token_rows: fn split into bf16 parts by a launch of its own first
    presplit: bool = False
    # with pdl: the finalize lets the next launch start before its own wait, else after it
    early_release: bool = True


def _config(T: int, H: int, num_sms: int, block_t=None, block_k=None, num_splits=None,
            block_h=None, warps=None, pdl=None, wait=None, vector_sums=None,
            prefetch_fn=None, mma=None, dtype=None, device_index=-1, token_rows=None,
            stages=None, presplit=None, boundary=False, on_gpu=None,
            release=None, early_release=None) -> _Config:
    # on_gpu: plan as on an sm_90+ NVIDIA GPU (True) or in the interpreter (False) whatever
    # device_index is (the tables' planner queries, no device needed); release: the Triton
    # (major, minor) the kernels are compiled with, default the imported one
    # Small T (decode) is latency-bound and fn (2.75 MB at H = 7168) dominates: one 64-wide
    # chunk of h per program (112 programs at H = 7168, 64 at H = 4096: ~every SM reads one
    # slice of fn once), up to 8 tokens per program; 112 splits also keep the finalize's tiles
    # of partial sums in registers. 33-64 tokens: 4-token blocks; more: 8-token blocks and ~4
    # programs per SM, each looping over a run of chunks (fn from L2 per block). Tile and warps
    # per range from the H200 sweep in benchmarks/results/mhc/mhc_probe.json.
    if mma is None:
        mma = (dtype == torch.bfloat16 and T >= MMA_MIN_TOKENS
               and ((device_index >= 0 if on_gpu is None else on_gpu)
                    or interpreter_multiplies_bf16()))
    if mma:
        return _mma_config(T, H, num_sms, block_t, block_k, num_splits, block_h, warps,
                           token_rows, stages, presplit, boundary)
    small = T <= 32
    invariant = T <= INVARIANT_MAX_TOKENS  # one tiling for all of them
    if block_t is None:
        block_t = 4 if invariant else min(next_power_of_2(T), 4 if 32 < T <= 64 else 8)
        if (boundary and 8 < T <= 16
                and (release or triton_release()) >= SMALL_BLOCKS_FROM_TRITON):
            block_t = 4
    if block_k is None:
        block_k = 64 if small else 32
    n_chunks = cdiv(H, block_k)
    if num_splits is None:
        num_splits = n_chunks if small else min(
            n_chunks, max(1, 4 * num_sms // cdiv(T, block_t)))
    chunks_per_split = cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
    num_splits = cdiv(n_chunks, chunks_per_split)
    if block_h is None:
        # the finalize's H-blocks: more, narrower programs while few tokens leave SMs idle
        # (benchmarks/results/mhc/mhc_sweep.json: 256 at T = 3-4 and 512 at 5-8 cut the boundary
        # by 0.4 and 1.2 us at T = 4 and 8)
        block_h = 256 if invariant else 512 if T <= 8 else 1024 if T <= 128 else 512
    pdl_capable = supports_pdl if on_gpu is None else lambda index: on_gpu
    if pdl is None:
        pdl = T <= PDL_MAX_TOKENS and pdl_capable(device_index)
    elif pdl and not pdl_capable(device_index):
        raise ValueError("pdl needs an sm_90+ GPU")
    if wait is None:
        # the partials as a dependent launch, fn loaded before the wait, up to 8 tokens: the
        # boundary 0.3-0.75 us faster at T = 1-8 and 0.9 us slower at 16 (H = 7168;
        # benchmarks/results/mhc/mhc_sweep.json)
        wait = T <= WAIT_MAX_TOKENS
    wait = bool(wait and pdl and chunks_per_split == 1)
    if vector_sums is None:
        # independent sums where the splits are many (112 at H = 7168): 0.03-0.31 us off the
        # boundary at T = 1-32 there; at 64 splits (H = 4096) the tiles were up to 0.08 us
        # faster (mhc_sweep.json, "vector" against "default")
        vector_sums = T <= 32 and num_splits >= 96
    if warps is None:
        # the finalize's reductions stay in-warp shuffles with one warp; a dependent partials
        # launch at one token holds its fn columns in 4 warps' registers
        warps = (4 if invariant else 2 if 16 < T <= 64 else 4, 1)
    prefetch_fn = bool((wait if prefetch_fn is None else prefetch_fn) and chunks_per_split == 1)
    if early_release is None:
        early_release = FINALIZE_EARLY_RELEASE
    return _Config(block_t, block_k, chunks_per_split, num_splits, block_h, warps[0], warps[1],
                   pdl, wait, bool(vector_sums), prefetch_fn or wait,
                   early_release=bool(early_release and pdl))


def _mma_config(T: int, H: int, num_sms: int, block_t, block_k, num_splits, block_h,
                warps, token_rows=None, stages=None, presplit=None, boundary=False) -> _Config:
    # Tensor-core partials. mhc_pre: tokens as rows, 64 per program, 32-wide chunks, 4 warps,
    # 3 stages, fn split into bf16 parts by its own launch first, about two programs per SM
    # (the best of benchmarks/results/mhc/mhc_large_t.json at 1024 and 4096 tokens, 1.3-1.9x
    # the (t, i) rows at 256-4096). The boundary: rows (t, i), 32 tokens, 64-wide chunks,
    # 8 warps (mhc_sweep.json) below BOUNDARY_TOKEN_ROWS_MIN_TOKENS; from there token rows
    # with fn split per chunk, 16-wide chunks and 3 stages (the split launch was slower with
    # the new residual formed in the same program; 16-wide chunks with 3 stages 1.04-1.14x the
    # 2 stages and 1.17-1.26x the 32-wide chunks at 512-4096 tokens, both widths:
    # mhc_boundary_token_rows_fma.json). The finalize as at large T on CUDA cores, in wider
    # H-blocks for mhc_pre up to WIDE_FINALIZE_MAX_ELEMENTS.
    if token_rows is None:
        token_rows = not boundary or T >= BOUNDARY_TOKEN_ROWS_MIN_TOKENS
    if presplit is None:
        presplit = token_rows and not boundary
    if block_t is None:
        block_t = 64 if token_rows else 32
    block_k = block_k or ((16 if boundary else 32) if token_rows else 64)
    n_chunks = cdiv(H, block_k)
    if num_splits is None:
        num_splits = min(n_chunks, max(1, 2 * num_sms // cdiv(T, block_t)))
    chunks_per_split = cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
    num_splits = cdiv(n_chunks, chunks_per_split)
    if block_k > 32 and chunks_per_split == 1:
        # On the H200 (Triton 3.6) the presplit kernel with 64-wide chunks and one chunk per
        # split gave wrong sums (post 0.36-0.81 off, at every stage count, T and width tried)
        # while the interpreter, 32-wide chunks and runs of chunks were exact
        # (benchmarks/results/logs/mhc_token_rows_one_chunk.json): not planned, not allowed.
        presplit = False
    if block_h is None:
        block_h = (1024 if T <= 128 else
                   2048 if not boundary and T * H <= WIDE_FINALIZE_MAX_ELEMENTS else 512)
    if warps is None:
        warps = (4 if token_rows else 8 if block_t >= 32 else 4, 1)
    if stages is None and token_rows:
        stages = 3
    return _Config(block_t, block_k, chunks_per_split, num_splits, block_h, warps[0], warps[1],
                   False, mma=True, token_rows=bool(token_rows), stages=stages,
                   presplit=bool(token_rows and presplit), early_release=False)


@functools.lru_cache(maxsize=4096)
def _plan(T: int, H: int, device_index: int, **overrides) -> _Config:
    return _config(T, H, num_sms(device_index), device_index=device_index, **overrides)


# The partials' fp32 workspace, reused per (stream, shape) by eager calls: launch 1 rewrites every
# slot the finalize reads.
WORKSPACES = WorkspaceCache()


_PARTIALS = LaunchCache(_mhc_partials_kernel)
_PARTIALS_MMA = LaunchCache(_mhc_partials_mma_kernel)
_PARTIALS_TOKEN_MMA = LaunchCache(_mhc_partials_token_mma_kernel)
_SPLIT_FN = LaunchCache(_split_fn_kernel)
_FINALIZE = LaunchCache(_mhc_finalize_kernel)
_POST = LaunchCache(_mhc_post_kernel)
_DIRECT: dict = {}  # key -> (partials, finalize, fn split or None) direct launches


def _pre_launches(x, fn, hc_scale, hc_base, norm_weight, post_out, comb_out, out, rms_eps, hc_eps,
                  norm_eps, post_mult, sinkhorn_iters, cfg: _Config, boundary=None,
                  head: bool = False) -> None:
    """Launch 1 then the finalize; ``boundary = (f, residual, post, comb)`` makes launch 1 form
    ``x`` (the new residual, written into ``x``) from the previous layer's post first. ``head``:
    ``fn`` is hc_head's 4 rows and the finalize writes only ``out`` (``post_out``, ``comb_out``
    unused)."""
    T, _, H = x.shape
    device_index = x.get_device()
    rmsnorm = norm_weight is not None
    weight = norm_weight if rmsnorm else hc_base  # a valid pointer, unused without the norm
    nrows = HC if head else NMIX
    ws = WORKSPACES.get(x, (T, nrows + (10 if rmsnorm else 4), cfg.num_splits), device_index)
    # fn in three bf16 parts [3, 4H, 32] (the token-row partials' presplit), in fp32 scratch
    parts = (WORKSPACES.get(x, (3, 4 * H, 16), device_index).view(torch.bfloat16)
             if cfg.presplit else fn)
    if boundary is None:
        src, f, post_in, comb_in = x, x, hc_scale, hc_scale  # unused pointers: POST is off
    else:
        f, src, post_in, comb_in = boundary
    p1 = (src.data_ptr(), f.data_ptr(), post_in.data_ptr(), comb_in.data_ptr(), x.data_ptr(),
          parts.data_ptr(), ws.data_ptr())
    p2 = (p1[4], p1[6], hc_scale.data_ptr(), hc_base.data_ptr(), weight.data_ptr(),
          post_out.data_ptr(), comb_out.data_ptr(), out.data_ptr())
    # one key for both kernels: everything either binds or specialises on
    key = (T, H, x.dtype, f.dtype, weight.dtype, rmsnorm, boundary is None, head, device_index,
           cfg, rms_eps, hc_eps, norm_eps, post_mult, sinkhorn_iters,
           alignment_key(*p1, *p2, fn.data_ptr()))
    direct = _DIRECT.get(key) if LaunchCache.enabled else None
    if direct is not None:
        if cfg.presplit:
            direct[2](fn.data_ptr(), p1[5])
        direct[0](*p1)
        direct[1](*p2)
        return
    grid1 = (triton.cdiv(T, cfg.block_t) * cfg.num_splits, 1, 1)
    args1 = (src, f, post_in, comb_in, x, fn, ws, T, H, cfg.num_splits, fn.stride(0),
             ws.stride(0), ws.stride(1))
    constexprs1 = partials_constexprs(cfg, boundary is not None, rmsnorm, nrows)
    partials_cache = partials_kernel(cfg)
    if cfg.presplit:
        _SPLIT_FN.launch(key, (triton.cdiv(4 * H, 64), 1, 1), (fn, parts, 4 * H, fn.stride(0)),
                         {"BLOCK_C": 64}, 4)
        args1 = (*args1[:5], parts, *args1[6:])
    partials_cache.launch(key, grid1, args1, constexprs1, cfg.partials_warps,
                          num_stages=cfg.stages, launch_pdl=cfg.wait)
    num_hblocks = triton.cdiv(H, cfg.block_h)
    _FINALIZE.launch(
        key, (T * (num_hblocks + (0 if head else 1)), 1, 1),
        (x, ws, hc_scale, hc_base, weight, post_out, comb_out, out, T, H, cfg.num_splits,
         num_hblocks, rms_eps, hc_eps, norm_eps, post_mult, ws.stride(0), ws.stride(1)),
        finalize_constexprs(cfg, sinkhorn_iters, rmsnorm, boundary is not None, head,
                            fast_math(x), nrows),
        cfg.finalize_warps, launch_pdl=cfg.pdl,
    )
    partials, finalize = partials_cache.get(key), _FINALIZE.get(key)
    split = _SPLIT_FN.get(key) if cfg.presplit else None
    if partials is not None and finalize is not None and (split is not None or not cfg.presplit):
        _DIRECT[key] = (partials, finalize, split)


def partials_kernel(cfg: _Config) -> LaunchCache:
    """Launch 1's kernel for ``cfg``: on CUDA cores, or on tensor cores by rows (t, i) or
    tokens."""
    if not cfg.mma:
        return _PARTIALS
    return _PARTIALS_TOKEN_MMA if cfg.token_rows else _PARTIALS_MMA


def partials_constexprs(cfg: _Config, boundary: bool, rmsnorm: bool, nrows: int) -> dict:
    """Launch 1's constexprs (the vLLM plugin's precompile builds the same launches)."""
    out = {"POST": boundary, "GRAM": rmsnorm, "CHUNKS_PER_SPLIT": cfg.chunks_per_split,
           "BLOCK_T": cfg.block_t, "BLOCK_K": cfg.block_k}
    if not cfg.mma:
        out.update(PDL=cfg.pdl, PREFETCH_FN=cfg.prefetch_fn, WAIT=cfg.wait, NROWS=nrows,
                   ROWS_PAD=32 if nrows > 4 else 4)
    elif cfg.token_rows:
        out["PRESPLIT"] = cfg.presplit
    return out


def finalize_constexprs(cfg: _Config, sinkhorn_iters: int, rmsnorm: bool, boundary: bool,
                        head: bool, fast: bool, nrows: int) -> dict:
    """The finalize's constexprs (the vLLM plugin's precompile builds the same launches)."""
    return {"SINKHORN_ITERS": sinkhorn_iters, "RMSNORM": rmsnorm, "X_EARLY": not boundary,
            "BLOCK_S": triton.next_power_of_2(cfg.num_splits), "BLOCK_H": cfg.block_h,
            "PDL": cfg.pdl, "FAST_MATH": fast, "VECTOR_SUMS": cfg.vector_sums, "HEAD": head,
            "SLOT_D": nrows, "EARLY_RELEASE": cfg.early_release}


def fast_math(x: torch.Tensor) -> bool:
    """Whether kernels on ``x``'s device may use CUDA's approximate division (libdevice): not in
    the interpreter, not on ROCm."""
    return x.is_cuda and not on_rocm()


def _pre_outputs(x: torch.Tensor, T: int, H: int):
    # three allocations: cheaper on the host than views of one buffer (a view costs about as
    # much as an allocation)
    f32 = torch.float32
    return (x.new_empty((T, 4), dtype=f32), x.new_empty((T, 4, 4), dtype=f32),
            x.new_empty((T, H)))


def mhc_pre_triton(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_eps: float, sinkhorn_iters: int, post_mult: float = 2.0,
    norm_weight: torch.Tensor | None = None, norm_eps: float = 0.0,
    out: tuple[torch.Tensor, ...] | None = None, **overrides,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_pre of contiguous ``residual [T, 4, H]`` (T > 0) in 2 launches (3 with fn's split at
    tensor-core sizes): ``(post [T, 4] fp32, comb [T, 4, 4] fp32, layer_input [T, H])``,
    allocated or given as ``out`` (contiguous).
    Inputs are assumed checked by ``dsv4spec.ops.mhc``; ``overrides`` (``block_t``, ``block_k``,
    ``num_splits``, ``block_h``, ``warps``, ``pdl``) change the tiling.
    After the first call of a shape, eager calls launch the cached compiled kernels directly
    (:class:`~dsv4spec.kernels.launch.LaunchCache`); the partials workspace is reused per stream
    and shape, except while a CUDA graph is captured."""
    T, hc, H = residual.shape
    assert hc == HC and T > 0 and residual.is_contiguous() and fn.is_contiguous()
    cfg = _plan(T, H, residual.get_device(), dtype=residual.dtype, **overrides)
    post, comb, out = _pre_outputs(residual, T, H) if out is None else out
    _pre_launches(residual, fn, hc_scale, hc_base, norm_weight, post, comb, out, rms_eps, hc_eps,
                  norm_eps, post_mult, sinkhorn_iters, cfg)
    return post, comb, out


def mhc_post_pre_triton(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_eps: float, sinkhorn_iters: int, post_mult: float = 2.0,
    norm_weight: torch.Tensor | None = None, norm_eps: float = 0.0,
    out: tuple[torch.Tensor, ...] | None = None, **overrides,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_post then the next hc_pre in 2 launches: ``(residual' [T, 4, H], post', comb',
    layer_input)``, allocated or given as ``out``; as :func:`mhc_pre_triton` otherwise."""
    T, hc, H = residual.shape
    assert hc == HC and T > 0 and residual.is_contiguous() and fn.is_contiguous()
    cfg = _plan(T, H, residual.get_device(), dtype=residual.dtype, boundary=True,
                **overrides)
    if out is None:
        new = torch.empty_like(residual)
        post2, comb2, out = _pre_outputs(residual, T, H)
    else:
        new, post2, comb2, out = out
    _pre_launches(new, fn, hc_scale, hc_base, norm_weight, post2, comb2, out, rms_eps, hc_eps,
                  norm_eps, post_mult, sinkhorn_iters, cfg, boundary=(f, residual, post, comb))
    return new, post2, comb2, out


def mhc_post_head_triton(
    f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor, norm_eps: float,
    hc_eps: float, norm_weight: torch.Tensor | None = None, final_norm_eps: float = 0.0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None, fused: bool | None = None,
    **overrides,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model tail in 2 launches: the last layer's hc_post, then hc_head (then the final
    RMSNorm with ``norm_weight``) of the new streams -> ``(residual' [T, 4, H], hidden [T, H])``,
    allocated or given as ``out``. Launch 1 is the boundary's partials over hc_head's 4 rows of
    ``hc_fn`` (the new streams formed, rounded and stored on the way); launch 2 the finalize's
    layer-input programs alone. Above ``TAIL_FUSED_MAX_TOKENS`` tokens it is
    ``mhc_post_triton`` then ``hc_head_triton`` (3 launches), which are faster there: the fused
    partials stay on CUDA cores (the tensor-core kernel holds the boundary's 24 rows).
    ``fused`` True or False forces one path (benchmarks); tiling overrides force the fused one."""
    T, hc, H = residual.shape
    assert hc == HC and T > 0 and residual.is_contiguous() and hc_fn.is_contiguous()
    new, hidden = (torch.empty_like(residual), residual.new_empty((T, H))) if out is None else out
    if fused is None:
        fused = T <= TAIL_FUSED_MAX_TOKENS or bool(overrides)
    if not fused and (norm_weight is None or final_norm_eps == norm_eps):
        # hc_head's own launches (tensor cores, 2-D partials) are faster here; hc_head_triton's
        # RMSNorm takes norm_eps, hence the sequence only where both epsilons agree
        mhc_post_triton(f, residual, post, comb, out=new)
        # the weight as given (fp32 or the streams' dtype): hc_head's finalize multiplies it in
        # fp32 either way, and its launch key holds the weight's dtype
        hc_head_triton(new, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight, out=hidden)
        return new, hidden
    cfg = _plan(T, H, residual.get_device(), mma=False, **overrides)
    # post_out and comb_out are not written with head=True: hidden stands in as a valid pointer
    _pre_launches(new, hc_fn, hc_scale, hc_base, norm_weight, hidden, hidden, hidden, norm_eps,
                  hc_eps, final_norm_eps, 2.0, 1, cfg, boundary=(f, residual, post, comb),
                  head=True)
    return new, hidden


def post_tiling(T: int) -> tuple[int, int]:
    """``mhc_post``'s default (H-block, warps) at ``T`` tokens."""
    # H-blocks of 256 up to 2 tokens, 512 up to 8, 1024 up to 32 (4 warps); 256, then 512 with
    # 2 warps above: the best of benchmarks/results/mhc/mhc_sweep.json per measured T
    return (256 if T <= 2 else 512 if T <= 8 else 1024 if T <= 32 else 256 if T <= 128
            else 512), (4 if T <= 32 else 2)


def mhc_post_triton(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                    comb: torch.Tensor, out: torch.Tensor | None = None,
                    block_h: int | None = None, pdl: bool | None = None,
                    num_warps: int | None = None) -> torch.Tensor:
    """hc_post of contiguous tensors (T > 0) in 1 launch -> ``[T, 4, H]`` in ``residual.dtype``
    (allocated or ``out``)."""
    T, hc, H = residual.shape
    assert hc == HC and T > 0
    default_block_h, default_warps = post_tiling(T)
    block_h = block_h or default_block_h
    if num_warps is None:
        num_warps = default_warps
    device_index = residual.get_device()
    if pdl is None:
        pdl = POST_PDL and supports_pdl(device_index)
    out = torch.empty_like(residual) if out is None else out
    pointers = (f.data_ptr(), residual.data_ptr(), post.data_ptr(), comb.data_ptr(),
                out.data_ptr())
    key = (T, H, residual.dtype, f.dtype, block_h, pdl, num_warps, device_index,
           alignment_key(*pointers))
    direct = _POST.get(key)
    if direct is not None:
        direct(*pointers)
        return out
    num_hblocks = triton.cdiv(H, block_h)
    _POST.launch(key, (T * num_hblocks, 1, 1), (f, residual, post, comb, out, H, num_hblocks),
                 {"BLOCK_H": block_h, "PDL": pdl}, num_warps, launch_pdl=pdl)
    return out


# For scripts that time or sweep each launch on its own
# (benchmarks/results/archive/scripts/mhc_probe.py): the jit kernels, the tiling planner
# (overrides: block_t, block_k, num_splits, block_h, warps, pdl), and the output allocation and
# launches of mhc_pre_triton.
JIT_KERNELS = {"partials": _mhc_partials_kernel, "partials_mma": _mhc_partials_mma_kernel,
               "partials_token_mma": _mhc_partials_token_mma_kernel,
               "split_fn": _split_fn_kernel,
               "finalize": _mhc_finalize_kernel,
               "post": _mhc_post_kernel}
# The jit helpers of the token-row partials, for launch-1 prototypes built on them
# (scripts/mhc_tma_ab.py): the previous layer's mixes, the new residual, the Gram sums and the
# workspace stores, as the library's kernels compute them.
JIT_HELPERS = {"load_mixes": _load_mixes, "store_new_residual": _store_new_residual,
               "token_grams_zero": _token_grams_zero, "token_grams_add": _token_grams_add,
               "store_token_partials": _store_token_partials}
tiling = _config
plan = _plan
pre_outputs = _pre_outputs
pre_launches = _pre_launches
