"""``dsv4spec demo``: check the fused C128 rollback against the per-layer loop and the reference
on a DSV4-Pro-shaped pool, then generate with the trained tiny model with and without MTP
speculative decoding and compare the outputs (identical: lossless).

The rollback is timed on CUDA only: on the CPU its Triton kernel runs in Triton's interpreter,
which is no speed measurement. The generation's tokens/s on the CPU come with the same caveat
beside them: they say nothing about a GPU, and on the CPU MTP may run slower than greedy. Exit
status 1 when an output differs from its reference."""

from __future__ import annotations

import argparse
import os

import torch

from dsv4spec.usage import resolve_device


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None,
                        help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")


def gpu_caveat(why: str, bench: str) -> str:
    """The line printed beside timings taken without a GPU: why they say nothing, and what to run
    on one."""
    return (f"timings need a GPU ({why}): run `dsv4spec demo` or `dsv4spec bench {bench}` on a "
            f"CUDA machine")


def main(args: argparse.Namespace) -> int:
    return run_demo(resolve_device(args.device))


def run_demo(device: torch.device | str | None = None) -> int:
    device = resolve_device(None) if device is None else torch.device(device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # show the Triton kernel on CPU too
    from dsv4spec.cache import C128StatePool
    from dsv4spec.model.config import RELEASED_CONFIGS, ModelConfig
    from dsv4spec.ops import clear_unaccepted_c128_draft_states_reference

    cfg = ModelConfig.from_hf(RELEASED_CONFIGS["pro"])  # DSV4-Pro: 31 C128 layers
    num_slots, num_draft, batch = 8, 4, 4
    pool = dict(ring_size=cfg.state_ring_size(cfg.compress_ratio, speculative=True),
                head_dim=cfg.head_dim, device=device)
    fused = C128StatePool(cfg.num_c128_layers, num_slots, **pool)
    loop = C128StatePool(cfg.num_c128_layers, num_slots, cleanup="loop", **pool)
    print(f"C128 state pool: {len(fused.states)} layers x [{fused.num_rows}, "
          f"{2 * fused.head_dim}] {fused.states[0].dtype} on {device}, ring {fused.ring_size}, "
          f"cleanup backend: {fused.cleanup.backend}")

    g = torch.Generator().manual_seed(0)
    for a, b in zip(fused.states, loop.states):  # rows a step would have written: random
        a.copy_(torch.randn(a.shape, generator=g).to(a.dtype))
        b.copy_(a)
    idx = torch.tensor([0, 3, 5, 6], device=device)
    seq = torch.tensor([10, 254, 300, 511], device=device)  # 254 and 511 wrap around the ring
    acc = torch.tensor([1, 2, 4, 3], device=device)
    expected = [s.clone() for s in fused.states]
    ring = fused.ring_size  # 256
    for s in expected:
        clear_unaccepted_c128_draft_states_reference(s, idx, seq, acc, ring_size=ring,
                                                     num_draft_tokens=num_draft)
    fused.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    loop.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    for b in range(batch):
        rows = [int(idx[b]) * ring + (int(seq[b]) + j) % ring
                for j in range(int(acc[b]), num_draft)]
        print(f"  request slot {int(idx[b])}: seq_len {int(seq[b])}, accepted {int(acc[b])}/"
              f"{num_draft} -> neutralised rows {rows} in every layer")
    same = all(torch.equal(a, e) and torch.equal(b, e)
               for a, b, e in zip(fused.states, loop.states, expected))
    print(f"fused and per-layer loop equal the reference in all {len(expected)} layers: {same}")

    if device.type != "cuda":
        print(gpu_caveat("the Triton interpreter is not a speed measurement", "cleanup"))
    else:
        from dsv4spec.timing import time_eager

        t_fused = time_eager(lambda: fused.clear_unaccepted_c128_draft_states(idx, seq, acc,
                                                                              num_draft))
        t_loop = time_eager(lambda: loop.clear_unaccepted_c128_draft_states(idx, seq, acc,
                                                                             num_draft))
        t_fused, t_loop = t_fused["median_us"], t_loop["median_us"]
        print(f"rollback per step (eager wall per call): fused {t_fused:.1f} µs, per-layer loop "
              f"{t_loop:.1f} µs ({t_loop / t_fused:.1f}x)")
    return 0 if same and generation_demo(device) else 1


def generation_demo(device: torch.device, max_new_tokens: int = 48) -> bool:
    """The trained tiny model: greedy vs MTP speculative decoding, outputs compared."""
    import time
    from collections import Counter

    from dsv4spec.engine import Engine, Request
    from dsv4spec.model.build import TINY_CHECKPOINT, build_model
    from dsv4spec.model.tokenizer import decode, encode

    if not TINY_CHECKPOINT.exists():
        print(f"no trained checkpoint at {TINY_CHECKPOINT}: run `dsv4spec train-tiny`")
        return True
    model = build_model("tiny", TINY_CHECKPOINT, device=device)
    if device.type != "cuda":
        model.hc_head_impl = "eager"  # the interpreter would be slow, not wrong
    prompts = ["import os\n", "def main(", "class Parser:\n    def "]
    print(f"\ntrained tiny model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M "
          f"parameters), {len(prompts)} prompts, {max_new_tokens} new bytes each:")
    outputs = {}
    for W in (0, 4):
        reqs = [Request(encode(p), max_new_tokens) for p in prompts]
        engine = Engine(model, num_slots=len(reqs), max_seq_len=128, num_draft_tokens=W)
        start = time.perf_counter()
        engine.generate(reqs)
        seconds = time.perf_counter() - start
        outputs[W] = [r.output for r in reqs]
        tokens = sum(len(r.output) for r in reqs)
        label = "greedy" if W == 0 else f"MTP speculative, W = {W}"
        print(f"  {label}: {tokens} tokens in {seconds:.2f} s ({tokens / seconds:.0f} tokens/s)")
        if W:
            accepts = [a for r in reqs for a in r.accept_lens]
            hist = Counter(accepts)
            print("    accept lengths: " + ", ".join(f"{a}: {hist[a]}" for a in range(1, W + 1))
                  + f"; mean {sum(accepts) / len(accepts):.2f} tokens per step, "
                  f"{len(accepts) / len(reqs):.1f} target steps per request vs "
                  f"{max_new_tokens - 1} without speculation")
    if device.type != "cuda":
        print("  " + gpu_caveat("CPU tokens/s say nothing about a GPU, and MTP may run slower "
                                "than greedy here", "e2e"))
    print(f"  {prompts[2]!r} -> {decode(outputs[4][2])!r}")
    same = outputs[0] == outputs[4]
    print(f"speculative output identical to greedy output: {same}")
    return same
