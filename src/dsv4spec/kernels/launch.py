"""Lean eager launches of Triton kernels: a compiled kernel cached per call shape.

``kernel[grid](...)`` (Triton 3.6) pays, every call, for binding and specialising each argument,
a cache-key lookup, a launch-metadata dict for the (empty) launch-hook chain, two calls of that
empty chain from the C launcher, and a ``cuPointerGetAttribute`` driver call per tensor argument.
Launch-bound ops (a few µs of GPU work) pay that on every eager call. :class:`LaunchCache` keeps,
per caller-chosen key, the ``CompiledKernel`` that Triton's own first launch returned, and later
calls go straight to its C launcher with raw device addresses; Inductor launches its generated
Triton kernels the same way.

The key must capture everything Triton specialises on: the constexprs and ``num_warps``, the
integer arguments (equal to 1, divisible by 16), and each pointer's 16-byte alignment. Callers
build it from the same values they pass. Where the cache cannot apply (the CPU interpreter, a
launch hook installed, e.g. by a profiler) every call goes through ``kernel[grid](...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from triton import knobs

from dsv4spec.kernels import interpreter_enabled


def _hooks_installed() -> bool:
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    # Triton 3.6 keeps hooks in (usually empty) HookChains; older versions use None.
    return any(h is not None and getattr(h, "calls", True) for h in (enter, leave))


class LaunchCache:
    """Launch one ``@triton.jit`` kernel, reusing its compiled form per key on CUDA.

    ``launch(key, grid, args, constexprs, num_warps)``: ``args`` are the kernel's runtime
    arguments in signature order (tensors for pointers), ``constexprs`` the ``tl.constexpr``
    ones by name, in signature order after the runtime ones. The first call per key launches
    through Triton and keeps the returned compiled kernel; later calls launch it directly, with
    tensors replaced by their device addresses. ``direct_launches`` counts the latter.
    """

    # False sends every launch through ``kernel[grid](...)`` (benchmarks compare the two paths).
    enabled = True

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._compiled: dict[Hashable, tuple[Callable, object, object, tuple]] = {}
        self.direct_launches = 0

    def clear(self) -> None:
        self._compiled.clear()

    def __len__(self) -> int:
        return len(self._compiled)

    def launch(
        self, key: Hashable, grid: tuple[int, int, int], args: Sequence, constexprs: dict,
        num_warps: int,
    ) -> None:
        entry = self._compiled.get(key) if LaunchCache.enabled else None
        if entry is not None:
            run, function, metadata, tail = entry
            self.direct_launches += 1
            stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
            run(grid[0], grid[1], grid[2], stream, function, metadata, None, None, None,
                *[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args], *tail)
            return
        names = self.kernel.arg_names
        if len(names) != len(args) + len(constexprs) or list(constexprs) != names[len(args):]:
            raise AssertionError(f"{names} is not (runtime args, then {list(constexprs)})")
        compiled = self.kernel[grid](*args, **constexprs, num_warps=num_warps)
        if compiled is None or interpreter_enabled() or _hooks_installed():
            return  # the interpreter returns no compiled kernel; hooks need Triton's own path
        # The C launcher takes every parameter, constexprs included (it skips those).
        self._compiled[key] = (compiled.run, compiled.function, compiled.packed_metadata,
                               tuple(constexprs.values()))


def alignment_key(*tensors: torch.Tensor | None) -> int:
    """Bit ``i`` set when tensor ``i``'s address is 16-byte aligned (Triton specialises on it)."""
    bits = 0
    for i, t in enumerate(tensors):
        if t is not None and t.data_ptr() % 16 == 0:
            bits |= 1 << i
    return bits
