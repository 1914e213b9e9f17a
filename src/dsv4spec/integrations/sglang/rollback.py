"""AROUND hook on ``DeepSeekV4TokenToKVPool.clear_unaccepted_c128_draft_states``: one launch.

SGLang launches its per-layer cleanup kernel once per C128 state (31 launches per step on
DSV4-Pro, eagerly after acceptance). The hook keeps the original's contract and early returns and
replaces the loop with one :class:`~dsv4spec.ops.C128DraftCleanup` launch over the same buffers,
built lazily and cached on the KV pool object. Wherever the fused path cannot apply, the original
runs unchanged; :class:`~dsv4spec.integrations.hooks.GuardedHook` turns the hook off for good if
the fused path ever raises.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import torch

from dsv4spec.capture import stream_capturing
from dsv4spec.integrations import tables
from dsv4spec.integrations.hooks import STEP_ASIDE, Gate, GuardedHook, gpu_architecture
from dsv4spec.integrations.sglang.served_model import only_for_dsv4
from dsv4spec.kernels import on_rocm, triton_runs_on
from dsv4spec.ops import C128DraftCleanup

logger = logging.getLogger("dsv4spec.integrations.sglang")

CACHE_ATTR = "_dsv4spec_c128_cleanup"
# Grid sized for up to 16 drafts by default: num_draft_tokens is fixed per server (4 for DSV4).
MIN_MAX_DRAFT_TOKENS = 16


class RollbackPlan:
    """What the hook does for one KV pool and one set of C128 buffers.

    ``ptrs`` are the base addresses of the C128 states (``pool.kv_score_buffer.kv_score`` of every
    ratio-128 pool, in order) the plan was made for; ``cleanup`` is the fused helper over them, or
    ``None`` when the fused path cannot apply (``reason`` says why) and the original runs.
    """

    __slots__ = ("ptrs", "cleanup", "reason")

    def __init__(self, ptrs: list[int], cleanup: C128DraftCleanup | None, reason: str = ""):
        self.ptrs = ptrs
        self.cleanup = cleanup
        self.reason = reason


def _capturing(device: torch.device) -> bool:
    return stream_capturing(device)


def _plan(kv_pool: Any, ptrs: list[int], num_draft_tokens: int,
          old: RollbackPlan | None) -> RollbackPlan | None:
    """A new plan for the current buffers; ``None`` (nothing cached) while a capture runs."""
    pools = [p for p in kv_pool.compress_state_pools if p is not None and p.ratio == 128]
    if not pools:
        return RollbackPlan(ptrs, None, "no C128 state pools")
    rings = sorted({p.ring_size for p in pools})
    if len(rings) > 1:
        return RollbackPlan(ptrs, None, f"C128 pools mix ring sizes {rings}")
    states = [p.kv_score_buffer.kv_score for p in pools]
    device = states[0].device
    if not triton_runs_on(device):
        return RollbackPlan(ptrs, None, f"Triton cannot run on {device}")
    if on_rocm():
        return RollbackPlan(ptrs, None, "ROCm: the fused kernel is measured on NVIDIA GPUs only")
    if not tables.stack_validated(gpu_architecture(device.index if device.type == "cuda"
                                                   else -1)):
        return RollbackPlan(ptrs, None, f"no table validates Triton {tables.running_stack()} "
                                        "on this GPU")
    if _capturing(device):  # building uploads a pointer table: not inside a CUDA graph
        return None
    max_draft = max(MIN_MAX_DRAFT_TOKENS, num_draft_tokens)
    try:
        cleanup = old.cleanup if old is not None else None
        if (cleanup is not None and cleanup.ring_size == rings[0]
                and cleanup.max_num_draft_tokens >= max_draft):
            cleanup.refresh(states)  # the same object, rebuilt over the current buffers
        else:
            cleanup = C128DraftCleanup(states, ring_size=rings[0], max_num_draft_tokens=max_draft)
    except ValueError as e:
        return RollbackPlan(ptrs, None, str(e))
    return RollbackPlan(ptrs, cleanup)


def make_rollback_hook(pool_module: ModuleType) -> GuardedHook:
    """The AROUND hook for ``clear_unaccepted_c128_draft_states`` of ``pool_module``'s pool.

    Parameters
    ----------
    pool_module : module
        ``sglang.srt.mem_cache.deepseek_v4_memory_pool``: its ``ONLINE_C128`` global is read at
        call time, as the original reads it.

    Returns
    -------
    GuardedHook
        ``hook(original, self, req_pool_indices, seq_lens, accept_lens, num_draft_tokens)``.
    """
    if not isinstance(getattr(pool_module, "ONLINE_C128", None), bool):
        raise AttributeError(f"{pool_module.__name__} has no bool ONLINE_C128")

    def clear_unaccepted_c128_draft_states(
        self: Any, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        accept_lens: torch.Tensor, num_draft_tokens: int,
    ) -> Any:
        if pool_module.ONLINE_C128 or num_draft_tokens <= 1 or req_pool_indices.numel() == 0:
            return None  # the original's early returns
        if torch.compiler.is_compiling():
            return STEP_ASIDE  # the helper's host-side planning is not traceable
        # The fingerprint: the base addresses of the current C128 buffers. It changes when a
        # pool or buffer is replaced (the plan holds the old tensors, so a new one lives
        # elsewhere) and when a held buffer is reallocated (what is_stale() reports), i.e.
        # exactly when the helper's pointer table no longer addresses the pool's buffers.
        ptrs = [p.kv_score_buffer.kv_score.data_ptr()
                for p in self.compress_state_pools if p is not None and p.ratio == 128]
        plan = getattr(self, CACHE_ATTR, None)
        if plan is None or plan.ptrs != ptrs or (
                plan.cleanup is not None and num_draft_tokens > plan.cleanup.max_num_draft_tokens):
            plan = _plan(self, ptrs, num_draft_tokens, plan)
            if plan is None:
                return STEP_ASIDE
            setattr(self, CACHE_ATTR, plan)
            if plan.cleanup is not None:  # every batch size compiled now, not mid-request
                plan.cleanup.precompile(num_draft_tokens, (
                    req_pool_indices.dtype, seq_lens.dtype, accept_lens.dtype))
            if plan.cleanup is None:
                logger.warning("dsv4spec: C128 rollback: SGLang's per-layer loop runs for %s: %s",
                               type(self).__name__, plan.reason)
        if plan.cleanup is None:
            return STEP_ASIDE
        try:
            plan.cleanup.clear(req_pool_indices, seq_lens, accept_lens,
                               num_draft_tokens=num_draft_tokens)
        except (ValueError, TypeError) as e:  # raised by the input checks, before any launch
            if plan.reason != str(e):
                plan.reason = str(e)
                logger.warning("dsv4spec: C128 rollback: fused path rejected the inputs (%s); "
                               "SGLang's per-layer loop runs for such inputs", e)
            return STEP_ASIDE
        return None

    return GuardedHook("C128 rollback", only_for_dsv4(clear_unaccepted_c128_draft_states), logger,
                       "SGLang")


# How the hook decides, for reports (dsv4spec doctor): no table of its own, every call where a
# table of the running Triton's stack serves the GPU (see _plan).
GATES: dict[str, Gate] = {
    "C128 rollback": Gate(ops=("C128DraftCleanup",), stack_gated=True,
                          note="every call: one launch for every C128 state"),
}
