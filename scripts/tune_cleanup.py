"""Sweep the fused cleanup kernel's tile (HALF_BLOCK) and warps at a few geometries (GPU)."""

import sys

import torch

from dsv4spec.bench.cleanup import Case
from dsv4spec.bench.common import time_in_graph
from dsv4spec.kernels.c128_cleanup import c128_cleanup_fused_triton_tiled

GEOMETRIES = [(31, 1, 4), (31, 8, 4), (31, 64, 8), (31, 256, 8)]


def launch(case: Case, half_block: int, num_warps: int) -> None:
    f = case.fused
    c128_cleanup_fused_triton_tiled(
        f.table, f.dtype, f.num_states, f.num_rows, f.half, f.ring_size, case.idx, case.seq,
        case.acc, case.num_draft, half_block=half_block, num_warps=num_warps)


def main() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for states, batch, draft in GEOMETRIES:
            case = Case(states, batch, draft, dtype, "worst")
            best = None
            line = []
            for half_block in (64, 128, 256, 512):
                for num_warps in (1, 2, 4, 8):
                    us = time_in_graph(lambda: launch(case, half_block, num_warps), rep_ms=10)
                    us = us["median_us"]
                    line.append(f"{half_block}/{num_warps}:{us:.2f}")
                    if best is None or us < best[0]:
                        best = (us, half_block, num_warps)
            default = time_in_graph(case.run_fused, rep_ms=10)["median_us"]
            print(f"{str(dtype):15s} {states},{batch},{draft}: default {default:.2f} µs, best "
                  f"{best[0]:.2f} µs at HALF_BLOCK={best[1]} warps={best[2]} | " + " ".join(line))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
