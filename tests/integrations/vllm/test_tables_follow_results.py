"""The vLLM hooks' tables say what the committed H200 run of ``dsv4spec bench vllm`` measured:
at every point it timed, ours is served exactly where it was faster than vLLM's kernel."""

import json
from pathlib import Path

import pytest

from dsv4spec.integrations import tables
from dsv4spec.integrations.manifest import packaged_manifests
from dsv4spec.integrations.vllm import mhc as hooks

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "plugin"
ROWS = [r for r in json.loads((RESULTS / "vllm_plugin.json").read_text())["rows"] if "op" in r]
SM90 = (9, 0)


def test_the_run_covers_every_hooked_call_at_both_widths():
    assert {(r["op"], r["H"]) for r in ROWS} == {
        (op, H) for op in ("hc_head", "mhc_pre", "mhc_post", "mhc_fused_post_pre")
        for H in (4096, 7168)}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_ours_is_served_exactly_where_it_was_measured_faster(mode, h200_tables):
    differ = [(r["op"], r["H"], r["T"]) for r in ROWS
              if hooks.prefers_dsv4spec(r["op"], r["T"], r["H"], mode == "graph", SM90)
              != (r[f"{mode}_speedup"] > 1)]
    assert not differ, differ
    # the run holds both answers (hc_head at H = 4096, T = 64 lost in a graph)
    assert mode == "eager" or not hooks.prefers_dsv4spec("hc_head", 64, 4096, True, SM90)


def test_every_packaged_vllm_row_names_every_supported_vllm_version():
    """A release gets a manifest only with rows that hold for it: measured on it, or sharing the
    measured kernels (the rows say which)."""
    supported = {m["version"] for m in packaged_manifests("vllm")}
    assert {"0.33.0", "0.34.0"} <= supported
    for path in sorted(tables.PACKAGED_DIR.glob("*.json")):
        for hook, entry in tables.read_file(path)["vllm"].items():
            assert supported <= set(entry.get("engine_versions", ())), (path.name, hook)


def test_engine_versions_must_be_a_list_of_version_strings():
    data = json.loads((tables.PACKAGED_DIR / "NVIDIA_H200.json").read_text())
    for bad in ("0.34.0", [], [""], [34]):
        data["engines"]["vllm"]["hc_head"]["engine_versions"] = bad
        with pytest.raises(ValueError, match="engine_versions"):
            tables.validate(data)
