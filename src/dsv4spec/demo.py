"""``dsv4spec demo``: speculative-decoding rollback on a DSV4-Pro-shaped C128 state pool."""

from __future__ import annotations

import os

import torch

# DSV4-Pro's released compress_ratios: [128, 128] + [4, 128] * 29 + [4] + [0 for the MTP layer]
# -> 31 C128 layers (tests/cache checks this against the released config.json when present).
PRO_COMPRESS_RATIOS = [128, 128] + [4, 128] * 29 + [4] + [0]


def run_demo(device: str | None = None) -> int:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # show the Triton kernel on CPU too
    from dsv4spec.cache import C128StatePool
    from dsv4spec.ops import clear_unaccepted_c128_draft_states_reference

    ratios = PRO_COMPRESS_RATIOS
    num_slots, num_draft, batch = 8, 4, 4
    fused = C128StatePool.from_compress_ratios(ratios, num_slots, device=device)
    loop = C128StatePool.from_compress_ratios(ratios, num_slots, device=device, cleanup="loop")
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
    for s in expected:
        clear_unaccepted_c128_draft_states_reference(s, idx, seq, acc, ring_size=256,
                                                     num_draft_tokens=num_draft)
    fused.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    loop.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    for b in range(batch):
        rows = [int(idx[b]) * 256 + (int(seq[b]) + j) % 256 for j in range(int(acc[b]), num_draft)]
        print(f"  request slot {int(idx[b])}: seq_len {int(seq[b])}, accepted {int(acc[b])}/"
              f"{num_draft} -> neutralised rows {rows} in every layer")
    same = all(torch.equal(a, e) and torch.equal(b, e)
               for a, b, e in zip(fused.states, loop.states, expected))
    print(f"fused and per-layer loop equal the reference in all {len(expected)} layers: {same}")

    if device.type != "cuda":
        print("timings need a GPU (the Triton interpreter is not a speed measurement): "
              "run `dsv4spec demo` or `dsv4spec bench cleanup` on a CUDA machine")
        return 0 if same else 1
    from dsv4spec.bench.common import time_eager

    t_fused = time_eager(lambda: fused.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft))
    t_loop = time_eager(lambda: loop.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft))
    t_fused, t_loop = t_fused["median_us"], t_loop["median_us"]
    print(f"rollback per step (eager median, CUDA events): fused {t_fused:.1f} µs, per-layer loop "
          f"{t_loop:.1f} µs ({t_loop / t_fused:.1f}x)")
    return 0 if same else 1
