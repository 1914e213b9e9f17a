"""Fused mHC boundary ops for hc_mult = 4: ``mhc_pre``, ``mhc_post`` and ``mhc_post_pre``.

``mhc_pre`` is 2 launches. Launch 1 (partials), grid = token blocks x K-splits: each program
reads BLOCK_T tokens over a range of h for the 4 streams and the matching columns of all 24 rows
of ``fn`` and writes, per token, fp32 partial sums: the 24 dot products ``xf @ fn.T``, the diagonal
of the streams' Gram matrix ``G_ij = sum_h x_i[h] x_j[h]`` (its trace is ``sum(xf^2)``) and, with
the sublayer RMSNorm, the 6 off-diagonal entries. Launch 2 (finalize), grid = tokens x H-blocks:
each program reduces its token's partials, forms r, the pre weights and its H-block of
``y = sum_i pre_i x_i``; the first H-block's program also writes ``post`` and runs the Sinkhorn
on the 4 x 4 ``comb`` in registers. The RMSNorm's ``sum_h y^2 = w^T G w`` is known before any y
is formed, so the norm costs 6 more reductions, not another pass.

``mhc_post_pre`` (one layer boundary) is the same 2 launches: launch 1 first forms its slice of
the new residual ``x'_j = post_j f + sum_i comb[i, j] x_i``, rounds it to the stream dtype, stores
it and accumulates the partials from those rounded values (what a separate post then pre sees).
``mhc_post`` alone is one launch over (tokens, H-blocks).

Bytes (bf16, H = 7168, T = 4): ``fn`` is 24 x 28672 fp32 = 2.75 MB, a different tensor per layer,
so it dominates; the partials spread it over ~100-200 programs (one HBM round trip for the whole
GPU). x is 229 KB, the boundary's new residual another 229 KB written and read back from L2.
On sm_90+ up to ``PDL_MAX_TOKENS`` tokens the finalize is a programmatic dependent launch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4spec.kernels.hc_head import (
    _interpreter_multiplies_bf16,
    _num_sms,
    _round_to,
    _supports_pdl,
)
from dsv4spec.kernels.launch import LaunchCache, alignment_key
from dsv4spec.kernels.workspace import WorkspaceCache

HC = 4
NMIX = (2 + HC) * HC  # 24 rows of fn: pre 0-3, post 4-7, comb 8-23
SLOT_DIAG = NMIX  # ws slots 24-27: diagonal of G; 28-33: (01, 02, 03, 12, 13, 23)
PDL_MAX_TOKENS = 32


@triton.jit
def _dots(fn_rows, col0, offs_h, mask_h, mask_r, xi, BF16: tl.constexpr):
    # [BLOCK_T, 32]: stream i's share of the 24 dot products over this chunk of h, on tensor
    # cores. bf16 x: fn (fp32) as three bf16 parts (hi + mid + lo carry its 24 bits), exact
    # products, fp32 sums, each chunk from zero and the chunks added in fp32 registers (the
    # tensor cores truncate along long chains). Other dtypes: fp32 operands as tf32x3.
    f = tl.trans(tl.load(fn_rows[:, None] + col0 + offs_h[None, :],
                         mask=mask_r[:, None] & mask_h[None, :], other=0.0))
    if BF16:
        hi = f.to(tl.bfloat16)
        rest = f - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(xi, hi, tl.dot(xi, mid, tl.dot(xi, lo)))
    else:
        return tl.dot(xi, f, input_precision="tf32x3")


@triton.jit
def _mix(p, c0, c1, c2, c3, fv, x0, x1, x2, x3, DTYPE: tl.constexpr):
    # x'_j = post_j f + sum_i comb[i, j] x_i, rounded to the stream dtype (then exact in fp32)
    v = p[:, None] * fv + (c0[:, None] * x0 + c1[:, None] * x1 + c2[:, None] * x2
                           + c3[:, None] * x3)
    return _round_to(v, DTYPE)


@triton.jit
def _mhc_partials_kernel(
    x_ptr, f_ptr, post_ptr, comb_ptr, xnew_ptr, fn_ptr, ws_ptr,
    T, H, NUM_SPLITS, stride_fn, stride_wt, stride_wk,
    POST: tl.constexpr, GRAM: tl.constexpr, BF16: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # let the finalize start now: it loads its parameters, then waits for these
        gdc_launch_dependents()
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    offs_t = (pid // NUM_SPLITS) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    rows = offs_t * (4 * H)
    offs_r = tl.arange(0, 32)
    mask_r = offs_r < 24
    fn_rows = fn_ptr + offs_r * stride_fn
    if POST:  # the previous layer's post and comb, per token
        pp = post_ptr + offs_t * 4
        p0 = tl.load(pp, mask=mask_t, other=0.0)
        p1 = tl.load(pp + 1, mask=mask_t, other=0.0)
        p2 = tl.load(pp + 2, mask=mask_t, other=0.0)
        p3 = tl.load(pp + 3, mask=mask_t, other=0.0)
        cp = comb_ptr + offs_t * 16
        c00 = tl.load(cp, mask=mask_t, other=0.0)
        c01 = tl.load(cp + 1, mask=mask_t, other=0.0)
        c02 = tl.load(cp + 2, mask=mask_t, other=0.0)
        c03 = tl.load(cp + 3, mask=mask_t, other=0.0)
        c10 = tl.load(cp + 4, mask=mask_t, other=0.0)
        c11 = tl.load(cp + 5, mask=mask_t, other=0.0)
        c12 = tl.load(cp + 6, mask=mask_t, other=0.0)
        c13 = tl.load(cp + 7, mask=mask_t, other=0.0)
        c20 = tl.load(cp + 8, mask=mask_t, other=0.0)
        c21 = tl.load(cp + 9, mask=mask_t, other=0.0)
        c22 = tl.load(cp + 10, mask=mask_t, other=0.0)
        c23 = tl.load(cp + 11, mask=mask_t, other=0.0)
        c30 = tl.load(cp + 12, mask=mask_t, other=0.0)
        c31 = tl.load(cp + 13, mask=mask_t, other=0.0)
        c32 = tl.load(cp + 14, mask=mask_t, other=0.0)
        c33 = tl.load(cp + 15, mask=mask_t, other=0.0)
    acc = tl.zeros([BLOCK_T, 32], dtype=tl.float32)
    g00 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g11 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g22 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g33 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g01 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g02 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g03 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g12 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g13 = tl.zeros([BLOCK_T], dtype=tl.float32)
    g23 = tl.zeros([BLOCK_T], dtype=tl.float32)
    for c in range(0, CHUNKS_PER_SPLIT):
        offs_h = (split * CHUNKS_PER_SPLIT + c) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask = mask_t[:, None] & mask_h[None, :]
        offs = rows[:, None] + offs_h[None, :]
        x0 = tl.load(x_ptr + offs, mask=mask, other=0.0)
        x1 = tl.load(x_ptr + offs + H, mask=mask, other=0.0)
        x2 = tl.load(x_ptr + offs + 2 * H, mask=mask, other=0.0)
        x3 = tl.load(x_ptr + offs + 3 * H, mask=mask, other=0.0)
        if POST:
            dt = xnew_ptr.dtype.element_ty
            fv = tl.load(f_ptr + offs_t[:, None] * H + offs_h[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            x0 = x0.to(tl.float32)
            x1 = x1.to(tl.float32)
            x2 = x2.to(tl.float32)
            x3 = x3.to(tl.float32)
            n0 = _mix(p0, c00, c10, c20, c30, fv, x0, x1, x2, x3, dt)
            n1 = _mix(p1, c01, c11, c21, c31, fv, x0, x1, x2, x3, dt)
            n2 = _mix(p2, c02, c12, c22, c32, fv, x0, x1, x2, x3, dt)
            n3 = _mix(p3, c03, c13, c23, c33, fv, x0, x1, x2, x3, dt)
            tl.store(xnew_ptr + offs, n0, mask=mask)
            tl.store(xnew_ptr + offs + H, n1, mask=mask)
            tl.store(xnew_ptr + offs + 2 * H, n2, mask=mask)
            tl.store(xnew_ptr + offs + 3 * H, n3, mask=mask)
            x0, x1, x2, x3 = n0, n1, n2, n3
        if not BF16:
            x0 = x0.to(tl.float32)
            x1 = x1.to(tl.float32)
            x2 = x2.to(tl.float32)
            x3 = x3.to(tl.float32)
        acc += _dots(fn_rows, 0, offs_h, mask_h, mask_r, x0, BF16)
        acc += _dots(fn_rows, H, offs_h, mask_h, mask_r, x1, BF16)
        acc += _dots(fn_rows, 2 * H, offs_h, mask_h, mask_r, x2, BF16)
        acc += _dots(fn_rows, 3 * H, offs_h, mask_h, mask_r, x3, BF16)
        x0 = x0.to(tl.float32)
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        x3 = x3.to(tl.float32)
        g00 += tl.sum(x0 * x0, axis=1)
        g11 += tl.sum(x1 * x1, axis=1)
        g22 += tl.sum(x2 * x2, axis=1)
        g33 += tl.sum(x3 * x3, axis=1)
        if GRAM:
            g01 += tl.sum(x0 * x1, axis=1)
            g02 += tl.sum(x0 * x2, axis=1)
            g03 += tl.sum(x0 * x3, axis=1)
            g12 += tl.sum(x1 * x2, axis=1)
            g13 += tl.sum(x1 * x3, axis=1)
            g23 += tl.sum(x2 * x3, axis=1)
    # ws[t, slot, split]
    ws = ws_ptr + offs_t * stride_wt + split
    tl.store(ws[:, None] + offs_r[None, :] * stride_wk, acc, mask=mask_t[:, None] & mask_r[None, :])
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
def _total(ws_ptr, SLOT: tl.constexpr, stride_wk, offs_s, mask_s):
    return tl.sum(tl.load(ws_ptr + SLOT * stride_wk + offs_s, mask=mask_s, other=0.0), axis=0)


@triton.jit
def _normalise(a, b, c, d, eps):
    # one row or column divided by (its sum + eps); an approximate reciprocal (2 ulp) and four
    # products instead of four IEEE divisions
    inv = tl.fdiv(1.0, a + b + c + d + eps, ieee_rounding=False)
    return a * inv, b * inv, c * inv, d * inv


@triton.jit
def _softmax_row(ws, SLOT: tl.constexpr, stride_wk, offs_s, mask_s, r, s2, base_ptr, eps):
    l0 = _total(ws, SLOT, stride_wk, offs_s, mask_s) * r * s2 + tl.load(base_ptr + SLOT)
    l1 = _total(ws, SLOT + 1, stride_wk, offs_s, mask_s) * r * s2 + tl.load(base_ptr + SLOT + 1)
    l2 = _total(ws, SLOT + 2, stride_wk, offs_s, mask_s) * r * s2 + tl.load(base_ptr + SLOT + 2)
    l3 = _total(ws, SLOT + 3, stride_wk, offs_s, mask_s) * r * s2 + tl.load(base_ptr + SLOT + 3)
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
def _mhc_finalize_kernel(
    x_ptr, ws_ptr, scale_ptr, base_ptr, weight_ptr, post_ptr, comb_ptr, out_ptr,
    T, H, NUM_SPLITS, NUM_HBLOCKS, rms_eps, hc_eps, norm_eps, post_mult, stride_wt, stride_wk,
    SINKHORN_ITERS: tl.constexpr, RMSNORM: tl.constexpr, X_EARLY: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    # Last token first: launch 1 read x in token order, so its newest rows are still in L2.
    t = T - 1 - pid // NUM_HBLOCKS
    hb = pid % NUM_HBLOCKS
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    xr = x_ptr + t * (4 * H) + offs_h
    # Loads that do not depend on launch 1 first (with PDL they overlap its tail). The fused
    # boundary's x is launch 1's output: it is loaded after the wait.
    if X_EARLY:
        x0 = tl.load(xr, mask=mask_h, other=0.0).to(tl.float32)
        x1 = tl.load(xr + H, mask=mask_h, other=0.0).to(tl.float32)
        x2 = tl.load(xr + 2 * H, mask=mask_h, other=0.0).to(tl.float32)
        x3 = tl.load(xr + 3 * H, mask=mask_h, other=0.0).to(tl.float32)
    s0 = tl.load(scale_ptr)
    b0 = tl.load(base_ptr)
    b1 = tl.load(base_ptr + 1)
    b2 = tl.load(base_ptr + 2)
    b3 = tl.load(base_ptr + 3)
    if RMSNORM:
        nw = tl.load(weight_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
    if not X_EARLY:
        x0 = tl.load(xr, mask=mask_h, other=0.0).to(tl.float32)
        x1 = tl.load(xr + H, mask=mask_h, other=0.0).to(tl.float32)
        x2 = tl.load(xr + 2 * H, mask=mask_h, other=0.0).to(tl.float32)
        x3 = tl.load(xr + 3 * H, mask=mask_h, other=0.0).to(tl.float32)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    ws = ws_ptr + t * stride_wt
    g00 = _total(ws, 24, stride_wk, offs_s, mask_s)
    g11 = _total(ws, 25, stride_wk, offs_s, mask_s)
    g22 = _total(ws, 26, stride_wk, offs_s, mask_s)
    g33 = _total(ws, 27, stride_wk, offs_s, mask_s)
    r = 1.0 / tl.sqrt((g00 + g11 + g22 + g33) / (4 * H) + rms_eps)
    w0 = tl.sigmoid(_total(ws, 0, stride_wk, offs_s, mask_s) * r * s0 + b0) + hc_eps
    w1 = tl.sigmoid(_total(ws, 1, stride_wk, offs_s, mask_s) * r * s0 + b1) + hc_eps
    w2 = tl.sigmoid(_total(ws, 2, stride_wk, offs_s, mask_s) * r * s0 + b2) + hc_eps
    w3 = tl.sigmoid(_total(ws, 3, stride_wk, offs_s, mask_s) * r * s0 + b3) + hc_eps
    y = _round_to(w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3, out_ptr.dtype.element_ty)
    if RMSNORM:
        g01 = _total(ws, 28, stride_wk, offs_s, mask_s)
        g02 = _total(ws, 29, stride_wk, offs_s, mask_s)
        g03 = _total(ws, 30, stride_wk, offs_s, mask_s)
        g12 = _total(ws, 31, stride_wk, offs_s, mask_s)
        g13 = _total(ws, 32, stride_wk, offs_s, mask_s)
        g23 = _total(ws, 33, stride_wk, offs_s, mask_s)
        # sum_h y^2 = w^T G w of the fp32 y (the reference squares y rounded to x.dtype; the
        # difference is far below the output's rounding)
        yy = w0 * w0 * g00 + w1 * w1 * g11 + w2 * w2 * g22 + w3 * w3 * g33
        yy += 2.0 * (w0 * (w1 * g01 + w2 * g02 + w3 * g03) + w1 * (w2 * g12 + w3 * g13)
                     + w2 * w3 * g23)
        rstd = 1.0 / tl.sqrt(yy / H + norm_eps)
        y = _round_to(y.to(tl.float32) * rstd * nw, out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * H + offs_h, y, mask=mask_h)
    if hb == 0:
        s1 = tl.load(scale_ptr + 1)
        for j in tl.static_range(4):
            pl = _total(ws, 4 + j, stride_wk, offs_s, mask_s)
            tl.store(post_ptr + t * 4 + j, post_mult * tl.sigmoid(pl * r * s1
                                                                  + tl.load(base_ptr + 4 + j)))
        s2 = tl.load(scale_ptr + 2)
        # 16 scalars per thread, no cross-thread traffic: 4 x 4 tensors cost a shuffle or a
        # barrier per reduction, 80 of them in 20 passes
        c00, c01, c02, c03 = _softmax_row(ws, 8, stride_wk, offs_s, mask_s, r, s2, base_ptr, hc_eps)
        c10, c11, c12, c13 = _softmax_row(ws, 12, stride_wk, offs_s, mask_s, r, s2, base_ptr,
                                          hc_eps)
        c20, c21, c22, c23 = _softmax_row(ws, 16, stride_wk, offs_s, mask_s, r, s2, base_ptr,
                                          hc_eps)
        c30, c31, c32, c33 = _softmax_row(ws, 20, stride_wk, offs_s, mask_s, r, s2, base_ptr,
                                          hc_eps)
        c00, c10, c20, c30 = _normalise(c00, c10, c20, c30, hc_eps)
        c01, c11, c21, c31 = _normalise(c01, c11, c21, c31, hc_eps)
        c02, c12, c22, c32 = _normalise(c02, c12, c22, c32, hc_eps)
        c03, c13, c23, c33 = _normalise(c03, c13, c23, c33, hc_eps)
        for _ in range(SINKHORN_ITERS - 1):
            c00, c01, c02, c03 = _normalise(c00, c01, c02, c03, hc_eps)
            c10, c11, c12, c13 = _normalise(c10, c11, c12, c13, hc_eps)
            c20, c21, c22, c23 = _normalise(c20, c21, c22, c23, hc_eps)
            c30, c31, c32, c33 = _normalise(c30, c31, c32, c33, hc_eps)
            c00, c10, c20, c30 = _normalise(c00, c10, c20, c30, hc_eps)
            c01, c11, c21, c31 = _normalise(c01, c11, c21, c31, hc_eps)
            c02, c12, c22, c32 = _normalise(c02, c12, c22, c32, hc_eps)
            c03, c13, c23, c33 = _normalise(c03, c13, c23, c33, hc_eps)
        cp = comb_ptr + t * 16
        _store4(cp, c00, c01, c02, c03)
        _store4(cp + 4, c10, c11, c12, c13)
        _store4(cp + 8, c20, c21, c22, c23)
        _store4(cp + 12, c30, c31, c32, c33)


@triton.jit
def _mhc_post_kernel(
    f_ptr, x_ptr, post_ptr, comb_ptr, out_ptr,
    H, NUM_HBLOCKS,
    BLOCK_H: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    t = pid // NUM_HBLOCKS
    offs_h = (pid % NUM_HBLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    jj = tl.arange(0, 4)
    mask = mask_h[None, :] & (jj[:, None] < 4)
    # [4 streams, BLOCK_H] tiles; out[j] = post_j f + sum_i comb[i, j] x_i
    xs = tl.load(x_ptr + t * (4 * H) + jj[:, None] * H + offs_h[None, :], mask=mask,
                 other=0.0).to(tl.float32)
    fv = tl.load(f_ptr + t * H + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    post = tl.load(post_ptr + t * 4 + jj)
    comb = tl.load(comb_ptr + t * 16 + jj[:, None] * 4 + jj[None, :])  # [i, j]
    mixed = tl.sum(comb[:, :, None] * xs[:, None, :], axis=0)  # [j, BLOCK_H]
    out = _round_to(post[:, None] * fv[None, :] + mixed, out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * (4 * H) + jj[:, None] * H + offs_h[None, :], out, mask=mask)


class _Config(NamedTuple):
    block_t: int
    block_k: int
    chunks_per_split: int
    num_splits: int
    block_h: int
    partials_warps: int
    finalize_warps: int
    pdl: bool


def _config(T: int, H: int, num_sms: int, block_t=None, block_k=None, num_splits=None,
            block_h=None, warps=None, pdl=None, device_index=-1) -> _Config:
    # Small T: fn (2.75 MB at H = 7168) dominates, so cut h into small chunks and spread them
    # over ~2 programs per SM (one HBM round trip). Large T: 32-token tiles, fn from L2 once per
    # tile. The finalize runs one warp: its ~30 reductions over the splits stay in-warp
    # shuffles (4 warps put a barrier behind each; 3-4x slower on the H200).
    if block_t is None:
        block_t = 32 if T >= 256 else 16
    if block_k is None:
        block_k = 32 if T <= 32 else 64
    n_chunks = triton.cdiv(H, block_k)
    if num_splits is None:
        target = 2 * num_sms if T <= 32 else 4 * num_sms
        num_splits = min(n_chunks, max(1, target // triton.cdiv(T, block_t)))
    chunks_per_split = triton.cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
    num_splits = triton.cdiv(n_chunks, chunks_per_split)
    if block_h is None:
        block_h = 1024 if T <= 128 else 512
    if warps is None:
        warps = (4, 1)
    if pdl is None:
        pdl = T <= PDL_MAX_TOKENS and _supports_pdl(device_index)
    elif pdl and not _supports_pdl(device_index):
        raise ValueError("pdl needs an sm_90+ GPU")
    return _Config(block_t, block_k, chunks_per_split, num_splits, block_h, warps[0], warps[1],
                   pdl)


def _bf16_dots(dtype: torch.dtype, device_index: int) -> bool:
    # bf16 streams enter the tensor cores as they are; not in an interpreter whose bf16 dots are
    # wrong (Triton 3.6's, unless patched as the tests do): there tf32x3 on fp32 copies
    return dtype is torch.bfloat16 and (device_index >= 0 or _interpreter_multiplies_bf16())


@functools.lru_cache(maxsize=4096)
def _plan(T: int, H: int, device_index: int, **overrides) -> _Config:
    return _config(T, H, _num_sms(device_index), device_index=device_index, **overrides)


# The partials' fp32 workspace, reused per (stream, shape) by eager calls: launch 1 rewrites every
# slot the finalize reads.
WORKSPACES = WorkspaceCache()


_PARTIALS = LaunchCache(_mhc_partials_kernel)
_FINALIZE = LaunchCache(_mhc_finalize_kernel)
_POST = LaunchCache(_mhc_post_kernel)
_DIRECT: dict = {}  # key -> (partials, finalize) direct launches


def _pre_launches(x, fn, hc_scale, hc_base, norm_weight, post_out, comb_out, out, rms_eps, hc_eps,
                  norm_eps, post_mult, sinkhorn_iters, cfg: _Config, boundary=None) -> None:
    """Launch 1 then the finalize; ``boundary = (f, residual, post, comb)`` makes launch 1 form
    ``x`` (the new residual, written into ``x``) from the previous layer's post first."""
    T, _, H = x.shape
    device_index = x.get_device()
    rmsnorm = norm_weight is not None
    weight = norm_weight if rmsnorm else hc_base  # a valid pointer, unused without the norm
    ws = WORKSPACES.get(x, (T, 34 if rmsnorm else 28, cfg.num_splits), device_index)
    if boundary is None:
        src, f, post_in, comb_in = x, x, hc_scale, hc_scale  # unused pointers: POST is off
    else:
        f, src, post_in, comb_in = boundary
    p1 = (src, f, post_in, comb_in, x, fn, ws)
    p2 = (x, ws, hc_scale, hc_base, weight, post_out, comb_out, out)
    key = (T, H, x.dtype, f.dtype, weight.dtype, rmsnorm, boundary is None, device_index, cfg,
           rms_eps, hc_eps, norm_eps, post_mult, sinkhorn_iters,
           alignment_key(*(t.data_ptr() for t in p1 + p2)))
    direct = _DIRECT.get(key) if LaunchCache.enabled else None
    if direct is not None:
        direct[0](*(t.data_ptr() for t in p1))
        direct[1](*(t.data_ptr() for t in p2))
        return
    grid1 = (triton.cdiv(T, cfg.block_t) * cfg.num_splits, 1, 1)
    _PARTIALS.launch(
        key, grid1, (*p1, T, H, cfg.num_splits, fn.stride(0), ws.stride(0), ws.stride(1)),
        {"POST": boundary is not None, "GRAM": rmsnorm, "BF16": _bf16_dots(x.dtype, device_index),
         "CHUNKS_PER_SPLIT": cfg.chunks_per_split, "BLOCK_T": cfg.block_t,
         "BLOCK_K": cfg.block_k, "PDL": cfg.pdl},
        cfg.partials_warps,
    )
    num_hblocks = triton.cdiv(H, cfg.block_h)
    _FINALIZE.launch(
        key, (T * num_hblocks, 1, 1),
        (*p2, T, H, cfg.num_splits, num_hblocks, rms_eps, hc_eps, norm_eps, post_mult,
         ws.stride(0), ws.stride(1)),
        {"SINKHORN_ITERS": sinkhorn_iters, "RMSNORM": rmsnorm, "X_EARLY": boundary is None,
         "BLOCK_S": triton.next_power_of_2(cfg.num_splits), "BLOCK_H": cfg.block_h,
         "PDL": cfg.pdl},
        cfg.finalize_warps, launch_pdl=cfg.pdl,
    )
    partials, finalize = _PARTIALS.get(key), _FINALIZE.get(key)
    if partials is not None and finalize is not None:
        _DIRECT[key] = (partials, finalize)


def _pre_outputs(x: torch.Tensor, T: int, H: int):
    # post and comb as two contiguous views of one fp32 buffer: one allocation fewer per call
    pc = torch.empty(T * 20, dtype=torch.float32, device=x.device)
    return pc[:4 * T].view(T, 4), pc[4 * T:].view(T, 4, 4), x.new_empty((T, H))


def mhc_pre_triton(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_eps: float, sinkhorn_iters: int, post_mult: float = 2.0,
    norm_weight: torch.Tensor | None = None, norm_eps: float = 0.0,
    out: tuple[torch.Tensor, ...] | None = None, **overrides,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_pre of contiguous ``residual [T, 4, H]`` (T > 0) in 2 launches: ``(post [T, 4] fp32,
    comb [T, 4, 4] fp32, layer_input [T, H])``, allocated or given as ``out`` (contiguous).
    Inputs are assumed checked by ``dsv4spec.ops.mhc``; ``overrides`` (``block_t``, ``block_k``,
    ``num_splits``, ``block_h``, ``warps``, ``pdl``) change the tiling.
    After the first call of a shape, eager calls launch the cached compiled kernels directly
    (:class:`~dsv4spec.kernels.launch.LaunchCache`); the partials workspace is reused per stream
    and shape, except while a CUDA graph is captured."""
    T, hc, H = residual.shape
    assert hc == HC and T > 0 and residual.is_contiguous() and fn.is_contiguous()
    cfg = _plan(T, H, residual.get_device(), **overrides)
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
    cfg = _plan(T, H, residual.get_device(), **overrides)
    if out is None:
        new = torch.empty_like(residual)
        post2, comb2, out = _pre_outputs(residual, T, H)
    else:
        new, post2, comb2, out = out
    _pre_launches(new, fn, hc_scale, hc_base, norm_weight, post2, comb2, out, rms_eps, hc_eps,
                  norm_eps, post_mult, sinkhorn_iters, cfg, boundary=(f, residual, post, comb))
    return new, post2, comb2, out


def mhc_post_triton(f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                    comb: torch.Tensor, out: torch.Tensor | None = None,
                    block_h: int | None = None) -> torch.Tensor:
    """hc_post of contiguous tensors (T > 0) in 1 launch -> ``[T, 4, H]`` in ``residual.dtype``
    (allocated or ``out``)."""
    T, hc, H = residual.shape
    assert hc == HC and T > 0
    block_h = block_h or (512 if T <= 16 else 1024)
    out = torch.empty_like(residual) if out is None else out
    num_hblocks = triton.cdiv(H, block_h)
    pointers = (f, residual, post, comb, out)
    key = (T, H, residual.dtype, f.dtype, block_h, residual.get_device(),
           alignment_key(*(t.data_ptr() for t in pointers)))
    direct = _POST.get(key)
    if direct is not None:
        direct(*(t.data_ptr() for t in pointers))
        return out
    _POST.launch(key, (T * num_hblocks, 1, 1), (*pointers, H, num_hblocks),
                 {"BLOCK_H": block_h}, 4)
    return out
