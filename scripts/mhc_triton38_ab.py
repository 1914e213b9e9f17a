"""The fused boundary (mhc_post_pre_triton, bf16, RMSNorm, 20 Sinkhorn passes) under the planned
tiling and under the candidate tilings for Triton 3.8, each checked against the float64
references first, then timed in a CUDA graph (triton.testing.do_bench_cudagraph, median) on
fresh random inputs per shape, at 1-32 tokens and both widths.

    PYTHONPATH=src python3 scripts/mhc_triton38_ab.py OUT_DIR

Writes OUT_DIR/mhc_triton38_ab.json and .md (with the torch and Triton versions and each
tiling's plan) and prints the table. Exits non-zero if any tiling's outputs are off the
references (checked as tests/ops/test_mhc.py's assert_boundary_close does: the new residual
within an ulp of the float64 post, post and comb within 1e-5 of the float64 pre of that
residual, the layer input within 2 ulps). Candidates, where they differ from the plan:
``tile8`` the 8-token blocks (Triton 3.6's plan at 5-32 tokens), ``tile4`` 4-token blocks,
``warps8`` the 8-token blocks with 8 warps in the partials, ``no_pdl`` the 8-token blocks
without programmatic dependent launches. A dash in the table: the same tiling as a column to
its left.

``--norm-weight bfloat16`` gives the RMSNorm a bf16 weight (DSV4's, and the one ``bench stack``
and ``tune`` time) instead of fp32; ``--via-op`` calls ``dsv4spec.ops.mhc_post_pre`` (the planned
tiling alone: the op takes no overrides) and lets it allocate the outputs, as those benchmarks
do, instead of the kernels' function writing into preallocated outputs. Either one names the files
``mhc_triton38_ab_<weight>[_op]``: the four runs isolate which of the two makes the 16-token
boundary slower under 3.8 with the benchmarks' inputs (benchmarks/results/triton38/
boundary_9_16_tokens.md).

``--interpret`` (with TRITON_INTERPRET=1, on a CPU): the correctness part alone at a tiny
width, no timing.
"""

import argparse
import json
import os
import sys
import time

import torch
import triton

from dsv4spec import ops
from dsv4spec.kernels import mhc as K
from dsv4spec.kernels.mhc import mhc_post_pre_triton, mhc_pre_triton
from dsv4spec.ops import mhc_post_reference, mhc_pre_reference

TOKENS = (1, 4, 8, 16, 24, 32)
WIDTHS = (4096, 7168)
EPS = {"rms_eps": 1e-6, "hc_eps": 1e-6}
ITERS = 20


def candidates(T: int) -> dict:
    """Tiling overrides by name; the planner's own first."""
    out = {"planned": {}}
    if T > K.INVARIANT_MAX_TOKENS:
        tile8 = {"block_t": min(8, triton.next_power_of_2(T))}
        out["tile8"] = tile8
        out["tile4"] = {"block_t": 4}
        out["warps8"] = {**tile8, "warps": (8, 1)}
        out["no_pdl"] = {**tile8, "pdl": False}
    return out


def make_inputs(T, H, device, seed, weight_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 4, H, generator=g).to(device=device, dtype=torch.bfloat16)
    fn = (torch.randn(24, 4 * H, generator=g) * (4 * H) ** -0.5).to(device)
    scale = (torch.rand(3, generator=g) + 0.5).to(device)
    base = torch.randn(24, generator=g).to(device)
    norm_weight = (torch.rand(H, generator=g) + 0.5).to(device=device, dtype=weight_dtype)
    f = torch.randn(T, H, generator=g).to(device=device, dtype=torch.bfloat16)
    return x, fn, scale, base, norm_weight, f


def _ulp(v):
    e = torch.floor(torch.log2(v.abs().clamp_min(torch.finfo(torch.bfloat16).tiny)))
    return torch.finfo(torch.bfloat16).eps * torch.exp2(e)


def _off(actual, expected, ulps=None) -> str | None:
    a, e = actual.double().cpu(), expected.double().cpu()
    diff = (a - e).abs()
    scale = e.abs().max().clamp_min(1e-30)
    if ulps is None:
        bad = diff > 1e-5 * scale
    else:
        bad = diff > ulps * _ulp(torch.maximum(a.abs(), e.abs())) + 1e-6 * scale
    bad |= a.isnan() != e.isnan()
    if bad.any():
        return f"{int(bad.sum())}/{bad.numel()} off, rel error {(diff.max() / scale).item():.3g}"
    return None


def check(got, f, x, post, comb, fn, sc, base, kw) -> list[str]:
    """assert_boundary_close's checks, as messages (empty: within tolerance)."""
    new, post2, comb2, y = got
    ref_pre = mhc_pre_reference(new, fn, sc, base, **kw)
    errors = {"residual'": _off(new, mhc_post_reference(f, x, post, comb), 1),
              "post": _off(post2, ref_pre[0]), "comb": _off(comb2, ref_pre[1]),
              "layer_input": _off(y, ref_pre[2], 2)}
    return [f"{k}: {v}" for k, v in errors.items() if v]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--interpret", action="store_true",
                    help="correctness only, tiny width, on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--rep", type=int, default=10, help="do_bench_cudagraph's rep (ms)")
    ap.add_argument("--norm-weight", choices=("float32", "bfloat16"), default="float32",
                    help="the RMSNorm weight's dtype (DSV4's and the benchmarks' is bfloat16)")
    ap.add_argument("--via-op", action="store_true",
                    help="call dsv4spec.ops.mhc_post_pre, outputs allocated per call")
    args = ap.parse_args()
    weight_dtype = getattr(torch, args.norm_weight)
    stem = "mhc_triton38_ab" + (
        "" if args.norm_weight == "float32" and not args.via_op
        else f"_{args.norm_weight}" + ("_op" if args.via_op else ""))
    interpret = args.interpret
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--interpret needs TRITON_INTERPRET=1")
    if not interpret and (args.out_dir is None or not torch.cuda.is_available()):
        ap.error("needs OUT_DIR and a CUDA GPU (or --interpret)")
    device = "cpu" if interpret else "cuda"
    device_index = -1 if interpret else torch.cuda.current_device()
    tokens, widths = ((1, 16), (72,)) if interpret else (TOKENS, WIDTHS)
    start = time.time()
    rows, failures = [], []
    for H in widths:
        for T in tokens:
            x, fn, sc, base, nw, f = make_inputs(T, H, device, seed=1000 * T + H,
                                                 weight_dtype=weight_dtype)
            kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
            pargs = (EPS["rms_eps"], EPS["hc_eps"], ITERS, 2.0, nw, 1e-6)
            post, comb, _ = mhc_pre_triton(x, fn, sc, base, *pargs)
            seen = {}
            for name, ov in candidates(T).items():
                if args.via_op and ov:  # the op takes no tiling: its plan alone
                    continue
                cfg = K.plan(T, H, device_index, dtype=torch.bfloat16, boundary=True, **ov)
                if cfg in seen:  # the same tiling as an earlier name
                    continue
                seen[cfg] = name
                out = (torch.empty_like(x), x.new_empty((T, 4), dtype=torch.float32),
                       x.new_empty((T, 4, 4), dtype=torch.float32), torch.empty_like(f))

                def call(ov=ov, out=out):
                    return mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *pargs, out=out,
                                               **ov)

                if args.via_op:
                    def call(out=out):  # noqa: F811 - the benchmarks' way in
                        got = ops.mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)
                        for o, g in zip(out, got):  # the last replay's outputs, for the check
                            o.copy_(g)
                        return got

                got = call()
                if not interpret:
                    torch.cuda.synchronize()
                errors = check(got, f, x, post, comb, fn, sc, base, kw)
                row = {"T": T, "H": H, "tiling": name, "overrides": {k: v for k, v in ov.items()},
                       "plan": cfg._asdict(), "errors": errors}
                if errors:
                    failures.append(f"T={T} H={H} {name}: " + "; ".join(errors))
                    print("WRONG", failures[-1], file=sys.stderr, flush=True)
                if not interpret:
                    row["us"] = 1e3 * triton.testing.do_bench_cudagraph(
                        call, rep=args.rep, return_mode="median")
                    # the outputs once more after the replays
                    again = check(out, f, x, post, comb, fn, sc, base, kw)
                    if again:
                        row["errors"] += again
                        failures.append(f"T={T} H={H} {name} after replays: " + "; ".join(again))
                        print("WRONG", failures[-1], file=sys.stderr, flush=True)
                rows.append(row)
                print(f"T={T:3d} H={H} {name:8s} block_t={cfg.block_t} warps="
                      f"{cfg.partials_warps} splits={cfg.num_splits} pdl={cfg.pdl} "
                      f"wait={cfg.wait} " + (f"{row['us']:7.2f} us" if "us" in row else "")
                      + (" WRONG" if row["errors"] else " ok"), flush=True)
    meta = {"torch": torch.__version__, "triton": triton.__version__,
            "device": "interpreter" if interpret else torch.cuda.get_device_name(),
            "rep_ms": args.rep, "seconds": round(time.time() - start, 1),
            "norm_weight": args.norm_weight, "via_op": args.via_op}
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, f"{stem}.json"), "w") as fh:
            json.dump({"meta": meta, "rows": rows, "failures": failures}, fh, indent=1)
        names = ["planned", "tile8", "tile4", "warps8", "no_pdl"]
        lines = [f"# mhc_post_pre, CUDA graph median (us): torch {meta['torch']}, Triton "
                 f"{meta['triton']}, {meta['device']}; norm weight {args.norm_weight}"
                 + (", through dsv4spec.ops.mhc_post_pre" if args.via_op else ""), "",
                 "| H | T | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
        for H in widths:
            for T in tokens:
                cells = []
                for n in names:
                    r = [r for r in rows if r["T"] == T and r["H"] == H and r["tiling"] == n]
                    cells.append("-" if not r else ("WRONG" if r[0]["errors"] else
                                                    f"{r[0].get('us', float('nan')):.2f}"))
                lines.append(f"| {H} | {T} | " + " | ".join(cells) + " |")
        lines += ["", "- (a dash: the same tiling as a column to its left, or not a candidate)"]
        lines += [f"- FAILURE {s}" for s in failures]
        with open(os.path.join(args.out_dir, f"{stem}.md"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        print("\n".join(lines))
    print(json.dumps(meta))
    if failures:
        print(f"FAILED: {len(failures)} tilings off the references", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
