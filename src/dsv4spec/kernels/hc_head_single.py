"""hc_head (SPEC §3, hc_mult = 4) in ONE launch for small T, optionally with the head RMSNorm.

Why: :func:`~dsv4spec.kernels.hc_head.hc_head_triton` takes two launches (split-K partials, then
finalize). At T = 1, H = 7168 that costs 4.4-5.5 µs in a CUDA graph: each graph kernel node costs
about 0.7 µs, and the finalize waits for the partials' memory round trip. The target (<= 3.0 µs)
is out of reach for two launches, so this variant does both steps in one.

Design (the "last block finalises" pattern of CUDA's threadFenceReduction sample), grid = token
blocks x K-splits as in the two-launch partials kernel:

1. Every program computes the split-K partials of its token block over its range of h, with the
   same fp32 math and the same workspace layout as ``_hc_head_partials_kernel``
   (``ws [T, 8 or 14, NUM_SPLITS]``: slots 0-3 the dots with ``hc_fn``, 4-7 the diagonal of the
   streams' Gram matrix G, 8-13 its off-diagonal for the RMSNorm), and stores them.
2. A CTA barrier (every thread's partial stores precede it), then one
   ``old = atomic_add(counter[token_block], 1, sem="acq_rel")``: the release publishes this
   program's partials, the acquire makes the other programs' partials visible to the one that
   sees ``old == NUM_SPLITS - 1``, the last of its token block. The others exit.
3. The last program resets its counter to 0 (every increment of this call has landed: it saw
   them), reduces the block's partials (loaded with ``.cg``, i.e. from L2, never a stale L1
   line), forms r, the sigmoid weights w and, with ``norm_weight``, the RMSNorm's
   ``sum_h y^2 = w^T G w`` exactly as ``_hc_head_finalize_kernel`` does, then loops over H in
   BLOCK_H chunks writing ``y = sum_i w_i x_i`` for the block's tokens (rounded with
   ``_round_to``).

Counters: int32, one per token block, zero between calls (each call leaves them zero). They come
from a per-device pool that this module owns: each (device, current stream) gets its own slot of
counters, assigned on its first call and kept for the life of the process (a CUDA graph captured
on that stream keeps the slot's address, so a slot is never freed, moved or handed to another
stream; a pool that runs out of room is replaced by a larger one and the old one is kept alive).
Constraints:

* Calls that may run concurrently must be on different streams: they then use different
  counters. Two calls on one stream are ordered by the stream. A graph uses the counters of the
  stream it was captured on: do not replay it concurrently with other work using those counters
  (eager calls on the capture stream, or another graph captured on the same stream).
* The pool of a device is allocated (zeroed) by the first call on that device, outside graph
  capture; a call that needs a new pool during capture raises (call once eagerly first, or
  :func:`reserve_counters`). Giving a new stream a slot needs no allocation, so capturing on a
  fresh stream (``torch.cuda.graph``'s own) is fine.
* A kernel aborted mid-way (or a launch with a too-small grid) leaves a counter non-zero, and
  every later call on that stream would then finalise too early: :func:`reset_counters` zeroes
  them all.

Memory ordering (what the GPU must confirm; the interpreter runs programs one after another):
the PTX that Triton 3.6 emits for sm_90a (compiled on a CPU host, H = 7168) has, after the partial
stores, ``bar.sync 0`` (the explicit ``tl.debug_barrier()``), then
``atom.global.gpu.acq_rel.add.u32`` predicated on thread 0, ``st.shared`` of its result,
``bar.sync 0`` and ``ld.shared`` in every thread: CUDA's grid-sync shape
(``__syncthreads(); if (tid == 0) { fence; atomic; }``), so the other threads' partial stores
are ordered before thread 0's GPU-scope release, and every thread's workspace loads
(``ld.global.cg``) after its acquire. Triton 3.6 puts no barrier before a scalar atomic by itself
(later versions add CTA barriers around release/acquire scalar atomics): without the explicit
one a token block with several storing threads (BLOCK_T > 1) could publish its count early.

Trade-off: the last program of a token block finalises alone, serially over H. At T = 1,
H = 7168 it reads 57 KB of x (and 3.6 KB of partials, 6.3 KB with the norm) from L2 through one
SM in ceil(H / BLOCK_H) blocks, where the two-launch finalize spreads that over ~56 programs;
the loop is software-pipelined (``num_stages``: cp.async through shared memory, NUM_STAGES - 1
blocks in flight) to cut the serial round trips. It starts only after the slowest split's
atomic. Larger T multiplies the serial part (T = 8: 459 KB through one SM), so this variant is
meant for T <= 8; it is correct for any T > 0 (8-token blocks, one counter each).

The partials workspace is reused per (device, stream, shape) in eager calls, as in
``hc_head_triton`` (fresh, from the graph's pool, while a CUDA graph is captured).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from dsv4spec.kernels.hc_head import HC, _round_to, _row_dot
from dsv4spec.kernels.launch import LaunchCache, alignment_key


@triton.jit
def _block_total(ws_rows, SLOT: tl.constexpr, stride_wk, offs_s, mask):
    # sum over the splits of one slot, per token of the block: [BLOCK_T]. ".cg": read at L2, where
    # the other programs' stores landed, never from this SM's L1.
    v = tl.load(ws_rows + SLOT * stride_wk + offs_s[None, :], mask=mask, other=0.0,
                cache_modifier=".cg")
    return tl.sum(v, axis=1)


@triton.jit
def _hc_head_single_kernel(
    x_ptr, fn_ptr, ws_ptr, counter_ptr, scale_ptr, base_ptr, weight_ptr, out_ptr,
    T, H, NUM_SPLITS, norm_eps, hc_eps,
    stride_xt, stride_xs, stride_fn, stride_wt, stride_wk, stride_ot,
    RMSNORM: tl.constexpr, CHUNKS_PER_SPLIT: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    NUM_HBLOCKS: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    token_block = pid // NUM_SPLITS
    offs_t = token_block * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    rows = x_ptr + offs_t[:, None] * stride_xt

    # ---- 1. split-K partials: the body of _hc_head_partials_kernel (GRAM = RMSNORM) ----
    m0 = tl.zeros([BLOCK_T], dtype=tl.float32)
    m1 = tl.zeros([BLOCK_T], dtype=tl.float32)
    m2 = tl.zeros([BLOCK_T], dtype=tl.float32)
    m3 = tl.zeros([BLOCK_T], dtype=tl.float32)
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
        ptrs = rows + offs_h[None, :]
        x0 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(ptrs + stride_xs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + 2 * stride_xs, mask=mask, other=0.0).to(tl.float32)
        x3 = tl.load(ptrs + 3 * stride_xs, mask=mask, other=0.0).to(tl.float32)
        m0 += _row_dot(fn_ptr, H, offs_h, mask_h, x0, x1, x2, x3)
        m1 += _row_dot(fn_ptr + stride_fn, H, offs_h, mask_h, x0, x1, x2, x3)
        m2 += _row_dot(fn_ptr + 2 * stride_fn, H, offs_h, mask_h, x0, x1, x2, x3)
        m3 += _row_dot(fn_ptr + 3 * stride_fn, H, offs_h, mask_h, x0, x1, x2, x3)
        g00 += tl.sum(x0 * x0, axis=1)
        g11 += tl.sum(x1 * x1, axis=1)
        g22 += tl.sum(x2 * x2, axis=1)
        g33 += tl.sum(x3 * x3, axis=1)
        if RMSNORM:
            g01 += tl.sum(x0 * x1, axis=1)
            g02 += tl.sum(x0 * x2, axis=1)
            g03 += tl.sum(x0 * x3, axis=1)
            g12 += tl.sum(x1 * x2, axis=1)
            g13 += tl.sum(x1 * x3, axis=1)
            g23 += tl.sum(x2 * x3, axis=1)
    # ws[t, k, split]: slots 0-3 dots, 4-7 diagonal of G, 8-13 (01, 02, 03, 12, 13, 23)
    ws = ws_ptr + offs_t * stride_wt + split
    tl.store(ws, m0, mask=mask_t)
    tl.store(ws + stride_wk, m1, mask=mask_t)
    tl.store(ws + 2 * stride_wk, m2, mask=mask_t)
    tl.store(ws + 3 * stride_wk, m3, mask=mask_t)
    tl.store(ws + 4 * stride_wk, g00, mask=mask_t)
    tl.store(ws + 5 * stride_wk, g11, mask=mask_t)
    tl.store(ws + 6 * stride_wk, g22, mask=mask_t)
    tl.store(ws + 7 * stride_wk, g33, mask=mask_t)
    if RMSNORM:
        tl.store(ws + 8 * stride_wk, g01, mask=mask_t)
        tl.store(ws + 9 * stride_wk, g02, mask=mask_t)
        tl.store(ws + 10 * stride_wk, g03, mask=mask_t)
        tl.store(ws + 11 * stride_wk, g12, mask=mask_t)
        tl.store(ws + 12 * stride_wk, g13, mask=mask_t)
        tl.store(ws + 13 * stride_wk, g23, mask=mask_t)

    # ---- 2. count the finished splits of this token block ----
    # Every thread's stores above precede the barrier; the one thread that runs the scalar atomic
    # then releases them all at GPU scope, and its acquire is broadcast to the CTA.
    tl.debug_barrier()
    old = tl.atomic_add(counter_ptr + token_block, 1, sem="acq_rel", scope="gpu")

    # ---- 3. the last program of the block: finalize ----
    if old == NUM_SPLITS - 1:
        # All NUM_SPLITS increments of this call have landed: zero the counter for the next call
        # (or graph replay), which the stream orders after this kernel.
        tl.store(counter_ptr + token_block, 0)
        offs_s = tl.arange(0, BLOCK_S)
        mask_ts = mask_t[:, None] & (offs_s < NUM_SPLITS)[None, :]
        ws_rows = ws_ptr + offs_t[:, None] * stride_wt
        t00 = _block_total(ws_rows, 4, stride_wk, offs_s, mask_ts)
        t11 = _block_total(ws_rows, 5, stride_wk, offs_s, mask_ts)
        t22 = _block_total(ws_rows, 6, stride_wk, offs_s, mask_ts)
        t33 = _block_total(ws_rows, 7, stride_wk, offs_s, mask_ts)
        # r = rsqrt(mean(xf^2) + eps) over all 4H values; sum(xf^2) = trace(G)
        r = 1.0 / tl.sqrt((t00 + t11 + t22 + t33) / (4 * H) + norm_eps)
        scale = tl.load(scale_ptr)
        w0 = tl.sigmoid(_block_total(ws_rows, 0, stride_wk, offs_s, mask_ts) * r * scale
                        + tl.load(base_ptr))
        w1 = tl.sigmoid(_block_total(ws_rows, 1, stride_wk, offs_s, mask_ts) * r * scale
                        + tl.load(base_ptr + 1))
        w2 = tl.sigmoid(_block_total(ws_rows, 2, stride_wk, offs_s, mask_ts) * r * scale
                        + tl.load(base_ptr + 2))
        w3 = tl.sigmoid(_block_total(ws_rows, 3, stride_wk, offs_s, mask_ts) * r * scale
                        + tl.load(base_ptr + 3))
        w0 += hc_eps
        w1 += hc_eps
        w2 += hc_eps
        w3 += hc_eps
        rstd = tl.zeros([BLOCK_T], dtype=tl.float32)
        if RMSNORM:
            t01 = _block_total(ws_rows, 8, stride_wk, offs_s, mask_ts)
            t02 = _block_total(ws_rows, 9, stride_wk, offs_s, mask_ts)
            t03 = _block_total(ws_rows, 10, stride_wk, offs_s, mask_ts)
            t12 = _block_total(ws_rows, 11, stride_wk, offs_s, mask_ts)
            t13 = _block_total(ws_rows, 12, stride_wk, offs_s, mask_ts)
            t23 = _block_total(ws_rows, 13, stride_wk, offs_s, mask_ts)
            # sum_h y^2 = w^T G w, of the fp32 y (the reference squares y rounded to x.dtype; the
            # difference is far below the output's rounding)
            yy = w0 * w0 * t00 + w1 * w1 * t11 + w2 * w2 * t22 + w3 * w3 * t33
            yy += 2.0 * (w0 * (w1 * t01 + w2 * t02 + w3 * t03) + w1 * (w2 * t12 + w3 * t13)
                         + w2 * w3 * t23)
            rstd = 1.0 / tl.sqrt(yy / H + norm_eps)
        out_rows = out_ptr + offs_t[:, None] * stride_ot
        # NUM_STAGES > 1: Triton's pipeliner streams x (and the norm weight) through shared
        # memory with cp.async, NUM_STAGES - 1 blocks ahead, so the serial loop is not one L2
        # round trip per block.
        for hb in tl.range(0, NUM_HBLOCKS, num_stages=NUM_STAGES):
            offs_o = hb * BLOCK_H + tl.arange(0, BLOCK_H)
            mask_o = offs_o < H
            mask_y = mask_t[:, None] & mask_o[None, :]
            xr = rows + offs_o[None, :]
            y = w0[:, None] * tl.load(xr, mask=mask_y, other=0.0).to(tl.float32)
            y += w1[:, None] * tl.load(xr + stride_xs, mask=mask_y, other=0.0).to(tl.float32)
            y += w2[:, None] * tl.load(xr + 2 * stride_xs, mask=mask_y, other=0.0).to(tl.float32)
            y += w3[:, None] * tl.load(xr + 3 * stride_xs, mask=mask_y, other=0.0).to(tl.float32)
            # hc_head returns x.dtype; the RMSNorm then runs on that rounded y, as in the reference
            y = _round_to(y, out_ptr.dtype.element_ty)
            if RMSNORM:
                nw = tl.load(weight_ptr + offs_o, mask=mask_o, other=0.0)
                y = _round_to(y.to(tl.float32) * rstd[:, None] * nw[None, :],
                              out_ptr.dtype.element_ty)
            tl.store(out_rows + offs_o[None, :], y, mask=mask_y)


# ------------------------------------------------------------------------------------ tiling


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
    num_warps: int
    num_stages: int


def _power_of_two(name: str, v: int) -> None:
    if not (isinstance(v, int) and v > 0 and v & (v - 1) == 0):
        raise ValueError(f"{name} must be a power of two, got {v!r}")


def _single_config(T, H, num_sms, block_k=None, num_splits=None, block_h=None,
                   num_warps=None, num_stages=None) -> _Config:
    """Tiling for T <= 8 (guesses, to be swept on the H200: scripts/hc_head_single_launch_check.py).

    Partials: BLOCK_T = next_pow2(T) (one token block up to T = 8), 64-wide chunks and about 4
    programs per SM, so at H = 7168 112 programs each read one 64-wide chunk in one round trip.
    Finalize: BLOCK_T x BLOCK_H tiles of at most 2048 elements (16 per thread and stream at 4
    warps), BLOCK_H = 1024 at T <= 2, 512 at T = 3-4, 256 at T = 5-8; a 3-stage pipelined loop
    (2 blocks of x in flight ahead of the one being written). 4 warps. ptxas (sm_90a, H = 7168,
    with the norm, PTX compiled on a CPU host): 48 registers and 26 KB of shared memory at
    T = 1, 86 registers and 34 KB at T = 8, no spills.
    """
    block_t = min(triton.next_power_of_2(T), 8)
    n_blocks = triton.cdiv(T, block_t)
    if block_k is None:
        block_k = 64 if T <= 8 else 128
    _power_of_two("block_k", block_k)
    n_chunks = triton.cdiv(H, block_k)
    if num_splits is None:
        num_splits = min(n_chunks, triton.cdiv(4 * num_sms, n_blocks))
    if not (isinstance(num_splits, int) and num_splits > 0):
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    chunks_per_split = triton.cdiv(n_chunks, min(num_splits, n_chunks))
    num_splits = triton.cdiv(n_chunks, chunks_per_split)
    if block_h is None:
        block_h = min(1024, max(128, 2048 // block_t), triton.next_power_of_2(H))
    _power_of_two("block_h", block_h)
    if num_warps is None:
        num_warps = 4
    _power_of_two("num_warps", num_warps)
    if num_stages is None:
        num_stages = 3
    if not (isinstance(num_stages, int) and num_stages > 0):
        raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
    return _Config(block_t, block_k, chunks_per_split, num_splits, block_h, num_warps,
                   num_stages)


@functools.lru_cache(maxsize=4096)
def _plan(T, H, device_index, rmsnorm, block_k, num_splits, block_h, num_warps, num_stages):
    cfg = _single_config(T, H, _num_sms(device_index), block_k, num_splits, block_h, num_warps,
                         num_stages)
    n_blocks = triton.cdiv(T, cfg.block_t)
    ws_shape = (T, 14 if rmsnorm else 8, cfg.num_splits)
    return cfg, ws_shape, n_blocks, (n_blocks * cfg.num_splits, 1, 1)


# ---------------------------------------------------------------------------------- counters

_SLOT = 8  # counters per slot granule (32 bytes: every slot stays 16-byte aligned)
_POOL_SIZE = 4096  # counters in a device's first pool (16 KB): 512 one-block slots


class _Pool:
    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.used = 0


_POOLS: dict[int, _Pool] = {}  # device index (-1: the interpreter's CPU) -> its pool
_RETIRED: list[torch.Tensor] = []  # replaced pools: captured graphs may still use their slots
_SLOTS: dict[tuple[int, int], torch.Tensor] = {}  # (device index, raw stream) -> its counters


def _capturing(device_index: int) -> bool:
    return device_index >= 0 and torch._C._cuda_isCurrentStreamCapturing()


def _new_pool(device: torch.device, device_index: int, size: int) -> _Pool:
    if _capturing(device_index):
        raise RuntimeError(
            f"hc_head_single_launch_triton: the counters of cuda:{device_index} must be allocated "
            f"outside CUDA graph capture; call it once eagerly on this device first, or "
            f"reserve_counters()")
    old = _POOLS.get(device_index)
    if old is not None:
        _RETIRED.append(old.buffer)
    pool = _Pool(torch.zeros(size, dtype=torch.int32, device=device))
    if device_index >= 0:
        # Other streams get slots of this buffer later: the zero fill must be done before any.
        torch.cuda.current_stream(device).synchronize()
    _POOLS[device_index] = pool
    return pool


def _counters(x: torch.Tensor, device_index: int, n_blocks: int) -> torch.Tensor:
    """The zeroed counters of (x's device, its current stream), at least ``n_blocks`` of them."""
    stream = torch._C._cuda_getCurrentRawStream(device_index) if device_index >= 0 else 0
    key = (device_index, stream)
    slot = _SLOTS.get(key)
    if slot is not None and slot.numel() >= n_blocks:
        return slot
    # A new slot (a new stream, or more token blocks): the old slot stays reserved, since a graph
    # captured on this stream may use it, and stays zero.
    size = triton.cdiv(n_blocks, _SLOT) * _SLOT
    pool = _POOLS.get(device_index)
    if pool is None or pool.used + size > pool.buffer.numel():
        capacity = _POOL_SIZE if pool is None else 2 * pool.buffer.numel()
        pool = _new_pool(x.device, device_index, max(capacity, size))
    slot = pool.buffer[pool.used:pool.used + size]
    pool.used += size
    _SLOTS[key] = slot
    return slot


def reserve_counters(device: torch.device | str | int | None = None, num_slots: int = 64) -> None:
    """Make room, outside graph capture, for ``num_slots`` more one-block stream slots on
    ``device`` (default: the current CUDA device; ``"cpu"``: the interpreter's pool), so that the
    calls after it never allocate (e.g. before capturing on many new streams)."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    index = device.index if device.type == "cuda" else -1
    pool = _POOLS.get(index)
    used = 0 if pool is None else pool.used
    if pool is None or used + num_slots * _SLOT > pool.buffer.numel():
        capacity = _POOL_SIZE if pool is None else 2 * pool.buffer.numel()
        _new_pool(device, index, max(capacity, num_slots * _SLOT))


def counter_buffers() -> list[torch.Tensor]:
    """Every counter buffer this module holds (current pools and retired ones). All zero between
    calls; tests and recovery code read them."""
    return [p.buffer for p in _POOLS.values()] + list(_RETIRED)


def reset_counters() -> None:
    """Zero every counter, e.g. after a kernel was aborted mid-way. Call it outside graph capture
    with no call of this module in flight (it synchronizes each device before and after)."""
    for buf in counter_buffers():
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)
        buf.zero_()
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)


# ----------------------------------------------------------------------------------- launch

_SINGLE = LaunchCache(_hc_head_single_kernel)
_WORKSPACES: dict[tuple, torch.Tensor] = {}
WORKSPACE_CACHE_LIMIT = 256


def _workspace(x: torch.Tensor, shape: tuple, device_index: int) -> torch.Tensor:
    """The partials workspace, reused per (device, stream, shape) in eager calls as
    ``hc_head_triton`` does (calls on one stream run one after another, so they may share it);
    a fresh one (from the graph's pool) while a CUDA graph is captured."""
    if device_index >= 0:
        if torch._C._cuda_isCurrentStreamCapturing():
            return x.new_empty(shape, dtype=torch.float32)
        key = (device_index, torch._C._cuda_getCurrentRawStream(device_index), shape)
    else:
        key = (device_index, 0, shape)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = x.new_empty(shape, dtype=torch.float32)
        if len(_WORKSPACES) < WORKSPACE_CACHE_LIMIT:
            _WORKSPACES[key] = ws
    return ws


def _prepare(x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight, out, tiling):
    T, hc, H = x.shape
    # The cached launch binds the strides: they hold for contiguous tensors only.
    assert hc == HC and T > 0 and x.is_contiguous() and hc_fn.is_contiguous()
    rmsnorm = norm_weight is not None
    weight = norm_weight if rmsnorm else hc_base  # an unused but valid pointer without the norm
    device_index = x.get_device()
    cfg, ws_shape, n_blocks, grid = _plan(T, H, device_index, rmsnorm, *tiling)
    ws = _workspace(x, ws_shape, device_index)
    counters = _counters(x, device_index, n_blocks)
    if out is None:
        out = x.new_empty((T, H))
    elif not (out.shape == (T, H) and out.dtype == x.dtype and out.is_contiguous()):
        raise ValueError(f"out must be a contiguous [{T}, {H}] {x.dtype} tensor")
    pointers = (x, hc_fn, ws, counters, hc_scale, hc_base, weight, out)
    return T, H, rmsnorm, device_index, cfg, grid, pointers


def _args(pointers, T, H, cfg: _Config, rmsnorm, norm_eps, hc_eps):
    x, hc_fn, ws, _, _, _, _, out = pointers
    args = (*pointers, T, H, cfg.num_splits, norm_eps, hc_eps,
            x.stride(0), x.stride(1), hc_fn.stride(0), ws.stride(0), ws.stride(1), out.stride(0))
    constexprs = {"RMSNORM": rmsnorm, "CHUNKS_PER_SPLIT": cfg.chunks_per_split,
                  "BLOCK_T": cfg.block_t, "BLOCK_K": cfg.block_k,
                  "BLOCK_S": triton.next_power_of_2(cfg.num_splits), "BLOCK_H": cfg.block_h,
                  "NUM_HBLOCKS": triton.cdiv(H, cfg.block_h), "NUM_STAGES": cfg.num_stages}
    return args, constexprs


def hc_head_single_launch_triton(
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
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """hc_head of contiguous ``x [T, 4, H]`` (T > 0) -> ``[T, H]`` in ``x.dtype``, in 1 launch.

    The contract of :func:`~dsv4spec.kernels.hc_head.hc_head_triton` (inputs assumed checked by
    ``dsv4spec.ops.hc_head``; with ``norm_weight [H]`` the shared-head RMSNorm is applied too);
    meant for T <= 8. ``block_k``, ``num_splits``, ``block_h``, ``num_warps`` and ``num_stages``
    (of the finalize loop; 1: not pipelined) override the tiling (``block_k``, ``block_h`` and
    ``num_warps`` powers of two). See the module docstring for the counters' rules.
    After the first call of a shape, eager calls launch the cached compiled kernel directly
    (:class:`~dsv4spec.kernels.launch.LaunchCache`): one allocation (``out``; the workspace is
    reused per stream and shape outside graph capture), one launch.
    """
    norm_eps, hc_eps = float(norm_eps), float(hc_eps)
    T, H, rmsnorm, device_index, cfg, grid, pointers = _prepare(
        x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight, out,
        (block_k, num_splits, block_h, num_warps, num_stages))
    addresses = tuple(p.data_ptr() for p in pointers)
    # Everything the kernel binds or specialises on (strides follow from T, H and cfg).
    key = (T, H, x.dtype, rmsnorm, device_index, norm_eps, hc_eps, cfg,
           alignment_key(*addresses))
    direct = _SINGLE.get(key)
    if direct is not None:
        direct(*addresses)
    else:
        args, constexprs = _args(pointers, T, H, cfg, rmsnorm, norm_eps, hc_eps)
        _SINGLE.launch(key, grid, args, constexprs, cfg.num_warps)
    return pointers[-1]


def warmup(
    x: torch.Tensor,
    hc_fn: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    norm_eps: float,
    hc_eps: float,
    norm_weight: torch.Tensor | None = None,
    *,
    block_k: int | None = None,
    num_splits: int | None = None,
    block_h: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> None:
    """Compile, without launching, the kernel that the same call of
    :func:`hc_head_single_launch_triton` would launch. Inside Triton's ``AsyncCompileMode`` the
    compile runs in its executor, so benchmarks can compile many tilings in parallel."""
    norm_eps, hc_eps = float(norm_eps), float(hc_eps)
    T, H, rmsnorm, _, cfg, grid, pointers = _prepare(
        x, hc_fn, hc_scale, hc_base, norm_eps, hc_eps, norm_weight, None,
        (block_k, num_splits, block_h, num_warps, num_stages))
    args, constexprs = _args(pointers, T, H, cfg, rmsnorm, norm_eps, hc_eps)
    _hc_head_single_kernel.warmup(*args, **constexprs, grid=grid, num_warps=cfg.num_warps)
