"""``dsv4spec generate``: greedy generation with or without MTP speculative decoding."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

import torch

from dsv4spec.engine.generate import ROLLBACKS, Engine, Request
from dsv4spec.model.build import TINY_CHECKPOINT, build_model, packaged_checkpoint
from dsv4spec.model.tokenizer import decode, encode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", required=True,
                        help="a prompt (repeat for a batch)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    spec = parser.add_mutually_exclusive_group()
    spec.add_argument("--num-draft-tokens", type=int, default=4, help="W, 2..8")
    spec.add_argument("--no-spec", action="store_true", help="plain greedy decoding")
    parser.add_argument("--checkpoint", default=None,
                        help=f"safetensors weights (default for tiny: the packaged "
                        f"{TINY_CHECKPOINT.name})")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default="float32")
    parser.add_argument("--rollback", choices=ROLLBACKS, default="fused")
    parser.add_argument("--rollback-after-verify", action="store_true",
                        help="run the rollback after the verify step (SGLang's arrangement) "
                        "instead of inside it")
    parser.add_argument("--draft-hc-head-impl", choices=["auto", "eager", "compiled", "triton"],
                        default=None, help="the MTP block's hc_head (default: as the target's)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="capture every decode-time phase per batch-size bucket (CUDA)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def main(args: argparse.Namespace) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    checkpoint = args.checkpoint or packaged_checkpoint(args.preset)
    if checkpoint is None:
        print(f"no checkpoint for {args.preset}: random weights (drafts are rarely accepted)",
              file=sys.stderr)
    model = build_model(args.preset, checkpoint, device=device, dtype=dtype)
    W = 0 if args.no_spec else args.num_draft_tokens
    reqs = [Request(encode(p), args.max_new_tokens) for p in args.prompt]
    max_len = max(len(r.prompt) for r in reqs) + args.max_new_tokens + 2 * max(W, 2)
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
