"""Where dsv4spec's ops beat vLLM 0.33.0's TileLang kernels: the vLLM hooks' measured tables.

Same structure as the SGLang hooks' (:data:`dsv4spec.integrations.hooks.FasterTable`): per GPU
architecture, mode ("graph": device time inside a CUDA graph; "eager": host wall time per
back-to-back eager call) and hidden size, inclusive token ranges whose measured points all won.
A width, architecture or token count absent here keeps vLLM's kernel.

Source: a held-out H200 run (TileLang 0.1.12 as vLLM pins it, vLLM's kernels loaded by path with
DeepGEMM off, H = 7168, T in {1, 4, 16, 32, 64}; hc_head at T in {1, 4, 64}), graph us vLLM /
ours: hc_head 8.08 / 3.78 at T = 1 to 8.83 / 6.40 at 64; fused boundary 8.41 / 6.60 to
25.1 / 16.7 (vLLM's faster from T = 256: 63.7 / 69.0); mhc_pre 8.90 / 6.34 to 21.4 / 13.6;
mhc_post 3.25 / 1.40 to 3.54 / 2.74. Eager, ours was 4-7x faster per call at those sizes.
H = 4096 (DSV4-Flash) was not measured: vLLM's kernels serve it until a measurement fills it.
The graph and eager spans may differ: a shape the eager span gives to ours and the graph span to
vLLM finds vLLM's kernel compiled before any capture, since vLLM compiles its TileLang kernels at
warm-up (``kernel_config.enable_jit_warmup``, on by default) and in its eager dummy runs.
"""

from __future__ import annotations

from dsv4spec.integrations.hooks import FasterTable

TABLES: dict[str, FasterTable] = {
    "hc_head": {(9, 0): {"graph": {7168: ((1, 64),)}, "eager": {7168: ((1, 64),)}}},
    "mhc_pre": {(9, 0): {"graph": {7168: ((1, 64),)}, "eager": {7168: ((1, 64),)}}},
    "mhc_post": {(9, 0): {"graph": {7168: ((1, 64),)}, "eager": {7168: ((1, 64),)}}},
    "mhc_fused_post_pre": {(9, 0): {"graph": {7168: ((1, 64),)}, "eager": {7168: ((1, 64),)}}},
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
