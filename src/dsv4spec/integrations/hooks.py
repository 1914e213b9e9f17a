"""What every serving-engine plugin of dsv4spec needs, whatever the engine: switches, hook
targets, and hooks that can never take the engine down.

A hook wraps one method of the engine. Its fast path (dsv4spec's op) either returns the method's
result, or :data:`STEP_ASIDE` where it does not apply (another device, an input it does not
cover, a mode it was not measured in), and then the engine's original runs with the same
arguments. :class:`GuardedHook` adds the rule a server that runs for days needs: any exception
from the fast path, of any type, is logged once at WARNING with its traceback, switches that hook
off for the rest of the process, and the original runs instead.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from dsv4spec.kernels import on_rocm
from dsv4spec.usage import OFF_VALUES, env_switch  # noqa: F401 - OFF_VALUES: the plugins' export


def switch_on(switch: str) -> bool:
    """Whether the environment switch ``switch`` leaves its hook on: unset, on; otherwise read as
    every dsv4spec switch is (:func:`dsv4spec.usage.env_switch`): a value that is neither on nor
    off is logged at WARNING, naming it, and turns the hook off."""
    return env_switch(switch, True)


class _StepAside:
    __slots__ = ()

    def __repr__(self) -> str:
        return "STEP_ASIDE"


# Returned by a fast path that does not apply to a call: the engine's original runs instead.
STEP_ASIDE: Any = _StepAside()


@dataclass(frozen=True)
class Hook:
    """One hook: its switch, the engine method it wraps (``module`` + dotted ``attr``), that
    method's parameters as the hook expects them, and ``make(module)`` building the hook."""

    name: str
    switch: str
    module: str
    attr: str
    params: tuple[str, ...]
    make: Callable[[ModuleType], Callable]

    @property
    def target(self) -> str:
        return f"{self.module}.{self.attr}"

    def resolve(self) -> ModuleType:
        """The target's module, after checking the target exists with :attr:`params`."""
        module = importlib.import_module(self.module)
        fn = module
        for part in self.attr.split("."):
            fn = getattr(fn, part)
        params = tuple(inspect.signature(fn).parameters)
        if params != self.params:
            raise TypeError(f"parameters {params}, the hook expects {self.params}")
        return module


class GuardedHook:
    """An AROUND hook ``hook(original, *args, **kwargs)`` around a fast path that never fails the
    engine: ``fast(*args, **kwargs)`` returns the result or :data:`STEP_ASIDE`; any exception it
    raises switches the hook off (one WARNING with the traceback) and the original runs.

    Exceptions raised by the original propagate untouched: they are the engine's own.
    """

    _dsv4spec_hook = True  # how a registry tells dsv4spec's hooks from others

    def __init__(self, name: str, fast: Callable[..., Any], logger: logging.Logger,
                 engine: str = "the engine") -> None:
        self.name = name
        self.fast = fast
        self.logger = logger
        self.engine = engine
        self.enabled = True
        self.failure: str | None = None

    def __call__(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.enabled:
            try:
                result = self.fast(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - whatever it is, the server must keep serving
                self.switch_off(e)
            else:
                if result is not STEP_ASIDE:
                    return result
        return original(*args, **kwargs)

    def switch_off(self, error: BaseException) -> None:
        """Turn the hook off for the rest of the process, logging ``error`` once."""
        self.enabled = False
        self.failure = f"{type(error).__name__}: {error}"
        self.logger.warning(
            "dsv4spec: the %s hook failed (%s); it is off for the rest of this process and "
            "%s's own code runs in its place", self.name, self.failure, self.engine,
            exc_info=(type(error), error, error.__traceback__))


# Measured-faster tables: where dsv4spec's op beat the engine's own, per GPU architecture
# (compute capability), mode ("graph": device time inside a CUDA graph; "eager": host wall time
# per back-to-back eager call) and hidden size: inclusive token ranges whose measured points all
# won. A hook runs dsv4spec's op only inside them.
Architecture = tuple[int, int]
Spans = tuple[tuple[int, int], ...]
FasterTable = dict[Architecture, dict[str, dict[int, Spans]]]
# The architecture the CPU interpreter stands in for (its grids mirror an H200's).
INTERPRETER_ARCHITECTURE: Architecture = (9, 0)
_architectures: dict[int, Architecture | None] = {}


def gpu_architecture(device_index: int) -> Architecture | None:
    """Device ``device_index``'s compute capability (remembered); the interpreter's stand-in
    for the CPU (-1); None on ROCm, whose capability numbers mean something else."""
    if device_index < 0:
        return INTERPRETER_ARCHITECTURE
    if device_index not in _architectures:
        _architectures[device_index] = (
            None if on_rocm() else tuple(torch.cuda.get_device_capability(device_index)))
    return _architectures[device_index]


def measured_faster(table: FasterTable, architecture: Architecture | None, hidden_size: int,
                    num_tokens: int, in_graph: bool) -> bool:
    """Whether ``num_tokens`` lies in a winning range of ``table`` for that architecture, mode
    and hidden size."""
    modes = table.get(architecture) if architecture is not None else None
    if modes is None:
        return False
    for lo, hi in modes["graph" if in_graph else "eager"].get(hidden_size, ()):
        if lo <= num_tokens <= hi:
            return True
    return False


def rows_for(table: FasterTable, deepgemm_table: FasterTable | None,
             architecture: Architecture | None, deep_gemm: bool,
             key: int | None = None) -> FasterTable:
    """The rows deciding an mHC hook where the engine runs DeepGEMM (``deep_gemm``): those
    measured against its DeepGEMM path (``deepgemm_table``, the ``.deepgemm`` files) where any
    exist for ``architecture`` (and, given, the width ``key``), else ``table``'s, which
    :func:`path_matches` then admits only at the counts where the engine's path is theirs;
    ``table`` where the engine does not."""
    if not deep_gemm or deepgemm_table is None or architecture is None:
        return table
    modes = deepgemm_table.get(architecture)
    if modes is None or (key is not None and not any(key in keyed for keyed in modes.values())):
        return table
    return deepgemm_table


# (logger name, engine path, rows' path, op) already told at WARNING
_told_paths: set[tuple[str, str, str, str]] = set()
# the attribute :func:`path_matches`'s WARNING records carry (``dsv4spec doctor`` reports both
# DeepGEMM cases itself and leaves these out)
PATH_MISMATCH = "dsv4spec_path_mismatch"


def path_matches(table: FasterTable, architecture: Architecture | None, op: str,
                 num_tokens: int, engine_deep_gemm: bool, logger: logging.Logger,
                 tell: bool = True) -> bool:
    """Whether the rows of ``table`` deciding ``architecture`` were measured against the path the
    engine's ``op`` takes at ``num_tokens``: DeepGEMM's pre-norm GEMM (``engine_deep_gemm``) or
    the engine's own kernels. A table of files records its rows' path per count
    (``measured_against``: :func:`dsv4spec.integrations.tables.deepgemm_above`); one set by hand
    (tests) holds the engine's own kernels. Where the two differ the rows say nothing of the
    kernel running, so the hook steps aside: False, with one WARNING per op and pair of paths
    naming both (none where not ``tell``: the engine's path is assumed, not read, and the caller
    has said so). True where no rows decide (nothing is served then anyway)."""
    if architecture is None or table.get(architecture) is None:
        return True
    above = getattr(table, "deepgemm_above", {}).get(architecture)
    rows_deep_gemm = above is not None and num_tokens > above
    if rows_deep_gemm == engine_deep_gemm:
        return True
    names = {True: "DeepGEMM's pre-norm GEMM", False: "its own kernels without DeepGEMM"}
    told = (logger.name, names[engine_deep_gemm], names[rows_deep_gemm], op)
    if tell and told not in _told_paths:
        _told_paths.add(told)
        logger.warning(
            "dsv4spec: %s runs %s at %d tokens, but the measured-faster rows for it (%s) were "
            "timed against %s; the hook steps aside wherever the two differ (a `dsv4spec tune` "
            "run beside the path this engine takes measures it)", op, names[engine_deep_gemm],
            num_tokens, getattr(table, "sources", {}).get(architecture, "set by hand"),
            names[rows_deep_gemm], extra={PATH_MISMATCH: True})
    return False


@dataclass(frozen=True)
class Gate:
    """How one hook decides where it runs dsv4spec's ops, as data for reports (``dsv4spec
    doctor``): the table and the decision function its fast path uses, never a copy of them.

    ``ops``: the ops of :mod:`dsv4spec.ops` it launches, by name. ``table``: the measured-faster
    table its decision reads (a :class:`~dsv4spec.integrations.tables.FileTable`); None: none of
    its own. ``prefers(count, key, in_graph, architecture, **case)``: what its fast path asks per
    call; without a table it is asked with key None (it serves every key) at counts
    ``1..max_count``; None: no per-call range. ``cases``: label -> keyword arguments of
    ``prefers`` for conditions only the running engine knows (vLLM's DeepGEMM), each reported
    apart. ``stack_gated``: it serves only where a table of the running Triton's stack serves the
    GPU (:func:`~dsv4spec.integrations.tables.stack_validated`). ``follows``: the hook whose
    launch it hands over; it acts where that one does. ``note``: what else decides at run time.
    ``key``, ``count``: what the key and the count are where no table names them.
    ``deepgemm_table``: the rows measured against the engine's DeepGEMM path, which decide the
    case ``deep_gemm=True`` where they cover the GPU (:func:`rows_for`).
    """

    ops: tuple[str, ...] = ()
    table: Any = None
    deepgemm_table: Any = None
    prefers: Callable[..., bool] | None = None
    cases: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"": {}})
    max_count: int | None = None
    stack_gated: bool = False
    follows: str | None = None
    note: str = ""
    key: str = "hidden_size"
    count: str = "num_tokens"


def deep_gemm_cases(deep_gemm_from_tokens: int | None) -> dict[str, dict[str, Any]]:
    """:attr:`Gate.cases` of an mHC hook whose engine op runs DeepGEMM's pre-norm GEMM from
    ``deep_gemm_from_tokens`` tokens where the engine decides so (None: never): reported with
    DeepGEMM off and on, which only the running engine knows."""
    if deep_gemm_from_tokens is None:
        return {"": {}}
    return {"DeepGEMM off": {"deep_gemm": False}, "DeepGEMM on": {"deep_gemm": True}}


def run_where_measured_faster(key: tuple, compiled: set, capturing: bool,
                              prefers: Callable[[bool], bool], launch: Callable[[], Any]) -> Any:
    """``launch()`` where ``prefers(in_graph)`` gives this call to dsv4spec, else STEP_ASIDE: the
    capture rule of the hooks with measured tables.

    Inside a capture only a launch already compiled (``key`` in ``compiled``) runs: compiling
    there would stall the capture. Eagerly, the eager table decides; a shape the graph table gives
    to dsv4spec is also launched once where the eager table keeps the engine's (the result is
    dropped), so it is compiled before the engine captures it.
    """
    if capturing:
        if key in compiled and prefers(True):
            return launch()
        return STEP_ASIDE
    if prefers(False):
        result = launch()
        compiled.add(key)
        return result
    if key not in compiled and prefers(True):
        launch()
        compiled.add(key)
    return STEP_ASIDE

