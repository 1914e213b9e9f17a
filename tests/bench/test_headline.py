"""The README's headline table and ``benchmarks/results/headline/`` are what
``dsv4spec.bench.headline`` computes from the committed result files and the packaged tables,
and its sums follow the tables' decisions (a table that serves nothing saves nothing)."""

import json

import pytest

from dsv4spec.bench import headline
from dsv4spec.integrations import tables


@pytest.fixture(autouse=True)
def _packaged_tables_only(monkeypatch, tmp_path):
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "no-user-tables"))
    tables.clear_cache()


def test_the_readme_and_the_results_files_hold_what_the_generator_computes():
    stale = [str(path.relative_to(headline.ROOT)) for path, content in headline.outputs().items()
             if not path.is_file() or path.read_text() != content]
    assert not stale, f"regenerate with `python -m dsv4spec.bench.headline`: {stale}"


def test_the_table_states_its_conditions_and_a_small_end_row():
    rows = headline.compute()
    text = headline.readme_table(rows)
    assert "Triton 3.8, DeepGEMM on" in text.splitlines()[0]
    assert "Triton 3.6, DeepGEMM off" in text.splitlines()[0]
    assert min(r["saved_pct"] for r in rows) < 2  # the small end is shown, not only the best
    for r in rows:
        saved = r["saved_us"]
        assert all(value >= 0 for value in saved.values())
        assert r["plugin_step_us"] == pytest.approx(
            r["engine_step_us"] - saved["triton3.6_deepgemm_off"], abs=0.11)
    json_rows = json.loads((headline.ROOT / headline.OUT / "headline.json").read_text())["rows"]
    assert json_rows == headline.compute(specs=headline.every_spec())
    assert json_rows[:len(rows)] == rows


@pytest.mark.parametrize("stack", headline.STACKS)
def test_with_deepgemm_on_an_mhc_call_is_served_only_where_its_deepgemm_point_saves(stack):
    """Where the engine runs DeepGEMM, a step's mhc_pre and boundary calls are decided by the
    rows measured against DeepGEMM's path and counted at those rows' points: no call is served
    (and summed) where that point has ours slower."""
    from dsv4spec.model.config import preset

    checked = 0
    for engine, model, drafter, k, bs in headline.every_spec():
        H = preset(headline.MODELS[model]).hidden_size
        points = headline.table_points(engine, stack, deepgemm=True)
        with tables.assuming(headline.DEVICE, stack):
            serves = headline.decision(engine, deep_gemm=True)
            for op, T, _ in headline.step_calls(engine, model, drafter, k, bs):
                hook = headline.TABLE_HOOK.get(op, op)
                if (hook, H) in points and serves(op, T, H):
                    assert headline.point_saving(points, hook, H, T) > 0, (engine, op, T, H)
                    checked += 1
    assert checked > 0


def test_the_plugin_pages_hold_the_tables_of_their_engine():
    for name, specs in headline.DOC_ROWS.items():
        block = headline.outputs()[headline.ROOT / name]
        table = block[block.index(headline.BEGIN):block.index(headline.END)]
        engine = headline.ENGINE_NAMES[specs[0][0]]
        rows = [line for line in table.splitlines() if line.startswith(f"| {engine}")]
        assert len(rows) == len(specs), name
        assert "](../benchmarks/results/headline/headline.md)" in table  # links from docs/


def test_vllm_with_deepgemm_saves_nothing_on_mhc_pre_and_the_boundary_above_32_tokens():
    measured = headline.vllm_points()
    r = headline.row("vllm", "DSV4-Pro", "dspark", 7, 8, measured)
    calls = headline.step_calls("vllm", "DSV4-Pro", "dspark", 7, 8)
    with tables.assuming(headline.DEVICE, "3.6"):
        serves = headline.decision("vllm", deep_gemm=True)
        left = sum(n * (measured[(op, 7168, T)][1] - measured[(op, 7168, T)][0])
                   for op, T, n in calls if serves(op, T, 7168))
        assert not any(serves(op, T, 7168) for op, T, _ in calls
                       if op == "mhc_pre" or (op.startswith("mhc_fused") and T > 32))
    assert r["saved_us"]["triton3.6_deepgemm_on"] == pytest.approx(left, abs=0.06)
    assert r["saved_us"]["triton3.6_deepgemm_on"] < 0.1 * r["saved_us"]["triton3.6_deepgemm_off"]


def test_the_sums_follow_the_tables(monkeypatch):
    """With every table serving nothing, nothing is saved: the sums are the decisions'."""
    measured = headline.sglang_points()
    monkeypatch.setattr(headline, "decision", lambda engine, deep_gemm: lambda op, T, H: False)
    r = headline.row("sglang", "DSV4-Pro", "dspark", 7, 1, measured)
    assert set(r["saved_us"].values()) == {0.0}
    assert r["plugin_step_us"] == r["engine_step_us"]


def test_a_user_table_does_not_change_the_headline(monkeypatch, tmp_path):
    """The headline is the packaged tables': a user's tuned file (here one serving nothing)
    is not read."""
    rows = headline.compute()
    user = tmp_path / "user"
    user.mkdir()
    packaged = json.loads((tables.PACKAGED_DIR / "NVIDIA_H200.json").read_text())
    for hooks in packaged["engines"].values():
        for entry in hooks.values():
            for mode in tables.MODES:
                entry[mode] = {key: [] for key in entry[mode]}
    (user / "NVIDIA_H200.json").write_text(json.dumps(packaged))
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(user))
    assert headline.compute() == rows


def test_a_call_saves_its_own_point_else_the_smaller_of_the_two_around_it():
    points = {("mhc_pre", 7168): [[1, 5.0, 9.0], [4, 6.0, 9.5], [16, 8.0, 10.0]]}
    assert headline.point_saving(points, "mhc_pre", 7168, 4) == 3.5
    assert headline.point_saving(points, "mhc_pre", 7168, 7) == 2.0  # 3.5 at 4, 2.0 at 16
    assert headline.point_saving(points, "mhc_pre", 7168, 2) == 3.5  # 4.0 at 1, 3.5 at 4
    assert headline.point_saving(points, "mhc_pre", 7168, 16) == 2.0
    assert headline.point_saving(points, "mhc_pre", 7168, 20) == 2.0  # none above
    with pytest.raises(LookupError):
        headline.point_saving(points, "mhc_pre", 4096, 4)
