"""Where an eager call's host time goes: hc_head and the fused rollback, piece by piece.

Every number is host wall time per call of back-to-back calls with one synchronize at the end
(``common.time_eager``), so it is what an eager caller pays; ``host_us`` is the host's share alone
(``common.time_host``: a short burst with no synchronize, median of bursts): where the two agree
the call is host-bound. Pieces: a small ``torch.empty``; an
empty Triton kernel through ``kernel[grid](...)`` and through the cached compiled kernel
(``LaunchCache``); hc_head's input checks; its launcher through Triton's dispatcher and through the
cache; the ``torch.library`` op around it; the public op; SGLang's ``fused_hc_head`` (with
``--peer sglang``); ``C128DraftCleanup.clear`` both ways, a CUDA-graph replay of it, and
``C128DraftCleanup.graphed`` (static index buffers + graph) with and without a copy into its
buffers. A cProfile
of the dispatcher path is written beside the results (``eager_cost_profile.txt``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path

import torch
import triton

from dsv4spec.bench import common
from dsv4spec.bench.cleanup import Case
from dsv4spec.bench.hc_head import EPS, make_inputs
from dsv4spec.capture import capture_cuda_graph
from dsv4spec.kernels.hc_head import hc_head_triton
from dsv4spec.kernels.launch import LaunchCache
from dsv4spec.ops.hc_head import check_hc_head_inputs, hc_head, inputs_look_valid

COLUMNS = ["what", "T", "median_us", "p20_us", "p80_us", "host_us"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 64, 1024],
                        help="hc_head token counts T")
    parser.add_argument("--hidden", type=int, default=7168, help="hc_head hidden size H")
    parser.add_argument("--peer", choices=["sglang"], nargs="*", default=[],
                        help="also time SGLang's kernels (loaded from its installed source or "
                             "DSV4SPEC_SGLANG_ROOT)")


@triton.jit
def _empty_kernel(x_ptr):
    pass


def _without_cache(fn):
    def run():
        with LaunchCache.disabled():
            fn()
    return run


def main(args: argparse.Namespace) -> int:
    env = common.environment()
    peer = (common.sglang_peer("kernels/ops/layernorm/mhc_head.py")
            if "sglang" in args.peer else None)
    rows = []

    def add(what, fn, T=""):
        t = common.time_eager(fn, repeats=5 if args.quick else 15)
        host = common.time_host(fn)
        rows.append({"what": what, "T": T, **t, "host_us": host})
        print(f"{what:<52} T={T!s:<5} {t['median_us']:8.2f} µs (host {host:.2f})", flush=True)

    small = torch.empty(1, device="cuda")
    add("torch.empty((4, 7168), bf16)",
        lambda: torch.empty((4, 7168), device="cuda", dtype=torch.bfloat16))
    add("empty Triton kernel, kernel[grid](...)", lambda: _empty_kernel[(1,)](small))
    empty_launch = LaunchCache(_empty_kernel)
    empty_launch.launch("k", (1, 1, 1), (small,), {}, 4)
    direct = empty_launch.get("k")
    if direct is not None:
        add("empty Triton kernel, LaunchCache direct launch", lambda: direct(small.data_ptr()))

    H = args.hidden
    for T in args.tokens:
        x, fn, sc, base, _ = make_inputs(T, H)
        add("hc_head input checks (full)",
            lambda: check_hc_head_inputs(x, fn, sc, base, None, 1e-6, 1e-6, "auto"), T)
        add("hc_head input checks (fast path)",
            lambda: inputs_look_valid(x, fn, sc, base, None, 1e-6, 1e-6, "auto"), T)
        launcher = lambda: hc_head_triton(x, fn, sc, base, 1e-6, 1e-6)  # noqa: E731
        add("hc_head_triton, Triton dispatcher", _without_cache(launcher), T)
        add("hc_head_triton, LaunchCache", launcher, T)
        add("torch.ops.dsv4spec.hc_head (library op)",
            lambda: torch.ops.dsv4spec.hc_head(x, fn, sc, base, 1e-6, 1e-6), T)
        add("hc_head(impl='triton') (public op)",
            lambda: hc_head(x, fn, sc, base, **EPS, impl="triton"), T)
        add("hc_head(impl='triton'), Triton dispatcher",
            _without_cache(lambda: hc_head(x, fn, sc, base, **EPS, impl="triton")), T)
        if peer is not None:
            add("SGLang fused_hc_head",
                lambda: peer.fused_hc_head(x, fn, sc, base, **EPS), T)

    case = Case(31, 1, 4, torch.float32, "worst")
    case.refcheck()
    add("C128DraftCleanup.clear (31, 1, 4), LaunchCache", case.run_fused)
    add("C128DraftCleanup.clear (31, 1, 4), Triton dispatcher", case.run_fused_dispatch)
    graph = capture_cuda_graph(case.run_fused)
    add("CUDA-graph replay of that clear", graph.replay)
    graphed = case.fused.graphed(1, case.num_draft)
    for buffer, value in zip((graphed.req_pool_indices, graphed.seq_lens, graphed.accept_lens),
                             (case.idx, case.seq, case.acc)):
        buffer.copy_(value)
    add("C128DraftCleanup.graphed(1, 4).replay() (indices written in place)", graphed.replay)

    def copy_then_replay():
        graphed.accept_lens.copy_(case.acc)
        graphed.replay()

    add("accept_lens.copy_ + graphed replay (indices from elsewhere)", copy_then_replay)

    x, fn, sc, base, _ = make_inputs(4, H)
    profiler = cProfile.Profile()
    run = _without_cache(lambda: hc_head(x, fn, sc, base, **EPS, impl="triton"))
    for _ in range(50):
        run()
    profiler.enable()
    for _ in range(2000):
        run()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eager_cost_profile.txt").write_text(
        f"cProfile, 2000 calls of hc_head(impl='triton') at T = 4, H = {H}, through Triton's "
        "dispatcher\n" + text.getvalue())
    common.print_table(rows, COLUMNS)
    common.write_results(out, "eager_cost", {"environment": env}, rows, COLUMNS,
                         notes=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " "))
    return 0
