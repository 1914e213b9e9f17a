"""mhc_pre and the boundary between decode and prefill sizes (17-512 tokens, where DeepGEMM's path
is faster than the planned tilings): the plan beside the other tensor-core tilings (tokens as
rows, rows (t, i)) and the finalize as a programmatic dependent launch past 16 tokens, and beside
the engines' DeepGEMM path, in one run. Each tiling is checked against the float64 references
first (the boundary as tests/ops/test_mhc.py's assert_boundary_close does, mhc_pre's post and
comb within 1e-5 and its layer input within 2 ulps), then timed in a CUDA graph
(triton.testing.do_bench_cudagraph, median) on fresh random inputs per shape; its outputs are
checked again after the replays.

    PYTHONPATH=src python3 scripts/mhc_mid_t_ab.py OUT_DIR [--tokens ...] [--widths ...]
        [--engines vllm sglang] [--seconds N]

The engines' peers run with DeepGEMM on (``deep_gemm``, TileLang and the engines' source as
``scripts/deepgemm_gpu.sh`` sets them up; its ``mid-t`` step runs this program); a peer that
cannot load is left out with a line saying why. Writes OUT_DIR/mhc_mid_t_ab.json and .md (the
best tiling per point and its ratio to the faster engine) and exits non-zero if any tiling's
outputs are off the references. ``--interpret`` (with TRITON_INTERPRET=1, on a CPU): the
correctness part alone at a tiny width, no timing and no engines (the tensor-core tilings only
where the interpreter multiplies bf16 dots as numbers: tests/conftest.py makes Triton 3.6's do).
"""

import argparse
import itertools
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mhc_triton38_ab import EPS, ITERS, _off, check, make_inputs  # noqa: E402

from dsv4spec.bench import mhc as bench_mhc  # noqa: E402
from dsv4spec.kernels import mhc as K  # noqa: E402
from dsv4spec.kernels.mhc import mhc_post_pre_triton, mhc_pre_triton  # noqa: E402
from dsv4spec.ops import mhc_pre_reference  # noqa: E402

TOKENS = (17, 32, 33, 48, 64, 128, 256, 512)
WIDTHS = (7168, 4096)
OPS = ("post_pre", "pre")


def candidates(T: int) -> dict:
    """Tiling overrides by name; the planner's own first."""
    out = {"planned": {},
           "token rows t64 k32": {"mma": True, "token_rows": True, "block_t": 64, "block_k": 32,
                                  "warps": (4, 1), "stages": 3, "presplit": False},
           "rows (t, i) t16 k64": {"mma": True, "token_rows": False, "block_t": 16,
                                   "block_k": 64, "warps": (4, 1),
                                   "num_splits": 2 * 132 // triton.cdiv(T, 64)}}
    if T <= 64:  # the CUDA-core plan: its finalize as a dependent launch past PDL_MAX_TOKENS
        out["planned pdl"] = {"pdl": True}
    return out


def check_pre(got, x, fn, sc, base, kw) -> list[str]:
    ref = mhc_pre_reference(x, fn, sc, base, **kw)
    errors = {"post": _off(got[0], ref[0]), "comb": _off(got[1], ref[1]),
              "layer_input": _off(got[2], ref[2], 2)}
    return [f"{k}: {v}" for k, v in errors.items() if v]


def engine_peers(engines) -> dict:
    """engine -> (its mHC kernels, loaded once with DeepGEMM on, bench mhc's provider for them);
    an engine whose kernels cannot load is left out with a line saying why."""
    from dsv4spec.bench import deepgemm, sglang_mhc, vllm_kernels

    peers = {}
    for engine in engines:
        try:
            dg = deepgemm.resolve("on", engine)
            if engine == "vllm":
                peer, make = vllm_kernels.vllm_mhc_peer(dg), bench_mhc.vllm_provider
            else:
                peer, make = sglang_mhc.sglang_mhc_peer(dg), bench_mhc.sglang_provider
            if peer is None:
                raise RuntimeError("its mHC kernels could not be loaded")
            peers[engine] = (peer, make)
        except Exception as err:  # noqa: BLE001 - a peer that cannot load is left out
            print(f"{engine}: left out ({type(err).__name__}: {err})", flush=True)
    return peers


def markdown(meta: dict, rows: list[dict], failures: list[str]) -> str:
    lines = [f"# mhc_pre and the boundary at 17-512 tokens, CUDA graph median (µs): "
             f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}; engines with "
             f"DeepGEMM on", "",
             "| op | H | T | faster engine | planned | best of ours | its tiling | "
             "faster engine / best |", "|---|---|---|---|---|---|---|---|"]
    points = sorted({(r["op"], r["H"], r["T"]) for r in rows})
    for op, H, T in points:
        here = [r for r in rows if (r["op"], r["H"], r["T"]) == (op, H, T) and "us" in r]
        engines = [r for r in here if r["tiling"] in ("vllm", "sglang")]
        ours = [r for r in here if r["tiling"] not in ("vllm", "sglang") and not r["errors"]]
        planned = next((r["us"] for r in ours if r["tiling"] == "planned"), None)
        best = min(ours, key=lambda r: r["us"], default=None)
        eng = min((r["us"] for r in engines), default=None)
        ratio = f"{eng / best['us']:.2f}x" if eng and best else "-"
        lines.append(f"| {op} | {H} | {T} | {eng if eng else '-'} | "
                     f"{planned if planned else '-'} | {best['us'] if best else '-'} | "
                     f"{best['tiling'] if best else '-'} | {ratio} |")
    lines += ["", "Every tiling's row (with its plan) is in the JSON beside this file."]
    lines += [f"- FAILURE {s}" for s in failures]
    return "\n".join(lines) + "\n"


def time_engines(peers: dict, op: str, T: int, H: int, inputs, rows: list, bench) -> None:
    """A row per engine peer of ``op`` at (T, H) on bench mhc's ``inputs``; a peer that fails
    is said and left out."""
    for engine, (peer, make) in peers.items():
        try:
            us = bench(make(peer, op, inputs, True))
            rows.append({"op": op, "T": T, "H": H, "tiling": engine, "us": us, "errors": []})
            print(f"{op} T={T} H={H} {engine}: {us:.2f} us", flush=True)
        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
            print(f"{op} T={T} H={H} {engine}: failed ({err})", flush=True)


def ab_parser(description: str) -> argparse.ArgumentParser:
    """The options this program and mhc_tma_ab.py share."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--engines", nargs="*", default=["vllm"], choices=["vllm", "sglang"])
    ap.add_argument("--rep", type=int, default=10, help="do_bench_cudagraph's rep (ms)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="time no new point after this many seconds")
    ap.add_argument("--interpret", action="store_true",
                    help="correctness only, tiny width, on the CPU (TRITON_INTERPRET=1)")
    return ap


def ab_run(ap: argparse.ArgumentParser, args, stem: str, markdown_of):
    """Checks the machine against ``args`` (a CUDA GPU and OUT_DIR, or the interpreter) and
    returns ``(device, meta, rows, failures, write, bench)``: ``write()`` puts the rows so far in
    OUT_DIR/<stem>.json and .md (``markdown_of(meta, rows, failures)``), ``bench(fn)`` is fn's
    CUDA-graph median in µs after one call."""
    interpret = args.interpret
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--interpret needs TRITON_INTERPRET=1")
    if not interpret and (args.out_dir is None or not torch.cuda.is_available()):
        ap.error("needs OUT_DIR and a CUDA GPU (or --interpret)")
    start = time.time()
    rows, failures = [], []
    meta = {"torch": torch.__version__, "triton": triton.__version__,
            "device": "interpreter" if interpret else torch.cuda.get_device_name(),
            "rep_ms": args.rep}

    def write() -> None:
        if not args.out_dir:
            return
        os.makedirs(args.out_dir, exist_ok=True)
        meta["seconds"] = round(time.time() - start, 1)
        with open(os.path.join(args.out_dir, stem + ".json"), "w") as fh:
            json.dump({"meta": meta, "rows": rows, "failures": failures}, fh, indent=1)
        with open(os.path.join(args.out_dir, stem + ".md"), "w") as fh:
            fh.write(markdown_of(meta, rows, failures))

    def bench(fn) -> float:
        fn()
        torch.cuda.synchronize()
        return round(1e3 * triton.testing.do_bench_cudagraph(fn, rep=args.rep,
                                                             return_mode="median"), 3)

    return "cpu" if interpret else "cuda", meta, rows, failures, write, bench


def main(argv=None) -> int:
    ap = ab_parser(__doc__.splitlines()[0])
    args = ap.parse_args(argv)
    interpret = args.interpret
    device, meta, rows, failures, write, bench = ab_run(ap, args, "mhc_mid_t_ab", markdown)
    start = time.time()
    device_index = -1 if interpret else torch.cuda.current_device()
    tokens, widths = ((17, 40), (72,)) if interpret else (args.tokens, args.widths)

    peers = {} if interpret else engine_peers(args.engines)
    stopped = False
    for T, H in itertools.product(tokens, widths):
        if stopped:
            break
        x, fn, sc, base, nw, f = make_inputs(T, H, device, seed=1000 * T + H,
                                             weight_dtype=torch.bfloat16)
        kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": nw, "norm_eps": 1e-6}
        pargs = (EPS["rms_eps"], EPS["hc_eps"], ITERS, 2.0, nw, 1e-6)
        post, comb, _ = mhc_pre_triton(x, fn, sc, base, *pargs)  # the boundary's inputs
        engine_inputs = None
        for op in args.ops:
            if args.seconds is not None and time.time() - start > args.seconds:
                print(f"past --seconds: {op} H={H} T={T} and after not timed", flush=True)
                stopped = True
                break
            seen = {}
            for name, ov in candidates(T).items():
                if interpret and (ov.get("pdl") or (
                        ov.get("mma") and not K.interpreter_multiplies_bf16())):
                    continue  # no PDL on a CPU; bf16 dots only where the interpreter can
                cfg = K.plan(T, H, device_index, dtype=torch.bfloat16,
                             boundary=op == "post_pre", **ov)
                if cfg in seen:  # the same tiling as an earlier name
                    continue
                seen[cfg] = name
                if op == "post_pre":
                    out = (torch.empty_like(x), x.new_empty((T, 4), dtype=torch.float32),
                           x.new_empty((T, 4, 4), dtype=torch.float32),
                           torch.empty_like(f))

                    def call(ov=ov, out=out):
                        return mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *pargs,
                                                   out=out, **ov)

                    def errors_of(got):
                        return check(got, f, x, post, comb, fn, sc, base, kw)
                else:
                    out = (x.new_empty((T, 4), dtype=torch.float32),
                           x.new_empty((T, 4, 4), dtype=torch.float32), torch.empty_like(f))

                    def call(ov=ov, out=out):
                        return mhc_pre_triton(x, fn, sc, base, *pargs, out=out, **ov)

                    def errors_of(got):
                        return check_pre(got, x, fn, sc, base, kw)
                row = {"op": op, "T": T, "H": H, "tiling": name, "overrides": repr(ov),
                       "plan": cfg._asdict()}
                try:
                    row["errors"] = errors_of(call())
                    if not interpret:
                        row["us"] = bench(call)
                        row["errors"] += errors_of(out)  # after the replays
                except Exception as err:  # noqa: BLE001 - a tiling that fails to compile
                    row["errors"] = [f"{type(err).__name__}: {str(err)[:300]}"]
                if row["errors"]:
                    failures.append(f"{op} T={T} H={H} {name}: " + "; ".join(row["errors"]))
                    print("WRONG", failures[-1], file=sys.stderr, flush=True)
                rows.append(row)
                print(f"{op} T={T} H={H} {name}: " + (f"{row['us']:.2f} us" if "us" in row
                                                     else "checked")
                      + (" WRONG" if row["errors"] else ""), flush=True)
            if peers and engine_inputs is None:  # bench mhc's inputs, made once per point
                engine_inputs = bench_mhc.make_inputs(T, H, seed=1000 * H + T)
            time_engines(peers, op, T, H, engine_inputs, rows, bench)
            write()
    write()  # also where --seconds stopped the run before its first point
    print(markdown(meta, rows, failures) if not interpret else json.dumps(meta))
    if failures:
        print(f"FAILED: {len(failures)} tilings off the references", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
