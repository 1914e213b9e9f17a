"""How many decode counts (T 1-64) each table-gated mHC / hc_head hook gives to dsv4spec on a GPU
(default the H200), per stack, mode and width, asked of the plugins' own decision functions over
the packaged tables in a folder (default: the package's):
``python decode_counts.py [TABLES_DIR] [--device NAME] [--deepgemm]`` (``--deepgemm``: the mHC
hooks as where the engine runs DeepGEMM's pre-norm GEMM). Prints one JSON object: stack ->
engine hook -> mode -> H -> count served."""
import argparse
import json
import sys
from pathlib import Path
from unittest import mock

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import hc_head as sglang_hc_head
from dsv4spec.integrations.sglang import mhc as sglang_mhc
from dsv4spec.integrations.vllm import hc_head as vllm_hc_head
from dsv4spec.integrations.vllm import mhc as vllm_mhc

parser = argparse.ArgumentParser()
parser.add_argument("tables_dir", nargs="?", type=Path, default=tables.PACKAGED_DIR)
parser.add_argument("--device", default="NVIDIA H200")
parser.add_argument("--deepgemm", action="store_true")
args = parser.parse_args()
ARCH, DG = (9, 0), args.deepgemm
DECIDE = {
    "SGLang mhc_pre": lambda T, H, g: sglang_mhc.prefers_dsv4spec("mhc_pre", T, H, g, ARCH, DG),
    "SGLang mhc_post": lambda T, H, g: sglang_mhc.prefers_dsv4spec("mhc_post", T, H, g, ARCH),
    "SGLang boundary": lambda T, H, g: sglang_mhc.prefers_dsv4spec("mhc_fused_post_pre", T, H,
                                                                   g, ARCH, DG),
    "SGLang target hc_head": lambda T, H, g: sglang_hc_head.target_prefers_dsv4spec(T, H, g, ARCH),
    "SGLang DSpark hc_head": lambda T, H, g: sglang_hc_head.dspark_prefers_dsv4spec(T, H, g, ARCH),
    "vLLM mhc_pre": lambda T, H, g: vllm_mhc.prefers_dsv4spec("mhc_pre", T, H, g, ARCH, DG),
    "vLLM mhc_post": lambda T, H, g: vllm_mhc.prefers_dsv4spec("mhc_post", T, H, g, ARCH),
    "vLLM boundary": lambda T, H, g: vllm_mhc.prefers_dsv4spec("mhc_fused_post_pre", T, H, g,
                                                               ARCH, DG),
    "vLLM hc_head": lambda T, H, g: vllm_hc_head.hc_head_prefers_dsv4spec(T, H, g, ARCH),
}

folder = args.tables_dir
out = {}
with mock.patch.object(tables, "PACKAGED_DIR", folder), \
        mock.patch.object(tables, "user_dir", lambda: folder / "no-user-tables"):
    for stack in ("3.6", "3.8"):
        tables.clear_cache()
        with tables.assuming(args.device, stack):
            out[stack] = {hook: {mode: {H: sum(decide(T, H, mode == "graph") for T in range(1, 65))
                                        for H in (4096, 7168)}
                                 for mode in ("graph", "eager")}
                          for hook, decide in DECIDE.items()}
json.dump(out, sys.stdout)
print()
