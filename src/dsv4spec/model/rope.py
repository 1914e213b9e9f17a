"""Rotary embedding on the last ``qk_rope_head_dim`` dims, interleaved pairs.

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


def rope_table(
    positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [T, 2 * len(freqs)]`` in ``dtype`` at ``positions [T]`` (angles in float64).

    Laid out per interleaved pair ``(2i, 2i+1)`` as ``(cos, cos)`` and ``(-sin, sin)``, so that
    :func:`rotate` is two multiplies and an add. Depends only on the positions and the rope kind,
    so the model builds it once per forward and kind, and every layer of that kind shares it.
    """
    angles = positions.to(torch.float64)[:, None] * freqs.to(positions.device)  # [T, rd/2]
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    return torch.stack((cos, cos), -1).flatten(-2), torch.stack((-sin, sin), -1).flatten(-2)


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool = False,
) -> torch.Tensor:
    """Rotate the last ``rd`` dims of ``x [T, ..., D]`` by a :func:`rope_table` ``[T, rd]``.

    Rotated in the table's dtype; the non-rotary dims pass through unchanged. Returns a new
    tensor in ``x.dtype``. Pair ``(a, b)`` becomes ``(a cos - b sin, b cos + a sin)``, which is
    ``x * cos + swap(x) * sin`` with the table's signed ``sin``; ``inverse`` subtracts instead,
    the rotation by the negated angle (``cos`` is even, ``sin`` odd, bit for bit).
    """
    rd = cos.shape[-1]
    shape = (cos.shape[0], *([1] * (x.dim() - 2)), rd)
    cos, sin = cos.view(shape), sin.view(shape)
    rot = x[..., -rd:].to(cos.dtype)
    swapped = rot.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (b, a) for each pair (a, b)
    rotated = rot * cos - swapped * sin if inverse else rot * cos + swapped * sin
    return torch.cat((x[..., :-rd], rotated.to(x.dtype)), dim=-1)


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, *, inverse: bool = False,
) -> torch.Tensor:
    """Rotate the last ``2 * len(freqs)`` dims of ``x [T, ..., D]`` at ``positions [T]``.

    Computed in float64 angles, rotated in ``x``'s dtype (float32 at least); the non-rotary dims
    pass through unchanged. Returns a new tensor in ``x.dtype``.
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    return rotate(x, *rope_table(positions, freqs, compute), inverse=inverse)
