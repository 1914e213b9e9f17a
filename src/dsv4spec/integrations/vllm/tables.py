"""Where dsv4spec's ops beat vLLM 0.33.0's TileLang kernels: the vLLM hooks' measured tables.

The tables are data, read through :func:`dsv4spec.integrations.tables.faster_table` from the same
files as the SGLang plugin's (``engines.vllm`` of ``tables/NVIDIA_H200.json`` and ``sm_90.json``,
a user file from ``$DSV4SPEC_TABLES_DIR`` first): per GPU, mode ("graph": device time inside a
CUDA graph; "eager": host wall time per back-to-back eager call) and hidden size, inclusive token
ranges whose measured points all won, with the points themselves. A width, architecture or token
count absent there keeps vLLM's kernel; a malformed file, or none for the GPU, means vLLM's kernel
for every hook (one WARNING).

Sources of the packaged rows (H200, TileLang 0.1.12 as vLLM pins it, vLLM's kernels loaded by
path with DeepGEMM off): ``benchmarks/results/plugin/vllm_plugin.md`` (``dsv4spec bench vllm``,
2026-12-01 22:21, each hooked call beside vLLM's own at T = 1, 2, 4, 8, 16, 32, 64, 256 and
H = 4096 / 7168). The mHC hooks won at every measured point, in a graph and eager (the boundary
6.40 vs 8.42 us at T = 1, H = 7168; ``mhc_pre`` at H = 4096, T = 16 by 0.4 %, the narrowest), and
``bench mhc`` (2026-12-02 04:37-04:40, code 2de4f81:
``benchmarks/results/archive/mhc_2026-12-02_token_rows/``) adds T = 1024 and 4096 at both widths,
where ours won each mHC op again (``mhc_pre`` 200 vs 906 us at 4096 tokens, H = 7168; the
boundary 619 vs 1028; the narrowest, ``mhc_post`` at H = 4096, 19.2 vs 20.0 at 1024), so the mHC
spans reach 4096 at both widths (with the boundary's token rows, ``benchmarks/results/mhc/``
12:44-12:53, 408 vs 1034 us at 4096). hc_head
won everywhere eagerly and in a graph at H = 7168 (3.85 vs 7.99 us at T = 1, 13.4 vs 14.0 at
256); at H = 4096 in a graph it won to T = 32 and at 256 but lost at 64 (6.19 vs 5.63 us). A
count is decided from the points of its segment, the counts between two tiling switches of our
op or vLLM's kernel (:mod:`dsv4spec.integrations.plans`); a segment without a point keeps vLLM's
kernel and is listed in the row's ``unmeasured`` until measured. ``dsv4spec tune --engine vllm``
measures these hooks on another GPU (``bench vllm``'s measurement over its grid) into the user
directory's file. The graph and eager spans may differ: a shape the eager span gives to ours
and the graph span to vLLM finds vLLM's kernel compiled before any capture, since vLLM compiles
its TileLang kernels at warm-up (``kernel_config.enable_jit_warmup``, on by default) and in its
eager dummy runs.
"""

from __future__ import annotations

from dsv4spec.integrations.tables import FileTable, faster_table

OPS = ("hc_head", "mhc_pre", "mhc_post", "mhc_fused_post_pre")
TABLES: dict[str, FileTable] = {op: faster_table("vllm", op) for op in OPS}
# The rows measured against vLLM's DeepGEMM path (the ``.deepgemm`` files), which decide where
# vLLM runs DeepGEMM (hooks.rows_for).
DEEPGEMM_TABLES: dict[str, FileTable] = {op: faster_table("vllm", op, deepgemm=True)
                                         for op in ("mhc_pre", "mhc_fused_post_pre")}
# The token count from which vLLM's op computes its pre-norm GEMM with DeepGEMM where DeepGEMM is
# supported (``is_deep_gemm_supported()``: Hopper or Blackwell, VLLM_USE_DEEP_GEMM, DeepGEMM
# importable) instead of TileLang: mhc_pre at every count, the fused boundary above its one-launch
# TileLang kernel's 32 tokens. Where vLLM runs DeepGEMM a row decides these counts only if it
# was measured against DeepGEMM (its ``measured_against``: hooks.path_matches). mhc_post and
# hc_head never use DeepGEMM.
DEEP_GEMM_FROM_TOKENS: dict[str, int | None] = {
    "hc_head": None,
    "mhc_pre": 1,
    "mhc_post": None,
    "mhc_fused_post_pre": 33,
}
