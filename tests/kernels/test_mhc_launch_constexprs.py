"""What each mHC launch is compiled with, against how it is launched: on a GPU a mismatch is a
race (a partials launch that waits without being a dependent launch, a finalize that releases
its dependents in another order than planned), which the CPU interpreter never shows. The
launches are recorded instead of run, with the sm_90 plans (``on_gpu``)."""

import pytest
import torch
import triton

from dsv4spec.kernels import mhc as K
from dsv4spec.kernels.launch import LaunchCache
from tests.ops.test_mhc import make_inputs
from tests.ops.test_mhc_post_head import tail_inputs


@pytest.fixture
def recorded(monkeypatch):
    """The launches made, as (kernel: "partials" or "finalize", constexprs, launch_pdl, args)."""
    names = {id(K._PARTIALS): "partials", id(K._PARTIALS_MMA): "partials",
             id(K._PARTIALS_TOKEN_MMA): "partials", id(K._FINALIZE): "finalize"}
    seen = []

    def launch(self, key, grid, args, constexprs, num_warps, num_stages=None, launch_pdl=False):
        if id(self) in names:
            seen.append((names[id(self)], dict(constexprs), launch_pdl, args))

    monkeypatch.setattr(LaunchCache, "launch", launch)
    monkeypatch.setattr(LaunchCache, "get", lambda self, key: None)
    monkeypatch.setattr(K, "_DIRECT", {})
    return seen


TILINGS = [
    pytest.param({}, id="default sm_90 plan (pdl, wait)"),
    pytest.param({"wait": False}, id="pdl without wait"),
    pytest.param({"num_splits": 16}, id="runs of chunks (no wait)"),
    pytest.param({"early_release": False}, id="release after the wait"),
    pytest.param({"pdl": False}, id="no pdl"),
]


def pre_and_boundary(tiling):
    x, fn, sc, base, nw, f = make_inputs(3, 7168, torch.float32)
    post, comb = torch.rand(3, 4), torch.rand(3, 4, 4)
    args = (1e-6, 1e-6, 20, 2.0, nw, 1e-6)
    K.mhc_pre_triton(x, fn, sc, base, *args, on_gpu=True, **tiling)
    K.mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *args, on_gpu=True, **tiling)


@pytest.mark.parametrize("tiling", TILINGS)
def test_each_launch_is_compiled_for_how_it_is_launched(recorded, tiling):
    pre_and_boundary(tiling)
    kinds = [kind for kind, *_ in recorded]
    assert kinds == ["partials", "finalize"] * 2
    for (_, c1, pdl1, _), (_, c2, pdl2, args2), boundary in zip(recorded[::2], recorded[1::2],
                                                                (False, True)):
        # launch 1 waits for the launch before it only where it is a dependent launch
        assert c1["WAIT"] is pdl1
        # launch 1 lets the finalize start early exactly where the finalize is a dependent one
        assert c1["PDL"] is pdl2
        assert c2["PDL"] is pdl2
        # the finalize's order of release and wait: early unless the plan says after
        assert c2["EARLY_RELEASE"] is (pdl2 and tiling.get("early_release", True))
        # the boundary forms x in launch 1: the finalize reads it only after its wait
        assert c2["X_EARLY"] is (not boundary)
        num_splits = args2[10]
        assert c2["BLOCK_S"] == triton.next_power_of_2(num_splits) and c2["BLOCK_S"] >= num_splits
        assert c1["NROWS"] == c2["SLOT_D"] == K.NMIX and c1["ROWS_PAD"] == 32
    expected_pdl = tiling.get("pdl", True)
    expected_wait = expected_pdl and tiling.get("wait", True) and "num_splits" not in tiling
    assert [r[2] for r in recorded] == [expected_wait, expected_pdl] * 2


def test_the_fused_tails_four_rows_are_padded_to_four(recorded):
    """hc_head's 4 rows of fn (the fused tail): no padding to the boundary's 32, 4 slots."""
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(3, 40, torch.float32)
    K.mhc_post_head_triton(f, x, post, comb, hc_fn, sc, base, 1e-6, 1e-6, nw, 1e-6)
    (_, c1, _, _), (_, c2, _, _) = recorded
    assert c1["NROWS"] == c1["ROWS_PAD"] == c2["SLOT_D"] == K.HC
    assert c2["HEAD"] is True
