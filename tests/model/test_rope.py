import math

import pytest
import torch

from dsv4spec.model.config import YarnScaling
from dsv4spec.model.rope import apply_rope, rope_frequencies, rope_table, rotate


def test_frequencies_without_scaling():
    freqs = rope_frequencies(8, 10000.0)
    expected = torch.tensor([10000.0 ** (-i / 8) for i in (0, 2, 4, 6)], dtype=torch.float64)
    torch.testing.assert_close(freqs, expected)


def test_yarn_keeps_high_and_divides_low_frequencies():
    scaling = YarnScaling(factor=16, original_max_position_embeddings=65536, beta_fast=32,
                          beta_slow=1)
    plain, yarn = rope_frequencies(64, 160000.0), rope_frequencies(64, 160000.0, scaling)
    turns = plain * 65536 / (2 * math.pi)  # rotations over the original context
    fast, slow = turns > 32 * 1.5, turns < 1 / 1.5  # clear of the ramp's rounded ends
    assert fast.any() and slow.any()
    torch.testing.assert_close(yarn[fast], plain[fast])
    torch.testing.assert_close(yarn[slow], plain[slow] / 16)
    assert ((yarn <= plain) & (yarn >= plain / 16 * (1 - 1e-12))).all()


def as_complex(x, rd):
    return torch.view_as_complex(x[..., -rd:].double().unflatten(-1, (-1, 2)).contiguous())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rope_is_a_complex_rotation_of_interleaved_pairs(dtype):
    T, heads, D, rd = 5, 3, 16, 8
    x = torch.randn(T, heads, D).to(dtype)
    pos = torch.tensor([0, 1, 7, 130, 65537])
    freqs = rope_frequencies(rd, 10000.0)
    out = apply_rope(x, pos, freqs)
    assert out.dtype == dtype and torch.equal(out[..., :-rd], x[..., :-rd])
    expected = as_complex(x, rd) * torch.polar(torch.ones(T, rd // 2, dtype=torch.float64),
                                               pos[:, None].double() * freqs)[:, None, :]
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(as_complex(out, rd), expected, rtol=tol, atol=tol)


def test_inverse_undoes_and_scores_depend_on_relative_position():
    D, rd = 16, 8
    freqs = rope_frequencies(rd, 160000.0, YarnScaling())
    q, k = torch.randn(1, D, dtype=torch.float64), torch.randn(1, D, dtype=torch.float64)
    p = torch.tensor([300])
    torch.testing.assert_close(apply_rope(apply_rope(q, p, freqs), p, freqs, inverse=True), q)

    def score(pq, pk):
        return (apply_rope(q, torch.tensor([pq]), freqs) * apply_rope(k, torch.tensor([pk]), freqs)
                ).sum()

    torch.testing.assert_close(score(10, 3), score(1010, 1003))
    assert not torch.isclose(score(10, 3), score(10, 4))


def pairwise_rope(x, positions, freqs, inverse=False):
    """RoPE spelled out per pair (a, b) -> (a cos - b sin, a sin + b cos) at float64 angles."""
    rd = 2 * freqs.shape[0]
    angles = positions.double()[:, None] * freqs
    angles = -angles if inverse else angles
    compute = torch.promote_types(x.dtype, torch.float32)
    cos = angles.cos().to(compute).view(angles.shape[0], *([1] * (x.dim() - 2)), -1)
    sin = angles.sin().to(compute).view_as(cos)
    rot = x[..., -rd:].to(compute).unflatten(-1, (-1, 2))
    a, b = rot[..., 0], rot[..., 1]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rotated.to(x.dtype)), dim=-1)


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_table_rotation_equals_the_pairwise_formula_bit_for_bit(dtype, inverse):
    """The shared-table form (swap pairs, signed sin) rounds exactly like the pairwise one."""
    x = torch.randn(64, 3, 24).to(dtype)
    pos = torch.randint(0, 1 << 20, (64,))
    freqs = rope_frequencies(16, 160000.0, YarnScaling())
    expected = pairwise_rope(x, pos, freqs, inverse)
    assert torch.equal(apply_rope(x, pos, freqs, inverse=inverse), expected)
    cos, sin = rope_table(pos, freqs, torch.promote_types(dtype, torch.float32))
    assert torch.equal(rotate(x, cos, sin, inverse=inverse), expected)
