"""Per-layer C128 compressor state rings for a pool of request slots (layout and rollback
contract: docs/design.md)."""

from __future__ import annotations

import torch

from dsv4spec.cache.neutral import neutral_rows, neutralise
from dsv4spec.ops.c128_cleanup import C128DraftCleanup, clear_unaccepted_c128_draft_states

CLEANUP_IMPLS = ("fused", "loop")


class C128StatePool:
    """One ``[kv | score]`` ring buffer per C128 layer, separate allocations, neutral at start.

    Slot ``r``'s token ``p`` lives in row ``r * ring_size + p % ring_size``. Each buffer has
    ``num_slots * ring_size`` slot rows, one spare ring (slot ``num_slots``, a scratch slot for
    CUDA-graph padding rows) and a sentinel row last: ``num_slots * ring + ring + 1`` rows.

    Parameters
    ----------
    num_layers : int
        Number of C128 layers (``ModelConfig.num_c128_layers``: 31 for DSV4-Pro, 20 for
        DSV4-Flash).
    num_slots : int
        Request slots.
    ring_size : int
        128 without speculation, 256 with it.
    head_dim : int
        Row width is ``2 * head_dim`` (512 on DSV4).
    dtype : torch.dtype
        float32 (default) or bfloat16.
    cleanup : {"fused", "loop"}
        Rollback through one fused launch or one launch per layer (the baseline).
    """

    def __init__(
        self, num_layers: int, num_slots: int, *, ring_size: int = 256, head_dim: int = 512,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
        cleanup: str = "fused", max_num_draft_tokens: int = 8,
    ) -> None:
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive, got {num_layers}")
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        if cleanup not in CLEANUP_IMPLS:
            raise ValueError(f"cleanup must be one of {CLEANUP_IMPLS}, got {cleanup!r}")
        self.num_slots = num_slots
        self.ring_size = ring_size
        self.head_dim = head_dim
        self.cleanup_impl = cleanup
        # The per-layer kernel of the "loop" rollback (benchmarks swap in SGLang's own).
        self.per_layer_clear = clear_unaccepted_c128_draft_states
        self.num_rows = num_slots * ring_size + ring_size + 1
        self.states = [neutral_rows(self.num_rows, 2 * head_dim, dtype, device)
                       for _ in range(num_layers)]
        self.cleanup = C128DraftCleanup(self.states, ring_size=ring_size,
                                        max_num_draft_tokens=max_num_draft_tokens)

    def slot_rows(self, slot: int) -> slice:
        return slice(slot * self.ring_size, (slot + 1) * self.ring_size)

    def reset_slot(self, slot: int) -> None:
        """Make every row of one request's ring neutral (request admitted or freed)."""
        if not 0 <= slot <= self.num_slots:
            raise ValueError(f"slot must lie in [0, {self.num_slots}], got {slot}")
        rows = self.slot_rows(slot)
        for state in self.states:
            neutralise(state[rows])

    def clear_unaccepted_c128_draft_states(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, accept_lens: torch.Tensor,
        num_draft_tokens: int,
    ) -> None:
        """Make the rows of each request's rejected drafts neutral in every C128 layer: one fused
        launch, or the per-layer loop."""
        if self.cleanup_impl == "fused":
            self.cleanup.clear(req_pool_indices, seq_lens, accept_lens,
                               num_draft_tokens=num_draft_tokens)
            return
        for state in self.states:
            self.per_layer_clear(
                state, req_pool_indices, seq_lens, accept_lens, ring_size=self.ring_size,
                num_draft_tokens=num_draft_tokens)
