"""AROUND hooks on SGLang's mHC entry points in ``sglang.kernels.ops.layernorm.mhc``.

SGLang 0.5.23's DeepSeek-V4 reaches the three functions as follows (CUDA, defaults; see
:data:`dsv4spec.bench.sglang_mhc.CALL_SITES`):

- ``mhc_fused_post_pre`` (every layer boundary): through ``get_mhc_ops().mhc_fused_post_pre``,
  where ``get_mhc_ops`` (``sglang.srt.models.deepseek_v4``) is ``functools.cache``'d and runs
  ``from sglang.kernels.ops.layernorm.mhc import mhc_fused_post_pre`` at its first call, i.e. at
  the first forward, after ``load_plugins()`` has applied the hooks: it reads the hooked module
  attribute and caches that;
- ``mhc_pre`` (the first layer's hc_pre) and ``mhc_post`` (the last layer's and the MTP layer's
  hc_post): ``from sglang.kernels.ops.layernorm.mhc import ...`` inside the calling function, at
  every call, so they read the hooked module attribute too. SGLang's own wrappers in that file
  (``_mhc_pre_dispatch``, ``_mhc_post_dispatch``, ``prewarm_mhc_pre``) look the names up in the
  module's globals at call time, which the registry's ``setattr`` on the module replaces.

Each hook computes SGLang's result (same shapes, dtypes and views: ``post_mix [T, hc, 1]``,
``comb_mix [T, hc, hc]`` float32, bf16 activations) with dsv4spec's ops where the measured tables
below say ours is faster, and steps aside (SGLang's function runs with the same arguments)
everywhere else: token counts where SGLang runs DeepGEMM's pre-norm GEMM (SGLang's own
``_use_deep_gemm_hc_prenorm()``, on by default where DeepGEMM is installed: ``mhc_pre`` at every
count, the fused boundary above 32 tokens; the tables were measured against SGLang's TileLang
GEMM), ROCm, GPU architectures or widths absent from the tables, ``torch.compile``,
SGLang's deterministic inference or batch-invariant mode (our split-K tiling depends on the token
count), inputs our ops do not cover (hc_mult other than 4, dtypes other than SGLang's, empty or
non-contiguous inputs, extra leading dimensions, ``hc_pre_eps != hc_sinkhorn_eps``), a first
sight of a shape inside a CUDA-graph capture (nothing compiles there), a model other than
DeepSeek-V4 (GLM-5-next calls the same functions; :mod:`~dsv4spec.integrations.sglang.
served_model`), and, for ``mhc_pre`` and ``mhc_fused_post_pre``, SGLang's symmetric memory
(``--enable-symm-mem``): SGLang allocates their ``layer_input`` in NCCL symmetric memory, where
the MoE writes its output and the all-reduce reads it; ours would come from the ordinary
allocator, so SGLang's own runs.

Where a table gives a shape to ours eagerly and to SGLang's in a graph (``mhc_post`` at T <= 64,
``mhc_pre`` at 17-32 tokens), SGLang's function also runs once eagerly for that shape at the
first such call (result dropped), so its TileLang kernel is compiled before SGLang captures it,
as SGLang's load-time prewarm would have done had it not reached ours.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations.hooks import (
    INTERPRETER_ARCHITECTURE,
    STEP_ASIDE,
    FasterTable,
    Gate,
    GuardedHook,
    deep_gemm_cases,
    gpu_architecture,
    measured_faster,
    path_matches,
    rows_for,
    run_where_measured_faster,
)
from dsv4spec.integrations.mhc import HC, post_shapes_ok, pre_kwargs, streams_ok
from dsv4spec.integrations.sglang.hc_head import sglang_deterministic
from dsv4spec.integrations.sglang.served_model import only_for_dsv4
from dsv4spec.integrations.sglang.source import MHC_MODULE
from dsv4spec.integrations.tables import faster_table
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.ops import mhc_post, mhc_post_pre, mhc_pre

logger = logging.getLogger("dsv4spec.integrations.sglang")

# Where dsv4spec's op beat SGLang's function, per GPU architecture (compute capability), mode
# ("graph": device time inside a CUDA graph; "eager": host wall time per back-to-back eager call)
# and hidden size H: inclusive token ranges, read from the measured-faster tables
# (dsv4spec.integrations.tables: the GPU's file, tables/NVIDIA_H200.json on an H200, sm_90.json
# on other sm_90 GPUs). The H200's, from the first bench mhc runs (H200, 2026-12-01,
# benchmarks/results/archive/mhc_2026-12-01*/: SGLang 0.5.23's TileLang kernels side by side
# with ours at T = 1, 16, 64, 4096): in a graph ours won pre and the fused boundary at T = 1
# and 16 (and the boundary at 64, beyond the 32-token cap), lost post at every T <= 64 and tied
# it at 4096; eager, ours won every op at T <= 64.
SGLANG_MHC_PRE_FASTER: FasterTable = faster_table("sglang", "mhc_pre")
SGLANG_MHC_POST_FASTER: FasterTable = faster_table("sglang", "mhc_post")
SGLANG_MHC_FUSED_POST_PRE_FASTER: FasterTable = faster_table("sglang", "mhc_fused_post_pre")
TABLES: dict[str, FasterTable] = {
    "mhc_pre": SGLANG_MHC_PRE_FASTER,
    "mhc_post": SGLANG_MHC_POST_FASTER,
    "mhc_fused_post_pre": SGLANG_MHC_FUSED_POST_PRE_FASTER,
}
# The rows measured against SGLang's DeepGEMM path (the ``.deepgemm`` files), which decide where
# SGLang runs DeepGEMM (hooks.rows_for), to their own max_count.
DEEPGEMM_TABLES: dict[str, FasterTable] = {
    op: faster_table("sglang", op, deepgemm=True) for op in ("mhc_pre", "mhc_fused_post_pre")}
# Token counts beyond which the rows measured without DeepGEMM are not consulted (the call steps
# aside whatever they say): the benchmark measured mhc_pre and the boundary against SGLang's
# TileLang kernels up to 32 tokens. mhc_post's table alone bounds it.
MEASURED_MAX_TOKENS: dict[str, int | None] = {
    "mhc_pre": 32,
    "mhc_post": None,
    "mhc_fused_post_pre": 32,
}
# The token count from which SGLang's op computes its pre-norm GEMM with DeepGEMM's tf32
# ``tf32_hc_prenorm_gemm`` where SGLang's ``_use_deep_gemm_hc_prenorm()`` says so
# (``SGLANG_OPT_DEEPGEMM_HC_PRENORM``, on by default, and DeepGEMM enabled and importable): mhc_pre
# at every count, the fused boundary above its one-launch TileLang kernel's 32 tokens. A table row
# decides these counts only where it was measured against DeepGEMM (its ``measured_against``:
# hooks.path_matches); rows measured against SGLang's TileLang GEMM keep SGLang's op there.
# mhc_post never uses DeepGEMM.
DEEP_GEMM_FROM_TOKENS: dict[str, int | None] = {
    "mhc_pre": 1,
    "mhc_post": None,
    "mhc_fused_post_pre": 33,
}

_warned: set[str] = set()
# SGLang's _use_deep_gemm_hc_prenorm() in this process (None: not read yet).
_deep_gemm: bool | None = None
# Whether that read failed (DeepGEMM then assumed on, and said so once).
_deep_gemm_unread = False
# Launch shapes dsv4spec's op has run eagerly (so compiled): inside a capture only these run.
_compiled: set[tuple] = set()
# Launch shapes SGLang's function has run eagerly through the hook (see _WarmsOriginal).
_original_warmed: set[tuple] = set()
# The shape whose eager call ran ours while the graph table keeps SGLang's: the hook runs
# SGLang's function once for it after the fast path returns.
_warm_pending: tuple | None = None
PYNCCL_ALLOCATOR_MODULE = "sglang.srt.distributed.device_communicators.pynccl_allocator"


def prefers_dsv4spec(op: str, num_tokens: int, hidden_size: int, in_graph: bool,
                     architecture: tuple[int, int] | None = INTERPRETER_ARCHITECTURE,
                     deep_gemm: bool = False) -> bool:
    """Whether SGLang's ``op`` should run dsv4spec's op rather than its own.

    Parameters
    ----------
    op : {"mhc_pre", "mhc_post", "mhc_fused_post_pre"}
    num_tokens : int
        ``T``, rows of ``residual [T, 4, hidden_size]``.
    hidden_size : int
        ``H``.
    in_graph : bool
        Whether the call is captured into a CUDA graph (device time counts) or runs eagerly.
    architecture : (int, int) or None
        The GPU's compute capability; None (ROCm) never prefers ours.
    deep_gemm : bool
        Whether SGLang runs DeepGEMM's pre-norm GEMM (:func:`sglang_deep_gemm`).

    Returns
    -------
    bool
        True iff the rows deciding (where ``deep_gemm``, those of :data:`DEEPGEMM_TABLES` if
        they cover the GPU, :func:`~dsv4spec.integrations.hooks.rows_for`; else ``op``'s table,
        up to :data:`MEASURED_MAX_TOKENS`) were measured against the path SGLang's op takes
        there (DeepGEMM's GEMM from :data:`DEEP_GEMM_FROM_TOKENS` where ``deep_gemm``, else its
        own kernels: :func:`~dsv4spec.integrations.hooks.path_matches`) and ``num_tokens`` lies
        in one of their measured winning ranges for that architecture, mode and width.
    """
    cap, deep_from = MEASURED_MAX_TOKENS[op], DEEP_GEMM_FROM_TOKENS[op]
    if architecture is None:
        return False
    table = rows_for(TABLES[op], DEEPGEMM_TABLES.get(op), architecture,
                     deep_gemm and deep_from is not None, hidden_size)
    if table is TABLES[op] and cap is not None and num_tokens > cap:
        return False
    engine_deep_gemm = deep_gemm and deep_from is not None and num_tokens >= deep_from
    if not path_matches(table, architecture, op, num_tokens, engine_deep_gemm, logger,
                        tell=not _deep_gemm_unread):
        return False
    return measured_faster(table, architecture, hidden_size, num_tokens, in_graph)


def sglang_deep_gemm() -> bool:
    """Whether SGLang's mHC ops run DeepGEMM's pre-norm GEMM: SGLang's own
    ``_use_deep_gemm_hc_prenorm()`` in the hooked module (its env switch, then DeepGEMM's
    ``ENABLE_JIT_DEEPGEMM``), read at the first call that asks and remembered for the process
    (both are fixed at server start). True where it cannot be read: the hooks then serve ours
    only where rows measured against DeepGEMM's path have it faster."""
    global _deep_gemm, _deep_gemm_unread
    if _deep_gemm is not None:
        return _deep_gemm
    module = sys.modules.get(MHC_MODULE)
    if module is None:  # SGLang's mHC ops are not loaded: asked again once they are
        return True
    try:
        _deep_gemm = bool(module._use_deep_gemm_hc_prenorm())
    except Exception as e:  # noqa: BLE001 - renamed or failing: SGLang's path is safe
        _deep_gemm = _deep_gemm_unread = True
        logger.warning("dsv4spec: could not read SGLang's DeepGEMM pre-norm decision (%s: %s); "
                       "the mhc_pre and boundary hooks take it as on: wherever SGLang may run "
                       "DeepGEMM they serve ours only where rows measured against DeepGEMM's "
                       "path have it faster", type(e).__name__, e)
    return _deep_gemm


def _architecture(index: int) -> tuple[int, int] | None:
    return gpu_architecture(index)


def _capturing(index: int) -> bool:
    return index >= 0 and stream_capturing(index)


def _run(op: str, residual: torch.Tensor, key: tuple, launch) -> Any:
    """``launch()`` where the table prefers ours for this call, else STEP_ASIDE (the capture
    rule: :func:`~dsv4spec.integrations.hooks.run_where_measured_faster`)."""
    if (torch.compiler.is_compiling() or on_rocm() or not triton_runs_on(residual.device)
            or sglang_deterministic()):
        return STEP_ASIDE
    global _warm_pending
    index = residual.get_device()
    architecture = _architecture(index)
    T, _, H = residual.shape
    key, capturing = (op, index, *key), _capturing(index)
    deep_gemm = DEEP_GEMM_FROM_TOKENS[op] is not None and sglang_deep_gemm()

    def prefers(in_graph: bool) -> bool:
        return prefers_dsv4spec(op, T, H, in_graph, architecture, deep_gemm)

    result = run_where_measured_faster(key, _compiled, capturing, prefers, launch)
    if (result is not STEP_ASIDE and not capturing and key not in _original_warmed
            and not prefers(True)):
        _warm_pending = key
    return result


def sglang_symmetric_memory() -> bool:
    """Whether SGLang may allocate ``layer_input`` in NCCL symmetric memory: its own
    ``is_symmetric_memory_enabled()`` (``--enable-symm-mem``) where SGLang's allocator module is
    loaded; True where that module is loaded but does not answer."""
    allocator = sys.modules.get(PYNCCL_ALLOCATOR_MODULE)
    if allocator is None:  # SGLang's mhc file imports it: not loaded, not in use
        return False
    try:
        return bool(allocator.is_symmetric_memory_enabled())
    except Exception:  # noqa: BLE001 - renamed or failing: not known to be off
        return True


def _rejected(op: str, error: Exception) -> Any:
    if op not in _warned:
        _warned.add(op)
        logger.warning("dsv4spec: SGLang %s: dsv4spec's op rejected the inputs (%s); SGLang's "
                       "own %s runs for such inputs", op, error, op)
    return STEP_ASIDE


def fast_mhc_pre(
    residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
    sinkhorn_repeat: int, n_splits: int = 1, n_splits_pre: int = 32, *,
    norm_weight: torch.Tensor | None = None, norm_eps: float | None = None,
) -> Any:
    """Fast path for SGLang's ``mhc_pre``: ``(post_mix [T, 4, 1] f32, comb_mix [T, 4, 4] f32,
    layer_input [T, H] bf16)`` from dsv4spec's :func:`~dsv4spec.ops.mhc_pre`, or STEP_ASIDE.

    ``n_splits`` and ``n_splits_pre`` only tile SGLang's GEMM; SGLang asserts ``n_splits == 1``
    where DeepGEMM is absent, so any other value steps aside and meets SGLang's own checks.
    """
    if not streams_ok(residual) or n_splits != 1 or sglang_symmetric_memory():
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
    try:
        return _run("mhc_pre", residual, key, launch)
    except (ValueError, TypeError) as e:  # raised by the op's input checks, before any launch
        return _rejected("mhc_pre", e)


def fast_mhc_post(
    x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
) -> Any:
    """Fast path for SGLang's ``mhc_post``: ``[T, 4, H]`` bf16 from dsv4spec's
    :func:`~dsv4spec.ops.mhc_post` (``post_layer_mix`` ``[T, 4, 1]`` or ``[T, 4]``, as SGLang
    takes it), or STEP_ASIDE."""
    if not streams_ok(residual) or not post_shapes_ok(x, residual, post_layer_mix, comb_res_mix):
        return STEP_ASIDE
    T = residual.shape[0]
    post = post_layer_mix.view(T, HC)

    def launch():
        return mhc_post(x, residual, post, comb_res_mix, impl="triton")

    try:
        return _run("mhc_post", residual, tuple(residual.shape), launch)
    except (ValueError, TypeError) as e:
        return _rejected("mhc_post", e)


def fast_mhc_fused_post_pre(
    x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
    sinkhorn_repeat: int, n_splits: int = 1, tile_n: int = 1, *,
    norm_weight: torch.Tensor | None = None, norm_eps: float | None = None,
) -> Any:
    """Fast path for SGLang's ``mhc_fused_post_pre``: ``(residual_cur [T, 4, H] bf16,
    post_mix_cur [T, 4, 1] f32, comb_mix_cur [T, 4, 4] f32, layer_input_cur [T, H] bf16)`` from
    dsv4spec's :func:`~dsv4spec.ops.mhc_post_pre`, or STEP_ASIDE.

    ``n_splits`` and ``tile_n`` only tile SGLang's kernels (it overrides both from the token
    count); they do not change the result and are ignored.
    """
    if (not streams_ok(residual) or not post_shapes_ok(x, residual, post_layer_mix, comb_res_mix)
            or sglang_symmetric_memory()):
        return STEP_ASIDE
    kwargs = pre_kwargs(rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                        sinkhorn_repeat, norm_weight, norm_eps, residual.shape[2])
    if kwargs is None:
        return STEP_ASIDE
    T = residual.shape[0]
    post_in = post_layer_mix.view(T, HC)

    def launch():
        new, post, comb, layer_input = mhc_post_pre(x, residual, post_in, comb_res_mix, fn,
                                                    hc_scale, hc_base, impl="triton", **kwargs)
        return new, post.unsqueeze(-1), comb, layer_input

    key = (*residual.shape, sinkhorn_repeat, norm_weight is None)
    try:
        return _run("mhc_fused_post_pre", residual, key, launch)
    except (ValueError, TypeError) as e:
        return _rejected("mhc_fused_post_pre", e)


def _forget_cached_mhc_ops() -> None:
    """Empty ``get_mhc_ops``'s cache if DeepSeek-V4 already filled it (a forward before the
    plugin loaded), so that its next call reads the hooked ``mhc_fused_post_pre``."""
    model = sys.modules.get("sglang.srt.models.deepseek_v4")
    get_mhc_ops = getattr(model, "get_mhc_ops", None)
    cache_clear = getattr(get_mhc_ops, "cache_clear", None)
    try:
        if cache_clear is not None and get_mhc_ops.cache_info().currsize:
            cache_clear()
    except Exception as e:  # noqa: BLE001 - never fatal: at worst the boundary keeps SGLang's
        logger.warning("dsv4spec: could not reset SGLang's get_mhc_ops cache (%s: %s); the "
                       "mhc_fused_post_pre hook may not reach DeepSeek-V4's boundary",
                       type(e).__name__, e)


class _WarmsOriginal(GuardedHook):
    """A GuardedHook that, after an eager call ours served for a shape the graph table gives to
    SGLang, runs SGLang's function once with the same arguments (result dropped): its kernels
    compile here, not inside SGLang's first capture of that shape. Outside the guard: an
    exception from SGLang's own function is SGLang's and propagates."""

    def __call__(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        global _warm_pending
        _warm_pending = None
        result = super().__call__(original, *args, **kwargs)
        key, _warm_pending = _warm_pending, None
        if key is not None:
            original(*args, **kwargs)
            _original_warmed.add(key)
        return result


def make_mhc_pre_hook(module: Any = None) -> GuardedHook:
    return _WarmsOriginal("mHC mhc_pre", only_for_dsv4(fast_mhc_pre), logger, "SGLang")


def make_mhc_post_hook(module: Any = None) -> GuardedHook:
    return _WarmsOriginal("mHC mhc_post", only_for_dsv4(fast_mhc_post), logger, "SGLang")


def make_mhc_fused_post_pre_hook(module: Any = None) -> GuardedHook:
    _forget_cached_mhc_ops()
    return _WarmsOriginal("mHC mhc_fused_post_pre", only_for_dsv4(fast_mhc_fused_post_pre),
                          logger, "SGLang")


# How each hook here decides, for reports (dsv4spec doctor): its table and prefers_dsv4spec, with
# SGLang's DeepGEMM pre-norm off and on (only SGLang knows which).
_DETERMINISTIC = "SGLang's deterministic inference or batch-invariant mode"
GATES: dict[str, Gate] = {
    f"mHC {op}": Gate(ops=(ours,), table=TABLES[op], deepgemm_table=DEEPGEMM_TABLES.get(op),
                      prefers=functools.partial(prefers_dsv4spec, op),
                      cases=deep_gemm_cases(DEEP_GEMM_FROM_TOKENS[op]),
                      note=f"not under {_DETERMINISTIC}" + (
                          "" if op == "mhc_post" else " or symmetric memory (--enable-symm-mem)"))
    for op, ours in (("mhc_pre", "mhc_pre"), ("mhc_post", "mhc_post"),
                     ("mhc_fused_post_pre", "mhc_post_pre"))}
