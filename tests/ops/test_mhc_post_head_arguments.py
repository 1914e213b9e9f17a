"""The model tail op's epsilons and their checks: the float64 reference normalises with the final
norm's own epsilon, and a final-norm epsilon given without a weight is still checked."""

import pytest
import torch

from dsv4spec.ops import mhc_post_head

from .test_mhc import assert_close
from .test_mhc_post_head import float64_tail, tail_inputs


def test_the_reference_takes_the_final_norms_own_epsilon():
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(3, 40, torch.float32)
    new, y = mhc_post_head(f, x, post, comb, hc_fn, sc, base, norm_eps=0.25, hc_eps=1.0,
                           norm_weight=nw, final_norm_eps=0.5, impl="reference")
    ref_new, ref_y = float64_tail(f, x, post, comb, hc_fn, sc, base, nw, 0.25, 1.0, 0.5)
    assert torch.equal(new, ref_new)
    assert_close(y, ref_y, what="hidden")


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("final_norm_eps", [-1.0, "1e-6", True])
def test_a_final_norm_epsilon_without_a_weight_is_checked(impl, final_norm_eps):
    f, x, post, comb, hc_fn, sc, base, _ = tail_inputs(2, 8, torch.float32)
    with pytest.raises(ValueError, match="final_norm_eps"):
        mhc_post_head(f, x, post, comb, hc_fn, sc, base, norm_eps=1e-6, hc_eps=1e-6,
                      final_norm_eps=final_norm_eps, impl=impl)
