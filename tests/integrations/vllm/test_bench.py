"""``bench vllm``'s per-step call counts (from vLLM 0.33.0's source) and sums, on CPU."""

import ast

import pytest

from dsv4spec.bench import vllm_plugin
from dsv4spec.integrations.vllm.source import vllm_file, vllm_src

# The bench models vLLM 0.33.0's step (its V1 proposer is gone in 0.34.0).
pytestmark = pytest.mark.vllm_versions("0.33.0")


def test_step_calls_count_each_call_of_one_mtp_step():
    calls = vllm_plugin.step_calls(layers=61, bs=4, k=3)
    count = {}
    for op, T, n in calls:
        count[(op, T)] = count.get((op, T), 0) + n
    assert count == {
        ("mhc_fused_post_pre", 16): 2 * 61 - 1 + 1,  # the target's boundaries, the first draft's
        ("mhc_post", 16): 2, ("hc_head", 16): 1, ("mhc_pre", 16): 1,
        ("hc_head", 4): 3, ("mhc_pre", 4): 2, ("mhc_fused_post_pre", 4): 2, ("mhc_post", 4): 2,
    }


def _row(op, H, T, vllm, hook, served):
    return {"op": op, "H": H, "T": T, "vllm_graph_us": vllm, "hook_graph_us": hook,
            "served": served}


def test_step_rows_sum_served_times():
    rows = [_row(op, 4096, T, 10.0, 4.0, "ours" if op != "mhc_post" else "vllm")
            for op in vllm_plugin.OPS for T in (1, 2)]
    (step,) = vllm_plugin.step_rows(rows, drafts=[1])
    layers = 43  # DSV4-Flash
    calls = 2 * layers - 1 + 1 + 2 + 2 + 1  # boundaries, mhc_post x2, hc_head x2, mhc_pre x1
    assert step["model"] == "DSV4-Flash" and (step["bs"], step["k"], step["verify_T"]) == (1, 1, 2)
    assert step["vllm_step_us"] == pytest.approx(10.0 * calls)
    assert step["plugin_step_us"] == pytest.approx(4.0 * (calls - 2) + 10.0 * 2)


@pytest.mark.skipif(vllm_src() is None, reason="vLLM's source is not unpacked")
def test_the_draft_passes_after_the_first_run_over_the_batch():
    """vLLM's proposer runs its first draft pass over the verify tokens and samples one row per
    request (``token_indices_to_sample``), then loops ``num_speculative_tokens - 1`` more
    passes over the batch: what ``step_calls`` counts."""
    tree = ast.parse(vllm_file("v1/spec_decode/llm_base_proposer.py").read_text())
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)
             and ast.unparse(n.iter) == "range(self.num_speculative_tokens - 1)"]
    assert len(loops) == 1
    samples = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and ast.unparse(n) == "sample_hidden_states = "
               "last_hidden_states[token_indices_to_sample]"]
    assert samples and samples[0].lineno < loops[0].lineno
