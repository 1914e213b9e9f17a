"""Digest of the sm_90 PTX of hc_head's partials kernel, compiled on this machine (no GPU needed).

    TRITON_INTERPRET=0 PYTHONPATH=src python3 scripts/hc_head_partials_ptx.py

Prints one line per (ACC_2D, GRAM, BLOCK_T, BLOCK_K, warps): a digest of the PTX without debug
info, line directives and label names, and its size. Run it before and after a refactor of the
kernel's source: equal digests mean the GPU runs the same code, so earlier H200 timings and GPU
tests still hold for it.
"""

import hashlib
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsv4spec.kernels.hc_head import JIT_KERNELS

SIGNATURE = {"x_ptr": "*bf16", "fn_ptr": "*fp32", "ws_ptr": "*fp32", "T": "i32", "H": "i32",
             "NUM_SPLITS": "i32", "stride_xt": "i32", "stride_xs": "i32", "stride_fn": "i32",
             "stride_wt": "i32", "stride_wk": "i32"}
KERNEL = JIT_KERNELS["partials"]
CASES = [  # (ACC_2D, GRAM, BLOCK_T, BLOCK_K, warps)
    (False, False, 1, 64, 4), (False, False, 8, 256, 2), (False, True, 1, 64, 4),
    (False, True, 8, 256, 2), (True, False, 4, 64, 4), (True, True, 4, 64, 4),
]


def ptx_digest(constexprs: dict, num_warps: int) -> tuple[str, int]:
    signature = {**SIGNATURE, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=KERNEL, signature=signature,
                       constexprs={(KERNEL.arg_names.index(n),): v for n, v in constexprs.items()})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": num_warps}).asm["ptx"]
    body = ptx.split(".section\t.debug")[0]
    lines = [line for line in body.splitlines()
             if line.strip() and not line.strip().startswith((".loc", ".file", "//", "$L__"))]
    text = re.sub(r"\$L__\w+", "L", "\n".join(lines))
    return hashlib.sha1(text.encode()).hexdigest()[:12], len(text)


def main() -> None:
    for acc_2d, gram, block_t, block_k, warps in CASES:
        constexprs = {"GRAM": gram, "ACC_2D": acc_2d, "CHUNKS_PER_SPLIT": 3, "BLOCK_T": block_t,
                      "BLOCK_K": block_k, "PDL": False}
        digest, size = ptx_digest(constexprs, warps)
        print(f"ACC_2D={acc_2d!s:<5} GRAM={gram!s:<5} BLOCK_T={block_t} BLOCK_K={block_k:<3} "
              f"warps={warps}: {digest} ({size} chars)")


if __name__ == "__main__":
    main()
