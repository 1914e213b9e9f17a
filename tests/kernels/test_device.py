"""Device helpers shared by the ops' kernels (dsv4spec/kernels/device.py), in the interpreter."""

import pytest
import torch
import triton
import triton.language as tl

from dsv4spec.kernels.device import sum_over_h


@triton.jit
def _sum_over_h_kernel(x_ptr, out_ptr, A: tl.constexpr, B: tl.constexpr, K: tl.constexpr):
    a = tl.arange(0, A)[:, None, None]
    b = tl.arange(0, B)[None, :, None]
    k = tl.arange(0, K)[None, None, :]
    x = tl.load(x_ptr + (a * B + b) * K + k)
    tl.store(out_ptr + a * B + b, sum_over_h(x))


def pairwise_tree(x: torch.Tensor) -> torch.Tensor:
    """(x0 + x1) + (x2 + x3) ... over the last axis, in float32, written out level by level."""
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


@pytest.mark.parametrize("K", [2, 4, 8, 32, 64, 128])
def test_sum_over_h_is_the_pairwise_tree_bit_for_bit(K):
    g = torch.Generator().manual_seed(K)
    # magnitudes spread over 2^-20 .. 2^20, so a different order of the adds changes the bits
    x = torch.randn(2, 4, K, generator=g) * torch.exp2(torch.randint(-20, 21, (2, 4, K),
                                                                     generator=g).float())
    out = torch.full((2, 4), float("nan"))
    _sum_over_h_kernel[(1,)](x, out, 2, 4, K)
    assert torch.equal(out, pairwise_tree(x))
    if K >= 8:  # the test can tell orders apart: the sequential sum differs somewhere
        sequential = x.clone()
        acc = sequential[..., 0]
        for i in range(1, K):
            acc = acc + sequential[..., i]
        assert not torch.equal(acc, out)
