"""Which op's launch planner each table-gated hook runs, and where along the hook's token counts
that plan changes: what a measured-faster range may not extend across.

A measured verdict holds for the tiling it was measured with. ``dsv4spec tune`` extends a
winning point to the next measured one only up to the next planner switch (a count where the
op's tiling changes: :mod:`dsv4spec.ops.plan_scan`), and measures both sides of every switch; a
GPU whose SM count differs from the measured GPU's takes a table's ranges only below the first
count at which the planner launches another plan (tiling or split count) for it. Both are read
off the ops' planners here, so they follow the planners as they change. Hooks absent from
``HOOK_OPS`` (the metadata builders) run kernels of one fixed tiling at every count.
"""

from __future__ import annotations

from dsv4spec.kernels.device import num_sms as _device_sms
from dsv4spec.ops import mhc as mhc_ops
from dsv4spec.ops.hc_head import first_plan_difference as _hc_head_difference
from dsv4spec.ops.hc_head import tiling_switches as _hc_head_switches

# (engine, hook) -> the op whose planner it runs; its table's key is the hidden size
HOOK_OPS = {
    ("sglang", "mhc_pre"): "mhc_pre",
    ("sglang", "mhc_post"): "mhc_post",
    ("sglang", "mhc_fused_post_pre"): "mhc_post_pre",
    ("sglang", "target_hc_head"): "hc_head",
    ("sglang", "dspark_hc_head"): "hc_head",
    ("vllm", "hc_head"): "hc_head",
    ("vllm", "mhc_pre"): "mhc_pre",
    ("vllm", "mhc_post"): "mhc_post",
    ("vllm", "mhc_fused_post_pre"): "mhc_post_pre",
}
# The SM count planned for where none is given: the interpreter's, an H200's (132)
DEFAULT_SMS = _device_sms(-1)


def tiling_switches(engine: str, hook: str, hidden_size: int, max_count: int,
                    num_sms: int | None = None,
                    triton_stack: str | None = None) -> tuple[int, ...]:
    """The counts ``2..max_count`` at which ``engine``'s ``hook`` runs another tiling than one
    count below, at ``hidden_size`` on a GPU of ``num_sms`` SMs (default ``DEFAULT_SMS``) under
    the Triton stack ``triton_stack`` (``"3.8"``; default the imported Triton); ``()`` for a hook
    without a planner."""
    op = HOOK_OPS.get((engine, hook))
    sms = DEFAULT_SMS if num_sms is None else num_sms
    if op is None:
        return ()
    if op == "hc_head":
        return _hc_head_switches(hidden_size, max_count, sms)
    return mhc_ops.tiling_switches(op, hidden_size, max_count, sms, triton_version=triton_stack)


def first_plan_difference(engine: str, hook: str, hidden_size: int, max_count: int,
                          num_sms: int, other_num_sms: int,
                          triton_stack: str | None = None) -> int | None:
    """The smallest count up to ``max_count`` at which ``engine``'s ``hook`` launches another
    plan on a GPU of ``other_num_sms`` SMs than on one of ``num_sms``; None where there is none
    (always for a hook without a planner)."""
    op = HOOK_OPS.get((engine, hook))
    if op is None or num_sms == other_num_sms:
        return None
    if op == "hc_head":
        return _hc_head_difference(hidden_size, max_count, num_sms, other_num_sms)
    return mhc_ops.first_plan_difference(op, hidden_size, max_count, num_sms, other_num_sms,
                                         triton_version=triton_stack)
