"""Neutral compressor-state rows: ``kv = 0`` and ``score = -inf`` (each the half of a row).

A neutral row adds nothing to a compressed entry: its softmax weight over the block is
``exp(-inf) = 0``. Rings start neutral, a slot's rows become neutral when its request is admitted
or freed, and the rollback makes rejected drafts' rows neutral again.
"""

from __future__ import annotations

import torch


def neutralise(rows: torch.Tensor) -> torch.Tensor:
    """Make ``rows [..., 2 * w]`` neutral in place (first half 0, second half -inf); returns it."""
    half = rows.shape[-1] // 2
    rows[..., :half] = 0
    rows[..., half:] = float("-inf")
    return rows


def neutral_rows(num_rows: int, width: int, dtype: torch.dtype,
                 device: torch.device | str) -> torch.Tensor:
    """A new ``[num_rows, width]`` buffer of neutral rows."""
    return neutralise(torch.empty(num_rows, width, dtype=dtype, device=device))
