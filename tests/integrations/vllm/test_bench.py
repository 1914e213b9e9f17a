"""``bench vllm``'s per-step call counts (from vLLM 0.33.0's and 0.34.0's source) and sums, on
CPU."""

import ast

import pytest

from dsv4spec.bench import vllm_plugin
from dsv4spec.integrations.vllm.source import vllm_file, vllm_src


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
    (step,) = vllm_plugin.step_rows(rows, batches=[1], drafts=[1], dspark_block=0,
                                    boundary="mhc_fused_post_pre")
    layers = 43  # DSV4-Flash
    calls = 2 * layers - 1 + 1 + 2 + 2 + 1  # boundaries, mhc_post x2, hc_head x2, mhc_pre x1
    assert step["model"] == "DSV4-Flash" and step["drafter"] == "mtp"
    assert (step["bs"], step["k"], step["verify_T"]) == (1, 1, 2)
    assert step["vllm_step_us"] == pytest.approx(10.0 * calls)
    assert step["plugin_step_us"] == pytest.approx(4.0 * (calls - 2) + 10.0 * 2)


def test_step_calls_of_one_dspark_step_on_0_34():
    """Verify over bs (N + 1) tokens through 0.34.0's reuse_residual boundary; one draft forward
    over bs N rows through DSpark's 3 stages (first mhc_pre, 5 plain boundaries)."""
    calls = vllm_plugin.step_calls(layers=61, bs=8, k=7, drafter="dspark",
                                   boundary=vllm_plugin.REUSE)
    assert sorted(calls) == sorted([
        (vllm_plugin.REUSE, 64, 121), ("mhc_post", 64, 1), ("hc_head", 64, 1),
        ("mhc_pre", 56, 1), ("mhc_fused_post_pre", 56, 5), ("mhc_post", 56, 1),
        ("hc_head", 56, 1)])


def test_needed_tokens_cover_every_step_sum():
    for boundary in ("mhc_fused_post_pre", vllm_plugin.REUSE):
        args = type("A", (), {"batch": [1, 8], "drafts": [1, 3], "dspark_block": 7})()
        need = vllm_plugin.needed_tokens(args, boundary)
        rows = [_row(op, H, T, 2.0, 1.0, "ours") for op, counts in need.items()
                for T in counts for H in (4096, 7168)]
        steps = vllm_plugin.step_rows(rows, [1, 8], [1, 3], 7, boundary)
        # both models x (2 MTP draft counts + DSpark) x 2 batches, none skipped for a missing T
        assert len(steps) == 2 * 3 * 2
        assert {s["drafter"] for s in steps} == {"mtp", "dspark"}
        assert all(s["saved_us"] == pytest.approx(s["vllm_step_us"] / 2) for s in steps)


@pytest.mark.vllm_versions("0.34.0")
@pytest.mark.skipif(vllm_src() is None, reason="vLLM's source is not unpacked")
def test_0_34_target_layers_get_reuse_residual_and_dspark_stages_do_not():
    """What the sums assume of 0.34.0: ``DeepseekV4Model.forward`` calls its layers with
    ``reuse_residual=True``; DSpark's forward calls its (3 by default) layers without it."""
    model = ast.parse(vllm_file("models/deepseek_v4/nvidia/model.py").read_text())
    dspark = vllm_file("models/deepseek_v4/nvidia/dspark.py").read_text()
    calls = [n for n in ast.walk(model) if isinstance(n, ast.Call)
             and any(k.arg == "reuse_residual" for k in n.keywords)]
    assert any(ast.unparse(k.value) == "True" for c in calls for k in c.keywords
               if k.arg == "reuse_residual")
    assert "reuse_residual" not in dspark
    assert 'getattr(config, "n_mtp_layers", None) or 3' in dspark


@pytest.mark.vllm_versions("0.33.0")
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
