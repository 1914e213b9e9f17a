"""Fast paths for vLLM's mHC functions (``vllm.model_executor.kernels.mhc.tilelang``):
``mhc_pre_tilelang``, ``mhc_post_tilelang`` and ``mhc_fused_post_pre_tilelang`` (0.33.0 and
0.34.0), and ``mhc_fused_post_pre_tilelang_reuse_residual`` (0.34.0).

Each takes vLLM's exact arguments and returns vLLM's result (same shapes, dtypes and views:
``post_mix [T, 4, 1]``, ``comb_mix [T, 4, 4]`` float32, bf16 activations) computed with
dsv4spec's ops where :mod:`~dsv4spec.integrations.vllm.tables` says ours is faster, and
:data:`~dsv4spec.integrations.hooks.STEP_ASIDE` (vLLM's function runs with the same arguments)
everywhere else: ROCm, GPU architectures or widths absent from the tables, ``torch.compile``,
vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT``: our split-K tiling depends on the token
count), token counts where vLLM would run DeepGEMM's pre-norm GEMM (not what the tables were
measured against), inputs our ops do not cover (hc_mult other than 4, dtypes other than vLLM's,
empty or non-contiguous inputs, extra leading dimensions, ``hc_pre_eps != hc_sinkhorn_eps``, a
float32 norm weight), and a shape first seen inside a CUDA-graph capture (nothing compiles
there: vLLM's warm-up runs each size eagerly before it captures it).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations.hooks import (
    INTERPRETER_ARCHITECTURE,
    STEP_ASIDE,
    Gate,
    deep_gemm_cases,
    gpu_architecture,
    measured_faster,
    path_matches,
    rows_for,
    run_where_measured_faster,
)
from dsv4spec.integrations.mhc import HC, post_shapes_ok, pre_kwargs, streams_ok
from dsv4spec.integrations.mhc_precompile import Signature, precompile_mhc
from dsv4spec.integrations.vllm.tables import DEEP_GEMM_FROM_TOKENS, DEEPGEMM_TABLES, TABLES
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.ops import mhc_post, mhc_post_pre, mhc_pre

logger = logging.getLogger("dsv4spec.integrations.vllm")

_warned: set[str] = set()
# Launch shapes dsv4spec's op has run eagerly (so compiled): inside a capture only these run.
_compiled: set[tuple] = set()
_deep_gemm: bool | None = None


def prefers_dsv4spec(op: str, num_tokens: int, hidden_size: int, in_graph: bool,
                     architecture: tuple[int, int] | None = INTERPRETER_ARCHITECTURE,
                     deep_gemm: bool = False) -> bool:
    """Whether vLLM's ``op`` should run dsv4spec's op rather than its own.

    Parameters
    ----------
    op : {"hc_head", "mhc_pre", "mhc_post", "mhc_fused_post_pre"}
    num_tokens, hidden_size : int
        ``T`` and ``H`` of ``residual [T, 4, H]``.
    in_graph : bool
        Whether the call is captured into a CUDA graph (device time counts) or runs eagerly.
    architecture : (int, int) or None
        The GPU's compute capability; None (ROCm) never prefers ours.
    deep_gemm : bool
        Whether vLLM runs DeepGEMM's pre-norm GEMM (``is_deep_gemm_supported()``).

    Returns
    -------
    bool
        True iff ``num_tokens`` lies in one of ``op``'s measured winning ranges for that
        architecture, mode and width (where ``deep_gemm``, those of :data:`DEEPGEMM_TABLES` if
        they cover the GPU and width: :func:`~dsv4spec.integrations.hooks.rows_for`; else
        :data:`TABLES`'), measured against the path vLLM's op takes there
        (DeepGEMM's GEMM from :data:`~dsv4spec.integrations.vllm.tables.DEEP_GEMM_FROM_TOKENS`
        where ``deep_gemm``, else its own kernels:
        :func:`~dsv4spec.integrations.hooks.path_matches`).
    """
    deep_from = DEEP_GEMM_FROM_TOKENS[op]
    if architecture is None:
        return False
    engine_deep_gemm = deep_gemm and deep_from is not None and num_tokens >= deep_from
    table = rows_for(TABLES[op], DEEPGEMM_TABLES.get(op), architecture,
                     deep_gemm and deep_from is not None, hidden_size)
    if not path_matches(table, architecture, op, num_tokens, engine_deep_gemm, logger):
        return False
    return measured_faster(table, architecture, hidden_size, num_tokens, in_graph)


def vllm_batch_invariant() -> bool:
    """vLLM's ``VLLM_BATCH_INVARIANT`` (fixed at server start; read as vLLM's envs reads it)."""
    try:
        return bool(int(os.environ.get("VLLM_BATCH_INVARIANT", "0")))
    except ValueError:
        return True  # vLLM itself would refuse to start; never guess in its favour


def vllm_deep_gemm() -> bool:
    """vLLM's ``is_deep_gemm_supported()``, from the module already loaded (nothing imported;
    remembered once vLLM has loaded it). Unknown counts as supported: the hook steps aside."""
    global _deep_gemm
    if _deep_gemm is not None:
        return _deep_gemm
    module = sys.modules.get("vllm.utils.deep_gemm")
    if module is None:
        return True
    _deep_gemm = bool(module.is_deep_gemm_supported())
    return _deep_gemm


def _capturing(index: int) -> bool:
    return index >= 0 and stream_capturing(index)


def visible_architectures() -> list[tuple[int, int] | None] | None:
    """The compute capability of each GPU this process sees (None for a ROCm GPU); None in a
    process without CUDA (the CPU interpreter)."""
    if not torch.cuda.is_available():
        return None
    return [gpu_architecture(index) for index in range(torch.cuda.device_count())]


def table_spans(op: str, architecture: tuple[int, int] | None, hidden_size: int | None = None,
                ) -> list[tuple[int, int]]:
    """The token ranges ``op``'s tables (its rows measured with and without vLLM's DeepGEMM)
    give to dsv4spec on that architecture, in a graph or eagerly, at ``hidden_size`` (every
    width where None)."""
    if architecture is None:
        return []
    spans = []
    for table in (TABLES[op], DEEPGEMM_TABLES.get(op)):
        modes = None if table is None else table.get(architecture)
        for keyed in (modes or {}).values():
            spans += [span for key, key_spans in keyed.items()
                      if hidden_size is None or key == hidden_size for span in key_spans]
    return spans


def process_served(op: str) -> tuple[bool, str | None]:
    """Whether ``op``'s table serves any GPU this process sees (any width, count or mode), and
    those GPUs' architectures; (True, None) without CUDA (the interpreter decides per call)."""
    architectures = visible_architectures()
    if architectures is None:
        return True, None
    where = ", ".join("ROCm" if a is None else f"sm_{a[0]}{a[1]}" for a in architectures)
    return any(table_spans(op, a) for a in architectures), where


def served_tokens(op: str, hidden_size: int, architecture: tuple[int, int] | None,
                  deep_gemm: bool) -> list[int]:
    """The token counts at which the hook may launch dsv4spec's ``op`` at this width on that
    architecture, in a graph or eagerly (:func:`prefers_dsv4spec`)."""
    spans = table_spans(op, architecture, hidden_size)
    top = max((hi for _, hi in spans), default=0)
    return [T for T in range(1, top + 1)
            if any(prefers_dsv4spec(op, T, hidden_size, in_graph, architecture, deep_gemm)
                   for in_graph in (False, True))]


_prepared: set[tuple] = set()


def _prepare(op: str, index: int, hidden_size: int, architecture, deep_gemm: bool,
             sig: Signature) -> None:
    """At ``op``'s first eager call for a (device, width, signature) outside a capture: compile
    every variant it may launch at the counts the table serves there (none where no table
    serves), so no later eager call compiles, whatever its token count. Decided again where
    vLLM's DeepGEMM use becomes known (it changes the counts served)."""
    key = (op, index, hidden_size, sig, deep_gemm)
    if key in _prepared:
        return
    _prepared.add(key)
    tokens = served_tokens(op, hidden_size, architecture, deep_gemm)
    if tokens:
        precompile_mhc(op, tokens, hidden_size, index, sig, logger)


def run_if_faster(op: str, residual: torch.Tensor, key: tuple, launch,
                  sig: Signature | None = None) -> Any:
    """``launch()`` where the table prefers ours for this call, else STEP_ASIDE (the capture
    rule: :func:`~dsv4spec.integrations.hooks.run_where_measured_faster`). The first eager call
    of a (device, width, signature) compiles every variant ``op`` may launch first
    (:func:`_prepare`; ``sig`` None: nothing compiled ahead)."""
    if (torch.compiler.is_compiling() or on_rocm() or not triton_runs_on(residual.device)
            or vllm_batch_invariant()):
        return STEP_ASIDE
    index = residual.get_device()
    architecture = gpu_architecture(index)
    T, _, H = residual.shape
    deep_gemm = DEEP_GEMM_FROM_TOKENS[op] is not None and vllm_deep_gemm()
    capturing = _capturing(index)
    if not capturing and sig is not None:
        _prepare(op, index, H, architecture, deep_gemm, sig)
    return run_where_measured_faster(
        (op, index, *key), _compiled, capturing,
        lambda in_graph: prefers_dsv4spec(op, T, H, in_graph, architecture, deep_gemm), launch)


def _signature(residual: torch.Tensor, fn: Any, hc_scale: Any, hc_base: Any, norm_weight: Any,
               sinkhorn_repeat: int) -> Signature | None:
    """The precompile's signature of an mhc_pre or boundary call (None where an argument is
    not a tensor: nothing is compiled for it, and the op rejects the call)."""
    if not all(isinstance(t, torch.Tensor) for t in (fn, hc_scale, hc_base)):
        return None
    return Signature(residual.dtype, fn.dtype, hc_scale.dtype, hc_base.dtype,
                     None if norm_weight is None else norm_weight.dtype, int(sinkhorn_repeat),
                     residual.is_cuda)


def rejected(op: str, error: Exception) -> Any:
    """STEP_ASIDE for inputs dsv4spec's op refused, with one warning per op."""
    if op not in _warned:
        _warned.add(op)
        logger.warning("dsv4spec: vLLM %s: dsv4spec's op rejected the inputs (%s); vLLM's own "
                       "kernel runs for such inputs", op, error)
    return STEP_ASIDE


def _post_ok(x: Any, residual: torch.Tensor, post_layer_mix: Any, comb_res_mix: Any) -> bool:
    """:func:`~dsv4spec.integrations.mhc.post_shapes_ok`, with both mixes float32 (vLLM's
    kernels take float32 mixes only)."""
    return (post_shapes_ok(x, residual, post_layer_mix, comb_res_mix)
            and post_layer_mix.dtype == torch.float32 and comb_res_mix.dtype == torch.float32)


def fast_mhc_pre(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
    sinkhorn_repeat: int, n_splits: int = 1, norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> Any:
    """Fast path for vLLM's ``mhc_pre_tilelang``: ``(post_mix [T, 4, 1] f32, comb_mix
    [T, 4, 4] f32, layer_input [T, H] bf16)`` from dsv4spec's :func:`~dsv4spec.ops.mhc_pre`, or
    STEP_ASIDE. ``n_splits`` is ignored, as vLLM ignores it (its GEMM picks its own split)."""
    if not streams_ok(residual):
        return STEP_ASIDE
    kwargs = pre_kwargs(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                        sinkhorn_repeat, norm_weight, norm_eps, residual.shape[2])
    if kwargs is None:
        return STEP_ASIDE

    def launch():
        post, comb, layer_input = mhc_pre(residual, fn, hc_scale, hc_base, impl="triton",
                                          **kwargs)
        return post.unsqueeze(-1), comb, layer_input

    key = (*residual.shape, sinkhorn_repeat, norm_weight is None)
    sig = _signature(residual, fn, hc_scale, hc_base, norm_weight, sinkhorn_repeat)
    try:
        return run_if_faster("mhc_pre", residual, key, launch, sig)
    except (ValueError, TypeError) as e:  # raised by the op's input checks, before any launch
        return rejected("mhc_pre", e)


def fast_mhc_post(
    x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
) -> Any:
    """Fast path for vLLM's ``mhc_post_tilelang``: ``[T, 4, H]`` bf16 from dsv4spec's
    :func:`~dsv4spec.ops.mhc_post` (``post_layer_mix`` ``[T, 4, 1]`` or ``[T, 4]``, as vLLM
    takes it), or STEP_ASIDE."""
    if not streams_ok(residual) or not _post_ok(x, residual, post_layer_mix, comb_res_mix):
        return STEP_ASIDE
    post = post_layer_mix.view(residual.shape[0], HC)

    def launch():
        return mhc_post(x, residual, post, comb_res_mix, impl="triton")

    try:
        return run_if_faster("mhc_post", residual, tuple(residual.shape), launch,
                             Signature(dtype=residual.dtype, fast_math=residual.is_cuda))
    except (ValueError, TypeError) as e:
        return rejected("mhc_post", e)


# vLLM 0.34.0's reuse_residual boundary writes the new residual into ``residual`` above its fused
# kernel's 32 tokens (``_FUSED_POST_PRE_MAX_TOKENS``, at the DSV4 widths); the fast path can too
# from this count (33), saving a transient [T, 4, H] bf16 residual (58.7 MB at 1,024 tokens, 235 MB
# at 4,096, H = 7168). Off (None) until it has run on a GPU: launch 1 loads each token's four
# streams as a tile broadcast over fn's rows and stores the new streams at the same addresses,
# with no barrier between, so a warp holding a replica could read a value another warp has
# already overwritten, which the interpreter (one program at a time) cannot show.
REUSE_IN_PLACE_FROM_TOKENS: int | None = None


def _boundary_fast_path(reuse_residual: bool) -> Callable[..., Any]:
    """The fast path of vLLM's boundary function, with vLLM's parameters; ``reuse_residual``: as
    vLLM 0.34.0's, from :data:`REUSE_IN_PLACE_FROM_TOKENS` tokens ``residual_cur`` is
    ``residual``, overwritten, once the shape has run here before."""

    def fast(
        x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
        comb_res_mix: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor,
        hc_base: torch.Tensor, rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float,
        hc_post_mult_value: float, sinkhorn_repeat: int, n_splits: int = 1, tile_n: int = 1,
        norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
    ) -> Any:
        if not streams_ok(residual) or not _post_ok(x, residual, post_layer_mix, comb_res_mix):
            return STEP_ASIDE
        kwargs = pre_kwargs(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                            sinkhorn_repeat, norm_weight, norm_eps, residual.shape[2])
        if kwargs is None:
            return STEP_ASIDE
        post_in = post_layer_mix.view(residual.shape[0], HC)
        key = (*residual.shape, sinkhorn_repeat, norm_weight is None)
        # in place only once this shape has run (so compiled): a first launch that failed while
        # compiling, or one only warming a graph's shape, must leave vLLM's fallback its input
        in_place = (reuse_residual and REUSE_IN_PLACE_FROM_TOKENS is not None
                    and residual.shape[0] >= REUSE_IN_PLACE_FROM_TOKENS
                    and ("mhc_fused_post_pre", residual.get_device(), *key) in _compiled)

        def launch():
            new, post, comb, layer_input = mhc_post_pre(
                x, residual, post_in, comb_res_mix, fn, hc_scale, hc_base, impl="triton",
                residual_out=residual if in_place else None, **kwargs)
            return new, post.unsqueeze(-1), comb, layer_input

        sig = _signature(residual, fn, hc_scale, hc_base, norm_weight, sinkhorn_repeat)
        try:
            return run_if_faster("mhc_fused_post_pre", residual, key, launch, sig)
        except (ValueError, TypeError) as e:
            return rejected("mhc_fused_post_pre", e)

    fast.__name__ = fast.__qualname__ = ("fast_mhc_fused_post_pre_reuse_residual"
                                         if reuse_residual else "fast_mhc_fused_post_pre")
    return fast


fast_mhc_fused_post_pre = _boundary_fast_path(False)
fast_mhc_fused_post_pre.__doc__ = (
    """Fast path for vLLM's ``mhc_fused_post_pre_tilelang``: ``(residual_cur [T, 4, H] bf16,
    post_mix_cur [T, 4, 1] f32, comb_mix_cur [T, 4, 4] f32, layer_input_cur [T, H] bf16)`` from
    dsv4spec's :func:`~dsv4spec.ops.mhc_post_pre`, or STEP_ASIDE. ``n_splits`` and ``tile_n``
    are ignored, as vLLM ignores them (it picks both from the token count).""")
fast_mhc_fused_post_pre_reuse_residual = _boundary_fast_path(True)
fast_mhc_fused_post_pre_reuse_residual.__doc__ = (
    """Fast path for vLLM 0.34.0's ``mhc_fused_post_pre_tilelang_reuse_residual``, the boundary
    ``DeepseekV4DecoderLayer.forward`` runs when ``DeepseekV4Model.forward`` hands each layer its
    residual (``reuse_residual=True``): the same arguments and results as
    ``mhc_fused_post_pre_tilelang``, except that ``residual`` may be overwritten, which the
    caller allows (it drops the old residual). As :func:`fast_mhc_fused_post_pre`, except that
    where vLLM's writes in place (from :data:`REUSE_IN_PLACE_FROM_TOKENS` tokens) the returned
    ``residual_cur`` is ``residual``, overwritten, from the second eager call of a shape on (its
    first, out of place, compiles it); below, a new tensor, as vLLM's fused kernel returns. Both
    run the same kernels, so the same tables decide (vLLM's boundary kernels are those of
    ``mhc_fused_post_pre_tilelang``: ``tilelang_kernels.py`` is byte-identical in 0.33.0 and
    0.34.0, and 0.34.0's two functions are one ``_mhc_fused_post_pre_tilelang_impl`` differing
    only in where the unfused path writes).""")



def _gate(op: str, ours: str) -> Gate:
    return Gate(ops=(ours,), table=TABLES[op], deepgemm_table=DEEPGEMM_TABLES.get(op),
                prefers=functools.partial(prefers_dsv4spec, op),
                cases=deep_gemm_cases(DEEP_GEMM_FROM_TOKENS[op]),
                note="not under VLLM_BATCH_INVARIANT or torch.compile")


# How each hook here decides, for reports (dsv4spec doctor): its table and prefers_dsv4spec, with
# vLLM's DeepGEMM off and on (only vLLM knows which). The reuse_residual boundary is the
# boundary's fast path and reads its table.
GATES: dict[str, Gate] = {
    "mhc_pre": _gate("mhc_pre", "mhc_pre"),
    "mhc_post": _gate("mhc_post", "mhc_post"),
    "mhc_fused_post_pre": _gate("mhc_fused_post_pre", "mhc_post_pre"),
    "mhc_fused_post_pre_reuse_residual": _gate("mhc_fused_post_pre", "mhc_post_pre"),
}
