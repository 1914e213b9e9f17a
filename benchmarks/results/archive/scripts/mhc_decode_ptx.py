"""sm_90 PTX of the mHC kernels at decode sizes as the planner tiles them, compiled on a CPU from
the tree on PYTHONPATH (no GPU needed): the CUDA-core partials of the boundary and of mhc_pre and
their finalizes at 1-32 tokens, the model tail's fused partials and finalize, and mhc_post's
H-blocks, both widths. Writes one .ptx per kernel and size into OUT_DIR and prints its digest
and the plan; the lines of two trees compare their kernels. The constexprs are written out here,
not taken from the launcher, so that the script also compiles trees older than itself.

    PYTHONPATH=OTHER_TREE/src python3 benchmarks/results/archive/scripts/mhc_decode_ptx.py OUT_DIR > other.txt
"""

import hashlib
import inspect
import os
import re
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsv4spec.kernels import mhc as K

BF16_POINTERS = {"x_ptr", "f_ptr", "xnew_ptr", "out_ptr", "weight_ptr"}
TOKENS = (1, 4, 8, 16, 32)


def signature(kernel) -> dict:
    parameters = inspect.signature(kernel.fn).parameters.values()
    annotations = {p.name: str(p.annotation) for p in parameters}
    sig = {}
    for name in kernel.arg_names:
        if "constexpr" in annotations[name]:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*bf16" if name in BF16_POINTERS else "*fp32"
        else:
            sig[name] = "fp32" if name.endswith("eps") or name == "post_mult" else "i32"
    return sig


def dump(out: str, kernel, constexprs: dict, warps: int, stages, tag: str) -> None:
    names, sig = kernel.arg_names, signature(kernel)
    missing = [n for n in names if sig[n] == "constexpr" and n not in constexprs]
    assert not missing, (tag, missing)
    bound = {(names.index(n),): v for n, v in constexprs.items() if n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
    options = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    compiled = triton.compile(ASTSource(kernel, sig, bound, attrs),
                              target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"].split(".section\t.debug")[0]
    lines = [line for line in ptx.splitlines()
             if not re.match(r"^\s*\.(loc|file)|^\$L__tmp[0-9]+:|^\s*//", line)]
    text = "\n".join(lines)
    with open(f"{out}/{tag}.ptx", "w") as f:
        f.write(text)
    print(tag, hashlib.sha1(text.encode()).hexdigest()[:12], len(lines), "lines", flush=True)


def partials_constexprs(cfg, post: bool, nrows: int) -> dict:
    # as kernels/mhc.py's _pre_launches binds them for the CUDA-core partials
    return {"POST": post, "GRAM": True, "NROWS": nrows, "ROWS_PAD": 32 if nrows > 4 else 4,
            "CHUNKS_PER_SPLIT": cfg.chunks_per_split, "BLOCK_T": cfg.block_t,
            "BLOCK_K": cfg.block_k, "PDL": cfg.pdl, "PREFETCH_FN": cfg.prefetch_fn,
            "WAIT": cfg.wait}


def finalize_constexprs(cfg, x_early: bool, head: bool, sinkhorn_iters: int) -> dict:
    # as _pre_launches binds them for the finalize, with the RMSNorm and CUDA's fast division
    return {"SINKHORN_ITERS": sinkhorn_iters, "RMSNORM": True, "X_EARLY": x_early,
            "BLOCK_S": triton.next_power_of_2(cfg.num_splits), "BLOCK_H": cfg.block_h,
            "PDL": cfg.pdl, "FAST_MATH": True, "VECTOR_SUMS": cfg.vector_sums, "HEAD": head,
            "SLOT_D": 4 if head else 24}


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    K.supports_pdl = lambda device_index: True  # as on the H200
    takes_boundary = "boundary" in inspect.signature(K._config).parameters
    for H in (7168, 4096):
        for T in TOKENS:
            for boundary in (True, False):
                kw = {"device_index": 0, "dtype": torch.bfloat16}
                if takes_boundary:
                    kw["boundary"] = boundary
                cfg = K._config(T, H, 132, **kw)
                plan = {k: v for k, v in cfg._asdict().items()
                        if k not in ("stages", "token_rows", "presplit")}
                name = "boundary" if boundary else "pre"
                print(f"plan_{name}_T{T}_H{H}", sorted(plan.items()))
                dump(out, K._mhc_partials_kernel, partials_constexprs(cfg, boundary, 24),
                     cfg.partials_warps, getattr(cfg, "stages", None),
                     f"partials_{name}_T{T}_H{H}")
                dump(out, K._mhc_finalize_kernel,
                     finalize_constexprs(cfg, not boundary, False, 20), cfg.finalize_warps,
                     None, f"finalize_{name}_T{T}_H{H}")
            # the model tail's fused path (mhc_post_head): hc_head's 4 rows after the post
            cfg = K._config(T, H, 132, device_index=0, dtype=torch.bfloat16, mma=False)
            dump(out, K._mhc_partials_kernel, partials_constexprs(cfg, True, 4),
                 cfg.partials_warps, getattr(cfg, "stages", None), f"partials_tail_T{T}_H{H}")
            dump(out, K._mhc_finalize_kernel, finalize_constexprs(cfg, False, True, 1),
                 cfg.finalize_warps, None, f"finalize_tail_T{T}_H{H}")
    for block_h in (256, 512, 1024):  # mhc_post's H-blocks up to 32 tokens, 4 warps
        dump(out, K._mhc_post_kernel, {"BLOCK_H": block_h, "PDL": True}, 4, None,
             f"post_block_h{block_h}")


if __name__ == "__main__":
    main(sys.argv[1])
