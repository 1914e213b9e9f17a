"""One MTP speculative-decoding step end to end (W = 4), DSV4-shaped model in bf16, CUDA graphs.

Method: random weights (``init_weights``) cast for serving; ``bs`` requests of ``--prompt`` random
tokens; a plain greedy run (decode graphs) gives the reference tokens; then, per configuration,
an engine with ``cuda_graphs=True`` and one bucket (``bs``) runs ``--warmup`` steps (captures) and
``--steps`` timed steps with forced acceptance: the drafts are the greedy reference with a mismatch
at offsets cycling 0, 1, 2, 3 (accept lengths 1..4, mean 2.5); every emitted token is checked
against the reference. Per phase: host wall time (device synchronised at both ends of a phase,
median over steps) and the device time of one replay of the phase's graph (median of 20 replays,
CUDA events; replays are idempotent). The rollback's own device time comes from the profiler's
kernel records of two profiled steps (kernels whose name contains ``c128``), and so does the
number of kernels per step. Configurations: SGLang's arrangement (per-layer loop after the verify
graph, with SGLang's own kernel when its source is found; eager draft hc_head), the loop inside the
graph, fused after, and fused inside with the draft hc_head eager / compiled / triton (all on).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from dsv4spec.bench import common
from dsv4spec.engine import Engine, Request
from dsv4spec.model.build import build_model

W = 4
SCHEDULE = (0, 1, 2, 3)  # mismatch offsets: accept lengths 1, 2, 3, 4 (offset 3: all accepted)
CONFIGS = {  # name -> Engine keyword arguments
    "sglang": dict(rollback="loop", rollback_in_verify=False, draft_hc_head_impl="eager"),
    "loop-inside": dict(rollback="loop", rollback_in_verify=True, draft_hc_head_impl="triton"),
    "fused-after": dict(rollback="fused", rollback_in_verify=False, draft_hc_head_impl="triton"),
    "fused-inside/eager": dict(rollback="fused", draft_hc_head_impl="eager"),
    "fused-inside/compiled": dict(rollback="fused", draft_hc_head_impl="compiled"),
    "all-on": dict(rollback="fused", draft_hc_head_impl="triton"),
}
PHASES = ("verify", "rollback", "draft-extend", "draft-decode")
COLUMNS = ["preset", "dtype", "batch", "config", "step_ms", "tokens_per_s", "mean_accept",
           "verify_graph_us", "extend_graph_us", "chain_graph_us", "rollback_host_us",
           "rollback_kernel_us", "rollback_span_us", "rollback_kernels", "kernels_per_step",
           "identical_to_greedy", "identical_requests", "same_tokens_as"]
GREEDY_COLUMNS = ["preset", "dtype", "batch", "decode_step_ms", "decode_graph_us",
                  "tokens_per_s"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--presets", nargs="+", default=["pro-shape", "flash-shape"],
                        choices=["pro-shape", "flash-shape", "tiny"],
                        help="model shapes (random weights)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128],
                        help="batch sizes")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                        help="engine configurations: SGLang's arrangement, the rollback loop "
                             "inside the graph, fused after, fused inside with the draft "
                             "hc_head eager / compiled, all on")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per configuration")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="model dtype")
    parser.add_argument("--name", default="e2e", help="results file stem")


def forced_drafts(reference: dict[int, list[int]], vocab_size: int):
    """Drafts from the greedy reference, a mismatch at the scheduled offset (per request)."""
    calls: dict[int, int] = {}

    def override(r: Request) -> list[int]:
        ref = reference[id(r)]
        drafts = ref[len(r.output):len(r.output) + W - 1]
        drafts += [0] * (W - 1 - len(drafts))
        k = SCHEDULE[calls.get(id(r), 0) % len(SCHEDULE)]
        calls[id(r)] = calls.get(id(r), 0) + 1
        if k < W - 1:
            drafts[k] = (drafts[k] + 1) % vocab_size  # any other token
        return drafts

    return override


def replay_times_us(runners: dict[str, object], replays: int = 30) -> dict[str, float | None]:
    """Median device time of one replay of each runner's captured graph (CUDA events), the
    runners' replays interleaved so drifting clocks hit all alike."""
    graphs = {k: r.graph(r.captured()[0]) for k, r in runners.items() if r.captured()}
    samples: dict[str, list[float]] = {k: [] for k in graphs}
    for _ in range(replays):
        for k, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples[k].append(start.elapsed_time(end) * 1e3)
    return {k: statistics.median(samples[k]) if k in samples else None for k in runners}


def profile_steps(engine: Engine, reqs: list[Request], steps: int = 2) -> dict[str, float]:
    """From the profiler's kernel records of ``steps`` steps: kernels per step, the rollback's
    kernels and their summed time per step, and the rollback's span (first kernel start to last
    kernel end, gaps between its kernels included) per step."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.speculative_step(reqs)
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA
                      and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()),
                     key=lambda e: e.time_range.start)
    rollback = [e for e in kernels if "c128" in e.name.lower()]
    per_step = len(rollback) // steps
    spans = [rollback[i + per_step - 1].time_range.end - rollback[i].time_range.start
             for i in range(0, per_step * steps, per_step)] if per_step else [0.0]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:80], []).append(e.device_time)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:12]
    return {"kernels_per_step": len(kernels) / steps, "rollback_kernels": per_step,
            "kernel_us_per_step": sum(e.device_time for e in kernels) / steps,
            "top_kernels": [(k, len(v) / steps, sum(v) / steps) for k, v in top],
            "rollback_kernel_us": sum(e.device_time for e in rollback) / steps,
            "rollback_span_us": statistics.mean(spans)}


def phase_device_us(engine: Engine, phase: str) -> float | None:
    """Median device time of one phase inside the timed steps (CUDA events at its ends), unlike
    ``replay_times_us``, which replays a graph alone."""
    events = engine.phase_events.get(phase, ())
    return statistics.median(a.elapsed_time(b) for a, b in events) * 1e3 if events else None


def median_us(samples) -> float | None:
    samples = list(samples)
    return statistics.median(samples) * 1e6 if samples else None


def run_batch(model, bs: int, prompts: list[list[int]], reference: list[list[int]], args,
              sglang_clear) -> list[dict]:
    """Every configuration at one batch size, side by side: engines built and warmed up, then
    timed steps interleaved config by config (rotating the order), then graph replays."""
    engines, requests = {}, {}
    for name in args.configs:
        reqs = [Request(p, 10_000) for p in prompts]
        engine = Engine(model, num_slots=bs, max_seq_len=args.prompt + len(reference[0]) + 2 * W,
                        num_draft_tokens=W, buckets=(bs,), cuda_graphs=True,
                        draft_override=forced_drafts(
                            {id(r): ref for r, ref in zip(reqs, reference)},
                            model.cfg.vocab_size), **CONFIGS[name])
        if name == "sglang" and sglang_clear is not None:
            engine.state.c128.per_layer_clear = sglang_clear
        engine.admit(reqs)
        for _ in range(args.warmup):
            engine.speculative_step(reqs)
        engine.phase_walls.clear()
        engine.phase_events.clear()
        engines[name], requests[name] = engine, reqs
    names = list(engines)
    walls: dict[str, list[float]] = {k: [] for k in names}
    emitted = {k: sum(len(r.output) for r in requests[k]) for k in names}
    for step in range(args.steps):
        for name in names[step % len(names):] + names[:step % len(names)]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            engines[name].speculative_step(requests[name])
            walls[name].append(time.perf_counter() - start)
    phase_runners = {"verify": lambda e: e.verify.runner, "extend": lambda e: e.drafts.extend,
                     "chain": lambda e: e.drafts.chain}
    replay = {part: replay_times_us({k: runner(e) for k, e in engines.items()})
              for part, runner in phase_runners.items()}
    rows = []
    for name in names:
        engine, reqs = engines[name], requests[name]
        tokens = sum(len(r.output) for r in reqs) - emitted[name]
        matches = [r.output == ref[:len(r.output)] for r, ref in zip(reqs, reference)]
        divergences = [next(i for i, (a, b) in enumerate(zip(r.output, ref)) if a != b)
                       for r, ref, same in zip(reqs, reference, matches) if not same]
        accepts = [a for r in reqs for a in r.accept_lens[args.warmup:]]
        rows.append({
            "config": name, "step_ms": statistics.median(walls[name]) * 1e3,
            "tokens_per_s": tokens / sum(walls[name]), "mean_accept": statistics.mean(accepts),
            "verify_graph_us": replay["verify"][name], "extend_graph_us": replay["extend"][name],
            "chain_graph_us": replay["chain"][name],
            "rollback_host_us": median_us(engine.phase_walls.get("rollback", ())),
            **profile_steps(engine, reqs), "identical_to_greedy": all(matches),
            "identical_requests": sum(matches),
            "first_divergence": min(divergences) if divergences else None,
            "same_tokens_as": next(k for k in names
                                   if [r.output for r in requests[k]] == [r.output for r in reqs]),
            "phase_wall_us": {p: median_us(engine.phase_walls.get(p, ())) for p in PHASES},
            "phase_device_us": {p: phase_device_us(engine, p) for p in PHASES}})
    del engines, requests
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def greedy_reference(model, bs: int, prompts: list[list[int]], new_tokens: int
                     ) -> tuple[list[list[int]], dict]:
    """Plain greedy outputs (decode graphs), the decode step's median wall time and the device
    time of one decode graph replay."""
    reqs = [Request(p, new_tokens) for p in prompts]
    engine = Engine(model, num_slots=bs, max_seq_len=len(prompts[0]) + new_tokens + 2 * W,
                    buckets=(bs,), cuda_graphs=True)
    engine.generate(reqs)
    walls = engine.phase_walls["decode"][2:]  # past the capture
    timing = {"decode_step_ms": statistics.median(walls) * 1e3,
              "decode_graph_us": replay_times_us({"decode": engine.decoder})["decode"]}
    timing["tokens_per_s"] = bs / timing["decode_step_ms"] * 1e3
    del engine
    return [r.output for r in reqs], timing


def plot(rows: list[dict], path: str) -> None:
    """Per preset: the rollback's cost per step and the draft-extend graph per hc_head impl."""
    plt = common.pyplot()
    if plt is None or not rows:
        return
    presets = sorted({r["preset"] for r in rows})
    fig, axes = plt.subplots(len(presets), 2, figsize=(11, 4 * len(presets)), squeeze=False)
    for ax_row, name in zip(axes, presets):
        mine = [r for r in rows if r["preset"] == name]
        batches = sorted({r["batch"] for r in mine})

        def series(config, key):
            by_bs = {r["batch"]: r.get(key) for r in mine if r["config"] == config}
            return [by_bs.get(b) or float("nan") for b in batches]

        ax = ax_row[0]
        for config, key, label in (
                ("sglang", "rollback_host_us", "SGLang loop after the graph (host wall)"),
                ("fused-after", "rollback_host_us", "fused after the graph (host wall)"),
                ("loop-inside", "rollback_span_us", "loop inside the graph (device span)"),
                ("all-on", "rollback_span_us", "fused inside the graph (device span)")):
            ax.plot(batches, series(config, key), "o-", label=label)
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="µs per step",
               title=f"{name}: C128 rollback per step")
        ax.legend(fontsize=8)
        ax = ax_row[1]
        for config, label in (("fused-inside/eager", "eager"),
                              ("fused-inside/compiled", "compiled"), ("all-on", "triton")):
            ax.plot(batches, series(config, "extend_graph_us"), "o-", label=label)
        ax.set(xscale="log", xlabel="batch size", ylabel="µs (graph replay)",
               title=f"{name}: draft-extend by draft hc_head")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: argparse.Namespace) -> int:
    if args.quick:
        args.presets, args.batch, args.steps = args.presets[:1], args.batch[:2], 4
    env = common.environment()
    peer = common.sglang_peer("kernels/ops/kvcache/dsv4_c128_cleanup.py")
    sglang_clear = peer.clear_unaccepted_c128_draft_states if peer else None
    rows, greedy_rows = [], []
    for preset_name in args.presets:
        model = build_model(preset_name, device="cuda", dtype=getattr(torch, args.dtype))
        g = torch.Generator().manual_seed(0)
        for bs in args.batch:
            prompts = torch.randint(0, model.cfg.vocab_size, (bs, args.prompt),
                                    generator=g).tolist()
            new_tokens = 1 + W * (args.warmup + args.steps + 2) + W
            reference, timing = greedy_reference(model, bs, prompts, new_tokens)
            greedy_rows.append({"preset": preset_name, "dtype": args.dtype, "batch": bs,
                                **timing})
            common.print_table(greedy_rows[-1:], GREEDY_COLUMNS)
            batch_rows = [{"preset": preset_name, "dtype": args.dtype, "batch": bs, **row}
                          for row in run_batch(model, bs, prompts, reference, args,
                                               sglang_clear)]
            common.print_table(batch_rows, COLUMNS)
            rows += batch_rows
        del model
        gc.collect()
        torch.cuda.empty_cache()
    payload = {"environment": env, "num_draft_tokens": W, "schedule": SCHEDULE,
               "sglang_kernel_in_loop": sglang_clear is not None, "greedy": greedy_rows}
    common.write_results(args.out, args.name, payload, rows, COLUMNS,
                         notes=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " "))
    plot(rows, f"{args.out}/{args.name}.png")
    print(common.markdown_table(greedy_rows, GREEDY_COLUMNS))
    return 0
