"""KV compression math: gated softmax pooling of a block of raw rows into one entry.

A compressor of ratio ``m`` turns each token ``p`` into a raw row ``[kv | score]`` with
``score = wgate(x_p) + ape[p mod m]`` (float32). Entry ``j`` pools, per channel ``c``,
``K_j[c] = sum_p softmax_p(score_p[c]) * kv_p[c]``, then gets the compressor's RMSNorm and RoPE at
position ``j * m``. Non-overlapping (ratio 128): the rows of block ``j``. Overlapping (ratio 4):
rows are ``2 * D`` wide, and entry ``j`` pools the first halves of block ``j - 1``'s rows together
with the second halves of block ``j``'s (nothing before block 0). A neutral row (``kv = 0``,
``score = -inf``) contributes nothing, which is why state rings are reset to it.
"""

from __future__ import annotations

import torch

from dsv4spec.model.config import OVERLAP_RATIO


def pool(kv: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """``[..., n, D]`` rows -> ``[..., D]``: per-channel softmax over ``n`` weighting ``kv``."""
    return (torch.softmax(score, dim=-2) * kv).sum(-2)


def overlap_halves(rows: torch.Tensor, ratio: int = OVERLAP_RATIO) -> torch.Tensor:
    """Rows ``[..., 2 * ratio, 2D]``, block ``j - 1``'s then block ``j``'s, to the pooling set
    ``[..., 2 * ratio, D]``: the first block's first halves, then the second's second halves."""
    D = rows.shape[-1] // 2
    return torch.cat((rows[..., :ratio, :D], rows[..., ratio:, D:]), -2)


def overlapped_blocks(
    kv: torch.Tensor, score: torch.Tensor, ratio: int = OVERLAP_RATIO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[nb * ratio, 2D]`` rows of whole blocks -> ``[nb, 2 * ratio, D]`` pooling sets.

    Set ``j``: first halves of block ``j - 1`` (neutral rows for ``j = 0``), then second halves
    of block ``j``.
    """
    n, width = kv.shape
    kv_b, score_b = kv.view(n // ratio, ratio, width), score.view(n // ratio, ratio, width)
    prev_kv = torch.cat((kv_b.new_zeros(1, ratio, width), kv_b[:-1]))  # neutral before block 0
    prev_score = torch.cat((score_b.new_full((1, ratio, width), float("-inf")), score_b[:-1]))
    return (overlap_halves(torch.cat((prev_kv, kv_b), 1), ratio),
            overlap_halves(torch.cat((prev_score, score_b), 1), ratio))


def compress_rows(kv: torch.Tensor, score: torch.Tensor, ratio: int) -> torch.Tensor:
    """Entries of whole blocks: ``kv``, ``score`` ``[nb * ratio, coff * D]`` -> ``[nb, D]``.

    ``coff`` is 2 for the overlapping ratio 4, else 1. This is the reference the model's
    incremental compression (from state rings) is tested against.
    """
    n = kv.shape[0]
    if n % ratio:
        raise ValueError(f"rows must be whole blocks of {ratio}, got {n}")
    if ratio == OVERLAP_RATIO:
        kv_sets, score_sets = overlapped_blocks(kv, score, ratio)
    else:
        kv_sets = kv.view(n // ratio, ratio, -1)
        score_sets = score.view(n // ratio, ratio, -1)
    return pool(kv_sets, score_sets)
