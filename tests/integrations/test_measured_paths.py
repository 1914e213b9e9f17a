"""Which engine path a table's rows were measured against, and the plugins using a row only where
the running engine takes that path: DeepGEMM's pre-norm GEMM or the engine's own kernels
(``measured_against``, written by ``dsv4spec tune`` from the GEMM that ran at each count)."""

import json
import logging

import pytest

from dsv4spec.bench import deepgemm, tune
from dsv4spec.integrations import hooks, tables
from dsv4spec.integrations.sglang import mhc as sglang_hooks
from dsv4spec.integrations.vllm import mhc as vllm_hooks
from dsv4spec.integrations.vllm.tables import DEEP_GEMM_FROM_TOKENS as VLLM_DEEP_FROM

from .test_tables import H200, SM90, fresh, packaged, write_user  # noqa: F401 - fresh: fixture

COUNTS = range(1, 4097)


@pytest.mark.parametrize("label, above", [
    ("tilelang, DeepGEMM off", None), ("tilelang, DeepGEMM on", None), ("triton", None),
    ("torch", None), ("deepgemm", 0), ("tilelang to 32 tokens, deepgemm above", 32)])
def test_each_label_reads_as_the_count_above_which_deepgemm_ran(label, above):
    assert tables.deepgemm_above(label) == above


@pytest.mark.parametrize("label", ["", " ", "DeepGEMM", "tilelang", "tilelang to 0 tokens, "
                                   "deepgemm above", "tilelang to 32 tokens", 7])
def test_another_label_is_refused_naming_the_field(label):
    with pytest.raises(ValueError, match="measured_against"):
        tables.validate_hook({**packaged()["engines"]["sglang"]["mhc_post"],
                              "measured_against": label}, "mhc_post")


@pytest.mark.parametrize("op", ["mhc_pre", "mhc_post", "mhc_fused_post_pre"])
@pytest.mark.parametrize("deep_gemm", [False, True])
@pytest.mark.parametrize("top", [16, 32, 33, 512])
def test_tunes_label_reads_back_as_the_path_that_ran_at_every_count(op, deep_gemm, top):
    """The label an entry measured at counts ``1..top`` gets names, read back, the GEMM that ran
    at each of those counts (:func:`deepgemm.gemm_path`)."""
    counts = range(1, top + 1)
    above = tables.deepgemm_above(deepgemm.measured_against(op, counts, deep_gemm))
    for c in counts:
        ran = deepgemm.gemm_path(op, c, deep_gemm) == deepgemm.DEEPGEMM
        assert (above is not None and c > above) == ran, (op, deep_gemm, top, c)


@pytest.mark.parametrize("engine", tune.ENGINES)
def test_with_deepgemm_on_tune_measures_the_gemm_hooks_to_512_across_deepgemms_splits(engine):
    """The hooks with a pre-norm GEMM are measured beside DeepGEMM's path up to 512 tokens, on
    both sides of every change of DeepGEMM's split count and of the hand-over at 33 tokens; the
    others keep their grids."""
    off, on = tune.grids_for(engine, False), tune.grids_for(engine, True)
    assert off is tune.ENGINE_GRIDS[engine]
    for hook, g in on.items():
        if hook not in ("mhc_pre", "mhc_fused_post_pre"):
            assert g == off[hook]
            continue
        assert g.max_count == 512 and g.deepgemm_above == {"mhc_pre": 0,
                                                           "mhc_fused_post_pre": 32}[hook]
        for key in g.keys:
            counts = {c for k, c in g.points(False) if k == key}
            assert set(tune.DEEPGEMM_COUNTS) <= counts
            splits = [tune.plans.deepgemm_splits(key, c, 132) for c in range(1, 514)]
            changes = [c for c in range(2, 513) if splits[c - 1] != splits[c - 2]]
            assert changes and all({c - 1, c} <= counts for c in changes), (hook, key)


def test_deepgemms_split_count_is_the_engines():
    """SGLang's ``_compute_num_split_for_mhc_pre`` and vLLM's ``compute_num_split``: 132 SMs
    over the 64-token row blocks, at most a quarter of the 64-wide K blocks (K = 4 H)."""
    split = tune.plans.deepgemm_splits
    assert [split(7168, t, 132) for t in (1, 64, 65, 128, 129, 256, 4096)] == [
        112, 112, 66, 66, 44, 33, 2]
    assert [split(4096, t, 132) for t in (1, 128, 129)] == [64, 64, 44]
    assert tune.plans.deepgemm_switches(4096, 0, 512, 132) == (129, 193, 257, 321, 385, 449)
    assert tune.plans.segment_switches("vllm", "mhc_post", 7168, 512, deepgemm_above=0) == \
        tune.plans.segment_switches("vllm", "mhc_post", 7168, 512)  # no GEMM there


def test_tune_writes_the_path_that_ran():
    points = {7168: {1: {"graph": [1.0, 2.0], "eager": [1.0, 2.0]},
                     64: {"graph": [3.0, 2.0], "eager": [3.0, 2.0]}}}
    against = {(h, dg): tables.validate_hook(tune.entry_from_points(
        tune.GRIDS[h], points, deep_gemm=dg), h)["measured_against"]
        for h in ("mhc_pre", "mhc_post", "mhc_fused_post_pre") for dg in (False, True)}
    assert against == {("mhc_pre", False): "tilelang, DeepGEMM off",
                       ("mhc_pre", True): "deepgemm",
                       ("mhc_post", False): "tilelang, DeepGEMM off",
                       ("mhc_post", True): "tilelang, DeepGEMM on",
                       ("mhc_fused_post_pre", False): "tilelang, DeepGEMM off",
                       ("mhc_fused_post_pre", True): "tilelang to 32 tokens, deepgemm above"}
    hc_head = tune.entry_from_points(tune.VLLM_GRIDS["hc_head"], points, deep_gemm=True)
    assert hc_head["measured_against"] == "tilelang, DeepGEMM on"


def vllm_file(hook: str, against: str, spans) -> dict:
    """A valid file holding vLLM's ``hook`` alone, serving ours at ``spans`` (both modes, both
    widths), measured against ``against``."""
    data = packaged()
    entry = {**data["engines"]["vllm"][hook], "measured_against": against,
             "graph": {"4096": spans, "7168": spans}, "eager": {"4096": spans, "7168": spans}}
    for field in ("points", "unmeasured"):
        entry.pop(field, None)
    data["engines"] = {"vllm": {hook: entry}}
    return data


def path_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "were timed against" in r.getMessage()]


def test_rows_measured_against_deepgemm_serve_only_where_the_engine_runs_it(
        fresh, caplog, monkeypatch):  # noqa: F811 - the fixture
    """vLLM's mhc_pre (DeepGEMM at every count where vLLM runs it): rows measured against
    DeepGEMM serve ours with DeepGEMM on and step aside with it off, the reverse of rows measured
    against TileLang; each mismatch is told once, naming both paths and the file."""
    monkeypatch.setattr(hooks, "_told_paths", set())  # told once per process: not yet here
    fresh(H200)
    path = write_user(H200, vllm_file("mhc_pre", "deepgemm", [[1, 4096]]))
    fresh(H200)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert all(vllm_hooks.prefers_dsv4spec("mhc_pre", c, 7168, g, SM90, deep_gemm=True)
                   for c in (1, 16, 4096) for g in (True, False))
        assert path_warnings(caplog) == []
        assert not any(vllm_hooks.prefers_dsv4spec("mhc_pre", c, 7168, g, SM90)
                       for c in (1, 16, 4096) for g in (True, False))
    told = path_warnings(caplog)
    assert len(told) == 1 and "mhc_pre runs its own kernels without DeepGEMM" in told[0]
    assert str(path) in told[0] and "timed against DeepGEMM's pre-norm GEMM" in told[0]
    write_user(H200, vllm_file("mhc_pre", "tilelang, DeepGEMM off", [[1, 4096]]))
    fresh(H200)
    assert vllm_hooks.prefers_dsv4spec("mhc_pre", 64, 7168, True, SM90)
    # with DeepGEMM on the user's TileLang rows do not decide: the packaged rows measured against
    # DeepGEMM's path do (ours slower at 64 tokens there)
    assert not vllm_hooks.prefers_dsv4spec("mhc_pre", 64, 7168, True, SM90, deep_gemm=True)
    assert vllm_hooks.DEEPGEMM_TABLES["mhc_pre"].sources[SM90] == (
        tables.PACKAGED_DIR / tables.device_file_name(H200, "3.6", deepgemm=True))


@pytest.mark.parametrize("deep_gemm", [False, True])
def test_boundary_rows_split_at_the_fused_kernels_hand_over(fresh, deep_gemm):  # noqa: F811 - the fixture
    """Rows measured with DeepGEMM on hold vLLM's fused TileLang kernel to 32 tokens (the path
    with DeepGEMM off too) and DeepGEMM's GEMM above: every count decides by the path that ran
    there, against the path vLLM takes."""
    fresh(H200)
    write_user(H200, vllm_file("mhc_fused_post_pre", "tilelang to 32 tokens, deepgemm above",
                               [[1, 4096]]))
    fresh(H200)
    deep_from = VLLM_DEEP_FROM["mhc_fused_post_pre"]
    for c in COUNTS:
        served = vllm_hooks.prefers_dsv4spec("mhc_fused_post_pre", c, 4096, True, SM90,
                                             deep_gemm=deep_gemm)
        assert served == (c < deep_from or deep_gemm), c


def test_sglang_follows_the_same_rule_and_deepgemm_rows_reach_their_own_max_count(
        fresh):  # noqa: F811 - the fixture
    """SGLang's 32-token cap bounds the rows measured against its TileLang GEMM; rows measured
    against DeepGEMM's path decide to their own max_count."""
    fresh(H200)
    data = packaged()
    entry = {**data["engines"]["sglang"]["mhc_pre"], "measured_against": "deepgemm",
             "graph": {"7168": [[1, 512]]}, "eager": {"7168": [[1, 512]]}, "max_count": 512}
    entry.pop("unmeasured", None)
    data["engines"] = {"sglang": {"mhc_pre": entry}}
    write_user(H200, data)
    fresh(H200)
    cap = sglang_hooks.MEASURED_MAX_TOKENS["mhc_pre"]
    for c in (1, 8, cap, cap + 1, 512, 513):
        assert sglang_hooks.prefers_dsv4spec("mhc_pre", c, 7168, True, SM90,
                                             deep_gemm=True) == (c <= 512)
        assert not sglang_hooks.prefers_dsv4spec("mhc_pre", c, 7168, True, SM90)
    # the same ranges measured against SGLang's TileLang GEMM stop at the cap
    write_user(H200, {**data, "engines": {"sglang": {"mhc_pre": {
        **entry, "measured_against": "tilelang, DeepGEMM off"}}}})
    fresh(H200)
    for c in (1, 8, cap, cap + 1, 512):
        assert sglang_hooks.prefers_dsv4spec("mhc_pre", c, 7168, True, SM90) == (c <= cap)


def test_a_verdict_beside_deepgemm_is_not_carried_across_its_split_change():
    """Rows measured against DeepGEMM's GEMM: its split count changes at 65 tokens (H = 7168),
    so clear wins at 64 and 128 say nothing of 65-127, listed unmeasured until measured."""
    g = tune.grids_for("vllm", True)["mhc_pre"]
    win = {"graph": [1.0, 2.0], "eager": [1.0, 2.0]}
    entry = tables.validate_hook(json.loads(tables.dumps(tune.entry_from_points(
        g, {7168: {64: win, 128: win}}, deep_gemm=True))), "mhc_pre")
    assert entry["measured_against"] == "deepgemm"
    assert entry["graph"][7168] == ((64, 64), (128, 128))
    assert entry["unmeasured"]["graph"][7168] == ((1, 63), (65, 127))
