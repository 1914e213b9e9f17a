"""The mHC partials kernels compiled for sm_90 on a CPU, as their first launch on an H200 compiles
them (``kernel.warmup`` over a stand-in driver answering sm_90, so integer arguments divisible by
16 are specialized as a launch specializes them): per kernel and tiling the registers and spills
(cuobjdump -res-usage), shared memory, SASS instructions, tensor-core instructions (HGMMA /
HMMA), the waits on them (WARPGROUP.DEPBAR, WARPGROUP.ARRIVE) and the barriers (BAR.SYNC). A
static view of what bounds a launch between decode and prefill sizes, where the GPU's own
counters (scripts/mhc_ncu.py) are not at hand.

    PYTHONPATH=src python3 scripts/mhc_partials_sass.py OUT_DIR [--tokens 64 256] [--widths 7168]

Writes OUT_DIR/<kernel>_<tiling>.cubin and prints a line per kernel.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

from dsv4spec.kernels import mhc as K

# name -> overrides of the planner: the CUDA-core plan at 33-64 tokens and the tensor-core
# kernels (tokens as rows, rows (t, i))
TILINGS = {
    "plan": {},
    "token rows t64 k32": {"mma": True, "token_rows": True, "block_t": 64, "block_k": 32,
                           "presplit": False, "stages": 3},
    "rows (t, i) t16 k64": {"mma": True, "token_rows": False, "block_t": 16, "block_k": 64,
                            "num_splits": 112, "warps": (4, 1)},
}
SASS_COUNTS = {"HGMMA": r"\bHGMMA\b", "HMMA": r"\bHMMA\b", "DEPBAR": r"WARPGROUP\.DEPBAR",
               "ARRIVE": r"WARPGROUP\.ARRIVE", "BAR.SYNC": r"\bBAR\.SYNC", "SHFL": r"\bSHFL",
               "LDG": r"\bLDG", "LDGSTS": r"\bLDGSTS", "STS": r"\bSTS\b", "LDS": r"\bLDS\b",
               "LDSM": r"\bLDSM", "UTMALDG": r"\bUTMALDG\b"}


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


def summary(out: str, compiled, tag: str) -> dict:
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    path = os.path.join(out, re.sub(r"[^\w.-]+", "_", tag))
    with open(path + ".cubin", "wb") as fh:
        fh.write(compiled.asm["cubin"])
    res = subprocess.run([f"{tools}/cuobjdump", "-res-usage", path + ".cubin"],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([f"{tools}/cuobjdump", "-sass", path + ".cubin"],
                          capture_output=True, text=True).stdout
    row = {"instructions": len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+[@A-Z]", sass))}
    for key in ("REG", "STACK", "SHARED"):
        m = re.search(rf"{key}:(\d+)", res)
        row[key.lower()] = int(m[1]) if m else None
    row["shared_dynamic"] = compiled.metadata.shared
    row.update({k: len(re.findall(p, sass)) for k, p in SASS_COUNTS.items()})
    return row


def compile_partials(cfg, T: int, H: int, boundary: bool):
    x, f = torch.empty(T, 4, H, dtype=torch.bfloat16), torch.empty(T, H, dtype=torch.bfloat16)
    post, comb, fn = torch.empty(T, 4), torch.empty(T, 4, 4), torch.empty(24, 4 * H)
    ws = torch.empty(T, 34, cfg.num_splits)
    # with presplit the kernel reads fn's bf16 parts [3, 4H, 32] (_split_fn_kernel's output)
    parts = torch.empty(3, 4 * H, 32, dtype=torch.bfloat16) if cfg.presplit else fn
    args = (x, f, post, comb, torch.empty_like(x), parts, ws, T, H, cfg.num_splits,
            fn.stride(0), ws.stride(0), ws.stride(1))
    kernel = K.partials_kernel(cfg).kernel
    return kernel.warmup(*args, grid=(1,), **K.partials_constexprs(cfg, boundary, True, 24),
                         num_warps=cfg.partials_warps, num_stages=cfg.stages,
                         launch_pdl=cfg.wait)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--tokens", type=int, nargs="+", default=[64, 256])
    p.add_argument("--widths", type=int, nargs="+", default=[7168])
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    driver.set_active(SM90())
    K.supports_pdl = lambda device_index: True  # as on the H200
    print("triton", triton.__version__, "torch", torch.__version__, flush=True)
    failures = 0
    for H in a.widths:
        for T in a.tokens:
            for boundary in (True, False):
                for name, ov in TILINGS.items():
                    cfg = K._config(T, H, 132, device_index=0, dtype=torch.bfloat16,
                                    boundary=boundary, **ov)
                    tag = (f"{'boundary' if boundary else 'pre'} T{T} H{H} {name} "
                           f"(t{cfg.block_t} k{cfg.block_k} x{cfg.chunks_per_split} "
                           f"s{cfg.num_splits} w{cfg.partials_warps})")
                    try:
                        row = summary(a.out, compile_partials(cfg, T, H, boundary), tag)
                    except Exception as err:  # noqa: BLE001 - a tiling that does not compile
                        failures += 1
                        print(f"{tag}: FAILED {type(err).__name__}: {str(err)[:300]}",
                              flush=True)
                        continue
                    print(f"{tag}: " + " ".join(f"{k} {v}" for k, v in row.items()),
                          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
