"""Measured-faster tables as data: one JSON file per GPU, found by device name, read by every
engine plugin through :func:`faster_table`.

A hook serves dsv4spec's op only where its table says ours was measured faster on this GPU under
the Triton release this process runs (its major.minor, the *stack*: our kernels are compiled by
it, and Triton 3.8 compiles some of them slower than 3.6 did). The tables live in
``tables/<device>.json`` (the device name as CUDA reports it, spaces as underscores:
``NVIDIA_H200.json``), with one file per architecture (``sm_90.json``) for GPUs no file names;
a file holds one stack, the one its ``measured.triton`` names, and files of other stacks are
named ``<device>.triton<M.m>.json`` (``NVIDIA_H200.triton3.8.json``). ``dsv4spec tune`` measures
a GPU under the running Triton and writes its file, named with its stack, into the user directory
(``$DSV4SPEC_TABLES_DIR``, default ``$XDG_CACHE_HOME/dsv4spec/tables`` or
``~/.cache/dsv4spec/tables``). For each hook, the first file of this chain that holds the hook
and was measured under the running stack decides: the user directory's device files, the
packaged device files, the packaged architecture files. A malformed file in the chain means the
engine's own code for every hook on that GPU (one WARNING naming the file); no file at all, or
files of other stacks only, the same (one WARNING naming ``dsv4spec tune``).

Rows measured against the engines' DeepGEMM path (their ``mhc_pre`` and, above 32 tokens, the
fused boundary run DeepGEMM's pre-norm GEMM where it is on) live in files of their own, named
with ``.deepgemm`` before the stack (``NVIDIA_H200.deepgemm.triton3.8.json``,
``sm_90.deepgemm.triton3.8.json``): where the engine runs DeepGEMM, an mHC hook reads that chain
(the user directory's, the packaged device file, the architecture file) first
(:func:`faster_table` with ``deepgemm``), and the rows measured without DeepGEMM where it does
not; each row is used only at counts where the engine takes the path it was measured against
(:func:`dsv4spec.integrations.hooks.path_matches`). ``dsv4spec tune`` writes rows measured
against DeepGEMM's GEMM there and the others to the plain file.

An eager row is host time per call, which ours won by its direct launch of the compiled kernels
(:mod:`dsv4spec.kernels.launch`), bound only under the exact Triton releases it was validated
with: rows measured with it decide only where this process's Triton has it too
(:func:`eager_rows_hold`). Under a patch release of the stack (3.8.1) or a local build
(``3.8.0+git...``) every launch goes through Triton's dispatcher, so the graph rows alone decide
and every eager call runs the engine's code (one WARNING per process says so; ``dsv4spec doctor``
shows it beside the Triton release).

A GPU is served only what was measured on it, or measured clearly enough to carry over: its own
file (packaged, or written by ``dsv4spec tune``) decides every hook it holds; another GPU of a
measured architecture (an H100, H20 or GH200 beside the H200's file) reads the architecture
file, which is not a copy of the measured GPU's: ``dsv4spec tune --derive`` writes it from that
file's points, serving ours only where it was at least ``ARCHITECTURE_MARGIN`` (1.25x) faster
there. Such a GPU is told so once per process (one WARNING naming it, the architecture file and
``dsv4spec tune``). And where a GPU's SM count differs from the measured GPU's
(``measured.sm_count``), a planned hook's ranges stop below the first count at which the op's
planner launches another plan for it (the split counts follow the SM count:
:mod:`dsv4spec.integrations.plans`).

Format (``FORMAT`` 1)::

    {"format": 1, "device": "NVIDIA H200", "architecture": "sm_90",
     "measured": {"date": "2026-12-01", "dsv4spec": "0.1.0", "torch": "2.11.0",
                  "triton": "3.6.0", "command": "...", "sources": ["benchmarks/results/..."]},
     "engines": {"sglang": {"mhc_pre": {
         "key": "hidden_size", "between_keys": "exact", "count": "num_tokens", "max_count": 32,
         "graph": {"4096": [[1, 16]], "7168": [[1, 16]]},
         "eager": {"4096": [[1, 64]], "7168": [[1, 64]]}}}}}

Per engine (``sglang``, ``vllm``) and hook: per mode (``graph``: device time inside a CUDA graph;
``eager``: host wall time per back-to-back eager call), the measured keys (a page-table width in
pages, ``qo_len``, a hidden size ``H``) and for each key the inclusive ranges of counts (query
rows, requests, tokens) where ours is served; a measured key where ours never won holds ``[]``.
A key between two measured keys gets the nearer smaller one's ranges where ``between_keys`` is
``nearer_smaller`` (widths, ``qo_len``: a wider table only costs the engine's builder more), and
nothing where it is ``exact`` (``H``, a property of the model); a key below or above every
measured key gets nothing, never an extrapolation. ``dsv4spec tune`` writes the ranges from
the points segment by segment: a segment is a maximal range of counts with no tiling switch of
ours or of the engine's kernel inside (:func:`dsv4spec.integrations.plans.segment_switches`),
and a count is decided only from points of its segment, never beyond the largest measured
count. A measured count is ours where ours won there; one not measured is ours only between
two measured points of its segment that both won by ``CARRY_MARGIN`` (1.10x in a graph, 1.25x
eagerly; an architecture file's margin where larger). A count below its segment's first point or
above its last, and every count of a segment without a point, is the engine's and listed in
``unmeasured`` (optional, written by ``tune``: per mode and key, its inclusive ranges), so that
a count left to the engine has either a measured loss or near-tie beside it or a listed range;
``tune`` measures both sides of every switch, so a full run lists none.
``measured_against`` (optional, written by ``tune``) names the engine path ours was timed
against: ``"tilelang, DeepGEMM off"`` (the mHC kernels of both engines, vLLM's hc_head),
``"triton"`` (SGLang's target hc_head, the metadata builders), ``"torch"`` (SGLang's draft
hc_head, the expand). ``max_count`` (optional) is a cap beyond
which the engine's own code runs whatever was measured (the mHC hooks' 32 tokens, above which
SGLang runs DeepGEMM's GEMM, not the kernel measured); ranges are clipped to it on loading.
``points`` (optional) keeps what ``tune`` measured: per mode and key, ``[count, ours_us,
engine_us]`` rows, which a later run resumes from and an architecture file is derived from.
``measured.sm_count`` (optional) is the measured GPU's SM count. An architecture file
(``device`` null) also names what it was derived from, ``"derived": {"device": "NVIDIA H200",
"file": "NVIDIA_H200.json", "margin": 1.25}``, and must give ``measured.sm_count``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dsv4spec.integrations.hooks import Architecture, Spans
from dsv4spec.kernels import DIRECT_LAUNCH_LAYOUTS, triton_version

logger = logging.getLogger("dsv4spec.integrations")

FORMAT = 1
# An architecture file serves ours where the measured GPU's was at least this much faster
# (engine_us >= ARCHITECTURE_MARGIN * ours_us): a GPU of other SMs, clocks and bandwidth may
# lose a near-tie, not a clear win
ARCHITECTURE_MARGIN = 1.25
# Per mode, how much faster ours must have been at a measured point for a count not measured in
# its segment (no tiling switch of either kernel between them) to take ours, every point of the
# segment won: more than one point's ratio moves between two runs. The H200's two full runs
# (benchmarks/results/tune/NVIDIA_H200.json and NVIDIA_H200_rerun.json, 397 shared points) moved
# it by at most 9.6 % in a graph (95 % of points within 3.2 %) and by up to 66 % eagerly (95 %
# within 26 %, the host's speed modes)
CARRY_MARGIN = {"graph": 1.10, "eager": 1.25}
TABLES_DIR_ENV = "DSV4SPEC_TABLES_DIR"
PACKAGED_DIR = Path(__file__).with_name("tables")
MODES = ("graph", "eager")
BETWEEN_KEYS = ("exact", "nearer_smaller")
ENGINES = ("sglang", "vllm")
_REQUIRED = ("format", "device", "architecture", "measured", "engines")
_HOOK_FIELDS = {"key", "between_keys", "count", "max_count", "graph", "eager", "points",
                "source", "note", "engine_versions", "measured_against", "unmeasured"}


_told_not_a_directory: set[Path] = set()  # the user dirs a WARNING named as not directories


def user_dir() -> Path:
    """Where ``dsv4spec tune`` writes and the plugins look first: ``$DSV4SPEC_TABLES_DIR``, else
    the user's cache directory's ``dsv4spec/tables``; one that exists but is not a directory (a
    mistyped variable) is named once in a WARNING, since no file is ever found in it."""
    env = os.environ.get(TABLES_DIR_ENV)
    if env:
        path = Path(env).expanduser()
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(cache) / "dsv4spec" / "tables"
    if path not in _told_not_a_directory and path.exists() and not path.is_dir():
        _told_not_a_directory.add(path)
        logger.warning("dsv4spec: the tables directory %s is not a directory: no user tables are "
                       "read from it (the packaged ones are) and `dsv4spec tune` cannot write "
                       "there", f"{TABLES_DIR_ENV}={env}" if env else path)
    return path


def stack_of(triton_version: str) -> str:
    """A Triton release's stack, its major.minor: ``"3.8.0+git1"`` -> ``"3.8"``."""
    parts = str(triton_version).split("+")[0].split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"not a Triton version: {triton_version!r}")
    return f"{int(parts[0])}.{int(parts[1])}"


def running_stack() -> str:
    """The stack of the Triton this process compiles our kernels with;
    ``ModuleNotFoundError`` where none is installed (read :func:`assuming` a stack instead)."""
    version = triton_version()
    if version is None:
        raise ModuleNotFoundError("No module named 'triton'", name="triton")
    return stack_of(version)


# Infix of the files holding rows measured against the engines' DeepGEMM path.
DEEPGEMM_INFIX = ".deepgemm"


def device_file_name(device_name: str, stack: str | None = None, deepgemm: bool = False) -> str:
    """``"NVIDIA H200"`` -> ``"NVIDIA_H200.json"`` (the engines' convention for tuned configs);
    with a stack, ``"NVIDIA_H200.triton3.8.json"``; with ``deepgemm`` (rows measured against
    the engines' DeepGEMM path), ``"NVIDIA_H200.deepgemm.triton3.8.json"``."""
    stem = "_".join(device_name.split()).replace("/", "_")
    return (stem + (DEEPGEMM_INFIX if deepgemm else "") + (f".triton{stack}" if stack else "")
            + ".json")


def architecture_name(architecture: Architecture) -> str:
    return f"sm_{architecture[0]}{architecture[1]}"


def candidates(device_name: str | None, architecture: Architecture,
               stack: str | None = None, deepgemm: bool = False) -> list[Path]:
    """The files consulted for a GPU, in order: the user device files, the packaged device
    files, the packaged architecture files; at each place the file named with ``stack`` (default
    the running one) first, then the one named without a stack. With ``deepgemm``, the files of
    rows measured against the engines' DeepGEMM path (always named with their stack), the user
    directory's plain device files after its own (an earlier ``tune`` wrote such rows there;
    :func:`hook_entry` takes only those rows of them)."""
    stack = stack or running_stack()
    arch = architecture_name(architecture)
    if deepgemm:
        found = []
        if device_name:
            found = [user_dir() / device_file_name(device_name, stack, deepgemm=True),
                     user_dir() / device_file_name(device_name, stack),
                     user_dir() / device_file_name(device_name),
                     PACKAGED_DIR / device_file_name(device_name, stack, deepgemm=True)]
        return found + [PACKAGED_DIR / f"{arch}{DEEPGEMM_INFIX}.triton{stack}.json"]
    found = []
    if device_name:
        for where in (user_dir(), PACKAGED_DIR):
            found += [where / device_file_name(device_name, stack),
                      where / device_file_name(device_name)]
    return found + [PACKAGED_DIR / f"{arch}.triton{stack}.json", PACKAGED_DIR / f"{arch}.json"]


# ---------------------------------------------------------------------------------------------
# Validation: a file is taken whole or not at all


def _int(value: Any, what: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what}: expected an integer >= {low}, got {value!r}")
    return value


def _spans(value: Any, what: str) -> Spans:
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected a list of [lo, hi] ranges, got {value!r}")
    spans = []
    for i, span in enumerate(value):
        if not (isinstance(span, list) and len(span) == 2):
            raise ValueError(f"{what}[{i}]: expected [lo, hi], got {span!r}")
        lo, hi = _int(span[0], f"{what}[{i}][0]"), _int(span[1], f"{what}[{i}][1]")
        if hi < lo or (spans and lo <= spans[-1][1]):
            raise ValueError(f"{what}[{i}]: ranges must be ordered, disjoint, lo <= hi")
        spans.append((lo, hi))
    return tuple(spans)


def validate_hook(entry: Any, what: str) -> dict[str, Any]:
    """One hook's entry, checked; returns it with integer keys and tuple ranges."""
    if not isinstance(entry, dict):
        raise ValueError(f"{what}: expected an object")
    unknown = set(entry) - _HOOK_FIELDS
    if unknown:
        raise ValueError(f"{what}: unknown fields {sorted(unknown)}")
    for field in ("key", "count"):
        if not isinstance(entry.get(field), str):
            raise ValueError(f"{what}.{field}: expected a name")
    if entry.get("between_keys") not in BETWEEN_KEYS:
        raise ValueError(f"{what}.between_keys: expected one of {BETWEEN_KEYS}")
    cap = entry.get("max_count")
    out = {"key": entry["key"], "count": entry["count"], "between_keys": entry["between_keys"],
           "max_count": None if cap is None else _int(cap, f"{what}.max_count")}
    for mode in MODES:
        keyed = entry.get(mode)
        if not isinstance(keyed, dict):
            raise ValueError(f"{what}.{mode}: expected an object of key -> ranges")
        parsed = {}
        for key, spans in keyed.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise ValueError(f"{what}.{mode}: key {key!r} is not a positive integer")
            parsed[_int(int(key), f"{what}.{mode} key")] = _spans(spans, f"{what}.{mode}.{key}")
        out[mode] = dict(sorted(parsed.items()))
    if "points" in entry:
        out["points"] = entry["points"]
    # which of the engine's paths ours was timed against ("tilelang, DeepGEMM off")
    against = entry.get("measured_against")
    if against is not None:
        out["measured_against"] = against
        out["deepgemm_above"] = deepgemm_above(against, f"{what}.measured_against")
    if "unmeasured" in entry:
        gaps = entry["unmeasured"]
        if not isinstance(gaps, dict) or set(gaps) - set(MODES):
            raise ValueError(f"{what}.unmeasured: expected an object of mode -> key -> ranges")
        out["unmeasured"] = {}
        for mode, keyed in gaps.items():
            if not isinstance(keyed, dict) or not all(
                    isinstance(k, str) and k.isdigit() for k in keyed):
                raise ValueError(f"{what}.unmeasured.{mode}: expected an object of key -> "
                                 "ranges")
            out["unmeasured"][mode] = {int(k): _spans(v, f"{what}.unmeasured.{mode}.{k}")
                                       for k, v in keyed.items()}
    # the engine releases the rows hold for: measured on, or sharing the measured kernels
    versions = entry.get("engine_versions")
    if versions is not None:
        if not (isinstance(versions, list) and versions
                and all(isinstance(v, str) and v for v in versions)):
            raise ValueError(f"{what}.engine_versions: expected a list of version strings")
        out["engine_versions"] = tuple(versions)
    return out


# The engine paths a row can be measured against (``measured_against``): the engines' mHC kernels
# with their pre-norm GEMM in TileLang (DeepGEMM off, or on where the op runs no DeepGEMM GEMM at
# the counts measured), DeepGEMM's GEMM at every count, or the fused boundary's TileLang kernel up
# to N tokens and DeepGEMM's GEMM above; SGLang's Triton and torch kernels.
TILELANG_DEEPGEMM_OFF, TILELANG_DEEPGEMM_ON = "tilelang, DeepGEMM off", "tilelang, DeepGEMM on"
_NO_DEEPGEMM_PATHS = (TILELANG_DEEPGEMM_OFF, TILELANG_DEEPGEMM_ON, "triton", "torch")
DEEPGEMM_PATH = "deepgemm"
_SPLIT_PATH = re.compile(r"tilelang to ([1-9][0-9]*) tokens, deepgemm above")


def split_path(above: int) -> str:
    """The label of rows measured against the engine's TileLang kernels up to ``above`` tokens
    and DeepGEMM's GEMM above (the fused boundary with DeepGEMM on)."""
    return f"tilelang to {above} tokens, deepgemm above"


def deepgemm_above(measured_against: Any, what: str = "measured_against") -> int | None:
    """The count above which rows ``measured_against`` were timed against the engine's DeepGEMM
    GEMM: 0 (every count), N (``"tilelang to N tokens, deepgemm above"``), or None (none: the
    engine's own kernels alone). Raises ``ValueError`` naming ``what`` for another label."""
    if measured_against == DEEPGEMM_PATH:
        return 0
    if measured_against in _NO_DEEPGEMM_PATHS:
        return None
    match = _SPLIT_PATH.fullmatch(measured_against) if isinstance(measured_against, str) else None
    if match is None:
        raise ValueError(f"{what}: expected the engine path measured (one of "
                         f"{', '.join(map(repr, (*_NO_DEEPGEMM_PATHS, DEEPGEMM_PATH)))} or "
                         f"'tilelang to N tokens, deepgemm above'), got {measured_against!r}")
    return int(match.group(1))


def validate(data: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """A whole file's content, checked (raises ``ValueError`` naming the first fault); returns
    ``{engine: {hook: entry}}``."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing fields {missing}")
    if data["format"] != FORMAT:
        raise ValueError(f"format {data['format']!r}, this dsv4spec reads format {FORMAT}")
    if not isinstance(data["measured"], dict) or not isinstance(data["engines"], dict):
        raise ValueError("measured and engines must be objects")
    file_stack(data)
    sm_count = data["measured"].get("sm_count")
    if sm_count is not None:
        _int(sm_count, "measured.sm_count")
    if data["device"] is None:
        derived = data.get("derived")
        if not (isinstance(derived, dict) and isinstance(derived.get("device"), str)
                and isinstance(derived.get("file"), str)
                and isinstance(derived.get("margin"), (int, float))
                and not isinstance(derived.get("margin"), bool) and derived["margin"] >= 1):
            raise ValueError("derived: an architecture file (device null) names the device, the "
                             "file and the margin (>= 1) it was derived with")
        _int(sm_count, "measured.sm_count (an architecture file's)")
    elif not isinstance(data["device"], str):
        raise ValueError(f"device: expected a device name or null, got {data['device']!r}")
    engines = {}
    for engine, hooks in data["engines"].items():
        if engine not in ENGINES or not isinstance(hooks, dict):
            raise ValueError(f"engines.{engine}: expected one of {ENGINES} holding an object")
        engines[engine] = {hook: validate_hook(entry, f"engines.{engine}.{hook}")
                           for hook, entry in hooks.items()}
    return engines


def dumps(data: Any, indent: int = 0) -> str:
    """JSON of a tables file with every list of numbers (a range, a point) and every list of
    those on one line."""
    pad, inner = " " * indent, " " * (indent + 1)

    def flat(v: Any) -> bool:
        return isinstance(v, list) and all(
            isinstance(x, (int, float)) or (isinstance(x, list) and flat(x)) for x in v)

    if isinstance(data, dict) and data:
        items = [f"{inner}{json.dumps(str(k))}: {dumps(v, indent + 1)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(data, list) and data and not flat(data):
        return "[\n" + ",\n".join(inner + dumps(v, indent + 1) for v in data) + f"\n{pad}]"
    return json.dumps(data)


def file_stack(data: Any) -> str:
    """The stack a tables file was measured under (its ``measured.triton``); ``ValueError``
    where it names none."""
    measured = data.get("measured") if isinstance(data, dict) else None
    if not isinstance(measured, dict) or not isinstance(measured.get("triton"), str):
        raise ValueError("measured.triton: expected the Triton version the file was measured "
                         "under")
    return stack_of(measured["triton"])


def read_file(path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``path``'s tables, validated; raises ``OSError`` or ``ValueError``."""
    return read_file_with_stack(path)[1]


def read_file_with_stack(path: Path) -> tuple[str, dict[str, dict[str, dict[str, Any]]]]:
    """``path``'s stack and tables, validated; raises ``OSError`` or ``ValueError``."""
    source = read_source(path)
    return source.stack, source.engines


class Source(NamedTuple):
    """One readable tables file: its stack and tables, the SM count it was measured on (None:
    not recorded), and, for an architecture file, its ``derived`` object."""

    path: Path
    stack: str
    engines: dict[str, dict[str, dict[str, Any]]]
    sm_count: int | None
    derived: dict[str, Any] | None
    triton: str | None = None  # the release measured under (``measured.triton``)


def read_source(path: Path) -> Source:
    """``path`` read and validated; raises ``OSError`` or ``ValueError``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    engines = validate(data)
    return Source(path, file_stack(data), engines, data["measured"].get("sm_count"),
                  data.get("derived") if data["device"] is None else None,
                  data["measured"]["triton"])


# ---------------------------------------------------------------------------------------------
# Lookup


def spans_for(keyed: Mapping[int, Spans], key: int, between_keys: str) -> Spans:
    """The ranges for ``key``: its own where measured; between two measured keys the nearer
    smaller one's (``nearer_smaller``) or none (``exact``); none outside the measured keys."""
    if key in keyed:
        return keyed[key]
    if between_keys != "nearer_smaller" or not keyed or not min(keyed) < key < max(keyed):
        return ()
    return keyed[max(k for k in keyed if k < key)]


def served(entry: Mapping[str, Any], key: int, count: int, in_graph: bool) -> bool:
    """Whether a validated hook entry serves ours at ``key`` and ``count`` in that mode."""
    cap = entry.get("max_count")
    if cap is not None and count > cap:
        return False
    spans = spans_for(entry["graph" if in_graph else "eager"], key, entry["between_keys"])
    return any(lo <= count <= hi for lo, hi in spans)


class KeyedSpans(dict):
    """One mode of a loaded table, ``{key: ranges}``, whose ``get`` applies the file's rule for
    a key between measured keys (what :func:`~dsv4spec.integrations.hooks.measured_faster`
    reads)."""

    def __init__(self, keyed: Mapping[int, Spans], between_keys: str) -> None:
        super().__init__(keyed)
        self.between_keys = between_keys

    def get(self, key: Any, default: Any = ()) -> Any:
        if key in self:
            return self[key]
        return spans_for(dict(self), key, self.between_keys) or default


def _clipped(keyed: Mapping[int, Spans], cap: int | None) -> dict[int, Spans]:
    if cap is None:
        return dict(keyed)
    return {k: tuple((lo, min(hi, cap)) for lo, hi in spans if lo <= cap)
            for k, spans in keyed.items()}


def _device_index(architecture: Architecture) -> int | None:
    """A visible CUDA device of that architecture (the current device first), or None."""
    if not torch.cuda.is_available():
        return None
    current = torch.cuda.current_device()
    for index in [current, *range(torch.cuda.device_count())]:
        if tuple(torch.cuda.get_device_capability(index)) == tuple(architecture):
            return index
    return None


def _device_name(architecture: Architecture) -> str | None:
    """The name of a visible CUDA device of that architecture (the current device first), or
    None (no CUDA: the interpreter, whose tables are the architecture file); the assumed GPU's
    name inside :func:`assuming`."""
    if _assumed is not None:
        return _assumed[0]
    index = _device_index(architecture)
    return None if index is None else torch.cuda.get_device_name(index)


def _device_sm_count(architecture: Architecture) -> int | None:
    """The SM count of the device :func:`_device_name` names, or None (no CUDA; an assumed GPU,
    whose count is taken to be the one its file was measured with)."""
    if _assumed is not None:
        return None
    index = _device_index(architecture)
    return None if index is None else torch.cuda.get_device_properties(index).multi_processor_count


_chains: dict[tuple[str | None, Architecture, str], list[Source] | None] = {}
_told_derived: set[str] = set()  # the GPUs told they read an architecture file
_told_no_direct_launch: set[str] = set()  # the Triton versions told their eager rows are not read
# (device name, stack) answered for in place of the visible GPU and the running Triton, inside
# assuming(); None outside.
_assumed: tuple[str | None, str | None] | None = None
# Every FileTable made (weakly), so that assuming() can make each read its files again.
_file_tables: list[weakref.ref] = []


def clear_cache() -> None:
    """Forget the files read and the GPUs told (tests; a process reads each once)."""
    _chains.clear()
    _told_derived.clear()
    _told_no_direct_launch.clear()


def _chain(device_name: str | None, architecture: Architecture,
           stack: str | None = None, deepgemm: bool = False) -> list[Source]:
    """The readable files of the running stack for this GPU, in order; empty (after one WARNING)
    where a file of the chain is malformed, or none of this stack exists. With ``deepgemm``, the
    chain of rows measured against the engines' DeepGEMM path (empty without a word where none
    exists: the plain chain decides then)."""
    stack = stack or _stack()
    cache_key = (device_name, tuple(architecture), stack, deepgemm)
    if cache_key in _chains:
        return _chains[cache_key] or []
    chain, others = [], {}
    for path in candidates(device_name, architecture, stack, deepgemm):
        if not path.is_file() or any(path == source.path for source in chain):
            continue
        try:
            source = read_source(path)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            logger.warning("dsv4spec: the measured-faster tables in %s are not readable (%s); "
                           "%s on %s", path, e,
                           "none of the rows measured against DeepGEMM's path is used"
                           if deepgemm else "the engine's own code runs for every table-gated "
                           "hook", device_name or architecture_name(architecture))
            chain = []
            break
        if source.stack == stack:
            chain.append(source)
        else:
            others[path] = source.stack
    else:
        if not chain and device_name is not None and not deepgemm:  # a visible GPU
            measured = "; ".join(f"{p} under Triton {s}" for p, s in others.items())
            logger.warning(
                "dsv4spec: no measured-faster tables for %s (%s) under Triton %s (this process's "
                "Triton %s) in %s or the package%s; the engine's own code runs for every "
                "table-gated hook. `dsv4spec tune` measures this GPU under this Triton and "
                "writes its table", device_name, architecture_name(architecture), stack,
                triton_version() or "none", user_dir(),
                f" (measured: {measured})" if measured else "")
    _chains[cache_key] = chain
    return chain


def _stack() -> str:
    """The stack the tables are read for: the assumed one inside :func:`assuming`, else the
    running Triton's."""
    if _assumed is not None and _assumed[1] is not None:
        return _assumed[1]
    return running_stack()


@contextlib.contextmanager
def assuming(device_name: str | None, stack: str | None = None) -> Iterator[None]:
    """Within the block, every table lookup answers for a GPU named ``device_name`` (whatever
    architecture is asked; None: the architecture files alone) under Triton ``stack`` (None: the
    running one), not for the visible GPU: what ``dsv4spec doctor --device-name`` reports. Every
    table forgets what it read on entry and on exit (entries set by hand too)."""
    global _assumed
    if stack is not None:
        stack = stack_of(stack)
    previous = _assumed
    _assumed = (device_name, stack)
    _forget_read()
    try:
        yield
    finally:
        _assumed = previous
        _forget_read()


def _forget_read() -> None:
    clear_cache()
    _file_tables[:] = [ref for ref in _file_tables if ref() is not None]
    for ref in _file_tables:
        table = ref()
        if table is not None:
            table.reload()


def chain_files(architecture: Architecture | None, device_name: str | None = None,
                deepgemm: bool = False) -> list[Path]:
    """The files of the running stack that serve this GPU, in the order they are consulted
    (empty where none does, or one of the chain is malformed): the tables
    :func:`stack_validated` and :func:`hook_entry` read (``deepgemm``: those of rows measured
    against the engines' DeepGEMM path)."""
    if architecture is None:
        return []
    name = device_name if device_name is not None else _device_name(architecture)
    return [source.path for source in _chain(name, architecture, deepgemm=deepgemm)]


def stack_validated(architecture: Architecture | None, device_name: str | None = None) -> bool:
    """Whether any table of the running Triton's stack serves this GPU: the rule for hooks with
    no table of their own (the rollback, the draft hc_head), whose kernels were validated with
    the rest. False (after the chain's one WARNING) where none does."""
    if architecture is None:
        return False
    name = device_name if device_name is not None else _device_name(architecture)
    return bool(_chain(name, architecture))


def hook_entry(engine: str, hook: str, architecture: Architecture,
               device_name: str | None = None, sm_count: int | None = None,
               deepgemm: bool = False) -> tuple[Path | None, dict | None]:
    """The file and validated entry deciding ``engine``'s ``hook`` on a GPU of ``architecture``
    (named ``device_name``, of ``sm_count`` SMs; default: the visible CUDA device of that
    architecture) under the running Triton's stack; its ranges stop below the first count whose
    plan differs on this GPU where its SM count is not the measured one's. ``deepgemm``: from
    the files of rows measured against the engines' DeepGEMM path."""
    name = device_name if device_name is not None else _device_name(architecture)
    sms = sm_count if sm_count is not None else _device_sm_count(architecture)
    for source in _chain(name, architecture, deepgemm=deepgemm):
        entry = source.engines.get(engine, {}).get(hook)
        if entry is None or (deepgemm and DEEPGEMM_INFIX not in source.path.name
                             and entry.get("deepgemm_above") is None):
            continue
        differs = sms is not None and source.sm_count is not None and sms != source.sm_count
        if source.derived is not None and name is not None and name not in _told_derived:
            _told_derived.add(name)
            logger.warning(
                "dsv4spec: no measured-faster table for %s under Triton %s; its table-gated "
                "hooks read %s, derived from the %s's (%s): ours only where it was at least "
                "%.2fx faster there%s. `dsv4spec tune` measures this GPU and writes its own "
                "table", name, source.stack, source.path, source.derived["device"],
                source.derived["file"], source.derived["margin"],
                f", and below the first count whose launch plan differs on this GPU's {sms} "
                f"SMs (measured on {source.sm_count})" if differs else "")
        if differs:
            entry = _same_plan_only(engine, hook, entry, source.sm_count, sms, source.stack)
        if not eager_rows_hold(source.triton):
            entry = _graph_rows_only(entry, source)
        return source.path, entry
    return None, None


def eager_rows_hold(measured_triton: str | None) -> bool:
    """Whether a file's eager rows, measured under Triton ``measured_triton``, decide in this
    process. An eager row is host time per call, and ours won those by the direct launch
    (:func:`~dsv4spec.kernels.launch.direct_launch_supported`; without it the mHC boundary at
    T = 1, H = 7168 took 103.6 us a call on the H200's host, 35.3 us with it:
    ``benchmarks/results/triton38/stack_triton3.6_vs_3.8.md``): rows measured with it (under a
    release of ``DIRECT_LAUNCH_LAYOUTS``) hold only where this process's Triton has it too. On a
    patch release of the stack or a local build every launch goes through Triton's dispatcher,
    so the engine's code serves every eager call and the graph rows alone decide (ours is still
    compiled before the engine's capture). Rows measured without the direct launch (``dsv4spec
    tune`` under such a release) timed that path and hold. Inside :func:`assuming` another stack
    than the running one, the release that stack's file was measured under is assumed."""
    if measured_triton not in DIRECT_LAUNCH_LAYOUTS:
        return True
    running = triton_version()
    if _assumed is not None and _assumed[1] is not None and (
            running is None or _assumed[1] != running_stack()):
        return True
    return running in DIRECT_LAUNCH_LAYOUTS


def _graph_rows_only(entry: dict, source: Source) -> dict:
    """``entry`` with no eager range (one WARNING per process where any is dropped)."""
    running = triton_version()
    if any(entry["eager"].values()) and running not in _told_no_direct_launch:
        _told_no_direct_launch.add(running)
        logger.warning(
            "dsv4spec: Triton %s is not a release dsv4spec's direct launch binds (%s): every "
            "eager launch of its kernels goes through Triton's dispatcher, so the eager rows of "
            "%s (measured with the direct launch under Triton %s) do not hold and every eager "
            "call runs the engine's own code; CUDA graphs follow the graph rows",
            running, ", ".join(DIRECT_LAUNCH_LAYOUTS), source.path, source.triton)
    return {**entry, "eager": {key: () for key in entry["eager"]}}


def _same_plan_only(engine: str, hook: str, entry: dict, measured_sms: int, sms: int,
                    stack: str) -> dict:
    """``entry`` with each key's ranges cut below the first count at which the hook's op
    launches another plan on ``sms`` SMs than on the ``measured_sms`` it was measured on."""
    from dsv4spec.integrations import plans  # the ops' planners: only for such a GPU

    out = dict(entry)
    for mode in MODES:
        cut = {}
        for key, spans in entry[mode].items():
            first = spans and plans.first_plan_difference(
                engine, hook, key, max(hi for _, hi in spans), measured_sms, sms, stack)
            cut[key] = tuple((lo, min(hi, first - 1)) for lo, hi in spans
                             if lo < first) if first else spans
        out[mode] = cut
    return out


class FileTable(dict):
    """A ``FasterTable`` (architecture -> mode -> key -> ranges) read from the files on first
    use of each architecture: what the plugins' ``*_FASTER`` constants are. Entries set by hand
    (tests) win; ``sources`` says which file decided each architecture. ``deepgemm``: the rows
    measured against the engines' DeepGEMM path (the ``.deepgemm`` files)."""

    def __init__(self, engine: str, hook: str, deepgemm: bool = False) -> None:
        super().__init__()
        self.engine, self.hook, self.deepgemm = engine, hook, deepgemm
        self.sources: dict[Architecture, Path | None] = {}
        # per architecture read: the count above which its rows were measured against the
        # engine's DeepGEMM GEMM (deepgemm_above; None: against its own kernels alone)
        self.deepgemm_above: dict[Architecture, int | None] = {}

    def _load(self, architecture: Any) -> dict[str, KeyedSpans] | None:
        if not (isinstance(architecture, tuple) and len(architecture) == 2):
            return None
        path, entry = hook_entry(self.engine, self.hook, architecture, deepgemm=self.deepgemm)
        self.sources[architecture] = path
        if entry is None:
            return None
        # a plain dict where keys match exactly: measured_faster's own .get is the rule
        keyed = KeyedSpans if entry["between_keys"] == "nearer_smaller" else (
            lambda spans, rule: dict(spans))
        modes = {mode: keyed(_clipped(entry[mode], entry["max_count"]), entry["between_keys"])
                 for mode in MODES}
        self.deepgemm_above[architecture] = entry.get("deepgemm_above")
        dict.__setitem__(self, architecture, modes)
        return modes

    def get(self, architecture: Any, default: Any = None) -> Any:
        if dict.__contains__(self, architecture):
            return dict.__getitem__(self, architecture)
        if architecture in self.sources:  # looked up before: no file holds it
            return default
        modes = self._load(architecture)
        return default if modes is None else modes

    def __missing__(self, architecture: Any) -> Any:
        modes = self.get(architecture)
        if modes is None:
            raise KeyError(architecture)
        return modes

    def __contains__(self, architecture: object) -> bool:
        return self.get(architecture) is not None

    def reload(self) -> None:
        """Drop what was read (after a new file was written, or :func:`clear_cache`)."""
        dict.clear(self)
        self.sources.clear()
        self.deepgemm_above.clear()


def faster_table(engine: str, hook: str, deepgemm: bool = False) -> FileTable:
    """``engine``'s measured-faster table for ``hook``, read from the files on first use;
    ``deepgemm``: from the files of rows measured against the engines' DeepGEMM path."""
    table = FileTable(engine, hook, deepgemm)
    _file_tables.append(weakref.ref(table))
    return table
