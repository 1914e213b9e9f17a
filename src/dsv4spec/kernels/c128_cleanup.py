"""Triton kernels that neutralise C128 ring rows written by rejected draft tokens.

A neutral row is ``kv = 0`` (first half of the row), ``score = -inf`` (second half). Program
``(b, s * n_col_blocks + c)`` owns batch row ``b``, state ``s`` and column block ``c`` of the half
width, and writes a ``[DRAFT_BLOCK, HALF_BLOCK]`` tile of kv zeros plus the matching tile of
-inf scores. Only draft indices ``j`` in ``[accept_lens[b], num_draft_tokens)`` are stored and only
rows inside ``[0, num_rows)``, so no index value can make the kernel write outside a state.

Bytes: the kernel only writes, ``states * sum_b(num_draft - accept_b) * 2 * half * elt`` bytes,
plus 3 index loads per program.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton import knobs

# Launch grids fold (state, column block) into axis 1, whose CUDA limit is 65535.
GRID_AXIS_LIMIT = 65535


@triton.jit
def _neutralise_rows(
    state_ptr, slot_ptr, seq_ptr, accept_ptr, b, c, num_rows, num_draft_tokens,
    HALF: tl.constexpr, RING: tl.constexpr, DRAFT_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr,
):
    slot = tl.load(slot_ptr + b).to(tl.int64)
    seq = tl.load(seq_ptr + b).to(tl.int64)
    accept = tl.load(accept_ptr + b).to(tl.int64)
    j = tl.arange(0, DRAFT_BLOCK).to(tl.int64)
    # Floor modulo (Python/torch semantics) so negative positions map like the reference.
    pos = (seq + j) % RING
    pos = tl.where(pos < 0, pos + RING, pos)
    row = slot * RING + pos
    row_ok = (j >= accept) & (j < num_draft_tokens) & (row >= 0) & (row < num_rows)
    col = c * HALF_BLOCK + tl.arange(0, HALF_BLOCK)
    col_ok = col < HALF
    mask = row_ok[:, None] & col_ok[None, :]
    offs = row[:, None] * (2 * HALF) + col[None, :]
    zero = tl.zeros((DRAFT_BLOCK, HALF_BLOCK), dtype=tl.float32)
    # bf16 constants are built in fp32 and cast (Triton 3.6's interpreter cannot build them).
    tl.store(state_ptr + offs, zero.to(state_ptr.dtype.element_ty), mask=mask)
    tl.store(state_ptr + offs + HALF, (zero - float("inf")).to(state_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _c128_cleanup_fused_kernel(
    table_ptr, slot_ptr, seq_ptr, accept_ptr, num_rows, num_draft_tokens,
    DTYPE: tl.constexpr, HALF: tl.constexpr, RING: tl.constexpr, N_COL_BLOCKS: tl.constexpr,
    DRAFT_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    sc = tl.program_id(1)
    s = sc // N_COL_BLOCKS
    c = sc % N_COL_BLOCKS
    state_ptr = tl.load(table_ptr + s).to(tl.pointer_type(DTYPE))
    _neutralise_rows(state_ptr, slot_ptr, seq_ptr, accept_ptr, b, c, num_rows, num_draft_tokens,
                     HALF, RING, DRAFT_BLOCK, HALF_BLOCK)


@triton.jit
def _c128_cleanup_kernel(
    state_ptr, slot_ptr, seq_ptr, accept_ptr, num_rows, num_draft_tokens,
    HALF: tl.constexpr, RING: tl.constexpr, DRAFT_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    _neutralise_rows(state_ptr, slot_ptr, seq_ptr, accept_ptr, b, c, num_rows, num_draft_tokens,
                     HALF, RING, DRAFT_BLOCK, HALF_BLOCK)


_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}


@functools.lru_cache(maxsize=None)
def cleanup_launch_config(half: int, num_draft_tokens: int) -> tuple[int, int, int]:
    """(DRAFT_BLOCK, HALF_BLOCK, column blocks): a tile of at most 4096 elements per half.

    One program per (batch row, state) writes all its rejected rows at DSV4 width (half 512,
    <= 8 drafts), which keeps programs few at bs 1 and each one's stores wide.
    """
    draft_block = triton.next_power_of_2(max(num_draft_tokens, 1))
    half_block = min(triton.next_power_of_2(half), max(16, 4096 // draft_block))
    return draft_block, half_block, triton.cdiv(half, half_block)


class FusedCleanupLauncher:
    """Launches the fused kernel over one pointer table, optionally skipping Triton's dispatcher.

    ``kernel[grid](...)`` re-binds and re-specialises every argument on each call, which costs
    more host time than the launch itself (measured: 15.8 µs per empty-kernel call on an H200
    host). With ``cached=True`` the first launch for a specialisation key goes through Triton
    and returns its compiled kernel; later launches with the same key call that kernel's
    launcher directly. The key holds everything Triton specialises on that can change between
    calls here: ``num_draft_tokens``, the index dtypes and their 16-byte alignment; the table,
    row count and geometry are fixed per launcher. Launch hooks (profilers) and the interpreter
    always take Triton's own path.
    """

    def __init__(self, table: torch.Tensor, dtype: torch.dtype, num_states: int, num_rows: int,
                 half: int, ring_size: int, *, cached: bool = True) -> None:
        self.table, self.num_states, self.num_rows = table, num_states, num_rows
        self.half, self.ring_size = half, ring_size
        self.triton_dtype = _TRITON_DTYPES[dtype]
        self.cached = cached and table.device.type == "cuda"
        self._compiled: dict[tuple, object] = {}

    def __call__(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 accept_lens: torch.Tensor, num_draft_tokens: int) -> None:
        draft_block, half_block, n_col = cleanup_launch_config(self.half, num_draft_tokens)
        grid = (req_pool_indices.shape[0], self.num_states * n_col)
        args = (self.table, req_pool_indices, seq_lens, accept_lens, self.num_rows,
                num_draft_tokens, self.triton_dtype, self.half, self.ring_size, n_col,
                draft_block, half_block)
        key = None
        if self.cached and knobs.runtime.launch_enter_hook is None:
            key = (num_draft_tokens,
                   *((t.dtype, t.data_ptr() % 16 == 0) for t in args[1:4]))
            compiled = self._compiled.get(key)
            if compiled is not None:
                stream = torch._C._cuda_getCurrentRawStream(self.table.device.index)
                compiled.run(grid[0], grid[1], 1, stream, compiled.function,
                             compiled.packed_metadata, None, None, None, *args)
                return
        compiled = _c128_cleanup_fused_kernel[grid](*args, num_warps=4)
        if key is not None:
            self._compiled[key] = compiled


def c128_cleanup_triton(
    state: torch.Tensor, ring_size: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor, num_draft_tokens: int,
) -> None:
    """One launch for one state ``[rows, 2*half]`` (the per-layer baseline)."""
    half = state.shape[1] // 2
    draft_block, half_block, n_col = cleanup_launch_config(half, num_draft_tokens)
    grid = (req_pool_indices.shape[0], n_col)
    _c128_cleanup_kernel[grid](
        state, req_pool_indices, seq_lens, accept_lens, state.shape[0], num_draft_tokens,
        HALF=half, RING=ring_size, DRAFT_BLOCK=draft_block, HALF_BLOCK=half_block, num_warps=4,
    )
