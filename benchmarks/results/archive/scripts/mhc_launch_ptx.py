"""The boundary's two kernels at 9-16 tokens compiled for sm_90 on a CPU as their first launch on an
H200 compiles them: through Triton's own launch-time specialization (``kernel.warmup`` over a
stand-in driver answering sm_90), so integer arguments divisible by 16 (H, the split count, the
strides) are specialized as a real launch specializes them, with the norm weight bf16 (DSV4's, the
benchmarks' inputs) or fp32. Prints per kernel the registers and spill bytes (cuobjdump
-res-usage), SASS instructions, global load / store widths and the TTGIR's blocked layouts; the
lines of two Tritons compare their kernels.

    PYTHONPATH=src python3 benchmarks/results/archive/scripts/mhc_launch_ptx.py OUT_DIR
"""

import collections
import os
import re
import subprocess
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

from dsv4spec.kernels import mhc as K

TOKENS = (9, 12, 16)
WIDTHS = (7168, 4096)


class SM90:
    """What a launch asks the driver, answered as on an H200; nothing runs."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


def report(out: str, compiled, tag: str) -> None:
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    path = os.path.join(out, tag)
    with open(path + ".cubin", "wb") as fh:
        fh.write(compiled.asm["cubin"])
    res = subprocess.run([f"{tools}/cuobjdump", "-res-usage", path + ".cubin"],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([f"{tools}/cuobjdump", "-sass", path + ".cubin"],
                          capture_output=True, text=True).stdout
    mem = collections.Counter(re.findall(r"\b((?:LDG|STG)[A-Z0-9_.]*)", sass))
    instr = len(re.findall(r"/\*[0-9a-f]{4}\*/\s+[@A-Z]", sass))
    shfl = len(re.findall(r"\bSHFL", sass))
    head = compiled.asm["ttgir"].split("tt.func")[0]
    layouts = " ".join(re.findall(r"sizePerThread = \[([\d, ]+)\]", head))
    reg, stack = re.search(r"REG:\d+", res).group(0), re.search(r"STACK:\d+", res).group(0)
    print(f"{tag:34s} {reg} {stack} instr {instr} SHFL {shfl} {dict(sorted(mem.items()))} "
          f"sizePerThread [{layouts}]", flush=True)


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    driver.set_active(SM90())
    K.supports_pdl = lambda device_index: True  # as on the H200
    print("triton", triton.__version__, "torch", torch.__version__)
    for H in WIDTHS:
        for T in TOKENS:
            for block_t in (None, 8):  # the planner's tiling, and the 8-token blocks
                kw = {"device_index": 0, "dtype": torch.bfloat16, "boundary": True}
                cfg = K._config(T, H, 132, **kw, **({"block_t": block_t} if block_t else {}))
                if block_t and cfg == K._config(T, H, 132, **kw):
                    continue
                x, f = torch.empty(T, 4, H, dtype=torch.bfloat16), torch.empty(T, H,
                                                                               dtype=torch.bfloat16)
                post, comb, fn = torch.empty(T, 4), torch.empty(T, 4, 4), torch.empty(24, 4 * H)
                sc, base, ws = torch.empty(3), torch.empty(24), torch.empty(T, 34, cfg.num_splits)
                new, y = torch.empty_like(x), torch.empty_like(f)
                p2, c2 = torch.empty(T, 4), torch.empty(T, 4, 4)
                args = (x, f, post, comb, new, fn, ws, T, H, cfg.num_splits, fn.stride(0),
                        ws.stride(0), ws.stride(1))
                name = f"T{T}_H{H}_bt{cfg.block_t}"
                report(out, K._mhc_partials_kernel.warmup(
                    *args, grid=(1,), **K.partials_constexprs(cfg, True, True, 24),
                    num_warps=cfg.partials_warps, launch_pdl=cfg.wait), f"partials_{name}")
                for dtype in (torch.bfloat16, torch.float32):
                    args = (new, ws, sc, base, torch.empty(H, dtype=dtype), p2, c2, y, T, H,
                            cfg.num_splits, triton.cdiv(H, cfg.block_h), 1e-6, 1e-6, 1e-6, 2.0,
                            ws.stride(0), ws.stride(1))
                    report(out, K._mhc_finalize_kernel.warmup(
                        *args, grid=(1,),
                        **K.finalize_constexprs(cfg, 20, True, True, False, True, 24),
                        num_warps=cfg.finalize_warps, launch_pdl=cfg.pdl),
                        f"finalize_{name}_{str(dtype).removeprefix('torch.')}")


if __name__ == "__main__":
    main(sys.argv[1])
