"""One MTP speculative-decoding step end to end (W = 4), DSV4-shaped model in bf16, CUDA graphs.

Method: random weights (``init_weights``) cast for serving; ``bs`` requests of ``--prompt`` random
tokens; a plain greedy run (decode graphs) per mHC implementation gives the reference tokens; then,
per configuration, an engine with ``cuda_graphs=True`` and one bucket (``bs``) runs ``--warmup``
steps (captures) and ``--steps`` timed steps with forced acceptance: the drafts are the greedy
reference with a mismatch at offsets cycling 0, 1, 2, 3 (accept lengths 1..4, mean 2.5); every
emitted token is checked against the reference. Per phase: host wall time (device synchronised at
both ends of a phase, median over steps) and the device time of one replay of the phase's graph
(median of 20 replays, CUDA events; replays are idempotent). The rollback's own device time comes
from the profiler's kernel records of two profiled steps (kernels whose name contains ``c128``),
and so does the number of kernels per step. Configurations: SGLang's arrangement (per-layer loop
after the verify graph, with SGLang's own kernel when its source is found; eager draft hc_head;
every layer's mHC boundaries, the MTP block's included, through SGLang 0.5.23's own TileLang
kernels ``mhc_pre`` / ``mhc_fused_post_pre`` / ``mhc_post`` when CUDA, TileLang and SGLang's source
are found and the model is bf16 and they pass a check against the float64 reference first, else our
fused ops, recorded per row as ``sglang_mhc``), the loop inside the graph, fused after, and fused
inside with the draft hc_head eager / compiled / triton (all on), all with our mHC ops. Each
configuration is checked against (and drafts from) plain greedy decoding with its own mHC
implementation: SGLang's kernels round differently from ours, so tokens may part from our greedy
run for rounding alone, which would say nothing about the speculative step. SGLang's kernels also
change with the token count (verify runs ``W`` times decode's), so its arrangement may still part
from its own greedy run; that is reported (``identical_requests``, ``first_divergence``), not
raised.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import statistics
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import torch
from torch import nn

from dsv4spec.bench import common, sglang_mhc
from dsv4spec.bench import mhc as mhc_bench
from dsv4spec.engine import Engine, Request
from dsv4spec.model.build import build_model
from dsv4spec.model.model import Layer, MhcImplementation

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
COLUMNS = ["preset", "dtype", "batch", "config", "sglang_mhc", "step_ms", "tokens_per_s",
           "mean_accept", "verify_graph_us", "extend_graph_us", "chain_graph_us",
           "rollback_host_us", "rollback_kernel_us", "rollback_span_us", "rollback_kernels",
           "kernels_per_step",
           "identical_to_greedy", "identical_requests", "first_divergence", "same_tokens_as"]
GREEDY_COLUMNS = ["preset", "dtype", "batch", "mhc", "decode_step_ms", "decode_graph_us",
                  "tokens_per_s", "same_requests_as_ours"]
# SGLang's DSV4 passes hc_eps as both its pre and Sinkhorn eps and a post multiplier of 2
POST_MULT = 2.0
# tokens of the check run before SGLang's mHC goes into the model (its FMA boundary kernel)
CHECK_TOKENS = 4


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
    parser.add_argument("--no-sglang-mhc", action="store_true",
                        help="SGLang's arrangement with our mHC ops in the layers (only the "
                             "rollback and the draft hc_head as SGLang does them)")


# ---------------------------------------------------------------------------------------------
# SGLang's mHC kernels in the model's layers


class SGLangMhc:
    """SGLang 0.5.23's mHC module (``dsv4spec.bench.sglang_mhc``) behind the layers' boundary
    signatures (:class:`dsv4spec.model.model.MhcImplementation`).

    SGLang takes the epsilons, post multiplier and Sinkhorn count positionally (its pre eps and
    Sinkhorn eps both ``hc_eps``, as its DSV4 passes them) and hands ``post`` around as
    ``[T, hc, 1]``; the layers use ``[T, hc]``. Return orders are ours already: ``mhc_pre``
    ``(post, comb, layer_input)``, ``mhc_fused_post_pre`` ``(residual', post', comb',
    layer_input)``.
    """

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def pre(self, residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor,
            hc_base: torch.Tensor, *, rms_eps: float, hc_eps: float, sinkhorn_iters: int,
            post_mult: float = POST_MULT, norm_weight: torch.Tensor | None = None,
            norm_eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        post, comb, layer_input = self.module.mhc_pre(
            residual, fn, hc_scale, hc_base, rms_eps, hc_eps, hc_eps, post_mult, sinkhorn_iters,
            norm_weight=norm_weight, norm_eps=norm_eps)
        return post.squeeze(-1), comb, layer_input

    def post_pre(self, f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                 comb: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor,
                 hc_base: torch.Tensor, *, rms_eps: float, hc_eps: float, sinkhorn_iters: int,
                 post_mult: float = POST_MULT, norm_weight: torch.Tensor | None = None,
                 norm_eps: float | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        new_residual, new_post, new_comb, layer_input = self.module.mhc_fused_post_pre(
            f, residual, post.unsqueeze(-1), comb, fn, hc_scale, hc_base, rms_eps, hc_eps,
            hc_eps, post_mult, sinkhorn_iters, norm_weight=norm_weight, norm_eps=norm_eps)
        return new_residual, new_post.squeeze(-1), new_comb, layer_input

    def post(self, f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> torch.Tensor:
        return self.module.mhc_post(f, residual, post.unsqueeze(-1), comb)


def check_mhc_implementation(ops: MhcImplementation, hidden_size: int,
                             device: str = "cuda") -> dict[str, float]:
    """Run ``ops``' three boundaries once on ``dsv4spec.bench.mhc``'s random inputs (bf16, norm
    fused) and compare with its float64 torch reference: the outputs' shapes exactly, then the
    max error of each relative to the reference's range (raising past 2 %, a broken setup and not
    rounding). Returns the errors by ``"<op>[<output index>]"``."""
    inputs = mhc_bench.make_inputs(CHECK_TOKENS, hidden_size, seed=0, device=device)
    calls = {"pre": ops.pre, "post": ops.post, "post_pre": ops.post_pre}
    errors: dict[str, float] = {}
    for op in mhc_bench.OPS:
        want = mhc_bench.torch_provider(op, inputs, norm=True)()
        got = mhc_bench.ours_provider(calls[op], op, inputs, norm=True)()
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        shapes = [tuple(t.shape) for t in got]
        if shapes != [tuple(t.shape) for t in want]:
            raise RuntimeError(f"{op}: outputs of shapes {shapes}, expected "
                               f"{[tuple(t.shape) for t in want]}")
        op_errors = mhc_bench.max_errors({i: t for i, t in enumerate(got)},
                                         {i: t for i, t in enumerate(want)})
        mhc_bench.check(op, op_errors)
        errors.update({f"{op}[{i}]": e for i, e in op_errors.items()})
    return errors


def sglang_mhc_implementation(
    hidden_size: int, dtype: torch.dtype, *, device: str = "cuda",
    load: Callable[[], ModuleType] = sglang_mhc.load_sglang_mhc,
) -> tuple[SGLangMhc | None, str]:
    """SGLang's mHC kernels for the layers, checked by :func:`check_mhc_implementation`, or
    None (our fused ops stay) with the reason: not bf16, no CUDA, no TileLang, SGLang's source
    not found, or a failure or wrong output in the check."""
    if dtype != torch.bfloat16:
        return None, f"SGLang's mHC kernels take bf16 residuals, the model is {dtype}"
    if device == "cuda":
        if not torch.cuda.is_available():
            return None, "no CUDA device"
        if importlib.util.find_spec("tilelang") is None:
            return None, "TileLang is not installed"
    try:
        ops = SGLangMhc(load())
        errors = check_mhc_implementation(ops, hidden_size, device)
    except Exception as err:  # noqa: BLE001 - any failure to load or run falls back, recorded
        return None, f"SGLang's mHC failed to load or run ({type(err).__name__}: {err})"
    worst = max(errors.values())
    return ops, (f"SGLang {sglang_mhc.sglang_version()} mhc.py (TileLang), max error "
                 f"{worst:.1e} of the range against the float64 reference")


@contextlib.contextmanager
def use_mhc_implementation(model: nn.Module, ops: MhcImplementation | None) -> Iterator[None]:
    """Within the block every layer of ``model`` (the MTP block's included) crosses its mHC
    boundaries through ``ops``; None changes nothing. Each layer's own setting is restored
    after."""
    if ops is None:
        yield
        return
    unset = object()
    layers = [m for m in model.modules() if isinstance(m, Layer)]
    before = [m.__dict__.get("mhc_implementation", unset) for m in layers]
    try:
        for layer in layers:
            layer.mhc_implementation = ops
        yield
    finally:
        for layer, previous in zip(layers, before):
            if previous is unset:  # back to the class's default
                layer.__dict__.pop("mhc_implementation", None)
            else:
                layer.mhc_implementation = previous


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


def compare_tokens(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """Each request's emitted tokens against its reference: all identical, how many requests
    are, and the earliest token index where one parts (None if none does). A mismatch is a
    result to report, never an error."""
    matches = [out == ref[:len(out)] for out, ref in zip(outputs, reference)]
    divergences = [next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b),
                        min(len(out), len(ref)))  # past the reference's end
                   for out, ref, same in zip(outputs, reference, matches) if not same]
    return {"identical_to_greedy": all(matches), "identical_requests": sum(matches),
            "first_divergence": min(divergences) if divergences else None}


def run_batch(model, bs: int, prompts: list[list[int]], references: dict[str, list[list[int]]],
              args, sglang_clear, sglang_ops: MhcImplementation | None = None) -> list[dict]:
    """Every configuration at one batch size, side by side: engines built and warmed up, then
    timed steps interleaved config by config (rotating the order), then graph replays.
    ``references``: each configuration's greedy tokens (drafts and check); ``sglang_ops``: the
    mHC implementation of the "sglang" configuration (None: our ops)."""

    def boundaries(name: str):
        # The engines share the model's layers: SGLang's mHC goes in around each of the
        # "sglang" engine's calls (eager prefill, warm-ups and captures, steps) and out after.
        return use_mhc_implementation(model, sglang_ops if name == "sglang" else None)

    engines, requests = {}, {}
    for name in args.configs:
        reference = references[name]
        reqs = [Request(p, 10_000) for p in prompts]
        engine = Engine(model, num_slots=bs, max_seq_len=args.prompt + len(reference[0]) + 2 * W,
                        num_draft_tokens=W, buckets=(bs,), cuda_graphs=True,
                        draft_override=forced_drafts(
                            {id(r): ref for r, ref in zip(reqs, reference)},
                            model.cfg.vocab_size), **CONFIGS[name])
        if name == "sglang" and sglang_clear is not None:
            engine.state.c128.per_layer_clear = sglang_clear
        with boundaries(name):
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
            with boundaries(name):  # swapped outside the timed window
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
        engine, reqs, reference = engines[name], requests[name], references[name]
        tokens = sum(len(r.output) for r in reqs) - emitted[name]
        accepts = [a for r in reqs for a in r.accept_lens[args.warmup:]]
        with boundaries(name):
            profile = profile_steps(engine, reqs)
        rows.append({
            "config": name, "sglang_mhc": name == "sglang" and sglang_ops is not None,
            "step_ms": statistics.median(walls[name]) * 1e3,
            "tokens_per_s": tokens / sum(walls[name]), "mean_accept": statistics.mean(accepts),
            "verify_graph_us": replay["verify"][name], "extend_graph_us": replay["extend"][name],
            "chain_graph_us": replay["chain"][name],
            "rollback_host_us": median_us(engine.phase_walls.get("rollback", ())),
            **profile, **compare_tokens([r.output for r in reqs], reference),
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


def sglang_mhc_note(status: dict[str, dict]) -> str:
    """One markdown sentence: which mHC the "sglang" configuration ran per preset, from
    ``{preset: {"used": bool, "detail": str}}``."""
    parts = [f"{preset}: " + ("SGLang's own kernels" if s["used"] else "our fused ops")
             + f" ({s['detail']})" for preset, s in status.items()]
    return ("mHC boundaries in SGLang's arrangement (column `sglang_mhc`): " + "; ".join(parts)
            + ". `identical_to_greedy` compares each configuration with plain greedy decoding "
            "through its own mHC implementation.") if parts else ""


def main(args: argparse.Namespace) -> int:
    if args.quick:
        args.presets, args.batch, args.steps = args.presets[:1], args.batch[:2], 4
    env = common.environment()
    peer = common.sglang_peer("kernels/ops/kvcache/dsv4_c128_cleanup.py")
    sglang_clear = peer.clear_unaccepted_c128_draft_states if peer else None
    rows, greedy_rows, mhc_status = [], [], {}
    for preset_name in args.presets:
        dtype = getattr(torch, args.dtype)
        model = build_model(preset_name, device="cuda", dtype=dtype)
        sglang_ops = None
        if "sglang" in args.configs:
            if args.no_sglang_mhc:
                detail = "--no-sglang-mhc"
            else:
                sglang_ops, detail = sglang_mhc_implementation(model.cfg.hidden_size, dtype)
            mhc_status[preset_name] = {"used": sglang_ops is not None, "detail": detail}
            print(f"{preset_name}: SGLang's arrangement with "
                  f"{'SGLang' if sglang_ops is not None else 'our'} mHC: {detail}", flush=True)
        g = torch.Generator().manual_seed(0)
        for bs in args.batch:
            prompts = torch.randint(0, model.cfg.vocab_size, (bs, args.prompt),
                                    generator=g).tolist()
            new_tokens = 1 + W * (args.warmup + args.steps + 2) + W
            reference, timing = greedy_reference(model, bs, prompts, new_tokens)
            greedy_rows.append({"preset": preset_name, "dtype": args.dtype, "batch": bs,
                                "mhc": "ours", **timing, "same_requests_as_ours": bs})
            references = {name: reference for name in args.configs}
            if sglang_ops is not None:
                # SGLang's configuration is checked against (and drafts from) greedy decoding
                # with SGLang's mHC: against ours, bf16 rounding alone could part the tokens
                # and shift the forced acceptance schedule.
                with use_mhc_implementation(model, sglang_ops):
                    references["sglang"], timing = greedy_reference(model, bs, prompts,
                                                                    new_tokens)
                greedy_rows.append({
                    "preset": preset_name, "dtype": args.dtype, "batch": bs, "mhc": "sglang",
                    **timing, "same_requests_as_ours": sum(
                        a == b for a, b in zip(references["sglang"], reference))})
            common.print_table(greedy_rows[-1 - (sglang_ops is not None):], GREEDY_COLUMNS)
            batch_rows = [{"preset": preset_name, "dtype": args.dtype, "batch": bs, **row}
                          for row in run_batch(model, bs, prompts, references, args,
                                               sglang_clear, sglang_ops)]
            common.print_table(batch_rows, COLUMNS)
            rows += batch_rows
        del model, sglang_ops
        gc.collect()
        torch.cuda.empty_cache()
    payload = {"environment": env, "num_draft_tokens": W, "schedule": SCHEDULE,
               "sglang_kernel_in_loop": sglang_clear is not None, "sglang_mhc": mhc_status,
               "greedy": greedy_rows}
    notes = (__doc__ or "").split("\n\n", 1)[1].replace("\n", " ")
    if mhc_status:
        notes += "\n\n" + sglang_mhc_note(mhc_status)
    paths = common.write_results(args.out, args.name, payload, rows, COLUMNS, notes=notes)
    with open(paths[1], "a") as md:
        md.write("\nPlain greedy decoding per mHC implementation (`same_requests_as_ours`: "
                 "requests whose tokens equal greedy with our mHC):\n\n"
                 + common.markdown_table(greedy_rows, GREEDY_COLUMNS) + "\n")
    plot(rows, f"{args.out}/{args.name}.png")
    print(common.markdown_table(greedy_rows, GREEDY_COLUMNS))
    return 0
