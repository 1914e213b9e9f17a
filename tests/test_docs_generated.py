"""What the docs show of the code's decisions is the code's: every doctor sample block (a fenced
block after a ``<!-- dsv4spec doctor ... -->`` comment) is what that command prints, and every
hook range claim (``SGLang's `mhc_pre` serves T 1–4, 8, 16 at H 7168 (graph, Triton 3.6)``)
states exactly the counts the plugin's decision function serves. ``python scripts/regen_docs.py``
rewrites both."""

import importlib.util
from pathlib import Path

import pytest

from dsv4spec.integrations import tables

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("regen_docs", ROOT / "scripts/regen_docs.py")
regen_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regen_docs)

REGEN = "regenerate with `python scripts/regen_docs.py`"


@pytest.fixture(autouse=True)
def _packaged_tables_only(monkeypatch, tmp_path):
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "no-user-tables"))
    tables.clear_cache()
    regen_docs._reports.clear()


def samples(name: str) -> list:
    return list(regen_docs.SAMPLE.finditer((ROOT / name).read_text()))


@pytest.mark.parametrize("name", regen_docs.DOCS)
def test_every_doctor_sample_block_is_what_its_command_prints(name):
    for m in samples(name):
        expected = regen_docs.comparable(regen_docs.run_sample(m[1]))
        assert regen_docs.comparable(m[2]) == expected, f"{name}: `{m[1]}` is stale; {REGEN}"


def test_the_doctor_page_shows_a_sample_without_a_gpu_and_a_what_if():
    commands = [m[1] for m in samples("docs/doctor.md")]
    assert "dsv4spec doctor" in commands
    assert any("--triton-stack 3.8" in c and "--engine" in c for c in commands)


@pytest.mark.parametrize("name", regen_docs.DOCS)
def test_every_range_claim_states_what_the_decision_functions_serve(name):
    text = (ROOT / name).read_text()
    for m in regen_docs.CLAIM.finditer(text):
        stated = " ".join(m[0].split())
        assert stated == regen_docs.claim_text(m), f"{name}: {stated!r} is stale; {REGEN}"


def test_the_plugin_pages_state_their_mhc_ranges_as_claims():
    for name, engine in (("docs/sglang.md", "SGLang"), ("docs/vllm.md", "vLLM")):
        claims = [m for m in regen_docs.CLAIM.finditer((ROOT / name).read_text())
                  if m[1] == engine]
        assert {m[2] for m in claims} >= {"mhc_pre", "mhc_fused_post_pre"}, name
        assert {m[6] for m in claims} == {"3.6", "3.8"}, name


def test_a_stale_claim_or_sample_is_caught():
    served = regen_docs.served("SGLang", "mhc_pre", 7168, "graph", "3.6", "off")
    assert served and served[0][0] == 1
    wrong = "SGLang's `mhc_pre` serves T 1–4096 at H 7168 (graph, Triton 3.6, DeepGEMM off)"
    m = regen_docs.CLAIM.search(wrong)
    assert m and regen_docs.claim_text(m) != wrong
    wrapped = "vLLM's `mhc_pre` serves\nT 1–3 at H 7168 (graph, Triton 3.8,\nDeepGEMM on)"
    m = regen_docs.CLAIM.search(wrapped)
    assert m and regen_docs.claim_text(m) == (  # the rows measured against DeepGEMM's path
        "vLLM's `mhc_pre` serves T 1–9, 16 at H 7168 (graph, Triton 3.8, DeepGEMM on)")
    with pytest.raises(ValueError, match="cases"):
        regen_docs.served("vLLM", "mhc_pre", 7168, "graph", "3.8", None)
    block = "<!-- dsv4spec doctor -->\n```\n$ dsv4spec doctor\nresult    validated (exit 0)\n```"
    m = regen_docs.SAMPLE.search(block)
    assert regen_docs.comparable(m[2]) != regen_docs.comparable(regen_docs.run_sample(m[1]))
    with pytest.raises(ValueError, match="command"):
        regen_docs.run_sample("dsv4spec demo")


def test_the_readmes_example_of_a_ratio_that_moves_across_a_segment_holds():
    """The README's example of why a count not measured takes no verdict from one side: vLLM's
    mhc_post at 64 and 128 tokens, H = 7168 (no switch of either kernel between), won at 64 and
    measured slower at 128, where the tables no longer serve ours."""
    import json

    from dsv4spec.integrations import plans
    from dsv4spec.integrations.vllm import mhc

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("`mhc_post` in a graph, H = 7168: 2.47 vs 3.49 µs at 64 tokens, 4.61 vs 4.18 µs at "
            "128") in readme
    rows = json.loads((ROOT / "benchmarks/results/vllm034/vllm_plugin_h7168.json").read_text())
    at = {r["T"]: r for r in rows["rows"] if r["op"] == "mhc_post" and r["T"] in (64, 128)}
    assert at[64]["hook_graph_us"] < at[64]["vllm_graph_us"]
    assert at[128]["hook_graph_us"] > at[128]["vllm_graph_us"]  # measured slower
    with tables.assuming("NVIDIA H200", "3.6"):
        assert not any(mhc.prefers_dsv4spec("mhc_post", T, 7168, True, (9, 0))
                       for T in range(65, 129))
    assert plans.engine_tiling_switches("vllm", "mhc_post", 128) == ()
