"""hc_head: eager ATen chain vs capture-compiled vs fused Triton (+ RMSNorm), graph and eager.

Method: for each width H and token count T, fresh random bf16 inputs (randn) and random fp32
parameters; every provider's output is checked against the reference before any timing; device
time per call comes from ``time_in_graph`` (many calls in one CUDA graph, median with p20/p80; the
inputs stay L2-resident across replays for T <= 256, as the draft's input does right after the
previous layer wrote it). The "compiled" provider is warmed up (compiled) under ``capture_mode()``
and timed inside it, so the graph records the Inductor kernels. Bytes moved count the compulsory
traffic: x read once, the parameters read once, y written once. ``eager_us`` is the host wall
time per call of back-to-back eager calls (one synchronize at the end), outside ``capture_mode()``.
With ``--peer sglang``, SGLang 0.5.23's own ``fused_hc_head`` (its file, loaded by path) is timed
the same way. With ``--peer vllm``, vLLM 0.33.0's own ``hc_head_fused_kernel_tilelang`` (its
``tilelang.py`` and TileLang kernels, loaded by path from vLLM's source: see
``dsv4spec.bench.vllm_kernels``) is timed alone ("vllm") and followed by the shared-head RMSNorm
as a separate call ("vllm+norm", the unfused pair vLLM's model runs; the norm here is the bench's
torch RMSNorm, not vLLM's own Triton one). Each peer loads only where its source (and, for vLLM,
TileLang and a CUDA device) is found; otherwise the bench runs without it and says so in one line.
vLLM's outputs are checked against the float64 reference; ``vllm_over_triton`` is vLLM's time
over ours (its "+norm" row over ``triton+norm``), > 1 where ours is faster.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

import torch

from dsv4spec.bench import common, vllm_kernels
from dsv4spec.capture import capture_mode
from dsv4spec.model.model import rms_norm
from dsv4spec.ops.hc_head import (
    hc_head,
    hc_head_reference,
    hc_head_rmsnorm,
    hc_head_rmsnorm_reference,
)

HC = 4
EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}
WIDTHS = (4096, 7168)
TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_TOKENS = (1, 4, 64, 1024)
# provider -> (impl, with the shared-head RMSNorm)
PROVIDERS = {
    "eager": ("eager", False),
    "compiled": ("compiled", False),
    "triton": ("triton", False),
    "eager+norm": ("eager", True),
    "triton+norm": ("triton", True),
}
# provider -> (peer, with the shared-head RMSNorm); a peer's providers run with --peer <peer>.
# "sglang": SGLang 0.5.23's fused_hc_head (its own file, loaded by path); "vllm": vLLM 0.33.0's
# hc_head_fused_kernel_tilelang, "vllm+norm": it, then the RMSNorm as a separate call.
PEER_PROVIDERS = {"sglang": ("sglang", False), "vllm": ("vllm", False),
                  "vllm+norm": ("vllm", True)}
PEERS = ("sglang", "vllm")
# Each peer's columns: its time over ours, in a graph and eager.
PEER_COLUMNS = {
    "sglang": ["sglang_over_triton", "sglang_over_triton_eager"],
    "vllm": ["vllm_over_triton", "vllm_over_triton_eager"],
}
COLUMNS = [
    "H", "T", "provider", "median_us", "p20_us", "p80_us", "eager_us", "kernels", "bytes",
    "GB/s", "pct_copy_bw", "speedup_vs_eager", "triton_over_compiled", "norm_overhead_us",
    *(column for columns in PEER_COLUMNS.values() for column in columns),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS), help="hidden sizes")
    parser.add_argument("--tokens", type=int, nargs="+", default=None, help="token counts T")
    parser.add_argument("--providers", nargs="+", default=list(PROVIDERS),
                        choices=list(PROVIDERS), help="our providers to run (default: all)")
    parser.add_argument("--peer", choices=list(PEERS), nargs="*", default=[],
                        help="also time SGLang's fused_hc_head (loaded from its installed source "
                             "or DSV4SPEC_SGLANG_ROOT) and/or vLLM's hc_head TileLang kernel "
                             f"(from vLLM's source: {vllm_kernels.SRC_ENV}, .vllm-src/ or an "
                             "installed vllm; TileLang and a CUDA device needed)")


def bytes_moved(T: int, H: int, elt: int, rmsnorm: bool = False, hc: int = HC) -> int:
    """Compulsory bytes: read x [T, hc, H] and the fp32 parameters, write y [T, H]."""
    params = 4 * (hc * hc * H + 1 + hc + (H if rmsnorm else 0))
    return T * hc * H * elt + params + T * H * elt


def make_inputs(T: int, H: int, dtype=torch.bfloat16, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, HC, H, generator=g, device=device).to(dtype)
    hc_fn = torch.randn(HC, HC * H, generator=g, device=device) * 0.02
    hc_scale = torch.rand(1, generator=g, device=device) + 0.5
    hc_base = torch.randn(HC, generator=g, device=device) * 0.5
    norm_weight = torch.rand(H, generator=g, device=device) + 0.5
    return x, hc_fn, hc_scale, hc_base, norm_weight


def vllm_peer() -> object | None:
    """vLLM's mHC kernels (``hc_head`` among them), or None with a one-line message where they
    cannot run here (no CUDA device, no vLLM source, no TileLang)."""
    if not torch.cuda.is_available():
        print("vllm peer: skipped, no CUDA device (vLLM's hc_head is a TileLang CUDA kernel)")
        return None
    return vllm_kernels.vllm_mhc_peer()


def load_peers(names: Sequence[str]) -> dict[str, object]:
    """The peers named in ``names`` that load here, by name; each one that does not is left out
    (its loader prints why, in one line)."""
    loaders = {"sglang": lambda: common.sglang_peer("kernels/ops/layernorm/mhc_head.py"),
               "vllm": vllm_peer}
    peers = {name: loaders[name]() for name in PEERS if name in names}
    return {name: peer for name, peer in peers.items() if peer is not None}


def peer_providers(peers: Sequence[str]) -> list[str]:
    """The providers of the loaded ``peers``, in :data:`PEER_PROVIDERS` order."""
    return [provider for provider, (peer, _) in PEER_PROVIDERS.items() if peer in peers]


def peer_of(provider: str, peers: dict[str, object]) -> object | None:
    """The loaded peer ``provider`` calls, or None for our providers."""
    return peers.get(PEER_PROVIDERS[provider][0]) if provider in PEER_PROVIDERS else None


def float64_reference(inputs, rmsnorm: bool) -> torch.Tensor:
    """hc_head (then the RMSNorm where ``rmsnorm``) of ``inputs`` in float64, unrounded."""
    x, hc_fn, hc_scale, hc_base, nw = (t.double() for t in inputs)
    if rmsnorm:
        return hc_head_rmsnorm_reference(x, hc_fn, hc_scale, hc_base, nw, **EPS)
    return hc_head_reference(x, hc_fn, hc_scale, hc_base, **EPS)


def setup(provider: str, inputs, peer=None) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    """The callable that runs ``provider`` once on ``inputs``, and the reference output.

    ``peer`` is the loaded peer a peer provider calls: SGLang's ``mhc_head.py`` module for
    "sglang", vLLM's kernels (:func:`vllm_peer`) for "vllm" and "vllm+norm".
    """
    impl, rmsnorm = {**PROVIDERS, **PEER_PROVIDERS}[provider]
    x, hc_fn, hc_scale, hc_base, nw = inputs
    if impl == "sglang":
        ref = hc_head_reference(x, hc_fn, hc_scale, hc_base, **EPS)
        return lambda: peer.fused_hc_head(x, hc_fn, hc_scale, hc_base, **EPS), ref
    if impl == "vllm":
        # vLLM's call (nvidia/model.py, nvidia/mtp.py): rms_eps then hc_eps, positionally
        eps = (EPS["norm_eps"], EPS["hc_eps"])
        if rmsnorm:  # vLLM's model norms hc_head's bf16 output in a separate kernel
            return (lambda: rms_norm(peer.hc_head(x, hc_fn, hc_scale, hc_base, *eps), nw,
                                     EPS["norm_eps"]),
                    float64_reference(inputs, rmsnorm=True))
        return (lambda: peer.hc_head(x, hc_fn, hc_scale, hc_base, *eps),
                float64_reference(inputs, rmsnorm=False))
    if rmsnorm:
        ref = hc_head_rmsnorm_reference(x, hc_fn, hc_scale, hc_base, nw, **EPS)
        return lambda: hc_head_rmsnorm(x, hc_fn, hc_scale, hc_base, nw, **EPS, impl=impl), ref
    ref = hc_head_reference(x, hc_fn, hc_scale, hc_base, **EPS)
    return lambda: hc_head(x, hc_fn, hc_scale, hc_base, **EPS, impl=impl), ref


def refcheck(provider: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """Raise ``RuntimeError`` unless ``out`` is within bf16 rounding of ``ref``."""
    # bf16: one ulp (two with the norm, which carries y's rounding into its own); the ulp of v
    # is at most 2**-7 * |v|, plus fp32 summation noise near zero.
    ulps = 2 if {**PROVIDERS, **PEER_PROVIDERS}[provider][1] else 1
    diff = (out.float() - ref.float()).abs()
    bad = diff > ulps * 2**-7 * ref.float().abs() + 1e-5 * ref.float().abs().max()
    if bad.any():
        raise RuntimeError(f"refcheck failed for {provider}: {int(bad.sum())} elements, "
                           f"max abs diff {diff.max().item():.3g}")


def derive(rows: list[dict], copy_bw: float) -> list[dict]:
    """Add GB/s, % of copy bandwidth, speedups and the norm's overhead to timed rows."""
    by = {(r["H"], r["T"], r["provider"]): r for r in rows}
    for r in rows:
        key = (r["H"], r["T"])
        r["GB/s"] = r["bytes"] / (r["median_us"] * 1e-6) / 1e9
        r["pct_copy_bw"] = 100.0 * r["GB/s"] * 1e9 / copy_bw
        eager = by.get((*key, "eager+norm" if r["provider"].endswith("+norm") else "eager"))
        if eager is not None:
            r["speedup_vs_eager"] = eager["median_us"] / r["median_us"]
        compiled = by.get((*key, "compiled"))
        if r["provider"] == "triton" and compiled is not None:
            r["triton_over_compiled"] = r["median_us"] / compiled["median_us"]
        fused = by.get((*key, "triton"))
        if r["provider"] == "triton+norm" and fused is not None:
            r["norm_overhead_us"] = r["median_us"] - fused["median_us"]
            r["norm_overhead_pct"] = 100 * r["norm_overhead_us"] / fused["median_us"]
        if r["provider"] == "sglang" and fused is not None:
            r["sglang_over_triton"] = r["median_us"] / fused["median_us"]
            r["sglang_over_triton_eager"] = r["eager_us"] / fused["eager_us"]
        # vLLM's rows over ours doing the same work: "vllm" over "triton", "vllm+norm" over
        # "triton+norm"
        ours = (by.get((*key, r["provider"].replace("vllm", "triton", 1)))
                if r["provider"] in ("vllm", "vllm+norm") else None)
        if ours is not None:
            r["vllm_over_triton"] = r["median_us"] / ours["median_us"]
            if r.get("eager_us") is not None and ours.get("eager_us") is not None:
                r["vllm_over_triton_eager"] = r["eager_us"] / ours["eager_us"]
    return rows


def table_columns(rows: list[dict]) -> list[str]:
    """:data:`COLUMNS` less the columns of peers with no row in ``rows``."""
    present = {PEER_PROVIDERS[r["provider"]][0] for r in rows if r["provider"] in PEER_PROVIDERS}
    absent = {column for peer, columns in PEER_COLUMNS.items() if peer not in present
              for column in columns}
    return [column for column in COLUMNS if column not in absent]


def check_targets(rows: list[dict], H: int = 7168) -> dict[str, bool]:
    """hc_head's performance targets, each met or missed: the fused kernel's eager time per call
    and its time in a CUDA graph, its lead over SGLang's ``fused_hc_head`` and the RMSNorm's
    overhead. Each holds at width ``H`` (at every width where its name says so) over the token
    counts that were measured; a target with no measured row counts as missed."""
    def col(provider, cond, value, limit, width=H):
        vals = [r.get(value) for r in rows
                if (width is None or r["H"] == width) and r["provider"] == provider and cond(r)]
        return bool(vals) and all(v is not None and limit(v) for v in vals)

    return {
        "triton eager <= 30 us, H = 7168, T <= 64": col(
            "triton", lambda r: r["T"] <= 64, "eager_us", lambda v: v <= 30),
        "triton eager never slower than sglang, every H and T": col(
            "sglang", lambda r: True, "sglang_over_triton_eager", lambda v: v >= 1, width=None),
        "triton <= 3.0 us in a graph, T = 1": col(
            "triton", lambda r: r["T"] == 1, "median_us", lambda v: v <= 3.0),
        "triton <= 30 us in a graph, T = 1024": col(
            "triton", lambda r: r["T"] == 1024, "median_us", lambda v: v <= 30),
        "triton >= 4x faster than sglang in a graph, T >= 64": col(
            "sglang", lambda r: r["T"] >= 64, "sglang_over_triton", lambda v: v >= 4,
            width=None),
        "norm overhead <= 10 %, every T": col(
            "triton+norm", lambda r: True, "norm_overhead_pct", lambda v: v <= 10),
    }


def plot(rows: list[dict], path) -> bool:
    """Two panels: device time in a CUDA graph, and eager wall time per call (host included)."""
    plt = common.pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    widest = max(r["H"] for r in rows)
    for ax, column, what in ((axes[0], "median_us", "in a CUDA graph (device time)"),
                             (axes[1], "eager_us", "eager, back-to-back (host wall)")):
        providers = list(dict.fromkeys(r["provider"] for r in rows))
        for H in sorted({r["H"] for r in rows}):
            for i, provider in enumerate(providers):
                pts = sorted((r["T"], r[column]) for r in rows
                             if r["H"] == H and r["provider"] == provider
                             and r.get(column) is not None)
                if pts:  # one colour per provider, solid for the widest H
                    ax.plot(*zip(*pts), marker="o", label=f"{provider}, H={H}", color=f"C{i}",
                            linestyle="-" if H == widest else "--")
        ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="µs per call",
               title=f"hc_head, hc_mult 4, bf16: {what}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(args: argparse.Namespace) -> int:
    tokens = args.tokens or (QUICK_TOKENS if args.quick else TOKENS)
    rep_ms = 10 if args.quick else 30
    env = common.environment()
    floor = common.launch_floor()
    copy_bw = common.copy_bandwidth()
    print(f"{env['device']}: empty kernel {floor['empty_kernel_graph_us']:.2f} µs in a graph, "
          f"{floor['empty_kernel_eager_us']:.2f} µs eager; copy {copy_bw / 1e12:.2f} TB/s",
          flush=True)
    peers = load_peers(args.peer)
    if "vllm" in peers:
        env["vllm"] = str(peers["vllm"].version)
    providers = [*args.providers, *peer_providers(peers)]
    rows = []
    for H in args.widths:
        for T in tokens:
            inputs = make_inputs(T, H, seed=T)
            elt = inputs[0].element_size()
            fns = {}
            for provider in providers:
                fn, ref = setup(provider, inputs, peer_of(provider, peers))
                with capture_mode():  # only "compiled" cares: compile in the warm-up, then capture
                    for _ in range(2):
                        out = fn()
                    torch.cuda.synchronize()
                    refcheck(provider, out, ref)
                    timing = common.time_in_graph(fn, rep_ms=rep_ms)
                fns[provider] = fn
                rmsnorm = {**PROVIDERS, **PEER_PROVIDERS}[provider][1]
                rows.append({"H": H, "T": T, "provider": provider, **timing,
                             "bytes": bytes_moved(T, H, elt, rmsnorm)})
            # Eager: outside capture_mode(), as an eager caller runs it ("compiled" is then the
            # eager reference, by design); all providers side by side, loops interleaved.
            eager = common.time_eager_side_by_side(fns, repeats=5 if args.quick else 15)
            for r in rows[-len(providers):]:
                r["eager_us"] = eager[r["provider"]]["median_us"]
                r["eager_p20_us"] = eager[r["provider"]]["p20_us"]
                r["eager_p80_us"] = eager[r["provider"]]["p80_us"]
            print(f"H={H} T={T}: " + ", ".join(
                f"{r['provider']} {r['median_us']:.1f}/{r['eager_us']:.1f}"
                for r in rows[-len(providers):]) + " µs (graph/eager)", flush=True)
    # Kernel counts last: once the profiler (CUPTI) has run in a process, later eager launches
    # can pay for its callbacks, so no eager timing follows it.
    for r in rows:
        fn, _ = setup(r["provider"], make_inputs(r["T"], r["H"], seed=r["T"]),
                      peer_of(r["provider"], peers))
        with capture_mode():
            r["kernels"] = common.count_kernels(fn)
    derive(rows, copy_bw)
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and not math.isfinite(v):
                r[k] = None
    targets = check_targets(rows)
    columns = table_columns(rows)
    common.print_table(rows, columns)
    for name, ok in targets.items():
        print(f"target {'met' if ok else 'MISSED'}: {name}")
    payload = {"environment": env, "launch_floor": floor, "copy_bandwidth_Bps": copy_bw,
               "targets_H7168": targets}
    notes = (f"Launch floor (empty Triton kernel): {floor['empty_kernel_graph_us']:.2f} µs in a "
             f"graph, {floor['empty_kernel_eager_us']:.2f} µs eager. Copy bandwidth "
             f"{copy_bw / 1e12:.2f} TB/s. "
             + (__doc__ or "").split("\n\n", 1)[1].replace("\n", " "))
    paths = common.write_results(args.out, "hc_head", payload, rows, columns, notes=notes)
    png = paths[0].with_suffix(".png")
    if plot(rows, png):
        paths.append(png)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
