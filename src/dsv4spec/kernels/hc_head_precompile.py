"""Compiling hc_head's kernels ahead of the first call: which variants the default tiling needs
for ``T = 1..PRECOMPILE_MAX_TOKENS``, Triton's ``warmup`` of each on placeholder tensors, and a
count of what is compiled. A server calls :func:`precompile` once per width and dtype, so a new
batch size compiles nothing mid-request.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import torch

from dsv4spec.kernels.hc_head import (
    _FINALIZE,
    _PARTIALS,
    _PARTIALS_MMA,
    HC,
    _finalize_launch,
    _partials_launch,
)
from dsv4spec.kernels.hc_head_plan import _plan

# Triton compiles one variant per constexpr set and per specialisation of the integer arguments
# (== 1, divisible by 16; T is exempt); hc_head_triton's plan depends on T, so a new T can need a
# new variant.
# At T above this every call compiles what some T below it did (tests/kernels/test_hc_head_plan.py
# checks up to twice this), so compiling the variants up to it leaves nothing to compile for any T.
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
    kernel = cache.kernel
    # a JITFunction, or under TRITON_INTERPRET=1 an InterpretedFunction keeping jit's kwargs
    fixed = set(getattr(kernel, "kwargs", None) and kernel.kwargs.get("do_not_specialize") or
                getattr(kernel, "do_not_specialize", None) or ())
    ints = tuple((a == 1, a % 16 == 0) for name, a in zip(kernel.arg_names, args)
                 if type(a) is int and name not in fixed)
    return kernel, tuple(constexprs.items()), tuple(options.items()), ints


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
