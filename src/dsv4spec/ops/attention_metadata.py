"""DeepSeek-V4 attention metadata bounded by the live length: SGLang 0.5.23's page-table and
compressed-attention metadata builders, same values, without the full-context loops.

SGLang's DSV4 backend builds, per forward of the target-verify graph and of each draft-decode
step, a page table ``[rows, cdiv(max_seq_len, page_size)]`` and C128 page indices
``[rows, (page_size // 128) * num_pages]`` over the pool's whole context (``max_seq_len`` is
``req_to_token.shape[1]``, 1M tokens: 4,096 columns), whatever each request holds. The ops here
return tensors of the same shapes and dtypes whose values equal SGLang's everywhere a consumer
reads them; each row's table is written only up to its extent (:func:`page_table_extent`,
:func:`c128_index_extent`), the rest is left as allocated.

Why nothing reads past the extent. The consumers are those of SGLang 0.5.23's SM90 target-verify
and draft-decode graphs, the only calls where the SGLang plugin runs these ops (its tables; eager
calls, which include every extend/prefill build, keep SGLang's); paths are under ``sglang/``:

- page table, (1) the C128 page-index builder reads columns ``j // (page_size // 128)`` for
  ``j < seq_len // 128`` (SGLang's kernel loads further columns and discards them in its
  ``where``; ours does not load them): below ``cdiv(seq_len, page_size)``.
- page table, (2) the C4 indexer (``srt/layers/attention/dsv4/indexer.py``, ``run_paged_indexer``)
  passes it as ``block_table`` to DeepGEMM's ``fp8_paged_mqa_logits`` with
  ``context_lens = c4_topk_lengths_raw = seq_len // 4`` as an ``[R, 1]`` tensor (next_n 1: the
  C4 ``PagedIndexerMetadata`` has ``rows_per_request = 1``, so block-table row = query row).
  SGLang pins ``sgl-deep-gemm==0.2.3.post2``, whose run-time-compiled headers
  ``deep_gemm/include/deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh`` and
  ``.../scheduler/sm90_paged_mqa_logits.cuh`` are byte-identical to deepseek-ai/DeepGEMM commit
  54e22612409371d6364144b69086735beb54e98b. There, kernel ``sm90_fp8_paged_mqa_logits`` (its TMA
  warps) loads ``block_table[q, c]`` only under ``c < num_kv`` (else it uses 0), where
  ``SM90PagedMQALogitsScheduler::refresh_num_kv_and_advance`` sets
  ``num_kv = ceil_div(context_lens[q], BLOCK_KV)`` and the host (``csrc/apis/attention.hpp``,
  ``fp8_fp4_paged_mqa_logits``) requires ``BLOCK_KV == 64`` on SM90 and reads only the table's
  shape and stride; the schedule kernel ``sm90_paged_mqa_logits_metadata`` reads only
  ``context_lens``. So the last column read is ``cdiv(seq_len // 4, 64) - 1``, below
  ``cdiv(seq_len, 256)``: within the live pages, no slack needed. The same table then feeds the
  top-k transforms, which map selected positions ``i < seq_len // 4`` through column ``i >> 6``
  (``kernels/jit/csrc/deepseek_v4/topk_v1.cuh`` ``page_to_indices``, ``topk_v2.cuh``
  ``trivial_transform``/``paged_transform``; the torch backend gathers only such columns), and
  the TileLang indexer (``SGLANG_OPT_USE_TILELANG_INDEXER``) reads ``page_table[r, i]`` for
  ``i < cdiv(seq_len // 4, 64)``. Two readers are not bounded by source read here, and the plugin
  steps aside whenever SGLang is configured to use them: ``fp8_paged_mqa_logits_torch``
  (``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1``) gathers every column, and FlashInfer's fused
  ``top_k_page_table_transform`` (``--dsa-topk-backend flashinfer`` or
  ``--speculative-dsa-topk-backend flashinfer``; flashinfer_python 0.7.2, source not read).
- page table, (3) ``max_seq_len`` properties, ``copy_`` between metadata objects and row padding
  (``F.pad``) read the shape or copy the bytes without interpreting them. The low-ratio (DSV4.1),
  HIP, SM120, context-parallel, non-paged-indexer and sparse-prefill readers are other models,
  other architectures, or extend/prefill builds, all outside these calls. The sparse-prefill
  gathers (``srt/layers/attention/dsv4/sparse_prefill_utils.py``, ``ensure_compressed`` and
  ``ensure_c128``) do read every row up to the batch's longest, which is why an eager entry in
  the plugin's tables needs those covered first. SGLang's prefill CUDA graphs build and refresh
  their metadata outside the capture (``srt/model_executor/runner/prefill_cuda_graph_runner.py``:
  ``_init_forward_metadata_for_capture`` before ``capture_one``, and the replay refresh in
  ``load_batch``), so those builds are eager calls too.
- C128 page indices: FlashMLA's sparse decode reads them as the extra cache's indices with
  ``extra_topk_length = max(seq_len // 128, 1)``. On SM90 SGLang calls
  ``flash_mla.flash_mla_with_kvcache`` (``sgl-flash-mla==1.0.0``) with ``use_legacy=True``; that
  wheel's legacy kernel is compiled from ``csrc_legacy/kernels/sm90/decode/sparse/splitkv_mla.cuh``,
  not published in the sources read. The readable kernel, ``csrc/sm90/decode/sparse_fp8/
  splitkv_mla.cuh`` at deepseek-ai/FlashMLA 9241ae3ef9bac614dd25e45e507e089f888280e0 (unchanged
  since 082094b, the same in sgl-project/FlashMLA's main, sgl and rebase branches), loads extra
  indices only in blocks ``[b * 64, (b + 1) * 64)`` with ``b < ceil(extra_topk_length / 64)``
  (``get_cur_req_info``'s ``end_block_idx``; the next-block prefetch stops at it) and turns every
  entry at or past ``extra_topk_length`` into -1 before using it. So entries below
  ``round_up(extra_topk_length, 64)`` are read; the extent adds one more block of 64
  (``C128_SLACK``) for a prefetch one block further. SGLang writes -1 from ``seq_len // 128`` on,
  and so do we up to the extent. FlashMLA's scheduler (``flashmla_sched_meta``, SM100 only in
  SGLang) reads only the lengths. The TRT-LLM table copy (``init_trtllm_sparse_buffers``) reads
  the whole row but runs only with ``trtllm_attn`` (SM100), never on SM90.

The small per-row outputs (lengths, positions, cache-write locations) are always written.

:func:`expand_same_length` is the target-verify prologue's row expansion (SGLang's
``DeepseekV4AttnBackend.expand_extend_with_same_length``, optionally with the caller's
``seq_lens + W``) as one launch; it writes every element, so no consumer argument is needed: its
outputs equal SGLang's everywhere.

:func:`build_compression_metadata` is what SGLang's ``DSV4AttnMetadata.init_compression_metadata``
and ``init_flashmla_related`` compute for a model with C4/C128 layers only (no ratio-1/2 layers),
in one launch instead of six (the compressed-metadata kernel, three ``_pad_last_dim`` copies, a
clamp and a fill; the idea of sgl-project/sglang PR #33387). The C128 page indices are written at
the 64-aligned width directly, bounded as :func:`init_compressed_attn_metadata`'s are (the pad
columns lie past ``seq_len // 128``, where SGLang's values are -1 too, and are written as -1 where
they fall inside the extent): the argument above is unchanged, it only counts columns of the
aligned table. Every other output (the SWA copy, the C4 sparse lengths and -1 table, the lengths
and cache-write locations) is written in full.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dsv4spec.kernels import triton_runs_on
from dsv4spec.kernels.attention_metadata import (
    C128_BLOCK,
    C128_SLACK,
    PAGE_TABLE_SLACK,
    aligned_width,
    compressed_attn_metadata_triton,
    compression_metadata_fused_triton,
    expand_same_length_triton,
    page_table_positions_triton,
)

INDEX_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1
IMPLS = ("triton", "torch")


class PageTablePositions(NamedTuple):
    """``build_page_table_positions``'s result, in SGLang's field order."""

    seq_lens_casual: torch.Tensor  # int32 [R]
    positions_casual: torch.Tensor  # int32 [R], seq_lens - 1
    page_table: torch.Tensor  # int32 [R, cdiv(max_seq_len, page_size)]
    swa_topk_lengths: torch.Tensor  # int32 [R], min(seq_lens, swa_window)


class CompressedAttnMetadata(NamedTuple):
    """``init_compressed_attn_metadata``'s result, in SGLang's tuple order."""

    c4_out_loc: torch.Tensor  # int64 [W]
    c4_positions: torch.Tensor  # int32 [R]
    c4_seq_lens_raw: torch.Tensor  # int32 [R]
    c4_seq_lens_clamp1: torch.Tensor  # int32 [R]
    c128_out_loc: torch.Tensor  # int64 [W]
    c128_positions: torch.Tensor  # int32 [R]
    c128_seq_lens_raw: torch.Tensor  # int32 [R]
    c128_seq_lens_clamp1: torch.Tensor  # int32 [R]
    c128_page_indices: torch.Tensor | None  # int32 [R, (page_size // 128) * max_pages]


def _div(a: torch.Tensor, b: int) -> torch.Tensor:
    """Integer division as the GPU (and Triton's ``//``) computes it: truncated."""
    return torch.div(a, b, rounding_mode="trunc")


def _check_int(name: str, value: object, low: int, high: int = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _check_index(name: str, t: object, dim: int, device: torch.device | None = None,
                 dtypes: tuple[torch.dtype, ...] = INDEX_DTYPES) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the other inputs on {device}")
    if dim == 1 and t.numel() > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")
    return t


def _check_impl(impl: str, device: torch.device) -> None:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "triton" and not triton_runs_on(device):
        raise ValueError(f"impl='triton' cannot run on {device} (CUDA, or the CPU with "
                         "TRITON_INTERPRET=1)")


def _check_page_table_inputs(req_to_token, req_pool_indices, seq_lens, max_seq_len, page_size,
                             swa_window) -> int:
    """The number of page-table columns, after checking every argument (nothing written)."""
    seq_lens = _check_index("seq_lens_casual", seq_lens, 1)
    device = seq_lens.device
    _check_index("req_pool_indices_repeated", req_pool_indices, 1, device)
    _check_index("req_to_token", req_to_token, 2, device)
    if req_pool_indices.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"req_pool_indices_repeated has {req_pool_indices.shape[0]} rows, "
                         f"seq_lens_casual {seq_lens.shape[0]}")
    if req_to_token.shape[1] > 1 and req_to_token.stride(1) != 1:
        raise ValueError("req_to_token's rows must be contiguous (stride(1) == 1)")
    _check_int("page_size", page_size, 1)
    _check_int("max_seq_len", max_seq_len, 1, max(1, req_to_token.shape[1]))
    _check_int("swa_window", swa_window, 1)
    return -(-max_seq_len // page_size)


def build_page_table_positions_reference(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, *,
    max_seq_len: int, page_size: int, swa_window: int,
) -> PageTablePositions:
    """SGLang's values at every position, the full width written (pure torch, any device).

    ``page_table[r, c] = req_to_token[req_pool_indices[r], c * page_size] // page_size`` for
    ``c < cdiv(max_seq_len, page_size)``; ``positions = seq_lens - 1``;
    ``swa_topk_lengths = min(seq_lens, swa_window)``; all int32.
    """
    num_pages = _check_page_table_inputs(req_to_token, req_pool_indices, seq_lens, max_seq_len,
                                         page_size, swa_window)
    lengths = seq_lens.to(torch.int32)
    columns = torch.arange(num_pages, device=seq_lens.device) * page_size
    tokens = req_to_token[req_pool_indices.long()][:, columns].to(torch.int32)
    return PageTablePositions(lengths, lengths - 1, _div(tokens, page_size).to(torch.int32),
                              lengths.clamp(max=swa_window))


def build_page_table_positions(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, *,
    max_seq_len: int, page_size: int, swa_window: int, impl: str = "triton",
) -> PageTablePositions:
    """SGLang 0.5.23's ``build_page_table_positions_triton``, bounded by the live length.

    Parameters
    ----------
    req_to_token : Tensor ``[slots, context]``, int32 or int64
        Token slot of every position of every request slot (rows contiguous).
    req_pool_indices : Tensor ``[R]``, int32 or int64
        Request slot of each query row.
    seq_lens : Tensor ``[R]``, int32 or int64
        Causal length of each query row (its position + 1).
    max_seq_len : int
        Context the table spans, ``1 <= max_seq_len <= context``.
    page_size, swa_window : int
        Tokens per page; the sliding window.
    impl : {"triton", "torch"}
        ``"torch"``: :func:`build_page_table_positions_reference` (full width).

    Returns
    -------
    PageTablePositions
        int32 tensors of SGLang's shapes. ``"triton"`` writes row ``r`` of ``page_table`` only up
        to ``page_table_extent(seq_lens, ...)[r]`` columns; beyond, the memory is as allocated.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, before anything is allocated or launched.
    """
    num_pages = _check_page_table_inputs(req_to_token, req_pool_indices, seq_lens, max_seq_len,
                                         page_size, swa_window)
    _check_impl(impl, seq_lens.device)
    if impl == "torch":
        return build_page_table_positions_reference(
            req_to_token, req_pool_indices, seq_lens, max_seq_len=max_seq_len,
            page_size=page_size, swa_window=swa_window)
    return PageTablePositions(*page_table_positions_triton(
        req_to_token, req_pool_indices, seq_lens, num_pages, page_size, swa_window))


def page_table_extent(seq_lens: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """Columns of each page-table row the Triton path writes (int64 ``[R]``): the live pages
    ``cdiv(max(seq_len, 0), page_size)`` plus ``PAGE_TABLE_SLACK``, at most ``num_pages``."""
    live = -(-seq_lens.long().clamp(min=0) // page_size)
    return (live + PAGE_TABLE_SLACK).clamp(max=num_pages)


def c128_index_extent(seq_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Entries of each C128 page-index row the Triton path writes (int64 ``[R]``): the
    attention's length ``max(seq_len // 128, 1)`` rounded up to FlashMLA's block of 64, plus
    ``C128_SLACK``, at most ``width``."""
    reach = -(-_div(seq_lens.long(), 128).clamp(min=1) // C128_BLOCK) * C128_BLOCK
    return (reach + C128_SLACK).clamp(max=width)


def _check_compressed_inputs(seq_lens, positions, raw_out_loc, page_table, page_size,
                             compute_page_indices) -> None:
    seq_lens = _check_index("seq_lens", seq_lens, 1)
    device = seq_lens.device
    _check_index("positions", positions, 1, device)
    _check_index("raw_out_loc", raw_out_loc, 1, device)
    rows = seq_lens.shape[0]
    if positions.shape[0] != rows:
        raise ValueError(f"positions has {positions.shape[0]} rows, seq_lens {rows}")
    if raw_out_loc.shape[0] > rows:
        raise ValueError(f"raw_out_loc has {raw_out_loc.shape[0]} rows, more than the {rows} "
                         "metadata rows")
    if not isinstance(compute_page_indices, bool):
        raise TypeError("compute_page_indices must be a bool, got "
                        f"{type(compute_page_indices).__name__}")
    if not compute_page_indices:
        return
    if page_table is None:
        raise ValueError("page_table is required when compute_page_indices=True")
    _check_index("page_table", page_table, 2, device, (torch.int32,))
    if page_table.shape[0] != rows:
        raise ValueError(f"page_table has {page_table.shape[0]} rows, seq_lens {rows}")
    if not page_table.is_contiguous():
        raise ValueError("page_table must be contiguous (its row stride is its width)")
    _check_int("page_size", page_size, 128)
    if page_size % 128:
        raise ValueError(f"page_size must be a multiple of 128, got {page_size}")
    if (page_size // 128) * page_table.shape[1] > INT32_MAX:
        raise ValueError("page_table is too wide for int32 page indices")


def init_compressed_attn_metadata_reference(
    seq_lens: torch.Tensor, positions: torch.Tensor, raw_out_loc: torch.Tensor,
    page_table: torch.Tensor | None = None, page_size: int = 0,
    compute_page_indices: bool = True,
) -> CompressedAttnMetadata:
    """SGLang's values at every position, the full width written (pure torch, any device).

    For ratio ``k`` in (4, 128): ``out_loc = raw_out_loc // k`` where ``seq_len % k == 0``,
    else 0 (int64, the first ``raw_out_loc.shape[0]`` rows); ``positions & ~(k - 1)``;
    ``seq_len // k`` and its ``max(., 1)``. C128 page indices (``cps = page_size // 128``):
    ``page_table[r, j // cps] * cps + j % cps`` for ``j < seq_len // 128``, else -1.
    Integer division truncates, as on the GPU.
    """
    _check_compressed_inputs(seq_lens, positions, raw_out_loc, page_table, page_size,
                             compute_page_indices)
    write_rows = raw_out_loc.shape[0]
    lengths = seq_lens.long()
    out_loc = raw_out_loc.long()
    outputs: list[torch.Tensor | None] = []
    for ratio in (4, 128):
        compress = torch.fmod(lengths[:write_rows], ratio) == 0
        outputs.append(torch.where(compress, _div(out_loc, ratio), 0))
        outputs.append((positions.long() & ~(ratio - 1)).to(torch.int32))
        raw = _div(lengths, ratio)
        outputs.append(raw.to(torch.int32))
        outputs.append(raw.clamp(min=1).to(torch.int32))
    indices = None
    if compute_page_indices:
        entries = page_size // 128
        width = entries * page_table.shape[1]
        j = torch.arange(width, device=seq_lens.device)
        values = page_table[:, j // entries].long() * entries + j % entries
        valid = j[None, :] < _div(lengths, 128)[:, None]
        indices = torch.where(valid, values, -1).to(torch.int32)
    outputs.append(indices)
    return CompressedAttnMetadata(*outputs)


def init_compressed_attn_metadata(
    seq_lens: torch.Tensor, positions: torch.Tensor, raw_out_loc: torch.Tensor,
    page_table: torch.Tensor | None = None, page_size: int = 0,
    compute_page_indices: bool = True, *, impl: str = "triton",
) -> CompressedAttnMetadata:
    """SGLang 0.5.23's ``_init_compressed_attn_metadata_triton``, bounded by the live length.

    Parameters
    ----------
    seq_lens, positions : Tensor ``[R]``, int32 or int64
        Causal length and position of each metadata row.
    raw_out_loc : Tensor ``[W]``, ``W <= R``, int32 or int64
        Cache-write slot of each row that writes (context-parallel padding rows do not).
    page_table : Tensor ``[R, max_pages]`` int32, contiguous; required with page indices
        As :func:`build_page_table_positions` returns it (only each row's live columns are read).
    page_size : int
        Tokens per page, a multiple of 128 with page indices.
    compute_page_indices : bool
        Whether to build the C128 page indices (SGLang: when the model has C128 layers).
    impl : {"triton", "torch"}
        ``"torch"``: :func:`init_compressed_attn_metadata_reference` (full width).

    Returns
    -------
    CompressedAttnMetadata
        SGLang's nine outputs. ``"triton"`` writes row ``r`` of ``c128_page_indices`` only up to
        ``c128_index_extent(seq_lens, width)[r]`` entries; beyond, the memory is as allocated.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, before anything is allocated or launched.
    """
    _check_compressed_inputs(seq_lens, positions, raw_out_loc, page_table, page_size,
                             compute_page_indices)
    _check_impl(impl, seq_lens.device)
    if impl == "torch":
        return init_compressed_attn_metadata_reference(
            seq_lens, positions, raw_out_loc, page_table, page_size, compute_page_indices)
    return CompressedAttnMetadata(*compressed_attn_metadata_triton(
        seq_lens, positions, raw_out_loc, page_table if compute_page_indices else None,
        page_size, compute_page_indices))


class ExpandedRows(NamedTuple):
    """``expand_same_length``'s result: what SGLang's method returns, after the shifted lengths."""

    seq_lens: torch.Tensor | None  # [bs], seq_lens + shift (None unless asked for)
    seq_lens_casual: torch.Tensor  # [bs * qo_len], seq_lens' dtype
    req_pool_indices_repeated: torch.Tensor  # [bs * qo_len], req_pool_indices' dtype


def _check_expand_inputs(seq_lens, req_pool_indices, bs, qo_len, shift) -> None:
    seq_lens = _check_index("seq_lens", seq_lens, 1)
    _check_index("req_pool_indices", req_pool_indices, 1, seq_lens.device)
    _check_int("bs", bs, 0)
    _check_int("qo_len", qo_len, 1)
    _check_int("shift", shift, 0)
    if seq_lens.shape[0] != bs:
        raise ValueError(f"seq_lens has {seq_lens.shape[0]} rows, bs is {bs}")
    if req_pool_indices.shape[0] < bs:
        raise ValueError(f"req_pool_indices has {req_pool_indices.shape[0]} rows, fewer than "
                         f"bs = {bs}")
    if bs * qo_len > INT32_MAX:
        raise ValueError(f"bs * qo_len = {bs * qo_len} rows do not fit int32 offsets")


def expand_same_length_reference(
    seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, *, bs: int, qo_len: int,
    shift: int = 0,
) -> ExpandedRows:
    """SGLang's values (pure torch, any device): request ``b``'s rows ``b * qo_len + j`` have
    causal length ``seq_lens[b] + shift - (qo_len - 1) + j`` (in ``seq_lens``' dtype, wrapping
    as the GPU does) and slot ``req_pool_indices[b]``."""
    _check_expand_inputs(seq_lens, req_pool_indices, bs, qo_len, shift)
    lengths = seq_lens + shift
    offsets = torch.arange(1 - qo_len, 1, dtype=torch.int32, device=seq_lens.device)
    casual = (lengths[:, None] + offsets).reshape(-1)
    repeated = req_pool_indices[:bs].repeat_interleave(qo_len)
    return ExpandedRows(lengths if shift else None, casual, repeated)


def expand_same_length(
    seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, *, bs: int, qo_len: int,
    shift: int = 0, return_shifted: bool = False, impl: str = "triton",
) -> ExpandedRows:
    """SGLang 0.5.23's ``expand_extend_with_same_length`` (and, with ``shift``, the
    ``seq_lens + shift`` before it) in one launch.

    Parameters
    ----------
    seq_lens : Tensor ``[bs]``, int32 or int64, contiguous
        Each request's length before the shift (SGLang's method receives it shifted: shift 0).
    req_pool_indices : Tensor ``[>= bs]``, int32 or int64, contiguous
        Request slots; the first ``bs`` are used, as SGLang's gather does.
    bs, qo_len : int
        Requests (``bs >= 0``) and query rows per request (``>= 1``).
    shift : int
        Added to every length first (``>= 0``; the verify prologue's draft count).
    return_shifted : bool
        Whether to return ``seq_lens + shift`` too (always, with ``impl="torch"`` and a shift).
    impl : {"triton", "torch"}
        ``"torch"``: :func:`expand_same_length_reference`.

    Returns
    -------
    ExpandedRows
        Fresh tensors equal to SGLang's at every element: causal lengths in ``seq_lens``' dtype
        (SGLang's int32 arange promotes to it), slots in ``req_pool_indices``' dtype.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, before anything is allocated or launched.
    """
    _check_expand_inputs(seq_lens, req_pool_indices, bs, qo_len, shift)
    if not isinstance(return_shifted, bool):
        raise TypeError(f"return_shifted must be a bool, got {type(return_shifted).__name__}")
    _check_impl(impl, seq_lens.device)
    if impl == "torch":
        return expand_same_length_reference(seq_lens, req_pool_indices, bs=bs, qo_len=qo_len,
                                            shift=shift)
    return ExpandedRows(*expand_same_length_triton(seq_lens, req_pool_indices, bs, qo_len, shift,
                                                   return_shifted))


class CompressionMetadata(NamedTuple):
    """``build_compression_metadata``'s result: the ``DSV4AttnMetadata`` fields SGLang's
    ``init_compression_metadata`` and ``init_flashmla_related`` assign (None: ratio absent)."""

    c4_out_loc: torch.Tensor | None  # int64 [W]
    c4_topk_lengths_raw: torch.Tensor | None  # int32 [R]
    c4_topk_lengths_clamp1: torch.Tensor | None  # int32 [R]
    c4_sparse_topk_lengths: torch.Tensor | None  # int32 [R], min(clamp1, index_topk)
    c4_sparse_page_indices: torch.Tensor | None  # int32 [R, align(index_topk)], all -1
    c128_out_loc: torch.Tensor | None  # int64 [W]
    c128_topk_lengths_clamp1: torch.Tensor | None  # int32 [R]
    c128_page_indices: torch.Tensor | None  # int32 [R, align((page_size // 128) * max_pages)]
    swa_page_indices: torch.Tensor  # int32 [R, align(swa width)], a fresh copy, -1 padded


def _check_fused_inputs(seq_lens, raw_out_loc, page_table, swa_page_indices, page_size,
                        index_topk, has_c4, has_c128) -> None:
    seq_lens = _check_index("seq_lens", seq_lens, 1)
    device = seq_lens.device
    _check_index("raw_out_loc", raw_out_loc, 1, device)
    rows = seq_lens.shape[0]
    if raw_out_loc.shape[0] > rows:
        raise ValueError(f"raw_out_loc has {raw_out_loc.shape[0]} rows, more than the {rows} "
                         "metadata rows")
    for name, flag in (("has_c4", has_c4), ("has_c128", has_c128)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    _check_index("swa_page_indices", swa_page_indices, 2, device, (torch.int32,))
    if swa_page_indices.shape[0] != rows:
        raise ValueError(f"swa_page_indices has {swa_page_indices.shape[0]} rows, seq_lens "
                         f"{rows}")
    if swa_page_indices.shape[1] > 1 and swa_page_indices.stride(1) != 1:
        raise ValueError("swa_page_indices' rows must be contiguous (stride(1) == 1)")
    _check_index("page_table", page_table, 2, device, (torch.int32,))
    if page_table.shape[0] != rows:
        raise ValueError(f"page_table has {page_table.shape[0]} rows, seq_lens {rows}")
    if not page_table.is_contiguous():
        raise ValueError("page_table must be contiguous (its row stride is its width)")
    if has_c4:
        _check_int("index_topk", index_topk, 1)
    if has_c128:
        _check_int("page_size", page_size, 128)
        if page_size % 128:
            raise ValueError(f"page_size must be a multiple of 128, got {page_size}")
        if aligned_width((page_size // 128) * page_table.shape[1]) > INT32_MAX:
            raise ValueError("page_table is too wide for int32 page indices")


def build_compression_metadata_reference(
    seq_lens: torch.Tensor, raw_out_loc: torch.Tensor, page_table: torch.Tensor,
    swa_page_indices: torch.Tensor, *, page_size: int, index_topk: int, has_c4: bool = True,
    has_c128: bool = True,
) -> CompressionMetadata:
    """SGLang's values at every position, every element written (pure torch, any device):
    :func:`init_compressed_attn_metadata_reference`'s fields, each table padded with -1 to a
    multiple of 64 columns, ``min(c4_topk_lengths_clamp1, index_topk)`` and a -1 table of
    ``align(index_topk)`` columns."""
    _check_fused_inputs(seq_lens, raw_out_loc, page_table, swa_page_indices, page_size,
                        index_topk, has_c4, has_c128)

    def pad(table: torch.Tensor) -> torch.Tensor:
        out = torch.full((table.shape[0], aligned_width(table.shape[1])), -1, dtype=table.dtype,
                         device=table.device)
        out[:, :table.shape[1]] = table
        return out

    base = init_compressed_attn_metadata_reference(
        seq_lens, seq_lens, raw_out_loc, page_table, page_size if has_c128 else 128, has_c128)
    c4 = c128 = (None,)
    if has_c4:
        rows = seq_lens.shape[0]
        c4 = (base.c4_out_loc, base.c4_seq_lens_raw, base.c4_seq_lens_clamp1,
              base.c4_seq_lens_clamp1.clamp(max=index_topk),
              torch.full((rows, aligned_width(index_topk)), -1, dtype=torch.int32,
                         device=seq_lens.device))
    if has_c128:
        c128 = (base.c128_out_loc, base.c128_seq_lens_clamp1, pad(base.c128_page_indices))
    return CompressionMetadata(*(c4 if has_c4 else (None,) * 5),
                               *(c128 if has_c128 else (None,) * 3), pad(swa_page_indices))


def build_compression_metadata(
    seq_lens: torch.Tensor, raw_out_loc: torch.Tensor, page_table: torch.Tensor,
    swa_page_indices: torch.Tensor, *, page_size: int, index_topk: int, has_c4: bool = True,
    has_c128: bool = True, impl: str = "triton",
) -> CompressionMetadata:
    """SGLang 0.5.23's ``DSV4AttnMetadata.init_compression_metadata`` followed by
    ``init_flashmla_related`` (decode, no ratio-1/2 layers) in one launch.

    Parameters
    ----------
    seq_lens : Tensor ``[R]``, int32 or int64
        Causal length of each metadata row (``seq_lens_casual``).
    raw_out_loc : Tensor ``[W]``, ``W <= R``, int32 or int64
        Cache-write slot of each row that writes.
    page_table : Tensor ``[R, max_pages]`` int32, contiguous
        As :func:`build_page_table_positions` returns it (only live columns are read).
    swa_page_indices : Tensor ``[R, S]`` int32, rows contiguous
        The SWA indices; returned copied into a fresh ``[R, align(S)]`` table, -1 padded.
    page_size : int
        Tokens per page, a multiple of 128 (read with C128 only).
    index_topk : int
        The indexer's top-k (read with C4 only).
    has_c4, has_c128 : bool
        Whether the model has C4 / C128 layers (SGLang's ``present_ratios``).
    impl : {"triton", "torch"}
        ``"torch"``: :func:`build_compression_metadata_reference` (every element written).

    Returns
    -------
    CompressionMetadata
        Fresh contiguous tensors of SGLang's shapes and dtypes. ``"triton"`` writes row ``r`` of
        ``c128_page_indices`` only up to ``c128_index_extent(seq_lens, its width)[r]`` entries;
        every other element is written.

    Raises
    ------
    TypeError, ValueError
        Naming the argument, before anything is allocated or launched.
    """
    _check_fused_inputs(seq_lens, raw_out_loc, page_table, swa_page_indices, page_size,
                        index_topk, has_c4, has_c128)
    _check_impl(impl, seq_lens.device)
    if impl == "torch":
        return build_compression_metadata_reference(
            seq_lens, raw_out_loc, page_table, swa_page_indices, page_size=page_size,
            index_topk=index_topk, has_c4=has_c4, has_c128=has_c128)
    return CompressionMetadata(*compression_metadata_fused_triton(
        seq_lens, raw_out_loc, page_table, swa_page_indices, page_size, index_topk, has_c4,
        has_c128))
