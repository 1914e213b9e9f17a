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

from dsv4spec.kernels.launch import LaunchCache, alignment_key

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
    neg_inf = zero - float("inf")
    tl.store(state_ptr + offs + HALF, neg_inf.to(state_ptr.dtype.element_ty), mask=mask)


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
    """(DRAFT_BLOCK, HALF_BLOCK, column blocks) for a ``[draft, 256]`` tile per program.

    Swept on the H200 (dsv4spec bench cleanup-sweep, HALF_BLOCK 64..512 x 1..8 warps): 256 columns
    is within 4% of the best tile at every (31 states, bs 1..256) geometry in fp32 and bf16.
    """
    draft_block = triton.next_power_of_2(max(num_draft_tokens, 1))
    half_block = min(triton.next_power_of_2(half), 256)
    return draft_block, half_block, triton.cdiv(half, half_block)


def cleanup_num_warps(batch: int) -> int:
    # Few programs (bs < 8): 4 warps shorten each program's stores; many: 1 warp each keeps
    # more programs resident (the 256/1 vs 256/4 tiles at (31, 256, 8) fp32 in
    # benchmarks/results/logs/tune_cleanup.log).
    return 4 if batch < 8 else 1


_FUSED = LaunchCache(_c128_cleanup_fused_kernel)
_PER_STATE = LaunchCache(_c128_cleanup_kernel)


def c128_cleanup_fused_triton(
    table: torch.Tensor, dtype: torch.dtype, num_states: int, num_rows: int, half: int,
    ring_size: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor, num_draft_tokens: int,
) -> None:
    """One launch over every state whose base address is in ``table`` (int64, on the device)."""
    batch = req_pool_indices.shape[0]
    ptrs = (table.data_ptr(), req_pool_indices.data_ptr(), seq_lens.data_ptr(),
            accept_lens.data_ptr())
    key = (batch, num_draft_tokens, dtype, num_states, num_rows, half, ring_size,
           req_pool_indices.dtype, seq_lens.dtype, accept_lens.dtype, table.get_device(),
           alignment_key(*ptrs))
    direct = _FUSED.get(key)
    if direct is not None:
        direct(*ptrs)
        return
    draft_block, half_block, n_col = cleanup_launch_config(half, num_draft_tokens)
    _FUSED.launch(
        key, (batch, num_states * n_col, 1),
        (table, req_pool_indices, seq_lens, accept_lens, num_rows, num_draft_tokens),
        {"DTYPE": _TRITON_DTYPES[dtype], "HALF": half, "RING": ring_size, "N_COL_BLOCKS": n_col,
         "DRAFT_BLOCK": draft_block, "HALF_BLOCK": half_block},
        cleanup_num_warps(batch),
    )


def c128_cleanup_fused_precompile(
    table: torch.Tensor, dtype: torch.dtype, num_states: int, num_rows: int, half: int,
    ring_size: int, index_dtypes: tuple[torch.dtype, torch.dtype, torch.dtype],
    num_draft_tokens: int,
) -> None:
    """Compile the fused kernel for every batch size (one variant per warp count of
    :func:`cleanup_num_warps`), launching nothing: a server's first batch of a new size then
    compiles nothing. ``index_dtypes``: those of req_pool_indices, seq_lens and accept_lens."""
    from triton.runtime.jit import MockTensor

    if table.get_device() < 0:
        return  # the interpreter compiles nothing
    draft_block, half_block, n_col = cleanup_launch_config(half, num_draft_tokens)
    with torch.cuda.device(table.get_device()):
        for batch in (1, 8):
            _FUSED.kernel.warmup(
                table, *(MockTensor(d) for d in index_dtypes), num_rows, num_draft_tokens,
                grid=(batch, num_states * n_col, 1), DTYPE=_TRITON_DTYPES[dtype], HALF=half,
                RING=ring_size, N_COL_BLOCKS=n_col, DRAFT_BLOCK=draft_block,
                HALF_BLOCK=half_block, num_warps=cleanup_num_warps(batch))


def c128_cleanup_fused_triton_tiled(
    table: torch.Tensor, dtype: torch.dtype, num_states: int, num_rows: int, half: int,
    ring_size: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor, num_draft_tokens: int, *, half_block: int, num_warps: int,
) -> None:
    """:func:`c128_cleanup_fused_triton` on an explicit tile (``half_block`` columns of each half
    per program, ``num_warps``), through Triton's own launch path. For tuning scripts."""
    n_col = triton.cdiv(half, half_block)
    _c128_cleanup_fused_kernel[(req_pool_indices.shape[0], num_states * n_col)](
        table, req_pool_indices, seq_lens, accept_lens, num_rows, num_draft_tokens,
        DTYPE=_TRITON_DTYPES[dtype], HALF=half, RING=ring_size, N_COL_BLOCKS=n_col,
        DRAFT_BLOCK=triton.next_power_of_2(max(num_draft_tokens, 1)), HALF_BLOCK=half_block,
        num_warps=num_warps)


def c128_cleanup_triton(
    state: torch.Tensor, ring_size: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    accept_lens: torch.Tensor, num_draft_tokens: int,
) -> None:
    """One launch for one state ``[rows, 2*half]`` (the per-layer baseline)."""
    num_rows, width = state.shape
    batch = req_pool_indices.shape[0]
    ptrs = (state.data_ptr(), req_pool_indices.data_ptr(), seq_lens.data_ptr(),
            accept_lens.data_ptr())
    key = (batch, num_draft_tokens, state.dtype, num_rows, width, ring_size,
           req_pool_indices.dtype, seq_lens.dtype, accept_lens.dtype, state.get_device(),
           alignment_key(*ptrs))
    direct = _PER_STATE.get(key)
    if direct is not None:
        direct(*ptrs)
        return
    draft_block, half_block, n_col = cleanup_launch_config(width // 2, num_draft_tokens)
    _PER_STATE.launch(
        key, (batch, n_col, 1),
        (state, req_pool_indices, seq_lens, accept_lens, num_rows, num_draft_tokens),
        {"HALF": width // 2, "RING": ring_size, "DRAFT_BLOCK": draft_block,
         "HALF_BLOCK": half_block},
        cleanup_num_warps(batch),
    )
