"""Our ops on the running Triton: each op the plugins launch, checked against float64, then its
device time in a CUDA graph and its eager cost, to set one Triton release beside another.

Ops: the mHC boundary (``mhc_post_pre``), ``mhc_pre`` and ``mhc_post`` (DSV4's fused RMSNorm of
the layer input on), ``hc_head_rmsnorm`` and ``hc_head``, at H = 4096 and 7168; the fused C128
rollback (31 fp32 states, half 512, ring 256, 4 drafts) at batch = T; the SGLang metadata
builders (``page_table``, ``c128``, ``compression``: T verify requests of 4 rows, 4K live tokens
of a 64K context; ``expand``: T requests, qo_len 4). Every output is checked first against a
float64 formulation (the mHC ops' and hc_head's references evaluated in float64 on the same
inputs; the rollback and the metadata bit for bit against their references, the metadata tables
over the extent the consumers read); a miss fails the run before anything is timed. "graph" is
device time per call from a CUDA graph of many calls (``do_bench_cudagraph``, median); "eager" is
host wall time per call of back-to-back calls with one synchronize at the end, through the cached
direct launch (``LaunchCache``) and through Triton's own ``kernel[grid](...)``;
``direct_launch`` says whether this Triton release has the direct path. One run writes
``<name>.json``/``.md``; ``--compare A.json B.json`` writes the two runs side by side (B / A per
column).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import triton

from dsv4spec.bench import common
from dsv4spec.integrations import tables
from dsv4spec.kernels import launch

WIDTHS = (4096, 7168)
TOKENS = (1, 4, 16, 32, 256)
OPS = ("boundary", "mhc_pre", "mhc_post", "hc_head_rmsnorm", "hc_head", "rollback",
       "page_table", "c128", "compression", "expand")
# The case of each op of dsv4spec.ops the plugins launch (the names their Gates give).
OP_CASES = {"mhc_post_pre": "boundary", "mhc_pre": "mhc_pre", "mhc_post": "mhc_post",
            "hc_head_rmsnorm": "hc_head_rmsnorm", "hc_head": "hc_head",
            "C128DraftCleanup": "rollback", "build_page_table_positions": "page_table",
            "init_compressed_attn_metadata": "c128",
            "build_compression_metadata": "compression", "expand_same_length": "expand"}
# Cases without a hidden size: T is their batch.
WIDTHLESS = ("rollback", "page_table", "c128", "compression", "expand")
METADATA_LIVE, METADATA_CAPACITY = 4096, 1 << 16
EPS = {"rms_eps": 1e-6, "hc_eps": 1e-6}
ITERS = 20
COLUMNS = ["op", "H", "T", "graph_us", "eager_us", "eager_dispatcher_us", "max_rel_err"]
# float64 agreement: fp32 mixes to 1e-4, bf16 outputs within 2 ulps of their largest value
RTOL = {"float32": 1e-4, "bfloat16": 8e-3}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                        help="hidden sizes H")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS),
                        help="token counts T (the batch of the rollback and the metadata cases)")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS),
                        help="ops to check and time")
    parser.add_argument("--name", default=None, help="results file stem (default: "
                        "stack_triton<M.m>)")
    parser.add_argument("--check-only", action="store_true",
                        help="the float64 checks alone, nothing timed (e.g. under "
                             "compute-sanitizer)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"),
                        default=None, help="write two runs side by side instead of measuring")


def _inputs(T: int, H: int, seed: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    from dsv4spec.bench.mhc import make_inputs

    return make_inputs(T, H, seed, device)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref64 = ref.double()
    return ((got.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1e-30)).item()


def _check(name: str, got, ref) -> float:
    worst = 0.0
    for i, (g, r) in enumerate(zip(got, ref)):
        err = _rel_err(g, r)
        if not err <= RTOL[str(g.dtype).removeprefix("torch.")]:
            raise AssertionError(f"{name}: output {i} is {err:.3g} off float64")
        worst = max(worst, err)
    return worst


def _as64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.double() for t in tensors]


def _metadata_case(op: str, T: int, seed: int, device: str = "cuda"):
    """``(call, None, check)`` for one metadata builder: ``check`` runs it and compares it bit for
    bit with its torch reference (the tables over the extent the consumers read)."""
    from dsv4spec.bench import metadata
    from dsv4spec.ops import attention_metadata as am

    if op == "expand":
        x = metadata.expand_inputs(T, metadata.DRAFTS, device, seed)
        kw = {"bs": T, "qo_len": metadata.DRAFTS}

        def call():
            return tuple(am.expand_same_length(x["shifted"], x["req_pool"], **kw)[1:])

        def check():
            ref = am.expand_same_length_reference(x["shifted"], x["req_pool"], **kw)
            metadata.expand_refcheck(op, call(), tuple(ref[1:]))

        return call, None, check
    capacity = METADATA_CAPACITY
    x = metadata.make_inputs(T, METADATA_LIVE, capacity, "verify", device, seed)
    kw = {"max_seq_len": capacity, "page_size": metadata.PAGE_SIZE,
          "swa_window": metadata.SWA_WINDOW}
    page_args = (x["req_to_token"], x["req_pool"], x["seq_lens"])
    page_table = am.build_page_table_positions_reference(*page_args, **kw).page_table
    call = metadata.providers(op, x, capacity, None, None, page_table)["dsv4spec"]
    if op == "page_table":
        def reference():
            return am.build_page_table_positions_reference(*page_args, **kw)
    elif op == "c128":
        def reference():
            return am.init_compressed_attn_metadata_reference(
                x["seq_lens"], x["positions"], x["out_loc"], page_table, metadata.PAGE_SIZE, True)
    else:
        def reference():
            return tuple(am.build_compression_metadata_reference(
                x["seq_lens"], x["out_loc"], page_table, x["swa"],
                page_size=metadata.PAGE_SIZE, index_topk=metadata.INDEX_TOPK))

    def check():
        metadata.refcheck(op, call(), reference(), x["seq_lens"], capacity)

    return call, None, check


def _case(op: str, T: int, H: int, seed: int, device: str = "cuda"):
    """``(call, float64 outputs, check)`` for one op at one size (the rollback on CUDA only)."""
    from dsv4spec import ops

    if op in ("page_table", "c128", "compression", "expand"):
        return _metadata_case(op, T, seed, device)
    if op == "rollback":
        from dsv4spec.bench.cleanup import Case

        case = Case(num_states=31, batch=T, num_draft=4, dtype=torch.float32, accept="random",
                    seed=seed)
        return case.run_fused, None, case.refcheck
    x = _inputs(T, H, seed, device)
    kw = {**EPS, "sinkhorn_iters": ITERS, "norm_weight": x["norm_weight"], "norm_eps": 1e-6}
    r, f, fn, sc, base = x["residual"], x["f"], x["fn"], x["scale"], x["base"]
    if op == "boundary":
        def call():
            return ops.mhc_post_pre(f, r, x["post"], x["comb"], fn, sc, base, **kw)
        # the pre of the boundary's own residual: a bf16 tie rounds either way (1 ulp)
        def ref(out):
            post = ops.mhc_post_reference(*_as64(f, r, x["post"], x["comb"]))
            pre = ops.mhc_pre_reference(out[0].double(), *_as64(fn, sc, base),
                                        **{**kw, "norm_weight": x["norm_weight"].double()})
            return (post, *pre)
    elif op == "mhc_pre":
        def call():
            return ops.mhc_pre(r, fn, sc, base, **kw)

        def ref(out):
            return ops.mhc_pre_reference(*_as64(r, fn, sc, base),
                                         **{**kw, "norm_weight": x["norm_weight"].double()})
    elif op == "mhc_post":
        def call():
            return (ops.mhc_post(f, r, x["post"], x["comb"]),)

        def ref(out):
            return (ops.mhc_post_reference(*_as64(f, r, x["post"], x["comb"])),)
    else:
        hc_fn, hc_scale, hc_base = fn[:4], sc[:1], base[:4]
        head_weight = x["norm_weight"].float()  # the draft's shared-head norm is fp32
        head = {"norm_eps": 1e-6, "hc_eps": 1e-6}
        if op == "hc_head":
            def call():
                return (ops.hc_head(r, hc_fn, hc_scale, hc_base, **head),)

            def ref(out):
                return (ops.hc_head_reference(*_as64(r, hc_fn, hc_scale, hc_base), **head),)
        else:
            def call():
                return (ops.hc_head_rmsnorm(r, hc_fn, hc_scale, hc_base, head_weight,
                                            **head),)

            def ref(out):
                return (ops.hc_head_rmsnorm_reference(
                    *_as64(r, hc_fn, hc_scale, hc_base, head_weight), **head),)
    return call, ref, None


def checked(op: str, T: int, H: int | None, seed: int,
            device: str = "cuda") -> tuple[Callable[[], object], float]:
    """Case ``op`` at (T, H) run once on ``device`` and checked against its reference (an
    ``AssertionError`` names what missed): its call, and the largest relative error off float64
    (0.0 for the cases checked bit for bit)."""
    call, ref, check = _case(op, T, H or 0, seed, device)
    if check is not None:  # the rollback, the metadata: bit for bit against their references
        check()
        return call, 0.0
    out = call()
    return call, _check(f"{op} H={H} T={T}", out, ref(out))


def measure(op: str, T: int, H: int, seed: int, timed: bool = True) -> dict:
    call, err = checked(op, T, H, seed)
    width = None if op in WIDTHLESS else H
    if not timed:
        call()  # a second call: the cached direct launch where this Triton has one
        torch.cuda.synchronize()
        return {"op": op, "H": width, "T": T, "max_rel_err": err}
    graph = common.time_in_graph(call)["median_us"]
    eager = common.time_eager(call)["median_us"]
    with launch.LaunchCache.disabled():
        dispatcher = common.time_eager(call)["median_us"]
    return {"op": op, "H": width, "T": T, "graph_us": graph, "eager_us": eager,
            "eager_dispatcher_us": dispatcher, "max_rel_err": err}


def compare(a: dict, b: dict) -> str:
    """Markdown of two runs: per (op, H, T), A's and B's times and B / A."""
    def label(run):
        e = run["environment"]
        return f"Triton {e['triton']}"

    rows_b = {(r["op"], r["H"], r["T"]): r for r in b["rows"]}
    la, lb = label(a), label(b)
    out = [f"# Our ops: {la} (A) and {lb} (B)", "",
           f"A: {json.dumps(a['environment'])}, direct launch {a['direct_launch']}", "",
           f"B: {json.dumps(b['environment'])}, direct launch {b['direct_launch']}", "",
           "| op | H | T | graph A us | graph B us | B / A | eager A us | eager B us | B / A | "
           "eager via Triton's dispatcher A / B us |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in a["rows"]:
        s = rows_b.get((r["op"], r["H"], r["T"]))
        if s is None:
            continue
        out.append(
            f"| {r['op']} | {r['H'] or '-'} | {r['T']} | {r['graph_us']:.2f} | "
            f"{s['graph_us']:.2f} | {s['graph_us'] / r['graph_us']:.2f} | {r['eager_us']:.1f} | "
            f"{s['eager_us']:.1f} | {s['eager_us'] / r['eager_us']:.2f} | "
            f"{r['eager_dispatcher_us']:.1f} / {s['eager_dispatcher_us']:.1f} |")
    return "\n".join(out) + "\n"


def main(args: argparse.Namespace) -> int:
    if args.compare is not None:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        text = compare(a, b)
        name = args.name or f"{args.compare[0].stem}_vs_{args.compare[1].stem}"
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{name}.md").write_text(text)
        print(text)
        return 0
    stack = tables.stack_of(triton.__version__)
    name = args.name or f"stack_triton{stack}"
    rows = []
    seed = 0
    for op in args.ops:
        for H in (args.widths if op not in WIDTHLESS else [None]):
            for T in args.tokens:
                seed += 1
                row = measure(op, T, H or 0, seed, timed=not args.check_only)
                rows.append(row)
                if args.check_only:
                    print(f"{op} H={H} T={T}: err {row['max_rel_err']:.2g} ok", flush=True)
                    continue
                print(f"{op} H={H} T={T}: graph {row['graph_us']:.2f} us, eager "
                      f"{row['eager_us']:.1f} us (dispatcher {row['eager_dispatcher_us']:.1f}), "
                      f"err {row['max_rel_err']:.2g}", flush=True)
    if args.check_only:
        return 0
    payload = {"environment": common.environment(), "direct_launch": launch.direct_launch_layout()}
    common.write_results(args.out, name, payload, rows, COLUMNS)
    common.print_table(rows, COLUMNS)
    return 0
