"""Which op's launch planner each table-gated hook runs, and where along the hook's token counts
that plan changes: what a measured-faster range may not extend across.

A measured verdict holds for the tiling it was measured with. ``dsv4spec tune`` carries a
measured verdict only within its segment, up to the next switch (a count where the op's tiling
changes: :mod:`dsv4spec.ops.plan_scan`), and measures both sides of every switch; a
GPU whose SM count differs from the measured GPU's takes a table's ranges only below the first
count at which the planner launches another plan (tiling or split count) for it. Both are read
off the ops' planners here, so they follow the planners as they change. Hooks absent from
``HOOK_OPS`` (the metadata builders) run kernels of one fixed tiling at every count.

The engine's own kernel changes its tiling at counts of its own too (``ENGINE_TILING_SWITCHES``,
read off the engines' sources): a verdict measured on one side of such a count says as little
about the other. :func:`segment_switches` is both sets, what ``tune`` measures both sides of and
what a measured verdict is not carried across (:mod:`dsv4spec.bench.tune`).
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
# (engine, hook) -> the counts at which the engine's own kernel, as the tables measure it
# (TileLang, DeepGEMM off; on sm_90), runs another tiling than one count below, at both hidden
# sizes the tables hold (4096, 7168). SGLang 0.5.23, kernels/ops/layernorm/mhc.py: mhc_pre runs
# its split-k GEMM up to 2048 tokens; mhc_post splits the hidden size into blocks up to 256
# tokens; mhc_fused_post_pre's FMA kernel widens its tile from 8 tokens and hands over to the
# GEMM path above 32. vLLM 0.33.0/0.34.0, model_executor/kernels/mhc/tilelang_kernels.py: the
# pre-norm GEMM (mhc_pre, and the fused op above 32 tokens) takes a small tile below 128 tokens
# and two-row blocks from 1024; the fused kernel widens its tile from 16 tokens and hands over
# above 32. The hc_head kernels (SGLang's Triton one, vLLM's TileLang one), SGLang's draft
# hc_head (torch) and the metadata builders keep one tiling at every count.
ENGINE_TILING_SWITCHES = {
    ("sglang", "mhc_pre"): (2049,),
    ("sglang", "mhc_post"): (257,),
    ("sglang", "mhc_fused_post_pre"): (8, 33),
    ("vllm", "mhc_pre"): (128, 1024),
    ("vllm", "mhc_fused_post_pre"): (16, 33, 128, 1024),
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


def engine_tiling_switches(engine: str, hook: str, max_count: int) -> tuple[int, ...]:
    """The counts ``2..max_count`` at which the engine's own kernel for ``hook`` runs another
    tiling than one count below (``ENGINE_TILING_SWITCHES``); ``()`` where it keeps one."""
    return tuple(s for s in ENGINE_TILING_SWITCHES.get((engine, hook), ()) if s <= max_count)


# The mHC hooks whose engine op has a pre-norm GEMM, which DeepGEMM computes where the engine
# enables it; the GEMM's multiplier (hc) on the hidden size
GEMM_HOOKS = ("mhc_pre", "mhc_fused_post_pre")
HC_MULT = 4


def deepgemm_splits(hidden_size: int, num_tokens: int, num_sms: int) -> int:
    """The split-K count both engines launch DeepGEMM's ``tf32_hc_prenorm_gemm`` with (SGLang
    0.5.23's ``_compute_num_split_for_mhc_pre``, vLLM's ``compute_num_split(64, K, cdiv(T,
    64))``): the SMs over the 64-token row blocks, at most a quarter of the 64-wide K blocks."""
    row_blocks = -(-num_tokens // 64)
    k_blocks = -(-HC_MULT * hidden_size // 64)
    return max(1, min(num_sms // row_blocks, k_blocks // 4))


def deepgemm_switches(hidden_size: int, above: int, max_count: int,
                      num_sms: int | None = None) -> tuple[int, ...]:
    """The counts ``above + 2..max_count`` at which DeepGEMM's split count changes, for rows
    measured against DeepGEMM's GEMM above ``above`` tokens (its launch changes with it)."""
    sms = DEFAULT_SMS if num_sms is None else num_sms
    return tuple(c for c in range(above + 2, max_count + 1)
                 if deepgemm_splits(hidden_size, c, sms) != deepgemm_splits(hidden_size, c - 1,
                                                                             sms))


def segment_switches(engine: str, hook: str, hidden_size: int, max_count: int,
                     num_sms: int | None = None, triton_stack: str | None = None,
                     deepgemm_above: int | None = None) -> tuple[int, ...]:
    """Every count ``2..max_count`` at which either side's tiling changes: ours
    (:func:`tiling_switches`) and the engine's (:func:`engine_tiling_switches`; for rows measured
    against DeepGEMM's GEMM above ``deepgemm_above`` tokens, also the count after it and
    DeepGEMM's split changes, :func:`deepgemm_switches`). Between two of them both kernels keep
    their tilings: a *segment*, what a measured verdict may cover."""
    deep: tuple[int, ...] = ()
    if deepgemm_above is not None and hook in GEMM_HOOKS:
        deep = (*((deepgemm_above + 1,) if 1 < deepgemm_above + 1 <= max_count else ()),
                *deepgemm_switches(hidden_size, deepgemm_above, max_count, num_sms))
    return tuple(sorted({*tiling_switches(engine, hook, hidden_size, max_count, num_sms,
                                          triton_stack),
                         *engine_tiling_switches(engine, hook, max_count), *deep}))


def segments(switches: tuple[int, ...], top: int) -> list[tuple[int, int]]:
    """The inclusive count ranges ``1..top`` split at ``switches`` (each starts a range)."""
    starts = [1, *sorted(s for s in set(switches) if 1 < s <= top)]
    return [(lo, hi - 1) for lo, hi in zip(starts, starts[1:])] + [(starts[-1], top)]


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
