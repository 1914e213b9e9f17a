"""The mHC finalize's programmatic dependent launch order: early release vs release after its wait.

Up to ``PDL_MAX_TOKENS`` tokens the finalize of ``mhc_pre`` and of the boundary is a
programmatic dependent launch (PDL). With ``FINALIZE_EARLY_RELEASE`` it lets the next launch
start before its own wait on launch 1; otherwise right after that wait. Both orders compute the
same bits (checked here before timing). Three shapes, bf16, RMSNorm, Sinkhorn 20, each layer its
own weights:

- ``one``: one boundary call;
- ``chain``: ``--layers`` boundaries back to back, so the next boundary's launch 1 (a PDL that
  loads its ``fn`` before it waits) is the launch released early; per boundary;
- ``sublayer``: each boundary followed by a PDL stand-in for the sublayer's first kernel (it waits,
  then reads the layer input and writes the next boundary's ``f``); per layer.

graph = device µs per boundary (or layer) from a CUDA graph (``do_bench_cudagraph``, median),
``--repeats`` times per order, the orders interleaved: the median of those, and the smallest and
largest of the per-repeat differences;
eager = host wall µs per boundary of back-to-back eager calls, both orders' loops interleaved.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4spec.bench import common
from dsv4spec.kernels import mhc as mhc_kernels
from dsv4spec.kernels.mhc import mhc_post_pre_triton

WIDTHS = (4096, 7168)
TOKENS = (1, 2, 4, 8, 12, 16)
SHAPES = ("one", "chain", "sublayer")
ORDERS = {"early": True, "after_wait": False}
EPS = 1e-6
COLUMNS = ["H", "T", "shape", "layers", "early_graph_us", "after_wait_graph_us",
           "after_minus_early_graph_us", "after_minus_early_min_us", "after_minus_early_max_us",
           "early_eager_us", "after_wait_eager_us", "wait_launch"]


@triton.jit
def _sublayer_standin_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    # a PDL engine kernel: waits for its predecessor, lets its own dependents start, copies
    gdc_wait()
    gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS), help="hidden sizes")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS),
                        help="token counts T (the finalize is a PDL up to 16)")
    parser.add_argument("--layers", type=int, default=0,
                        help="boundaries per chain (default: 61 at H = 7168, 43 otherwise)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                        help="what to time: one boundary, boundaries back to back, or each "
                             "boundary followed by a PDL stand-in sublayer kernel")
    parser.add_argument("--repeats", type=int, default=5,
                        help="graph timings per order, the orders interleaved (median reported, "
                             "with the smallest and largest difference)")


class _Layers:
    """Per-layer weights and the activations of a chain of boundaries."""

    def __init__(self, T: int, H: int, layers: int, seed: int):
        g = torch.Generator().manual_seed(seed)

        def rand(*shape, scale=1.0, dtype=torch.float32):
            return (torch.randn(*shape, generator=g) * scale).to("cuda", dtype)

        self.T, self.H, self.layers = T, H, layers
        self.fn = [rand(24, 4 * H, scale=(4 * H) ** -0.5) for _ in range(layers)]
        self.scale = [(torch.rand(3, generator=g) + 0.5).cuda() for _ in range(layers)]
        self.base = [rand(24) for _ in range(layers)]
        self.norm = [(torch.rand(H, generator=g) + 0.5).cuda() for _ in range(layers)]
        self.f = [rand(T, H, dtype=torch.bfloat16) for _ in range(layers)]
        self.residual = [rand(T, 4, H, dtype=torch.bfloat16) for _ in range(layers + 1)]
        self.post = [torch.rand(T, 4, generator=g).cuda() for _ in range(layers + 1)]
        comb = torch.rand(T, 4, 4, generator=g)
        self.comb = [(comb / comb.sum(1, keepdim=True)).cuda() for _ in range(layers + 1)]
        self.layer_input = [torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
                            for _ in range(layers)]

    def boundary(self, i: int, early_release: bool) -> None:
        mhc_post_pre_triton(
            self.f[i], self.residual[i], self.post[i], self.comb[i], self.fn[i], self.scale[i],
            self.base[i], EPS, EPS, 20, 2.0, self.norm[i], EPS,
            out=(self.residual[i + 1], self.post[i + 1], self.comb[i + 1], self.layer_input[i]),
            early_release=early_release)

    def run(self, shape: str, early_release: bool) -> None:
        n = self.T * self.H
        for i in range(1 if shape == "one" else self.layers):
            self.boundary(i, early_release)
            if shape == "sublayer" and i + 1 < self.layers:
                _sublayer_standin_kernel[(triton.cdiv(n, 1024),)](
                    self.layer_input[i], self.f[i + 1], n, BLOCK=1024, launch_pdl=True)

    def outputs(self) -> list[torch.Tensor]:
        return [t.clone() for t in (*self.residual[1:], *self.post[1:], *self.comb[1:],
                                    *self.layer_input)]


def measure(T: int, H: int, shape: str, layers: int, repeats: int) -> dict:
    n = 1 if shape == "one" else layers
    outputs = {}
    for name, early in ORDERS.items():
        net = _Layers(T, H, n, seed=T * 7 + H)  # the same inputs for both orders
        net.run(shape, early)
        torch.cuda.synchronize()
        outputs[name] = net.outputs()
    if not all(torch.equal(a, b) for a, b in zip(outputs["early"], outputs["after_wait"])):
        raise AssertionError(f"T={T} H={H} {shape}: the two release orders differ in bits")
    net = _Layers(T, H, n, seed=T * 7 + H + 1)  # fresh inputs for the timing
    calls = {name: (lambda e=early: net.run(shape, e)) for name, early in ORDERS.items()}
    samples = {name: [] for name in ORDERS}
    for _ in range(repeats):  # interleaved, so a drift of the clocks reaches both orders
        for name, fn in calls.items():
            samples[name].append(common.time_in_graph(fn)["median_us"] / n)
    graph = {name: statistics.median(v) for name, v in samples.items()}
    diffs = [a - e for a, e in zip(samples["after_wait"], samples["early"])]
    eager = common.time_eager_side_by_side(calls)
    cfg = mhc_kernels._plan(T, H, torch.cuda.current_device(), dtype=torch.bfloat16,
                            boundary=True)
    return {"H": H, "T": T, "shape": shape, "layers": n,
            "early_graph_us": graph["early"], "after_wait_graph_us": graph["after_wait"],
            "after_minus_early_graph_us": graph["after_wait"] - graph["early"],
            "after_minus_early_min_us": min(diffs), "after_minus_early_max_us": max(diffs),
            "early_eager_us": eager["early"]["median_us"] / n,
            "after_wait_eager_us": eager["after_wait"]["median_us"] / n,
            "wait_launch": cfg.wait}


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available() or not mhc_kernels.supports_pdl(0):
        print("dsv4spec bench pdl: needs an sm_90+ NVIDIA GPU")
        return 1
    rows = []
    if args.quick:
        args.widths, args.tokens = [7168], [1, 8, 16]
    for H in args.widths:
        layers = args.layers or (61 if H == 7168 else 43)
        for T in args.tokens:
            if T > mhc_kernels.PDL_MAX_TOKENS:
                continue  # no dependent launch there: the orders are the same kernel
            for shape in args.shapes:
                rows.append(measure(T, H, shape, layers, args.repeats))
                common.print_table(rows[-1:], COLUMNS)
    common.print_table(rows, COLUMNS)
    payload = {"environment": common.environment(),
               "finalize_early_release": mhc_kernels.FINALIZE_EARLY_RELEASE}
    notes = ("The mHC finalize's release of its dependents before its own wait (early) or after "
             "it (after_wait), same bits (checked); graph = device us per boundary (one, chain) "
             "or per layer (sublayer: boundary + a PDL stand-in sublayer kernel), median of "
             f"{args.repeats} interleaved timings per order (min / max: the range of the "
             "per-repeat differences); eager = host us "
             "per boundary, back-to-back calls, both orders interleaved. wait_launch: launch 1 "
             "is itself a dependent launch (1-8 tokens).")
    for path in common.write_results(args.out, "pdl_order", payload, rows, COLUMNS, notes):
        print(f"wrote {path}")
    return 0
