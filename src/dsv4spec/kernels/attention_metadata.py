"""Triton device code for DeepSeek-V4 attention metadata bounded by each row's live length.

Two per-step metadata builders of SGLang's DSV4 attention backend write tables as wide as the
pool's whole context whatever a request holds: the page table (one column per page of capacity,
4,096 at 1M tokens and 256-token pages) and the C128 page indices (``page_size // 128`` entries per
column). These kernels compute the same values, but each row writes only the columns its live
length can reach plus a fixed slack; the rest of the row is left as allocated.

Written extent of row ``r`` (``seq_len = seq_lens[r]``), everything else untouched:

- page table: columns ``[0, min(num_pages, cdiv(max(seq_len, 0), page_size) + PAGE_TABLE_SLACK))``,
  each ``req_to_token[req_pool[r], column * page_size] // page_size``;
- C128 page indices: entries ``[0, min(width, round_up(max(seq_len // 128, 1), C128_BLOCK)
  + C128_SLACK))``, ``page_table[r, j // cps] * cps + j % cps`` below ``seq_len // 128`` and -1
  above it (``cps = page_size // 128``).

Every consumer SGLang 0.5.23 runs on SM90 reads within ``cdiv(seq_len, page_size)`` page-table
columns and ``round_up(max(seq_len // 128, 1), 64)`` C128 entries (the argument, consumer by
consumer, with the DeepGEMM and FlashMLA sources it rests on: ``dsv4spec.ops.attention_metadata``);
the slacks are margin beyond that.

A third kernel expands a fixed-width verify batch into its query rows in one launch: each of the
``bs`` requests becomes ``qo_len`` rows with causal lengths ``seq_len + shift - qo_len + 1 ..
seq_len + shift`` and the request's slot repeated (SGLang's ``expand_extend_with_same_length``,
optionally with the caller's ``seq_lens + shift`` folded in). Every output element is written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Page-table columns written past the last live page of a row. The readers' source bounds their
# reads by the live pages (none reads column cdiv(seq_len, page_size) or beyond); the 16 columns
# (1,024 C4 positions, four of DeepGEMM's 256-position splits) keep a reader that rounds its
# reach up to a whole split inside what is written.
PAGE_TABLE_SLACK = 16
# FlashMLA's sparse-decode block (TOPK_BLOCK_SIZE): it reads the C128 indices by blocks of 64
# below round_up(extra_topk_length, 64), so the extent is rounded up to it ...
C128_BLOCK = 64
# ... and extended by one further block, covering one block of index prefetch past the last.
C128_SLACK = 64
# Vector widths (elements per loop step). One step covers 128 pages (32K tokens at 256 per page).
PAGE_BLOCK = 128
C128_INDEX_BLOCK = 256
# Query rows per program of the expansion: a verify batch of up to 64 requests at 4 drafts is one
# program (a launch-bound kernel: more programs would only add scheduling).
EXPAND_BLOCK = 256


@triton.jit
def _page_table_positions_live_kernel(
    req_to_token, req_pool, seq_lens, seq_lens_out, positions_out, page_table, swa_lengths_out,
    req_to_token_stride, num_pages, page_size, swa_window,
    SLACK: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    seq_len = tl.load(seq_lens + row).to(tl.int32)
    tl.store(seq_lens_out + row, seq_len)
    tl.store(positions_out + row, seq_len - 1)
    tl.store(swa_lengths_out + row, tl.minimum(seq_len, swa_window))

    # Columns this row's tokens [0, seq_len) occupy, plus the slack, within the table.
    live_pages = (tl.maximum(seq_len, 0) + page_size - 1) // page_size
    extent = tl.minimum(live_pages + SLACK, num_pages)
    slot = tl.load(req_pool + row).to(tl.int64)
    src = req_to_token + slot * req_to_token_stride
    dst = page_table + row.to(tl.int64) * num_pages
    for start in range(0, extent, BLOCK):
        column = start + tl.arange(0, BLOCK)
        inside = column < extent
        token = tl.load(src + column.to(tl.int64) * page_size, mask=inside, other=0).to(tl.int32)
        tl.store(dst + column, token // page_size, mask=inside)


def page_table_positions_triton(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_pages: int, page_size: int, swa_window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch: ``(seq_lens int32 [R], positions int32 [R], page_table int32 [R, num_pages],
    swa_lengths int32 [R])``; the page table written to each row's extent only.

    Inputs are checked by :func:`dsv4spec.ops.build_page_table_positions`; ``req_to_token``'s
    rows may be strided, its columns must be contiguous.
    """
    rows = seq_lens.shape[0]
    device = seq_lens.device
    int32 = {"dtype": torch.int32, "device": device}
    seq_lens_out = torch.empty(rows, **int32)
    positions = torch.empty(rows, **int32)
    page_table = torch.empty((rows, num_pages), **int32)
    swa_lengths = torch.empty(rows, **int32)
    if rows:
        _page_table_positions_live_kernel[(rows,)](
            req_to_token, req_pool_indices, seq_lens, seq_lens_out, positions, page_table,
            swa_lengths, req_to_token.stride(0), num_pages, page_size, swa_window,
            SLACK=PAGE_TABLE_SLACK, BLOCK=PAGE_BLOCK,
        )
    return seq_lens_out, positions, page_table, swa_lengths


# num_write_rows changes with the batch: not specialised, so a new batch size compiles nothing.
@triton.jit(do_not_specialize=["num_write_rows"])
def _compressed_attn_metadata_live_kernel(
    seq_lens, positions, raw_out_loc, page_table,
    c4_out_loc, c4_positions, c4_lengths, c4_lengths_clamp1,
    c128_out_loc, c128_positions, c128_lengths, c128_lengths_clamp1, c128_page_indices,
    num_write_rows, max_pages, width,
    PAGE_ENTRIES: tl.constexpr, SLACK: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr,
    PAGE_INDICES: tl.constexpr,
):
    row = tl.program_id(0)
    seq_len = tl.load(seq_lens + row)
    position = tl.load(positions + row)
    # Rows past raw_out_loc (context-parallel padding) have no cache write.
    writes = row < num_write_rows
    out_loc = tl.load(raw_out_loc + row, mask=writes, other=0)

    # A compressed entry is written when the row completes a group of 4 (resp. 128) tokens.
    tl.store(c4_out_loc + row, tl.where((seq_len % 4) == 0, out_loc // 4, 0), mask=writes)
    tl.store(c4_positions + row, position & (~3))
    c4_len = seq_len // 4
    tl.store(c4_lengths + row, c4_len)
    tl.store(c4_lengths_clamp1 + row, tl.maximum(c4_len, 1))

    tl.store(c128_out_loc + row, tl.where((seq_len % 128) == 0, out_loc // 128, 0), mask=writes)
    tl.store(c128_positions + row, position & (~127))
    c128_len = seq_len // 128
    tl.store(c128_lengths + row, c128_len)
    tl.store(c128_lengths_clamp1 + row, tl.maximum(c128_len, 1))

    if PAGE_INDICES:
        # Entries a block-wise reader can reach: the valid count (at least one, as the
        # attention's length is clamped to 1) rounded up to the reader's block, plus the slack.
        reach = (tl.maximum(c128_len, 1) + ALIGN - 1) // ALIGN * ALIGN
        extent = tl.minimum(reach + SLACK, width)
        dst = c128_page_indices + row.to(tl.int64) * width
        table = page_table + row.to(tl.int64) * max_pages
        for start in range(0, extent, BLOCK):
            entry = start + tl.arange(0, BLOCK)
            valid = entry < c128_len
            page = tl.load(table + entry // PAGE_ENTRIES, mask=valid, other=0)
            index = page * PAGE_ENTRIES + entry % PAGE_ENTRIES
            tl.store(dst + entry, tl.where(valid, index, -1), mask=entry < extent)


def compressed_attn_metadata_triton(
    seq_lens: torch.Tensor, positions: torch.Tensor, raw_out_loc: torch.Tensor,
    page_table: torch.Tensor | None, page_size: int, compute_page_indices: bool,
) -> tuple[torch.Tensor, ...]:
    """Launch: SGLang's nine outputs ``(c4_out_loc int64 [W], c4_positions, c4_lengths,
    c4_lengths_clamp1, c128_out_loc int64 [W], c128_positions, c128_lengths, c128_lengths_clamp1
    (int32 [R]), c128_page_indices int32 [R, (page_size // 128) * max_pages] or None)``, the page
    indices written to each row's extent only. ``W = raw_out_loc.shape[0] <= R``.

    Inputs are checked by :func:`dsv4spec.ops.init_compressed_attn_metadata`; ``page_table`` must
    be contiguous when page indices are computed (its row stride is taken as its width).
    """
    rows = seq_lens.shape[0]
    write_rows = raw_out_loc.shape[0]
    device = seq_lens.device
    int32 = {"dtype": torch.int32, "device": device}
    c4_out_loc = torch.empty(write_rows, dtype=torch.int64, device=device)
    c4 = [torch.empty(rows, **int32) for _ in range(3)]
    c128_out_loc = torch.empty(write_rows, dtype=torch.int64, device=device)
    c128 = [torch.empty(rows, **int32) for _ in range(3)]
    if compute_page_indices:
        max_pages = page_table.shape[1]
        page_entries = page_size // 128
        width = page_entries * max_pages
        page_indices = torch.empty((rows, width), **int32)
        table, indices_arg = page_table, page_indices
    else:
        max_pages, page_entries, width = 0, 1, 0
        page_indices = None
        # Never read (PAGE_INDICES is off): any int32 tensor of the device will do.
        table = indices_arg = c4[0]
    if rows:
        _compressed_attn_metadata_live_kernel[(rows,)](
            seq_lens, positions, raw_out_loc, table, c4_out_loc, *c4, c128_out_loc, *c128,
            indices_arg, write_rows, max_pages, width,
            PAGE_ENTRIES=page_entries, SLACK=C128_SLACK, ALIGN=C128_BLOCK,
            BLOCK=C128_INDEX_BLOCK, PAGE_INDICES=compute_page_indices,
        )
    return (c4_out_loc, *c4, c128_out_loc, *c128, page_indices)


# total and shift change with the batch: not specialised, so a new batch size compiles nothing.
@triton.jit(do_not_specialize=["total", "shift"])
def _expand_same_length_kernel(
    seq_lens, req_pool, shifted_out, casual_out, req_pool_out, total, shift,
    QO_LEN: tl.constexpr, WRITE_SHIFTED: tl.constexpr, BLOCK: tl.constexpr,
):
    flat = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = flat < total
    request = flat // QO_LEN
    draft = flat - request * QO_LEN
    # In seq_lens' own dtype, as SGLang's add of an int32 arange promotes to it.
    length = tl.load(seq_lens + request, mask=inside, other=0) + shift
    tl.store(casual_out + flat, length + (draft - (QO_LEN - 1)), mask=inside)
    tl.store(req_pool_out + flat, tl.load(req_pool + request, mask=inside, other=0), mask=inside)
    if WRITE_SHIFTED:
        tl.store(shifted_out + request, length, mask=inside & (draft == 0))


def expand_same_length_triton(
    seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, bs: int, qo_len: int, shift: int,
    write_shifted: bool,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Launch: ``(seq_lens + shift [bs] or None, seq_lens_casual [bs * qo_len],
    req_pool_indices_repeated [bs * qo_len])``, lengths in ``seq_lens.dtype``, slots in
    ``req_pool_indices.dtype``, every element written.

    Inputs are checked by :func:`dsv4spec.ops.attention_metadata.expand_same_length`
    (``seq_lens`` ``[bs]`` and ``req_pool_indices`` ``[>= bs]`` contiguous on one device).
    """
    device = seq_lens.device
    total = bs * qo_len
    casual = torch.empty(total, dtype=seq_lens.dtype, device=device)
    repeated = torch.empty(total, dtype=req_pool_indices.dtype, device=device)
    shifted = torch.empty(bs, dtype=seq_lens.dtype, device=device) if write_shifted else None
    if total:
        _expand_same_length_kernel[(triton.cdiv(total, EXPAND_BLOCK),)](
            seq_lens, req_pool_indices, shifted if write_shifted else casual, casual, repeated,
            total, shift, QO_LEN=qo_len, WRITE_SHIFTED=write_shifted, BLOCK=EXPAND_BLOCK,
        )
    return shifted, casual, repeated


# Widths padded to a multiple of this, as SGLang's _pad_last_dim (PAGE_INDEX_ALIGNED_SIZE) does.
INDEX_ALIGN = 64
# Entries per loop step of the SWA copy and the C4 sparse fill (SWA 128 wide, top-k 512/1024).
FILL_BLOCK = 128


def aligned_width(width: int) -> int:
    """``width`` rounded up to :data:`INDEX_ALIGN` (SGLang's ``ceil_align(width, 64)``)."""
    return -(-width // INDEX_ALIGN) * INDEX_ALIGN


# num_write_rows changes with the batch: not specialised, so a new batch size compiles nothing.
@triton.jit(do_not_specialize=["num_write_rows"])
def _compression_metadata_fused_kernel(
    seq_lens, raw_out_loc, page_table, swa_in, swa_out,
    c4_out_loc, c4_lengths, c4_lengths_clamp1, c4_sparse_lengths, c4_sparse_indices,
    c128_out_loc, c128_lengths_clamp1, c128_page_indices,
    num_write_rows, max_pages, width, c128_width, swa_in_stride, swa_width, swa_out_width,
    index_topk, sparse_width,
    PAGE_ENTRIES: tl.constexpr, SLACK: tl.constexpr, ALIGN: tl.constexpr,
    BLOCK: tl.constexpr, FILL: tl.constexpr, HAS_C4: tl.constexpr, HAS_C128: tl.constexpr,
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    seq_len = tl.load(seq_lens + row)
    writes = row < num_write_rows
    out_loc = tl.load(raw_out_loc + row, mask=writes, other=0)

    # The SWA indices, copied to a fresh table (SGLang's F.pad returns a new tensor even when it
    # pads nothing) with -1 in the alignment columns.
    for start in range(0, swa_out_width, FILL):
        column = start + tl.arange(0, FILL)
        value = tl.load(swa_in + row64 * swa_in_stride + column, mask=column < swa_width,
                        other=-1)
        tl.store(swa_out + row64 * swa_out_width + column, value, mask=column < swa_out_width)

    if HAS_C4:
        tl.store(c4_out_loc + row, tl.where((seq_len % 4) == 0, out_loc // 4, 0), mask=writes)
        c4_len = seq_len // 4
        c4_clamp1 = tl.maximum(c4_len, 1)
        tl.store(c4_lengths + row, c4_len)
        tl.store(c4_lengths_clamp1 + row, c4_clamp1)
        # init_flashmla_related's clamp (in int32, as SGLang clamps the int32 lengths) ...
        tl.store(c4_sparse_lengths + row, tl.minimum(c4_clamp1.to(tl.int32), index_topk))
        # ... and its -1 table, every entry written.
        minus_one = tl.full((FILL,), -1, tl.int32)
        for start in range(0, sparse_width, FILL):
            column = start + tl.arange(0, FILL)
            tl.store(c4_sparse_indices + row64 * sparse_width + column, minus_one,
                     mask=column < sparse_width)

    if HAS_C128:
        tl.store(c128_out_loc + row, tl.where((seq_len % 128) == 0, out_loc // 128, 0),
                 mask=writes)
        c128_len = seq_len // 128
        tl.store(c128_lengths_clamp1 + row, tl.maximum(c128_len, 1))
        # As compressed_attn_metadata_triton's extent, at the aligned width: entries past the
        # table's own width are SGLang's -1 padding.
        reach = (tl.maximum(c128_len, 1) + ALIGN - 1) // ALIGN * ALIGN
        extent = tl.minimum(reach + SLACK, c128_width)
        dst = c128_page_indices + row64 * c128_width
        table = page_table + row64 * max_pages
        for start in range(0, extent, BLOCK):
            entry = start + tl.arange(0, BLOCK)
            valid = (entry < c128_len) & (entry < width)
            page = tl.load(table + entry // PAGE_ENTRIES, mask=valid, other=0)
            index = page * PAGE_ENTRIES + entry % PAGE_ENTRIES
            tl.store(dst + entry, tl.where(valid, index, -1), mask=entry < extent)


def compression_metadata_fused_triton(
    seq_lens: torch.Tensor, raw_out_loc: torch.Tensor, page_table: torch.Tensor,
    swa_page_indices: torch.Tensor, page_size: int, index_topk: int, has_c4: bool,
    has_c128: bool,
) -> tuple[torch.Tensor | None, ...]:
    """Launch: ``(c4_out_loc int64 [W], c4_topk_lengths_raw, c4_topk_lengths_clamp1,
    c4_sparse_topk_lengths (int32 [R]), c4_sparse_page_indices int32 [R, align(index_topk)],
    c128_out_loc int64 [W], c128_topk_lengths_clamp1 int32 [R], c128_page_indices int32
    [R, align((page_size // 128) * max_pages)], swa_page_indices [R, align(swa width)])``, the C4
    fields None without C4, the C128 ones None without C128; every element written except each
    C128 row past its extent. ``W = raw_out_loc.shape[0] <= R``; ``align`` rounds up to 64.

    Inputs are checked by :func:`dsv4spec.ops.attention_metadata.build_compression_metadata`
    (``page_table`` contiguous; ``swa_page_indices``' columns contiguous).
    """
    rows = seq_lens.shape[0]
    write_rows = raw_out_loc.shape[0]
    device = seq_lens.device
    int32 = {"dtype": torch.int32, "device": device}
    swa_width = swa_page_indices.shape[1]
    swa_out = torch.empty((rows, aligned_width(swa_width)), dtype=swa_page_indices.dtype,
                          device=device)
    c4 = c128 = (None,)
    unused = swa_out  # any int32 tensor of the device: never read or written (flag off)
    if has_c4:
        sparse_width = aligned_width(index_topk)
        c4 = (torch.empty(write_rows, dtype=torch.int64, device=device),
              *(torch.empty(rows, **int32) for _ in range(3)),
              torch.empty((rows, sparse_width), **int32))
    else:
        sparse_width = 0
    page_entries = page_size // 128 if has_c128 else 1
    max_pages = page_table.shape[1]
    width = page_entries * max_pages if has_c128 else 0
    if has_c128:
        c128 = (torch.empty(write_rows, dtype=torch.int64, device=device),
                torch.empty(rows, **int32),
                torch.empty((rows, aligned_width(width)), **int32))
    c4_args = c4 if has_c4 else (unused,) * 5
    c128_args = c128 if has_c128 else (unused,) * 3
    if rows:
        _compression_metadata_fused_kernel[(rows,)](
            seq_lens, raw_out_loc, page_table, swa_page_indices, swa_out, *c4_args, *c128_args,
            write_rows, max_pages, width, aligned_width(width), swa_page_indices.stride(0),
            swa_width, swa_out.shape[1], index_topk, sparse_width,
            PAGE_ENTRIES=page_entries, SLACK=C128_SLACK, ALIGN=C128_BLOCK,
            BLOCK=C128_INDEX_BLOCK, FILL=FILL_BLOCK, HAS_C4=has_c4, HAS_C128=has_c128,
        )
    c4 = c4 if has_c4 else (None,) * 5
    c128 = c128 if has_c128 else (None,) * 3
    return (*c4, *c128, swa_out)
