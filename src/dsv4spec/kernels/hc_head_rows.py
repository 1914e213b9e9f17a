"""hc_head for large T in ONE launch: each program owns whole token rows (no split-K).

A persistent grid of about one program per SM loops over blocks of ``BLOCK_T`` tokens. For a
block it (1) streams the 4H-long rows once, accumulating ``[BLOCK_T, BLOCK_K]`` tiles of the 4
dot products with ``hc_fn`` and of the Gram terms elementwise (one cross-thread reduction per
accumulator at the end, none per chunk), forms r and the stream weights w, then (2) streams the
same rows again to write ``y = sum_i w_i x_i``. Pass 2 re-reads what pass 1 just read: with one
program per SM in flight the rows in flight are ``SMs x BLOCK_T x 4H x 2`` bytes (132 x 4 x 28672
x 2 = 30 MB at H = 7168, under the L2's 50 MB), so x should come from DRAM once.

Bytes at T = 1024, H = 7168, bf16: x 58.7 MB read once from DRAM (13.8 µs at 4.25 TB/s), y
14.7 MB written, ``hc_fn`` (459 KB) read from L2 once per token block. The split-K design
(``hc_head.py``) reads x from DRAM twice and pays a reduction per chunk per accumulator.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv4spec.kernels.hc_head import HC, _num_sms, _round_to
from dsv4spec.kernels.launch import LaunchCache, alignment_key

# Below this T the split-K kernels (hc_head.py) win: few token blocks cannot fill the GPU here.
# None: this kernel is only used when asked for (``hc_head_rows_triton``), until measured.
ROWS_MIN_TOKENS: int | None = None


@triton.jit
def _hc_head_rows_kernel(
    x_ptr, fn_ptr, scale_ptr, base_ptr, weight_ptr, out_ptr,
    T, num_programs, norm_eps, hc_eps,
    stride_xt, stride_xs, stride_fn, stride_ot,
    H: tl.constexpr, RMSNORM: tl.constexpr, BLOCKS_PER_PROGRAM: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    scale = tl.load(scale_ptr)
    b0 = tl.load(base_ptr)
    b1 = tl.load(base_ptr + 1)
    b2 = tl.load(base_ptr + 2)
    b3 = tl.load(base_ptr + 3)
    # Block pid + i * num_programs. Loop bounds are constexpr (Triton 3.6's interpreter cannot
    # range over runtime scalars with NumPy 2); the trip count is a power of two, so few
    # variants compile, and blocks past the end are fully masked.
    for i in range(0, BLOCKS_PER_PROGRAM):
        offs_t = (pid + i * num_programs) * BLOCK_T + tl.arange(0, BLOCK_T)
        mask_t = offs_t < T
        rows = x_ptr + offs_t[:, None] * stride_xt
        m0 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        m1 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        m3 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g00 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)  # trace of G without RMSNORM
        g11 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g22 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g33 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g01 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g02 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g03 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g12 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g13 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        g23 = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
        for k in range(0, H, BLOCK_K):
            offs_h = k + tl.arange(0, BLOCK_K)
            mask_h = offs_h < H
            mask = mask_t[:, None] & mask_h[None, :]
            ptrs = rows + offs_h[None, :]
            x0 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            x1 = tl.load(ptrs + stride_xs, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(ptrs + 2 * stride_xs, mask=mask, other=0.0).to(tl.float32)
            x3 = tl.load(ptrs + 3 * stride_xs, mask=mask, other=0.0).to(tl.float32)
            # hc_fn[j, i*H + h]: row j, stream i
            for j in tl.static_range(4):
                f = fn_ptr + j * stride_fn + offs_h
                t = x0 * tl.load(f, mask=mask_h, other=0.0)[None, :]
                t += x1 * tl.load(f + H, mask=mask_h, other=0.0)[None, :]
                t += x2 * tl.load(f + 2 * H, mask=mask_h, other=0.0)[None, :]
                t += x3 * tl.load(f + 3 * H, mask=mask_h, other=0.0)[None, :]
                if j == 0:
                    m0 += t
                elif j == 1:
                    m1 += t
                elif j == 2:
                    m2 += t
                else:
                    m3 += t
            if RMSNORM:
                g00 += x0 * x0
                g11 += x1 * x1
                g22 += x2 * x2
                g33 += x3 * x3
                g01 += x0 * x1
                g02 += x0 * x2
                g03 += x0 * x3
                g12 += x1 * x2
                g13 += x1 * x3
                g23 += x2 * x3
            else:
                g00 += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
        sumsq = tl.sum(g00, axis=1)
        if RMSNORM:
            d11 = tl.sum(g11, axis=1)
            d22 = tl.sum(g22, axis=1)
            d33 = tl.sum(g33, axis=1)
            sumsq_all = sumsq + d11 + d22 + d33
        else:
            sumsq_all = sumsq
        r = 1.0 / tl.sqrt(sumsq_all / (4 * H) + norm_eps)
        w0 = tl.sigmoid(tl.sum(m0, axis=1) * r * scale + b0) + hc_eps
        w1 = tl.sigmoid(tl.sum(m1, axis=1) * r * scale + b1) + hc_eps
        w2 = tl.sigmoid(tl.sum(m2, axis=1) * r * scale + b2) + hc_eps
        w3 = tl.sigmoid(tl.sum(m3, axis=1) * r * scale + b3) + hc_eps
        if RMSNORM:
            # sum_h y^2 = w^T G w of the fp32 y (as in hc_head.py's finalize)
            yy = w0 * w0 * sumsq + w1 * w1 * d11 + w2 * w2 * d22 + w3 * w3 * d33
            yy += 2.0 * (w0 * (w1 * tl.sum(g01, axis=1) + w2 * tl.sum(g02, axis=1)
                               + w3 * tl.sum(g03, axis=1))
                         + w1 * (w2 * tl.sum(g12, axis=1) + w3 * tl.sum(g13, axis=1))
                         + w2 * w3 * tl.sum(g23, axis=1))
            rstd = 1.0 / tl.sqrt(yy / H + norm_eps)
        out_rows = out_ptr + offs_t[:, None] * stride_ot
        for k in range(0, H, BLOCK_H):
            offs_h = k + tl.arange(0, BLOCK_H)
            mask_h = offs_h < H
            mask = mask_t[:, None] & mask_h[None, :]
            ptrs = rows + offs_h[None, :]
            y = w0[:, None] * tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            y += w1[:, None] * tl.load(ptrs + stride_xs, mask=mask, other=0.0).to(tl.float32)
            y += w2[:, None] * tl.load(ptrs + 2 * stride_xs, mask=mask, other=0.0).to(tl.float32)
            y += w3[:, None] * tl.load(ptrs + 3 * stride_xs, mask=mask, other=0.0).to(tl.float32)
            y = _round_to(y, out_ptr.dtype.element_ty)
            if RMSNORM:
                nw = tl.load(weight_ptr + offs_h, mask=mask_h, other=0.0)
                y = _round_to(y.to(tl.float32) * rstd[:, None] * nw[None, :],
                              out_ptr.dtype.element_ty)
            tl.store(out_rows + offs_h[None, :], y, mask=mask)


_ROWS = LaunchCache(_hc_head_rows_kernel)


@functools.lru_cache(maxsize=1024)
def _rows_plan(T: int, device_index: int, rmsnorm: bool, block_t, block_k, block_h, programs):
    block_t = block_t or 4
    block_k = block_k or (128 if rmsnorm else 256)
    block_h = block_h or 512
    programs = programs or _num_sms(device_index)
    grid = (min(programs, triton.cdiv(T, block_t)), 1, 1)
    return grid, block_t, block_k, block_h, (8 if rmsnorm else 4)


def hc_head_rows_triton(
    x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    norm_eps: float, hc_eps: float, norm_weight: torch.Tensor | None = None, *,
    block_t: int | None = None, block_k: int | None = None, block_h: int | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """hc_head (optionally + shared-head RMSNorm) of contiguous ``x [T, 4, H]`` in ONE launch.

    Same contract as :func:`dsv4spec.kernels.hc_head.hc_head_triton`; the keywords override the
    tiling (tokens per block, the two passes' widths) and the persistent grid size.
    """
    T, hc, H = x.shape
    assert hc == HC and T > 0 and x.is_contiguous() and hc_fn.is_contiguous()
    rmsnorm = norm_weight is not None
    weight = norm_weight if rmsnorm else hc_base  # unused without the norm, but a valid pointer
    device_index = x.get_device()
    grid, bt, bk, bh, warps = _rows_plan(T, device_index, rmsnorm, block_t, block_k, block_h,
                                         programs)
    out = x.new_empty((T, H))
    ptrs = (x.data_ptr(), hc_fn.data_ptr(), hc_scale.data_ptr(), hc_base.data_ptr(),
            weight.data_ptr(), out.data_ptr())
    aligned = -1 if not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5]) & 15 else (
        alignment_key(x, hc_fn, hc_scale, hc_base, weight, out))
    key = (T, H, x.dtype, rmsnorm, device_index, norm_eps, hc_eps, grid, bt, bk, bh, aligned)
    direct = _ROWS.get(key)
    if direct is not None:
        direct(*ptrs)
        return out
    _ROWS.launch(
        key, grid,
        (x, hc_fn, hc_scale, hc_base, weight, out, T, grid[0], float(norm_eps), float(hc_eps),
         x.stride(0), x.stride(1), hc_fn.stride(0), out.stride(0)),
        {"H": H, "RMSNORM": rmsnorm,
         "BLOCKS_PER_PROGRAM": triton.next_power_of_2(triton.cdiv(triton.cdiv(T, bt), grid[0])),
         "BLOCK_T": bt, "BLOCK_K": bk, "BLOCK_H": bh},
        warps,
    )
    return out
