"""Capture-time compilation: compile chosen functions with Inductor only while graphs are captured.

Graph runners hold :func:`capture_mode` around the warm-up runs and the capture of each batch size.
A function decorated with :func:`compile_in_capture_mode` then runs a ``torch.compile`` of itself
(compiled in the warm-up, replayed by the capture); everywhere else it runs eagerly, so the eager
path never pays compile time. Why and the rules it follows: docs/design.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

# Dynamo compiles one graph per input signature with dynamic=False; its default recompile limit
# (8) would silently send the 9th captured batch size back to eager. This is the limit we set for
# the decorated function only (patched around its compiled calls), with a hard failure beyond it.
RECOMPILE_LIMIT = 256


@dataclass(frozen=True)
class _CaptureState:
    allow_cpu: bool


_STATE: contextvars.ContextVar[_CaptureState | None] = contextvars.ContextVar(
    "dsv4spec_capture_mode", default=None
)


@contextlib.contextmanager
def capture_mode(allow_cpu: bool = False) -> Iterator[None]:
    """Mark the enclosed warm-up and capture runs as "capturing a CUDA graph".

    Nestable: the previous state is restored on exit. ``allow_cpu=True`` lets functions decorated
    with :func:`compile_in_capture_mode` take their compiled path with CPU tensors (for tests on
    machines without a GPU).
    """
    token = _STATE.set(_CaptureState(allow_cpu=allow_cpu))
    try:
        yield
    finally:
        _STATE.reset(token)


def is_capture_mode() -> bool:
    """True inside :func:`capture_mode`."""
    return _STATE.get() is not None


def stream_capturing(device: torch.device | str | int | None = None) -> bool:
    """Whether the current CUDA stream is being captured into a CUDA graph.

    False for non-CUDA devices, without asking CUDA: ``torch.cuda.is_current_stream_capturing``
    raises on CPU-only torch builds. ``device`` is a device, a device index (a tensor's
    ``get_device()``, -1 for the CPU: the cheapest form), or ``None`` for the current device.
    """
    if isinstance(device, int):  # a tensor's get_device(): -1 for the CPU
        if device < 0:
            return False
    elif device is not None:
        if torch.device(device).type != "cuda":
            return False
    elif not torch.cuda.is_available():
        return False
    return torch._C._cuda_isCurrentStreamCapturing()


def capture_cuda_graph(fn: Callable[[], object], device: torch.device | None = None, *,
                       warmups: int = 1) -> torch.cuda.CUDAGraph:
    """``fn`` run ``warmups`` times on a side stream (as ``torch.cuda.graphs`` does: compiles,
    lets the allocator and cuBLAS settle), then captured once in a CUDA graph on ``device``
    (default: the current one). Replay the returned graph. Call it under :func:`capture_mode`
    to compile the functions marked for it in the warm-up and record them compiled."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _key(value) -> object:
    # What Dynamo guards on, conservatively: tensor metadata, and the value of Python scalars
    # (floats and ints are specialised as constants with dynamic=False).
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), value.stride(), value.dtype, str(value.device),
                value.requires_grad)
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v) for v in value))
    return (type(value).__name__, id(value))


class CaptureCompiled:
    """The wrapper returned by :func:`compile_in_capture_mode` (counters for tests and logs)."""

    def __init__(self, fn: Callable, compile_kwargs: dict):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.compile_kwargs = {"fullgraph": True, **compile_kwargs}
        self._compiled: Callable | None = None
        self._seen: set = set()
        self.reset_counters()

    def reset_counters(self) -> None:
        """Zero ``compilations``, ``compiled_calls`` and ``eager_calls``."""
        self.compilations = 0
        self.compiled_calls = 0
        self.eager_calls = 0

    def _use_compiled(self, args: tuple, kwargs: dict) -> bool:
        state = _STATE.get()
        if state is None:
            return False
        x = _first_tensor(args, kwargs)
        if x is None or x.numel() == 0:
            return False
        return x.is_cuda or (state.allow_cpu and x.device.type == "cpu")

    def __call__(self, *args, **kwargs):
        if not self._use_compiled(args, kwargs):
            self.eager_calls += 1
            return self.fn(*args, **kwargs)
        key = (
            tuple(_key(a) for a in args),
            tuple((k, _key(v)) for k, v in sorted(kwargs.items())),
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
        )
        if key not in self._seen and stream_capturing():
            raise RuntimeError(
                f"{self.fn.__qualname__}: these inputs were not seen in a warm-up run under "
                "capture_mode(), and compiling during CUDA stream capture fails; run the same "
                f"call once under capture_mode() before capturing (signature: {key})"
            )
        if self._compiled is None:
            self._compiled = torch.compile(self.fn, **self.compile_kwargs)
        from torch._dynamo.utils import counters

        graphs_before = counters["stats"]["unique_graphs"]
        with torch._dynamo.config.patch(
            recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True
        ):
            out = self._compiled(*args, **kwargs)
        self.compilations += counters["stats"]["unique_graphs"] - graphs_before
        self._seen.add(key)
        self.compiled_calls += 1
        return out


def compile_in_capture_mode(fn: Callable | None = None, **compile_kwargs) -> Callable:
    """Decorator: run ``torch.compile(fn, **compile_kwargs)`` only under :func:`capture_mode`.

    At call time the compiled function runs when capture mode is on and the first tensor argument
    is a non-empty CUDA tensor (or a CPU tensor under ``capture_mode(allow_cpu=True)``); otherwise
    ``fn`` runs eagerly and nothing is compiled. ``fullgraph=True`` is the default, so a graph
    break is an error rather than a silent partial fallback.

    Compilation must happen in a warm-up run: a call made while the current CUDA stream is
    capturing with an input signature (tensor shapes, strides, dtypes, devices and Python scalar
    values) not seen by an earlier compiled call raises ``RuntimeError``. Dynamo's recompile limit
    is raised to ``RECOMPILE_LIMIT`` for this function's calls and hitting it is an error, so every
    captured batch size runs compiled code, also with ``dynamic=False``.

    Usable as ``@compile_in_capture_mode`` or ``@compile_in_capture_mode(dynamic=False)``. The
    returned wrapper counts ``compilations`` (new Dynamo graphs), ``compiled_calls`` and
    ``eager_calls``; ``reset_counters()`` zeroes them.
    """
    if fn is None:
        return functools.partial(compile_in_capture_mode, **compile_kwargs)
    return CaptureCompiled(fn, compile_kwargs)
