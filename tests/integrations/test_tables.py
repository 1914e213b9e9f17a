"""The measured-faster tables read from JSON: the packaged files, the user directory, malformed
and missing files, the lookup between measured keys, and the SGLang plugin's decisions."""

import functools
import json
import logging
from pathlib import Path

import pytest

from dsv4spec.integrations import plans, tables
from dsv4spec.integrations.sglang import hc_head, metadata, mhc
from dsv4spec.integrations.vllm import mhc as vllm_hooks
from dsv4spec.integrations.vllm.tables import DEEPGEMM_TABLES as VLLM_DEEPGEMM_TABLES
from dsv4spec.integrations.vllm.tables import TABLES as VLLM_TABLES
from dsv4spec.ops import mhc as mhc_ops
from dsv4spec.ops.hc_head import first_plan_difference as hc_head_first_difference
from dsv4spec.ops.hc_head import tiling_switches as hc_head_switches

H200, H100, H20 = "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H20"
H800 = "NVIDIA H800"  # sm_90 with the H200's 132 SMs and no file of its own
H200_SMS = 132  # benchmarks/results/metadata/*.json: "sm_count": "132"
SM90, SM100 = (9, 0), (10, 0)

# The packaged tables are the H200's full `dsv4spec tune` run (benchmarks/results/tune/
# NVIDIA_H200.json). The plugin must decide what that run's measured points say, read here by a
# lookup written independently of dsv4spec.integrations.tables and dsv4spec tune: at a measured
# key (the nearer smaller measured key where keys are widths, never beyond the largest), ours is
# served at a measured count where ours won there in that mode (on another GPU of the
# architecture, the architecture file's, by 1.25x or more), and at a count not measured only
# where the nearest measured counts on both sides, with no planner switch of the hook's op or
# the engine's kernel between them, both won by the carry margin; counts above a cap, other
# architectures and, on a GPU of other SMs, counts from the first one whose launch plan differs
# there get SGLang's.
HOOKS = ("mhc_pre", "mhc_post", "mhc_fused_post_pre", "target_hc_head", "dspark_hc_head",
         "build_page_table_positions_triton", "_init_compressed_attn_metadata_triton",
         "init_compression_metadata", "expand_extend_with_same_length")
KEYS = (1, 2, 3, 4, 5, 8, 9, 40, 64, 65, 127, 128, 511, 512, 2048, 4095, 4096, 4097, 5120,
        7168, 7169, 8192, 8193, 16384)
# The packaged H200 files per Triton stack (the 3.8 one: benchmarks/results/tune/
# NVIDIA_H200.triton3.8.json, 2026-12-03).
STACK_FILES = {"3.6": "NVIDIA_H200.json", "3.8": "NVIDIA_H200.triton3.8.json"}
_STACK_POINTS = {stack: {hook: entry for hook, entry in json.loads(
    (tables.PACKAGED_DIR / name).read_text())["engines"]["sglang"].items()}
    for stack, name in STACK_FILES.items()}
_PACKAGED_POINTS = _STACK_POINTS["3.6"]
# The H100's own file (Triton 3.6; benchmarks/results/deepgemm_h100/, 2026-12-08): SGLang's mHC
# and hc_head hooks, not its metadata builders (those read the sm_90 file)
H100_FILE = "NVIDIA_H100_80GB_HBM3.triton3.6.json"
_H100_POINTS = json.loads((tables.PACKAGED_DIR / H100_FILE).read_text())["engines"]["sglang"]
_MEASURED = {c for points in _STACK_POINTS.values() for e in points.values()
             for keyed in e["points"].values() for rows in keyed.values() for c, *_ in rows}
PLUGIN_TABLES = [*mhc.TABLES.values(), *metadata.TABLES.values(), hc_head.TARGET_HC_HEAD_FASTER,
                 hc_head.DSPARK_HC_HEAD_FASTER]
# the mHC hooks' rows measured against the engines' DeepGEMM path (the .deepgemm files)
DEEPGEMM_TABLES = [*mhc.DEEPGEMM_TABLES.values(), *VLLM_DEEPGEMM_TABLES.values()]
# The op each planned hook runs (the SGLang hooks here; the vLLM ones alike), read off the hooks'
# modules, and its planner's switches and SM-count dependence straight from the ops
OPS_OF = {"mhc_pre": "mhc_pre", "mhc_post": "mhc_post", "mhc_fused_post_pre": "mhc_post_pre",
          "target_hc_head": "hc_head", "dspark_hc_head": "hc_head", "hc_head": "hc_head"}


@functools.lru_cache(maxsize=None)
def switches(hook: str, key: int, stack: str = "3.6", top: int = 16384) -> tuple[int, ...]:
    if hook not in OPS_OF:
        return ()
    if OPS_OF[hook] == "hc_head":
        return hc_head_switches(key, top, H200_SMS)
    return mhc_ops.tiling_switches(OPS_OF[hook], key, top, H200_SMS, triton_version=stack)


@functools.lru_cache(maxsize=None)
def first_difference(hook: str, key: int, sms: int, top: int = 16384) -> int | None:
    if hook not in OPS_OF or sms == H200_SMS:
        return None
    if OPS_OF[hook] == "hc_head":
        return hc_head_first_difference(key, top, H200_SMS, sms)
    return mhc_ops.first_plan_difference(OPS_OF[hook], key, top, H200_SMS, sms)


_H100_MEASURED = {c for e in _H100_POINTS.values() for keyed in e["points"].values()
                  for rows in keyed.values() for c, *_ in rows}
COUNTS = tuple(sorted({*range(1, 70),
                       *(c + d for c in _MEASURED | _H100_MEASURED for d in (-1, 0, 1) if c + d),
                       *(s + d for h in HOOKS for k in (4096, 7168) for s in switches(h, k)
                         for d in (-1, 0, 1))}))


def measured_decides(hook: str, key: int, count: int, in_graph: bool, architecture,
                     stack: str = "3.6", margin: float | None = None,
                     sms: int = H200_SMS, points: dict | None = None) -> bool:
    entry = (points or _STACK_POINTS[stack])[hook]
    if architecture != SM90 or (entry["max_count"] is not None and count > entry["max_count"]):
        return False
    first = first_difference(hook, key, sms)
    if first is not None and count >= first:
        return False
    keyed = {int(k): rows for k, rows in entry["points"].get("graph" if in_graph else "eager",
                                                             {}).items()}
    if entry["between_keys"] == "exact":
        at = key if key in keyed else None
    else:
        at = max((k for k in keyed if k <= key), default=None) if keyed and key <= max(
            keyed) else None
    if at is None:
        return False
    rows = sorted(keyed[at])
    if count > rows[-1][0]:  # never beyond the largest measured count
        return False
    # the count's segment: no switch of our tiling or SGLang's kernel's between it and a point
    cuts = {*switches(hook, at, stack), *plans.ENGINE_TILING_SWITCHES.get(("sglang", hook), ())}
    lo = max([1, *(s for s in cuts if s <= count)])
    hi = min([rows[-1][0], *(s - 1 for s in cuts if s > count)])
    segment = [row for row in rows if lo <= row[0] <= hi]

    def won(row, by=margin):
        return row[1] < row[2] if by is None else row[2] >= by * row[1]

    clearly = max(tables.CARRY_MARGIN["graph" if in_graph else "eager"], margin or 1.0)
    if not segment:
        return False
    if count in [row[0] for row in segment]:
        return won(next(row for row in segment if row[0] == count))
    # not measured: ours only between two measured points of its segment, both won clearly
    below = [row for row in segment if row[0] < count]
    above = [row for row in segment if row[0] > count]
    return bool(below and above) and won(below[-1], clearly) and won(above[0], clearly)


def test_the_packaged_decisions_at_points_read_off_the_h200_run(fresh):
    """A few decisions written out from benchmarks/results/tune/NVIDIA_H200.md, so a packaged
    file that no longer says what the H200 measured fails even where it is self-consistent."""
    fresh(H200)
    pt = metadata.PAGE_TABLE
    assert not any(plugin_decides(pt, 64, r, True, SM90) for r in (1, 16, 512, 2048))
    assert all(plugin_decides(pt, w, r, True, SM90) for w in (4096, 5000, 8192)
               for r in (1, 4, 512, 2048))
    assert not plugin_decides(pt, 4096, 2049, True, SM90)  # beyond the largest measured count
    assert not plugin_decides(pt, 16384, 1, True, SM90)  # beyond the largest measured width
    assert not any(plugin_decides(pt, 4096, r, False, SM90) for r in (1, 64))  # eager: SGLang's
    assert plugin_decides("mhc_post", 7168, 1, True, SM90)
    assert not plugin_decides("mhc_post", 7168, 16, True, SM90)  # SGLang's 1.33 us beat ours
    assert plugin_decides("mhc_post", 7168, 4096, True, SM90)
    assert plugin_decides("mhc_pre", 4096, 11, True, SM90)
    assert not plugin_decides("mhc_pre", 4096, 12, True, SM90)
    assert not any(plugin_decides(h, 7168, 33, g, SM90) for h in ("mhc_pre", "mhc_fused_post_pre")
                   for g in (True, False))  # the DeepGEMM cap
    assert plugin_decides("target_hc_head", 7168, 16384, True, SM90)
    assert not plugin_decides("target_hc_head", 7168, 16385, True, SM90)
    assert not plugin_decides("target_hc_head", 5120, 1, True, SM90)  # widths are exact here
    ex = metadata.EXPAND
    assert plugin_decides(ex, 4, 512, True, SM90) and not plugin_decides(ex, 4, 513, True, SM90)
    assert not plugin_decides(ex, 9, 1, True, SM90)


def plugin_decides(hook: str, key: int, count: int, in_graph: bool, architecture) -> bool:
    if hook in mhc.TABLES:
        return mhc.prefers_dsv4spec(hook, count, key, in_graph, architecture)
    if hook == "target_hc_head":
        return hc_head.target_prefers_dsv4spec(count, key, in_graph, architecture)
    if hook == "dspark_hc_head":
        return hc_head.dspark_prefers_dsv4spec(count, key, in_graph, architecture)
    return metadata.prefers_dsv4spec(hook, count, key, in_graph, architecture)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty user directory, no file read yet, and the plugin's tables re-read on next use;
    ``fresh(name, architecture)`` makes ``name`` the visible GPU of that architecture (and no
    GPU of any other)."""
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "user"))

    def reset():
        tables.clear_cache()
        for table in [*PLUGIN_TABLES, *VLLM_TABLES.values(), *DEEPGEMM_TABLES]:
            table.reload()

    def device(name, architecture=SM90, sm_count=None):
        monkeypatch.setattr(tables, "_device_name",
                            lambda arch: name if tuple(arch) == architecture else None)
        monkeypatch.setattr(tables, "_device_sm_count",
                            lambda arch: sm_count if tuple(arch) == architecture else None)
        reset()

    reset()
    yield device
    monkeypatch.undo()
    reset()


def write_user(name: str, data) -> Path:
    path = tables.user_dir() / tables.device_file_name(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def packaged(name="NVIDIA_H200.json") -> dict:
    return json.loads((tables.PACKAGED_DIR / name).read_text())


def one_hook_file(hook: str, **fields) -> dict:
    """A valid file holding one SGLang hook, the packaged H200 entry with ``fields`` replaced."""
    data = packaged()
    data["engines"] = {"sglang": {hook: {**data["engines"]["sglang"][hook], **fields}}}
    return data


@pytest.mark.parametrize("stack", list(STACK_FILES))
def test_packaged_files_are_valid_and_sm90_is_derived_from_the_h200s_points(stack):
    arch_file = "sm_90.json" if stack == "3.6" else f"sm_90.triton{stack}.json"
    h200_stack, h200 = tables.read_file_with_stack(tables.PACKAGED_DIR / STACK_FILES[stack])
    sm90_stack, sm90 = tables.read_file_with_stack(tables.PACKAGED_DIR / arch_file)
    assert h200_stack == sm90_stack == stack
    assert set(h200["sglang"]) == set(HOOKS)
    derived = json.loads((tables.PACKAGED_DIR / arch_file).read_text())
    assert derived["device"] is None and derived["derived"] == {
        "device": H200, "file": STACK_FILES[stack], "margin": tables.ARCHITECTURE_MARGIN}
    assert derived["measured"]["sm_count"] == H200_SMS
    # the same points, not the same ranges: those follow the margin (the decisions test below)
    assert {e: {h: x["points"] for h, x in hooks.items()} for e, hooks in sm90.items()} == {
        e: {h: x["points"] for h, x in hooks.items()} for e, hooks in h200.items()}
    assert sm90 != h200
    for name in (STACK_FILES[stack], arch_file):
        text = (tables.PACKAGED_DIR / name).read_text()
        assert text == tables.dumps(json.loads(text)) + "\n", f"{name}: not in dumps' layout"


def test_the_test_knows_every_planned_hook():
    assert {hook for _, hook in plans.HOOK_OPS} == set(OPS_OF)
    assert all(OPS_OF[hook] == op for (_, hook), op in plans.HOOK_OPS.items())


@pytest.mark.parametrize("name", sorted(p.name for p in tables.PACKAGED_DIR.glob("*.json")))
def test_no_served_range_reaches_a_segment_without_a_measured_win(name):
    """A served range may cross a count where either kernel changes its tiling only into a
    segment (the counts between two such switches) where ours won a measured point: a verdict
    does not carry over to a tiling not measured."""
    data = json.loads((tables.PACKAGED_DIR / name).read_text())
    stack = tables.file_stack(data)
    crossed = []
    for engine, hooks in data["engines"].items():
        for hook, entry in hooks.items():
            for mode in tables.MODES:
                for key, spans in entry[mode].items():
                    rows = entry["points"].get(mode, {}).get(key, [])
                    cuts = sorted({*switches(hook, int(key), stack),
                                   *plans.ENGINE_TILING_SWITCHES.get((engine, hook), ())})
                    for lo, hi in spans:
                        starts = [lo, *(s for s in cuts if lo < s <= hi)]
                        crossed += [(engine, hook, mode, key, (lo, hi), start)
                                    for start in starts if not any(
                                        r[1] < r[2] for r in rows if r[0] >= start and not any(
                                            start < s <= r[0] for s in cuts))]
    assert not crossed, crossed
    planned = [h for hooks in data["engines"].values() for h in hooks if h in OPS_OF]
    # the H200's files hold every planned hook; another GPU's, the hooks measured there
    assert planned and all(switches(h, 7168, stack) for h in planned)
    assert len(planned) == 9 or not name.startswith(("NVIDIA_H200", "sm_")) or (
        tables.DEEPGEMM_INFIX in name)


@pytest.mark.parametrize("stack", list(STACK_FILES))
@pytest.mark.parametrize("device, sms", [(None, None), (H200, H200_SMS), (H800, 132), (H20, 78)],
                         ids=["interpreter (sm_90 file)", "H200 (its file)",
                              "H800 (sm_90 file)", "H20 (sm_90 file, 78 SMs)"])
def test_decisions_follow_the_measured_points(fresh, monkeypatch, caplog, device, sms, stack):
    monkeypatch.setattr(tables, "running_stack", lambda: stack)
    fresh(device, sm_count=sms)
    margin = None if device == H200 else tables.ARCHITECTURE_MARGIN
    differ = []
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        for hook in HOOKS:
            for architecture in (SM90, SM100, (8, 0), None):
                for in_graph in (True, False):
                    for key in KEYS:
                        for count in COUNTS:
                            if (plugin_decides(hook, key, count, in_graph, architecture)
                                    != measured_decides(hook, key, count, in_graph, architecture,
                                                        stack, margin, sms or H200_SMS)):
                                differ.append((hook, architecture, in_graph, key, count))
    assert not differ, f"{len(differ)} decisions differ, e.g. {differ[:5]}"
    arch_file = "sm_90.json" if stack == "3.6" else f"sm_90.triton{stack}.json"
    expected = tables.PACKAGED_DIR / (STACK_FILES[stack] if device == H200 else arch_file)
    assert all(t.sources[SM90] == expected for t in PLUGIN_TABLES)
    # a named GPU on the architecture file is told so once, naming the file and `dsv4spec tune`
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if device in (H800, H20):
        assert len(warnings) == 1 and device in warnings[0] and str(expected) in warnings[0]
        assert "dsv4spec tune" in warnings[0] and "1.25x" in warnings[0]
        assert ("78 SMs" in warnings[0]) == (device == H20)
    else:
        assert warnings == []
    # the grid covers both answers of every hook (a grid where nothing is served proves nothing)
    for hook in HOOKS:
        answers = {measured_decides(hook, k, c, g, SM90, stack, margin, sms or H200_SMS)
                   for k in KEYS for c in COUNTS for g in (True, False)}
        assert answers == {True, False}, hook


def test_the_h100_decides_from_its_own_points_where_its_file_has_the_hook(fresh, monkeypatch,
                                                                          caplog):
    monkeypatch.setattr(tables, "running_stack", lambda: "3.6")
    fresh(H100, sm_count=132)
    differ = []
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        for hook in HOOKS:
            own = hook in _H100_POINTS
            for in_graph in (True, False):
                for key in KEYS:
                    for count in COUNTS:
                        expected = (measured_decides(hook, key, count, in_graph, SM90,
                                                     points=_H100_POINTS, sms=132) if own else
                                    measured_decides(hook, key, count, in_graph, SM90,
                                                     margin=tables.ARCHITECTURE_MARGIN))
                        if plugin_decides(hook, key, count, in_graph, SM90) != expected:
                            differ.append((hook, in_graph, key, count))
    assert not differ, f"{len(differ)} decisions differ, e.g. {differ[:5]}"
    assert {t.sources[SM90].name for t in PLUGIN_TABLES} == {H100_FILE, "sm_90.json"}
    # the metadata builders, not in its file, read the sm_90 file, and it is told so once
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and H100 in warnings[0] and "sm_90.json" in warnings[0]
    for hook in _H100_POINTS:  # the file serves and keeps the engine's, both
        assert {measured_decides(hook, k, c, g, SM90, points=_H100_POINTS, sms=132)
                for k in KEYS for c in COUNTS for g in (True, False)} == {True, False}, hook


@pytest.mark.parametrize("content", [
    "{not json",
    "",
    json.dumps([1, 2]),
    json.dumps({**packaged(), "format": 2}),
    json.dumps({k: v for k, v in packaged().items() if k != "engines"}),
    json.dumps(one_hook_file("mhc_post", graph={"4096": [[16, 1]]})),
    json.dumps(one_hook_file("mhc_post", graph={"4096": [[1, 8], [4, 16]]})),
    json.dumps(one_hook_file("mhc_post", graph={"h4096": [[1, 8]]})),
    json.dumps(one_hook_file("mhc_post", graph={"4096": [[0, 8]]})),
    json.dumps(one_hook_file("mhc_post", graph={"4096": [[1, True]]})),
    json.dumps(one_hook_file("mhc_post", between_keys="linear")),
    json.dumps(one_hook_file("mhc_post", max_count=0)),
    json.dumps(one_hook_file("mhc_post", serves="always")),
    json.dumps({**packaged(), "engines": {"trtllm": {}}}),
], ids=["truncated", "empty", "a list", "format 2", "no engines", "reversed range",
        "overlapping ranges", "key not a number", "count 0", "bool bound", "unknown rule",
        "cap 0", "unknown field", "unknown engine"])
def test_a_malformed_user_file_means_the_engines_path_with_one_warning(fresh, caplog, content):
    fresh(H200)
    path = write_user(H200, content)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        for _ in range(2):
            for hook in HOOKS:
                assert not any(plugin_decides(hook, k, c, g, SM90)
                               for k in (4, 4096, 7168) for c in (1, 4, 16) for g in (True, False))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
    assert mhc.SGLANG_MHC_PRE_FASTER.sources[SM90] is None  # the packaged file was not used


def test_no_file_for_the_gpu_means_the_engines_path_with_one_warning(fresh, caplog):
    fresh("NVIDIA B200", SM100)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        for hook in HOOKS:
            for key in (4, 4096, 7168):
                assert not plugin_decides(hook, key, 1, True, SM100)
                assert not plugin_decides(hook, key, 1, False, SM100)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NVIDIA B200" in warnings[0] and "dsv4spec tune" in warnings[0]
    assert plugin_decides("mhc_pre", 4096, 1, True, SM90)  # an sm_90 GPU: the sm_90 file


def test_another_devices_user_file_is_not_read(fresh):
    write_user("NVIDIA H100 80GB HBM3", one_hook_file("mhc_post", graph={"4096": [[1, 64]]}))
    fresh(H200)
    assert not plugin_decides("mhc_post", 4096, 16, True, SM90)
    assert mhc.SGLANG_MHC_POST_FASTER.sources[SM90] == tables.PACKAGED_DIR / "NVIDIA_H200.json"
    fresh("NVIDIA H100 80GB HBM3")
    assert plugin_decides("mhc_post", 4096, 16, True, SM90)
    assert plugin_decides("mhc_post", 4096, 64, True, SM90)
    assert not plugin_decides("mhc_post", 4096, 65, True, SM90)


def test_a_user_file_overrides_the_packaged_one_hook_by_hook(fresh):
    path = write_user(H200, one_hook_file("mhc_post", graph={"4096": [[1, 8]], "7168": []}))
    fresh(H200)
    assert plugin_decides("mhc_post", 4096, 8, True, SM90)
    assert not plugin_decides("mhc_post", 7168, 8, True, SM90)
    assert mhc.SGLANG_MHC_POST_FASTER.sources[SM90] == path
    # hooks the user file does not hold keep the packaged tables
    assert plugin_decides("mhc_pre", 4096, 4, True, SM90)
    assert mhc.SGLANG_MHC_PRE_FASTER.sources[SM90] == tables.PACKAGED_DIR / "NVIDIA_H200.json"


def test_a_width_between_measured_widths_gets_the_nearer_smaller_ones_ranges(fresh):
    hook = metadata.PAGE_TABLE
    write_user(H200, one_hook_file(hook, graph={"512": [[1, 64]], "2048": [],
                                                "4096": [[1, 8], [33, 512]]}))
    fresh(H200)
    decide = [(w, r) for w in (256, 511, 512, 1000, 2047, 2048, 3000, 4096, 4097, 8192)
              for r in (1, 8, 9, 33, 64, 512, 513) if plugin_decides(hook, w, r, True, SM90)]
    assert decide == [
        *[(w, r) for w in (512, 1000, 2047) for r in (1, 8, 9, 33, 64)],
        *[(4096, r) for r in (1, 8, 33, 64, 512)]]  # 2048-4095: 2048's (none); 4097+: nothing
    assert not any(plugin_decides(hook, w, 1, False, SM90) for w in (512, 4096))


def test_exact_keys_and_the_cap():
    keyed = {4096: ((1, 16),), 7168: ((1, 64),)}
    assert tables.spans_for(keyed, 4096, "exact") == ((1, 16),)
    assert tables.spans_for(keyed, 5120, "exact") == ()
    assert tables.spans_for(keyed, 5120, "nearer_smaller") == ((1, 16),)
    assert tables.spans_for(keyed, 4095, "nearer_smaller") == ()
    assert tables.spans_for(keyed, 7169, "nearer_smaller") == ()
    assert tables.spans_for({}, 4096, "nearer_smaller") == ()
    entry = {"between_keys": "exact", "max_count": 32, "graph": keyed, "eager": {}}
    assert [c for c in range(1, 80) if tables.served(entry, 7168, c, True)] == list(range(1, 33))
    assert not tables.served(entry, 7168, 1, False)


def test_a_cap_clips_what_the_plugin_reads(fresh):
    write_user(H200, one_hook_file("mhc_post", max_count=20, graph={"4096": [[1, 8], [30, 64]]}))
    fresh(H200)
    assert mhc.SGLANG_MHC_POST_FASTER[SM90]["graph"][4096] == ((1, 8),)
    assert [c for c in range(1, 70) if plugin_decides("mhc_post", 4096, c, True, SM90)] == [
        *range(1, 9)]


def test_a_hand_set_entry_wins_and_reload_reads_again(fresh, monkeypatch):
    fresh(None)
    table = mhc.SGLANG_MHC_POST_FASTER
    assert SM90 in table and SM100 not in table and None not in table
    monkeypatch.setitem(table[SM90]["graph"], 4096, ((1, 16),))
    assert plugin_decides("mhc_post", 4096, 16, True, SM90)
    monkeypatch.setitem(table, SM100, {"graph": {4096: ((1, 4),)}, "eager": {}})
    assert plugin_decides("mhc_post", 4096, 4, True, SM100)
    monkeypatch.undo()
    table.reload()
    assert not plugin_decides("mhc_post", 4096, 16, True, SM90)
    assert not plugin_decides("mhc_post", 4096, 4, True, SM100)


def test_user_dir_and_file_names(monkeypatch, tmp_path):
    monkeypatch.delenv(tables.TABLES_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tables.user_dir() == tmp_path / "dsv4spec" / "tables"
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "t"))
    assert tables.user_dir() == tmp_path / "t"
    assert tables.device_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"
    assert tables.architecture_name((10, 0)) == "sm_100"
    assert tables.device_file_name(H200, "3.8") == "NVIDIA_H200.triton3.8.json"
    assert [p.name for p in tables.candidates(H200, SM90)] == [
        "NVIDIA_H200.triton3.6.json", "NVIDIA_H200.json"] * 2 + [
        "sm_90.triton3.6.json", "sm_90.json"]
    assert tables.candidates(H200, SM90)[0].parent == tmp_path / "t"


def test_a_tables_dir_that_is_not_a_directory_is_named_in_one_warning(monkeypatch, caplog,
                                                                      tmp_path):
    monkeypatch.setattr(tables, "_told_not_a_directory", set())
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/sh\n")
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(passwd))
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        for _ in range(3):
            assert tables.user_dir() == passwd
            tables.candidates(H200, (9, 0))
        monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path))  # a directory, or none yet
        assert tables.user_dir() == tmp_path
        monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "not yet"))
        assert tables.user_dir() == tmp_path / "not yet"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"dsv4spec: the tables directory {tables.TABLES_DIR_ENV}={passwd} is not "
                        f"a directory: no user tables are read from it (the packaged ones are) "
                        f"and `dsv4spec tune` cannot write there"], warnings


def test_the_format_holds_another_engine():
    data = packaged()
    data["engines"]["vllm"] = {"mhc_pre": data["engines"]["sglang"]["mhc_pre"]}
    read = tables.validate(json.loads(tables.dumps(data)))
    assert read["vllm"]["mhc_pre"] == read["sglang"]["mhc_pre"]


def test_the_vllm_plugin_reads_the_same_files(fresh, caplog):
    """vLLM's hooks decide from ``engines.vllm`` of the same chain: the packaged H200 rows, a
    user file's rows where it holds them, and vLLM's kernel for every hook when a file of the
    chain is malformed."""
    fresh(H200)
    assert vllm_hooks.prefers_dsv4spec("hc_head", 256, 7168, True, SM90)
    assert not vllm_hooks.prefers_dsv4spec("hc_head", 64, 4096, True, SM90)  # lost there
    assert vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 4096, 7168, True, SM90)
    assert not vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 33, 7168, True, SM90,
                                           deep_gemm=True)
    assert VLLM_TABLES["hc_head"].sources[SM90] == tables.PACKAGED_DIR / "NVIDIA_H200.json"
    data = packaged()
    data["engines"] = {"vllm": {"hc_head": {**data["engines"]["vllm"]["hc_head"],
                                            "graph": {"7168": [[1, 8]]}}}}
    path = write_user(H200, data)
    fresh(H200)
    assert vllm_hooks.prefers_dsv4spec("hc_head", 8, 7168, True, SM90)
    assert not vllm_hooks.prefers_dsv4spec("hc_head", 9, 7168, True, SM90)
    assert VLLM_TABLES["hc_head"].sources[SM90] == path
    assert vllm_hooks.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90)  # packaged still
    path.write_text("{not json")
    fresh(H200)
    caplog.clear()  # the DeepGEMM step-aside's WARNING above is not the file's
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert not any(vllm_hooks.prefers_dsv4spec(op, 1, 7168, g, SM90)
                       for op in VLLM_TABLES for g in (True, False))
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


def test_stack_of_a_triton_version():
    assert tables.stack_of("3.8.0") == tables.stack_of("3.8.1+git9") == "3.8"
    assert tables.stack_of("3.10.0") == "3.10"
    for bad in ("", "3", "x.y.z", None):
        with pytest.raises(ValueError):
            tables.stack_of(bad)


def test_a_file_without_its_triton_is_malformed():
    data = packaged()
    del data["measured"]["triton"]
    with pytest.raises(ValueError, match="measured.triton"):
        tables.validate(data)


def test_tables_serve_only_under_the_triton_they_were_measured_with(fresh, monkeypatch, caplog):
    """A file measured under another Triton is never read: under 3.9 (no table) every hook gets
    the engine's code and one WARNING names `dsv4spec tune` and the stacks that were measured;
    a user file of 3.9 (what `tune` writes under it) then serves, and the 3.6 file again under
    3.6."""
    monkeypatch.setattr(tables, "running_stack", lambda: "3.9")
    fresh(H200)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert not any(plugin_decides(h, 7168, 1, g, SM90) for h in ("mhc_post", "mhc_pre")
                       for g in (True, False))
        assert not vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 4, 7168, True, SM90)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "under Triton 3.9" in warnings[0]
    assert "dsv4spec tune" in warnings[0] and "NVIDIA_H200.json under Triton 3.6" in warnings[0]
    data = one_hook_file("mhc_post", graph={"7168": [[1, 3]]})
    data["measured"]["triton"] = "3.9.0"
    path = tables.user_dir() / tables.device_file_name(H200, "3.9")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    fresh(H200)
    assert plugin_decides("mhc_post", 7168, 3, True, SM90)
    assert not plugin_decides("mhc_post", 7168, 4, True, SM90)
    assert not plugin_decides("mhc_pre", 7168, 1, True, SM90)  # no 3.9 row for it anywhere
    assert mhc.TABLES["mhc_post"].sources[SM90] == path
    monkeypatch.setattr(tables, "running_stack", lambda: "3.6")
    fresh(H200)  # the 3.9 file is not read under 3.6
    assert plugin_decides("mhc_post", 7168, 1, True, SM90)
    assert not plugin_decides("mhc_post", 7168, 3, True, SM90)


def test_a_file_named_for_one_stack_but_measured_under_another_is_not_read(fresh, monkeypatch):
    data = one_hook_file("mhc_post", graph={"7168": [[1, 3]]})  # measured under 3.6
    path = tables.user_dir() / tables.device_file_name(H200, "3.9")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    monkeypatch.setattr(tables, "running_stack", lambda: "3.9")
    fresh(H200)
    assert not plugin_decides("mhc_post", 7168, 1, True, SM90)


def test_the_running_stack_is_the_imported_tritons(monkeypatch):
    import triton

    monkeypatch.undo()  # the suite pins the stack to the packaged 3.6 tables
    assert tables.running_stack() == tables.stack_of(triton.__version__)


def test_the_triton_38_decisions_read_off_its_h200_run(fresh, monkeypatch):
    """benchmarks/results/tune/NVIDIA_H200.triton3.8.md (2026-12-03): under Triton 3.8 the
    boundary at 9-16 tokens (H = 7168) lost to SGLang's in a graph (13.6 vs 12.6 us at 16),
    which under 3.6 ours won; eagerly ours won everywhere, with the direct launch."""
    monkeypatch.setattr(tables, "running_stack", lambda: "3.8")
    fresh(H200)
    boundary = "mhc_fused_post_pre"
    assert plugin_decides(boundary, 7168, 8, True, SM90)
    assert not any(plugin_decides(boundary, 7168, t, True, SM90) for t in (9, 12, 16))
    assert plugin_decides(boundary, 7168, 17, True, SM90)
    assert all(plugin_decides(boundary, 7168, t, False, SM90) for t in (1, 16, 32))
    assert plugin_decides(boundary, 4096, 16, True, SM90)
    assert vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 8, 7168, True, SM90)
    assert not vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 16, 7168, True, SM90)
    assert vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 16, 7168, False, SM90)
    monkeypatch.setattr(tables, "running_stack", lambda: "3.6")
    fresh(H200)
    assert plugin_decides(boundary, 7168, 16, True, SM90)
    assert vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", 16, 7168, True, SM90)


@pytest.mark.parametrize("version, holds", [
    ("3.8.0", True), ("3.8.1", False), ("3.8.0+gitabc", False), ("3.6.0", True),
    ("3.6.1", False)])
def test_eager_rows_decide_only_where_the_direct_launch_holds(fresh, monkeypatch, caplog,
                                                              version, holds):
    """The eager rows were won with the direct launch, bound only under 3.6.0 and 3.8.0: under a
    patch release of the stack or a local build every eager call steps aside to the engine's
    code (one WARNING per process, whatever the hooks asked), while the graph rows still decide
    as measured."""
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(tables, "running_stack", lambda: tables.stack_of(triton.__version__))
    stack = tables.stack_of(version)
    fresh(H200)
    differ, served = [], {True: 0, False: 0}
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        for hook in HOOKS:
            for in_graph in (True, False):
                for key in (4096, 7168, 2048, 8192):
                    for count in range(1, 70):
                        measured = measured_decides(hook, key, count, in_graph, SM90, stack)
                        decided = plugin_decides(hook, key, count, in_graph, SM90)
                        served[in_graph] += decided
                        if decided != (measured and (in_graph or holds)):
                            differ.append((hook, in_graph, key, count))
        boundary_eager = [vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", t, 7168, False, SM90)
                          for t in (1, 8, 16)]
    assert not differ, f"{len(differ)} decisions differ, e.g. {differ[:5]}"
    assert served[True] and bool(served[False]) == holds
    assert boundary_eager == [holds] * 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if holds:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        assert f"Triton {version} is not a release" in warnings[0]
        assert "engine's own code" in warnings[0] and STACK_FILES[stack] in warnings[0]


def test_eager_rows_measured_without_the_direct_launch_hold(fresh, monkeypatch, caplog):
    """A file `dsv4spec tune` wrote under 3.8.1 timed the dispatcher path: its eager rows hold
    there."""
    import triton

    monkeypatch.setattr(triton, "__version__", "3.8.1")
    monkeypatch.setattr(tables, "running_stack", lambda: "3.8")
    data = one_hook_file("mhc_post", graph={"7168": [[1, 2]]}, eager={"7168": [[1, 3]]})
    data["measured"]["triton"] = "3.8.1"
    path = tables.user_dir() / tables.device_file_name(H200, "3.8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    fresh(H200)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert [plugin_decides("mhc_post", 7168, t, False, SM90) for t in (1, 3, 4)] == [
            True, True, False]
        assert plugin_decides("mhc_post", 7168, 2, True, SM90)
    assert mhc.TABLES["mhc_post"].sources[SM90] == path
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_an_architecture_file_names_what_it_was_derived_from():
    tables.validate(packaged("sm_90.json"))
    faults = []
    data = packaged("sm_90.json")
    del data["derived"]
    faults.append((data, "derived"))
    data = packaged("sm_90.json")
    data["derived"]["margin"] = 0.5
    faults.append((data, "derived"))
    data = packaged("sm_90.json")
    del data["measured"]["sm_count"]
    faults.append((data, "sm_count"))
    data = packaged()
    data["measured"]["sm_count"] = 0
    faults.append((data, "measured.sm_count"))
    data = packaged()
    data["device"] = 7
    faults.append((data, "device"))
    for data, match in faults:
        with pytest.raises(ValueError, match=match):
            tables.validate(data)


def test_a_gpu_of_other_sms_takes_a_table_only_below_the_first_plan_difference(fresh, caplog):
    """The H200's own file on an H200 of 78 SMs (a partitioned one, say): hc_head's split counts
    at H = 7168 follow the SM count from 256 tokens, so its ranges stop at 255; mhc_post's plan
    has no split count and keeps its ranges."""
    fresh(H200, sm_count=78)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert plugin_decides("target_hc_head", 7168, 64, True, SM90)
        assert not plugin_decides("target_hc_head", 7168, 256, True, SM90)
        assert plugin_decides("mhc_post", 7168, 16384, True, SM90)
        assert vllm_hooks.prefers_dsv4spec("mhc_pre", 16, 7168, True, SM90)
        assert not vllm_hooks.prefers_dsv4spec("mhc_pre", 1024, 7168, True, SM90)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # its own file
    fresh(H200, sm_count=H200_SMS)
    assert plugin_decides("target_hc_head", 7168, 256, True, SM90)
    assert vllm_hooks.prefers_dsv4spec("mhc_pre", 1024, 7168, True, SM90)
