"""``dsv4spec tune`` at its bounds: bisection between counts two apart, ties and near-ties, the
cap itself measured, and the partial and existing files it must not take for its own (another
``--quick`` setting, another engine's points, another stack's file)."""

import json

import pytest

from dsv4spec import cli
from dsv4spec.bench import tune
from dsv4spec.integrations import tables

from .test_tune import FakeMeasure, fake_gpu  # noqa: F401 - the fixture


def test_neighbours_two_apart_are_bisected_once():
    assert tune.bisections({4: (True,), 6: (False,)}, {}) == [5]
    assert tune.bisections({4: (True,), 5: (False,), 6: (True,)}, {}) == []


def test_a_near_tie_in_either_run_is_a_near_tie():
    """Run A measured the two within 2 %, run B 3x apart the other way: the winners differ, and
    the point is a near-tie (A could not tell them apart), not a real difference."""
    g = tune.GRIDS["mhc_post"]
    a = {"sglang": {"mhc_post": tune.entry_from_points(g, {7168: {
        4: {"graph": [1.00, 1.02], "eager": [1.0, 2.0]}}})}}
    b = {"sglang": {"mhc_post": tune.entry_from_points(g, {7168: {
        4: {"graph": [3.00, 1.00], "eager": [1.0, 2.0]}}})}}
    lines, shared, real = tune.compare(a, b)
    assert shared == 2 and real == 0
    assert len(lines) == 1 and lines[0].endswith("(near-tie)")


def test_a_tie_is_not_a_point_ours_won():
    g = tune.GRIDS["mhc_post"]
    entry = tune.entry_from_points(g, {7168: {1: {"graph": [2.0, 2.0], "eager": [1.0, 2.0]},
                                              4: {"graph": [1.0, 2.0], "eager": [2.0, 2.0]}}})
    assert tune.served_share(entry, g.modes) == {"graph": 0.5, "eager": 0.5}


@pytest.mark.parametrize("hook", ["mhc_pre", "mhc_fused_post_pre"])
def test_the_cap_itself_is_measured(hook):
    g = tune.GRIDS[hook]
    assert g.max_count == 32
    assert max(c for _, c in g.points(quick=False)) == g.max_count


def test_a_quick_runs_partial_is_not_resumed_by_a_full_run(fake_gpu, capsys):  # noqa: F811
    path = fake_gpu
    FakeMeasure.stop_at = 1
    args = ["tune", "--quick", "--hooks", "mhc_post"]
    with pytest.raises(KeyboardInterrupt):
        tune.main(cli.build_parser(args).parse_args(args))
    assert FakeMeasure.calls == [("mhc_post", 7168, 1)]
    FakeMeasure.stop_at = None
    capsys.readouterr()
    assert cli.main(["tune", "--hooks", "mhc_post"]) == 0
    assert "starting over" in capsys.readouterr().out
    assert FakeMeasure.calls.count(("mhc_post", 7168, 1)) == 2  # measured again, full timing
    assert json.loads(path.read_text())["measured"]["quick"] is False


def test_vllms_points_are_not_sglangs(fake_gpu, monkeypatch):  # noqa: F811
    """The two engines share hook names: an interrupted SGLang run's points stay SGLang's in the
    partial; a vLLM run of the same hook measures its own and leaves them there."""
    path = fake_gpu
    partial = path.with_name(path.name + ".partial")
    FakeMeasure.stop_at = 1
    args = ["tune", "--quick", "--hooks", "mhc_post"]
    with pytest.raises(KeyboardInterrupt):
        tune.main(cli.build_parser(args).parse_args(args))
    FakeMeasure.stop_at = None

    def point(self, g, key, count, quick):  # vLLM's kernels lose everywhere
        FakeMeasure.calls.append((g.group, key, count))
        return {m: [2.0, 1.0] if g.group == "vllm" else [1.0, 2.0] for m in g.modes}

    monkeypatch.setattr(FakeMeasure, "point", point)
    assert cli.main(["tune", "--engine", "vllm", "--quick", "--hooks", "mhc_post"]) == 0
    assert [c for c in FakeMeasure.calls if c[0] == "vllm"] == [("vllm", 7168, 1),
                                                                ("vllm", 7168, 16)]
    written = tables.read_file(path)["vllm"]["mhc_post"]
    assert written["graph"] == {7168: ()} and written["eager"] == {7168: ()}
    kept = json.loads(partial.read_text())["points"]
    assert list(kept) == ["mhc_post"] and list(kept["mhc_post"]["7168"]) == ["1"]


def test_an_existing_file_of_another_stack_is_replaced_only_with_force(fake_gpu,  # noqa: F811
                                                                        capsys):
    """A file at this stack's name that says it was measured under another Triton is not merged
    into: refused without --force, replaced whole with it."""
    path = fake_gpu
    other = json.loads((tables.PACKAGED_DIR / "NVIDIA_H200.triton3.8.json").read_text())
    path.write_text(tables.dumps(other))
    before = path.read_text()
    assert cli.main(["tune", "--quick", "--hooks", "mhc_post"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured under Triton 3.8" in err and "--force" in err
    assert path.read_text() == before and not FakeMeasure.calls
    assert cli.main(["tune", "--quick", "--force", "--hooks", "mhc_post"]) == 0
    data = json.loads(path.read_text())
    assert data["measured"]["triton"] == "3.6.0"
    assert data["engines"] == {"sglang": {"mhc_post": data["engines"]["sglang"]["mhc_post"]}}
