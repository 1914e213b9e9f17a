"""The capture rule shared by the hooks with measured tables."""

import pytest

from dsv4spec.integrations.hooks import STEP_ASIDE, run_where_measured_faster, switch_on


def rule(compiled, capturing, graph, eager):
    launches = []

    def launch():
        launches.append(1)
        return "ours"

    result = run_where_measured_faster(
        ("op", 0), compiled, capturing, lambda in_graph: graph if in_graph else eager, launch)
    return result, len(launches)


@pytest.mark.parametrize("graph", [True, False])
def test_eager_table_decides_eagerly_and_compiles(graph):
    compiled = set()
    assert rule(compiled, False, graph, True) == ("ours", 1)
    assert compiled == {("op", 0)}


def test_graph_only_shape_is_launched_once_eagerly_then_captured():
    compiled = set()
    assert rule(compiled, True, True, False) == (STEP_ASIDE, 0), "not compiled: engine's"
    assert rule(compiled, False, True, False) == (STEP_ASIDE, 1), "compiled, result dropped"
    assert rule(compiled, False, True, False) == (STEP_ASIDE, 0), "compiled once only"
    assert rule(compiled, True, True, False) == ("ours", 1)


def test_nothing_runs_where_neither_table_prefers_ours():
    compiled = {("op", 0)}
    assert rule(compiled, True, False, True) == (STEP_ASIDE, 0)
    assert rule(compiled, False, False, False) == (STEP_ASIDE, 0)
    assert rule(set(), False, False, False) == (STEP_ASIDE, 0)


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("on", True), ("YES", True),
                                      ("0", False), ("false", False), ("no", False),
                                      ("Off", False)])
def test_switches_read_as_every_dsv4spec_switch(monkeypatch, caplog, value, on):
    if value is None:
        monkeypatch.delenv("DSV4SPEC_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("DSV4SPEC_TEST_SWITCH", value)
    with caplog.at_level("WARNING"):
        assert switch_on("DSV4SPEC_TEST_SWITCH") is on
    assert not caplog.records


def test_a_switch_value_that_is_neither_on_nor_off_warns_and_is_off(monkeypatch, caplog):
    monkeypatch.setenv("DSV4SPEC_SGLANG_MHC", "maybe")
    with caplog.at_level("WARNING"):
        assert not switch_on("DSV4SPEC_SGLANG_MHC")
    assert any("DSV4SPEC_SGLANG_MHC" in r.getMessage() and "'maybe'" in r.getMessage()
               for r in caplog.records)
