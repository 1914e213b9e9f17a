"""The mHC hooks' kernel preparation, the same for every engine: every Triton variant that
dsv4spec's ``mhc_pre``, ``mhc_post_pre`` (the boundary) and ``mhc_post`` launch at the token
counts a hook may serve, compiled at once for one device, width and call signature (outside a
CUDA-graph capture: nothing may compile inside one), launching nothing, and one line saying so.

The planner (:func:`dsv4spec.kernels.mhc.plan`) tiles by the token count, and Triton compiles one
variant per kernel, constexpr set, compile options, pointer dtypes and specialisation of the
integer arguments (== 1, divisible by 16; the CUDA-core partials' and the finalize's ``T`` is
exempt, the tensor-core partials' is not). The variants are enumerated per plan: the counts
sharing a plan and ``T``'s specialisation share their variants, so one count of each is enough,
and counts whose launches compile to variants already listed are dropped. :func:`launches`
builds each launch as ``kernels/mhc.py``'s launchers do, on placeholder tensors
(``tests/integrations/test_mhc_precompile.py`` compares them with the launchers' own launches at
every plan).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NamedTuple

import torch
import triton

from dsv4spec.kernels import mhc as K
from dsv4spec.kernels.hc_head_precompile import _async_compile, _Placeholder, _variant

OPS = ("mhc_pre", "mhc_fused_post_pre", "mhc_post")


class Signature(NamedTuple):
    """What a call fixes beyond ``T`` and ``H``: the dtypes of its tensors and its constexprs
    (``mhc_post`` reads ``dtype`` alone)."""

    dtype: torch.dtype = torch.bfloat16  # the streams, the layer input and ``f``
    fn_dtype: torch.dtype = torch.float32
    scale_dtype: torch.dtype = torch.float32
    base_dtype: torch.dtype = torch.float32
    weight_dtype: torch.dtype | None = torch.bfloat16  # None: no fused RMSNorm
    sinkhorn_iters: int = 20
    fast_math: bool = True  # CUDA's approximate division (every CUDA device, not ROCm)


def plan_of(op: str, T: int, H: int, device_index: int, dtype: torch.dtype = torch.bfloat16):
    """The tiling ``op`` runs at ``T`` (what its launches depend on besides ``T``)."""
    if op == "mhc_post":
        return (*K.post_tiling(T), K.POST_PDL and K.supports_pdl(device_index))
    return K.plan.__wrapped__(T, H, device_index, dtype=dtype,
                              **({"boundary": True} if op == "mhc_fused_post_pre" else {}))


def launches(op: str, T: int, H: int, device_index: int, sig: Signature = Signature()) -> list:
    """``op``'s launches at ``T`` tokens of width ``H`` on ``cuda:device_index`` as
    ``(launch cache, grid, args, constexprs, options)``, the tensors as placeholders."""
    P = _Placeholder
    hc, f32 = K.HC, torch.float32
    cfg = plan_of(op, T, H, device_index, sig.dtype)
    if op == "mhc_post":
        block_h, warps, pdl = cfg
        num_hblocks = triton.cdiv(H, block_h)
        options = {"num_warps": warps} | ({"launch_pdl": True} if pdl else {})
        args = (P(sig.dtype, (T, H)), P(sig.dtype, (T, hc, H)), P(f32, (T, hc)),
                P(f32, (T, hc, hc)), P(sig.dtype, (T, hc, H)), H, num_hblocks)
        return [(K._POST, (T * num_hblocks, 1, 1), args, {"BLOCK_H": block_h, "PDL": pdl},
                 options)]
    boundary = op == "mhc_fused_post_pre"
    rmsnorm = sig.weight_dtype is not None
    nrows = K.NMIX
    x = P(sig.dtype, (T, hc, H))
    fn = P(sig.fn_dtype, (nrows, hc * H))
    scale, base = P(sig.scale_dtype, (3,)), P(sig.base_dtype, (nrows,))
    weight = P(sig.weight_dtype, (H,)) if rmsnorm else base
    ws = P(f32, (T, nrows + (10 if rmsnorm else 4), cfg.num_splits))
    parts = P(torch.bfloat16, (3, 4 * H, 32)) if cfg.presplit else fn
    if boundary:
        src, f, post_in, comb_in = (P(sig.dtype, (T, hc, H)), P(sig.dtype, (T, H)),
                                    P(f32, (T, hc)), P(f32, (T, hc, hc)))
    else:
        src, f, post_in, comb_in = x, x, scale, scale
    out = []
    args1 = (src, f, post_in, comb_in, x, fn, ws, T, H, cfg.num_splits, fn.stride(0),
             ws.stride(0), ws.stride(1))
    constexprs1 = K.partials_constexprs(cfg, boundary, rmsnorm, nrows)
    cache = K.partials_kernel(cfg)
    if cfg.presplit:
        out.append((K._SPLIT_FN, (triton.cdiv(4 * H, 64), 1, 1),
                    (fn, parts, 4 * H, fn.stride(0)), {"BLOCK_C": 64}, {"num_warps": 4}))
        args1 = (*args1[:5], parts, *args1[6:])
    options1 = ({"num_warps": cfg.partials_warps}
                | ({"num_stages": cfg.stages} if cfg.stages is not None else {})
                | ({"launch_pdl": True} if cfg.wait else {}))
    out.append((cache, (triton.cdiv(T, cfg.block_t) * cfg.num_splits, 1, 1), args1,
                constexprs1, options1))
    num_hblocks = triton.cdiv(H, cfg.block_h)
    eps = 1e-6
    out.append((K._FINALIZE, (T * (num_hblocks + 1), 1, 1),
                (x, ws, scale, base, weight, P(f32, (T, hc)), P(f32, (T, hc, hc)),
                 P(sig.dtype, (T, H)), T, H, cfg.num_splits, num_hblocks, eps, eps, eps, 2.0,
                 ws.stride(0), ws.stride(1)),
                K.finalize_constexprs(cfg, sig.sinkhorn_iters, rmsnorm, boundary, False,
                                      sig.fast_math, nrows),
                {"num_warps": cfg.finalize_warps} | ({"launch_pdl": True} if cfg.pdl else {})))
    return out


def variant(launch) -> tuple:
    """What Triton compiles ``launch`` into (hc_head_precompile's key, plus the pointer
    dtypes)."""
    return (*_variant(launch),
            tuple(a.dtype for a in launch[2] if hasattr(a, "data_ptr")))


def variant_tokens(op: str, tokens: Iterable[int], H: int, device_index: int,
                   sig: Signature = Signature()) -> list[int]:
    """The smallest of ``tokens`` for each distinct compiled variant ``op`` launches at them:
    one count per plan and specialisation of ``T`` (the tensor-core partials specialise it),
    then the counts whose variants an earlier count already compiles dropped."""
    plans: dict = {}
    for T in tokens:
        plans.setdefault((plan_of(op, T, H, device_index, sig.dtype), T == 1, T % 16 == 0), T)
    seen: dict = {}
    for T in sorted(plans.values()):
        for launch in launches(op, T, H, device_index, sig):
            seen.setdefault(variant(launch), T)
    return sorted(set(seen.values()))


def variants(op: str, tokens: Iterable[int], H: int, device_index: int,
             sig: Signature = Signature()) -> set:
    """The distinct compiled variants ``op`` launches at ``tokens``."""
    return {variant(launch) for T in variant_tokens(op, tokens, H, device_index, sig)
            for launch in launches(op, T, H, device_index, sig)}


_KERNELS = (K._PARTIALS, K._PARTIALS_MMA, K._PARTIALS_TOKEN_MMA, K._SPLIT_FN, K._FINALIZE,
            K._POST)


def compiled_variants(device_index: int) -> int:
    """How many variants of the mHC kernels Triton holds compiled for ``device_index``."""
    total = 0
    for cache in _KERNELS:
        caches = getattr(cache.kernel, "device_caches", {})
        if device_index in caches:
            total += len(caches[device_index][0])
    return total


def precompile(op: str, tokens: Iterable[int], H: int, device_index: int,
               sig: Signature = Signature(), threads: int = 8) -> int:
    """Compile every kernel variant ``op`` launches at ``tokens`` on CUDA device
    ``device_index`` (Triton's ``warmup`` on placeholders, on ``threads`` threads where this
    Triton compiles asynchronously); returns how many were compiled (0 where all were, and in
    the interpreter, which compiles nothing)."""
    if device_index < 0:
        return 0
    before = compiled_variants(device_index)
    with torch.cuda.device(device_index), _async_compile(threads):
        for T in variant_tokens(op, tokens, H, device_index, sig):
            for cache, grid, args, constexprs, options in launches(op, T, H, device_index, sig):
                cache.kernel.warmup(*args, grid=grid, **constexprs, **options)
    return compiled_variants(device_index) - before


def spans_of(tokens: Iterable[int]) -> str:
    """``1-4, 9-16``: the counts as ranges, for the log line."""
    out, start, last = [], None, None
    for T in sorted(tokens):
        if start is None:
            start = last = T
        elif T == last + 1:
            last = T
        else:
            out.append(f"{start}-{last}" if last > start else f"{start}")
            start = last = T
    if start is not None:
        out.append(f"{start}-{last}" if last > start else f"{start}")
    return ", ".join(out)


def precompile_mhc(op: str, tokens: list[int], H: int, device_index: int, sig: Signature,
                   logger: logging.Logger) -> int:
    """:func:`precompile` and one WARNING saying how many variants and how long (the time the
    engine's first eager call of ``op`` at this width spends); nothing in the interpreter
    (``device_index`` -1)."""
    if device_index < 0:
        return 0
    start = time.perf_counter()
    count = precompile(op, tokens, H, device_index, sig)
    logger.warning("dsv4spec: %s kernels for H = %d, T = %s on cuda:%d ready: %d variants "
                   "compiled in %.1f s", op, H, spans_of(tokens), device_index, count,
                   time.perf_counter() - start)
    return count
