"""hc_head's planner (kernels/hc_head_plan.py): its default tilings, pinned, and the claim behind
``PRECOMPILE_MAX_TOKENS``.

``hc_head_plan_expected.json`` holds the default plan (config, workspace shape, warps) of a grid of
T x H x RMSNorm x dtype on CUDA device 0 of an H200 (132 SMs, sm_90: PDL), each choice set by the
measurements cited in the planner. A threshold or tiling rule that moves changes rows here: update
the file only together with the measurement that justifies the new choice.
"""

import json
from pathlib import Path

import pytest
import torch

from dsv4spec.kernels import hc_head_plan as planner
from dsv4spec.kernels.hc_head_precompile import PRECOMPILE_MAX_TOKENS, variant_tokens

EXPECTED = json.loads(Path(__file__).with_name("hc_head_plan_expected.json").read_text())
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.fixture
def h200(monkeypatch):
    # CUDA device 0 as an H200, without a GPU: the planner asks the device only these two things
    monkeypatch.setattr(planner, "num_sms", lambda device_index: 132)
    monkeypatch.setattr(planner, "supports_pdl", lambda device_index: True)


def test_default_plans_are_the_recorded_ones(h200):
    assert EXPECTED["config_fields"] == list(planner.HcHeadConfig._fields)
    assert len(EXPECTED["rows"]) == 15 * 2 * 2 * 2
    wrong = []
    for T, H, rmsnorm, dtype, config, ws_shape, warps in EXPECTED["rows"]:
        # __wrapped__: past the cache, which must not keep plans made under this fixture
        got = planner._plan.__wrapped__(T, H, 0, rmsnorm, None, None, None, dtype=DTYPES[dtype])
        want = (planner.HcHeadConfig(*config), tuple(ws_shape), tuple(warps))
        if got != want:
            wrong.append(f"T={T} H={H} rmsnorm={rmsnorm} {dtype}: {got} != {want}")
    assert not wrong, "\n".join(wrong)


def test_no_token_count_past_precompile_max_tokens_needs_a_new_variant(h200):
    # precompile() compiles the variants of T = 1..PRECOMPILE_MAX_TOKENS: at H = 7168 (DSV4-Pro),
    # bf16, every T up to twice that needs one of them (the SGLang hooks serve T up to the bound).
    args = (7168, 0, False, torch.bfloat16)
    assert (variant_tokens(*args, PRECOMPILE_MAX_TOKENS)
            == variant_tokens(*args, 2 * PRECOMPILE_MAX_TOKENS))


def test_one_tiling_and_one_binary_up_to_the_invariance_bound(h200):
    """What the GPU batch-invariance test of hc_head rests on, checked without a GPU: every T up
    to the bound gets the same tiling and warps, and T is not a specialisation key (1 and
    multiples of 16 would otherwise compile their own binaries)."""
    from dsv4spec.kernels import hc_head as K

    assert planner.INVARIANT_MAX_TOKENS >= 4  # one request's decode and verify of 3 drafts
    for rmsnorm in (False, True):
        for H in (4096, 7168):
            def plan(T):
                cfg, _, warps = planner._plan.__wrapped__(T, H, 0, rmsnorm, None, None, None,
                                                          dtype=torch.bfloat16)
                return cfg, warps

            plans = {plan(T) for T in range(1, planner.INVARIANT_MAX_TOKENS + 1)}
            assert len(plans) == 1, plans
    for kernel in (K._hc_head_partials_kernel, K._hc_head_finalize_kernel):
        # a JITFunction, or under TRITON_INTERPRET=1 an InterpretedFunction keeping jit's kwargs
        options = getattr(kernel, "kwargs", None) or {"do_not_specialize": kernel.do_not_specialize}
        assert list(options["do_not_specialize"]) == ["T"]
    args = (7168, 0, False, torch.bfloat16)
    assert variant_tokens(*args, planner.INVARIANT_MAX_TOKENS) == [1]  # one compiled variant
