"""Fused hc_head (docs/design.md) for hc_mult = 4 in two launches, optionally with the head RMSNorm.

Launch 1 (partials), grid = token blocks x K-splits: each program reads BLOCK_T tokens over a range
of h for all 4 streams plus the matching columns of the 4 rows of ``hc_fn``, and writes per token
fp32 partial sums: the 4 dot products ``xf @ hc_fn.T``, the 4 diagonal entries of the streams' Gram
matrix ``G_ij = sum_h x_i[h] x_j[h]`` (their sum is ``sum(xf^2)``), and, for the RMSNorm variant,
the 6 off-diagonal ones. Launch 2 (finalize), grid = tokens x H-blocks: each program reduces its
token's partials (a few hundred floats), forms r, m and the sigmoid weights w, and writes its
H-block of ``y = sum_i w_i x_i``. The RMSNorm needs ``sum_h y^2`` over the full row, which is known
before any y is formed: ``sum_h y^2 = w^T G w`` (fp32). So the RMSNorm costs 6 more reductions in
launch 1 and a weight load in launch 2, and both launches stay parallel over (T, H).

Launch 1 comes in two kernels: on CUDA cores (``_hc_head_partials_kernel``, every dtype) and, for
bf16 x from T * H = ``MMA_MIN_ELEMENTS`` on, on tensor cores (``_hc_head_partials_mma_kernel``:
hc_fn as three bf16 parts, the Gram sums from the x tile times its transpose, a pipelined loop).
On sm_90+ up to ``PDL_MAX_TOKENS`` tokens, launch 2 is a programmatic dependent launch: it loads x
and the parameters while launch 1 runs and waits for its partials only then.
Up to ``INVARIANT_MAX_TOKENS`` (4) tokens one tiling serves every T and neither kernel specialises
on T, so a token gets the same bits alone (decode) as in the verify of its drafts (docs/design.md,
mHC, batch invariance).

Bytes (bf16, H = 7168): T = 4 reads 229 KB of x and the 459 KB ``hc_fn`` (which dominates; split
over ~112 programs so the whole GPU reads it in one round trip), writes 57 KB. T = 1024 reads
58.7 MB of x, ``hc_fn`` once per 16-token block (from L2), writes 14.7 MB; launch 2 reads x a
second time, last token first so the rows launch 1 read last are still in L2 (launch 1 asks L2 to
keep x, launch 2 to drop it).

Here: the device code, the launch builders and :func:`hc_head_triton`. The tiling (which kernel,
blocks, splits, warps, PDL, L2 hints) is planned in ``hc_head_plan.py``; compiling every variant
ahead of the first call is ``hc_head_precompile.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4spec.kernels.device import (
    load_pre_params,
    load_streams,
    mix_rstd,
    round_to,
    split_bf16x3,
    store_token_grams,
)
from dsv4spec.kernels.hc_head_plan import HcHeadConfig, _plan
from dsv4spec.kernels.launch import LaunchCache, alignment_key
from dsv4spec.kernels.workspace import WorkspaceCache

HC = 4


@triton.jit
def _row_terms(fn_ptr, H, offs_h, mask_h, x0, x1, x2, x3):
    # sum_i fn[i*H + h] * x_i[:, h] for one row of hc_fn: [BLOCK_T, BLOCK_K]
    f0 = tl.load(fn_ptr + offs_h, mask=mask_h, other=0.0)
    f1 = tl.load(fn_ptr + H + offs_h, mask=mask_h, other=0.0)
    f2 = tl.load(fn_ptr + 2 * H + offs_h, mask=mask_h, other=0.0)
    f3 = tl.load(fn_ptr + 3 * H + offs_h, mask=mask_h, other=0.0)
    return x0 * f0[None, :] + x1 * f1[None, :] + x2 * f2[None, :] + x3 * f3[None, :]


@triton.jit
def _zeros(BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, ACC_2D: tl.constexpr):
    if ACC_2D:
        return tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    else:
        return tl.zeros([BLOCK_T], dtype=tl.float32)


@triton.jit
def _add(acc, terms, ACC_2D: tl.constexpr):
    # [BLOCK_T, BLOCK_K] terms into the accumulator: elementwise (2-D), or summed over h first
    if ACC_2D:
        return acc + terms
    else:
        return acc + tl.sum(terms, axis=1)


@triton.jit
def _store_total(ws, acc, mask_t, ACC_2D: tl.constexpr):
    if ACC_2D:
        tl.store(ws, tl.sum(acc, axis=1), mask=mask_t)
    else:
        tl.store(ws, acc, mask=mask_t)


@triton.jit(do_not_specialize=["T"])  # one binary for every T: INVARIANT_MAX_TOKENS
def _hc_head_partials_kernel(
    x_ptr, fn_ptr, ws_ptr,
    T, H, NUM_SPLITS,
    stride_xt, stride_xs, stride_fn, stride_wt, stride_wk,
    GRAM: tl.constexpr, ACC_2D: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # let the finalize start now: it loads x and waits for these partials (sm_90+)
        gdc_launch_dependents()
    # ACC_2D: [BLOCK_T, BLOCK_K] accumulators, so a chunk costs FMAs only and the cross-thread
    # sums run once per program; otherwise [BLOCK_T] ones, summed over h every chunk (fewer
    # registers). Which is faster depends on T, H and the RMSNorm (_plan).
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    offs_t = (pid // NUM_SPLITS) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    rows = x_ptr + offs_t[:, None] * stride_xt
    m0 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    m1 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    m2 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    m3 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g00 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g11 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g22 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g33 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g01 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g02 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g03 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g12 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g13 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    g23 = _zeros(BLOCK_T, BLOCK_K, ACC_2D)
    for c in range(0, CHUNKS_PER_SPLIT):
        offs_h = (split * CHUNKS_PER_SPLIT + c) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask = mask_t[:, None] & mask_h[None, :]
        ptrs = rows + offs_h[None, :]
        x0 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(ptrs + stride_xs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + 2 * stride_xs, mask=mask, other=0.0).to(tl.float32)
        x3 = tl.load(ptrs + 3 * stride_xs, mask=mask, other=0.0).to(tl.float32)
        m0 = _add(m0, _row_terms(fn_ptr, H, offs_h, mask_h, x0, x1, x2, x3), ACC_2D)
        m1 = _add(m1, _row_terms(fn_ptr + stride_fn, H, offs_h, mask_h, x0, x1, x2, x3), ACC_2D)
        m2 = _add(m2, _row_terms(fn_ptr + 2 * stride_fn, H, offs_h, mask_h, x0, x1, x2, x3),
                  ACC_2D)
        m3 = _add(m3, _row_terms(fn_ptr + 3 * stride_fn, H, offs_h, mask_h, x0, x1, x2, x3),
                  ACC_2D)
        g00 = _add(g00, x0 * x0, ACC_2D)
        g11 = _add(g11, x1 * x1, ACC_2D)
        g22 = _add(g22, x2 * x2, ACC_2D)
        g33 = _add(g33, x3 * x3, ACC_2D)
        if GRAM:
            g01 = _add(g01, x0 * x1, ACC_2D)
            g02 = _add(g02, x0 * x2, ACC_2D)
            g03 = _add(g03, x0 * x3, ACC_2D)
            g12 = _add(g12, x1 * x2, ACC_2D)
            g13 = _add(g13, x1 * x3, ACC_2D)
            g23 = _add(g23, x2 * x3, ACC_2D)
    # ws[t, k, split]: slots 0-3 dots, 4-7 diagonal of G, 8-13 (01, 02, 03, 12, 13, 23)
    ws = ws_ptr + offs_t * stride_wt + split
    _store_total(ws, m0, mask_t, ACC_2D)
    _store_total(ws + stride_wk, m1, mask_t, ACC_2D)
    _store_total(ws + 2 * stride_wk, m2, mask_t, ACC_2D)
    _store_total(ws + 3 * stride_wk, m3, mask_t, ACC_2D)
    _store_total(ws + 4 * stride_wk, g00, mask_t, ACC_2D)
    _store_total(ws + 5 * stride_wk, g11, mask_t, ACC_2D)
    _store_total(ws + 6 * stride_wk, g22, mask_t, ACC_2D)
    _store_total(ws + 7 * stride_wk, g33, mask_t, ACC_2D)
    if GRAM:
        _store_total(ws + 8 * stride_wk, g01, mask_t, ACC_2D)
        _store_total(ws + 9 * stride_wk, g02, mask_t, ACC_2D)
        _store_total(ws + 10 * stride_wk, g03, mask_t, ACC_2D)
        _store_total(ws + 11 * stride_wk, g12, mask_t, ACC_2D)
        _store_total(ws + 12 * stride_wk, g13, mask_t, ACC_2D)
        _store_total(ws + 13 * stride_wk, g23, mask_t, ACC_2D)


@triton.jit
def _hc_head_partials_mma_kernel(
    x_ptr, fn_ptr, ws_ptr,
    T, H, NUM_SPLITS,
    stride_xt, stride_xs, stride_fn, stride_wt, stride_wk,
    GRAM: tl.constexpr, SUMSQ_DOT: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, X_POLICY: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    # The partials on tensor cores, bf16 x only. A tile holds 4 * BLOCK_T rows r = (t, i) of x
    # (token t, stream i). Its product with the [BLOCK_K, 16] tile of hc_fn whose column
    # c = (j, i') holds hc_fn[j, i' * H + h] gives, at c = (j, i), stream i's share of the dot
    # product j; the other 12 columns are discarded. hc_fn (fp32) enters as three bf16 parts
    # (hi + mid + lo carry its 24 bits); bf16 products are exact and accumulate in fp32. The
    # tile times its own transpose accumulates every (t, i) x (t', j) sum; the 4 x 4 blocks
    # with t = t' are the per-token Gram matrices. hc_fn moves from L2 once per BLOCK_T tokens
    # in 16-column tiles instead of per 8 tokens in fp32 registers, and the loop is pipelined.
    ROWS: tl.constexpr = 4 * BLOCK_T
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    t0 = (pid // NUM_SPLITS) * BLOCK_T
    offs_r = tl.arange(0, ROWS)
    offs_t = t0 + offs_r // 4
    mask_r = offs_t < T
    rows = x_ptr + offs_t * stride_xt + (offs_r % 4) * stride_xs
    offs_c = tl.arange(0, 16)
    fn_cols = fn_ptr + (offs_c // 4) * stride_fn + (offs_c % 4) * H
    acc = tl.zeros([ROWS, 16], dtype=tl.float32)
    if GRAM or SUMSQ_DOT:
        gram = tl.zeros([ROWS, ROWS], dtype=tl.float32)
    else:
        sumsq = tl.zeros([ROWS], dtype=tl.float32)
    for c in range(0, CHUNKS_PER_SPLIT):
        offs_h = (split * CHUNKS_PER_SPLIT + c) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        xt = tl.load(rows[:, None] + offs_h[None, :], mask=mask_r[:, None] & mask_h[None, :],
                     other=0.0, eviction_policy=X_POLICY)
        f = tl.load(fn_cols[None, :] + offs_h[:, None], mask=mask_h[:, None], other=0.0)
        hi, mid, lo = split_bf16x3(f)
        # The tensor cores truncate as they accumulate, so each chunk's products start from
        # zero (smallest parts first) and the chunks add up in fp32 registers, rounded: over
        # 4H = 28672 terms one long chain lost 1.6e-6 of sum(x^2) (docs/design.md).
        acc += tl.dot(xt, hi, tl.dot(xt, mid, tl.dot(xt, lo)))
        if GRAM or SUMSQ_DOT:
            gram += tl.dot(xt, tl.trans(xt))
        else:
            xf = xt.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
    # ws[t, k, split], slots as in _hc_head_partials_kernel
    same_stream = offs_c[None, :] % 4 == offs_r[:, None] % 4
    mix = tl.sum(tl.reshape(tl.where(same_stream, acc, 0.0), [ROWS, 4, 4]), axis=2)  # [(t,i), j]
    mix = tl.sum(tl.reshape(mix, [BLOCK_T, 4, 4]), axis=1)  # [t, j]
    tt = t0 + tl.arange(0, BLOCK_T)
    jj = tl.arange(0, 4)
    tl.store(ws_ptr + tt[:, None] * stride_wt + split + jj[None, :] * stride_wk, mix,
             mask=(tt < T)[:, None])
    ws_rows = ws_ptr + offs_t * stride_wt + split
    if GRAM or SUMSQ_DOT:  # diagonal to slots 4-7, the pairs to 8-13
        store_token_grams(ws_rows, stride_wk, gram, mask_r, ROWS, BLOCK_T, 4, 8, GRAM)
    else:
        tl.store(ws_rows + (4 + offs_r % 4) * stride_wk, sumsq, mask=mask_r)


@triton.jit
def _total(ws_ptr, SLOT: tl.constexpr, stride_wk, offs_s, mask_s):
    return tl.sum(tl.load(ws_ptr + SLOT * stride_wk + offs_s, mask=mask_s, other=0.0), axis=0)


@triton.jit(do_not_specialize=["T"])  # one binary for every T: INVARIANT_MAX_TOKENS
def _hc_head_finalize_kernel(
    x_ptr, ws_ptr, scale_ptr, base_ptr, weight_ptr, out_ptr,
    T, H, NUM_SPLITS, NUM_HBLOCKS, norm_eps, hc_eps,
    stride_xt, stride_xs, stride_wt, stride_wk, stride_ot,
    RMSNORM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
    X_POLICY: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    # Last token first: launch 1 read x in token order, so its newest rows are still in L2.
    t = T - 1 - pid // NUM_HBLOCKS
    hb = pid % NUM_HBLOCKS
    # Everything that does not depend on the partials first: with PDL these loads overlap the
    # partials launch's tail instead of following it.
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    xr = x_ptr + t * stride_xt + offs_h
    x0, x1, x2, x3 = load_streams(xr, stride_xs, mask_h, X_POLICY)
    scale, b0, b1, b2, b3 = load_pre_params(scale_ptr, base_ptr)
    if RMSNORM:
        nw = tl.load(weight_ptr + offs_h, mask=mask_h, other=0.0)
    if PDL:
        gdc_wait()  # the partials launch has finished and its writes are visible
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    ws = ws_ptr + t * stride_wt
    g00 = _total(ws, 4, stride_wk, offs_s, mask_s)
    g11 = _total(ws, 5, stride_wk, offs_s, mask_s)
    g22 = _total(ws, 6, stride_wk, offs_s, mask_s)
    g33 = _total(ws, 7, stride_wk, offs_s, mask_s)
    # r = rsqrt(mean(xf^2) + eps) over all 4H values; sum(xf^2) = trace(G)
    r = 1.0 / tl.sqrt((g00 + g11 + g22 + g33) / (4 * H) + norm_eps)
    w0 = tl.sigmoid(_total(ws, 0, stride_wk, offs_s, mask_s) * r * scale + b0) + hc_eps
    w1 = tl.sigmoid(_total(ws, 1, stride_wk, offs_s, mask_s) * r * scale + b1) + hc_eps
    w2 = tl.sigmoid(_total(ws, 2, stride_wk, offs_s, mask_s) * r * scale + b2) + hc_eps
    w3 = tl.sigmoid(_total(ws, 3, stride_wk, offs_s, mask_s) * r * scale + b3) + hc_eps
    y = w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3
    # hc_head returns x.dtype; the RMSNorm then runs on that rounded y, as in the reference.
    y = round_to(y, out_ptr.dtype.element_ty)
    if RMSNORM:
        g01 = _total(ws, 8, stride_wk, offs_s, mask_s)
        g02 = _total(ws, 9, stride_wk, offs_s, mask_s)
        g03 = _total(ws, 10, stride_wk, offs_s, mask_s)
        g12 = _total(ws, 11, stride_wk, offs_s, mask_s)
        g13 = _total(ws, 12, stride_wk, offs_s, mask_s)
        g23 = _total(ws, 13, stride_wk, offs_s, mask_s)
        rstd = mix_rstd(w0, w1, w2, w3, g00, g11, g22, g33, g01, g02, g03, g12, g13, g23, H,
                        norm_eps)
        y = round_to(y.to(tl.float32) * rstd * nw, out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_ot + offs_h, y, mask=mask_h)


_PARTIALS = LaunchCache(_hc_head_partials_kernel)
_PARTIALS_MMA = LaunchCache(_hc_head_partials_mma_kernel)
_FINALIZE = LaunchCache(_hc_head_finalize_kernel)
# The jit kernels by name, for tools that compile one without launching it
# (scripts/hc_head_partials_ptx.py, in git at 0da66d4, digests the partials kernel's PTX).
JIT_KERNELS = {"partials": _hc_head_partials_kernel, "partials_mma": _hc_head_partials_mma_kernel,
               "finalize": _hc_head_finalize_kernel}
# key -> (partials, finalize) direct launches, so an eager call hashes its key once
_DIRECT: dict = {}
# The partials workspace of eager calls, reused per (stream, shape): an eager call is
# launch-bound, and an allocation costs as much host time as a launch. T x 8 (14 with the
# RMSNorm) x splits fp32: 4 KB at T = 4, H = 7168; 2.3 MB at T = 4096.
WORKSPACES = WorkspaceCache()


def _partials_launch(x, hc_fn, ws, cfg: HcHeadConfig, rmsnorm: bool, num_warps: int):
    """Launch 1 as (launch cache, grid, runtime args, constexprs, launch options)."""
    T, _, H = x.shape
    grid = (triton.cdiv(T, cfg.block_t) * cfg.num_splits, 1, 1)
    args = (x, hc_fn, ws, T, H, cfg.num_splits,
            x.stride(0), x.stride(1), hc_fn.stride(0), ws.stride(0), ws.stride(1))
    if cfg.mma:
        constexprs = {"GRAM": rmsnorm, "SUMSQ_DOT": cfg.sumsq_dot,
                      "CHUNKS_PER_SPLIT": cfg.chunks_per_split, "BLOCK_T": cfg.block_t,
                      "BLOCK_K": cfg.block_k, "PDL": cfg.pdl,
                      "X_POLICY": "evict_last" if cfg.evict_hints else ""}
        return _PARTIALS_MMA, grid, args, constexprs, _options(num_warps, cfg.stages, False)
    constexprs = {"GRAM": rmsnorm, "ACC_2D": cfg.partials_2d,
                  "CHUNKS_PER_SPLIT": cfg.chunks_per_split, "BLOCK_T": cfg.block_t,
                  "BLOCK_K": cfg.block_k, "PDL": cfg.pdl}
    return _PARTIALS, grid, args, constexprs, _options(num_warps, None, False)


def _finalize_launch(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps,
                     cfg: HcHeadConfig, num_warps: int):
    """Launch 2 as (launch cache, grid, runtime args, constexprs, launch options)."""
    T, _, H = x.shape
    rmsnorm = norm_weight is not None
    weight = norm_weight if rmsnorm else hc_base  # an unused but valid pointer
    num_hblocks = triton.cdiv(H, cfg.block_h)
    args = (x, ws, hc_scale, hc_base, weight, out,
            T, H, cfg.num_splits, num_hblocks, float(norm_eps), float(hc_eps),
            x.stride(0), x.stride(1), ws.stride(0), ws.stride(1), out.stride(0))
    constexprs = {"RMSNORM": rmsnorm, "BLOCK_S": triton.next_power_of_2(cfg.num_splits),
                  "BLOCK_H": cfg.block_h, "PDL": cfg.pdl,
                  "X_POLICY": "evict_first" if cfg.evict_hints else ""}
    return _FINALIZE, (T * num_hblocks, 1, 1), args, constexprs, _options(num_warps, None,
                                                                          cfg.pdl)


def _options(num_warps: int, num_stages: int | None, launch_pdl: bool) -> dict:
    options = {"num_warps": num_warps}
    if num_stages is not None:
        options["num_stages"] = num_stages
    if launch_pdl:
        options["launch_pdl"] = True
    return options


def _launch(launch, key) -> None:
    cache, grid, args, constexprs, options = launch
    cache.launch(key, grid, args, constexprs, **options)  # the options are launch()'s keywords


def launch_partials(x: torch.Tensor, hc_fn: torch.Tensor, ws: torch.Tensor, cfg: HcHeadConfig,
                    rmsnorm: bool, num_warps: int = 4, key: tuple | None = None) -> None:
    """Launch 1 on an explicit tiling ``cfg``: the partials of ``x [T, 4, H]`` and ``hc_fn`` into
    ``ws [T, 8 or 14 with rmsnorm, cfg.num_splits]`` (fp32). ``key`` names the compiled launch in
    its cache (by default everything the launch binds or specialises on). For tuning scripts."""
    if key is None:
        key = (x.shape[0], x.shape[2], x.dtype, cfg, rmsnorm, num_warps, x.get_device(),
               alignment_key(x.data_ptr(), hc_fn.data_ptr(), ws.data_ptr()))
    _launch(_partials_launch(x, hc_fn, ws, cfg, rmsnorm, num_warps), key)


def launch_finalize(x: torch.Tensor, ws: torch.Tensor, hc_scale: torch.Tensor,
                    hc_base: torch.Tensor, norm_weight: torch.Tensor | None, out: torch.Tensor,
                    norm_eps: float, hc_eps: float, cfg: HcHeadConfig, num_warps: int = 4,
                    key: tuple | None = None) -> None:
    """Launch 2 on an explicit tiling ``cfg``: ``out [T, H]`` from ``x`` and the partials in
    ``ws`` that :func:`launch_partials` wrote on the same ``cfg`` (with the RMSNorm when
    ``norm_weight`` is given). ``key`` as there. For tuning scripts."""
    if key is None:
        weight = hc_base if norm_weight is None else norm_weight
        key = (x.shape[0], x.shape[2], x.dtype, cfg, norm_weight is not None, num_warps,
               x.get_device(), float(norm_eps), float(hc_eps),
               alignment_key(*(t.data_ptr() for t in (x, ws, hc_scale, hc_base, weight, out))))
    _launch(_finalize_launch(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps, cfg,
                             num_warps), key)


def partials_launch(x: torch.Tensor, hc_fn: torch.Tensor, rmsnorm: bool,
                    ws: torch.Tensor | None = None, **overrides):
    """Launch 1 alone, on the plan :func:`hc_head_triton` picks for the same tiling ``overrides``
    (its keyword arguments): ``(launch, ws, cfg)``, where ``launch()`` writes the partials into
    ``ws`` (allocated when not given). For tests, sweeps and profilers."""
    T, _, H = x.shape
    plan = {"block_k": None, "num_splits": None, "block_h": None, **overrides}
    cfg, ws_shape, warps = _plan(T, H, x.get_device(), rmsnorm, plan.pop("block_k"),
                                 plan.pop("num_splits"), plan.pop("block_h"), dtype=x.dtype,
                                 **plan)
    if ws is None:
        ws = torch.empty(ws_shape, device=x.device)
    elif ws.shape != ws_shape:
        raise ValueError(f"ws must have shape {ws_shape}, got {tuple(ws.shape)}")
    return (lambda: launch_partials(x, hc_fn, ws, cfg, rmsnorm, warps[0])), ws, cfg


def hc_head_triton(
    x: torch.Tensor,
    hc_fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    norm_eps: float,
    hc_eps: float,
    norm_weight: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    block_k: int | None = None,
    num_splits: int | None = None,
    block_h: int | None = None,
    partials_2d: bool | None = None,
    block_t: int | None = None,
    warps: tuple[int, int] | None = None,
    mma: bool | None = None,
    stages: int | None = None,
    sumsq_dot: bool | None = None,
    pdl: bool | None = None,
    evict_hints: bool | None = None,
) -> torch.Tensor:
    """hc_head of contiguous ``x [T, 4, H]`` (T > 0) -> ``[T, H]`` in ``x.dtype``, in 2 launches.

    With ``norm_weight [H]`` (fp32, or x's dtype: multiplied in fp32 alike) the shared-head RMSNorm
    is applied too. Inputs are assumed checked by
    ``dsv4spec.ops.hc_head``; ``block_k``, ``num_splits``, ``block_h``, ``partials_2d``,
    ``block_t`` and ``warps`` (partials, finalize) override the tiling; ``mma`` picks the
    tensor-core partials kernel (bf16 x; by default on CUDA from T * H = ``MMA_MIN_ELEMENTS``),
    ``stages`` its pipeline depth and ``sumsq_dot`` how it sums ``x^2``; ``pdl`` launches the
    finalize as a programmatic dependent launch (default on sm_90+ GPUs up to
    ``PDL_MAX_TOKENS`` tokens; both thresholds in ``hc_head_plan``), ``evict_hints`` asks L2 to
    keep x between the two launches (default with the tensor-core partials).
    After the first call of a shape, eager calls launch the cached compiled kernels directly
    (:class:`~dsv4spec.kernels.launch.LaunchCache`): one allocation (``out``; the partials
    workspace is reused per stream and shape, except while a CUDA graph is captured), two
    launches.
    """
    T, hc, H = x.shape
    # The cached launches bind the strides: they hold for contiguous tensors only.
    assert hc == HC and T > 0 and x.is_contiguous() and hc_fn.is_contiguous()
    rmsnorm = norm_weight is not None
    weight = norm_weight if rmsnorm else hc_base  # the finalize's weight pointer, unused without
    device_index = x.get_device()
    cfg, ws_shape, warps = _plan(T, H, device_index, rmsnorm, block_k, num_splits, block_h,
                                 partials_2d, block_t, warps, x.dtype, mma, stages, sumsq_dot,
                                 pdl, evict_hints)
    ws = WORKSPACES.get(x, ws_shape, device_index)
    if out is None:
        out = x.new_empty((T, H))
    elif not (out.shape == (T, H) and out.dtype == x.dtype and out.is_contiguous()):
        raise ValueError(f"out must be a contiguous [{T}, {H}] {x.dtype} tensor")
    px, pf, pw, ps, pb, pn, po = (x.data_ptr(), hc_fn.data_ptr(), ws.data_ptr(),
                                  hc_scale.data_ptr(), hc_base.data_ptr(), weight.data_ptr(),
                                  out.data_ptr())
    # One key for both kernels: everything either binds or specialises on.
    key = (T, H, x.dtype, weight.dtype, rmsnorm, device_index, norm_eps, hc_eps, cfg, warps,
           alignment_key(px, pf, pw, ps, pb, pn, po))
    direct = _DIRECT.get(key) if LaunchCache.enabled else None
    if direct is not None:
        direct[0](px, pf, pw)
        direct[1](px, pw, ps, pb, pn, po)
        return out
    launch_partials(x, hc_fn, ws, cfg, rmsnorm, warps[0], key)
    launch_finalize(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps, cfg, warps[1],
                     key)
    partials, finalize = (_PARTIALS_MMA if cfg.mma else _PARTIALS).get(key), _FINALIZE.get(key)
    if partials is not None and finalize is not None:
        _DIRECT[key] = (partials, finalize)
    return out
