"""mHC layer boundary: SGLang's and vLLM's TileLang kernels vs ours vs the eager torch reference.

Three ops of DSV4's hyper-connections (hc_mult 4, bf16 residual, fp32 parameters, Sinkhorn 20,
RMSNorm of the layer input fused as DSV4's boundaries call it): ``pre`` (mix the streams into the
sublayer input: SGLang ``mhc_pre`` vs our ``mhc_pre``), ``post`` (write the sublayer output back
into the streams: ``mhc_post`` vs ``mhc_post``) and ``post_pre`` (one whole boundary, post then
the next pre: ``mhc_fused_post_pre`` vs ``mhc_post_pre``). The torch provider is the model's
reference (``dsv4spec.model.mhc.hc_pre`` / ``hc_post``, plus the RMSNorm), run eagerly.

Method: for each op, width H and token count T, fresh random inputs (randn residual and sublayer
output, random fp32 parameters, ``post`` and ``comb`` from the reference pre of another random
residual, so ``comb`` is doubly stochastic); every provider's outputs are compared with the
reference before timing (max error recorded per output). "graph" is device time per call from a
CUDA graph of many calls (``do_bench_cudagraph``, median with p20/p80); "eager" is host wall time
per call of back-to-back eager calls with one synchronize at the end (all providers' loops
interleaved). The floor is the compulsory bytes (inputs read once, outputs written once) over the
measured copy bandwidth; in a graph the inputs stay L2-resident across replays while they fit in
the 60 MB L2 (the smaller T), so a call can beat the floor there. SGLang 0.5.23's
``mhc.py`` is its own file loaded by path (see ``dsv4spec.bench.sglang_mhc``); its TileLang
kernels compile at their first call (``first_call_ms``). vLLM 0.33.0's ``tilelang.py``
(``mhc_pre_tilelang``, ``mhc_post_tilelang``, ``mhc_fused_post_pre_tilelang``) runs the same way
from its source (see ``dsv4spec.bench.vllm_kernels``). Both engines' pre-norm GEMM is DeepGEMM's
where ``--deepgemm`` (default: where ``deep_gemm`` imports, as the engines decide) gives them
one, else their TileLang GEMM: each engine row's ``path`` and the record's ``deep_gemm`` say which.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import time
import traceback

import torch

from dsv4spec.bench import common, deepgemm, sglang_mhc, vllm_kernels
from dsv4spec.model import mhc as ref_mhc

HC = 4
MIX = (2 + HC) * HC
RMS_EPS = 1e-6
HC_EPS = 1e-6
NORM_EPS = 1e-6
SINKHORN_ITERS = 20
POST_MULT = 2.0
OPS = ("pre", "post", "post_pre")
PROVIDERS = ("sglang", "vllm", "ours", "torch")
WIDTHS = (4096, 7168)
TOKENS = (1, 4, 16, 32, 64, 256, 1024, 4096)
# one token count per SGLang kernel specialisation: FMA tile 2 and 3, the split-K pre and the
# multi-block post, the plain-GEMM pre and the one-block post
QUICK_TOKENS = (1, 16, 64, 4096)
OURS_NAMES = {"pre": "mhc_pre", "post": "mhc_post", "post_pre": "mhc_post_pre"}
COLUMNS = [
    "op", "H", "T", "sglang_graph_us", "vllm_graph_us", "ours_graph_us", "torch_graph_us",
    "floor_us", "sglang_eager_us", "vllm_eager_us", "ours_eager_us", "torch_eager_us",
    "ours_vs_sglang_graph", "ours_vs_vllm_graph", "ours_vs_sglang_eager", "ours_vs_vllm_eager",
    "ours_pct_floor", "sglang_kernels",
]
PROVIDER_COLUMNS = [
    "op", "H", "T", "provider", "graph_us", "graph_p20_us", "graph_p80_us", "eager_us",
    "eager_p20_us", "eager_p80_us", "kernels", "bytes", "floor_us", "pct_floor", "max_err",
    "first_call_ms", "path",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS), help="hidden sizes")
    parser.add_argument("--tokens", type=int, nargs="+", default=None, help="token counts T")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS),
                        help="mHC ops to time")
    parser.add_argument("--providers", nargs="+", default=list(PROVIDERS),
                        choices=list(PROVIDERS), help="implementations to time")
    parser.add_argument("--no-norm", action="store_true",
                        help="pre without the fused RMSNorm of the layer input (DSV4's "
                             "boundaries fuse it, the default)")
    parser.add_argument("--name", default=None,
                        help="results file stem (default: mhc, or mhc_quick with --quick)")
    deepgemm.add_argument(parser)


# ---------------------------------------------------------------------------------------------
# Bytes, inputs, the reference


def bytes_moved(op: str, T: int, H: int, norm: bool = True, hc: int = HC) -> int:
    """Compulsory bytes of one call: bf16 activations, fp32 parameters and mixes, bf16 norm
    weight, each input read once and each output written once."""
    mix = (2 + hc) * hc
    residual = T * hc * H * 2
    act = T * H * 2
    mixes = T * (hc + hc * hc) * 4  # post + comb
    params = mix * hc * H * 4 + (3 + mix) * 4 + (H * 2 if norm else 0)
    if op == "pre":  # residual, params -> post, comb, layer input
        return residual + params + mixes + act
    if op == "post":  # f, residual, post, comb -> residual'
        return act + residual + mixes + residual
    if op == "post_pre":  # f, residual, post, comb, params -> residual', post', comb', input
        return act + residual + mixes + params + residual + mixes + act
    raise ValueError(op)


def make_inputs(T: int, H: int, seed: int, device: str = "cuda") -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    inputs = {
        "residual": randn(T, HC, H).bfloat16(),
        "f": randn(T, H).bfloat16(),
        "fn": randn(MIX, HC * H) * 0.02,
        "scale": torch.rand(3, generator=g, device=device) + 0.5,
        "base": randn(MIX) * 0.5,
        "norm_weight": (torch.rand(H, generator=g, device=device) + 0.5).bfloat16(),
    }
    with torch.no_grad():  # the previous boundary's post and comb, from another residual
        _, post, comb = ref_mhc.hc_pre(randn(T, HC, H).bfloat16(), inputs["fn"], inputs["scale"],
                                       inputs["base"], norm_eps=RMS_EPS, hc_eps=HC_EPS,
                                       sinkhorn_iters=SINKHORN_ITERS)
    inputs["post"] = post.contiguous()
    inputs["post3"] = post.unsqueeze(-1)  # SGLang's fused boundary passes post as [T, hc, 1]
    inputs["comb"] = comb.contiguous()
    return inputs


def _rmsnorm(y: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    yf = y.float()
    return (yf * torch.rsqrt(yf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(
        y.dtype)


def torch_pre(residual, inp, norm: bool):
    y, post, comb = ref_mhc.hc_pre(residual, inp["fn"], inp["scale"], inp["base"],
                                   norm_eps=RMS_EPS, hc_eps=HC_EPS, sinkhorn_iters=SINKHORN_ITERS)
    if norm:
        y = _rmsnorm(y, inp["norm_weight"], NORM_EPS)
    return post, comb, y


def torch_provider(op: str, inp, norm: bool):
    if op == "pre":
        return lambda: torch_pre(inp["residual"], inp, norm)
    if op == "post":
        return lambda: ref_mhc.hc_post(inp["f"], inp["residual"], inp["post"], inp["comb"])

    def post_pre():
        residual = ref_mhc.hc_post(inp["f"], inp["residual"], inp["post"], inp["comb"])
        return (residual, *torch_pre(residual, inp, norm))

    return post_pre


# ---------------------------------------------------------------------------------------------
# Providers


def sglang_provider(peer, op: str, inp, norm: bool):
    kw = {"norm_weight": inp["norm_weight"], "norm_eps": NORM_EPS} if norm else {}
    mix_args = (RMS_EPS, HC_EPS, HC_EPS, POST_MULT, SINKHORN_ITERS)
    if op == "pre":
        return lambda: peer.mhc_pre(inp["residual"], inp["fn"], inp["scale"], inp["base"],
                                    *mix_args, **kw)
    if op == "post":
        return lambda: peer.mhc_post(inp["f"], inp["residual"], inp["post"], inp["comb"])
    return lambda: peer.mhc_fused_post_pre(inp["f"], inp["residual"], inp["post3"], inp["comb"],
                                           inp["fn"], inp["scale"], inp["base"], *mix_args, **kw)


def vllm_provider(peer, op: str, inp, norm: bool):
    kw = {"norm_weight": inp["norm_weight"], "norm_eps": NORM_EPS} if norm else {}
    mix_args = (RMS_EPS, HC_EPS, HC_EPS, POST_MULT, SINKHORN_ITERS)
    if op == "pre":
        return lambda: peer.mhc_pre(inp["residual"], inp["fn"], inp["scale"], inp["base"],
                                    *mix_args, **kw)
    if op == "post":
        return lambda: peer.mhc_post(inp["f"], inp["residual"], inp["post3"], inp["comb"])
    return lambda: peer.mhc_fused_post_pre(inp["f"], inp["residual"], inp["post3"], inp["comb"],
                                           inp["fn"], inp["scale"], inp["base"], *mix_args, **kw)


def ours_functions() -> dict[str, object]:
    """Our ops that exist (``dsv4spec.ops`` or ``dsv4spec.ops.mhc``), by benchmark op name."""
    found = {}
    for module_name in ("dsv4spec.ops", "dsv4spec.ops.mhc"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for op, name in OURS_NAMES.items():
            if op not in found and callable(getattr(module, name, None)):
                found[op] = getattr(module, name)
    return found


# parameter name (any of ours' spellings) -> input key or constant
_ALIASES = {
    "f": "f", "x": "f", "sublayer_out": "f", "out": "f", "layer_output": "f",
    "residual": "residual", "streams": "residual",
    "post": "post", "post_mix": "post", "post_layer_mix": "post",
    "comb": "comb", "comb_mix": "comb", "comb_res_mix": "comb",
    "fn": "fn", "hc_fn": "fn", "hc_scale": "scale", "scale": "scale", "hc_base": "base",
    "base": "base", "norm_weight": "norm_weight",
}
_CONSTANTS = {"rms_eps": RMS_EPS, "hc_eps": HC_EPS, "sinkhorn_iters": SINKHORN_ITERS,
              "post_mult": POST_MULT, "norm_eps": NORM_EPS}


def ours_provider(fn, op: str, inp, norm: bool):
    """Call ``fn`` by its parameter names (checked against its signature once, here)."""
    kwargs = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in ("norm_weight", "norm_eps") and not norm:
            continue
        if name in _ALIASES:
            kwargs[name] = inp[_ALIASES[name]]
        elif name in _CONSTANTS:
            kwargs[name] = _CONSTANTS[name]
        elif p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL,
                                                                     p.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__}: no benchmark input for parameter {name!r}")
    return lambda: fn(**kwargs)


def canonical(op: str, out, T: int, H: int) -> dict[str, torch.Tensor]:
    """Name a provider's outputs by their sizes: residual [T, hc, H], post [T, hc], comb
    [T, hc, hc], layer input [T, H] (SGLang's post comes as [T, hc, 1])."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    by_size = {T * HC * H: "residual", T * HC: "post", T * HC * HC: "comb", T * H: "input"}
    named = {}
    for t in outs:
        if isinstance(t, torch.Tensor) and t.numel() in by_size:
            name = by_size[t.numel()]
            shape = {"residual": (T, HC, H), "post": (T, HC), "comb": (T, HC, HC),
                     "input": (T, H)}[name]
            named[name] = t.reshape(shape)
    want = {"pre": {"post", "comb", "input"}, "post": {"residual"},
            "post_pre": {"residual", "post", "comb", "input"}}[op]
    if set(named) != want:
        raise RuntimeError(f"{op}: outputs {sorted(named)} (shapes "
                           f"{[tuple(t.shape) for t in outs]}), expected {sorted(want)}")
    return named


def max_errors(out: dict, ref: dict) -> dict[str, float]:
    """Max abs error per output, relative to the output's largest reference value."""
    errs = {}
    for name, r in ref.items():
        d = (out[name].double() - r.double()).abs().max().item()
        errs[name] = d / max(r.double().abs().max().item(), 1e-30)
    return errs


def check(provider: str, errs: dict[str, float]) -> None:
    """Refuse garbage (NaN or errors of 2 % of the range): a broken setup, not rounding."""
    bad = {k: v for k, v in errs.items() if not (v <= 0.02)}
    if bad:
        raise RuntimeError(f"{provider}: outputs differ from the reference: {bad}")


# ---------------------------------------------------------------------------------------------
# Derived columns, the wide table, the plot


def wide_rows(rows: list[dict], deep_gemm: bool = False) -> list[dict]:
    """One row per (op, H, T) with the providers side by side (SGLang's kernels those it
    launches with DeepGEMM's pre-norm GEMM where ``deep_gemm``)."""
    out = {}
    for r in rows:
        w = out.setdefault((r["op"], r["H"], r["T"]), {
            "op": r["op"], "H": r["H"], "T": r["T"], "floor_us": r["floor_us"],
            "sglang_kernels": sglang_mhc.sglang_kernels(r["op"], r["T"], r["H"],
                                                        deep_gemm=deep_gemm)})
        for k in ("graph_us", "eager_us"):
            if r.get(k) is not None:
                w[f"{r['provider']}_{k}"] = r[k]
    for w in out.values():
        for kind in ("graph", "eager"):
            for peer in ("sglang", "vllm"):
                s, o = w.get(f"{peer}_{kind}_us"), w.get(f"ours_{kind}_us")
                if s and o:
                    w[f"ours_vs_{peer}_{kind}"] = s / o  # > 1: ours faster
        if w.get("ours_graph_us"):
            w["ours_pct_floor"] = 100 * w["floor_us"] / w["ours_graph_us"]
    return list(out.values())


def plot(rows: list[dict], path, ops=OPS) -> bool:
    """Per op: device time in a CUDA graph (with the byte floor) and eager wall time per call."""
    plt = common.pyplot()
    if plt is None or not rows:
        return False
    ops = [op for op in ops if any(r["op"] == op for r in rows)]
    fig, axes = plt.subplots(2, len(ops), figsize=(6 * len(ops), 9), squeeze=False)
    widest = max(r["H"] for r in rows)
    colours = {"sglang": "C0", "vllm": "C3", "ours": "C1", "torch": "C2"}
    for j, op in enumerate(ops):
        for i, (column, what) in enumerate((("graph_us", "in a CUDA graph (device)"),
                                            ("eager_us", "eager, back-to-back (host wall)"))):
            ax = axes[i][j]
            for H in sorted({r["H"] for r in rows}):
                style = "-" if H == widest else "--"
                for provider, colour in colours.items():
                    pts = sorted((r["T"], r[column]) for r in rows
                                 if r["op"] == op and r["H"] == H and r["provider"] == provider
                                 and r.get(column) is not None)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", color=colour, linestyle=style,
                                label=f"{provider}, H={H}")
                if column == "graph_us":
                    pts = sorted({(r["T"], r["floor_us"]) for r in rows
                                  if r["op"] == op and r["H"] == H})
                    ax.plot(*zip(*pts), color="k", linestyle=style, alpha=0.5,
                            label=f"byte floor, H={H}")
            ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="µs per call",
                   title=f"mHC {op}: {what}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------


def _tilelang_version() -> str:
    try:
        return importlib.import_module("tilelang").__version__
    except Exception as err:  # noqa: BLE001 - any import failure just goes in the record
        return f"unavailable ({type(err).__name__})"


def write(args, name: str, record: dict, rows: list[dict], failures: list[str],
          png: bool = True) -> list:
    """JSON (everything), markdown (the wide table, then per provider) and the PNG."""
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and not math.isfinite(v):
                r[k] = None
    floor, copy_bw = record["launch_floor"], record["copy_bandwidth_Bps"]
    payload = {**record, "sinkhorn_iters": SINKHORN_ITERS, "hc_mult": HC,
               "eps": {"rms": RMS_EPS, "hc": HC_EPS, "norm": NORM_EPS},
               "sglang_call_sites": sglang_mhc.CALL_SITES, "failures": failures,
               "provider_rows": rows}
    notes = (f"Launch floor (empty Triton kernel): {floor['empty_kernel_graph_us']:.2f} µs in a "
             f"graph, {floor['empty_kernel_eager_us']:.2f} µs eager. Copy bandwidth "
             f"{copy_bw / 1e12:.2f} TB/s. µs per call (medians). `ours_vs_sglang` and "
             "`ours_vs_vllm` > 1: ours faster. "
             + (__doc__ or "").split("\n\n", 1)[1].replace("\n", " ")
             + (f"\n\nFailures: {'; '.join(failures)}" if failures else ""))
    wide = wide_rows(rows, record["deep_gemm"] != "off")
    paths = common.write_results(args.out, name, payload, wide, COLUMNS, notes=notes)
    with open(paths[1], "a") as md:
        md.write("\nPer provider (kernels launched per call; max error relative to the "
                 "reference's largest value; first call includes TileLang's compile):\n\n"
                 + common.markdown_table(rows, PROVIDER_COLUMNS) + "\n")
    path = paths[0].with_suffix(".png")
    if png and plot(rows, path, args.ops):
        paths.append(path)
    return paths


def main(args: argparse.Namespace) -> int:
    tokens = args.tokens or (QUICK_TOKENS if args.quick else TOKENS)
    rep_ms = 10 if args.quick else 20
    repeats = 5 if args.quick else 11
    norm = not args.no_norm
    name = args.name or ("mhc_quick" if args.quick else "mhc")
    env = common.environment()
    floor = common.launch_floor()
    copy_bw = common.copy_bandwidth()
    print(f"{env['device']}: empty kernel {floor['empty_kernel_graph_us']:.2f} µs in a graph, "
          f"{floor['empty_kernel_eager_us']:.2f} µs eager; copy {copy_bw / 1e12:.2f} TB/s",
          flush=True)
    engines = {"sglang", "vllm"} & set(args.providers)
    # each engine's pre-norm GEMM, as it decides (--deepgemm auto) or as asked
    dgs = {e: deepgemm.resolve(args.deepgemm, e) for e in sorted(engines)}
    dg = dgs.get("sglang", dgs.get("vllm"))
    peer = sglang_mhc.sglang_mhc_peer(dgs["sglang"]) if "sglang" in args.providers else None
    vllm_peer = vllm_kernels.vllm_mhc_peer(dgs["vllm"]) if "vllm" in args.providers else None
    print("engines' pre-norm GEMM: " + ", ".join(f"{e} {deepgemm.describe(m)}"
                                                  for e, m in dgs.items())
          + f" (--deepgemm {args.deepgemm})")
    ours = ours_functions() if "ours" in args.providers else {}
    missing = [OURS_NAMES[op] for op in args.ops if op not in ours]
    if "ours" in args.providers and missing:
        print(f"ours: skipped for {', '.join(missing)} (not in dsv4spec.ops yet)")
    env["tilelang"] = _tilelang_version() if peer is not None else "not loaded"
    env["sglang"] = str(sglang_mhc.sglang_version()) if peer is not None else "not loaded"
    if vllm_peer is not None and env["tilelang"] == "not loaded":
        env["tilelang"] = _tilelang_version()
    env["vllm"] = str(vllm_peer.version) if vllm_peer is not None else "not loaded"
    env["ours"] = ", ".join(f"{op}={getattr(f, '__module__', '?')}.{f.__name__}"
                            for op, f in ours.items()) or "absent"
    record = {"environment": env, "launch_floor": floor, "copy_bandwidth_Bps": copy_bw,
              "norm_fused": norm, "deep_gemm": deepgemm.describe(dg),
              "deep_gemm_by_engine": {e: deepgemm.describe(m) for e, m in dgs.items()}}
    rows, failures = [], []
    for op in args.ops:
        for H in args.widths:
            for T in tokens:
                inp = make_inputs(T, H, seed=1000 * H + T)
                ref = canonical(op, torch_provider(op, inp, norm)(), T, H)
                nbytes = bytes_moved(op, T, H, norm)
                fns, shape_rows = {}, []
                for provider in args.providers:
                    try:
                        if provider == "sglang":
                            if peer is None:
                                continue
                            fn = sglang_provider(peer, op, inp, norm)
                        elif provider == "vllm":
                            if vllm_peer is None:
                                continue
                            fn = vllm_provider(vllm_peer, op, inp, norm)
                        elif provider == "ours":
                            if op not in ours:
                                continue
                            fn = ours_provider(ours[op], op, inp, norm)
                        else:
                            fn = torch_provider(op, inp, norm)
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        out = fn()
                        torch.cuda.synchronize()
                        first_ms = (time.perf_counter() - start) * 1e3
                        out = fn()
                        torch.cuda.synchronize()
                        errs = max_errors(canonical(op, out, T, H), ref)
                        check(provider, errs)
                        timing = common.time_in_graph(fn, rep_ms=rep_ms)
                    except Exception as err:  # noqa: BLE001 - one provider's failure is recorded
                        msg = f"{op} H={H} T={T} {provider}: {type(err).__name__}: {err}"
                        print("FAILED " + msg)
                        if not failures:
                            traceback.print_exc()
                        failures.append(msg)
                        continue
                    fns[provider] = fn
                    shape_rows.append({
                        "op": op, "H": H, "T": T, "provider": provider,
                        "graph_us": timing["median_us"], "graph_p20_us": timing["p20_us"],
                        "graph_p80_us": timing["p80_us"], "bytes": nbytes,
                        "floor_us": nbytes / copy_bw * 1e6,
                        "pct_floor": 100 * nbytes / copy_bw * 1e6 / timing["median_us"],
                        "max_err": max(errs.values()), "errors": errs,
                        "first_call_ms": first_ms,
                        "path": (deepgemm.gemm_path(op, T, dgs[provider] is not None)
                                 if provider in ("sglang", "vllm") else None)})
                try:
                    eager = common.time_eager_side_by_side(fns, repeats=repeats) if fns else {}
                except Exception as err:  # noqa: BLE001
                    failures.append(f"{op} H={H} T={T} eager: {type(err).__name__}: {err}")
                    print("FAILED " + failures[-1])
                    eager = {}
                for r in shape_rows:
                    e = eager.get(r["provider"], {})
                    r.update(eager_us=e.get("median_us"), eager_p20_us=e.get("p20_us"),
                             eager_p80_us=e.get("p80_us"))
                rows += shape_rows
                print(f"{op} H={H} T={T}: " + ", ".join(
                    f"{r['provider']} {r['graph_us']:.2f}/{r['eager_us'] or float('nan'):.1f}"
                    for r in shape_rows) + f" µs (graph/eager); floor "
                    f"{nbytes / copy_bw * 1e6:.2f} µs", flush=True)
                write(args, name, record, rows, failures, png=False)  # survives a time limit
        write(args, name, record, rows, failures)
    # Kernel counts last: once the profiler (CUPTI) has run, later eager launches can pay for
    # its callbacks, so no timing follows it.
    for r in rows:
        try:
            inp = make_inputs(r["T"], r["H"], seed=1000 * r["H"] + r["T"])
            fn = {"sglang": lambda: sglang_provider(peer, r["op"], inp, norm),
                  "vllm": lambda: vllm_provider(vllm_peer, r["op"], inp, norm),
                  "ours": lambda: ours_provider(ours[r["op"]], r["op"], inp, norm),
                  "torch": lambda: torch_provider(r["op"], inp, norm)}[r["provider"]]()
            r["kernels"] = common.count_kernels(fn)
        except Exception as err:  # noqa: BLE001
            r["kernels"] = f"? ({type(err).__name__})"
    common.print_table(wide_rows(rows, dgs.get("sglang") is not None), COLUMNS)
    paths = write(args, name, record, rows, failures)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
