"""AROUND hooks on the drafts' and the target's ``hc_head``.

The MTP draft's (``DeepseekV4ModelNextN.hc_head``) is an eager ATen chain of ~15 kernels: ours
replaces it on the GPU architectures it was measured on. DSpark's
(``DeepseekV4ForCausalLMDSpark.collapse_hc_head``, SGLang's ``hc_head_torch``) is the same chain
over the draft block's ``bs * N`` rows: ours replaces it where the measured tables say so (its
own "dspark_hc_head" rows, per architecture, mode, width and row count). The target's
(``DeepseekV4Model.hc_head``) is already SGLang's own fused Triton kernel (``fused_hc_head``): ours
replaces it only where it measured faster, per architecture, mode and width.

All step aside (SGLang's path runs) for a served model other than DeepSeek-V4
(:mod:`~dsv4spec.integrations.sglang.served_model`), on ROCm, on GPU architectures absent from the
measured tables, under a Triton release no table of this GPU was measured with, under
``torch.compile``, and when SGLang's deterministic inference or
batch-invariant mode is on: our tiling depends on the token count, so a token's result could depend
on the batch it came in.

All compile every kernel variant they can need when they first see a (device, width, dtype):
SGLang's warm-up passes run before its CUDA-graph capture, so nothing compiles inside a capture or
while serving. Token counts beyond what was compiled (and a first sight inside a capture) take
SGLang's path.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations.hc_head import precompile_hc_head
from dsv4spec.integrations.hooks import (
    INTERPRETER_ARCHITECTURE,
    STEP_ASIDE,
    FasterTable,
    Gate,
    GuardedHook,
    gpu_architecture,
    measured_faster,
)
from dsv4spec.integrations.sglang.served_model import only_for_dsv4, published_arguments
from dsv4spec.integrations.tables import faster_table, stack_validated
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.kernels.hc_head import HC
from dsv4spec.kernels.hc_head_precompile import PRECOMPILE_MAX_TOKENS
from dsv4spec.ops import hc_head

logger = logging.getLogger("dsv4spec.integrations.sglang")

# Where dsv4spec's hc_head beat SGLang's fused_hc_head, per GPU architecture (compute capability),
# mode ("graph": device time inside a CUDA graph; "eager": host wall time per back-to-back eager
# call, both measured side by side) and hidden size: inclusive token ranges, read from the
# measured-faster tables (dsv4spec.integrations.tables: the GPU's file). The H200's source:
# benchmarks/results/hc_head/hc_head_tensor_cores.md (H200, 2026-11-29, provider "sglang": SGLang /
# ours
# 3.7-14.1x in a graph, 1.2-3.9x eager), T in {1, 4, 16, 64, 256, 1024, 4096}. Anything else
# (other architectures and widths, T > 4096) keeps SGLang's path.
TARGET_HC_HEAD_FASTER: FasterTable = faster_table("sglang", "target_hc_head")
# Architectures where the draft hook's kernel was measured against the draft's eager chain
# (results/hc_head/hc_head_tensor_cores.md, provider "eager").
DRAFT_HC_HEAD_MEASURED: tuple[tuple[int, int], ...] = ((9, 0),)
# Where dsv4spec's hc_head beat SGLang's own ``hc_head_torch`` (loaded from SGLang's source) at
# DSpark's draft shapes, T = bs * N rows (``dsv4spec tune``'s "dspark_hc_head" points, N = 7,
# bs 1-64), per architecture, mode and width; elsewhere DSpark's chain runs.
DSPARK_HC_HEAD_FASTER: FasterTable = faster_table("sglang", "dspark_hc_head")

_warned: set[str] = set()
_ready: dict[tuple, tuple[int, int] | None] = {}
_deterministic: bool | None = None
# the published server arguments _deterministic was read under (a new publish reads it again)
_deterministic_for: object | None = None


def target_prefers_dsv4spec(num_tokens: int, hidden_size: int, in_graph: bool,
                            architecture: tuple[int, int] = INTERPRETER_ARCHITECTURE) -> bool:
    """Whether the target's hc_head should run dsv4spec's kernel rather than SGLang's.

    Parameters
    ----------
    num_tokens : int
        ``T``, rows of ``x [T, hc_mult, hidden_size]``.
    hidden_size : int
        ``H``.
    in_graph : bool
        Whether the call is being captured into a CUDA graph (device time is what counts) or
        runs eagerly (host time included).
    architecture : (int, int)
        The GPU's compute capability.

    Returns
    -------
    bool
        True iff ``num_tokens`` is at most ``PRECOMPILE_MAX_TOKENS`` (the counts compiled before
        capture) and lies in one of the measured winning ranges of
        :data:`TARGET_HC_HEAD_FASTER` for that architecture, mode and ``hidden_size``.
    """
    return num_tokens <= PRECOMPILE_MAX_TOKENS and measured_faster(
        TARGET_HC_HEAD_FASTER, architecture, hidden_size, num_tokens, in_graph)


def draft_prefers_dsv4spec(num_tokens: int,
                           architecture: tuple[int, int] | None = INTERPRETER_ARCHITECTURE) -> bool:
    """Whether a draft's unfused hc_head chain (the MTP draft's ``hc_head``, DSpark's
    ``hc_head_torch``) should run dsv4spec's kernel: on an architecture where it was measured
    against that chain (:data:`DRAFT_HC_HEAD_MEASURED`), at ``1 <= num_tokens <=
    PRECOMPILE_MAX_TOKENS``, in a graph or eagerly, at any width. The hooks also need a table of
    the running Triton's stack for the GPU (:func:`~dsv4spec.integrations.tables.
    stack_validated`), decided once per device."""
    return architecture in DRAFT_HC_HEAD_MEASURED and 0 < num_tokens <= PRECOMPILE_MAX_TOKENS


def dspark_prefers_dsv4spec(num_tokens: int, hidden_size: int, in_graph: bool,
                            architecture: tuple[int, int] = INTERPRETER_ARCHITECTURE) -> bool:
    """Whether DSpark's draft hc_head (``collapse_hc_head``) should run dsv4spec's kernel rather
    than SGLang's ``hc_head_torch``: ``num_tokens`` lies in a measured winning range of
    :data:`DSPARK_HC_HEAD_FASTER` for that architecture, mode and ``hidden_size``."""
    return measured_faster(DSPARK_HC_HEAD_FASTER, architecture, hidden_size, num_tokens,
                           in_graph)


def _architecture(x: torch.Tensor) -> tuple[int, int] | None:
    return gpu_architecture(x.get_device())


def sglang_deterministic() -> bool:
    """Whether SGLang runs in deterministic inference or batch-invariant mode.

    Read from the SGLang modules already loaded (nothing is imported); remembered for the server
    arguments SGLang has published (both are fixed when an engine starts; an engine rebuilt in
    the same process publishes new arguments, and the verdict is read again for them).
    """
    global _deterministic, _deterministic_for
    published = published_arguments()
    if _deterministic is not None and _deterministic_for is published:
        return _deterministic
    invariant = sys.modules.get("sglang.srt.batch_invariant_ops")
    if invariant is not None and invariant.is_batch_invariant_mode_enabled():
        return True
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is None:
        return False
    try:
        verdict = bool(context.get_exec().deterministic.enable_deterministic_inference)
    except (ValueError, AttributeError):  # not published yet: ask again next call
        return False
    _deterministic, _deterministic_for = verdict, published
    return verdict


def _prepared(x: torch.Tensor) -> tuple[int, int] | None:
    """``x``'s GPU architecture where the hooks may run dsv4spec's kernels on ``x``'s device,
    width and dtype, with every variant ``T = 1..PRECOMPILE_MAX_TOKENS`` needs compiled (the
    hooks share them); None where they step aside. Decided once per (device, width, dtype), at
    the first call outside a CUDA-graph capture (a first call inside one steps aside undecided)."""
    index = x.get_device()
    key = (index, x.shape[2], x.dtype)
    if key in _ready:
        return _ready[key]
    if on_rocm() or not triton_runs_on(x.device):
        _ready[key] = None
        return None
    architecture = _architecture(x)
    if not stack_validated(architecture):  # a Triton no table was measured under
        _ready[key] = None
        return None
    if index >= 0:
        if stream_capturing(index):
            return None
        precompile_hc_head(x.shape[2], x.dtype, index, logger)
    _ready[key] = architecture
    return _ready[key]


def _capturing(x: torch.Tensor) -> bool:
    return stream_capturing(x.get_device())


def _rejected(which: str, error: Exception) -> Any:
    if which not in _warned:
        _warned.add(which)
        logger.warning("dsv4spec: %s hc_head: dsv4spec's op rejected the inputs (%s); SGLang's "
                       "own hc_head runs for such inputs", which, error)
    return STEP_ASIDE


def _eager_chain_replaced(
    which: str, x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
    hc_base: torch.Tensor, norm_eps: float, hc_eps: float,
    prefers: Callable[[int, int, bool, tuple[int, int]], bool] | None = None,
) -> Any:
    """dsv4spec's fused hc_head in place of SGLang's unfused ATen chain (the MTP draft's
    ``hc_head``, DSpark's ``hc_head_torch``), or :data:`STEP_ASIDE`. Without ``prefers`` the
    architectures of :data:`DRAFT_HC_HEAD_MEASURED` run ours at every size; with it, where
    ``prefers(T, H, in_graph, architecture)`` says so."""
    # torch.compile (SGLang's --enable-torch-compile) traces SGLang's own path: the fast path's
    # host-side decisions are not traceable.
    if (torch.compiler.is_compiling() or x.dim() != 3 or x.shape[1] != HC
            or not 0 < x.shape[0] <= PRECOMPILE_MAX_TOKENS):
        return STEP_ASIDE
    architecture = _prepared(x)
    if architecture is None or sglang_deterministic():
        return STEP_ASIDE
    if prefers is None:
        if not draft_prefers_dsv4spec(x.shape[0], architecture):
            return STEP_ASIDE
    elif not prefers(x.shape[0], x.shape[2], _capturing(x), architecture):
        return STEP_ASIDE
    try:
        return hc_head(x.contiguous(), hc_fn, hc_scale, hc_base,
                       norm_eps=norm_eps, hc_eps=hc_eps, impl="triton")
    except (ValueError, TypeError) as e:  # raised by the input checks, before any work
        return _rejected(which, e)


def draft_hc_head(
    self: Any, x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
) -> Any:
    """Fast path for ``DeepseekV4ModelNextN.hc_head``: dsv4spec's fused hc_head.

    Uses the module's ``rms_norm_eps`` and ``hc_eps``; steps aside for inputs or devices it does
    not cover (see the module docstring).
    """
    return _eager_chain_replaced("draft", x, hc_fn, hc_scale, hc_base,
                                 self.rms_norm_eps, self.hc_eps)


def dspark_hc_head(self: Any, x: torch.Tensor) -> Any:
    """Fast path for ``DeepseekV4ForCausalLMDSpark.collapse_hc_head``: dsv4spec's fused hc_head
    in place of SGLang's ``hc_head_torch``, with the last stage's ``hc_head_*`` weights and the
    model's ``norm_eps`` and ``hc_eps`` (the config's ``rms_norm_eps`` and ``hc_eps``).

    ``x`` is the draft block's residual streams ``[bs * N, hc_mult, H]`` (N draft rows per
    request). DSV4.1's DSpark (``hc_pre_from_prev_sublayer``: ``forward`` has collapsed the
    streams already) steps aside. Ours runs where :func:`dspark_prefers_dsv4spec` says so for
    the call's size and mode (the measured tables), T capped at ``PRECOMPILE_MAX_TOKENS``, the
    range compiled before capture.
    """
    if self.hc_pre_from_prev_sublayer:
        return STEP_ASIDE
    last = self.stages[-1]
    return _eager_chain_replaced("DSpark draft", x, last.hc_head_fn, last.hc_head_scale,
                                 last.hc_head_base, self.norm_eps, self.hc_eps,
                                 prefers=dspark_prefers_dsv4spec)


def target_hc_head(
    self: Any, x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
) -> Any:
    """Fast path for ``DeepseekV4Model.hc_head``: dsv4spec's kernel where it measured faster.

    Uses the module's ``norm_eps`` and ``hc_eps``. Steps aside (SGLang's ``fused_hc_head``, or
    its torch path for empty input) unless ``x`` is ``[T, 4, H]`` on a device it covers and
    :func:`target_prefers_dsv4spec` says so for this architecture and mode.
    """
    if torch.compiler.is_compiling() or x.dim() != 3 or x.shape[1] != HC:
        return STEP_ASIDE
    architecture = _prepared(x)  # first: compiles on an eager call even where SGLang's path wins
    if (architecture is None or sglang_deterministic()
            or not target_prefers_dsv4spec(x.shape[0], x.shape[2], _capturing(x), architecture)):
        return STEP_ASIDE
    try:
        return hc_head(x.contiguous(), hc_fn, hc_scale, hc_base,
                       norm_eps=self.norm_eps, hc_eps=self.hc_eps, impl="triton")
    except (ValueError, TypeError) as e:
        return _rejected("target", e)


def make_draft_hook(module: Any = None) -> GuardedHook:
    return GuardedHook("draft hc_head", only_for_dsv4(draft_hc_head), logger, "SGLang")


def make_dspark_hook(module: Any = None) -> GuardedHook:
    return GuardedHook("DSpark draft hc_head", only_for_dsv4(dspark_hc_head), logger, "SGLang")


def make_target_hook(module: Any = None) -> GuardedHook:
    return GuardedHook("target hc_head", only_for_dsv4(target_hc_head), logger, "SGLang")


def _draft_gate(count: int, key: Any, in_graph: bool,
                architecture: tuple[int, int] | None) -> bool:
    """:func:`draft_prefers_dsv4spec` asked as a Gate asks (every width, both modes)."""
    return draft_prefers_dsv4spec(count, architecture)


# How each hook here decides, for reports (dsv4spec doctor): the MTP draft's architecture gate,
# the DSpark draft's and the target's tables.
GATES: dict[str, Gate] = {
    "draft hc_head": Gate(ops=("hc_head",), prefers=_draft_gate,
                          max_count=PRECOMPILE_MAX_TOKENS, stack_gated=True),
    "DSpark draft hc_head": Gate(ops=("hc_head",), table=DSPARK_HC_HEAD_FASTER,
                                 prefers=dspark_prefers_dsv4spec,
                                 max_count=PRECOMPILE_MAX_TOKENS, stack_gated=True,
                                 note="not DSV4.1's DSpark (hc_pre_from_prev_sublayer)"),
    "target hc_head": Gate(ops=("hc_head",), table=TARGET_HC_HEAD_FASTER,
                           prefers=target_prefers_dsv4spec, stack_gated=True),
}
