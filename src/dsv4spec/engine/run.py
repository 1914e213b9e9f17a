"""``dsv4spec generate``: greedy generation with or without MTP speculative decoding."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

import torch

from dsv4spec.engine.generate import MAX_NUM_DRAFT_TOKENS, ROLLBACKS, Engine, Request
from dsv4spec.model.build import TINY_CHECKPOINT, build_model, packaged_checkpoint
from dsv4spec.model.config import PRESETS, ModelConfig, preset
from dsv4spec.model.model import Transformer
from dsv4spec.model.tokenizer import decode, encode
from dsv4spec.model.weights import CheckpointError, check_weights
from dsv4spec.usage import UsageError, int_in, nonempty, resolve_device

HEADROOM = 1.25  # activations, allocator slack and the process itself, over params + state
BASE_BYTES = 256 * 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", required=True, type=nonempty,
                        help="a prompt, non-empty text (repeat for a batch)")
    parser.add_argument("--max-new-tokens", type=int_in(1), default=64,
                        help="tokens to generate per prompt, >= 1; with the longest prompt "
                        "within the preset's context, and memory for its state checked "
                        "before starting")
    spec = parser.add_mutually_exclusive_group()
    spec.add_argument("--num-draft-tokens", type=int_in(2, MAX_NUM_DRAFT_TOKENS,
                                                        " (--no-spec: plain greedy)"),
                      default=4, help=f"W, tokens per speculative step (the verified-in token "
                      f"and W - 1 drafts), 2..{MAX_NUM_DRAFT_TOKENS}")
    spec.add_argument("--no-spec", action="store_true", help="plain greedy decoding")
    parser.add_argument("--checkpoint", default=None,
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
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def needed_bytes(cfg: ModelConfig, dtype: torch.dtype, num_slots: int, max_seq_len: int,
                 num_draft_tokens: int) -> int:
    """An estimate of the memory a run takes: the parameters as built (float32, then cast), the
    engine's request state (measured on the meta device), times ``HEADROOM``, plus
    ``BASE_BYTES``."""
    with torch.device("meta"):
        model = Transformer(cfg)
        state = model.new_state(num_slots, max_seq_len, max(num_draft_tokens, 2), "meta")
    numel = sum(p.numel() for p in model.parameters())
    params = 4 * numel + (0 if dtype == torch.float32 else numel * dtype.itemsize)
    tensors = {id(t): t for t in [*state.window, *state.rows, *state.entries,
                                  *state.c128.states] if t is not None}
    scale = dtype.itemsize / 4  # the state is built in float32 on meta: window and entries scale
    state_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    state_bytes += sum(t.numel() * t.element_size() * (scale - 1)
                       for t in [*state.window, *state.entries] if t is not None)
    return int((params + state_bytes) * HEADROOM) + BASE_BYTES


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (CUDA: the driver's; CPU: the kernel's MemAvailable), or None
    when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_args(args: argparse.Namespace) -> tuple[torch.device, ModelConfig, int, int]:
    """What the arguments ask checked against the model, the engine and this machine, before
    anything runs: (device, config, W, the engine's max_seq_len), or :class:`UsageError`."""
    device = resolve_device(args.device)
    if args.cuda_graphs and device.type != "cuda":
        raise UsageError("--cuda-graphs", f"needs a CUDA device; this run is on {device}")
    if (args.draft_hc_head_impl == "triton" and device.type != "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"):
        raise UsageError("--draft-hc-head-impl", "triton needs a CUDA device (or "
                         "TRITON_INTERPRET=1 on the CPU); choose auto, eager or compiled")
    cfg = preset(args.preset)
    W = 0 if args.no_spec else args.num_draft_tokens
    longest = max(len(encode(p)) for p in args.prompt)
    max_len = longest + args.max_new_tokens + 2 * max(W, 2)
    if max_len > cfg.max_position_embeddings:
        room = cfg.max_position_embeddings - longest - 2 * max(W, 2)
        if room < 1:
            raise UsageError("--prompt", f"{longest} bytes is longer than preset {args.preset}'s "
                             f"context of {cfg.max_position_embeddings} tokens")
        raise UsageError("--max-new-tokens", f"must be <= {room} for this prompt (preset "
                         f"{args.preset}'s context is {cfg.max_position_embeddings} tokens, the "
                         f"longest prompt takes {longest}), got {args.max_new_tokens}")
    dtype = getattr(torch, args.dtype)
    need = needed_bytes(cfg, dtype, len(args.prompt), max_len, W)
    free = available_bytes(device)
    if free is not None and need > free:
        raise UsageError("--max-new-tokens", f"{args.max_new_tokens} new tokens for "
                         f"{len(args.prompt)} prompt(s) of preset {args.preset} in {args.dtype} "
                         f"need about {_bytes(need)}, {device} has {_bytes(free)} free; ask "
                         f"for fewer tokens, prompts or a smaller preset")
    return device, cfg, W, max_len


def main(args: argparse.Namespace) -> int:
    device, cfg, W, max_len = check_args(args)
    dtype = getattr(torch, args.dtype)
    checkpoint = args.checkpoint or packaged_checkpoint(args.preset)
    if checkpoint is None:
        print(f"no checkpoint for {args.preset}: random weights (drafts are rarely accepted)",
              file=sys.stderr)
    if checkpoint is not None:
        with torch.device("meta"):
            shapes = Transformer(cfg)
        try:
            check_weights(shapes, checkpoint)  # the header only, before building the model
        except CheckpointError as e:
            raise UsageError("--checkpoint", str(e)) from e
    model = build_model(cfg, checkpoint, device=device, dtype=dtype)
    reqs = [Request(encode(p), args.max_new_tokens) for p in args.prompt]
    engine = Engine(model, num_slots=len(reqs), max_seq_len=max_len, num_draft_tokens=W,
                    rollback=args.rollback, rollback_in_verify=not args.rollback_after_verify,
                    draft_hc_head_impl=args.draft_hc_head_impl, cuda_graphs=args.cuda_graphs)
    bar = None
    if not args.json:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(reqs) * args.max_new_tokens, desc="generate", unit="tok")
        except ImportError:
            pass
    if bar is not None:
        engine.on_step = lambda e, active: bar.update(
            sum(len(r.output) for r in reqs) - bar.n)
    start = time.perf_counter()
    engine.generate(reqs)
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.update(sum(len(r.output) for r in reqs) - bar.n)
        bar.close()
    accepts = [a for r in reqs for a in r.accept_lens]
    mean = sum(accepts) / len(accepts) if accepts else 1.0
    tokens = sum(len(r.output) for r in reqs)
    if args.json:
        print(json.dumps({"tokens": [r.output for r in reqs],
                          "text": [decode(r.output) for r in reqs],
                          "accept_lens": [r.accept_lens for r in reqs],
                          "mean_accept_len": mean, "num_draft_tokens": W,
                          "tokens_per_s": tokens / seconds,
                          "phase_seconds": dict(engine.phase_seconds)}))
        return 0
    for p, r in zip(args.prompt, reqs):
        print(f"--- {p!r}\n{decode(r.output)}")
    if W:
        hist = Counter(accepts)
        print("accept length histogram: " + ", ".join(f"{a}: {hist[a]}" for a in range(1, W + 1)))
        print(f"mean accepted tokens per step: {mean:.2f} of {W}")
    print(f"{tokens} tokens in {seconds:.2f} s: {tokens / seconds:.1f} tokens/s on {device}")
    print("time per phase: " + ", ".join(f"{k} {v * 1e3:.0f} ms"
                                         for k, v in engine.phase_seconds.items()))
    return 0
