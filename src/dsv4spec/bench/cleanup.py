"""C128 draft-state rollback: per-layer loop vs one fused launch, eager and in a CUDA graph."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dsv4spec.bench.common import (
    copy_bandwidth,
    environment,
    launch_floor,
    print_table,
    pyplot,
    sglang_peer,
    time_eager,
    time_in_graph,
    write_results,
)
from dsv4spec.capture import capture_cuda_graph
from dsv4spec.kernels.launch import LaunchCache
from dsv4spec.ops import (
    C128DraftCleanup,
    clear_unaccepted_c128_draft_states,
    clear_unaccepted_c128_draft_states_reference,
)

RING, HALF = 256, 512
# (states, batch, num_draft_tokens): DSV4-Pro has 31 C128 layers, DSV4-Flash 20; 64 shows the
# fused launch stays flat past both.
SHAPES = [(1, 1, 4), (8, 1, 4), (31, 1, 4), (31, 8, 4), (31, 32, 4), (31, 1, 8), (64, 1, 4),
          (31, 64, 8), (31, 256, 8)]
QUICK_SHAPES = [(31, 1, 4), (64, 1, 4), (31, 256, 8)]
SWEEP_STATES = [1, 2, 4, 8, 16, 31, 48, 64]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COLUMNS = ["dtype", "states", "batch", "draft", "accept", "loop_eager_us", "fused_eager_us",
           "speedup_eager", "loop_graph_us", "fused_graph_us", "speedup_graph",
           "fused_dispatch_eager_us", "fused_replay_eager_us", "sglang_loop_eager_us",
           "sglang_loop_graph_us", "vs_sglang_eager", "vs_sglang_graph",
           "fused_over_floor", "written_MB", "fused_TBps", "pct_copy_bw"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=list(DTYPES), nargs="+", default=list(DTYPES),
                        help="state dtypes to time")
    parser.add_argument("--peer", choices=["sglang"], nargs="*", default=[],
                        help="also time SGLang's per-layer kernel (loaded from its installed "
                             "source or DSV4SPEC_SGLANG_ROOT)")


class Case:
    """Random states and one batch of indices at one geometry, plus both implementations."""

    def __init__(self, num_states: int, batch: int, num_draft: int, dtype: torch.dtype,
                 accept: str, seed: int = 0, sglang_clear=None) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        num_slots = max(batch, 8) + 1
        rows = num_slots * RING + RING + 1
        self.states = [torch.randn(rows, 2 * HALF, device="cuda", generator=g).to(dtype)
                       for _ in range(num_states)]
        self.idx = torch.randperm(num_slots - 1, device="cuda", generator=g)[:batch].int()
        self.seq = torch.randint(0, 16 * RING, (batch,), device="cuda", generator=g).int()
        if accept == "worst":
            self.acc = torch.ones(batch, dtype=torch.int32, device="cuda")
        else:
            self.acc = torch.randint(1, num_draft + 1, (batch,), device="cuda", generator=g).int()
        self.num_draft = num_draft
        self.sglang_clear = sglang_clear
        self.fused = C128DraftCleanup(self.states, ring_size=RING, max_num_draft_tokens=num_draft)
        rejected_rows = int((num_draft - self.acc).sum())
        self.bytes_written = num_states * rejected_rows * 2 * HALF * self.states[0].element_size()

    def run_fused(self) -> None:
        self.fused.clear(self.idx, self.seq, self.acc, num_draft_tokens=self.num_draft)

    def run_fused_dispatch(self) -> None:
        """The fused clear launched through Triton's dispatcher (no cached compiled kernel)."""
        with LaunchCache.disabled():
            self.run_fused()

    def run_sglang_loop(self) -> None:
        for state in self.states:
            self.sglang_clear(state, self.idx, self.seq, self.acc, ring_size=RING,
                              num_draft_tokens=self.num_draft)

    def run_loop(self) -> None:
        for state in self.states:
            clear_unaccepted_c128_draft_states(state, self.idx, self.seq, self.acc,
                                               ring_size=RING, num_draft_tokens=self.num_draft)

    def refcheck(self) -> None:
        """Loop and fused must both equal the reference on the first and last state."""
        picks = sorted({0, len(self.states) - 1})
        originals = [self.states[i].clone() for i in picks]
        expected = [o.clone() for o in originals]
        for e in expected:
            clear_unaccepted_c128_draft_states_reference(
                e, self.idx, self.seq, self.acc, ring_size=RING, num_draft_tokens=self.num_draft)
        runs = [self.run_fused, self.run_fused_dispatch, self.run_loop]
        if self.sglang_clear is not None:
            runs.append(self.run_sglang_loop)
        for run in runs:
            for i, o in zip(picks, originals):
                self.states[i].copy_(o)
            run()
            for i, e in zip(picks, expected):
                if not torch.equal(self.states[i], e):
                    raise AssertionError(f"{run.__name__} disagrees with the reference")


def measure(case: Case, quick: bool) -> dict[str, float]:
    repeats = 5 if quick else 15
    out = {}
    runs = [("loop", case.run_loop), ("fused", case.run_fused)]
    if case.sglang_clear is not None:
        runs.append(("sglang_loop", case.run_sglang_loop))
    for name, fn in runs:
        out[f"{name}_eager_us"] = time_eager(fn, repeats=repeats)["median_us"]
        graph = time_in_graph(fn)
        out[f"{name}_graph_us"] = graph["median_us"]
        out[f"{name}_graph_p20_us"] = graph["p20_us"]
        out[f"{name}_graph_p80_us"] = graph["p80_us"]
    out["fused_dispatch_eager_us"] = time_eager(case.run_fused_dispatch,
                                                repeats=repeats)["median_us"]
    graph = capture_cuda_graph(case.run_fused)
    out["fused_replay_eager_us"] = time_eager(graph.replay, repeats=repeats)["median_us"]
    if case.sglang_clear is not None:
        out["vs_sglang_eager"] = out["sglang_loop_eager_us"] / out["fused_eager_us"]
        out["vs_sglang_graph"] = out["sglang_loop_graph_us"] / out["fused_graph_us"]
    return out


def plot(sweep: list[dict], floor: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["states"] for r in sweep]
    for key, style, label in (("loop_eager_us", "o--", "per-layer loop, eager"),
                              ("fused_eager_us", "o-", "fused, eager"),
                              ("loop_graph_us", "s--", "per-layer loop, CUDA graph"),
                              ("fused_graph_us", "s-", "fused, CUDA graph"),
                              ("sglang_loop_eager_us", "^:", "SGLang per-layer kernel, eager"),
                              ("sglang_loop_graph_us", "v:", "SGLang per-layer kernel, graph")):
        if all(key in r for r in sweep):
            ax.plot(xs, [r[key] for r in sweep], style, label=label)
    ax.axhline(floor["empty_kernel_graph_us"], color="gray", lw=0.8, ls=":",
               label="empty kernel in graph")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("C128 states (layers)")
    ax.set_ylabel("µs per rollback (median)")
    ax.set_title("C128 rollback, bs 1, 4 drafts, fp32, accept 1 (H200)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    env = environment()
    floor = launch_floor()
    bandwidth = copy_bandwidth()
    print(f"{env['device']}  torch {env['torch']}  triton {env['triton']}")
    print(f"empty kernel: eager {floor['empty_kernel_eager_us']:.2f} µs, "
          f"graph {floor['empty_kernel_graph_us']:.2f} µs; copy {bandwidth / 1e12:.2f} TB/s")

    sglang_clear = None
    if "sglang" in args.peer:
        peer = sglang_peer("kernels/ops/kvcache/dsv4_c128_cleanup.py")
        sglang_clear = peer and peer.clear_unaccepted_c128_draft_states
    rows = []
    for dtype_name in args.dtype:
        for num_states, batch, num_draft in (QUICK_SHAPES if args.quick else SHAPES):
            for accept in ("worst", "random"):
                case = Case(num_states, batch, num_draft, DTYPES[dtype_name], accept,
                            sglang_clear=sglang_clear)
                case.refcheck()
                t = measure(case, args.quick)
                row = dict(dtype=dtype_name, states=num_states, batch=batch, draft=num_draft,
                           accept=accept, **t)
                row["speedup_eager"] = t["loop_eager_us"] / t["fused_eager_us"]
                row["speedup_graph"] = t["loop_graph_us"] / t["fused_graph_us"]
                row["fused_over_floor"] = t["fused_graph_us"] / floor["empty_kernel_graph_us"]
                row["written_MB"] = case.bytes_written / 1e6
                row["fused_TBps"] = case.bytes_written / (t["fused_graph_us"] * 1e-6) / 1e12
                row["pct_copy_bw"] = 100 * row["fused_TBps"] * 1e12 / bandwidth
                rows.append(row)
                print_table([row], COLUMNS)
                del case
                torch.cuda.empty_cache()

    sweep = []
    for num_states in ([1, 31, 64] if args.quick else SWEEP_STATES):
        case = Case(num_states, 1, 4, torch.float32, "worst", sglang_clear=sglang_clear)
        sweep.append(dict(states=num_states, **measure(case, args.quick)))
        del case

    payload = {"environment": env, "floor": floor, "copy_bandwidth_Bps": bandwidth,
               "ring": RING, "half": HALF, "sweep_bs1_draft4_fp32": sweep}
    notes = (f"Empty Triton kernel: eager {floor['empty_kernel_eager_us']:.2f} µs, in graph "
             f"{floor['empty_kernel_graph_us']:.2f} µs. Copy bandwidth (read+write) "
             f"{bandwidth / 1e12:.2f} TB/s. Ring {RING}, half width {HALF}. accept=worst: every "
             "draft rejected (accept 1); random: accept uniform in [1, draft]. Eager = host wall "
             "time per call of back-to-back calls, one synchronize at the end; graph = "
             "do_bench_cudagraph median. fused_dispatch: the fused clear launched through "
             "Triton's dispatcher instead of the cached compiled kernel; fused_replay: a CUDA "
             "graph holding one fused clear, replayed eagerly. sglang_loop: SGLang 0.5.23's "
             "per-layer kernel (its own file, loaded by path) once per state.")
    out = Path(args.out)
    write_results(out, "cleanup", payload, rows, COLUMNS, notes)
    plot(sweep, floor, out / "cleanup.png")
    print()
    print_table(rows, COLUMNS)
    print_table(sweep, ["states", "loop_eager_us", "fused_eager_us", "loop_graph_us",
                        "fused_graph_us", "sglang_loop_eager_us", "sglang_loop_graph_us"])
    return 0
