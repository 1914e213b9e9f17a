"""``dsv4spec generate``: greedy generation with or without MTP speculative decoding.

Before a run estimated to take more than a minute (a prefill chunk and a step timed first, at
the start and the end of the context), one line on stderr states the estimate. Progress shows
on stderr: tqdm bars on a terminal (building a big preset's model, the prefill of a prompt longer
than a chunk, the generated tokens); where stderr is no terminal, or with ``--json``, only for a
run estimated past a minute, as a line 5 s into each phase and every 30 s after."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from dsv4spec.engine.generate import (
    MAX_NUM_DRAFT_TOKENS,
    PREFILL_CHUNK,
    ROLLBACKS,
    Engine,
    Request,
)
from dsv4spec.model.build import TINY_CHECKPOINT, build_model, packaged_checkpoint
from dsv4spec.model.config import PRESETS, ModelConfig, preset
from dsv4spec.model.model import Transformer
from dsv4spec.model.tokenizer import decode, encode
from dsv4spec.model.weights import CheckpointError, check_weights
from dsv4spec.usage import UsageError, int_in, nonempty, resolve_device

DEFAULT_NUM_DRAFT_TOKENS = 4
HEADROOM = 1.25  # allocator slack and temporaries over params + state + prefill
BASE_BYTES = 256 * 2**20  # the process itself: torch's libraries and thread pools
# Prefill chunks tried, largest first (fewer forwards) until one fits in memory.
CHUNK_CHOICES = (2048, 1024, 512, 256, 128, 64, 16)
LONG_RUN_S = 60.0  # a run estimated longer: its estimate first, progress on stderr whatever it is
PROGRESS_FIRST_S = 5.0  # progress as lines (no terminal): the first this far into a phase,
PROGRESS_EVERY_S = 30.0  # then one per this many seconds
BAR_DELAY_S = 2.0  # the model's build bar appears on a terminal only once building takes longer


def prompt_text(text: str) -> str:
    """An argparse ``type``: a non-empty prompt the byte tokenizer can encode (undecodable bytes
    in an argument arrive as surrogate escapes and are served as those bytes)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        encode(text)
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"holds {text[e.start]!r}, a lone surrogate that is "
                                         f"neither text nor an escaped byte; use --prompt-file "
                                         f"for raw bytes") from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", default=[], type=prompt_text,
                        help="a prompt, non-empty text (repeat for a batch); any bytes an "
                        "argument can hold are served as bytes")
    parser.add_argument("--prompt-file", action="append", default=[], metavar="PATH",
                        type=nonempty, help="a prompt read from a file, its bytes as they are "
                        "(- reads standard input; repeat for a batch, after the --prompt ones)")
    parser.add_argument("--max-new-tokens", type=int_in(1), default=64,
                        help="tokens to generate per prompt, >= 1; with the longest prompt "
                        "within the preset's context, and memory for the run checked "
                        "before starting")
    parser.add_argument("--num-draft-tokens", type=int_in(2, MAX_NUM_DRAFT_TOKENS,
                                                          " (--no-spec: plain greedy)"),
                        default=None, help=f"W, tokens per speculative step (the verified-in "
                        f"token and W - 1 drafts), 2..{MAX_NUM_DRAFT_TOKENS}; default "
                        f"{DEFAULT_NUM_DRAFT_TOKENS}")
    parser.add_argument("--no-spec", action="store_true", help="plain greedy decoding (not "
                        "with --num-draft-tokens)")
    parser.add_argument("--checkpoint", default=None, type=nonempty,
                        help=f"safetensors weights of the preset (default for tiny: the "
                        f"packaged {TINY_CHECKPOINT.name}; other presets: random weights)")
    parser.add_argument("--preset", choices=list(PRESETS), default="tiny",
                        help="model shape: tiny (0.32 M parameters, trained checkpoint "
                        "packaged), flash-shape or pro-shape (DSV4's layer counts and widths, "
                        "1.2 B / 2.9 B parameters, random weights)")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default="float32",
                        help="model dtype (what DSV4 keeps in float32 stays float32)")
    parser.add_argument("--prefill-chunk", type=int_in(1), default=None, metavar="N",
                        help=f"prompt tokens per prefill forward (default: the largest of "
                        f"{', '.join(map(str, CHUNK_CHOICES))} whose memory fits)")
    parser.add_argument("--rollback", choices=ROLLBACKS, default="fused",
                        help="C128 rollback after each verify: one fused launch, one launch "
                        "per layer, or none")
    parser.add_argument("--rollback-after-verify", action="store_true",
                        help="run the rollback after the verify step (SGLang's arrangement) "
                        "instead of inside it")
    parser.add_argument("--draft-hc-head-impl", choices=["auto", "eager", "compiled", "triton"],
                        default=None, help="the MTP block's hc_head (default: as the target's)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="capture every decode-time phase per batch-size bucket (CUDA only)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: the outputs and what ran (prompts, preset, "
                        "dtype, device, draft tokens, seconds)")


def read_prompts(args: argparse.Namespace) -> list[bytes]:
    """The prompts of ``--prompt`` then ``--prompt-file`` as bytes, or :class:`UsageError`."""
    prompts = [p.encode("utf-8", "surrogateescape") for p in args.prompt]
    for path in args.prompt_file:
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as e:
            raise UsageError("--prompt-file", f"cannot read {path}: "
                             f"{e.strerror or e}") from None
        if not data:
            raise UsageError("--prompt-file", f"{'standard input' if path == '-' else path} "
                             f"is empty")
        prompts.append(data)
    if not prompts:
        raise UsageError("--prompt", "give at least one --prompt or --prompt-file")
    return prompts


def longest_prompt(args: argparse.Namespace) -> tuple[str, str]:
    """The argument that gave the longest of ``args.prompts`` (``--prompt`` or
    ``--prompt-file``), and that prompt as a message names it."""
    i = max(range(len(args.prompts)), key=lambda k: len(args.prompts[k]))
    size = f"{len(args.prompts[i])}-byte prompt"
    if i < len(args.prompt):
        return "--prompt", f"a {size}"
    path = args.prompt_file[i - len(args.prompt)]
    return "--prompt-file", f"the {size} of {'standard input' if path == '-' else path}"


def _bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def prefill_bytes(cfg: ModelConfig, dtype: torch.dtype, num_prompts: int, chunk: int,
                  max_seq_len: int, num_draft_tokens: int) -> int:
    """What one prefill forward of ``chunk`` tokens per prompt allocates at its peak, late in a
    prompt of ``max_seq_len`` (the most entries to attend to): a layer's attention scores
    ``[B, chunk, heads, window + chunk + entries]`` in float32 or wider (scores, masked,
    softmax with the sink, its contiguous copy), their masks, and the chunk's activations
    through the widest layer."""
    B, n, cs = num_prompts, chunk, max(dtype.itemsize, 4)
    ratios = [r for r in cfg.compress_ratios if r]
    keys = cfg.sliding_window + max(num_draft_tokens, 2) + n
    keys += max_seq_len // min(ratios) + 1 if ratios else 0
    scores = 4 * B * n * cfg.num_attention_heads * (keys + 1) * cs
    masks = 4 * B * n * keys  # bool, one per layer kind and the window's
    width = cfg.hc_mult * cfg.hidden_size
    per_token = (8 * width + 4 * cfg.num_attention_heads * cfg.head_dim
                 + 3 * cfg.intermediate_size + 3 * cfg.vocab_size)
    return scores + masks + B * n * per_token * cs


@functools.lru_cache(maxsize=4)
def meta_model(cfg: ModelConfig) -> Transformer:
    """The model of ``cfg`` on the meta device (shapes, no storage), built once per config: the
    memory estimate (per prefill chunk tried), the checkpoint's header check and the build's
    progress all read it, and building it takes seconds for a DSV4-Pro-shaped preset."""
    with torch.device("meta"):
        return Transformer(cfg)


def memory_need(cfg: ModelConfig, dtype: torch.dtype, num_slots: int, max_seq_len: int,
                num_draft_tokens: int, prefill_chunk: int) -> dict[str, int]:
    """An estimate of the memory a run takes, in parts: the parameters as built (float32, then
    cast), the engine's request state (measured on the meta device), a prefill forward at
    ``prefill_chunk`` (:func:`prefill_bytes`); ``total`` is their sum times ``HEADROOM``, plus
    ``BASE_BYTES``."""
    model = meta_model(cfg)
    with torch.device("meta"):
        state = model.new_state(num_slots, max_seq_len, max(num_draft_tokens, 2), "meta")
    numel = sum(p.numel() for p in model.parameters())
    params = 4 * numel + (0 if dtype == torch.float32 else numel * dtype.itemsize)
    tensors = {id(t): t for t in [*state.window, *state.rows, *state.entries,
                                  *state.c128.states] if t is not None}
    scale = dtype.itemsize / 4  # the state is built in float32 on meta: window and entries scale
    state_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    state_bytes += sum(t.numel() * t.element_size() * (scale - 1)
                       for t in [*state.window, *state.entries] if t is not None)
    prefill = prefill_bytes(cfg, dtype, num_slots, prefill_chunk, max_seq_len, num_draft_tokens)
    parts = {"parameters": params, "request state": int(state_bytes), "prefill": prefill}
    parts["total"] = int(sum(parts.values()) * HEADROOM) + BASE_BYTES
    return parts


def needed_bytes(cfg: ModelConfig, dtype: torch.dtype, num_slots: int, max_seq_len: int,
                 num_draft_tokens: int, prefill_chunk: int = PREFILL_CHUNK) -> int:
    """The total of :func:`memory_need`."""
    return memory_need(cfg, dtype, num_slots, max_seq_len, num_draft_tokens,
                       prefill_chunk)["total"]


def available_bytes(device: torch.device) -> tuple[int, str] | None:
    """Memory a run on ``device`` may take, and where the limit comes from (CUDA: the driver's
    free memory; CPU: the least of the kernel's MemAvailable, the cgroup's limit less its use,
    and ``ulimit -v`` less this process's address space), or None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], "free"
    limits = []
    meminfo = _proc_fields("/proc/meminfo")
    if "MemAvailable" in meminfo:
        limits.append((meminfo["MemAvailable"], "available"))
    try:
        cap = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if cap != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            limits.append((int(cap) - used, "free under the cgroup's memory.max"))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        size = _proc_fields("/proc/self/status").get("VmSize", 0)
        limits.append((soft - size, "free under ulimit -v"))
    return min(limits) if limits else None


def _proc_fields(path: str) -> dict[str, int]:
    """``Name: value kB`` lines of a /proc file, in bytes."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                words = rest.split()
                if len(words) == 2 and words[1] == "kB" and words[0].isdigit():
                    fields[name] = int(words[0]) * 1024
    except OSError:
        pass
    return fields


def choose_prefill_chunk(need, free: int | None, longest: int, asked: int | None) -> int:
    """``asked`` (at most the longest prompt), or the largest of ``CHUNK_CHOICES`` that fits in
    ``free`` per ``need(chunk)`` (the smallest when none does)."""
    if asked is not None:
        return min(asked, longest)
    chunks = [min(c, longest) for c in CHUNK_CHOICES]
    for c in chunks:
        if free is None or need(c)["total"] <= free:
            return c
    return chunks[-1]


def check_args(args: argparse.Namespace) -> tuple[torch.device, ModelConfig, int, int, int]:
    """What the arguments ask checked against the model, the engine and this machine, before
    anything runs: (device, config, W, the engine's max_seq_len, the prefill chunk), or
    :class:`UsageError`. Sets ``args.prompts`` (bytes)."""
    if args.no_spec and args.num_draft_tokens is not None:
        raise UsageError("--no-spec", "not allowed with argument --num-draft-tokens (plain "
                         "greedy drafts nothing)")
    args.prompts = read_prompts(args)
    device = resolve_device(args.device)
    if args.cuda_graphs and device.type != "cuda":
        raise UsageError("--cuda-graphs", f"needs a CUDA device; this run is on {device}")
    if (args.draft_hc_head_impl == "triton" and device.type != "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"):
        raise UsageError("--draft-hc-head-impl", "triton needs a CUDA device (or "
                         "TRITON_INTERPRET=1 on the CPU); choose auto, eager or compiled")
    cfg = preset(args.preset)
    W = 0 if args.no_spec else args.num_draft_tokens or DEFAULT_NUM_DRAFT_TOKENS
    longest = max(len(p) for p in args.prompts)
    max_len = longest + args.max_new_tokens + 2 * max(W, 2)
    if max_len > cfg.max_position_embeddings:
        room = cfg.max_position_embeddings - longest - 2 * max(W, 2)
        if room < 1:
            argument, prompt = longest_prompt(args)
            raise UsageError(argument, f"{prompt} is longer than preset {args.preset}'s context "
                             f"of {cfg.max_position_embeddings} tokens")
        raise UsageError("--max-new-tokens", f"must be <= {room} for this prompt (preset "
                         f"{args.preset}'s context is {cfg.max_position_embeddings} tokens, the "
                         f"longest prompt takes {longest}), got {args.max_new_tokens}")
    dtype = getattr(torch, args.dtype)
    budget = available_bytes(device)
    free = None if budget is None else budget[0]

    def need(chunk: int) -> dict[str, int]:
        return memory_need(cfg, dtype, len(args.prompts), max_len, W, chunk)

    chunk = choose_prefill_chunk(need, free, longest, args.prefill_chunk)
    parts = need(chunk)
    if free is not None and parts["total"] > free:
        raise UsageError(*_memory_refusal(args, parts, budget, device, chunk, longest, need))
    return device, cfg, W, max_len, chunk


def _memory_refusal(args, parts: dict[str, int], budget: tuple[int, str], device, chunk: int,
                    longest: int, need) -> tuple[str, str]:
    """The argument to blame for a run that does not fit, and the one-line message: the part
    that needs the most names its argument."""
    free, where = budget
    spent = ", ".join(f"{k} {_bytes(v)}" for k, v in parts.items() if k != "total")
    head = (f"about {_bytes(parts['total'])} needed ({spent}, with headroom), {device} has "
            f"{_bytes(free)} {where}")
    biggest = max(("parameters", "request state", "prefill"), key=parts.get)
    if biggest == "parameters":
        return "--preset", (f"preset {args.preset} in {args.dtype} does not fit: {head}; "
                            f"choose a smaller preset or dtype")
    if biggest == "prefill" and args.prefill_chunk is not None:
        smaller = [c for c in CHUNK_CHOICES if c < chunk and need(c)["total"] <= free]
        hint = f"try --prefill-chunk {smaller[0]}" if smaller else "no chunk size fits"
        return "--prefill-chunk", f"{chunk} tokens per prefill forward do not fit: {head}; {hint}"
    if longest >= args.max_new_tokens:
        argument, prompt = longest_prompt(args)
        return argument, (f"{prompt} does not fit: {head}; shorten the prompt or ask for "
                          f"fewer prompts")
    return "--max-new-tokens", (f"{args.max_new_tokens} new tokens for {len(args.prompts)} "
                                f"prompt(s) do not fit: {head}; ask for fewer tokens or prompts")


def main(args: argparse.Namespace) -> int:
    device, cfg, W, max_len, chunk = check_args(args)
    dtype = getattr(torch, args.dtype)
    checkpoint = args.checkpoint or packaged_checkpoint(args.preset)
    if checkpoint is None:
        print(f"no checkpoint for {args.preset}: random weights (drafts are rarely accepted)",
              file=sys.stderr)
    if checkpoint is not None:
        try:
            check_weights(meta_model(cfg), checkpoint)  # the header only, before building the model
        except CheckpointError as e:
            raise UsageError("--checkpoint", str(e)) from e
    terminal = _stderr_is_terminal()
    with _build_progress(cfg, f"building {args.preset}", terminal and not args.json):
        model = build_model(cfg, checkpoint, device=device, dtype=dtype)
    reqs = [Request(encode(p), args.max_new_tokens) for p in args.prompts]
    engine = Engine(model, num_slots=len(reqs), max_seq_len=max_len, num_draft_tokens=W,
                    rollback=args.rollback, rollback_in_verify=not args.rollback_after_verify,
                    draft_hc_head_impl=args.draft_hc_head_impl, cuda_graphs=args.cuda_graphs,
                    prefill_chunk=chunk)
    times = engine.measure([r.prompt for r in reqs], args.max_new_tokens)
    estimate, what = run_estimate(times, max(len(r.prompt) for r in reqs), args.max_new_tokens,
                                  W)
    long = estimate > LONG_RUN_S
    if long:
        where = "this CPU" if device.type == "cpu" else str(device)
        print(f"generate: about {duration(estimate)} on {where} ({what}); Ctrl-C interrupts it",
              file=sys.stderr, flush=True)
    bars = []
    if long or (terminal and not args.json):
        bars = _progress(engine, reqs, chunk, bar=terminal)
    start = time.perf_counter()
    try:
        engine.generate(reqs)
    finally:  # an interrupt's message then starts on a line of its own
        for bar in bars:
            bar.close()
    seconds = time.perf_counter() - start
    accepts = [a for r in reqs for a in r.accept_lens]
    mean = sum(accepts) / len(accepts) if accepts else 1.0
    tokens = sum(len(r.output) for r in reqs)
    if args.json:
        print(json.dumps({"prompts": [decode(r.prompt) for r in reqs],
                          "prompt_tokens": [len(r.prompt) for r in reqs],
                          "preset": args.preset, "dtype": args.dtype, "device": str(device),
                          "num_draft_tokens": W, "prefill_chunk": chunk,
                          "max_new_tokens": args.max_new_tokens,
                          "tokens": [r.output for r in reqs],
                          "text": [decode(r.output) for r in reqs],
                          "accept_lens": [r.accept_lens for r in reqs],
                          "mean_accept_len": mean, "seconds": seconds,
                          "tokens_per_s": tokens / seconds,
                          "phase_seconds": dict(engine.phase_seconds)}))
        return 0
    for r in reqs:
        print(f"--- {_shown(decode(r.prompt))}\n{decode(r.output)}")
    if W:
        hist = Counter(accepts)
        print("accept length histogram: " + ", ".join(f"{a}: {hist[a]}" for a in range(1, W + 1)))
        print(f"mean accepted tokens per step: {mean:.2f} of {W}")
    print(f"{tokens} tokens in {seconds:.2f} s: {tokens / seconds:.1f} tokens/s on {device}")
    print("time per phase: " + ", ".join(f"{k} {v * 1e3:.0f} ms"
                                         for k, v in engine.phase_seconds.items()))
    return 0


def run_estimate(times: dict[str, float], longest: int, max_new_tokens: int,
                 W: int) -> tuple[float, str]:
    """Seconds a run takes, from :meth:`Engine.measure`'s ``times``, and what they are made of,
    for the estimate's line. The prefill takes the measured chunk's time per token for the
    longest prompt; a chunk's or a step's cost grows with its position (the entries attended
    to), taken as linear between the first and the last measured; a speculative step is counted
    per token, as if no draft were accepted (an upper bound)."""
    size = times["prefill_tokens"]
    first, last = times["prefill_first"], times["prefill_last"]
    prefill = first if longest <= size else longest / size * (first + last) / 2
    steps = max_new_tokens - 1
    decoding = steps * (times["step_first"] + times["step_last"]) / 2
    parts = []
    if longest > size:
        parts.append(f"prefill {duration(prefill)}: {longest:,} tokens, "
                     f"{_span(first / size, last / size)} per token measured")
    if steps:
        per = "per step measured, one step per token at most" if W else "per token measured"
        parts.append(f"{max_new_tokens:,} tokens, "
                     f"{_span(times['step_first'], times['step_last'])} {per}")
    else:
        parts.append(f"{max_new_tokens:,} token, from the prefill")
    return prefill + decoding, "; ".join(parts)


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a wait: 45 s, 12 min, 3 h 20 min, 12 days (290 h)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    return f"{round(hours / 24)} days ({hours:,} h)"


def _seconds(t: float) -> str:
    """A measured time: 470 µs, 4.1 ms, 190 ms, 2.3 s, or as :func:`duration` from 90 s on."""
    if t < 0.001:
        return f"{t * 1e6:.0f} µs"
    if t < 0.01:
        return f"{t * 1e3:.1f} ms"
    if t < 1:
        return f"{t * 1e3:.0f} ms"
    return f"{t:.1f} s" if t < 90 else duration(t)


def _span(first: float, last: float) -> str:
    """A time measured at the start of the context and at its end: the first, or both where the
    end's is more than a fifth longer."""
    if last <= 1.2 * first:
        return _seconds(first)
    return f"{_seconds(first)} rising to {_seconds(last)}"


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


class _Lines:
    """Progress as lines on stderr, which a log keeps (tqdm redraws one line with carriage
    returns): a line ``PROGRESS_FIRST_S`` into the phase and one every ``PROGRESS_EVERY_S``
    after, with the rate and the time left at that rate; while the phase's time projected from
    that rate is at most ``over`` seconds, none. ``unit`` None: a percentage only."""

    def __init__(self, total: int, desc: str, unit: str | None = "tok",
                 over: float = 0.0) -> None:
        self.total, self.desc, self.unit, self.over = total, desc, unit, over
        self.n = 0
        self.start = _clock()
        self.due = self.start + PROGRESS_FIRST_S

    def update(self, k: int = 1) -> None:
        self.n += k
        now = _clock()
        if now < self.due or not self.n:
            return
        self.due = now + PROGRESS_EVERY_S
        elapsed = now - self.start
        projected = elapsed * self.total / self.n
        if projected <= self.over:
            return
        share = f"{100 * min(self.n, self.total) / self.total:.0f} %"
        if self.unit is not None:
            rate = self.n / elapsed if elapsed > 0 else 0.0
            share = (f"{self.n:,} of {self.total:,} {self.unit} ({share}), "
                     f"{rate:,.1f} {self.unit}/s")
        print(f"{self.desc}: {share}, about {duration(max(projected - elapsed, 0))} left",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _clock() -> float:
    return time.monotonic()


def _progress_bar(total: int, desc: str, *, bar: bool, unit: str | None = "tok",
                  over: float = 0.0, **tqdm_args):
    """A tqdm bar on stderr where ``bar`` (a terminal) and tqdm is installed; else
    :class:`_Lines` (``over``: none while the phase is projected to end within it; 0 where a
    bar was asked)."""
    if bar:
        try:
            from tqdm import tqdm
        except ImportError:
            return _Lines(total, desc, unit)
        return tqdm(total=total, desc=desc, **({"unit": unit} if unit else {}), **tqdm_args)
    return _Lines(total, desc, unit, over)


@contextlib.contextmanager
def _build_progress(cfg: ModelConfig, desc: str, bar: bool):
    """Progress of building a model of ``cfg`` inside the block, in two parts of the parameters'
    size each: constructing them (counted as they are registered) and filling them (random or
    a checkpoint's weights: counted as they are copied in). A terminal's bar appears once it
    has taken ``BAR_DELAY_S`` (a small preset's build shows nothing); lines where ``bar`` is
    false, only while the build is projected past ``LONG_RUN_S``."""
    numel = sum(p.numel() for p in meta_model(cfg).parameters())
    progress = _progress_bar(2 * numel, desc, bar=bar, unit=None, over=LONG_RUN_S,
                             delay=BAR_DELAY_S,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")

    def registered(module, name, param):
        if param is not None:
            progress.update(param.numel())

    class Filled(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if (getattr(func, "__name__", "") == "copy_" and args
                    and isinstance(args[0], torch.nn.Parameter)):
                progress.update(args[0].numel())
            return func(*args, **(kwargs or {}))

    hook = torch.nn.modules.module.register_module_parameter_registration_hook(registered)
    try:
        with Filled():
            yield
    finally:
        hook.remove()
        progress.close()


def _shown(prompt: str, limit: int = 200) -> str:
    """A prompt as the output heads it: its repr, long ones cut in the middle."""
    if len(prompt) <= limit:
        return repr(prompt)
    return f"{prompt[:limit // 2]!r} ... {prompt[-limit // 2:]!r} ({len(prompt)} characters)"


def _progress(engine: Engine, reqs: list[Request], chunk: int, bar: bool) -> list:
    """Progress on stderr, one phase at a time: the prefill (prompts longer than one chunk),
    then the generated tokens from the first step on; tqdm bars where ``bar``, else lines
    (:class:`_Lines`). Returns them, for closing."""
    bars = []
    prompt_tokens = sum(len(r.prompt) for r in reqs)
    if max(len(r.prompt) for r in reqs) > chunk:
        prefill = _progress_bar(prompt_tokens, "prefill", bar=bar)
        bars.append(prefill)

        def on_prefill(e, done: int) -> None:
            prefill.update(done - prefill.n)
            if done == prompt_tokens:
                prefill.close()

        engine.on_prefill = on_prefill

    def on_step(e, active) -> None:
        if len(bars) == 0 or bars[-1].desc != "generate":
            bars.append(_progress_bar(len(reqs) * reqs[0].max_new_tokens, "generate",
                                      bar=bar))
        bars[-1].update(sum(len(r.output) for r in reqs) - bars[-1].n)

    engine.on_step = on_step
    return bars
