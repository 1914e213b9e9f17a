"""How many decode counts (T 1-64) each table-gated mHC / hc_head hook gives to dsv4spec on an
H200, per stack, mode and width, asked of the plugins' own decision functions over the packaged
tables in a folder (default: the package's): ``python decode_counts.py [TABLES_DIR]``. Prints one
JSON object: stack -> engine hook -> mode -> H -> count served."""
import json
import sys
from pathlib import Path
from unittest import mock

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import hc_head as sglang_hc_head
from dsv4spec.integrations.sglang import mhc as sglang_mhc
from dsv4spec.integrations.vllm import hc_head as vllm_hc_head
from dsv4spec.integrations.vllm import mhc as vllm_mhc

ARCH = (9, 0)
DECIDE = {
    "SGLang mhc_pre": lambda T, H, g: sglang_mhc.prefers_dsv4spec("mhc_pre", T, H, g, ARCH),
    "SGLang mhc_post": lambda T, H, g: sglang_mhc.prefers_dsv4spec("mhc_post", T, H, g, ARCH),
    "SGLang boundary": lambda T, H, g: sglang_mhc.prefers_dsv4spec("mhc_fused_post_pre", T, H,
                                                                   g, ARCH),
    "SGLang target hc_head": lambda T, H, g: sglang_hc_head.target_prefers_dsv4spec(T, H, g, ARCH),
    "SGLang DSpark hc_head": lambda T, H, g: sglang_hc_head.dspark_prefers_dsv4spec(T, H, g, ARCH),
    "vLLM mhc_pre": lambda T, H, g: vllm_mhc.prefers_dsv4spec("mhc_pre", T, H, g, ARCH),
    "vLLM mhc_post": lambda T, H, g: vllm_mhc.prefers_dsv4spec("mhc_post", T, H, g, ARCH),
    "vLLM boundary": lambda T, H, g: vllm_mhc.prefers_dsv4spec("mhc_fused_post_pre", T, H, g,
                                                               ARCH),
    "vLLM hc_head": lambda T, H, g: vllm_hc_head.hc_head_prefers_dsv4spec(T, H, g, ARCH),
}

folder = Path(sys.argv[1]) if len(sys.argv) > 1 else tables.PACKAGED_DIR
out = {}
with mock.patch.object(tables, "PACKAGED_DIR", folder), \
        mock.patch.object(tables, "user_dir", lambda: folder / "no-user-tables"):
    for stack in ("3.6", "3.8"):
        tables.clear_cache()
        with tables.assuming("NVIDIA H200", stack):
            out[stack] = {hook: {mode: {H: sum(decide(T, H, mode == "graph") for T in range(1, 65))
                                        for H in (4096, 7168)}
                                 for mode in ("graph", "eager")}
                          for hook, decide in DECIDE.items()}
json.dump(out, sys.stdout)
print()
