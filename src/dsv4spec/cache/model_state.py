"""Per-request state of the DSV4-style model: window KV rings, compressor state rings, entries.

Request slots ``0 .. num_slots - 1`` plus one scratch slot (``num_slots``) that CUDA-graph padding
rows use. Per layer:

- ``window[l]``: ``[slots + 1, window_ring, head_dim]``; position ``p`` of slot ``r`` at
  ``[r, p % window_ring]``. ``window_ring = sliding_window + max_num_draft_tokens``, so a verify
  batch's writes never clobber a key its first token still reads.
- compressor layers: ``rows[l]``, the raw ``[kv | score]`` rows in the ring layout of
  docs/design.md (row ``slot * ring + p % ring``, one spare ring and a sentinel row; width
  ``2 * coff * head_dim``);
  the non-overlapping layers' rings are a :class:`C128StatePool` (fused rollback). And
  ``entries[l]``: ``[slots + 1, max_entries, head_dim]``, entry ``j`` = block ``j``'s compressed
  key, normed and rotated.

Admitting or freeing a slot makes its rows neutral (``kv = 0``, ``score = -inf``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsv4spec.cache.c128_pool import C128StatePool
from dsv4spec.cache.neutral import neutral_rows, neutralise


class ModelState:
    """All request state of one model: one entry per layer (target layers, then the MTP layer).

    Parameters
    ----------
    layer_ratios : sequence of int
        Each layer's compression ratio: 0 (window only), ``c128_ratio`` (non-overlapping) or
        another value (the overlapping ratio 4, rows twice as wide).
    ring_sizes : dict
        Ratio -> rows per request of its state ring (``ModelConfig.state_ring_size``).
    c128_ratio, head_dim, sliding_window : int
    num_slots, max_seq_len : int
        Request slots; longest sequence (sizes the entries).
    max_num_draft_tokens : int
        Longest verify or draft-extend batch per request; widens the window ring.
    """

    def __init__(
        self, layer_ratios: Sequence[int], ring_sizes: dict[int, int], *, c128_ratio: int,
        head_dim: int, sliding_window: int, num_slots: int, max_seq_len: int,
        max_num_draft_tokens: int = 8, dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots <= 0 or max_seq_len <= 0:
            raise ValueError(f"num_slots and max_seq_len must be positive, got {num_slots}, "
                             f"{max_seq_len}")
        self.layer_ratios = tuple(layer_ratios)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.max_num_draft_tokens = max_num_draft_tokens
        self.window_ring = sliding_window + max_num_draft_tokens
        self.ring_size = dict(ring_sizes)
        device = torch.device(device)
        D = head_dim
        ratios = self.layer_ratios
        self.window = [torch.zeros(num_slots + 1, self.window_ring, D, dtype=dtype, device=device)
                       for _ in ratios]
        c128 = [i for i, r in enumerate(ratios) if r == c128_ratio]
        self.c128 = C128StatePool(
            max(len(c128), 1), num_slots, ring_size=self.ring_size.get(c128_ratio, 1),
            head_dim=D, dtype=torch.float32, device=device,
            max_num_draft_tokens=max(max_num_draft_tokens, 2))
        self.rows: list[torch.Tensor | None] = [None] * len(ratios)
        self.entries: list[torch.Tensor | None] = [None] * len(ratios)
        for k, i in enumerate(c128):
            self.rows[i] = self.c128.states[k]
        for i, r in enumerate(ratios):
            if r and r != c128_ratio:  # the overlapping compressor: [kv (2D) | score (2D)]
                ring = self.ring_size[r]
                self.rows[i] = neutral_rows((num_slots + 1) * ring + 1, 2 * 2 * D,
                                            torch.float32, device)
            if r:
                self.entries[i] = torch.zeros(num_slots + 1, max_seq_len // r + 1, D,
                                              dtype=dtype, device=device)

    def reset_slot(self, slot: int) -> None:
        """Neutral rows, zero window and entries for one slot (request admitted or freed)."""
        if not 0 <= slot <= self.num_slots:
            raise ValueError(f"slot must lie in [0, {self.num_slots}], got {slot}")
        for i, r in enumerate(self.layer_ratios):
            self.window[i][slot] = 0
            if r:
                ring = self.ring_size[r]
                neutralise(self.rows[i][slot * ring:(slot + 1) * ring])
                self.entries[i][slot] = 0

    def clear_unaccepted_draft_rows(
        self, slots: torch.Tensor, seq_lens: torch.Tensor, accept_lens: torch.Tensor,
        num_draft_tokens: int,
    ) -> None:
        """Neutralise the rejected drafts' rows of the non-overlapping rings (one fused launch)."""
        self.c128.clear_unaccepted_c128_draft_states(slots, seq_lens, accept_lens,
                                                     num_draft_tokens)
