"""AROUND hooks on SGLang's DSV4 attention-metadata builders: the page table and the C128 page
indices written over each row's live length instead of the pool's whole context, and the
target-verify row expansion in one launch.

Targets (SGLang 0.5.23). The first two are module-level functions reached through their module's
globals at call time, so the registry's ``setattr`` on the module is what every caller sees:

- ``sglang.kernels.ops.attention.dsv4.attn_metadata_kernels.build_page_table_positions_triton``:
  ``DeepseekV4AttnBackend.make_core_attn_metadata`` calls ``BuildPageTablePositions.execute``
  (the class is imported into the backend), whose ``triton`` classmethod calls
  ``build_page_table_positions_triton(...)`` by its global name on CUDA inputs;
- ``sglang.kernels.ops.attention.dsv4.metadata_kernel._init_compressed_attn_metadata_triton``:
  ``DSV4AttnMetadata.init_compression_metadata`` calls the backend's
  ``_init_compression_metadata_triton``, which is ``metadata_kernel.init_compression_metadata``
  bound at import; that wrapper calls ``_init_compressed_attn_metadata_triton(...)`` by its
  global name.

Each runs in the target-verify graph once per MTP step and in each draft-decode step's graph
(``dsv4spec bench metadata`` prints the source lines). The hooks return SGLang's result types
with the same shapes, dtypes and values wherever a consumer reads them (the argument, consumer
by consumer: :mod:`dsv4spec.ops.attention_metadata`).

The third is a method, ``sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend.
expand_extend_with_same_length``: the registry sets the class attribute, which every
``self.expand_extend_with_same_length(...)`` finds (no subclass in SGLang 0.5.23 overrides it).
Its two callers: ``make_forward_metadata_from_raw_verify`` (fixed-width target verify, recorded in
the verify graph once per MTP step, or eagerly where the verify metadata is built before the
graph) and ``init_forward_metadata_draft_extend`` (once per draft extend, eagerly: the draft-
extend graph runner builds it outside the graph). SGLang's method launches two aranges, an add,
a repeat_interleave and a gather; :func:`~dsv4spec.ops.attention_metadata.expand_same_length`
writes the same two tensors (every element, fresh, SGLang's dtypes) in one launch.

The fourth and fifth are methods of ``deepseek_v4_backend.DSV4AttnMetadata`` (class attributes,
found by every ``metadata.init_...(...)``): ``init_compression_metadata`` and
``init_flashmla_related``, which ``DeepseekV4AttnBackend.make_core_attn_metadata`` calls back to
back when ``need_compress`` (target verify, draft decode, prefill; draft extend passes
``need_compress=False``). SGLang launches there its compressed-metadata kernel, ``_pad_last_dim``
of the C128 and of the SWA indices (each a full copy, ``F.pad`` by zero columns being a clone), a
clamp, a ``torch.full`` and ``_pad_last_dim`` of it. The first hook launches
:func:`~dsv4spec.ops.attention_metadata.build_compression_metadata` once, assigns the fields SGLang
assigns (fresh tensors of SGLang's shapes, dtypes and strides; the SWA indices a fresh copy, as
``F.pad``'s) and keeps the C4 sparse fields for the second, which assigns them (and creates the
FlashMLA schedules as SGLang's method does) only for the same object with the same, unmodified
``c4_topk_lengths_clamp1`` and ``index_topk``, not in prefill; otherwise SGLang's method runs and
recomputes them. Consumers of the result: ``copy_`` (``copy_metadata``, every byte, unread),
``refresh_for_breakable_cuda_graph_replay_`` (prefill graphs: reference assignment),
``init_trtllm_sparse_buffers`` (SM100 only), ``apply_cp_reindex`` (prefill with context parallel,
where the hook steps aside) and the attention kernels: the C128 argument of
:mod:`dsv4spec.ops.attention_metadata` bounds them, the rest is written in full. The first hook
steps aside for ratio-1/2 layers (DSV4.1), ``low_ratio_buffers``, a request window, context
parallel (``num_tokens`` given), no C4/C128 layer, a non-contiguous SWA table, an
``index_topk`` SGLang rejects, empty batches, and as the others below; its measured table is empty.

All of them step aside (SGLang's code runs with the same arguments) for a served model other
than DeepSeek-V4 (DSV4.1 runs the same backend with page-table readers the argument does not
cover; :mod:`~dsv4spec.integrations.sglang.served_model`), on ROCm, under
``torch.compile``, where Triton cannot run, for inputs the ops do not take (their checks raise
before anything is written), for a launch shape first seen inside a CUDA-graph capture (nothing
compiles there), wherever the measured tables below do not say dsv4spec's kernel is faster, and,
for the page table, while SGLang is configured to use a reader of it whose reads past the live
pages no source read bounds (:func:`unbounded_reader`).

Left as SGLang's, with the reason:

- ``deepseek_v4_backend._pad_last_dim`` copies its input (``F.pad`` by zero columns is a clone)
  even when the width is already a multiple of 64 (the SWA indices, built 64-aligned; the C4
  sparse indices at top-k 512/1024; the C128 indices at 8,192 entries for 1M tokens in 256-token
  pages), one copy kernel per padded field. Returning the input instead would make the
  metadata field share storage with its source, and one source is held elsewhere: with a
  request window (DSV4.1), ``swa_page_indices`` would be the ``request_window_layout.indices``
  tensor the metadata also keeps, and ``DSV4AttnMetadata.refresh_for_breakable_cuda_graph_
  replay_`` writes the new layout into that tensor in place before it re-points
  ``swa_page_indices``: the captured kernels that read the old ``swa_page_indices`` by address
  would then read the new window's indices where SGLang's give them the captured copy. The
  other sources (fresh ``torch.full``/``torch.empty`` results) would be safe, but a hook on the
  function cannot tell them apart from the call, so it stays unhooked.
- the ``.to(torch.int64)`` casts in ``create_paged_compressor_data``
  (``srt/layers/attention/dsv4/compressor_v2.py``) are free where the tensor already is int64
  (``Tensor.to`` returns it); replacing them would mean replacing the planner call itself.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import weakref
from types import ModuleType
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations.hooks import (
    INTERPRETER_ARCHITECTURE,
    STEP_ASIDE,
    FasterTable,
    Gate,
    GuardedHook,
    gpu_architecture,
    measured_faster,
    run_where_measured_faster,
)
from dsv4spec.integrations.sglang.served_model import only_for_dsv4
from dsv4spec.integrations.tables import faster_table
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.ops.attention_metadata import (
    build_compression_metadata,
    build_page_table_positions,
    expand_same_length,
    init_compressed_attn_metadata,
)

logger = logging.getLogger("dsv4spec.integrations.sglang")

PAGE_TABLE = "build_page_table_positions_triton"
COMPRESSED = "_init_compressed_attn_metadata_triton"
EXPAND = "expand_extend_with_same_length"
COMPRESSION = "init_compression_metadata"

# Where dsv4spec's kernel beat SGLang's, per GPU architecture (compute capability) and mode
# ("graph": device time in a CUDA graph; "eager": host wall time per back-to-back eager call),
# keyed by the page table's width in pages (``cdiv(max_seq_len, page_size)``, 4096 at 1M tokens
# and 256-token pages): inclusive ranges of query rows, read from the measured-faster tables
# (dsv4spec.integrations.tables: the GPU's file; a width between two measured widths gets the
# nearer smaller one's ranges). The H200's:
# Source: benchmarks/results/metadata/metadata.md (H200, 2026-12-01, ``dsv4spec bench metadata
# --quick
# --modes verify decode``): in a graph both ops won at every measured point, 1 to 512 rows
# (verify and decode shapes, 4K and 64K live tokens) at width 4096; eager, where these calls are
# launch-bound, they lost at every point, so eager stays empty (eager calls also include every
# extend/prefill build, whose sparse-prefill readers the argument in
# dsv4spec.ops.attention_metadata does not cover).
SGLANG_PAGE_TABLE_FASTER: FasterTable = faster_table("sglang", PAGE_TABLE)
SGLANG_COMPRESSED_FASTER: FasterTable = faster_table("sglang", COMPRESSED)
# The row expansion, keyed by qo_len (query rows per request: speculative_num_draft_tokens in
# target verify, the draft-extend width there), over ranges of requests (bs). Source:
# benchmarks/results/metadata/metadata_expand.md (H200, 2026-12-01, ``dsv4spec bench metadata --ops
# expand
# expand_shift --widths 4``): at qo_len 4 ours won at every measured bs, 1 to 128, both in a graph
# and eagerly; other widths stay SGLang's until measured.
SGLANG_EXPAND_FASTER: FasterTable = faster_table("sglang", EXPAND)
# DSV4AttnMetadata.init_compression_metadata + init_flashmla_related in one launch, keyed as the
# compressed metadata (page-table width in pages, query rows). Source:
# benchmarks/results/metadata/metadata_compression.md (H200, 2026-12-01, ``dsv4spec bench metadata
# --ops
# compression --modes verify decode``): in a graph ours won at every point, 1 to 512 rows, 4K and
# 64K live tokens, width 4096. Eager stays empty although ours won there too: eager builds
# include prefill and extend, whose sparse-prefill readers the unwritten-tail argument in
# dsv4spec.ops.attention_metadata does not cover, and this method cannot tell them apart.
SGLANG_COMPRESSION_FASTER: FasterTable = faster_table("sglang", COMPRESSION)
TABLES: dict[str, FasterTable] = {
    PAGE_TABLE: SGLANG_PAGE_TABLE_FASTER,
    COMPRESSED: SGLANG_COMPRESSED_FASTER,
    EXPAND: SGLANG_EXPAND_FASTER,
    COMPRESSION: SGLANG_COMPRESSION_FASTER,
}

# Readers of the page table not bounded by the live pages in the sources read (see
# dsv4spec.ops.attention_metadata): SGLang's torch paged MQA logits, switched on by this variable,
# gather every column; FlashInfer's top-k page-table transform, chosen by this DSA top-k backend,
# is compiled from flashinfer_python 0.7.2, whose source for it was not read.
TORCH_PAGED_LOGITS_ENV = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
UNREAD_TOPK_BACKEND = "flashinfer"
_TRUE_VALUES = ("true", "1", "yes", "y")  # SGLang's EnvBool

_warned: set[str] = set()
# Launch keys dsv4spec's kernel has run eagerly (so compiled): inside a capture only these run.
_compiled: set[tuple] = set()


def prefers_dsv4spec(op: str, rows: int, width: int, in_graph: bool,
                     architecture: tuple[int, int] | None = INTERPRETER_ARCHITECTURE) -> bool:
    """Whether SGLang's ``op`` should run dsv4spec's kernel rather than its own.

    Parameters
    ----------
    op : {"build_page_table_positions_triton", "_init_compressed_attn_metadata_triton",
          "expand_extend_with_same_length", "init_compression_metadata"}
    rows : int
        Query (metadata) rows of the call; requests (bs) for the expansion.
    width : int
        The table's key: page-table width in pages; qo_len for the expansion.
    in_graph : bool
        Whether the call is captured into a CUDA graph or runs eagerly.
    architecture : (int, int) or None
        The GPU's compute capability; None (ROCm) never prefers ours.
    """
    return measured_faster(TABLES[op], architecture, width, rows, in_graph)


def unbounded_reader() -> str | None:
    """The page-table reader SGLang is configured to use whose reads past each row's live pages
    are not bounded by the sources read, or None when every configured reader is bounded.

    Read from SGLang's own environment fields and runtime configuration where this process has
    loaded them (``sglang.srt.environ``, ``sglang.srt.runtime_context``); configuration that is
    loaded but not readable counts as unbounded. A process without SGLang's runtime context runs
    no SGLang consumer.
    """
    environ = sys.modules.get("sglang.srt.environ")
    field = getattr(getattr(environ, "envs", None), TORCH_PAGED_LOGITS_ENV, None)
    try:
        torch_logits = (field.get() if field is not None
                        else os.environ.get(TORCH_PAGED_LOGITS_ENV, "").lower() in _TRUE_VALUES)
    except Exception as e:  # noqa: BLE001 - SGLang rejects a malformed value
        return f"{TORCH_PAGED_LOGITS_ENV} is not readable ({e})"
    if torch_logits:
        return (f"{TORCH_PAGED_LOGITS_ENV} is on: SGLang's torch paged MQA logits read every "
                "page-table column")
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is None:
        return None
    try:
        backends = (context.get_exec().kernel.dsa_topk_backend,
                    context.get_spec().speculative_dsa_topk_backend)
    except Exception as e:  # noqa: BLE001 - not published, or fields renamed
        return f"SGLang's DSA top-k backends are not readable ({type(e).__name__}: {e})"
    if UNREAD_TOPK_BACKEND in backends:
        return (f"the DSA top-k backend is {UNREAD_TOPK_BACKEND} (its page-table transform is "
                "not known to stay within the live pages)")
    return None


def _readers_bounded(op: str) -> bool:
    """Whether every configured reader of ``op``'s output stays within what ours writes (the C128
    indices' readers always do; the page table's see :func:`unbounded_reader`)."""
    if op != PAGE_TABLE:
        return True
    reason = unbounded_reader()
    if reason is None:
        return True
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("dsv4spec: SGLang %s: SGLang's own runs: %s", op, reason)
    return False


def _capturing(index: int) -> bool:
    """Whether CUDA device ``index``'s current stream is capturing a graph (never the CPU, -1)."""
    return index >= 0 and stream_capturing(index)


def _run(op: str, device: torch.device, rows: int, width: int, key: tuple, launch) -> Any:
    """``launch()`` where the table prefers ours for this call and every configured reader of its
    output is bounded, else STEP_ASIDE (the capture rule:
    :func:`~dsv4spec.integrations.hooks.run_where_measured_faster`)."""
    if torch.compiler.is_compiling() or on_rocm() or not triton_runs_on(device):
        return STEP_ASIDE
    index = device.index if device.type == "cuda" else -1
    if index is None:
        index = torch.cuda.current_device()
    architecture = gpu_architecture(index)
    return run_where_measured_faster(
        (op, index, *key), _compiled, _capturing(index),
        lambda in_graph: (prefers_dsv4spec(op, rows, width, in_graph, architecture)
                          and _readers_bounded(op)), launch)


def _rejected(op: str, error: Exception) -> Any:
    if op not in _warned:
        _warned.add(op)
        logger.warning("dsv4spec: SGLang %s: dsv4spec's kernel rejected the inputs (%s); "
                       "SGLang's own runs for such inputs", op, error)
    return STEP_ASIDE


def _tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def make_page_table_hook(module: ModuleType) -> GuardedHook:
    """The AROUND hook for ``module.build_page_table_positions_triton``.

    Parameters
    ----------
    module : module
        ``sglang.kernels.ops.attention.dsv4.attn_metadata_kernels``: its
        ``PageTablePositionsResult`` is the type the hook returns.
    """
    result_type = module.PageTablePositionsResult

    def build_page_table_positions_triton(
        *, req_to_token: torch.Tensor, req_pool_indices_repeated: torch.Tensor,
        seq_lens_casual: torch.Tensor, max_seq_len: int, page_size: int, swa_window: int,
    ) -> Any:
        if not (_tensor(req_to_token) and _tensor(seq_lens_casual)
                and _tensor(req_pool_indices_repeated)):
            return STEP_ASIDE
        rows = seq_lens_casual.shape[0] if seq_lens_casual.dim() == 1 else 0
        num_pages = -(-max_seq_len // page_size) if isinstance(page_size, int) and (
            page_size > 0 and isinstance(max_seq_len, int)) else 0

        def launch():
            prep = build_page_table_positions(
                req_to_token, req_pool_indices_repeated, seq_lens_casual,
                max_seq_len=max_seq_len, page_size=page_size, swa_window=swa_window)
            return result_type(seq_lens_casual=prep.seq_lens_casual,
                               positions_casual=prep.positions_casual,
                               page_table=prep.page_table,
                               swa_topk_lengths=prep.swa_topk_lengths)

        key = (req_to_token.dtype, req_pool_indices_repeated.dtype, seq_lens_casual.dtype,
               req_to_token.stride(0) if req_to_token.dim() == 2 else None, num_pages,
               page_size, swa_window)
        try:
            return _run(PAGE_TABLE, seq_lens_casual.device, rows, num_pages, key, launch)
        except (ValueError, TypeError) as e:  # the op's input checks, before any launch
            return _rejected(PAGE_TABLE, e)

    return GuardedHook("DSV4 page table", only_for_dsv4(build_page_table_positions_triton),
                       logger, "SGLang")


def make_compressed_metadata_hook(module: ModuleType | None = None) -> GuardedHook:
    """The AROUND hook for ``sglang.kernels.ops.attention.dsv4.metadata_kernel.
    _init_compressed_attn_metadata_triton``: SGLang's nine outputs, as a tuple."""

    def _init_compressed_attn_metadata_triton(
        seq_lens: torch.Tensor, positions: torch.Tensor, raw_out_loc: torch.Tensor,
        page_table: torch.Tensor | None = None, page_size: int = 0,
        compute_page_indices: bool = True,
    ) -> Any:
        if not (_tensor(seq_lens) and _tensor(positions) and _tensor(raw_out_loc)):
            return STEP_ASIDE
        rows = seq_lens.shape[0] if seq_lens.dim() == 1 else 0
        # SGLang passes the page table with or without page indices: its width keys the table.
        num_pages = page_table.shape[1] if _tensor(page_table) and page_table.dim() == 2 else 0

        def launch():
            return tuple(init_compressed_attn_metadata(
                seq_lens, positions, raw_out_loc, page_table, page_size, compute_page_indices))

        key = (seq_lens.dtype, positions.dtype, raw_out_loc.dtype, num_pages, page_size,
               compute_page_indices)
        try:
            return _run(COMPRESSED, seq_lens.device, rows, num_pages, key, launch)
        except (ValueError, TypeError) as e:
            return _rejected(COMPRESSED, e)

    return GuardedHook("DSV4 compressed metadata",
                       only_for_dsv4(_init_compressed_attn_metadata_triton), logger, "SGLang")


def _arange_device_matches(kwargs: Any, device: torch.device) -> bool:
    """Whether SGLang's aranges (``self.cuda_int32_kwargs["device"]``) land on ``device``, as the
    method needs for its add and gather: otherwise SGLang's own runs (and raises if it must)."""
    try:
        arange_device = torch.device(kwargs["device"])
    except Exception:  # noqa: BLE001 - missing or not a device: SGLang's code decides
        return False
    if arange_device.type != device.type:
        return False
    if arange_device.type != "cuda" or arange_device.index == device.index:
        return True
    index = arange_device.index
    return (torch.cuda.current_device() if index is None else index) == device.index


def make_expand_hook(module: ModuleType | None = None) -> GuardedHook:
    """The AROUND hook for ``DeepseekV4AttnBackend.expand_extend_with_same_length``: SGLang's
    ``(seq_lens_casual, req_pool_indices_repeated)``, from one launch."""

    def expand_extend_with_same_length(self: Any, *, bs: int, qo_len: int,
                                       seq_lens: torch.Tensor,
                                       req_pool_indices: torch.Tensor) -> Any:
        if not (_tensor(seq_lens) and _tensor(req_pool_indices)):
            return STEP_ASIDE
        if not _arange_device_matches(getattr(self, "cuda_int32_kwargs", None), seq_lens.device):
            return STEP_ASIDE

        def launch():
            rows = expand_same_length(seq_lens, req_pool_indices, bs=bs, qo_len=qo_len)
            return rows.seq_lens_casual, rows.req_pool_indices_repeated

        requests = bs if isinstance(bs, int) else 0
        width = qo_len if isinstance(qo_len, int) else 0
        key = (seq_lens.dtype, req_pool_indices.dtype, width)
        try:
            return _run(EXPAND, seq_lens.device, requests, width, key, launch)
        except (ValueError, TypeError) as e:
            return _rejected(EXPAND, e)

    return GuardedHook("DSV4 verify row expansion", only_for_dsv4(expand_extend_with_same_length),
                       logger, "SGLang")


# The C4 sparse fields init_compression_metadata's launch computed for init_flashmla_related:
# (the metadata, by weak reference; its c4_topk_lengths_clamp1 and that tensor's version counter
# when they were written; index_topk; c4_sparse_topk_lengths; c4_sparse_page_indices). One slot:
# SGLang's make_core_attn_metadata calls the two methods back to back on one object.
_pending_sparse: tuple | None = None


def _attn_metadata_covered(metadata: Any, num_tokens: Any, low_ratio_buffers: Any) -> bool:
    """Whether an ``init_compression_metadata`` call is one the fused launch reproduces: a model
    with C4/C128 layers and no ratio-1/2 ones, no request window, no context-parallel split
    (``num_tokens`` is passed only there), SGLang's own assertions satisfied, tensors the op takes
    and a SWA table whose ``F.pad`` copy is contiguous (a contiguous source)."""
    if num_tokens is not None or low_ratio_buffers is not None:
        return False
    if tuple(getattr(metadata, "low_ratios", ())) or metadata.request_window_layout is not None:
        return False
    present = tuple(metadata.present_ratios)
    if not set(present) <= {0, 4, 128} or not {4, 128} & set(present):
        return False
    seq_lens, page_table = metadata.seq_lens_casual, metadata.page_table
    swa, out_loc = metadata.swa_page_indices, metadata.raw_out_loc
    if not all(_tensor(t) for t in (seq_lens, page_table, swa, out_loc)):
        return False
    if seq_lens.dim() != 1 or page_table.dim() != 2 or swa.dim() != 2 or out_loc.dim() != 1:
        return False
    rows = seq_lens.shape[0]
    if rows == 0 or out_loc.shape[0] != rows or not swa.is_contiguous():
        return False
    # init_flashmla_related asserts this; SGLang's own path raises it.
    return 4 not in present or metadata.index_topk in (512, 1024)


def make_compression_metadata_hook(module: ModuleType | None = None) -> GuardedHook:
    """The AROUND hook for ``DSV4AttnMetadata.init_compression_metadata``: the fields SGLang
    assigns (its compressed-metadata kernel, ``_pad_last_dim`` of the C128 and SWA indices), and
    the C4 sparse fields ``init_flashmla_related`` derives next, from one launch of
    :func:`~dsv4spec.ops.attention_metadata.build_compression_metadata`."""

    def init_compression_metadata(self: Any, num_tokens: int | None = None,
                                  low_ratio_buffers: Any = None) -> Any:
        global _pending_sparse
        if not _attn_metadata_covered(self, num_tokens, low_ratio_buffers):
            return STEP_ASIDE
        has_c4, has_c128 = 4 in self.present_ratios, 128 in self.present_ratios
        seq_lens, page_table = self.seq_lens_casual, self.page_table
        swa = self.swa_page_indices

        def launch():
            return build_compression_metadata(
                seq_lens, self.raw_out_loc, page_table, swa, page_size=self.page_size,
                index_topk=self.index_topk, has_c4=has_c4, has_c128=has_c128)

        num_pages = page_table.shape[1]
        key = (seq_lens.dtype, self.raw_out_loc.dtype, num_pages, self.page_size,
               self.index_topk, has_c4, has_c128, swa.shape[1])
        try:
            out = _run(COMPRESSION, seq_lens.device, seq_lens.shape[0], num_pages, key, launch)
        except (ValueError, TypeError) as e:
            return _rejected(COMPRESSION, e)
        if out is STEP_ASIDE:
            return STEP_ASIDE
        # Assigned only after the launch: a failure above leaves self for SGLang's own run.
        if has_c4:
            self.c4_out_loc = out.c4_out_loc
            self.c4_topk_lengths_raw = out.c4_topk_lengths_raw
            self.c4_topk_lengths_clamp1 = out.c4_topk_lengths_clamp1
            _pending_sparse = (weakref.ref(self), out.c4_topk_lengths_clamp1,
                               out.c4_topk_lengths_clamp1._version, self.index_topk,
                               out.c4_sparse_topk_lengths, out.c4_sparse_page_indices)
        if has_c128:
            self.c128_out_loc = out.c128_out_loc
            self.c128_topk_lengths_clamp1 = out.c128_topk_lengths_clamp1
            self.c128_page_indices = out.c128_page_indices
        self.swa_page_indices = out.swa_page_indices
        return None

    return GuardedHook("DSV4 compression metadata", only_for_dsv4(init_compression_metadata),
                       logger, "SGLang")


def _take_pending_sparse(metadata: Any) -> tuple | None:
    """The C4 sparse fields computed for ``metadata`` if they still match its inputs (the same
    ``c4_topk_lengths_clamp1`` tensor, unmodified, and ``index_topk``); the slot is emptied."""
    global _pending_sparse
    pending, _pending_sparse = _pending_sparse, None
    if pending is None:
        return None
    ref, clamp1, version, index_topk, lengths, indices = pending
    if (ref() is not metadata or metadata.c4_topk_lengths_clamp1 is not clamp1
            or clamp1._version != version or metadata.index_topk != index_topk):
        return None
    return lengths, indices


def make_flashmla_related_hook(module: ModuleType) -> GuardedHook:
    """The AROUND hook for ``DSV4AttnMetadata.init_flashmla_related``: where
    ``init_compression_metadata``'s hook already computed the C4 sparse fields for this object
    (decode/verify, no ratio-1/2 layers), it assigns them and creates the FlashMLA schedules as
    SGLang's method does (``module._create_flashmla_metadata``, in the same order); otherwise
    SGLang's method runs.

    Parameters
    ----------
    module : module
        ``sglang.srt.layers.attention.deepseek_v4_backend`` (its ``_create_flashmla_metadata``
        is looked up at each call).
    """

    def init_flashmla_related(self: Any, is_prefill: bool = False,
                              low_ratio_buffers: Any = None) -> Any:
        # The slot is taken (emptied) on every call, used or not.
        pending = _take_pending_sparse(self)
        if (pending is None or is_prefill is not False or low_ratio_buffers is not None
                or tuple(self.low_ratios) or 4 not in self.present_ratios):
            return STEP_ASIDE
        create = module._create_flashmla_metadata
        self.c4_sparse_topk_lengths, self.c4_sparse_page_indices = pending
        self.c0_flashmla_metadata = create()
        self.c4_flashmla_metadata = create()
        self.c128_flashmla_metadata = create() if 128 in self.present_ratios else None
        return None

    return GuardedHook("DSV4 FlashMLA metadata", only_for_dsv4(init_flashmla_related), logger,
                       "SGLang")


def _gate(op: str, ours: str, note: str = "") -> Gate:
    return Gate(ops=(ours,), table=TABLES[op], prefers=functools.partial(prefers_dsv4spec, op),
                note=note)


# How each hook here decides, for reports (dsv4spec doctor): its table and prefers_dsv4spec.
GATES: dict[str, Gate] = {
    "DSV4 page table": _gate(
        PAGE_TABLE, "build_page_table_positions",
        f"not while SGLang reads the page table past the live pages ({TORCH_PAGED_LOGITS_ENV}, "
        f"the {UNREAD_TOPK_BACKEND} DSA top-k backend)"),
    "DSV4 compressed metadata": _gate(COMPRESSED, "init_compressed_attn_metadata"),
    "DSV4 verify row expansion": _gate(EXPAND, "expand_same_length"),
    "DSV4 compression metadata in one launch": _gate(
        COMPRESSION, "build_compression_metadata",
        "DSV4 (C4/C128 layers) only: not with ratio-1/2 layers, a request window or context "
        "parallel"),
    "DSV4 FlashMLA metadata": Gate(follows="DSV4 compression metadata in one launch"),
}
