"""Rotary embedding on the last ``qk_rope_head_dim`` dims, interleaved pairs (SPEC §2).

Window-only layers and the MTP layer use ``rope_theta``; compressor layers use
``compress_rope_theta`` with YaRN (``rope_scaling``). Pairs ``(2i, 2i+1)`` of the rotary part
rotate by ``position * freq_i``; the inverse rotation (``inverse=True``) undoes it, which the
attention applies to its output because values share the keys' rotated latent.
"""

from __future__ import annotations

import math

import torch

from dsv4spec.model.config import YarnScaling


def rope_frequencies(dim: int, theta: float, scaling: YarnScaling | None = None) -> torch.Tensor:
    """``[dim // 2]`` float64 angular frequencies, YaRN-interpolated when ``scaling`` is given.

    YaRN keeps the frequencies of the dims that turn more than ``beta_fast`` times over the
    original context, divides by ``factor`` those that turn fewer than ``beta_slow`` times, and
    ramps linearly in between (DeepSeek-V3's form).
    """
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if scaling is None:
        return freqs

    def correction_dim(rotations: float) -> float:
        length = scaling.original_max_position_embeddings
        return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
    high = min(math.ceil(correction_dim(scaling.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: keep the frequency (high), 0: interpolate by the factor (low)
    return freqs / scaling.factor * (1 - keep) + freqs * keep


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, *, inverse: bool = False,
) -> torch.Tensor:
    """Rotate the last ``2 * len(freqs)`` dims of ``x [T, ..., D]`` at ``positions [T]``.

    Computed in float64 angles, rotated in ``x``'s dtype (float32 at least); the non-rotary dims
    pass through unchanged. Returns a new tensor in ``x.dtype``.
    """
    rd = 2 * freqs.shape[0]
    angles = positions.to(torch.float64)[:, None] * freqs.to(positions.device)  # [T, rd/2]
    if inverse:
        angles = -angles
    compute = torch.promote_types(x.dtype, torch.float32)
    cos = angles.cos().to(compute).view(angles.shape[0], *([1] * (x.dim() - 2)), -1)
    sin = angles.sin().to(compute).view_as(cos)
    rot = x[..., -rd:].to(compute).unflatten(-1, (-1, 2))
    a, b = rot[..., 0], rot[..., 1]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rotated.to(x.dtype)), dim=-1)
