"""Where dsv4spec's ops beat vLLM 0.33.0's TileLang kernels: the vLLM hooks' measured tables.

Same structure as the SGLang hooks' (:data:`dsv4spec.integrations.hooks.FasterTable`): per GPU
architecture, mode ("graph": device time inside a CUDA graph; "eager": host wall time per
back-to-back eager call) and hidden size, inclusive token ranges whose measured points all won.
A width, architecture or token count absent here keeps vLLM's kernel.

Sources (H200, TileLang 0.1.12 as vLLM pins it, vLLM's kernels loaded by path with DeepGEMM
off): the mHC rows from ``benchmarks/results/mhc/mhc.md`` and ``mhc_h4096.md`` (2026-12-01, the
second-generation kernels beside vLLM's: ours faster at every measured T, 1-4096 at H = 7168 and
1-256 at H = 4096, in a graph and eager; e.g. the boundary 6.37 vs 8.46 us at T = 1, 625 vs 1045
at 4096); hc_head at H = 7168 from an earlier held-out run (graph us vLLM / ours 8.08 / 3.78 at
T = 1 to 8.83 / 6.40 at 64) and at H = 4096 from ``bench vllm --quick`` through the hook
(``benchmarks/results/logs/bench_vllm_quick_partial.log``: 5.13 / 3.74 at T = 1, 5.57 / 6.15 at
64, so in a graph only to T = 4; eager 1.5x at T = 1-64).
The graph and eager spans may differ: a shape the eager span gives to ours and the graph span to
vLLM finds vLLM's kernel compiled before any capture, since vLLM compiles its TileLang kernels at
warm-up (``kernel_config.enable_jit_warmup``, on by default) and in its eager dummy runs.
"""

from __future__ import annotations

from dsv4spec.integrations.hooks import FasterTable

TABLES: dict[str, FasterTable] = {
    "hc_head": {(9, 0): {"graph": {4096: ((1, 4),), 7168: ((1, 64),)},
                         "eager": {4096: ((1, 64),), 7168: ((1, 64),)}}},
    "mhc_pre": {(9, 0): {"graph": {4096: ((1, 256),), 7168: ((1, 4096),)},
                         "eager": {4096: ((1, 256),), 7168: ((1, 4096),)}}},
    "mhc_post": {(9, 0): {"graph": {4096: ((1, 256),), 7168: ((1, 4096),)},
                          "eager": {4096: ((1, 256),), 7168: ((1, 4096),)}}},
    "mhc_fused_post_pre": {(9, 0): {"graph": {4096: ((1, 256),), 7168: ((1, 4096),)},
                                    "eager": {4096: ((1, 256),), 7168: ((1, 4096),)}}},
}
# The token count from which vLLM's op computes its pre-norm GEMM with DeepGEMM where DeepGEMM is
# supported (``is_deep_gemm_supported()``: Hopper or Blackwell, VLLM_USE_DEEP_GEMM, DeepGEMM
# importable) instead of TileLang: mhc_pre at every count, the fused boundary above its one-launch
# TileLang kernel's 32 tokens. The tables compare with TileLang's GEMM, so where vLLM runs
# DeepGEMM these counts keep vLLM's op until measured against it. mhc_post and hc_head never
# use DeepGEMM.
DEEP_GEMM_FROM_TOKENS: dict[str, int | None] = {
    "hc_head": None,
    "mhc_pre": 1,
    "mhc_post": None,
    "mhc_fused_post_pre": 33,
}
