"""The ops' launch plans queried without a device: the token counts where a planner changes the
tiling (what the measured-faster tables' ranges stop at), read off the planner itself, and the
first count where two SM counts get other plans."""

import importlib

import pytest
import torch

from dsv4spec.kernels import hc_head_plan
from dsv4spec.kernels import mhc as mhc_kernels
from dsv4spec.ops import mhc, plan_scan

hc_head = importlib.import_module("dsv4spec.ops.hc_head")  # the package exports a function too

H200_SMS, H20_SMS = 132, 78


@pytest.fixture
def fresh_scans():
    """The scans are cached per arguments: forget them around a test that moves a threshold."""
    for f in (mhc.tiling_switches, mhc.first_plan_difference, hc_head.tiling_switches,
              hc_head.first_plan_difference):
        f.cache_clear()
    yield
    for f in (mhc.tiling_switches, mhc.first_plan_difference, hc_head.tiling_switches,
              hc_head.first_plan_difference):
        f.cache_clear()


def test_the_switches_are_the_planners_thresholds():
    pre = mhc_kernels.MMA_MIN_TOKENS
    for H in (4096, 7168):
        for op in ("mhc_pre", "mhc_post_pre"):
            found = mhc.tiling_switches(op, H, 4096, H200_SMS)
            # the invariant tiling's end, the finalize's H-blocks, PDL, 4-token blocks, the
            # tensor cores and the H-blocks beside them
            assert {mhc_kernels.INVARIANT_MAX_TOKENS + 1, 9, mhc_kernels.PDL_MAX_TOKENS + 1, 33,
                    65, pre, pre + 1} <= set(found), (op, H, found)
        assert mhc_kernels.BOUNDARY_TOKEN_ROWS_MIN_TOKENS in mhc.tiling_switches(
            "mhc_post_pre", H, 4096, H200_SMS)
        # mhc_pre's wide finalize ends at T * H = WIDE_FINALIZE_MAX_ELEMENTS
        wide_end = mhc_kernels.WIDE_FINALIZE_MAX_ELEMENTS // H + 1
        assert wide_end in mhc.tiling_switches("mhc_pre", H, 4096, H200_SMS)
        assert mhc.tiling_switches("mhc_post", H, 16384, H200_SMS) == (3, 9, 33, 129)
        assert hc_head_plan.MMA_MIN_ELEMENTS // H in hc_head.tiling_switches(H, 16384, H200_SMS)
    assert mhc.tiling_switches("mhc_pre", 7168, 4, H200_SMS) == ()  # one tiling up to 4


def test_the_switches_follow_the_planner_when_a_threshold_moves(monkeypatch, fresh_scans):
    assert 128 in mhc.tiling_switches("mhc_pre", 7168, 256, H200_SMS)
    monkeypatch.setattr(mhc_kernels, "MMA_MIN_TOKENS", 96)
    mhc.tiling_switches.cache_clear()
    found = mhc.tiling_switches("mhc_pre", 7168, 256, H200_SMS)
    assert 96 in found and 128 not in found
    monkeypatch.setattr(hc_head_plan, "MMA_MIN_ELEMENTS", 100 * 7168)
    assert 100 in hc_head.tiling_switches(7168, 512, H200_SMS)


def test_the_split_count_is_not_a_switch_but_differs_between_sm_counts():
    # above 32 tokens the split count follows T (and the SMs) at almost every token block
    grids = {mhc.launch_plan("mhc_pre", T, 7168, H200_SMS)[1] for T in range(33, 65)}
    assert len(grids) > 2
    assert mhc.tiling_switches("mhc_pre", 7168, 64, H200_SMS) == (5, 9, 17, 33)
    # up to 32 tokens one split per 64-wide chunk whatever the SMs: the same launches on an H20
    assert mhc.first_plan_difference("mhc_pre", 7168, 4096, H200_SMS, H20_SMS) == 33
    assert mhc.first_plan_difference("mhc_post_pre", 4096, 4096, H200_SMS, H20_SMS) == 33
    assert mhc.first_plan_difference("mhc_post", 7168, 4096, H200_SMS, H20_SMS) is None
    assert mhc.first_plan_difference("mhc_pre", 7168, 4096, H200_SMS, H200_SMS) is None
    assert hc_head.first_plan_difference(7168, 16384, H200_SMS, H20_SMS) == 256
    for T in range(1, 256):
        assert hc_head.launch_plan(T, 7168, H200_SMS) == hc_head.launch_plan(T, 7168, H20_SMS)
    assert hc_head.launch_plan(256, 7168, H200_SMS) != hc_head.launch_plan(256, 7168, H20_SMS)


def test_launch_plans_are_the_kernels_plans_on_an_sm90_gpu():
    for T in (1, 4, 12, 100, 600, 4096):
        cfg = mhc_kernels.tiling(T, 7168, H200_SMS, dtype=torch.bfloat16, boundary=True,
                                 on_gpu=True, release=(3, 6))
        tiling, grid = mhc.launch_plan("mhc_post_pre", T, 7168, H200_SMS, triton_version="3.6")
        assert grid == (cfg.chunks_per_split, cfg.num_splits)
        assert cfg.mma == (T >= mhc_kernels.MMA_MIN_TOKENS) and cfg.pdl == (T <= 16)
        # the finalize's early release only where it is a dependent launch
        assert cfg.early_release == (cfg.pdl and mhc_kernels.FINALIZE_EARLY_RELEASE)
        assert not mhc_kernels.tiling(T, 7168, H200_SMS, dtype=torch.bfloat16, boundary=True,
                                      on_gpu=True, early_release=False).early_release
    # the Triton 3.8 boundary: 4-token blocks at 9-16 tokens
    assert mhc.launch_plan("mhc_post_pre", 12, 7168, H200_SMS, triton_version="3.8") != (
        mhc.launch_plan("mhc_post_pre", 12, 7168, H200_SMS, triton_version="3.6"))
    assert mhc.launch_plan("mhc_post", 64, 7168, H200_SMS) == (
        (*mhc_kernels.post_tiling(64), mhc_kernels.POST_PDL), ())


def test_launch_plans_are_what_the_kernels_plan_on_an_h200(monkeypatch):
    """The kernels' own planners for CUDA device 0, made an H200 (132 SMs, PDL): the plans the
    ops launch there are the ones ``launch_plan`` describes without a device."""
    for module in (mhc_kernels, hc_head_plan):
        monkeypatch.setattr(module, "supports_pdl", lambda device_index: device_index >= 0)
        monkeypatch.setattr(module, "num_sms", lambda device_index: H200_SMS)
    mhc_kernels._plan.cache_clear()
    hc_head_plan._plan.cache_clear()
    try:
        for H in (4096, 7168):
            for T in [*range(1, 140), 255, 256, 447, 448, 511, 512, 585, 586, 1024, 1025, 4096]:
                for op, boundary in (("mhc_pre", False), ("mhc_post_pre", True)):
                    cfg = mhc_kernels.plan(T, H, 0, dtype=torch.bfloat16, boundary=boundary)
                    assert mhc.launch_plan(op, T, H, H200_SMS) == plan_scan.tiling_and_grid(cfg)
                cfg, _, warps = hc_head_plan._plan(T, H, 0, False, None, None, None,
                                                   dtype=torch.bfloat16)
                tiling, grid = plan_scan.tiling_and_grid(cfg)
                assert hc_head.launch_plan(T, H, H200_SMS) == ((*tiling, *warps), grid)
    finally:  # plans cached for device 0 under the stand-in answers
        mhc_kernels._plan.cache_clear()
        hc_head_plan._plan.cache_clear()


@pytest.mark.parametrize("call, match", [
    (lambda: mhc.launch_plan("mhc_head", 1, 7168, H200_SMS), "op must be one of"),
    (lambda: mhc.launch_plan("mhc_pre", 0, 7168, H200_SMS), "num_tokens"),
    (lambda: mhc.launch_plan("mhc_pre", 1, 0, H200_SMS), "hidden_size"),
    (lambda: mhc.launch_plan("mhc_pre", 1, 7168, True), "num_sms"),
    (lambda: mhc.tiling_switches("mhc_pre", 7168, 0, H200_SMS), "max_tokens"),
    (lambda: hc_head.launch_plan(2.0, 7168, H200_SMS), "num_tokens"),
    (lambda: hc_head.tiling_switches(7168, 16, 0), "num_sms"),
    (lambda: hc_head.first_plan_difference(-1, 16, H200_SMS, H20_SMS), "hidden_size"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_scans_of_a_plan_function():
    def plan(T):
        return ("small" if T <= 4 else "large", (T // 3,))

    assert plan_scan.tiling_switches(plan, 10) == (5,)
    assert plan_scan.tiling_switches(plan, 1) == ()
    assert plan_scan.first_difference(plan, plan, 10) is None
    assert plan_scan.first_difference(plan, lambda T: plan(T + 1), 10) == 2
