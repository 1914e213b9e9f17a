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

Bytes (bf16, H = 7168): T = 4 reads 229 KB of x and the 459 KB ``hc_fn`` (which dominates; split
over ~112 programs so the whole GPU reads it in one round trip), writes 57 KB. T = 1024 reads
58.7 MB of x, ``hc_fn`` once per 16-token block (from L2), writes 14.7 MB; launch 2 reads x a
second time, last token first so the rows launch 1 read last are still in L2 (launch 1 asks L2 to
keep x, launch 2 to drop it).
"""

from __future__ import annotations

import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4spec.kernels import on_rocm
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


@triton.jit
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
        hi = f.to(tl.bfloat16)
        rest = f - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
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
    ii = offs_r[:, None] % 4
    ws_rows = ws_ptr + offs_t * stride_wt + split
    if GRAM or SUMSQ_DOT:
        same_token = (offs_r[:, None] // 4) == (offs_r[None, :] // 4)
        g = tl.sum(tl.reshape(tl.where(same_token, gram, 0.0), [ROWS, BLOCK_T, 4]), axis=1)
        # g[(t, i), j] = G_ij of token t: diagonal to slot 4 + i, i < j to 8 + (01, 02, ..., 23)
        slot = tl.where(ii == jj[None, :], 4 + ii, 8 + ii * (7 - ii) // 2 + jj[None, :] - ii - 1)
        keep = (ii == jj[None, :]) | (GRAM & (ii < jj[None, :]))
        tl.store(ws_rows[:, None] + slot * stride_wk, g, mask=mask_r[:, None] & keep)
    else:
        tl.store(ws_rows + (4 + offs_r % 4) * stride_wk, sumsq, mask=mask_r)


@triton.jit
def _round_to(y, DTYPE: tl.constexpr):
    # fp32 -> DTYPE, round to nearest even. Triton 3.6's interpreter truncates fp32 -> bf16, so
    # bf16 is rounded by hand (then the cast is exact): the interpreter and the GPU agree.
    if DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        y = bits.to(tl.float32, bitcast=True)
    return y.to(DTYPE)


@triton.jit
def _total(ws_ptr, SLOT: tl.constexpr, stride_wk, offs_s, mask_s):
    return tl.sum(tl.load(ws_ptr + SLOT * stride_wk + offs_s, mask=mask_s, other=0.0), axis=0)


@triton.jit
def _load_f32(ptrs, mask, POLICY: tl.constexpr):
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)


@triton.jit
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
    x0 = _load_f32(xr, mask_h, X_POLICY)
    x1 = _load_f32(xr + stride_xs, mask_h, X_POLICY)
    x2 = _load_f32(xr + 2 * stride_xs, mask_h, X_POLICY)
    x3 = _load_f32(xr + 3 * stride_xs, mask_h, X_POLICY)
    scale = tl.load(scale_ptr)
    b0 = tl.load(base_ptr)
    b1 = tl.load(base_ptr + 1)
    b2 = tl.load(base_ptr + 2)
    b3 = tl.load(base_ptr + 3)
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
    y = _round_to(y, out_ptr.dtype.element_ty)
    if RMSNORM:
        g01 = _total(ws, 8, stride_wk, offs_s, mask_s)
        g02 = _total(ws, 9, stride_wk, offs_s, mask_s)
        g03 = _total(ws, 10, stride_wk, offs_s, mask_s)
        g12 = _total(ws, 11, stride_wk, offs_s, mask_s)
        g13 = _total(ws, 12, stride_wk, offs_s, mask_s)
        g23 = _total(ws, 13, stride_wk, offs_s, mask_s)
        # sum_h y^2 = w^T G w, of the fp32 y (the reference squares y rounded to x.dtype; the
        # difference is far below the output's rounding)
        yy = w0 * w0 * g00 + w1 * w1 * g11 + w2 * w2 * g22 + w3 * w3 * g33
        yy += 2.0 * (w0 * (w1 * g01 + w2 * g02 + w3 * g03) + w1 * (w2 * g12 + w3 * g13)
                     + w2 * w3 * g23)
        rstd = 1.0 / tl.sqrt(yy / H + norm_eps)
        y = _round_to(y.to(tl.float32) * rstd * nw, out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_ot + offs_h, y, mask=mask_h)


@triton.jit
def _bf16_dot_probe_kernel(a_ptr, out_ptr):
    offs = tl.arange(0, 16)
    a = tl.load(a_ptr + offs[:, None] * 16 + offs[None, :])
    tl.store(out_ptr + offs[:, None] * 16 + offs[None, :], tl.dot(a, a))


@functools.lru_cache(maxsize=None)
def _interpreter_multiplies_bf16() -> bool:
    # Triton 3.6's interpreter keeps bf16 as uint16 and multiplies the bit patterns in tl.dot
    # (tests/conftest.py converts them first): probe once instead of trusting a version number.
    a = torch.full((16, 16), 0.5, dtype=torch.bfloat16)
    out = torch.empty((16, 16), dtype=torch.float32)
    _bf16_dot_probe_kernel[(1,)](a, out)
    return bool((out == 4.0).all())


@functools.lru_cache(maxsize=None)
def _supports_pdl(device_index: int) -> bool:
    # griddepcontrol is NVIDIA's, from sm_90; not in the interpreter, not on ROCm (whose
    # capability numbers mean something else: an MI300 reports 9.4)
    return (device_index >= 0 and not on_rocm()
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    if device_index < 0:
        return 132  # the interpreter (CPU tensors): mirror an H200's grid
    return torch.cuda.get_device_properties(device_index).multi_processor_count


class _Config(NamedTuple):
    block_t: int
    block_k: int
    chunks_per_split: int
    num_splits: int
    block_h: int
    partials_2d: bool = False  # the partials kernel's ACC_2D
    mma: bool = False  # the tensor-core partials kernel (bf16 x)
    stages: int | None = None  # its software-pipeline depth (Triton's num_stages)
    sumsq_dot: bool = True  # its SUMSQ_DOT: sum(x^2) from the tile's Gram product
    pdl: bool = False  # the finalize as a programmatic dependent launch (sm_90+)
    evict_hints: bool = False  # x kept in L2 by the partials (evict_last), dropped by the finalize


# The tensor-core partials: the default for bf16 x on CUDA from T * H = this on (at H = 7168
# from T = 256, at H = 4096 from T = 512: results/ab_hc_head_all_t.json)
MMA_MIN_ELEMENTS = 256 * 7168
# The finalize as a programmatic dependent launch: the default up to this many tokens, where
# it saved 0.4-0.8 µs in a graph; from T = 64 on it was slower as often as faster, and with the
# RMSNorm up to 14 % slower (results/ab_hc_head_all_t.json, ab_hc_head_final.json).
PDL_MAX_TOKENS = 16


def _hc_head_config(T, H, num_sms, block_k=None, num_splits=None, block_h=None,
                    partials_2d=None, block_t=None, mma=False, stages=None,
                    sumsq_dot=None) -> _Config:
    # Small T is latency-bound: cut the 4H-long rows (and hc_fn) into many small chunks so each
    # program does one round trip. Large T is bandwidth-bound: 8-token blocks amortise hc_fn and
    # about 12 programs per SM loop over a few 256-wide chunks. Choices swept on the H200 at
    # H = 7168 (scripts/tune_hc_head.py).
    if mma:
        # 16-token (64-row) tiles, 4 warps, a 3-stage pipeline over 64-wide chunks (swept on the
        # H200 at H = 7168, T = 256, 1024, 4096: scripts/sweep_hc_head_mma.py). At most 16
        # chunks per program, and as many splits as fill whole waves: 5 programs fit on an SM
        # (ncu: registers and shared memory both cap it at 5), and at T = 1024 a grid of 704
        # (1.07 waves) left a tail that 640 (10 splits, the sweep's best) does not.
        block_t = block_t or 16
        block_k = block_k or 64
        n_chunks = triton.cdiv(H, block_k)
        if num_splits is None:
            token_blocks, slots = triton.cdiv(T, block_t), 5 * num_sms
            fewest = triton.cdiv(n_chunks, 16)
            waves = triton.cdiv(token_blocks * fewest, slots)
            num_splits = min(n_chunks, max(fewest, waves * slots // token_blocks))
        chunks_per_split = triton.cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
        num_splits = triton.cdiv(n_chunks, chunks_per_split)
        block_h = block_h or (1024 if T <= 128 else 512)
        return _Config(block_t, block_k, chunks_per_split, num_splits, block_h, False, True,
                       stages or 3, True if sumsq_dot is None else sumsq_dot)
    if partials_2d is None:
        partials_2d = False
    if block_t is None:
        block_t = 4 if partials_2d else min(triton.next_power_of_2(T), 8)
    if block_k is None:
        block_k = 64 if T <= 4 or partials_2d else 128 if T <= 32 else 256
    n_chunks = triton.cdiv(H, block_k)
    if num_splits is None:
        programs_per_sm = 4 if T <= 64 else 12
        # the 2-D kernel: the split count the default computes before rounding to whole chunks
        num_splits = min(triton.cdiv(H, 256) if partials_2d else n_chunks,
                         triton.cdiv(programs_per_sm * num_sms, triton.cdiv(T, 8 if partials_2d
                                                                           else block_t)))
    chunks_per_split = triton.cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
    num_splits = triton.cdiv(n_chunks, chunks_per_split)
    if block_h is None:
        block_h = 128 if T <= 8 else 1024 if T <= 128 else 512
    return _Config(block_t, block_k, chunks_per_split, num_splits, block_h, partials_2d)


def _num_warps(T: int) -> tuple[int, int]:
    # (partials, finalize). Swept at H = 7168: T = 4 partials 2.46 µs at 4 warps; T = 64 3.63 µs
    # at 2 (3.90 at 4); finalize at 1 warp everywhere (T = 4: 1.74 µs vs 3.87 at 4 warps).
    return (4 if T <= 4 else 2), 1


_PARTIALS = LaunchCache(_hc_head_partials_kernel)
_PARTIALS_MMA = LaunchCache(_hc_head_partials_mma_kernel)
_FINALIZE = LaunchCache(_hc_head_finalize_kernel)
# key -> (partials, finalize) direct launches, so an eager call hashes its key once
_DIRECT: dict = {}
# The partials workspace of eager calls, reused per (stream, shape): an eager call is
# launch-bound, and an allocation costs as much host time as a launch. T x 8 (14 with the
# RMSNorm) x splits fp32: 4 KB at T = 4, H = 7168; 2.3 MB at T = 4096.
WORKSPACES = WorkspaceCache()


def _partials_launch(x, hc_fn, ws, cfg: _Config, rmsnorm: bool, num_warps: int):
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


def _finalize_launch(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps, cfg: _Config,
                     num_warps: int):
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


def _launch_partials(x, hc_fn, ws, cfg: _Config, rmsnorm: bool, num_warps: int = 4,
                     key=None) -> None:
    if key is None:
        key = (x.shape[0], x.shape[2], x.dtype, cfg, rmsnorm, num_warps, x.get_device(),
               alignment_key(x.data_ptr(), hc_fn.data_ptr(), ws.data_ptr()))
    _launch(_partials_launch(x, hc_fn, ws, cfg, rmsnorm, num_warps), key)


def _launch_finalize(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps, cfg: _Config,
                     num_warps: int = 4, key=None) -> None:
    if key is None:
        weight = hc_base if norm_weight is None else norm_weight
        key = (x.shape[0], x.shape[2], x.dtype, cfg, norm_weight is not None, num_warps,
               x.get_device(), float(norm_eps), float(hc_eps),
               alignment_key(*(t.data_ptr() for t in (x, ws, hc_scale, hc_base, weight, out))))
    _launch(_finalize_launch(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps, cfg,
                             num_warps), key)


@functools.lru_cache(maxsize=4096)
def _plan(T: int, H: int, device_index: int, rmsnorm: bool, block_k, num_splits, block_h,
          partials_2d=None, block_t=None, warps=None, dtype=None, mma=None, stages=None,
          sumsq_dot=None, pdl=None, evict_hints=None):
    if mma is None:
        # Tensor cores need bf16 x (fp16 parts of hc_fn would underflow; fp32 x is not exact in
        # bf16). Not by default in the interpreter: Triton 3.6 multiplies bf16 there as integers.
        mma = dtype is torch.bfloat16 and device_index >= 0 and T * H >= MMA_MIN_ELEMENTS
    elif mma and dtype is not None and dtype is not torch.bfloat16:
        raise ValueError(f"the tensor-core partials need bfloat16 x, got {dtype}")
    elif mma and device_index < 0 and not _interpreter_multiplies_bf16():
        raise ValueError("the tensor-core partials need a GPU: this Triton interpreter "
                         "multiplies bf16 dot operands as integers")
    if partials_2d is None and not mma:
        # The 2-D partials pay off where the RMSNorm's Gram sums make a large pass heavy (in a
        # graph, 1-D -> 2-D: H = 7168 T = 1024 70.2 -> 64.5 µs, T = 4096 239 -> 219; H = 4096
        # T = 4096 138 -> 131) but not below (H = 4096 T = 1024 30.9 -> 39.8) nor without the
        # norm (results/hc_head.json, hc_head_launch_lean.json, sweep_hc_head_partials.json).
        partials_2d = rmsnorm and T * H >= 1024 * 7168
    cfg = _hc_head_config(T, H, _num_sms(device_index), block_k, num_splits, block_h,
                          partials_2d, block_t, mma, stages, sumsq_dot)
    if pdl is None:
        pdl = T <= PDL_MAX_TOKENS and _supports_pdl(device_index)
    elif pdl and not _supports_pdl(device_index):
        raise ValueError("pdl needs an sm_90+ GPU")
    if evict_hints is None:
        # x (> 50 MB at T = 1024, H = 7168) kept in L2 by the partials and dropped by the
        # finalize: 40.7 -> 38.9 µs there (results/ab_hc_head_one_launch_evict.json)
        evict_hints = cfg.mma
    cfg = cfg._replace(pdl=pdl, evict_hints=evict_hints)
    if warps is None and (cfg.partials_2d or cfg.mma):
        warps = (4, 1)
    if warps is not None:
        return cfg, (T, 14 if rmsnorm else 8, cfg.num_splits), warps
    return cfg, (T, 14 if rmsnorm else 8, cfg.num_splits), _num_warps(T)


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
    return (lambda: _launch_partials(x, hc_fn, ws, cfg, rmsnorm, warps[0])), ws, cfg

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

    With ``norm_weight [H]`` the shared-head RMSNorm is applied too. Inputs are assumed checked by
    ``dsv4spec.ops.hc_head``; ``block_k``, ``num_splits``, ``block_h``, ``partials_2d``,
    ``block_t`` and ``warps`` (partials, finalize) override the tiling; ``mma`` picks the
    tensor-core partials kernel (bf16 x; by default on CUDA from ``MMA_MIN_TOKENS`` tokens),
    ``stages`` its pipeline depth and ``sumsq_dot`` how it sums ``x^2``; ``pdl`` launches the
    finalize as a programmatic dependent launch (default on sm_90+ GPUs up to
    ``PDL_MAX_TOKENS`` tokens), ``evict_hints`` asks L2 to keep x between the two launches
    (default with the tensor-core partials).
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
    key = (T, H, x.dtype, rmsnorm, device_index, norm_eps, hc_eps, cfg, warps,
           alignment_key(px, pf, pw, ps, pb, pn, po))
    direct = _DIRECT.get(key) if LaunchCache.enabled else None
    if direct is not None:
        direct[0](px, pf, pw)
        direct[1](px, pw, ps, pb, pn, po)
        return out
    _launch_partials(x, hc_fn, ws, cfg, rmsnorm, warps[0], key)
    _launch_finalize(x, ws, hc_scale, hc_base, norm_weight, out, norm_eps, hc_eps, cfg, warps[1],
                     key)
    partials, finalize = (_PARTIALS_MMA if cfg.mma else _PARTIALS).get(key), _FINALIZE.get(key)
    if partials is not None and finalize is not None:
        _DIRECT[key] = (partials, finalize)
    return out


# Triton compiles one variant per constexpr set and per specialisation of the integer arguments
# (== 1, divisible by 16); hc_head_triton's plan depends on T, so a new T can need a new variant.
# At T above this every call compiles what some T below it did (checked in the tests), so
# compiling the variants up to it leaves nothing to compile for any T.
PRECOMPILE_MAX_TOKENS = 16384


class _Placeholder:
    """A contiguous tensor's dtype, shape and strides at address 0 (16-byte aligned, as the
    caching allocator's are), standing in for a real tensor in Triton's ``warmup``."""

    def __init__(self, dtype: torch.dtype, shape: tuple) -> None:
        self.dtype, self.shape = dtype, shape
        strides, step = [], 1
        for size in reversed(shape):
            strides.append(step)
            step *= size
        self._strides = tuple(reversed(strides))

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    @staticmethod
    def data_ptr() -> int:
        return 0


def _launches_at(T: int, H: int, device_index: int, rmsnorm: bool, dtype: torch.dtype) -> tuple:
    """Both launches of a default-tiled call at ``T``, on placeholder tensors."""
    cfg, ws_shape, warps = _plan.__wrapped__(T, H, device_index, rmsnorm, None, None, None,
                                             dtype=dtype)
    x = _Placeholder(dtype, (T, HC, H))
    ws = _Placeholder(torch.float32, ws_shape)
    param = _Placeholder(torch.float32, (HC, HC * H))
    weight = _Placeholder(torch.float32, (H,)) if rmsnorm else None
    return (_partials_launch(x, param, ws, cfg, rmsnorm, warps[0]),
            _finalize_launch(x, ws, param, param, weight, _Placeholder(dtype, (T, H)), 1e-6, 1e-6,
                             cfg, warps[1]))


def _variant(launch) -> tuple:
    """What Triton compiles a launch into: kernel, constexprs, options, and the
    specialisation (== 1, divisible by 16) of each integer argument."""
    cache, _, args, constexprs, options = launch
    ints = tuple((a == 1, a % 16 == 0) for a in args if type(a) is int)
    return cache.kernel, tuple(constexprs.items()), tuple(options.items()), ints


def variant_tokens(H: int, device_index: int, rmsnorm: bool, dtype: torch.dtype,
                   max_tokens: int = PRECOMPILE_MAX_TOKENS) -> list[int]:
    """The smallest ``T`` of each distinct compiled variant that ``T = 1..max_tokens`` need."""
    seen: dict = {}
    for T in range(1, max_tokens + 1):
        for launch in _launches_at(T, H, device_index, rmsnorm, dtype):
            seen.setdefault(_variant(launch), T)
    return sorted(set(seen.values()))


def compiled_variants(device_index: int) -> int:
    """How many variants of the hc_head kernels Triton holds compiled for ``device_index``."""
    total = 0
    for cache in (_PARTIALS, _PARTIALS_MMA, _FINALIZE):
        caches = getattr(cache.kernel, "device_caches", {})
        if device_index in caches:
            total += len(caches[device_index][0])
    return total


def precompile(H: int, dtype: torch.dtype, device_index: int, *, rmsnorm: bool = False,
               max_tokens: int = PRECOMPILE_MAX_TOKENS, threads: int = 8) -> int:
    """Compile every kernel variant that :func:`hc_head_triton`'s default tiling needs for
    ``x [T, 4, H]`` of ``dtype``, ``T = 1..max_tokens``, on CUDA device ``device_index``,
    launching nothing (Triton's ``warmup`` on placeholder tensors). Compiles run on ``threads``
    threads where this Triton has an asynchronous compile mode. Returns how many variants were
    compiled (0 when all were already)."""
    if device_index < 0:
        return 0  # the interpreter compiles nothing
    before = compiled_variants(device_index)
    with torch.cuda.device(device_index), _async_compile(threads):
        for T in variant_tokens(H, device_index, rmsnorm, dtype, max_tokens):
            for cache, grid, args, constexprs, options in _launches_at(T, H, device_index,
                                                                       rmsnorm, dtype):
                cache.kernel.warmup(*args, grid=grid, **constexprs, **options)
    return compiled_variants(device_index) - before


def _async_compile(threads: int):
    """Triton's asynchronous compile mode on a thread pool, where this Triton has it."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return contextlib.nullcontext()
    if threads <= 1:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def mode():
        with ThreadPoolExecutor(threads) as pool, AsyncCompileMode(pool):
            yield

    return mode()
