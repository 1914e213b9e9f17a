"""The engines' mHC arguments mapped to dsv4spec's: each epsilon goes where it belongs."""

import torch

from dsv4spec.integrations.mhc import pre_kwargs


def test_each_epsilon_goes_to_its_own_argument():
    weight = torch.ones(8, dtype=torch.bfloat16)
    kwargs = pre_kwargs(rms_eps=0.25, hc_pre_eps=1.0, hc_sinkhorn_eps=1.0,
                        hc_post_mult_value=2.0, sinkhorn_repeat=20, norm_weight=weight,
                        norm_eps=0.5, hidden_size=8)
    assert kwargs.pop("norm_weight") is weight
    assert kwargs == {"rms_eps": 0.25, "hc_eps": 1.0, "sinkhorn_iters": 20, "post_mult": 2.0,
                      "norm_eps": 0.5}


def test_without_a_norm_weight_norm_eps_is_ignored():
    kwargs = pre_kwargs(0.25, 1.0, 1.0, 2.0, 20, None, 0.5, 8)
    assert "norm_eps" not in kwargs and "norm_weight" not in kwargs and kwargs["rms_eps"] == 0.25


def test_distinct_pre_and_sinkhorn_epsilons_do_not_map():
    assert pre_kwargs(0.25, 1.0, 0.5, 2.0, 20, None, 0.5, 8) is None
