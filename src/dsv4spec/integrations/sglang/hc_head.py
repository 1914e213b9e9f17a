"""AROUND hooks on the draft's and the target's ``hc_head`` (SPEC §3).

The draft's (``DeepseekV4ModelNextN.hc_head``) is an eager ATen chain of ~15 kernels: ours
replaces it everywhere Triton runs. The target's (``DeepseekV4Model.hc_head``) is already SGLang's
own fused Triton kernel (``fused_hc_head``): ours replaces it only where it measured faster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from dsv4spec.kernels import triton_runs_on
from dsv4spec.kernels.hc_head import HC
from dsv4spec.ops import hc_head

logger = logging.getLogger("dsv4spec.integrations.sglang")

# Where dsv4spec's hc_head beat SGLang's fused_hc_head on one H200, per mode ("graph": device time
# inside a CUDA graph; "eager": host wall time per back-to-back eager call, both measured side by
# side) and hidden size: inclusive token ranges whose measured points all won. Source:
# benchmarks/results/hc_head_tensor_cores.md (2026-11-29, provider "sglang": SGLang / ours
# 3.7-14.1x in a graph, 1.2-3.9x eager; before it hc_head.md, 2.85-12.9x and 1.30-3.0x), T in
# {1, 4, 16, 64, 256, 1024, 4096}. Anything else (other widths, T > 4096) keeps SGLang's path.
TARGET_HC_HEAD_FASTER: dict[str, dict[int, tuple[tuple[int, int], ...]]] = {
    "graph": {4096: ((1, 4096),), 7168: ((1, 4096),)},
    "eager": {4096: ((1, 4096),), 7168: ((1, 4096),)},
}

_warned: set[str] = set()


def target_prefers_dsv4spec(num_tokens: int, hidden_size: int, in_graph: bool) -> bool:
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

    Returns
    -------
    bool
        True iff ``num_tokens`` lies in one of the measured winning ranges of
        :data:`TARGET_HC_HEAD_FASTER` for that mode and ``hidden_size``.
    """
    spans = TARGET_HC_HEAD_FASTER["graph" if in_graph else "eager"].get(hidden_size, ())
    return any(lo <= num_tokens <= hi for lo, hi in spans)


def _capturing(x: torch.Tensor) -> bool:
    if not x.is_cuda:
        return False
    return torch._C._cuda_isCurrentStreamCapturing()


def _fallback(which: str, error: Exception) -> None:
    if which not in _warned:
        _warned.add(which)
        logger.warning("%s hc_head: dsv4spec's op rejected the inputs (%s); SGLang's own "
                       "hc_head runs for such inputs", which, error)


def draft_hc_head(
    original: Callable[..., torch.Tensor], self: Any, x: torch.Tensor, hc_fn: torch.Tensor,
    hc_scale: torch.Tensor, hc_base: torch.Tensor,
) -> torch.Tensor:
    """AROUND hook for ``DeepseekV4ModelNextN.hc_head``: dsv4spec's fused hc_head.

    Uses the module's ``rms_norm_eps`` and ``hc_eps``; runs the original where Triton cannot run
    on ``x``'s device, or when dsv4spec's op rejects the inputs.
    """
    if not triton_runs_on(x.device):
        return original(self, x, hc_fn, hc_scale, hc_base)
    try:
        return hc_head(x.contiguous(), hc_fn, hc_scale, hc_base,
                       norm_eps=self.rms_norm_eps, hc_eps=self.hc_eps)
    except (ValueError, TypeError) as e:  # raised by the input checks, before any work
        _fallback("draft", e)
        return original(self, x, hc_fn, hc_scale, hc_base)


def target_hc_head(
    original: Callable[..., torch.Tensor], self: Any, x: torch.Tensor, hc_fn: torch.Tensor,
    hc_scale: torch.Tensor, hc_base: torch.Tensor,
) -> torch.Tensor:
    """AROUND hook for ``DeepseekV4Model.hc_head``: dsv4spec's kernel where it measured faster.

    Uses the module's ``norm_eps`` and ``hc_eps``. Runs the original (SGLang's ``fused_hc_head``,
    or its torch path for empty input) unless ``x`` is ``[T, 4, H]`` on a device Triton runs on
    and :func:`target_prefers_dsv4spec` says so for this mode (graph capture or eager).
    """
    if (x.dim() != 3 or x.shape[1] != HC or not triton_runs_on(x.device)
            or not target_prefers_dsv4spec(x.shape[0], x.shape[2], _capturing(x))):
        return original(self, x, hc_fn, hc_scale, hc_base)
    try:
        return hc_head(x.contiguous(), hc_fn, hc_scale, hc_base,
                       norm_eps=self.norm_eps, hc_eps=self.hc_eps, impl="triton")
    except (ValueError, TypeError) as e:
        _fallback("target", e)
        return original(self, x, hc_fn, hc_scale, hc_base)


draft_hc_head._dsv4spec_hook = True
target_hc_head._dsv4spec_hook = True
