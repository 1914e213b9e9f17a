"""The tiling planner of hc_head's two launches (kernels/hc_head.py), host code only.

For a call's T, H, dtype, device and RMSNorm flag it picks the partials kernel (CUDA cores or
tensor cores), the token block, chunk width and K-split count, the finalize's H-block, the warps of
each launch, the programmatic dependent launch and the L2 hints; every keyword of
``hc_head_triton`` overrides one choice. Each threshold states the measurement that set it
(``benchmarks/results/hc_head/``, ``dsv4spec bench hc-head-sweep``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from dsv4spec.kernels.device import (  # noqa: F401 - the planner's
    cdiv,
    interpreter_multiplies_bf16,
    next_power_of_2,
    num_sms,
    supports_pdl,
)


class HcHeadConfig(NamedTuple):
    """One tiling of hc_head's two launches: what :func:`hc_head_config` and the planner return,
    and what the launch builders of kernels/hc_head.py read."""

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
# from T = 256, at H = 4096 from T = 512:
# benchmarks/results/archive/hc_head_ab/ab_hc_head_all_t.json)
MMA_MIN_ELEMENTS = 256 * 7168
# The finalize as a programmatic dependent launch: the default up to this many tokens, where
# it was faster in a graph; from T = 64 on it was slower as often as faster, and slower with the
# RMSNorm (benchmarks/results/archive/hc_head_ab/ab_hc_head_all_t.json, ab_hc_head_final.json).
PDL_MAX_TOKENS = 16
# Up to this many tokens one tiling (4-token blocks) and, T not specialised in either kernel, one
# compiled partials and finalize: a token then gets the same bits alone as in a batch (a decode
# step and the verify of its drafts agree), as for the mHC ops (kernels/mhc.py). With 1- and
# 2-token blocks at T = 1 and 2 the partials' sums over h ran on other lanes than at T = 3-4
# (benchmarks/results/hc_head/batch_invariance.json).
INVARIANT_MAX_TOKENS = 4


def hc_head_config(T: int, H: int, num_sms: int, block_k: int | None = None,
                   num_splits: int | None = None, block_h: int | None = None,
                   partials_2d: bool | None = None, block_t: int | None = None, mma: bool = False,
                   stages: int | None = None, sumsq_dot: bool | None = None) -> HcHeadConfig:
    """The tiling of ``x [T, 4, H]`` on a GPU of ``num_sms`` SMs, each ``None`` argument at its
    default: with ``mma`` for the tensor-core partials kernel, else for the CUDA-core one (2-D
    accumulators with ``partials_2d``). ``pdl`` and ``evict_hints`` are left ``False``: the
    planner sets them per device. For sweeps that start from the default tiling."""
    # Small T is latency-bound: cut the 4H-long rows (and hc_fn) into many small chunks so each
    # program does one round trip. Large T is bandwidth-bound: 8-token blocks amortise hc_fn and
    # about 12 programs per SM loop over a few 256-wide chunks. Choices swept on the H200 at
    # H = 7168 (dsv4spec bench hc-head-sweep --sweeps launches).
    if mma:
        # 16-token (64-row) tiles, 4 warps, a 3-stage pipeline over 64-wide chunks (swept on the
        # H200 at H = 7168, T = 256, 1024, 4096: dsv4spec bench hc-head-sweep --sweeps
        # tensor-cores). At most 16
        # chunks per program, and as many splits as fill whole waves: 5 programs fit on an SM
        # (ncu: registers and shared memory both cap it at 5), and at T = 1024 a grid of 704
        # (1.07 waves) left a tail that 640 (10 splits, the sweep's best) does not.
        block_t = block_t or 16
        block_k = block_k or 64
        n_chunks = cdiv(H, block_k)
        if num_splits is None:
            token_blocks, slots = cdiv(T, block_t), 5 * num_sms
            fewest = cdiv(n_chunks, 16)
            waves = cdiv(token_blocks * fewest, slots)
            num_splits = min(n_chunks, max(fewest, waves * slots // token_blocks))
        chunks_per_split = cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
        num_splits = cdiv(n_chunks, chunks_per_split)
        block_h = block_h or (1024 if T <= 128 else 512)
        return HcHeadConfig(block_t, block_k, chunks_per_split, num_splits, block_h, False, True,
                            stages or 3, True if sumsq_dot is None else sumsq_dot)
    if partials_2d is None:
        partials_2d = False
    if block_t is None:
        block_t = 4 if partials_2d or T <= INVARIANT_MAX_TOKENS else min(
            next_power_of_2(T), 8)
    if block_k is None:
        block_k = 64 if T <= 4 or partials_2d else 128 if T <= 32 else 256
    n_chunks = cdiv(H, block_k)
    if num_splits is None:
        programs_per_sm = 4 if T <= 64 else 12
        # the 2-D kernel: the split count the default computes before rounding to whole chunks
        num_splits = min(cdiv(H, 256) if partials_2d else n_chunks,
                         cdiv(programs_per_sm * num_sms, cdiv(T, 8 if partials_2d
                                                                           else block_t)))
    chunks_per_split = cdiv(n_chunks, max(1, min(num_splits, n_chunks)))
    num_splits = cdiv(n_chunks, chunks_per_split)
    if block_h is None:
        block_h = 128 if T <= 8 else 1024 if T <= 128 else 512
    return HcHeadConfig(block_t, block_k, chunks_per_split, num_splits, block_h, partials_2d)


def _num_warps(T: int) -> tuple[int, int]:
    # (partials, finalize). Swept at H = 7168 (dsv4spec bench hc-head-sweep --sweeps launches,
    # timings in
    # benchmarks/results/logs/tune_hc_head.log): the partials fastest at 4 warps up to T = 4 and
    # at 2 from T = 64; the finalize at 1 warp everywhere.
    return (4 if T <= 4 else 2), 1


# (config, workspace shape, (partials warps, finalize warps)) of one call; every argument after
# rmsnorm an override, None for the default. Cached: an eager call plans on the host each time.
@functools.lru_cache(maxsize=4096)
def _plan(T: int, H: int, device_index: int, rmsnorm: bool, block_k, num_splits, block_h,
          partials_2d=None, block_t=None, warps=None, dtype=None, mma=None, stages=None,
          sumsq_dot=None, pdl=None, evict_hints=None):
    return plan_on(T, H, num_sms(device_index), device_index >= 0, supports_pdl(device_index),
                   rmsnorm, block_k, num_splits, block_h, partials_2d, block_t, warps, dtype,
                   mma, stages, sumsq_dot, pdl, evict_hints)


def plan_on(T: int, H: int, num_sms: int, on_gpu: bool, pdl_capable: bool, rmsnorm: bool,
            block_k=None, num_splits=None, block_h=None, partials_2d=None, block_t=None,
            warps=None, dtype=None, mma=None, stages=None, sumsq_dot=None, pdl=None,
            evict_hints=None):
    """The planner on a described device: ``num_sms`` SMs, a CUDA GPU (``on_gpu``, else the
    interpreter) taking programmatic dependent launches or not; ``(config, workspace shape,
    (partials warps, finalize warps))``."""
    if mma is None:
        # Tensor cores need bf16 x (fp16 parts of hc_fn would underflow; fp32 x is not exact in
        # bf16). Not by default in the interpreter: Triton 3.6 multiplies bf16 there as integers.
        mma = dtype is torch.bfloat16 and on_gpu and T * H >= MMA_MIN_ELEMENTS
    elif mma and dtype is not None and dtype is not torch.bfloat16:
        raise ValueError(f"the tensor-core partials need bfloat16 x, got {dtype}")
    elif mma and not on_gpu and not interpreter_multiplies_bf16():
        raise ValueError("the tensor-core partials need a GPU: this Triton interpreter "
                         "multiplies bf16 dot operands as integers")
    if partials_2d is None and not mma:
        # The 2-D partials pay off where the RMSNorm's Gram sums make a large pass heavy (in a
        # graph at H = 7168, T = 1024 and 4096, and H = 4096, T = 4096) but not below (H = 4096,
        # T = 1024) nor without the norm: the triton+norm rows of
        # benchmarks/results/hc_head/hc_head.md
        # (1-D) and hc_head_launch_lean.md (2-D), and sweep_hc_head_partials.json.
        partials_2d = rmsnorm and T * H >= 1024 * 7168
    cfg = hc_head_config(T, H, num_sms, block_k, num_splits, block_h, partials_2d, block_t,
                         mma, stages, sumsq_dot)
    if pdl is None:
        pdl = T <= PDL_MAX_TOKENS and pdl_capable
    elif pdl and not pdl_capable:
        raise ValueError("pdl needs an sm_90+ GPU")
    if evict_hints is None:
        # x (> 50 MB at T = 1024, H = 7168) kept in L2 by the partials and dropped by the
        # finalize: faster there (mma vs mma_evict in
        # benchmarks/results/archive/hc_head_ab/ab_hc_head_one_launch_evict.json)
        evict_hints = cfg.mma
    cfg = cfg._replace(pdl=pdl, evict_hints=evict_hints)
    if warps is None and (cfg.partials_2d or cfg.mma):
        warps = (4, 1)
    if warps is not None:
        return cfg, (T, 14 if rmsnorm else 8, cfg.num_splits), warps
    return cfg, (T, 14 if rmsnorm else 8, cfg.num_splits), _num_warps(T)
