"""Fast path for vLLM 0.33.0's ``hc_head_fused_kernel_tilelang``: dsv4spec's fused hc_head.

vLLM's DeepSeek-V4 calls it at three sites (the target's last rank, the MTP draft's
``compute_logits``, the DSpark draft) and follows the first two with an RMSNorm: the target's
``self.norm`` module, the draft's ``_MTP_SHARED_HEAD_RMSNORM_KERNEL``. dsv4spec's
``hc_head_rmsnorm`` would fuse the pair, but in vLLM the two are consecutive statements of the
model's ``forward`` / ``compute_logits``, with no function of vLLM's between them to hook: the
hc_head call does not receive the norm's weight, and skipping the norm would mean replacing
vLLM's model code. So the hook replaces hc_head alone and vLLM's RMSNorm runs after it.

The hook compiles every kernel variant ``T = 1..PRECOMPILE_MAX_TOKENS`` needs when it first sees
a (device, width, dtype) outside a capture (vLLM's warm-up runs eagerly before its CUDA-graph
capture), where the table serves this architecture and width and vLLM's batch-invariant mode is
off (nowhere else does it launch them), and steps aside where
:mod:`~dsv4spec.integrations.vllm.mhc`'s rules say so.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations.hc_head import precompile_hc_head
from dsv4spec.integrations.hooks import STEP_ASIDE, Gate, gpu_architecture
from dsv4spec.integrations.vllm.mhc import (
    HC,
    prefers_dsv4spec,
    rejected,
    table_spans,
    vllm_batch_invariant,
)
from dsv4spec.integrations.vllm.tables import TABLES
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.kernels.hc_head_precompile import PRECOMPILE_MAX_TOKENS
from dsv4spec.ops import hc_head

logger = logging.getLogger("dsv4spec.integrations.vllm")

_ready: dict[tuple, tuple[int, int] | None] = {}


def _prepared(x: torch.Tensor) -> tuple[int, int] | None:
    """``x``'s GPU architecture where the hook may run dsv4spec's kernel on ``x``'s device,
    width and dtype, with every variant up to PRECOMPILE_MAX_TOKENS compiled; None where it steps
    aside. Decided once per (device, width, dtype), at the first call outside a capture; the
    kernels are compiled only where the table serves some count at this architecture and width
    (elsewhere the hook never launches them)."""
    index = x.get_device()
    key = (index, x.shape[2], x.dtype)
    if key in _ready:
        return _ready[key]
    if on_rocm() or not triton_runs_on(x.device):
        _ready[key] = None
        return None
    if index >= 0 and stream_capturing(index):
        return None
    architecture = gpu_architecture(index)
    if not table_spans("hc_head", architecture, x.shape[2]):
        _ready[key] = None
        return None
    if index >= 0:
        precompile_hc_head(x.shape[2], x.dtype, index, logger)
    _ready[key] = architecture
    return architecture


def hc_head_prefers_dsv4spec(num_tokens: int, hidden_size: int, in_graph: bool,
                             architecture: tuple[int, int] | None) -> bool:
    """Whether vLLM's hc_head should run dsv4spec's kernel: at ``num_tokens`` up to
    ``PRECOMPILE_MAX_TOKENS`` (the counts compiled before capture) where the table prefers ours
    (:func:`~dsv4spec.integrations.vllm.mhc.prefers_dsv4spec`)."""
    return num_tokens <= PRECOMPILE_MAX_TOKENS and prefers_dsv4spec(
        "hc_head", num_tokens, hidden_size, in_graph, architecture)


def fast_hc_head(
    hs_flat: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
    rms_eps: float, hc_eps: float,
) -> Any:
    """Fast path for vLLM's ``hc_head_fused_kernel_tilelang``: ``[T, H]`` bf16 from dsv4spec's
    :func:`~dsv4spec.ops.hc_head` (the same formula: ``rms_eps`` is its ``norm_eps``), or
    STEP_ASIDE unless ``hs_flat`` is a contiguous bf16 ``[T, 4, H]`` with T > 0 on a device it
    covers and the measured table prefers ours for this architecture, mode and width."""
    x = hs_flat
    if (torch.compiler.is_compiling() or not isinstance(x, torch.Tensor) or x.dim() != 3
            or x.shape[1] != HC or x.dtype != torch.bfloat16 or not x.is_contiguous()
            or x.shape[0] == 0):
        return STEP_ASIDE
    if vllm_batch_invariant():
        return STEP_ASIDE
    architecture = _prepared(x)  # compiles on an eager call even where vLLM's path wins
    index = x.get_device()
    if (architecture is None
            or not hc_head_prefers_dsv4spec(x.shape[0], x.shape[2],
                                            index >= 0 and stream_capturing(index),
                                            architecture)):
        return STEP_ASIDE
    try:
        return hc_head(x, fn, hc_scale, hc_base, norm_eps=float(rms_eps), hc_eps=float(hc_eps),
                       impl="triton")
    except (ValueError, TypeError) as e:  # raised by the input checks, before any work
        return rejected("hc_head", e)


# How the hook decides, for reports (dsv4spec doctor): its table and hc_head_prefers_dsv4spec.
GATES: dict[str, Gate] = {
    "hc_head": Gate(ops=("hc_head",), table=TABLES["hc_head"], prefers=hc_head_prefers_dsv4spec,
                    note="not under VLLM_BATCH_INVARIANT or torch.compile"),
}
