"""``dsv4spec tune``: the grid, the ranges written from measured points, the refusal without
CUDA, resume / --force on a stand-in measurer (CPU), and the real run on a GPU."""

import json
import sys

import pytest
import torch
import triton

from dsv4spec import cli
from dsv4spec.bench import tune
from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import hc_head, metadata, mhc

from ..kernels.attention_metadata_support import interpreter_loop_bounds

PLUGIN_TABLES = [*mhc.TABLES.values(), *mhc.DEEPGEMM_TABLES.values(), *metadata.TABLES.values(),
                 hc_head.TARGET_HC_HEAD_FASTER]
DEVICE = "NVIDIA Test GPU"


WIN, CLEAR, NEAR, LOSS = (1.0, 1.5), (1.0, 1.2), (1.0, 1.05), (2.0, 1.0)


def test_a_count_not_measured_is_ours_only_between_two_clear_wins_of_its_segment():
    """One segment (no switch): a count without its own point takes ours only where the nearest
    measured points on both sides won by the carry margin (1.10x in a graph); below the first
    point and above the last nothing is carried, and those counts are listed unmeasured."""
    assert tables.CARRY_MARGIN == {"graph": 1.10, "eager": 1.25}
    assert tune.spans_from_points({4: CLEAR, 64: CLEAR}) == ((4, 64),)
    assert tune.spans_from_points({4: CLEAR, 64: NEAR}) == ((4, 4), (64, 64))
    assert tune.spans_from_points({2: WIN}) == ((2, 2),)
    assert tune.spans_from_points({2: CLEAR, 8: CLEAR}, carry=1.25) == ((2, 2), (8, 8))
    assert tune.spans_from_points({4: NEAR, 16: NEAR}) == ((4, 4), (16, 16))
    assert tune.spans_from_points({1: LOSS, 8: LOSS}) == ()
    assert tune.spans_from_points({}) == ()
    entry = {"points": {"graph": {"4096": [[4, *CLEAR], [16, *CLEAR], [64, *LOSS]]}}}
    assert tune.unmeasured_of(entry, "sglang", tune.PAGE_TABLE) == {"graph": {"4096": [[1, 3]]}}


def test_a_ratio_that_moves_across_a_segment_is_not_carried():
    """vLLM's mhc_post in a graph, 2026-12: ours 1.42x at 64 tokens, 0.91x at 128 (no switch of
    either kernel between): nothing between them is served, and a clear win with a loss beside
    it covers only itself."""
    assert tune.spans_from_points({64: (1.0, 1.42), 128: (4.61, 4.18)}) == ((64, 64),)
    assert tune.spans_from_points({1: WIN, 4: WIN, 16: LOSS, 64: WIN}) == ((1, 4), (64, 64))
    assert tune.spans_from_points({4: WIN, 16: LOSS}) == ((4, 4),)
    assert tune.spans_from_points({1: LOSS, 4: WIN, 16: WIN}) == ((4, 16),)


def test_a_verdict_is_not_carried_across_a_tiling_switch():
    # mhc_post's tiling changes at 3, 9 and 33 tokens: each segment on its own points
    assert tune.spans_from_points({1: WIN, 2: WIN, 16: WIN, 32: WIN, 64: LOSS},
                                  (3, 9, 33)) == ((1, 2), (16, 32))
    assert tune.spans_from_points({4: WIN, 5: WIN, 8: LOSS}, (5,)) == ((4, 5),)
    assert tune.spans_from_points({4: WIN, 5: LOSS, 8: WIN}, (5,)) == ((4, 4), (8, 8))
    assert tune.spans_from_points({3: WIN, 4: WIN}, (2, 3)) == ((3, 4),)  # 1-2: no point
    assert tune.segment_verdicts({4: WIN}, (2, 3))[0] == ((1, 1), None)
    assert tune.unmeasured_of({"points": {"graph": {"7168": [[4, *WIN]]}}}, "sglang",
                              "mhc_post") == {"graph": {"7168": [[1, 3]]}}
    # a cap clips the counts listed: none above it
    assert tune.unmeasured_of({"max_count": 2, "points": {"graph": {"7168": [[4, *WIN]]}}},
                              "sglang", "mhc_post") == {"graph": {"7168": [[1, 2]]}}
    assert tune.unmeasured_of({"points": {"graph": {"7168": [[1, *WIN], [2, *WIN],
                                                              [3, *WIN], [4, *WIN]]}}},
                              "sglang", "mhc_post") == {}


def test_the_engines_kernel_switches_are_segment_switches_too():
    """SGLang's fused boundary widens its FMA tile from 8 tokens: a win at 4 does not reach 8,
    a win at 8 not 7 (ours switches at 5 and 9 there)."""
    from dsv4spec.bench import sglang_mhc

    assert tune.plans.engine_tiling_switches("sglang", "mhc_fused_post_pre", 64) == (8, 33)
    assert sglang_mhc.FUSED_FMA_MAX_TOKENS + 1 in tune.plans.ENGINE_TILING_SWITCHES[
        ("sglang", "mhc_fused_post_pre")]
    assert (sglang_mhc.PRE_SPLITK_MAX_TOKENS + 1,) == tune.plans.ENGINE_TILING_SWITCHES[
        ("sglang", "mhc_pre")]
    assert tune.plans.segment_switches("sglang", "mhc_fused_post_pre", 7168, 32) == (
        5, 8, 9, 17)
    assert tune.plans.segments((5, 8, 9, 17), 20) == [(1, 4), (5, 7), (8, 8), (9, 16),
                                                      (17, 20)]


@pytest.mark.parametrize("engine", tune.ENGINES)
def test_the_full_grid_measures_both_sides_of_every_planner_switch(engine):
    for hook, g in tune.ENGINE_GRIDS[engine].items():
        points = g.points(False)
        top = max(c for _, c in points)
        for key in g.keys:
            counts = {c for k, c in points if k == key}
            switches = tune.plans.segment_switches(engine, hook, key, top)
            assert set(tune.plans.tiling_switches(engine, hook, key, top)) <= set(switches)
            for s in switches:
                assert {s - 1, s} <= counts, (engine, hook, key, s)
        assert set(g.points(True)) == {(k, c) for k in g.quick_keys for c in g.quick_counts}
    vllm = tune.VLLM_GRIDS
    assert {(7168, 511), (7168, 512)} <= set(vllm["mhc_fused_post_pre"].points(False))  # token rows
    assert {(4096, 127), (4096, 128)} <= set(vllm["mhc_pre"].points(False))  # tensor cores
    assert {(4096, 447), (4096, 448)} <= set(tune.GRIDS["target_hc_head"].points(False))


def test_the_packaged_tables_are_what_derive_writes():
    """Each packaged device file's ranges are its points by tune's rule, and the architecture
    file beside it is derived from those points (ours where it won by 1.25x or more): `dsv4spec
    tune --derive` on the packaged device files changes nothing."""
    devices = sorted(p for p in tables.PACKAGED_DIR.glob("*.json") if not p.name.startswith("sm_"))
    architecture_files = sorted(p for p in tables.PACKAGED_DIR.glob("sm_*.json"))
    derived = []
    for path in devices:
        data = json.loads(path.read_text())
        assert tune.respanned(data) == data, f"{path.name}: ranges not derived from its points"
        if not path.name.startswith("NVIDIA_H200"):  # the architecture files are the H200's
            continue
        target = tables.PACKAGED_DIR / tune.architecture_file_name(path.name, data)
        assert json.loads(target.read_text()) == tune.architecture_file(data, path.name), (
            f"{target.name} is not what {path.name} derives")
        derived.append(target)
    assert sorted(derived) == architecture_files  # one device file each, none underived


def test_an_architecture_file_serves_only_clear_wins():
    data = {"format": 1, "device": DEVICE, "architecture": "sm_90",
            "measured": {"triton": "3.6.0", "sm_count": 132},
            "engines": {"sglang": {"mhc_post": tune.entry_from_points(tune.GRIDS["mhc_post"], {
                7168: {16: {"graph": [1.0, 1.2], "eager": [1.0, 1.3]},
                       32: {"graph": [1.0, 2.0], "eager": [1.0, 1.25]}}})}}}
    arch = tune.architecture_file(data, "NVIDIA_Test_GPU.json")
    entry = tables.validate(arch)["sglang"]["mhc_post"]
    # eager: both won by the margin, which is also eager's carry margin: the counts between
    # them (16-32; 9-15 lie below the segment's first point)
    assert entry["graph"] == {7168: ((32, 32),)} and entry["eager"] == {7168: ((16, 32),)}
    assert arch["device"] is None and arch["derived"] == {
        "device": DEVICE, "file": "NVIDIA_Test_GPU.json", "margin": 1.25}
    assert tables.validate(data)["sglang"]["mhc_post"]["graph"] == {7168: ((16, 32),)}
    with pytest.raises(ValueError, match="not a device file"):
        tune.architecture_file(arch, "sm_90.json")
    del data["measured"]["sm_count"]
    with pytest.raises(ValueError, match="sm_count"):
        tune.architecture_file(data, "NVIDIA_Test_GPU.json")


def test_derive_rewrites_the_ranges_and_writes_the_architecture_file(tmp_path, capsys):
    shipped = tables.PACKAGED_DIR / "NVIDIA_H200.triton3.8.json"
    path = tmp_path / shipped.name
    data = json.loads(shipped.read_text())
    data["engines"]["sglang"]["mhc_post"]["graph"] = {"7168": [[1, 16384]]}  # extended
    path.write_text(tables.dumps(data))
    assert cli.main(["tune", "--derive", str(path)]) == 0
    assert capsys.readouterr().out.split() == ["wrote", str(path), "wrote",
                                               str(tmp_path / "sm_90.triton3.8.json")]
    assert path.read_text() == shipped.read_text()
    assert (tmp_path / "sm_90.triton3.8.json").read_text() == (
        tables.PACKAGED_DIR / "sm_90.triton3.8.json").read_text()
    # an architecture file derives nothing; two device files of one stack one file
    assert cli.main(["tune", "--derive", str(tmp_path / "sm_90.triton3.8.json")]) == (
        cli.EXIT_USAGE)
    assert "not a device file" in capsys.readouterr().err
    other = tmp_path / "NVIDIA_H100.triton3.8.json"
    other.write_text(tables.dumps({**data, "device": "NVIDIA H100"}))
    before = tables.dumps(data)  # extended ranges again: a failed run rewrites none
    path.write_text(before)
    assert cli.main(["tune", "--derive", str(path), str(other)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "both derive sm_90.triton3.8.json" in err and "nothing was written" in err
    assert path.read_text() == before


def test_bisection_refines_only_where_the_winner_changes():
    won = {1: (True,), 16: (True,), 64: (False,), 256: (False,)}
    depth = {}
    assert tune.bisections(won, depth) == [32]
    won[32] = (True,)
    assert tune.bisections(won, depth) == [45]
    won[45] = (False,)
    assert tune.bisections(won, depth) == [38]
    won[38] = (True,)
    assert tune.bisections(won, depth) == []  # three bisections deep
    assert tune.bisections({4: (True, False), 5: (False, False)}, {}) == []  # adjacent
    assert tune.bisections({4: (True, True), 8: (True, False)}, {}) == [6]  # eager flips


def test_the_grid_spans_what_a_deployment_reaches():
    g = tune.GRIDS
    assert set(g) == {*mhc.TABLES, *metadata.TABLES, "target_hc_head", "dspark_hc_head"}
    shipped = tables.read_file(tables.PACKAGED_DIR / "NVIDIA_H200.json")["sglang"]
    for hook, grid in g.items():  # tune writes the keys, rules and caps the packaged file has
        entry = shipped[hook]
        assert (grid.key, grid.count, grid.between_keys, grid.max_count) == (
            entry["key"], entry["count"], entry["between_keys"], entry["max_count"]), hook
        assert not any(s for m in tables.MODES if m not in grid.modes
                       for s in entry[m].values()), hook
    widths = g[metadata.PAGE_TABLE].keys
    assert min(widths) == 64 and max(widths) == 8192
    assert {512, 2048, 4096, 8192} <= set(widths)  # 128K/256, 128K/64, 1M/256, 1M/128 or 2M/256
    assert g[metadata.EXPAND].keys == tuple(range(2, 9))
    assert max(g[metadata.EXPAND].counts) == tune.MAX_BS == 512
    assert max(g[metadata.PAGE_TABLE].counts) == tune.MAX_BS * 4
    for hook in mhc.TABLES:
        assert g[hook].keys == (4096, 7168)
        assert g[hook].max_count == mhc.MEASURED_MAX_TOKENS[hook]
        assert all(c <= (g[hook].max_count or c) for _, c in g[hook].points(False))
    for hook in (metadata.PAGE_TABLE, metadata.COMPRESSED, metadata.COMPRESSION):
        assert g[hook].modes == ("graph",)  # eager builds include prefill: never ours
    lines, quick = tune.plan(list(g), quick=True)
    assert len(lines) == len(g) and quick < 150
    _, full = tune.plan(list(g), quick=False)
    assert full > 5 * quick


@pytest.mark.parametrize("engine", tune.ENGINES)
def test_the_plan_splits_the_grid_into_runs_within_a_call(engine, capsys):
    hooks = list(tune.ENGINE_GRIDS[engine])
    runs = tune.calls(hooks, False, engine)
    assert [h for run in runs for h in run] == hooks
    for run in runs:
        seconds = tune.START_SECONDS + sum(
            tune.hook_seconds(tune.ENGINE_GRIDS[engine][h], False)[1] for h in run)
        assert seconds <= tune.CALL_SECONDS or len(run) == 1, run
    assert tune.calls(hooks, False, engine, limit=1e9) == [hooks]
    with pytest.raises(ValueError, match="limit"):
        tune.calls(hooks, False, engine, limit=10)
    assert cli.main(["tune", "--engine", engine, "--plan"]) == 0
    out = capsys.readouterr().out
    points = sum(len(g.points(False)) for g in tune.ENGINE_GRIDS[engine].values())
    assert f"in all {points} points" in out
    assert out.count(f"dsv4spec tune --engine {engine} --hooks ") == len(runs)


def test_written_entries_serve_ours_exactly_at_the_points_it_won():
    g = tune.GRIDS["mhc_post"]
    points = {4096: {1: {"graph": [1.0, 2.0], "eager": [5.0, 4.0]},
                     16: {"graph": [1.0, 2.0], "eager": [3.0, 4.0]},
                     64: {"graph": [3.0, 2.0], "eager": [3.0, 4.0]}},
              7168: {1: {"graph": [2.0, 2.0], "eager": [1.0, 4.0]}}}
    entry = tune.entry_from_points(g, points)
    read = tables.validate_hook(json.loads(tables.dumps(entry)), "entry")
    for key, by_count in points.items():
        for count, result in by_count.items():
            for mode in ("graph", "eager"):
                ours, engine = result[mode]
                assert tables.served(read, key, count, mode == "graph") == (ours < engine)
    # mhc_post's tiling changes at 3, 9, 33 and 129 tokens: a win covers its own side only
    assert tune.plans.tiling_switches("sglang", "mhc_post", 4096, 64) == (3, 9, 33)
    assert read["graph"] == {4096: ((1, 1), (16, 16)), 7168: ()}  # 7168: a tie is SGLang's
    assert read["eager"] == {4096: ((16, 16), (64, 64)), 7168: ((1, 1),)}
    # 3-8 (no point) and the counts of each segment beyond its one point: listed
    assert read["unmeasured"]["graph"] == {4096: ((2, 15), (17, 63))}
    assert read["measured_against"] == "tilelang, DeepGEMM off"
    assert read["points"]["graph"]["4096"][0] == [1, 1.0, 2.0]


def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "tables"
    assert cli.main(["tune", "--quick", "--out-dir", str(out)]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "needs a CUDA GPU" in captured.err
    assert not out.exists() and list(tmp_path.iterdir()) == []


class FakeMeasure:
    """Stands in for the GPU: ours wins in a graph below 20 counts, eagerly never; raises
    ``KeyboardInterrupt`` at call number ``stop_at`` (an interrupted run)."""

    calls: list = []
    stop_at: int | None = None

    def prepare(self, groups):
        pass

    def peer_version(self, group):
        return "0.33.0"

    def point(self, g, key, count, quick):
        if FakeMeasure.stop_at is not None and len(FakeMeasure.calls) == FakeMeasure.stop_at:
            raise KeyboardInterrupt
        FakeMeasure.calls.append((g.hook, key, count))
        return {m: ([1.0, 2.0] if count < 20 else [3.0, 2.0]) if m == "graph" else [3.0, 2.0]
                for m in g.modes}


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(tune, "environment", lambda: {
        "device": DEVICE, "dsv4spec": "0", "torch": "t", "triton": "3.6.0", "cuda": "13",
        "sm_count": 132})
    monkeypatch.setattr(tune, "Measure", FakeMeasure)
    monkeypatch.setattr(tune, "_sglang_version", lambda: "0.5.23")
    FakeMeasure.calls, FakeMeasure.stop_at = [], None
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path))
    yield tmp_path / tables.device_file_name(DEVICE, "3.6")
    tables.clear_cache()
    for table in PLUGIN_TABLES:
        table.reload()


def test_an_interrupted_run_resumes_and_the_plugins_read_its_file(fake_gpu, monkeypatch):
    path, args = fake_gpu, ["tune", "--hooks", "mhc_post", metadata.EXPAND]
    FakeMeasure.stop_at = 5
    with pytest.raises(KeyboardInterrupt):
        tune.main(cli.build_parser(args).parse_args(args))
    assert not path.exists()
    first = list(FakeMeasure.calls)
    FakeMeasure.stop_at = None
    assert cli.main(args) == 0
    assert len(FakeMeasure.calls) > len(first) and FakeMeasure.calls[:5] == first
    again = FakeMeasure.calls[5:]
    assert not set(first) & set(again), "measured points kept, not measured again"
    assert not path.with_name(path.name + ".partial").exists()
    data = json.loads(path.read_text())
    assert set(data["engines"]["sglang"]) == {"mhc_post", metadata.EXPAND}
    assert data["measured"]["sm_count"] == 132
    post = tables.validate(data)["sglang"]["mhc_post"]
    # coarse 1, 4, 16, 64 ... and both sides of mhc_post's planner switches (2-3, 8-9, 32-33,
    # 128-129), bisected between 16 (won) and 32 (lost): 23, 19 (won), 21; 20, between 19 (won)
    # and 21 (lost), is not carried
    assert post["graph"][7168] == ((1, 19),) and post["eager"][7168] == ()
    post_counts = {c for h, k, c in FakeMeasure.calls if h == "mhc_post" and k == 7168}
    assert post_counts >= {2, 3, 8, 9, 19, 21, 23, 32, 33, 128, 129}
    # the plugins prefer the user file for this device and decide from it
    tables.clear_cache()
    monkeypatch.setattr(tables, "_device_name", lambda arch: DEVICE)
    monkeypatch.setattr(tables, "_device_sm_count", lambda arch: 132)
    for table in PLUGIN_TABLES:
        table.reload()
    assert mhc.prefers_dsv4spec("mhc_post", 19, 7168, True, (9, 0))
    assert not any(mhc.prefers_dsv4spec("mhc_post", c, 7168, True, (9, 0)) for c in (20, 21))
    assert mhc.SGLANG_MHC_POST_FASTER.sources[(9, 0)] == path
    assert metadata.prefers_dsv4spec(metadata.EXPAND, 16, 3, True, (9, 0))
    assert not metadata.prefers_dsv4spec(metadata.EXPAND, 16, 3, False, (9, 0))
    # hooks not tuned keep the packaged sm_90 tables
    assert mhc.prefers_dsv4spec("mhc_pre", 4, 4096, True, (9, 0))
    assert mhc.SGLANG_MHC_PRE_FASTER.sources[(9, 0)] == tables.PACKAGED_DIR / "sm_90.json"


def test_an_existing_file_is_kept_without_force(fake_gpu, capsys):
    path = fake_gpu
    assert cli.main(["tune", "--quick", "--hooks", "mhc_post"]) == 0
    before = path.read_text()
    capsys.readouterr()
    assert cli.main(["tune", "--quick", "--hooks", "mhc_post"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and path.read_text() == before
    # another hook is added beside it; --force measures mhc_post again, keeping the other
    assert cli.main(["tune", "--quick", "--hooks", "mhc_pre"]) == 0
    calls = len(FakeMeasure.calls)
    assert cli.main(["tune", "--quick", "--force", "--hooks", "mhc_post"]) == 0
    assert len(FakeMeasure.calls) > calls
    assert set(json.loads(path.read_text())["engines"]["sglang"]) == {"mhc_post", "mhc_pre"}


def test_a_malformed_existing_file_is_replaced_only_with_force(fake_gpu, capsys):
    path = fake_gpu
    path.write_text("{oops")
    assert cli.main(["tune", "--quick", "--hooks", "mhc_post"]) == cli.EXIT_USAGE
    assert path.read_text() == "{oops" and not FakeMeasure.calls
    assert cli.main(["tune", "--quick", "--force", "--hooks", "mhc_post"]) == 0
    tables.read_file(path)


@pytest.mark.gpu
def test_gpu_tune_quick_end_to_end_and_the_plugins_load_its_file(tmp_path, monkeypatch):
    from dsv4spec.integrations.sglang.source import sglang_root

    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed (or DSV4SPEC_SGLANG_ROOT unset)")
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path))
    stack = tables.stack_of(triton.__version__)
    monkeypatch.setattr(tables, "running_stack", lambda: stack)  # the suite pins 3.6
    assert cli.main(["tune", "--quick"]) == 0
    path = tmp_path / tables.device_file_name(torch.cuda.get_device_name(), stack)
    engines = tables.read_file(path)
    assert set(engines["sglang"]) == set(tune.GRIDS)
    architecture = tuple(torch.cuda.get_device_capability())
    tables.clear_cache()
    try:
        for table in PLUGIN_TABLES:
            table.reload()
        for hook, entry in engines["sglang"].items():
            g = tune.GRIDS[hook]
            for key, count in g.points(quick=True):
                for mode in g.modes:
                    expected = tables.served(entry, key, count, mode == "graph")
                    if hook in mhc.TABLES:
                        got = mhc.prefers_dsv4spec(hook, count, key, mode == "graph",
                                                   architecture)
                    elif hook == "target_hc_head":
                        got = hc_head.target_prefers_dsv4spec(count, key, mode == "graph",
                                                              architecture)
                    else:
                        got = metadata.prefers_dsv4spec(hook, count, key, mode == "graph",
                                                        architecture)
                    assert got == expected, (hook, key, count, mode)
        assert all(t.sources[architecture] == path for t in PLUGIN_TABLES)
    finally:
        tables.clear_cache()
        for table in PLUGIN_TABLES:
            table.reload()


def test_compare_lists_other_winners_and_marks_near_ties(tmp_path, capsys):
    g = tune.GRIDS["mhc_post"]
    a = {7168: {1: {"graph": [1.0, 2.0], "eager": [1.0, 2.0]},
                16: {"graph": [1.00, 1.02], "eager": [1.0, 2.0]},
                64: {"graph": [3.0, 2.0], "eager": [1.0, 2.0]}}}
    b = {7168: {1: {"graph": [1.0, 2.0], "eager": [3.0, 2.0]},
                16: {"graph": [1.02, 1.00], "eager": [1.0, 2.0]},
                256: {"graph": [1.0, 2.0], "eager": [1.0, 2.0]}}}
    paths = []
    for name, points in (("a", a), ("b", b)):
        data = json.loads((tables.PACKAGED_DIR / "sm_90.json").read_text())
        data["engines"] = {"sglang": {"mhc_post": tune.entry_from_points(g, points)}}
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(tables.dumps(data))
    assert cli.main(["tune", "--compare", *map(str, paths)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("4 points in both files, 2 with another winner, 1 of them beyond a 3% "
                       "near-tie")
    assert sorted(out[:-1]) == [
        "sglang mhc_post eager hidden_size=7168 num_tokens=1: ours/engine 1.00/2.00 vs "
        "3.00/2.00 us",
        "sglang mhc_post graph hidden_size=7168 num_tokens=16: ours/engine 1.00/1.02 vs "
        "1.02/1.00 us (near-tie)"]
    assert tune.served_share(tables.read_file(paths[0])["sglang"]["mhc_post"], g.modes) == {
        "graph": 2 / 3, "eager": 1.0}


@pytest.mark.parametrize("hook, key, count, quick, shapes", [
    (metadata.EXPAND, 4, 2, True, 1),
    (metadata.PAGE_TABLE, 64, 4, True, 1),  # verify, bs 1, one context
    (metadata.PAGE_TABLE, 64, 4, False, 4),  # verify bs 1 and decode bs 4, two contexts each
    (metadata.COMPRESSED, 64, 4, True, 1),
    (metadata.COMPRESSION, 64, 4, True, 1),
    ("target_hc_head", 256, 2, True, 1),
])
def test_each_measurer_checks_sglang_against_ours_before_timing(monkeypatch, hook, key, count,
                                                                quick, shapes):
    """The measuring code on CPU (Triton's interpreter, SGLang's own source): the benchmarks'
    inputs, providers and checks as the GPU run calls them, the timing stubbed out."""
    from dsv4spec.integrations.sglang.source import sglang_root

    if torch.cuda.is_available():
        pytest.skip("the CPU path of the measurers; on a GPU the end-to-end test runs them")
    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed (`make setup` installs sglang==0.5.23)")
    timed = []

    def fake_timing(fns, modes, quick):
        outs = {name: fn() for name, fn in fns.items()}  # both providers run
        timed.append(sorted(outs))
        return {m: [1.0, 2.0] for m in modes}

    monkeypatch.setattr(tune, "_graph_and_eager", fake_timing)
    g = tune.GRIDS[hook]
    saved = {n for n in sys.modules if n == "sglang" or n.startswith("sglang.")}
    try:
        with interpreter_loop_bounds():
            result = tune.Measure("cpu").point(g, key, count, quick=quick)
    finally:  # the benchmark's stand-in SGLang packages stay out of other tests' way
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            if name not in saved:
                del sys.modules[name]
    assert result == {m: [1.0, 2.0] for m in g.modes}
    assert timed == [["engine", "ours"]] * shapes


def test_the_mhc_measurer_waits_for_the_gpu_once_then_times(monkeypatch):
    """The mHC measurer as the GPU run calls it (a CUDA device), on CPU: SGLang's TileLang
    kernels and ours replaced by the torch reference, the inputs made on the CPU, the waits and
    the timing recorded. It synchronizes once, after both checked calls, before timing."""
    from types import SimpleNamespace

    from dsv4spec.bench import mhc as bench_mhc

    synced, emptied, timed = [], [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    make_inputs = bench_mhc.make_inputs
    monkeypatch.setattr(bench_mhc, "make_inputs",
                        lambda T, H, seed, device: make_inputs(T, H, seed, device="cpu"))

    def reference(residual, fn, scale, base, norm_weight):
        return bench_mhc.torch_pre(residual, {"fn": fn, "scale": scale, "base": base,
                                              "norm_weight": norm_weight}, True)

    def sglang_mhc_pre(residual, fn, scale, base, *mix, norm_weight, norm_eps):
        return reference(residual, fn, scale, base, norm_weight)

    def ours_mhc_pre(residual, fn, hc_scale, hc_base, norm_weight, norm_eps=None):
        return reference(residual, fn, hc_scale, hc_base, norm_weight)

    def fake_timing(fns, modes, quick):
        timed.append((sorted(fns), len(synced)))
        return {m: [1.0, 2.0] for m in modes}

    monkeypatch.setattr(tune, "_graph_and_eager", fake_timing)
    measure = tune.Measure("cuda")
    measure._loaded["mhc"] = (SimpleNamespace(mhc_pre=sglang_mhc_pre), {"pre": ours_mhc_pre})
    g = tune.GRIDS["mhc_pre"]
    assert measure.point(g, 64, 2, quick=True) == {m: [1.0, 2.0] for m in g.modes}
    assert synced == ["cuda"] and timed == [(["engine", "ours"], 1)] and emptied == [1]


def test_a_failed_measurement_names_the_hook_and_the_point(fake_gpu, monkeypatch, capsys):
    def point(self, g, key, count, quick):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(FakeMeasure, "point", point)
    assert cli.main(["tune", "--quick", "--hooks", "mhc_pre"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ("measuring mhc_pre at hidden_size=7168, num_tokens=1: RecursionError: maximum "
            "recursion depth exceeded") in err
    assert not fake_gpu.exists()


@pytest.mark.parametrize("hook", [metadata.PAGE_TABLE, metadata.COMPRESSED, metadata.COMPRESSION])
def test_every_count_a_bisection_reaches_has_a_shape_to_measure(hook):
    """Above the largest decode batch only verify batches (4 rows a request) hold the rows, so a
    bisection's middle there is rounded down to a whole verify batch (609 rows had none)."""
    g = tune.GRIDS[hook]
    counts = sorted(g.counts)
    for a, b in zip(counts, counts[1:]):
        for mid in range(a + 1, b):
            count = g.measurable(mid)
            assert a <= count < b
            assert tune.metadata_shapes(count, quick=False), (mid, count)
    assert g.measurable(609) == 608 and g.measurable(512) == 512 and g.measurable(7) == 7
    assert tune.metadata_shapes(609, quick=False) == []
    assert tune.GRIDS["mhc_post"].measurable(609) == 609


def test_report_shows_what_each_hook_serves_and_every_point(capsys):
    path = tables.PACKAGED_DIR / "NVIDIA_H200.json"
    assert cli.main(["tune", "--report", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    entry = data["engines"]["sglang"]["mhc_pre"]
    share = tune.served_share(entry, ("graph",))["graph"]
    gaps = entry.get("unmeasured", {}).get("graph")
    assert f"| sglang | mhc_pre | hidden_size | graph | {tune._describe(entry['graph'])} | " \
           f"{share:.0%} | {tune._describe(gaps) if gaps else '-'} | tilelang, DeepGEMM off |" \
           in out
    assert "| sglang | build_page_table_positions_triton | page_table_width | eager | " \
           "engine's always | - | - | triton |" in out
    assert "| sglang | mhc_fused_post_pre | hidden_size | graph | {4096: 1-4 8-8 16-16 32-32; " \
           "7168: 1-4 8-8 16-16 32-32} | 100% | {4096: 5-7 9-15 17-31; 7168: 5-7 9-15 17-31} | " \
           "tilelang, DeepGEMM off |" in out
    points = sum(len(rows) for hooks in data["engines"].values() for e in hooks.values()
                 for keyed in e["points"].values() for rows in keyed.values())
    assert "| vllm | hc_head | hidden_size | graph |" in out
    assert out.count(" | ours |") + out.count(" | engine |") == points


@pytest.mark.parametrize("content,says", [
    (None, "cannot read {path}: No such file or directory"),
    ("notes, not JSON\n", "{path} is not a tables file: Expecting value"),
    ("[1, 2]", "{path} is not a tables file: expected a JSON object"),
    ('{"format": 1}', "{path} is not a tables file: missing fields"),
    (b"\xff\xfe binary", "{path} is not a tables file: 'utf-8' codec can't decode"),
])
def test_a_report_or_compare_of_anything_but_a_tables_file_is_a_bad_argument(tmp_path, capsys,
                                                                              content, says):
    path = tmp_path / "table.json"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    good = str(tables.PACKAGED_DIR / "sm_90.json")
    for argv in (["--report", str(path)], ["--compare", str(path), good],
                 ["--compare", good, str(path)]):
        assert cli.main(["tune", *argv]) == cli.EXIT_USAGE, argv
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1, out
        assert out.err.startswith(f"dsv4spec tune: error: argument {argv[0]}: "
                                  f"{says.format(path=path)}"), out.err


def test_vllm_hooks_are_tuned_beside_vllms_kernels_into_the_same_file(fake_gpu, monkeypatch):
    from dsv4spec.integrations.vllm import mhc as vllm_hooks
    from dsv4spec.integrations.vllm.tables import TABLES as VLLM_TABLES

    path = fake_gpu
    assert cli.main(["tune", "--quick", "--hooks", "mhc_post"]) == 0  # SGLang's first
    assert cli.main(["tune", "--engine", "vllm", "--hooks", "hc_head", "mhc_post"]) == 0
    data = json.loads(path.read_text())
    assert set(data["engines"]["sglang"]) == {"mhc_post"}  # kept
    assert set(data["engines"]["vllm"]) == {"hc_head", "mhc_post"}
    assert data["measured"]["sglang"] == "0.5.23" and data["measured"]["vllm"] == "0.33.0"
    vllm_calls = [c for c in FakeMeasure.calls if c[0] == "hc_head"]
    # hc_head's tiling changes at 17 tokens: bisected between 17 (won) and 32 (lost)
    assert {k for _, k, _ in vllm_calls} == {4096, 7168} and {16, 17, 18, 20, 23, 32} <= {
        c for _, _, c in vllm_calls}
    tables.clear_cache()
    monkeypatch.setattr(tables, "_device_name", lambda arch: DEVICE)
    monkeypatch.setattr(tables, "_device_sm_count", lambda arch: 132)
    for table in VLLM_TABLES.values():
        table.reload()
    try:
        assert vllm_hooks.prefers_dsv4spec("hc_head", 18, 7168, True, (9, 0))
        # 19: between 18 (won) and 20 (lost), nothing carried
        assert not vllm_hooks.prefers_dsv4spec("hc_head", 19, 7168, True, (9, 0))
        assert not vllm_hooks.prefers_dsv4spec("hc_head", 20, 7168, True, (9, 0))
        assert not vllm_hooks.prefers_dsv4spec("hc_head", 1, 7168, False, (9, 0))
        assert VLLM_TABLES["hc_head"].sources[(9, 0)] == path
        # a vLLM hook the user file lacks keeps the packaged rows
        assert vllm_hooks.prefers_dsv4spec("mhc_pre", 1, 7168, True, (9, 0))
    finally:
        tables.clear_cache()
        for table in VLLM_TABLES.values():
            table.reload()


def test_rows_measured_against_deepgemm_go_to_their_own_file_and_decide_where_it_runs(
        fake_gpu, monkeypatch):
    """With DeepGEMM running, mhc_pre's rows (timed against DeepGEMM's GEMM) go to the
    ``.deepgemm`` file and mhc_post's (no GEMM of DeepGEMM) to the plain one; the plugin reads
    the former only where SGLang runs DeepGEMM, and the plain rows (here the packaged sm_90 ones)
    where it does not."""
    import types

    from dsv4spec.bench import deepgemm

    fake = types.ModuleType("deep_gemm")
    fake.__version__ = "2.8.1"
    monkeypatch.setattr(deepgemm, "resolve", lambda choice, engine="sglang": fake)
    plain = fake_gpu
    on = plain.with_name(tables.device_file_name(DEVICE, "3.6", deepgemm=True))
    assert on.name == "NVIDIA_Test_GPU.deepgemm.triton3.6.json"
    assert cli.main(["tune", "--quick", "--hooks", "mhc_pre", "mhc_post", "--deepgemm",
                     "on"]) == 0
    on_rows = tables.validate(json.loads(on.read_text()))["sglang"]
    assert set(on_rows) == {"mhc_pre"} and on_rows["mhc_pre"]["measured_against"] == "deepgemm"
    assert set(tables.validate(json.loads(plain.read_text()))["sglang"]) == {"mhc_post"}
    # a second run refuses to measure mhc_pre again into the .deepgemm file without --force
    assert cli.main(["tune", "--quick", "--hooks", "mhc_pre", "--deepgemm", "on"]) == 2
    tables.clear_cache()
    monkeypatch.setattr(tables, "_device_name", lambda arch: DEVICE)
    monkeypatch.setattr(tables, "_device_sm_count", lambda arch: 132)
    for table in PLUGIN_TABLES:
        table.reload()
    # the stand-in won in a graph below 20 tokens only; quick grid: 1, 4, 16, 64, ...
    assert mhc.prefers_dsv4spec("mhc_pre", 16, 7168, True, (9, 0), deep_gemm=True)
    assert not mhc.prefers_dsv4spec("mhc_pre", 16, 7168, False, (9, 0), deep_gemm=True)
    assert mhc.DEEPGEMM_TABLES["mhc_pre"].sources[(9, 0)] == on
    # DeepGEMM off: the plain chain (the packaged sm_90 rows, measured against TileLang)
    assert mhc.prefers_dsv4spec("mhc_pre", 4, 4096, True, (9, 0), deep_gemm=False)
    assert mhc.SGLANG_MHC_PRE_FASTER.sources[(9, 0)] == tables.PACKAGED_DIR / "sm_90.json"
    # a hook with no .deepgemm row reads its plain rows with DeepGEMM on too
    assert mhc.prefers_dsv4spec("mhc_post", 16, 7168, True, (9, 0), deep_gemm=True)
    assert mhc.SGLANG_MHC_POST_FASTER.sources[(9, 0)] == plain


def test_a_hook_of_the_other_engine_is_refused_in_one_line(fake_gpu, capsys):
    assert cli.main(["tune", "--engine", "vllm", "--hooks", "target_hc_head"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vllm has no hook target_hc_head" in err
    assert not fake_gpu.exists() and not FakeMeasure.calls


def test_the_vllm_measurer_times_bench_vllms_checked_measurement(monkeypatch):
    from dsv4spec.bench import vllm_plugin

    seen = []

    def fake_measure(peer, op, H, T, seed):
        seen.append((peer, op, H, T))
        return {"hook_graph_us": 1.0, "vllm_graph_us": 2.0, "hook_eager_us": 3.0,
                "vllm_eager_us": 4.0}

    monkeypatch.setattr(vllm_plugin, "measure", fake_measure)
    measure = tune.Measure(device="cpu")
    measure._loaded["vllm"] = peer = object()
    g = tune.VLLM_GRIDS["mhc_fused_post_pre"]
    assert measure.point(g, 7168, 16, quick=False) == {"graph": [1.0, 2.0], "eager": [3.0, 4.0]}
    assert seen == [(peer, "mhc_fused_post_pre", 7168, 16)]


@pytest.mark.parametrize("content", ["{not json", '{"format": 1}'])
def test_derive_on_a_bad_file_names_the_option_and_the_file_in_one_line(tmp_path, capsys,
                                                                         content):
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text(content)
    assert cli.main(["tune", "--derive", str(path)]) == tune.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--derive {path}: not a readable tables file" in err
    assert "nothing was written" in err and path.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NVIDIA_H200.json"]


def test_derive_into_a_read_only_folder_says_which_file_it_could_not_write(tmp_path, capsys,
                                                                          monkeypatch):
    """A read-only target (``[Errno 30]``): one line naming the option, the file and what was
    written before it."""
    path = tmp_path / "NVIDIA_H200.json"
    path.write_text((tables.PACKAGED_DIR / "NVIDIA_H200.json").read_text())
    write = tune._write_json

    def read_only_for_the_architecture_file(target, data):
        if target.name.startswith("sm_90"):
            raise OSError(30, "Read-only file system", str(target))
        write(target, data)

    monkeypatch.setattr(tune, "_write_json", read_only_for_the_architecture_file)
    assert cli.main(["tune", "--derive", str(path)]) == tune.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (f"dsv4spec tune: error: --derive: cannot write {tmp_path / 'sm_90.json'} "
                   f"(Read-only file system); wrote {path} before it\n")
