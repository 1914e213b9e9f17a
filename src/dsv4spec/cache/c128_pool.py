"""Per-layer C128 compressor state rings for a pool of request slots (SPEC §4 layout)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsv4spec.ops.c128_cleanup import C128DraftCleanup, clear_unaccepted_c128_draft_states

CLEANUP_IMPLS = ("fused", "loop")


def count_c128_layers(compress_ratios: Sequence[int]) -> int:
    """C128 layers of a model; ``compress_ratios`` carries one trailing entry for the MTP layer."""
    return sum(1 for r in compress_ratios[:-1] if r == 128)


class C128StatePool:
    """One ``[kv | score]`` ring buffer per C128 layer, separate allocations, neutral at start.

    Slot ``r``'s token ``p`` lives in row ``r * ring_size + p % ring_size``. Each buffer has
    ``num_slots * ring_size`` slot rows, one spare ring (slot ``num_slots``, a scratch slot for
    CUDA-graph padding rows) and a sentinel row last: ``num_slots * ring + ring + 1`` rows.

    Parameters
    ----------
    num_layers : int
        Number of C128 layers (31 for DSV4-Pro, 20 for DSV4-Flash).
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
        self.states = [
            self._neutral_buffer(self.num_rows, dtype, torch.device(device))
            for _ in range(num_layers)
        ]
        self.cleanup = C128DraftCleanup(self.states, ring_size=ring_size,
                                        max_num_draft_tokens=max_num_draft_tokens)

    @classmethod
    def from_compress_ratios(cls, compress_ratios: Sequence[int], num_slots: int,
                             **kwargs) -> C128StatePool:
        """A pool with one ring per ratio-128 layer of a released config's ``compress_ratios``."""
        return cls(count_c128_layers(compress_ratios), num_slots, **kwargs)

    def _neutral_buffer(self, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buf = torch.empty(rows, 2 * self.head_dim, dtype=dtype, device=device)
        buf[:, : self.head_dim] = 0
        buf[:, self.head_dim:] = float("-inf")
        return buf

    def slot_rows(self, slot: int) -> slice:
        return slice(slot * self.ring_size, (slot + 1) * self.ring_size)

    def reset_slot(self, slot: int) -> None:
        """Make every row of one request's ring neutral (request admitted or freed)."""
        if not 0 <= slot <= self.num_slots:
            raise ValueError(f"slot must lie in [0, {self.num_slots}], got {slot}")
        rows = self.slot_rows(slot)
        for state in self.states:
            state[rows, : self.head_dim] = 0
            state[rows, self.head_dim:] = float("-inf")

    def clear_unaccepted_c128_draft_states(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, accept_lens: torch.Tensor,
        num_draft_tokens: int,
    ) -> None:
        """SPEC §4 rollback over every C128 layer: one fused launch, or the per-layer loop."""
        if self.cleanup_impl == "fused":
            self.cleanup.clear(req_pool_indices, seq_lens, accept_lens,
                               num_draft_tokens=num_draft_tokens)
            return
        for state in self.states:
            self.per_layer_clear(
                state, req_pool_indices, seq_lens, accept_lens, ring_size=self.ring_size,
                num_draft_tokens=num_draft_tokens)
