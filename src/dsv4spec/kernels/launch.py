"""Lean eager launches of Triton kernels: the compiled kernel cached per call shape.

``kernel[grid](...)`` pays, every call, for binding and specialising each argument, a cache-key
lookup, a launch-metadata dict for the (empty) launch-hook chain and two calls of that empty
chain from the C launcher; Triton 3.6's launcher adds a ``cuPointerGetAttribute`` driver call per
tensor argument, Triton 3.8's a Python scratch-allocation step before its generic C launcher: on
the H200's host, well above the cached launch below, and more with more arguments (the
empty-kernel and ``hc_head_triton`` rows, Triton dispatcher vs ``LaunchCache``, of
``benchmarks/results/eager_cost/``). Launch-bound ops pay that on every eager call.

:class:`LaunchCache` keeps, per caller-chosen key, the ``CompiledKernel`` that Triton's own first
launch returned, with every argument but the pointers bound; a later call with the same key
passes only the pointers' device addresses to the kernel's C launcher (Inductor launches its
generated kernels the same way). The key must capture everything Triton specialises on and
everything bound: the grid, the integer and float arguments, the constexprs, ``num_warps``,
``num_stages`` and ``launch_pdl``, the pointer dtypes and each pointer's 16-byte alignment.
Where the cache cannot apply (the CPU interpreter, a launch hook installed, e.g. by a profiler,
a Triton release outside :data:`DIRECT_LAUNCH_LAYOUTS`, a C launcher that does not read one
argument per kernel parameter) every call goes through ``kernel[grid](...)``. Hooks are checked
when a key is first launched: install a profiler's hooks before the first call of a shape, or
launch inside ``LaunchCache.disabled()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence

import torch
import triton
from triton import knobs

from dsv4spec.kernels import DIRECT_LAUNCH_LAYOUTS, interpreter_enabled

# DIRECT_LAUNCH_LAYOUTS (kept in dsv4spec.kernels, which imports no Triton, for doctor and the
# tables): the direct launch calls Triton's compiled-kernel internals (``CompiledKernel.function``,
# ``packed_metadata`` and the C launcher's positional argument list), which change between
# releases: Triton 3.6 compiles one C launcher per signature and takes the kernel's arguments
# spread after the hooks; Triton 3.8 has one generic C launcher that takes the scratch buffers,
# the argument annotations, a packed signature and the arguments as one tuple. Each release maps
# to the argument layout its GPU tests ran with (bit-equal to ``kernel[grid](...)``); any other
# release launches through Triton's public ``kernel[grid](...)`` (correct, more host time a call).
# The version must match exactly: a local build (``3.8.0+git...``) is whatever commit it was
# built from, near that release or not, and a C launcher of another layout reads its positional
# arguments unchecked (a wrong launch or a crash, not an exception), which no check at bind time
# can rule out.


def direct_launch_layout(version: str | None = None) -> str | None:
    """The C launcher's argument layout on this Triton release (default: the imported one), or
    None where not validated (another release, a pre-release or a local build)."""
    return DIRECT_LAUNCH_LAYOUTS.get(triton.__version__ if version is None else version)


def direct_launch_supported(version: str | None = None) -> bool:
    """Whether :class:`LaunchCache` may bind direct launches on this Triton release (default:
    the imported one)."""
    return direct_launch_layout(version) is not None


def _hooks_installed() -> bool:
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    # Triton 3.6 and 3.8 keep hooks in (usually empty) HookChains; older versions use None.
    return any(h is not None and getattr(h, "calls", True) for h in (enter, leave))


class LaunchCache:
    """Launch one ``@triton.jit`` kernel, reusing its compiled form per key on CUDA.

    Kernels launched through it take their pointer arguments first. Use::

        direct = cache.get(key)
        if direct is not None:
            direct(a.data_ptr(), b.data_ptr())       # the pointers, in signature order
        else:
            cache.launch(key, grid, (a, b, n), {"BLOCK": 128}, num_warps=4)

    :meth:`launch` goes through Triton (``args``: the runtime arguments in signature order,
    tensors for the pointers; ``constexprs``: the ``tl.constexpr`` ones by name, in signature
    order after them) and keeps the compiled kernel with the grid and every non-pointer argument
    bound. ``direct_launches`` counts the launches made through :meth:`get`'s callables.
    """

    # False sends every launch through ``kernel[grid](...)`` (benchmarks compare the two paths).
    enabled = direct_launch_supported()

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._entries: dict[Hashable, Callable[..., None]] = {}
        self.direct_launches = 0

    @staticmethod
    @contextlib.contextmanager
    def disabled() -> Iterator[None]:
        """Every launch through ``kernel[grid](...)`` inside (benchmarks compare the paths)."""
        was = LaunchCache.enabled
        LaunchCache.enabled = False
        try:
            yield
        finally:
            LaunchCache.enabled = was

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Callable[..., None] | None:
        """The direct launch for ``key`` (call it with the pointers' addresses), or None."""
        return self._entries.get(key) if LaunchCache.enabled else None

    def launch(
        self, key: Hashable, grid: tuple[int, int, int], args: Sequence, constexprs: dict,
        num_warps: int, num_stages: int | None = None, launch_pdl: bool = False,
    ) -> None:
        names = self.kernel.arg_names
        if len(names) != len(args) + len(constexprs) or list(constexprs) != names[len(args):]:
            raise AssertionError(f"{names} is not (runtime args, then {list(constexprs)})")
        options = {"num_warps": num_warps}
        if num_stages is not None:
            options["num_stages"] = num_stages
        if launch_pdl:  # a programmatic dependent launch (sm_90+): it may start early
            options["launch_pdl"] = True
        compiled = self.kernel[grid](*args, **constexprs, **options)
        if (compiled is None or interpreter_enabled() or _hooks_installed()
                or not LaunchCache.enabled):
            return  # the interpreter returns no compiled kernel; hooks need Triton's own path
        num_pointers = 0
        while num_pointers < len(args) and isinstance(args[num_pointers], torch.Tensor):
            num_pointers += 1
        if any(isinstance(a, torch.Tensor) for a in args[num_pointers:]):
            return  # pointers after scalars: not a layout the direct launch binds
        # The C launcher takes every parameter, constexprs included (it skips those).
        bound = (*args[num_pointers:], *constexprs.values())
        direct = self._direct(compiled, grid, bound, num_pointers)
        if direct is not None:
            self._entries[key] = direct

    def _direct(self, compiled, grid, bound: tuple,
                num_pointers: int) -> Callable[..., None] | None:
        """The direct launch of ``compiled``, or None where its C launcher does not take one
        argument per parameter (``kernel[grid](...)`` then launches every call)."""
        gx, gy, gz = grid
        function, metadata = compiled.function, compiled.packed_metadata
        launcher = compiled.run
        get_stream, get_device = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
        c_launch = getattr(launcher, "launch", None)
        layout = direct_launch_layout()
        if _launcher_arguments(layout, compiled) != num_pointers + len(bound):
            return None
        # scratch buffers (global or profiler) are allocated per launch by the Python launcher
        scratch = (getattr(launcher, "global_scratch_size", 1)
                   or getattr(launcher, "profile_scratch_size", 1))
        generic = (layout == "generic" and c_launch is not None and not scratch
                   and not getattr(launcher, "gsan_enabled", False))
        if generic:
            # Triton 3.8: CudaLauncher.__call__ minus its scratch step; ``launch`` is the
            # generic C launcher itself (no tensor descriptors among our arguments)
            coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
            annotations, signature = launcher.arg_annotations, launcher.kernel_signature

            def direct(*pointers: int) -> None:
                self.direct_launches += 1
                c_launch(gx, gy, gz, get_stream(get_device()), function, coop, pdl, metadata,
                         None, None, None, None, None, annotations, signature,
                         (*pointers, *bound))
        elif layout == "per_signature" and c_launch is not None and not scratch:
            # Triton 3.6: no scratch buffers to allocate, so skip the launcher's Python __call__
            coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl

            def direct(*pointers: int) -> None:
                self.direct_launches += 1
                c_launch(gx, gy, gz, get_stream(get_device()), function, coop, pdl, None, None,
                         metadata, None, None, None, *pointers, *bound)
        else:
            # the launcher's own __call__ (the same positional layout in 3.6 and 3.8)
            def direct(*pointers: int) -> None:
                self.direct_launches += 1
                launcher(gx, gy, gz, get_stream(get_device()), function, metadata, None, None,
                         None, *pointers, *bound)
        direct.num_pointers = num_pointers
        return direct


def _launcher_arguments(layout: str | None, compiled) -> int | None:
    """How many kernel arguments ``compiled``'s C launcher reads, constexprs included (None:
    unknown). Triton 3.8's generic launcher reads one per argument annotation, unchecked (the
    address sanitizer's annotation is the one its launcher's ``__call__`` appends); Triton 3.6's
    was generated from the source's signature, one per entry, a tensor descriptor or a tuple
    expanding to several (it raises on another count, on every call)."""
    launcher = compiled.run
    if layout == "generic":
        annotations = getattr(launcher, "arg_annotations", None)
        if annotations is None:
            return None
        return len(annotations) - bool(getattr(launcher, "gsan_enabled", False))
    if layout == "per_signature":
        signature = getattr(getattr(compiled, "src", None), "signature", None)
        if not isinstance(signature, dict) or not all(
                isinstance(t, str) and not t.startswith("tensordesc") for t in signature.values()):
            return None
        return len(signature)
    return None


def alignment_key(*pointers: int) -> int:
    """-1 when every address is 16-byte aligned (the common case), else a bit mask of the aligned
    ones: Triton specialises pointer arguments on it, so cached launches key on it."""
    combined = 0
    for p in pointers:
        combined |= p
    if not combined & 15:
        return -1
    return sum(1 << i for i, p in enumerate(pointers) if not p & 15)
