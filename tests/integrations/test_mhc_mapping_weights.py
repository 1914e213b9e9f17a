"""Which norm weights map to dsv4spec's fused RMSNorm: a bf16 ``[hidden_size]`` tensor with its
epsilon, nothing else (the engines round the weight to bf16; the op would take another as is)."""

import pytest
import torch

from dsv4spec.integrations.mhc import pre_kwargs


@pytest.mark.parametrize("weight,norm_eps", [
    pytest.param(torch.ones(7, dtype=torch.bfloat16), 0.5, id="another width"),
    pytest.param(torch.ones(1, 8, dtype=torch.bfloat16), 0.5, id="2-D"),
    pytest.param(torch.ones(8), 0.5, id="float32"),
    pytest.param([1.0] * 8, 0.5, id="not a tensor"),
    pytest.param(torch.ones(8, dtype=torch.bfloat16), None, id="no epsilon"),
])
def test_only_a_bf16_weight_of_the_width_maps(weight, norm_eps):
    assert pre_kwargs(0.25, 1.0, 1.0, 2.0, 20, weight, norm_eps, 8) is None


def test_a_bf16_weight_of_the_width_maps():
    weight = torch.ones(8, dtype=torch.bfloat16)
    assert pre_kwargs(0.25, 1.0, 1.0, 2.0, 20, weight, 0.5, 8)["norm_weight"] is weight
