"""mhc_pre's and the boundary's launch 1 with TMA loads, a candidate for 33-512 tokens (where
DeepGEMM's path is faster than ours): the token-row tensor-core partials with the streams' tiles
(and the boundary's f) and fn's bf16 parts brought in by tensor descriptors, several chunks of h
per program in a software pipeline (``tl.range(..., num_stages=)``), so the loads of the next
chunks are in flight while this one's dots run, as DeepGEMM's pre-norm GEMM does. Nsight Compute
had our partials at 64 tokens stalled on their loads
(benchmarks/results/deepgemm_h100/mhc_ncu_T64.md). The finalize is the library's. A prototype:
the kernel lives here until a GPU run shows it faster.

    PYTHONPATH=src python3 scripts/mhc_tma_ab.py OUT_DIR [--ops pre post_pre] [--tokens ...]
        [--widths ...] [--engines vllm] [--seconds N]

Each tiling is checked against the float64 references first (post and comb within 1e-5, the
layer input within 2 ulps; the boundary's new residual within 1 ulp, its pre against the pre of
that residual, as tests/ops/test_mhc.py's assert_boundary_close), then timed in a CUDA graph
(triton.testing.do_bench_cudagraph, median) beside the plan and the engines' DeepGEMM path
(their peers as ``mhc_mid_t_ab.py`` loads them); "+ split" rows include the launch that splits
fn into its bf16 parts, the others split it once before timing (what a cached split of the
weight would cost). Writes OUT_DIR/mhc_tma_ab.json and .md; exits non-zero if any tiling is off
the reference. ``--interpret`` (TRITON_INTERPRET=1, on a CPU): the correctness part alone at a
tiny width. ``--sass`` (on a CPU): each tiling compiled for sm_90 as mhc_partials_sass.py
compiles the library's partials, a line per tiling (registers, spills, shared memory, TMA loads,
barriers).
"""

import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mhc_mid_t_ab import (  # noqa: E402
    ab_parser,
    ab_run,
    check_pre,
    engine_peers,
    time_engines,
)
from mhc_triton38_ab import EPS, ITERS, check, make_inputs  # noqa: E402

from dsv4spec.bench import mhc as bench_mhc  # noqa: E402
from dsv4spec.kernels import mhc as K  # noqa: E402

# the library's helpers, by the names the kernels below call them
load_mixes = K.JIT_HELPERS["load_mixes"]
store_new_residual = K.JIT_HELPERS["store_new_residual"]
token_grams_zero = K.JIT_HELPERS["token_grams_zero"]
token_grams_add = K.JIT_HELPERS["token_grams_add"]
store_token_partials = K.JIT_HELPERS["store_token_partials"]

TOKENS = (33, 48, 64, 128, 256, 512)
WIDTHS = (7168, 4096)
OPS = ("pre", "post_pre")
# name -> (block_t, block_k, chunks per program, pipeline stages, warps). 256 columns of the 4
# streams a program (112 programs at H 7168 and 64 tokens, as DeepGEMM's split) in 16-, 32- and
# 64-wide chunks, and 512 (56 programs, deeper pipelines); 8 warps too: compiled for sm_90 the
# boundary's mix spills with 4 warps at 32- and 64-wide chunks, and with 8 except at 16-wide
# chunks and 64 tokens by 32 (results/mhc/mhc_tma_partials_sass_triton3.6.txt)
TILINGS = {
    "tma t64 k16 c4 s4": (64, 16, 4, 4, 4),
    "tma t64 k32 c2 s2": (64, 32, 2, 2, 4),
    "tma t64 k64 c1 s1": (64, 64, 1, 1, 4),
    "tma t64 k32 c4 s4": (64, 32, 4, 4, 4),
    "tma t64 k64 c2 s2 w8": (64, 64, 2, 2, 8),
    "tma t128 k32 c2 s2 w8": (128, 32, 2, 2, 8),
    "tma t64 k16 c4 s4 w8": (64, 16, 4, 4, 8),
    "tma t64 k32 c2 s2 w8": (64, 32, 2, 2, 8),
}


@triton.jit
def _stream_part_dots(acc, xt, parts_desc, row, H):
    # xt [BLOCK_T, BLOCK_K] times the stream's [BLOCK_K, 32] tiles of fn's parts (rows j >= 24
    # zero), smallest part first, from zero; then added to acc in fp32 (the library's
    # _token_row_dots with its PRESPLIT parts)
    lo = parts_desc.load([row + 8 * H, 0])
    mid = parts_desc.load([row + 4 * H, 0])
    hi = parts_desc.load([row, 0])
    return acc + tl.dot(xt, hi, tl.dot(xt, mid, tl.dot(xt, lo)))


@triton.jit
def _partials_tma_kernel(
    x_desc, f_desc, parts_desc, post_ptr, comb_ptr, xnew_ptr, ws_ptr, T, H, NUM_SPLITS,
    stride_wt, stride_wk, POST: tl.constexpr, GRAM: tl.constexpr,
    CHUNKS_PER_SPLIT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):
    # x_desc: the streams as [T, 4H] (row t, column i * H + h), [BLOCK_T, BLOCK_K] boxes; rows
    # past T come back zero. parts_desc: fn's parts as [3 * 4H, 32] (hi, mid, lo), [BLOCK_K,
    # 32] boxes. Every chunk of h lies inside its stream: H is a multiple of BLOCK_K and the
    # splits cover the chunks exactly (the host checks both). With POST the new residual is
    # formed in registers from f_desc's [T, H] tiles and the previous post and comb, stored
    # (explicit fmas, as the library's token-row partials) and is itself the dots' tile.
    pid = tl.program_id(0).to(tl.int64)
    split = pid % NUM_SPLITS
    t0 = ((pid // NUM_SPLITS) * BLOCK_T).to(tl.int32)
    offs_t = t0 + tl.arange(0, BLOCK_T)
    tt = offs_t[:, None]
    mt = tt < T
    if POST:
        mixes = load_mixes(post_ptr, comb_ptr, tt, mt)
    acc = tl.zeros([BLOCK_T, 32], dtype=tl.float32)
    g00, g11, g22, g33, g01, g02, g03, g12, g13, g23 = token_grams_zero(BLOCK_T)
    for c in tl.range(0, CHUNKS_PER_SPLIT, num_stages=STAGES):
        h0 = ((split * CHUNKS_PER_SPLIT + c) * BLOCK_K).to(tl.int32)
        x0 = x_desc.load([t0, h0])
        x1 = x_desc.load([t0, H + h0])
        x2 = x_desc.load([t0, 2 * H + h0])
        x3 = x_desc.load([t0, 3 * H + h0])
        if POST:
            hh = h0 + tl.arange(0, BLOCK_K)[None, :]
            fv = f_desc.load([t0, h0]).to(tl.float32)
            x0, x1, x2, x3 = store_new_residual(
                xnew_ptr, tt * (4 * H) + hh, H, mt, mixes, fv, x0.to(tl.float32),
                x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32), True)
        acc = _stream_part_dots(acc, x0, parts_desc, h0, H)
        acc = _stream_part_dots(acc, x1, parts_desc, H + h0, H)
        acc = _stream_part_dots(acc, x2, parts_desc, 2 * H + h0, H)
        acc = _stream_part_dots(acc, x3, parts_desc, 3 * H + h0, H)
        g00, g11, g22, g33, g01, g02, g03, g12, g13, g23 = token_grams_add(
            g00, g11, g22, g33, g01, g02, g03, g12, g13, g23, x0, x1, x2, x3, GRAM)
    store_token_partials(ws_ptr, offs_t, T, split, stride_wt, stride_wk, acc, g00, g11, g22,
                          g33, g01, g02, g03, g12, g13, g23, GRAM)


class TmaOp:
    """mhc_pre (``boundary`` None) or the boundary (``boundary = (f, post, comb)``, x the
    residual) with the TMA partials, for one shape and tiling: buffers, descriptors and the
    finalize's plan made once (``__init__``), then ``split()`` (fn into its bf16 parts) and
    ``__call__`` (launch 1 and the finalize) per call; ``out`` as the library's op returns it."""

    def __init__(self, x, fn, hc_scale, hc_base, norm_weight, tiling, num_sms, boundary=None):
        block_t, block_k, chunks, stages, warps = tiling
        T, _, H = x.shape
        n_chunks = triton.cdiv(H, block_k)
        if H % block_k or n_chunks % chunks:
            raise ValueError(f"H = {H}: {block_k}-wide chunks, {chunks} a program, do not tile it")
        self.x, self.fn, self.scale, self.base, self.weight = x, fn, hc_scale, hc_base, norm_weight
        self.T, self.H, self.num_splits = T, H, n_chunks // chunks
        self.boundary = boundary
        self.cfg = K.tiling(T, H, num_sms, dtype=torch.bfloat16, mma=True, token_rows=True,
                            presplit=True, block_t=block_t, block_k=block_k,
                            num_splits=self.num_splits, on_gpu=x.is_cuda,
                            boundary=boundary is not None)
        rmsnorm = norm_weight is not None
        self.ws = torch.empty((T, K.NMIX + (10 if rmsnorm else 4), self.num_splits),
                              dtype=torch.float32, device=x.device)
        self.parts = torch.empty((3, 4 * H, 32), dtype=torch.bfloat16, device=x.device)
        self.x_desc = TensorDescriptor(x.view(T, 4 * H), [T, 4 * H], [4 * H, 1],
                                       [block_t, block_k])
        self.parts_desc = TensorDescriptor(self.parts.view(12 * H, 32), [12 * H, 32], [32, 1],
                                           [block_k, 32])
        if boundary is None:
            self.f_desc, self.post, self.comb = self.x_desc, hc_scale, hc_scale  # unused
            self.new = x
            self.out = K.pre_outputs(x, T, H)
        else:
            f, self.post, self.comb = boundary
            self.f_desc = TensorDescriptor(f, [T, H], [H, 1], [block_t, block_k])
            self.new = torch.empty_like(x)
            self.out = (self.new, *K.pre_outputs(x, T, H))
        self.grid = (triton.cdiv(T, block_t) * self.num_splits,)
        self.constexprs = {"POST": boundary is not None, "GRAM": rmsnorm,
                           "CHUNKS_PER_SPLIT": chunks, "BLOCK_T": block_t, "BLOCK_K": block_k,
                           "STAGES": stages}
        self.warps = warps

    def split(self) -> None:
        K.JIT_KERNELS["split_fn"][(triton.cdiv(4 * self.H, 64),)](
            self.fn, self.parts, 4 * self.H, self.fn.stride(0), BLOCK_C=64, num_warps=4)

    def launch_args(self) -> tuple[tuple, dict]:
        """Launch 1's arguments and its constexprs and options (compile_report compiles it)."""
        ws = self.ws
        return ((self.x_desc, self.f_desc, self.parts_desc, self.post, self.comb, self.new, ws,
                 self.T, self.H, self.num_splits, ws.stride(0), ws.stride(1)),
                {**self.constexprs, "num_warps": self.warps})

    def __call__(self, split: bool = True):
        if split:
            self.split()
        T, H, cfg, ws = self.T, self.H, self.cfg, self.ws
        args, options = self.launch_args()
        _partials_tma_kernel[self.grid](*args, **options)
        rmsnorm = self.weight is not None
        post, comb, y = self.out[-3:]
        num_hblocks = triton.cdiv(H, cfg.block_h)
        K.JIT_KERNELS["finalize"][(T * (num_hblocks + 1),)](
            self.new, ws, self.scale, self.base, self.weight if rmsnorm else self.base, post,
            comb, y, T, H, self.num_splits, num_hblocks, EPS["rms_eps"], EPS["hc_eps"], 1e-6,
            2.0, ws.stride(0), ws.stride(1),
            **K.finalize_constexprs(cfg, ITERS, rmsnorm, self.boundary is not None, False,
                                    K.fast_math(self.x), K.NMIX),
            num_warps=cfg.finalize_warps)
        return self.out


def compile_report(tokens, widths) -> int:
    """Each tiling compiled for sm_90 over mhc_partials_sass.py's stand-in driver, a line each;
    the number of tilings that failed to compile."""
    import tempfile

    from mhc_partials_sass import SM90, summary
    from triton.runtime import driver

    driver.set_active(SM90())
    print("triton", triton.__version__, "torch", torch.__version__, flush=True)
    failures = 0
    with tempfile.TemporaryDirectory() as out:
        for (op, T, H), (name, tiling) in itertools.product(
                itertools.product(OPS, tokens, widths), TILINGS.items()):
            x = torch.empty(T, 4, H, dtype=torch.bfloat16)
            boundary = None if op == "pre" else (torch.empty(T, H, dtype=torch.bfloat16),
                                                 torch.empty(T, 4), torch.empty(T, 4, 4))
            tag = f"{op} T{T} H{H} {name}"
            try:
                tma = TmaOp(x, torch.empty(K.NMIX, 4 * H), torch.empty(3), torch.empty(K.NMIX),
                            torch.empty(H, dtype=torch.bfloat16), tiling, 132, boundary)
                tag += f" ({tma.grid[0]} programs)"
                args, options = tma.launch_args()
                compiled = _partials_tma_kernel.warmup(*args, grid=(1,), **options)
                row = summary(out, compiled, tag)
            except Exception as err:  # noqa: BLE001 - a tiling that does not compile
                failures += 1
                print(f"{tag}: FAILED {type(err).__name__}: {str(err)[:300]}", flush=True)
                continue
            print(f"{tag}: " + " ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return failures


def markdown(meta: dict, rows: list[dict], failures: list[str]) -> str:
    lines = [f"# mhc_pre and the boundary with TMA partials at 33-512 tokens, CUDA graph median "
             f"(µs): {meta['device']}, torch {meta['torch']}, Triton {meta['triton']}; engines "
             f"with DeepGEMM on", "",
             "| op | H | T | faster engine | planned | best TMA (fn split cached) | its tiling | "
             "best TMA + split | faster engine / best TMA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for op, H, T in sorted({(r["op"], r["H"], r["T"]) for r in rows}):
        here = [r for r in rows if (r["op"], r["H"], r["T"]) == (op, H, T) and "us" in r
                and not r["errors"]]
        eng = min((r["us"] for r in here if r["tiling"] in ("vllm", "sglang")), default=None)
        planned = next((r["us"] for r in here if r["tiling"] == "planned"), None)
        tma = [r for r in here if r["tiling"].startswith("tma") and not r.get("split")]
        split = [r for r in here if r["tiling"].startswith("tma") and r.get("split")]
        best = min(tma, key=lambda r: r["us"], default=None)
        best_split = min((r["us"] for r in split), default=None)
        ratio = f"{eng / best['us']:.2f}x" if eng and best else "-"
        lines.append(f"| {op} | {H} | {T} | {eng or '-'} | {planned or '-'} | "
                     f"{best['us'] if best else '-'} | {best['tiling'] if best else '-'} | "
                     f"{best_split or '-'} | {ratio} |")
    lines += ["", "Every tiling's row is in the JSON beside this file."]
    lines += [f"- FAILURE {s}" for s in failures]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = ab_parser(__doc__.splitlines()[0])
    ap.set_defaults(tokens=list(TOKENS))
    ap.add_argument("--sass", action="store_true",
                    help="compile each tiling for sm_90 on a CPU and report it; nothing runs")
    args = ap.parse_args(argv)
    if args.sass:
        return 1 if compile_report(args.tokens, args.widths) else 0
    interpret = args.interpret
    if interpret and not K.interpreter_multiplies_bf16():
        ap.error("this interpreter multiplies bf16 dots as bits (tests/conftest.py patches it)")
    device, meta, rows, failures, write, bench = ab_run(ap, args, "mhc_tma_ab", markdown)
    start = time.time()
    num_sms = 132 if interpret else K.num_sms(torch.cuda.current_device())
    points = ([(17, 128), (40, 256)] if interpret
              else list(itertools.product(args.tokens, args.widths)))
    tilings = ({"tma t16 k32 c2 s2": (16, 32, 2, 2, 4), "tma t64 k64 c2 s2": (64, 64, 2, 2, 4)}
               if interpret else TILINGS)

    peers = {} if interpret else engine_peers(args.engines)
    for T, H in points:
        if args.seconds is not None and time.time() - start > args.seconds:
            print(f"past --seconds: T={T} H={H} and after not timed", flush=True)
            break
        x, fn, sc, base, nw, f = make_inputs(T, H, device, seed=1000 * T + H,
                                             weight_dtype=torch.bfloat16)
        kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
        pargs = (EPS["rms_eps"], EPS["hc_eps"], ITERS, 2.0, nw, 1e-6)
        post, comb, _ = K.mhc_pre_triton(x, fn, sc, base, *pargs)  # the boundary's inputs
        engine_inputs = None
        for op_name in args.ops:
            boundary = (f, post, comb) if op_name == "post_pre" else None

            def errors_of(got, boundary=boundary):
                if boundary is None:
                    return check_pre(got, x, fn, sc, base, kw)
                return check(got, f, x, post, comb, fn, sc, base, kw)

            if not interpret:
                if boundary is None:
                    out = K.pre_outputs(x, T, H)

                    def planned(out=out):
                        return K.mhc_pre_triton(x, fn, sc, base, *pargs, out=out)
                else:
                    out = (torch.empty_like(x), *K.pre_outputs(x, T, H))

                    def planned(out=out):
                        return K.mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *pargs,
                                                     out=out)
                rows.append({"op": op_name, "T": T, "H": H, "tiling": "planned",
                             "errors": errors_of(planned()), "us": bench(planned)})
            for name, tiling in tilings.items():
                row = {"op": op_name, "T": T, "H": H, "tiling": name, "tile": tiling}
                try:
                    op = TmaOp(x, fn, sc, base, nw, tiling, num_sms, boundary)
                    row["errors"] = errors_of(op())
                    if not interpret:
                        row["us"] = bench(lambda op=op: op(split=False))
                        row["errors"] += errors_of(op.out)
                        rows.append({**row, "tiling": name + " + split", "split": True,
                                     "us": bench(op)})
                except Exception as err:  # noqa: BLE001 - a tiling that fails to compile or tile
                    row["errors"] = [f"{type(err).__name__}: {str(err)[:300]}"]
                if row["errors"]:
                    failures.append(f"{op_name} T={T} H={H} {name}: " + "; ".join(row["errors"]))
                    print("WRONG", failures[-1], file=sys.stderr, flush=True)
                rows.append(row)
                print(f"{op_name} T={T} H={H} {name}: "
                      + (f"{row['us']:.2f} us" if "us" in row else "checked")
                      + (" WRONG" if row["errors"] else ""), flush=True)
            if peers and engine_inputs is None:
                engine_inputs = bench_mhc.make_inputs(T, H, seed=1000 * H + T)
            time_engines(peers, op_name, T, H, engine_inputs, rows, bench)
        write()
    write()
    print(markdown(meta, rows, failures) if not interpret else json.dumps(
        {"checked": len(rows), "failures": failures}))
    if failures:
        print(f"FAILED: {len(failures)} tilings off the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
