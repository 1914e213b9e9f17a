"""AROUND hooks on SGLang's DSV4 attention-metadata builders: the page table and the C128 page
indices written over each row's live length instead of the pool's whole context.

Targets (SGLang 0.5.23), both module-level functions reached through their module's globals at
call time, so the registry's ``setattr`` on the module is what every caller sees:

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
by consumer: :mod:`dsv4spec.ops.attention_metadata`), and step aside (SGLang's function runs with
the same arguments) on ROCm, under ``torch.compile``, where Triton cannot run, for inputs the ops
do not take (their checks raise before anything is written), for a launch shape first seen
inside a CUDA-graph capture (nothing compiles there), and wherever the measured tables below do
not say dsv4spec's kernel is faster.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations.hooks import (
    INTERPRETER_ARCHITECTURE,
    STEP_ASIDE,
    FasterTable,
    GuardedHook,
    gpu_architecture,
    measured_faster,
)
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.ops.attention_metadata import (
    build_page_table_positions,
    init_compressed_attn_metadata,
)

logger = logging.getLogger("dsv4spec.integrations.sglang")

PAGE_TABLE = "build_page_table_positions_triton"
COMPRESSED = "_init_compressed_attn_metadata_triton"

# Where dsv4spec's kernel beat SGLang's, per GPU architecture (compute capability) and mode
# ("graph": device time in a CUDA graph; "eager": host wall time per back-to-back eager call),
# keyed by the page table's width in pages (``cdiv(max_seq_len, page_size)``, 4096 at 1M tokens
# and 256-token pages): inclusive ranges of query rows whose measured points all won. Source:
# benchmarks/results/metadata.md (``dsv4spec bench metadata``). Empty until measured: every call
# steps aside. Filling one architecture is one line, e.g.
#   (9, 0): {"graph": {4096: ((1, 512),)}, "eager": {4096: ((1, 512),)}},
SGLANG_PAGE_TABLE_FASTER: FasterTable = {(9, 0): {"graph": {}, "eager": {}}}
SGLANG_COMPRESSED_FASTER: FasterTable = {(9, 0): {"graph": {}, "eager": {}}}
TABLES: dict[str, FasterTable] = {
    PAGE_TABLE: SGLANG_PAGE_TABLE_FASTER,
    COMPRESSED: SGLANG_COMPRESSED_FASTER,
}

_warned: set[str] = set()
# Launch keys dsv4spec's kernel has run eagerly (so compiled): inside a capture only these run.
_compiled: set[tuple] = set()


def prefers_dsv4spec(op: str, rows: int, num_pages: int, in_graph: bool,
                     architecture: tuple[int, int] | None = INTERPRETER_ARCHITECTURE) -> bool:
    """Whether SGLang's ``op`` should run dsv4spec's kernel rather than its own.

    Parameters
    ----------
    op : {"build_page_table_positions_triton", "_init_compressed_attn_metadata_triton"}
    rows : int
        Query (metadata) rows of the call.
    num_pages : int
        Page-table width in pages.
    in_graph : bool
        Whether the call is captured into a CUDA graph or runs eagerly.
    architecture : (int, int) or None
        The GPU's compute capability; None (ROCm) never prefers ours.
    """
    return measured_faster(TABLES[op], architecture, num_pages, rows, in_graph)


def _run(op: str, device: torch.device, rows: int, num_pages: int, key: tuple, launch) -> Any:
    """``launch()`` where the table prefers ours for this call, else STEP_ASIDE.

    Eagerly, a shape the graph table gives to ours is launched once even where the eager table
    keeps SGLang's (the result is dropped), so it is compiled before SGLang captures it.
    """
    if torch.compiler.is_compiling() or on_rocm() or not triton_runs_on(device):
        return STEP_ASIDE
    index = device.index if device.type == "cuda" else -1
    if index is None:
        index = torch.cuda.current_device()
    architecture = gpu_architecture(index)
    key = (op, index, *key)
    if index >= 0 and stream_capturing(index):
        if key in _compiled and prefers_dsv4spec(op, rows, num_pages, True, architecture):
            return launch()
        return STEP_ASIDE
    if prefers_dsv4spec(op, rows, num_pages, False, architecture):
        result = launch()
        _compiled.add(key)
        return result
    if key not in _compiled and prefers_dsv4spec(op, rows, num_pages, True, architecture):
        launch()
        _compiled.add(key)
    return STEP_ASIDE


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

    return GuardedHook("DSV4 page table", build_page_table_positions_triton, logger, "SGLang")


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

    return GuardedHook("DSV4 compressed metadata", _init_compressed_attn_metadata_triton, logger,
                       "SGLang")
