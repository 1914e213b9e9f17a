"""``dsv4spec tune``: measure where each table-gated hook's op beats the engine's own on this GPU
(SGLang's; vLLM's with ``--engine vllm``) and write the GPU's measured-faster tables, the file the
plugins prefer over the packaged ones.

Method: for every hook and grid point, the benchmarks' own inputs and providers (``bench mhc``,
``bench hc-head``, ``bench metadata``: SGLang's kernels from its own files beside dsv4spec's ops),
both outputs checked against each other or the reference before anything is timed (vLLM's
hooks: ``bench vllm``'s measurement, the hook with ours forced beside vLLM's TileLang function);
device time per call replayed from a CUDA graph, and host wall time per back-to-back eager call,
both providers side by side. Ours is served at a point in a mode where it was faster there (for the
metadata builders: at every shape measured for that row count, decode and verify, a short and a
half-full context). Counts are measured on a coarse grid, then bisected wherever the winner
changes between neighbours, so the table is dense only where it needs to be; the full grid holds
both sides of every tiling switch of the hook's op and of the engine's kernel (a count where a
tiling changes: :mod:`dsv4spec.integrations.plans`). A count is decided from the points of its
segment (the counts between two switches), never beyond the largest measured one; segments
without a point are listed as ``unmeasured``, and keys between measured keys follow the file's
rule (:mod:`dsv4spec.integrations.tables`). ``--plan`` prints the points, the time estimate and
the runs that split the grid within a lent GPU's per-command limit.

``--derive`` (no GPU) re-derives device files' ranges from their points by that rule and writes
beside each the architecture file that other GPUs of its architecture read: ours only where it
was at least ``tables.ARCHITECTURE_MARGIN`` faster on the measured GPU (the packaged
``sm_90*.json`` are ``dsv4spec tune --derive src/dsv4spec/integrations/tables/NVIDIA_H200*.json``).

Writes ``<device>.triton<M.m>.json`` (the running Triton's stack: the plugins read a table only
under the Triton it was measured with), and, where the engine's DeepGEMM ran, the rows of the ops
that ran its GEMM to ``<device>.deepgemm.triton<M.m>.json`` (read where the engine runs DeepGEMM)
into ``--out-dir`` (default ``$DSV4SPEC_TABLES_DIR`` or
the user cache directory). Every point is saved as it is measured (``<file>.partial``): an
interrupted run resumes there with its points kept. A file that already holds a hook being tuned
is not replaced without ``--force`` (its other hooks are always kept). Needs a CUDA GPU and SGLang's
source (an installed ``sglang`` or ``DSV4SPEC_SGLANG_ROOT``; the mHC hooks' peers also need
TileLang).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import torch
import triton

from dsv4spec import __version__
from dsv4spec.bench import deepgemm
from dsv4spec.integrations import plans, tables
from dsv4spec.integrations.hooks import Spans
from dsv4spec.integrations.sglang import metadata as metadata_hooks
from dsv4spec.usage import UsageError

ENGINES = ("sglang", "vllm")
ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}
EXIT_USAGE = 2
PAGE_TABLE, COMPRESSED = metadata_hooks.PAGE_TABLE, metadata_hooks.COMPRESSED
EXPAND, COMPRESSION = metadata_hooks.EXPAND, metadata_hooks.COMPRESSION


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(lo.bit_length() - 1, hi.bit_length()))


_CAP_NOTE = ("max_count 32: above it SGLang's mhc_pre and mhc_fused_post_pre run DeepGEMM's "
             "tf32 GEMM where installed, which tune does not measure")
_METADATA_NOTE = ("eager stays the engine's: eager builds include extend and prefill, whose "
                  "sparse-prefill readers the unwritten-tail argument of "
                  "dsv4spec.ops.attention_metadata does not cover")
# SGLang's largest decode CUDA-graph batch (arg_groups/memory_hook.py: 512 on an H200 or B200 at
# tp >= 4); the verify graph holds bs * qo_len rows (qo_len 4 in bench metadata's verify shape).
MAX_BS = 512
MAX_ROWS = MAX_BS * 4
WIDTHS = _pow2(64, 8192)  # 16K to 2M tokens at 256-token pages; 1M at 64/128/256: 16K/8K/4K
HIDDEN = (4096, 7168)  # DSV4-Flash, DSV4-Pro


@dataclass(frozen=True)
class Grid:
    """What ``tune`` measures for one hook: its table's key and count, the coarse points (full
    and ``--quick``), the modes it may serve ours in, a cap, seconds per point (estimate), and
    the engine's kernel it is measured against (the table's ``measured_against``)."""

    hook: str
    group: str
    key: str
    count: str
    between_keys: str
    keys: tuple[int, ...]
    counts: tuple[int, ...]
    quick_keys: tuple[int, ...]
    quick_counts: tuple[int, ...]
    modes: tuple[str, ...] = tables.MODES
    max_count: int | None = None
    note: str | None = None
    seconds: float = 0.5
    quick_seconds: float = 0.3
    # counts above ``whole_above`` must be multiples of ``whole_of`` (the metadata builders'
    # verify shape holds bs * 4 rows; above the largest decode batch only verify reaches them)
    whole_above: int | None = None
    whole_of: int = 1
    engine: str = "sglang"  # whose hook: the planner switches are its op's
    measured_against: str = tables.TILELANG_DEEPGEMM_OFF
    # measured beside the engine's DeepGEMM GEMM above this many tokens (None: DeepGEMM off or
    # no pre-norm GEMM): DeepGEMM's split changes are switches too
    deepgemm_above: int | None = None

    def measurable(self, count: int) -> int:
        """``count``, rounded down to a count this hook's shapes can hold."""
        if self.whole_above is not None and count > self.whole_above:
            return max(count - count % self.whole_of, self.whole_above)
        return count

    def points(self, quick: bool, num_sms: int | None = None) -> list[tuple[int, int]]:
        """The coarse (key, count) points; the full grid adds, per key, both sides of every
        tiling switch of the hook's op (on ``num_sms`` SMs) and of the engine's kernel up to the
        largest count: each segment between two switches holds a measured point at either
        end."""
        keys, counts = (self.quick_keys, self.quick_counts) if quick else (self.keys,
                                                                             self.counts)
        top = min(max(counts), self.max_count or max(counts))
        out = []
        for k in keys:
            sides = () if quick else {c for s in plans.segment_switches(
                self.engine, self.hook, k, top, num_sms, deepgemm_above=self.deepgemm_above)
                for c in (s - 1, s)}
            out += [(k, c) for c in sorted({*counts, *sides})
                    if self.max_count is None or c <= self.max_count]
        return out


def _mhc(hook: str, counts: tuple[int, ...], cap: int | None, seconds: float) -> Grid:
    return Grid(hook, "mhc", "hidden_size", "num_tokens", "exact", HIDDEN, counts, (7168,),
                (1, 16), max_count=cap, note=_CAP_NOTE if cap else None, seconds=seconds)


def _metadata(hook: str) -> Grid:
    return Grid(hook, "metadata", "page_table_width", "query_rows", "nearer_smaller", WIDTHS,
                (1, 4, 16, 64, 256, 1024, MAX_ROWS), (4096,), (4, 64), modes=("graph",),
                note=_METADATA_NOTE, seconds=0.35, quick_seconds=0.2, whole_above=MAX_BS,
                whole_of=MAX_ROWS // MAX_BS, measured_against="triton")


# Seconds per point (its checks, compiles and both modes' timing): the slower of the H200's full
# runs under Triton 3.6 (benchmarks/results/logs/tune_rerun.log) and 3.8
# (benchmarks/results/tune/sglang_mhc_triton3.8/, 77 points in 227 s;
# benchmarks/results/logs/tune_vllm.log), from the seconds each hook's points took there.
GRIDS: dict[str, Grid] = {g.hook: g for g in (
    _mhc("mhc_pre", (1, 2, 4, 8, 16, 32), 32, seconds=2.5),
    _mhc("mhc_post", (1, 4, 16, 64, 256, 1024, 4096, 16384), None, seconds=1.0),
    _mhc("mhc_fused_post_pre", (1, 2, 4, 8, 16, 32), 32, seconds=5.6),
    Grid("target_hc_head", "hc_head", "hidden_size", "num_tokens", "exact", HIDDEN,
         (1, 4, 16, 64, 256, 1024, 4096, 16384), (7168,), (1, 64), seconds=0.8,
         measured_against="triton"),
    # DSpark's draft hc_head (SGLang's hc_head_torch) over bs * N rows, N = 7, bs 1-64
    Grid("dspark_hc_head", "hc_head_torch", "hidden_size", "num_tokens", "exact", HIDDEN,
         tuple(7 * bs for bs in (1, 2, 4, 8, 16, 32, 64)), (7168,), (7, 56), seconds=0.8,
         measured_against="torch"),
    _metadata(PAGE_TABLE),
    _metadata(COMPRESSED),
    _metadata(COMPRESSION),
    Grid(EXPAND, "expand", "qo_len", "requests", "nearer_smaller", tuple(range(2, 9)),
         (1, 4, 16, 64, 256, MAX_BS), (4,), (1, 32), measured_against="torch"),
)}
# vLLM 0.33.0's hooks (dsv4spec.integrations.vllm), beside vLLM's TileLang kernels with DeepGEMM
# off, as `dsv4spec bench vllm` measures them; where vLLM runs DeepGEMM its own op runs whatever
# the table says (dsv4spec.integrations.vllm.tables.DEEP_GEMM_FROM_TOKENS).
VLLM_GRIDS: dict[str, Grid] = {hook: Grid(
    hook, "vllm", "hidden_size", "num_tokens", "exact", HIDDEN,
    (1, 4, 16, 64, 256, 1024, 4096), (7168,), (1, 16), seconds=seconds, quick_seconds=2.0,
    engine="vllm")
    for hook, seconds in (("hc_head", 1.0), ("mhc_pre", 4.0), ("mhc_post", 1.0),
                          ("mhc_fused_post_pre", 4.0))}
ENGINE_GRIDS = {"sglang": GRIDS, "vllm": VLLM_GRIDS}
# With the engines' DeepGEMM on, the mHC hooks with a pre-norm GEMM are timed against the path the
# engine runs (DeepGEMM's GEMM from the count deepgemm.gemm_path says) up to 512 tokens, where MTP
# and DSpark verify batches reach (SGLang's past their 32-token cap; vLLM's no further: from 33
# tokens DeepGEMM's path beat ours 1.3-2.2x on an H100, 2026-12-07), with both sides of every
# change of DeepGEMM's split count (plans.deepgemm_switches).
DEEPGEMM_COUNTS = (1, 2, 4, 8, 16, 32, 33, 64, 128, 256, 512)


def grids_for(engine: str, deep_gemm: bool) -> dict[str, Grid]:
    """``engine``'s grids; with DeepGEMM on (``deep_gemm``), its hooks with a pre-norm GEMM
    measured over :data:`DEEPGEMM_COUNTS` beside DeepGEMM's path."""
    grids = ENGINE_GRIDS[engine]
    if not deep_gemm:
        return grids
    out = dict(grids)
    for hook, g in grids.items():
        above = deepgemm.deepgemm_above(hook)
        if above is not None:
            out[hook] = replace(g, counts=DEEPGEMM_COUNTS, max_count=max(DEEPGEMM_COUNTS),
                                note=None, deepgemm_above=above)
    return out
MAX_REFINE = 3  # bisections between two neighbours whose winners differ
# per key; the estimate is the H200's, from the full runs of 2026-12-01 (2.5 min of measuring
# after 20 s of loading: benchmarks/results/logs/tune_rerun.log)
COMPILE_SECONDS = {"mhc": 3.0, "hc_head": 1.0, "hc_head_torch": 1.0, "metadata": 1.0,
                   "expand": 0.5, "vllm": 3.0}
START_SECONDS = 20.0
# what --plan cuts the run into: the 10 minutes a lent GPU's command may take, less a fifth for
# the estimate's error
CALL_SECONDS = 480.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES, default="sglang",
                        help="whose plugin's hooks to tune, each beside that engine's own "
                             "kernels (default: sglang)")
    parser.add_argument("--hooks", nargs="+", default=None,
                        choices=sorted({*GRIDS, *VLLM_GRIDS}),
                        help="hooks to tune (default: all of the engine's)")
    parser.add_argument("--quick", action="store_true",
                        help="a few points per hook and short timing (a smoke run: its file "
                             "covers little, so it is best written to a --out-dir of its own)")
    parser.add_argument("--force", action="store_true",
                        help="replace the hooks being tuned in an existing file")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where the file goes (default: $DSV4SPEC_TABLES_DIR, else "
                             "~/.cache/dsv4spec/tables)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), default=None,
                        help="print where two tables files' measured points disagree on the "
                             "winner (near-ties within 3%% marked), then exit (no GPU needed)")
    parser.add_argument("--report", type=Path, metavar="FILE", default=None,
                        help="print a tables file as markdown (what each hook serves, its share "
                             "of the measured points, every point), then exit (no GPU needed)")
    parser.add_argument("--derive", nargs="+", type=Path, metavar="FILE", default=None,
                        help="re-derive each device tables file's ranges from its points in "
                             "place and write beside it the architecture file (sm_XX) that GPUs "
                             "without a file of their own read: ours only where it was at least "
                             f"{tables.ARCHITECTURE_MARGIN}x faster; then exit (no GPU needed)")
    parser.add_argument("--plan", action="store_true",
                        help="print what would be measured and the time estimate, then exit "
                             "(no GPU needed)")
    deepgemm.add_argument(parser)


# ---------------------------------------------------------------------------------------------
# The grid, the estimate, the spans


def hook_seconds(g: Grid, quick: bool) -> tuple[int, float]:
    """A hook's grid points and the estimated seconds to measure them (bisections included)."""
    points = g.points(quick)
    keys = {k for k, _ in points}
    # refinement: about one bisection chain per key where the winner changes
    refine = 0 if quick else len(keys) * MAX_REFINE
    per_point = g.quick_seconds if quick else g.seconds
    return len(points), (len(points) + refine) * per_point + len(keys) * COMPILE_SECONDS[g.group]


def plan(hooks: list[str], quick: bool, engine: str = "sglang",
         deep_gemm: bool = False) -> tuple[list[str], float]:
    """One line per hook (keys, counts, modes, points) and the estimated seconds in all."""
    lines, total = [], START_SECONDS
    for hook in hooks:
        g = grids_for(engine, deep_gemm)[hook]
        points = g.points(quick)
        keys = sorted({k for k, _ in points})
        counts = sorted({c for _, c in points})
        seconds = hook_seconds(g, quick)[1]
        total += seconds
        lines.append(f"{hook}: {g.key} {_ranges(keys)} x {g.count} {_ranges(counts)}"
                     + ("" if quick else " (+ bisections where the winner changes)")
                     + f", {'/'.join(g.modes)}; {len(points)} points, ~{seconds / 60:.1f} min")
    return lines, total


def calls(hooks: list[str], quick: bool, engine: str = "sglang",
          limit: float = CALL_SECONDS, deep_gemm: bool = False) -> list[list[str]]:
    """``hooks`` in the order given, cut into runs each estimated to end within ``limit``
    seconds (its start included); a hook longer than that is a run of its own, which the same
    command resumes from its ``.partial`` file where a call was cut short."""
    if limit <= START_SECONDS:
        raise ValueError(f"limit: expected more than the {START_SECONDS:.0f} s a run takes to "
                         f"start, got {limit!r}")
    runs: list[list[str]] = []
    spent = limit
    for hook in hooks:
        seconds = hook_seconds(grids_for(engine, deep_gemm)[hook], quick)[1]
        if runs and spent + seconds <= limit:
            runs[-1].append(hook)
            spent += seconds
        else:
            runs.append([hook])
            spent = START_SECONDS + seconds
    return runs


def _ranges(values: list[int]) -> str:
    return "{" + ", ".join(map(str, values)) + "}" if len(values) <= 8 else (
        f"{{{values[0]}, {values[1]}, ..., {values[-1]}}} ({len(values)})")


def spans_from_points(points: dict[int, tuple[float, float]], switches: tuple[int, ...] = (),
                      margin: float | None = None,
                      carry: float = tables.CARRY_MARGIN["graph"]) -> Spans:
    """Inclusive count ranges served by ours from measured ``{count: (ours_us, engine_us)}``,
    segment by segment (the counts from 1 to the largest measured one, split at ``switches``,
    the counts where either kernel's tiling changes: :func:`segment_verdicts`)."""
    spans: list[tuple[int, int]] = []
    for (lo, hi), verdict in segment_verdicts(points, switches, margin, carry):
        if verdict is None:
            continue
        for c in range(lo, hi + 1):
            if not verdict(c):  # False, or None: nothing measured behind it
                continue
            if spans and spans[-1][1] == c - 1:
                spans[-1] = (spans[-1][0], c)
            else:
                spans.append((c, c))
    return tuple(spans)


def segment_verdicts(points: dict[int, tuple[float, float]], switches: tuple[int, ...] = (),
                     margin: float | None = None,
                     carry: float = tables.CARRY_MARGIN["graph"]) -> list:
    """Per segment of the counts ``1..max(points)`` split at ``switches``, ``((lo, hi),
    verdict)``: ``verdict(count)`` says whether ours is served there, None where it rests on no
    measurement (:func:`unmeasured_verdict`); ``verdict`` is None where no count of the segment
    was measured. A measured count is ours where ours won there (:func:`wins` with
    ``margin``). A count not measured takes ours only between two measured points of its
    segment that both won by ``carry`` or more (``margin`` if larger): the same tilings run on
    both sides of it, and a ratio can move across a segment (vLLM's mhc_post went from 1.42x at
    64 tokens to 0.91x at 128), so a clear win on one side says nothing of the other. A count
    between two points not both won clearly is the engine's by measurement; one below the
    segment's first point or above its last is the engine's with nothing measured behind it."""
    if not points:
        return []
    clear_margin = max(carry, margin or 1.0)
    out = []
    for lo, hi in plans.segments(switches, max(points)):
        measured = sorted(c for c in points if lo <= c <= hi)
        if not measured:
            out.append(((lo, hi), None))
            continue
        won = {c: wins(*points[c], margin) for c in measured}
        clear = {c: wins(*points[c], clear_margin) for c in measured}

        def verdict(c: int, measured=measured, won=won, clear=clear) -> bool | None:
            if c in won:
                return won[c]
            if c < measured[0] or c > measured[-1]:
                return None
            below = max(m for m in measured if m < c)
            above = min(m for m in measured if m > c)
            return clear[below] and clear[above]

        out.append(((lo, hi), verdict))
    return out


def _deepgemm_above(entry: dict) -> int | None:
    """The count above which an entry's points were measured against DeepGEMM's GEMM (its
    ``measured_against``: :func:`tables.deepgemm_above`), None for the engine's own kernels."""
    against = entry.get("measured_against")
    return None if against is None else tables.deepgemm_above(against)


def unmeasured_of(entry: dict, engine: str, hook: str, num_sms: int | None = None,
                  stack: str | None = None) -> dict[str, dict[str, list[list[int]]]]:
    """Per mode and key of an entry's ``points``, the counts below the cap left to the engine
    with no measurement behind them (:func:`segment_verdicts`): segments no point was measured
    in, and counts below the first or above the last point of their segment, until ``tune``
    measures there. Only modes and keys with such counts appear."""
    out: dict[str, dict[str, list[list[int]]]] = {}
    cap = entry.get("max_count")
    for mode, keyed in entry.get("points", {}).items():
        for key, rows in keyed.items():
            if not rows:
                continue
            top = max(r[0] for r in rows)
            switches = plans.segment_switches(engine, hook, int(key), top, num_sms, stack,
                                              _deepgemm_above(entry))
            gaps = []
            for (lo, hi), verdict in segment_verdicts({r[0]: (r[1], r[2]) for r in rows},
                                                      switches):
                hi = hi if cap is None else min(hi, cap)
                for c in range(lo, hi + 1):
                    if verdict is None or verdict(c) is None:
                        if gaps and gaps[-1][1] == c - 1:
                            gaps[-1][1] = c
                        else:
                            gaps.append([c, c])
            if gaps:
                out.setdefault(mode, {})[key] = gaps
    return out


def bisections(won: dict[int, tuple[bool, ...]], depth: dict[int, int]) -> list[int]:
    """Counts to measure next: the geometric middle of each pair of neighbours whose winners
    differ in some mode, until they are adjacent or ``MAX_REFINE`` bisections deep."""
    counts = sorted(won)
    todo = []
    for a, b in zip(counts, counts[1:]):
        if won[a] != won[b] and b - a > 1 and max(depth.get(a, 0), depth.get(b, 0)) < MAX_REFINE:
            mid = min(max(round(math.sqrt(a * b)), a + 1), b - 1)
            todo.append(mid)
            depth[mid] = max(depth.get(a, 0), depth.get(b, 0)) + 1
    return todo


def _won(result: dict, mode: str) -> bool:
    ours, engine = result[mode]
    return wins(ours, engine)


def wins(ours_us: float, engine_us: float, margin: float | None = None) -> bool:
    """Whether a point serves ours: faster (``margin`` None), or at least ``margin`` times as
    fast (``engine_us >= margin * ours_us``: an architecture file's rule)."""
    return ours_us < engine_us if margin is None else engine_us >= margin * ours_us


def spans_of(entry: dict, engine: str, hook: str, num_sms: int | None = None,
             stack: str | None = None, margin: float | None = None) -> dict[str, dict]:
    """An entry's ranges, per mode that has ``points`` and per key, derived from those points
    (:func:`spans_from_points`, a point served where :func:`wins` with ``margin``) in the
    segments between the tiling switches of ``engine``'s ``hook`` (ours on ``num_sms`` SMs
    under Triton ``stack``, and the engine's kernel's: :func:`plans.segment_switches`)."""
    out = {}
    for mode, keyed in entry.get("points", {}).items():
        out[mode] = {}
        for key, rows in keyed.items():
            switches = plans.segment_switches(
                engine, hook, int(key), max(r[0] for r in rows), num_sms, stack,
                _deepgemm_above(entry)) if rows else ()
            out[mode][key] = [list(s) for s in spans_from_points(
                {c: (o, e) for c, o, e in rows}, switches, margin, tables.CARRY_MARGIN[mode])]
    return out


def derived_fields(entry: dict, engine: str, hook: str, num_sms: int | None = None,
                   stack: str | None = None, margin: float | None = None) -> dict:
    """What :func:`spans_of` and :func:`unmeasured_of` derive from an entry's points: its
    ranges per mode and its ``unmeasured`` segments (the field absent where none is)."""
    out = spans_of(entry, engine, hook, num_sms, stack, margin)
    gaps = unmeasured_of(entry, engine, hook, num_sms, stack)
    return {**out, "unmeasured": gaps} if gaps else out


def entry_from_points(g: Grid, points: dict[int, dict[int, dict]], num_sms: int | None = None,
                      stack: str | None = None, deep_gemm: bool = False) -> dict:
    """A hook's table entry from ``{key: {count: {mode: [ours_us, engine_us]}}}`` measured on
    ``num_sms`` SMs under Triton ``stack`` (default: the imported one), beside the engine's mHC
    kernels with DeepGEMM on (``deep_gemm``) or off: ``measured_against`` names the path that ran
    at the measured counts (:func:`deepgemm.measured_against`)."""
    against = g.measured_against
    if g.group in ("mhc", "vllm"):
        counts = {c for by_count in points.values() for c in by_count}
        against = deepgemm.measured_against(g.hook, counts, deep_gemm)
    entry = {"key": g.key, "between_keys": g.between_keys, "count": g.count,
             "max_count": g.max_count, "measured_against": against}
    measured = {"max_count": g.max_count, "measured_against": against,
                "points": {mode: {str(k): [[c, *r[mode]] for c, r in sorted(by_count.items())]
                                  for k, by_count in sorted(points.items())}
                           for mode in g.modes}}
    derived = derived_fields(measured, g.engine, g.hook, num_sms, stack)
    for mode in tables.MODES:
        entry[mode] = derived.get(mode, {})
    if "unmeasured" in derived:
        entry["unmeasured"] = derived["unmeasured"]
    entry["points"] = measured["points"]
    if g.note:
        entry["note"] = g.note
    return entry


def respanned(data: dict) -> dict:
    """A device file with every range re-derived from its points (:func:`spans_of`: the rule
    ``tune`` writes by); modes without points keep theirs."""
    out = json.loads(json.dumps(data))
    stack = tables.file_stack(data)
    for engine, hooks in out["engines"].items():
        for hook, entry in hooks.items():
            entry.pop("unmeasured", None)
            entry.update(derived_fields(entry, engine, hook, data["measured"].get("sm_count"),
                                        stack))
    return out


def architecture_file(data: dict, name: str, margin: float = tables.ARCHITECTURE_MARGIN) -> dict:
    """The architecture file derived from device file ``data`` (named ``name``): its ranges
    re-derived from its points serving ours only where it won by ``margin`` or more, for the GPUs
    of its architecture that no file names."""
    if not data.get("device"):
        raise ValueError(f"{name}: not a device file (no device), nothing to derive from")
    if not isinstance(data["measured"].get("sm_count"), int):
        raise ValueError(f"{name}: measured.sm_count missing: the SM count it was measured on "
                         "decides where another GPU's plans differ")
    stack = tables.file_stack(data)
    out = {"format": tables.FORMAT, "device": None, "architecture": data["architecture"],
           "derived": {"device": data["device"], "file": name, "margin": margin},
           "measured": data["measured"], "engines": {}}
    for engine, hooks in data["engines"].items():
        out["engines"][engine] = {}
        for hook, entry in hooks.items():
            derived = {**entry, **{mode: {} for mode in tables.MODES}}
            derived.pop("unmeasured", None)
            derived.update(derived_fields(entry, engine, hook, data["measured"]["sm_count"],
                                          stack, margin))
            out["engines"][engine][hook] = derived
    return json.loads(json.dumps(out))


def architecture_file_name(device_file: str, data: dict) -> str:
    """``NVIDIA_H200.json`` -> ``sm_90.json``, ``NVIDIA_H200.triton3.8.json`` ->
    ``sm_90.triton3.8.json``, ``NVIDIA_H200.deepgemm.triton3.8.json`` ->
    ``sm_90.deepgemm.triton3.8.json``: the stack (and ``.deepgemm``) named as the device file
    names it."""
    stack = tables.file_stack(data)
    suffix = f".triton{stack}.json" if device_file.endswith(f".triton{stack}.json") else ".json"
    if device_file.endswith(f"{tables.DEEPGEMM_INFIX}{suffix}"):
        suffix = tables.DEEPGEMM_INFIX + suffix  # rows measured against DeepGEMM's path
    return data["architecture"] + suffix


def derive(paths: list[Path]) -> list[Path]:
    """``--derive``: each device file's ranges re-derived in place, and its architecture file
    written beside it; the paths written. Every file is derived and checked before any is
    written."""
    out, targets = {}, {}
    for path in paths:
        try:
            data = json.loads(path.read_text())
            tables.validate(data)
        except (OSError, ValueError) as e:  # json's errors are ValueErrors
            raise ValueError(f"--derive {path}: not a readable tables file ({e})") from e
        target = path.with_name(architecture_file_name(path.name, data))
        if target in targets:
            raise ValueError(f"{path} and {targets[target]} both derive {target.name}: one "
                             "device file per architecture and stack")
        targets[target] = path
        out[path] = respanned(data)
        out[target] = architecture_file(out[path], path.name)
        tables.validate(out[path])
        tables.validate(out[target])
    written: list[Path] = []
    for path, data in out.items():
        try:
            _write_json(path, data)
        except OSError as e:
            raise DeriveWriteError(f"--derive: cannot write {path} ({e.strerror or e})",
                                   written) from e
        written.append(path)
    return written


class DeriveWriteError(OSError):
    """A file ``--derive`` could not write; ``written`` holds those it wrote before."""

    def __init__(self, message: str, written: list[Path]) -> None:
        super().__init__(message)
        self.written = written


# ---------------------------------------------------------------------------------------------
# Measuring: the benchmarks' inputs, providers and checks


def _graph_and_eager(fns: dict, modes: tuple[str, ...], quick: bool) -> dict:
    """``{mode: [ours_us, engine_us]}`` of the two providers ``{"ours": f, "engine": g}``."""
    from dsv4spec.bench import common

    out = {}
    if "graph" in modes:
        out["graph"] = [common.time_in_graph(fns[p], rep_ms=10 if quick else 30)["median_us"]
                        for p in ("ours", "engine")]
    if "eager" in modes:
        eager = common.time_eager_side_by_side(fns, repeats=5 if quick else 15)
        out["eager"] = [eager[p]["median_us"] for p in ("ours", "engine")]
    return out


def _worst(results: list[dict], modes: tuple[str, ...]) -> dict:
    """Across the shapes of one point, per mode, the one least favourable to ours."""
    return {m: max((r[m] for r in results), key=lambda oe: oe[0] / oe[1]) for m in modes}


def metadata_shapes(rows: int, quick: bool) -> list[tuple[str, int]]:
    """The (mode, batch size) shapes whose query rows number ``rows``: verify at ``rows / 4``
    requests where whole, decode at ``rows`` up to the largest decode batch (quick: one)."""
    from dsv4spec.bench import metadata

    shapes = [("verify", rows // metadata.DRAFTS)] if rows % metadata.DRAFTS == 0 else []
    if rows <= MAX_BS and not (quick and shapes):
        shapes.append(("decode", rows))
    return shapes


class Measure:
    """Loads each peer once; ``point(grid, key, count, quick)`` -> ``{mode: [ours, engine]}``."""

    def __init__(self, device: str = "cuda", deep_gemm: ModuleType | None = None) -> None:
        self.device = device
        self._loaded: dict[str, object] = {}
        # the engines' pre-norm GEMM: DeepGEMM's from this module, or TileLang's where None
        self.deep_gemm = deep_gemm

    def _sync(self) -> None:
        """Wait for the device's work (both providers' checked outputs) before timing."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    def prepare(self, groups) -> None:
        """Load every peer the groups need now, so a missing one fails before any timing."""
        for group in groups:
            self._peer(group)

    def _peer(self, group: str):
        if group in self._loaded:
            return self._loaded[group]
        if group == "mhc":
            from dsv4spec.bench import mhc, sglang_mhc

            peer = sglang_mhc.load_sglang_mhc(self.deep_gemm)
            value = (peer, mhc.ours_functions())
        elif group == "hc_head":
            from dsv4spec.integrations.sglang.source import load_sglang_module

            value = load_sglang_module("kernels/ops/layernorm/mhc_head.py")
        elif group == "hc_head_torch":
            from dsv4spec.bench.sglang_hc_head_torch import load_sglang_hc_head_torch

            value = load_sglang_hc_head_torch()
        elif group == "metadata":
            from dsv4spec.bench import metadata

            page_mod, c128_mod = metadata.load_sglang_metadata_kernels()
            value = (page_mod, c128_mod, metadata.load_sglang_attn_metadata(c128_mod))
        elif group == "vllm":
            from dsv4spec.bench.vllm_kernels import vllm_mhc_peer

            value = vllm_mhc_peer(self.deep_gemm)
            if value is None:
                raise RuntimeError("vLLM's kernels did not load (vLLM's source, TileLang and "
                                   "a CUDA device are needed: see dsv4spec.bench.vllm_kernels)")
        else:
            from dsv4spec.bench import metadata

            value = metadata.load_sglang_expand()
        self._loaded[group] = value
        return value

    def gemm_path(self, hook: str, count: int) -> str:
        """The engine's pre-norm GEMM at this point: ``"deepgemm"`` or ``"tilelang"``."""
        return deepgemm.gemm_path(hook, count, self.deep_gemm is not None)

    def peer_version(self, group: str) -> str:
        """The version a loaded peer reports (vLLM's kernels), else "unknown"."""
        return str(getattr(self._loaded.get(group), "version", "unknown"))

    def point(self, g: Grid, key: int, count: int, quick: bool) -> dict:
        result = getattr(self, f"_{g.group}")(g, key, count, quick)
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()
        return result

    def _mhc(self, g: Grid, H: int, T: int, quick: bool) -> dict:
        from dsv4spec.bench import mhc

        peer, ours = self._peer("mhc")
        op = {"mhc_pre": "pre", "mhc_post": "post", "mhc_fused_post_pre": "post_pre"}[g.hook]
        inp = mhc.make_inputs(T, H, seed=1000 * H + T, device=self.device)
        ref = mhc.canonical(op, mhc.torch_provider(op, inp, True)(), T, H)
        fns = {"ours": mhc.ours_provider(ours[op], op, inp, True),
               "engine": mhc.sglang_provider(peer, op, inp, True)}
        for name, fn in fns.items():
            fn()
            mhc.check(name, mhc.max_errors(mhc.canonical(op, fn(), T, H), ref))
        self._sync()
        return _graph_and_eager(fns, g.modes, quick)

    def _hc_head(self, g: Grid, H: int, T: int, quick: bool) -> dict:
        from dsv4spec.bench import hc_head

        peer = self._peer("hc_head")
        inputs = hc_head.make_inputs(T, H, seed=T, device=self.device)
        fns = {}
        for name, provider in (("ours", "triton"), ("engine", "sglang")):
            fn, ref = hc_head.setup(provider, inputs, peer)
            fn()
            hc_head.refcheck(provider, fn(), ref)
            fns[name] = fn
        self._sync()
        return _graph_and_eager(fns, g.modes, quick)

    def _hc_head_torch(self, g: Grid, H: int, T: int, quick: bool) -> dict:
        from dsv4spec.bench import sglang_hc_head_torch

        fns = sglang_hc_head_torch.providers(self._peer("hc_head_torch"), H, T,
                                             ("dsv4spec", "sglang"), device=self.device)
        self._sync()
        return _graph_and_eager({"ours": fns["dsv4spec"], "engine": fns["sglang"]}, g.modes,
                                quick)

    def _metadata(self, g: Grid, width: int, rows: int, quick: bool) -> dict:
        from dsv4spec.bench import metadata

        page_mod, c128_mod, attn_metadata = self._peer("metadata")
        op = {PAGE_TABLE: "page_table", COMPRESSED: "c128", COMPRESSION: "compression"}[g.hook]
        capacity = width * metadata.PAGE_SIZE
        shapes = metadata_shapes(rows, quick)
        if not shapes:
            raise ValueError(f"no decode or verify batch holds {rows} query rows")
        lives = (capacity // 16,) if quick else (capacity // 16, capacity // 2)
        results = []
        for mode, bs in shapes:
            for live in lives:
                x = metadata.make_inputs(bs, live, capacity, mode, self.device,
                                           seed=bs + live)
                prep = page_mod.build_page_table_positions_triton(
                    req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
                    seq_lens_casual=x["seq_lens"], max_seq_len=capacity,
                    page_size=metadata.PAGE_SIZE, swa_window=metadata.SWA_WINDOW)
                fns = metadata.providers(op, x, capacity, page_mod, c128_mod, prep.page_table,
                                         attn_metadata)
                metadata.refcheck(op, fns["dsv4spec"](), fns["sglang"](), x["seq_lens"],
                                  capacity)
                self._sync()
                results.append(_graph_and_eager(
                    {"ours": fns["dsv4spec"], "engine": fns["sglang"]}, g.modes, quick))
                del x, prep, fns
        return _worst(results, g.modes)

    def _vllm(self, g: Grid, H: int, T: int, quick: bool) -> dict:
        from dsv4spec.bench import vllm_plugin

        # bench vllm's measurement: the hook with ours forced, checked against float64 and
        # within twice vLLM's error before both are timed in a graph and eagerly
        r = vllm_plugin.measure(self._peer("vllm"), g.hook, H, T, seed=T + H)
        return {"graph": [r["hook_graph_us"], r["vllm_graph_us"]],
                "eager": [r["hook_eager_us"], r["vllm_eager_us"]]}

    def _expand(self, g: Grid, qo_len: int, bs: int, quick: bool) -> dict:
        from dsv4spec.bench import metadata

        method = self._peer("expand")
        x = metadata.expand_inputs(bs, qo_len, self.device, seed=bs + qo_len)
        fns = metadata.expand_providers("expand", x, bs, qo_len, method)
        metadata.expand_refcheck("expand", fns["dsv4spec"](), fns["sglang"]())
        self._sync()
        return _graph_and_eager({"ours": fns["dsv4spec"], "engine": fns["sglang"]}, g.modes,
                                quick)


# ---------------------------------------------------------------------------------------------
# The run: refuse, plan, resume, measure, write


class MeasurementError(RuntimeError):
    """A measurement failed; the message names the hook and the point, then the error."""


def environment() -> dict:
    """What a file's points were measured with; a partial run resumes only on the same."""
    return {"device": torch.cuda.get_device_name(), "dsv4spec": __version__,
            "torch": torch.__version__, "triton": triton.__version__,
            "cuda": str(torch.version.cuda),
            "sm_count": torch.cuda.get_device_properties(
                torch.cuda.current_device()).multi_processor_count}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(tables.dumps(data) + "\n")
    os.replace(tmp, path)


def _sglang_version() -> str:
    try:
        from dsv4spec.bench.sglang_mhc import sglang_version

        return str(sglang_version())
    except Exception:  # noqa: BLE001 - a label only
        return "unknown"


TIE = 0.03  # a point where the two differ by at most this much is a near-tie


def compare(a: dict, b: dict, tie: float = TIE) -> tuple[list[str], int, int]:
    """Lines for the measured points two files (``{engine: {hook: entry}}``, with ``points``)
    share where the winner differs, "near-tie" where either run measured them within ``tie``;
    also the points shared and the differences that are not near-ties."""
    lines, shared, real = [], 0, 0
    for engine, hooks in a.items():
        for hook, entry in hooks.items():
            other = b.get(engine, {}).get(hook, {}).get("points", {})
            for mode, keyed in entry.get("points", {}).items():
                for key, rows in keyed.items():
                    theirs = {r[0]: r[1:] for r in other.get(mode, {}).get(key, [])}
                    for count, ours_a, engine_a in rows:
                        if count not in theirs:
                            continue
                        shared += 1
                        ours_b, engine_b = theirs[count]
                        if (ours_a < engine_a) == (ours_b < engine_b):
                            continue
                        near = any(abs(o / e - 1) <= tie
                                   for o, e in ((ours_a, engine_a), (ours_b, engine_b)))
                        real += not near
                        lines.append(
                            f"{engine} {hook} {mode} {entry['key']}={key} {entry['count']}="
                            f"{count}: ours/engine {ours_a:.2f}/{engine_a:.2f} vs "
                            f"{ours_b:.2f}/{engine_b:.2f} us"
                            + (" (near-tie)" if near else ""))
    return lines, shared, real


def served_share(entry: dict, modes: tuple[str, ...]) -> dict[str, float]:
    """Per mode, the share of an entry's measured points where ours was served."""
    share = {}
    for mode in modes:
        rows = [r for keyed in entry.get("points", {}).get(mode, {}).values() for r in keyed]
        share[mode] = sum(o < e for _, o, e in rows) / len(rows) if rows else 0.0
    return share


def report(data: dict) -> str:
    """A tables file (with ``points``) as markdown: provenance, then per hook the served ranges
    and the share of measured points ours won, then every point (ours / engine us, ratio)."""
    tables.validate(data)
    m = data["measured"]
    out = [f"# Measured-faster tables: {data['device'] or data['architecture']}", "",
           ", ".join(f"{k} {m[k]}" for k in m if k != "command")
           + f"; command `{m.get('command', '')}`", "",
           "| engine | hook | key | mode | ours served at | share of points | unmeasured | "
           "measured against |", "|---|---|---|---|---|---|---|---|"]
    for engine, hooks in data["engines"].items():
        for hook, entry in hooks.items():
            modes = [mode for mode in tables.MODES if entry.get("points", {}).get(mode)]
            share = served_share(entry, tuple(modes))
            for mode in tables.MODES:
                served = "engine's always" if mode not in modes else _describe(entry[mode])
                gaps = entry.get("unmeasured", {}).get(mode)
                out.append(f"| {engine} | {hook} | {entry['key']} | {mode} | {served} | "
                           + (f"{share[mode]:.0%}" if mode in modes else "-")
                           + f" | {_describe(gaps) if gaps else '-'} | "
                           + f"{entry.get('measured_against', '-')} |")
    for engine, hooks in data["engines"].items():
        for hook, entry in hooks.items():
            for mode, keyed in entry.get("points", {}).items():
                out += ["", f"## {engine} {hook}, {mode} ({entry['key']}, {entry['count']})", "",
                        f"| {entry['key']} | {entry['count']} | ours us | engine us | "
                        "engine / ours | served |", "|---|---|---|---|---|---|"]
                for key, rows in keyed.items():
                    out += [f"| {key} | {c} | {o:.2f} | {e:.2f} | {e / o:.2f} | "
                            f"{'ours' if o < e else 'engine'} |" for c, o, e in rows]
    return "\n".join(out) + "\n"


def _read_argument(argument: str, path: Path, read):
    """``read(path)``, or :class:`UsageError` naming ``argument`` and the file."""
    try:
        return read(path)
    except OSError as e:
        raise UsageError(argument, f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # not UTF-8, not JSON, or not a tables file (validate's message)
        raise UsageError(argument, f"{path} is not a tables file: {e}") from None


def main(args: argparse.Namespace) -> int:
    grids = grids_for(args.engine, args.deepgemm == "on")
    hooks = list(dict.fromkeys(args.hooks if args.hooks is not None else grids))
    others = [h for h in hooks if h not in grids]
    if others and not (args.compare or args.report or args.derive):
        print(f"dsv4spec tune: error: {args.engine} has no hook {', '.join(others)} (its hooks: "
              f"{', '.join(grids)}); nothing was written", file=sys.stderr)
        return EXIT_USAGE
    if args.compare:
        a, b = (_read_argument("--compare", p, tables.read_file) for p in args.compare)
        lines, shared, real = compare(a, b)
        print("\n".join(lines) + ("\n" if lines else "") + f"{shared} points in both files, "
              f"{len(lines)} with another winner, {real} of them beyond a {TIE:.0%} near-tie")
        return 0
    if args.report:
        text = _read_argument("--report", args.report,
                              lambda p: report(json.loads(p.read_text(encoding="utf-8"))))
        print(text, end="")
        return 0
    if args.derive:
        try:
            written = derive(args.derive)
        except DeriveWriteError as e:
            print(f"dsv4spec tune: error: {e}; " + (f"wrote {', '.join(map(str, e.written))} "
                  "before it" if e.written else "nothing was written"), file=sys.stderr)
            return EXIT_USAGE
        except (OSError, ValueError) as e:
            print(f"dsv4spec tune: error: {e}; nothing was written", file=sys.stderr)
            return EXIT_USAGE
        print("\n".join(f"wrote {p}" for p in written))
        return 0
    if args.plan:
        lines, seconds = plan(hooks, args.quick, args.engine, args.deepgemm == "on")
        points = sum(hook_seconds(grids[h], args.quick)[0] for h in hooks)
        runs = calls(hooks, args.quick, args.engine, deep_gemm=args.deepgemm == "on")
        print("\n".join(lines) + f"\nin all {points} points, ~{seconds / 60:.1f} min on an H200 "
              f"(estimate); in runs of at most {CALL_SECONDS / 60:.0f} min each:\n" + "\n".join(
                  f"  dsv4spec tune --engine {args.engine} --hooks {' '.join(run)}"
                  + (" --quick" * args.quick) + (" --deepgemm on" * (args.deepgemm == "on"))
                  for run in runs))
        return 0
    if not torch.cuda.is_available():
        print("dsv4spec tune: error: needs a CUDA GPU (none visible); nothing was written",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        engine_gemm = deepgemm.resolve(args.deepgemm, args.engine)
    except deepgemm.DeepGemmUnavailable as e:
        print(f"dsv4spec tune: error: {e}; nothing was written", file=sys.stderr)
        return EXIT_USAGE
    env = environment()
    # a partial measured against the other GEMM is not resumed
    env["deep_gemm"] = deepgemm.describe(engine_gemm)
    grids = grids_for(args.engine, engine_gemm is not None)
    lines, seconds = plan(hooks, args.quick, args.engine, engine_gemm is not None)
    out_dir = args.out_dir if args.out_dir is not None else tables.user_dir()
    # one file per stack: the plugins read only tables measured under the Triton they run;
    # the rows measured against the engine's DeepGEMM GEMM go to the stack's .deepgemm file
    stack = tables.stack_of(env["triton"])
    path = out_dir / tables.device_file_name(env["device"], stack)
    partial = path.with_name(path.name + ".partial")
    targets: dict[Path, list[str]] = {}
    for hook in hooks:
        on = engine_gemm is not None and deepgemm.deepgemm_above(hook) is not None
        targets.setdefault(out_dir / tables.device_file_name(env["device"], stack, on),
                           []).append(hook)
    existing: dict[Path, dict | None] = {}
    for target, target_hooks in targets.items():
        try:
            existing[target] = _existing_file(target, stack)
        except (OSError, ValueError) as e:
            if not args.force:
                print(f"dsv4spec tune: error: {target} is not a readable tables file ({e}); "
                      "--force replaces it; nothing was written", file=sys.stderr)
                return EXIT_USAGE
            existing[target] = None
        held = sorted(set(target_hooks)
                      & set((existing[target] or {}).get("engines", {}).get(args.engine, {})))
        if held and not args.force:
            print(f"dsv4spec tune: error: {target} already holds {', '.join(held)}; --force "
                  "measures them again (its other hooks are kept); nothing was written",
                  file=sys.stderr)
            return EXIT_USAGE
    state = {"environment": env, "quick": args.quick, "points": {}}
    if partial.is_file():
        try:
            saved = json.loads(partial.read_text())
            if saved.get("environment") == env and saved.get("quick") == args.quick:
                state = saved
            else:
                print(f"{partial}: measured with another setup ({saved.get('environment')}, "
                      f"quick={saved.get('quick')}); starting over")
        except (OSError, ValueError) as e:
            print(f"{partial}: not readable ({e}); starting over")
    # the partial's points by hook, vLLM's under "vllm:<hook>" (the two engines share hook names)
    slot = {h: h if args.engine == "sglang" else f"{args.engine}:{h}" for h in hooks}
    kept = sum(len(c) for h in hooks for c in state["points"].get(slot[h], {}).values())
    print(f"dsv4spec tune on {env['device']} (torch {env['torch']}, Triton {env['triton']}): "
          f"{'quick' if args.quick else 'full'} grid, writing {', '.join(map(str, targets))}")
    print("\n".join(lines) + f"\nin all ~{seconds / 60:.1f} min (estimate on an H200)"
          + (f"; resuming with {kept} points already measured in {partial}" if kept else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    measure = Measure()
    measure.deep_gemm = engine_gemm
    print(f"{ENGINE_NAMES[args.engine]}'s mHC pre-norm GEMM: {env['deep_gemm']} "
          f"(--deepgemm {args.deepgemm})")
    measure.prepare(dict.fromkeys(grids[h].group for h in hooks))
    start, done = time.perf_counter(), 0
    sms = env.get("sm_count")
    total = sum(len(grids[h].points(args.quick, sms)) for h in hooks)
    peer_name = ENGINE_NAMES[args.engine]
    for hook in hooks:
        g = grids[hook]
        measured = state["points"].setdefault(slot[hook], {})
        grid = g.points(args.quick, sms)
        for key in sorted({k for k, _ in grid}):
            by_count = measured.setdefault(str(key), {})
            todo = [c for k, c in grid if k == key]
            depth: dict[int, int] = {}
            while todo:
                for count in todo:
                    done += 1
                    if str(count) in by_count:
                        continue
                    try:
                        by_count[str(count)] = measure.point(g, key, count, args.quick)
                    except Exception as e:  # noqa: BLE001 - re-raised, naming the point
                        raise MeasurementError(
                            f"measuring {hook} at {g.key}={key}, {g.count}={count}: "
                            f"{type(e).__name__}: {e}") from e
                    _write_json(partial, state)
                    r = by_count[str(count)]
                    elapsed = time.perf_counter() - start
                    print(f"[{done}/{total}+] {hook} {g.key}={key} {g.count}={count}: "
                          + ", ".join(f"{m} ours {r[m][0]:.2f} / {peer_name} {r[m][1]:.2f} us "
                                      f"({'ours' if _won(r, m) else peer_name})"
                                      for m in g.modes)
                          + f"  [{elapsed:.0f} s]", flush=True)
                won = {int(c): tuple(_won(r, m) for m in g.modes) for c, r in by_count.items()}
                todo = [] if args.quick else list(dict.fromkeys(
                    g.measurable(c) for c in bisections(won, depth)
                    if g.max_count is None or c <= g.max_count))
                todo = [c for c in todo if str(c) not in by_count]
                total += len(todo)
    versions = ({"sglang": _sglang_version()} if args.engine == "sglang"
                else {"vllm": measure.peer_version("vllm")})
    rows = {}
    for target, target_hooks in targets.items():
        data = existing[target] or {"format": tables.FORMAT, "engines": {}}
        data.update(format=tables.FORMAT, device=env["device"],
                    architecture=tables.architecture_name(torch.cuda.get_device_capability()))
        # the last run's provenance; an earlier run's engine version is kept beside it
        data["measured"] = {
            **data.get("measured", {}), "date": datetime.date.today().isoformat(),
            **{k: env[k] for k in ("dsv4spec", "torch", "triton", "cuda", "sm_count",
                                   "deep_gemm") if k in env},
            **versions,
            "command": f"dsv4spec tune --engine {args.engine} --hooks {' '.join(target_hooks)}"
                       + (" --quick" * args.quick) + f" --deepgemm {args.deepgemm}",
            "quick": args.quick}
        engine = data["engines"].setdefault(args.engine, {})
        for hook in target_hooks:
            engine[hook] = rows[hook] = entry_from_points(grids[hook], {
                int(k): {int(c): r for c, r in by_count.items()}
                for k, by_count in state["points"][slot[hook]].items()}, sms, stack,
                engine_gemm is not None)
            if args.engine == "vllm":  # the release whose kernels were measured
                engine[hook]["engine_versions"] = [versions["vllm"]]
        tables.validate(data)
        _write_json(target, data)
    for hook in hooks:  # the partial keeps only points of hooks this run did not write
        state["points"].pop(slot[hook], None)
    if state["points"]:
        _write_json(partial, state)
    else:
        partial.unlink(missing_ok=True)
    for hook in hooks:
        entry = rows[hook]
        modes = grids[hook].modes
        served = {m: sum(hi - lo + 1 for spans in entry[m].values() for lo, hi in spans)
                  for m in modes}
        share = served_share(entry, modes)
        gaps = entry.get("unmeasured", {})
        print(f"{hook}: ours served at " + ", ".join(
            f"{m} {_describe(entry[m])} ({share[m]:.0%} of the points)" for m in modes) + (
            "" if any(served.values()) else f" (nowhere: {peer_name}'s own runs)") + (
            "; no point in " + ", ".join(f"{m} {_describe(k)}" for m, k in gaps.items())
            + f" ({peer_name}'s until measured)" if gaps else ""))
    print(f"wrote {', '.join(map(str, targets))} in {time.perf_counter() - start:.0f} s; the "
          "plugins read it at the next start")
    return 0


def _existing_file(path: Path, stack: str) -> dict | None:
    """The tables file at ``path`` where one exists, validated and of ``stack``; raises
    ``OSError`` or ``ValueError`` for one that is not."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    tables.validate(data)
    if tables.file_stack(data) != stack:
        raise ValueError(f"measured under Triton {tables.file_stack(data)}, this process runs "
                         f"{stack}")
    return data


def _describe(keyed: dict) -> str:
    parts = [f"{k}: " + (" ".join(f"{lo}-{hi}" for lo, hi in spans) or "-")
             for k, spans in keyed.items()]
    return "{" + "; ".join(parts) + "}"
