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
from dsv4spec.bench.model_step import build
from dsv4spec.engine import Engine, Request

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
COLUMNS = ["preset", "batch", "config", "step_ms", "tokens_per_s", "mean_accept",
           "verify_graph_us", "extend_graph_us", "chain_graph_us", "rollback_host_us",
           "rollback_kernel_us", "rollback_kernels", "kernels_per_step", "identical_to_greedy"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--presets", nargs="+", default=["pro-shape", "flash-shape"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)


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


def graph_replay_us(runner) -> float | None:
    """Median device time of one replay of the runner's (single) captured graph."""
    if not runner.captured():
        return None
    graph, _ = runner._graphs[runner.captured()[0]]
    samples = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def profile_steps(engine: Engine, reqs: list[Request], steps: int = 2) -> tuple[float, int, int]:
    """(rollback kernel µs per step, rollback kernels per step, kernels per step)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.speculative_step(reqs)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    rollback = [e for e in kernels if "c128" in e.name.lower()]
    return (sum(e.device_time for e in rollback) / steps, len(rollback) // steps,
            len(kernels) // steps)


def run_config(model, name: str, bs: int, prompts: list[list[int]], reference: list[list[int]],
               args, sglang_clear) -> dict:
    kw = dict(CONFIGS[name])
    reqs = [Request(p, 10_000) for p in prompts]
    engine = Engine(model, num_slots=bs, max_seq_len=args.prompt + len(reference[0]) + 2 * W,
                    num_draft_tokens=W, buckets=(bs,), cuda_graphs=True,
                    draft_override=forced_drafts({id(r): ref for r, ref in zip(reqs, reference)},
                                                 model.cfg.vocab_size),
                    **kw)
    if name == "sglang" and sglang_clear is not None:
        engine.state.c128.per_layer_clear = sglang_clear
    engine.admit(reqs)
    for _ in range(args.warmup):
        engine.speculative_step(reqs)
    engine.phase_seconds.clear()
    engine.phase_events.clear()
    emitted = sum(len(r.output) for r in reqs)
    walls = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.speculative_step(reqs)
        walls.append(time.perf_counter() - start)
    tokens = sum(len(r.output) for r in reqs) - emitted
    phase_device = {p: statistics.median(
        s.elapsed_time(e) for s, e in engine.phase_events[p]) * 1e3
        for p in PHASES if engine.phase_events.get(p)}
    rollback_us, rollback_kernels, kernels = profile_steps(engine, reqs)
    identical = all(r.output == ref[:len(r.output)] for r, ref in zip(reqs, reference))
    accepts = [a for r in reqs for a in r.accept_lens[args.warmup:]]
    row = {"config": name, "step_ms": statistics.median(walls) * 1e3,
           "tokens_per_s": tokens / sum(walls), "mean_accept": statistics.mean(accepts),
           "verify_graph_us": graph_replay_us(engine.verify.runner),
           "extend_graph_us": graph_replay_us(engine.drafts.extend),
           "chain_graph_us": graph_replay_us(engine.drafts.chain),
           "rollback_host_us": engine_phase_wall_us(engine, "rollback"),
           "rollback_kernel_us": rollback_us, "rollback_kernels": rollback_kernels,
           "kernels_per_step": kernels, "identical_to_greedy": identical,
           "phase_device_us": phase_device,
           "phase_wall_us": {p: engine_phase_wall_us(engine, p) for p in PHASES}}
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return row


def engine_phase_wall_us(engine: Engine, phase: str) -> float | None:
    """Mean host wall time of a phase per timed step (µs); None if the phase did not run."""
    n = len(engine.phase_events.get(phase, ()))
    return engine.phase_seconds[phase] / n * 1e6 if n else None


def greedy_reference(model, bs: int, prompts: list[list[int]], new_tokens: int
                     ) -> tuple[list[list[int]], float]:
    """Plain greedy outputs (decode graphs) and the decode step's wall time (ms)."""
    reqs = [Request(p, new_tokens) for p in prompts]
    engine = Engine(model, num_slots=bs, max_seq_len=len(prompts[0]) + new_tokens + 2 * W,
                    buckets=(bs,), cuda_graphs=True)
    engine.generate(reqs)
    steps = len(engine.phase_events["decode"])
    step_ms = engine.phase_seconds["decode"] / steps * 1e3
    del engine
    return [r.output for r in reqs], step_ms


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("e2e benchmark needs a CUDA GPU")
        return 1
    if args.quick:
        args.presets, args.batch, args.steps = args.presets[:1], args.batch[:2], 4
    env = common.environment()
    peer = common.sglang_peer("kernels/ops/kvcache/dsv4_c128_cleanup.py")
    sglang_clear = peer.clear_unaccepted_c128_draft_states if peer else None
    rows, greedy_rows = [], []
    for preset_name in args.presets:
        model = build(preset_name)
        g = torch.Generator().manual_seed(0)
        for bs in args.batch:
            prompts = torch.randint(0, model.cfg.vocab_size, (bs, args.prompt),
                                    generator=g).tolist()
            new_tokens = 1 + W * (args.warmup + args.steps + 2) + W
            reference, decode_ms = greedy_reference(model, bs, prompts, new_tokens)
            greedy_rows.append({"preset": preset_name, "batch": bs, "decode_step_ms": decode_ms,
                                "tokens_per_s": bs / decode_ms * 1e3})
            for name in args.configs:
                row = {"preset": preset_name, "batch": bs,
                       **run_config(model, name, bs, prompts, reference, args, sglang_clear)}
                rows.append(row)
                common.print_table([row], COLUMNS)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    payload = {"environment": env, "num_draft_tokens": W, "schedule": SCHEDULE,
               "sglang_kernel_in_loop": sglang_clear is not None, "greedy": greedy_rows}
    common.write_results(args.out, "e2e", payload, rows, COLUMNS,
                         notes=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " "))
    print(common.markdown_table(greedy_rows, ["preset", "batch", "decode_step_ms",
                                              "tokens_per_s"]))
    return 0
