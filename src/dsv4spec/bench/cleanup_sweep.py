"""The fused C128 rollback's tile (HALF_BLOCK x warps) swept at four geometries, float32 and
bf16, each beside the default plan's time; the tile of ``dsv4spec.kernels.c128_cleanup`` cites the
committed run (benchmarks/results/logs/tune_cleanup.log).

    dsv4spec bench cleanup-sweep --out DIR [--quick]

One line per geometry on stdout (the default's time, the best tile, every tile's median in a CUDA
graph, µs) and DIR/cleanup_sweep.json with every point. ``--quick``: the first two geometries.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dsv4spec.bench import common
from dsv4spec.bench.cleanup import Case
from dsv4spec.bench.common import time_in_graph
from dsv4spec.kernels.c128_cleanup import c128_cleanup_fused_triton_tiled

# (C128 layers, requests, draft tokens): DSV4-Pro's 31 layers, batch 1 to 256
GEOMETRIES = [(31, 1, 4), (31, 8, 4), (31, 64, 8), (31, 256, 8)]
HALF_BLOCKS = (64, 128, 256, 512)
WARPS = (1, 2, 4, 8)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"],
                        default=["float32", "bfloat16"], help="state dtypes")


def _launch(case: Case, half_block: int, num_warps: int) -> None:
    f = case.fused
    c128_cleanup_fused_triton_tiled(
        f.table, f.dtype, f.num_states, f.num_rows, f.half, f.ring_size, case.idx, case.seq,
        case.acc, case.num_draft, half_block=half_block, num_warps=num_warps)


def main(args: argparse.Namespace) -> int:
    rows = []
    for dtype in (getattr(torch, d) for d in args.dtype):
        for states, batch, draft in GEOMETRIES[:2] if args.quick else GEOMETRIES:
            case = Case(states, batch, draft, dtype, "worst")
            best, line = None, []
            for half_block in HALF_BLOCKS:
                for num_warps in WARPS:
                    us = time_in_graph(lambda: _launch(case, half_block, num_warps),
                                       rep_ms=10)["median_us"]
                    line.append(f"{half_block}/{num_warps}:{us:.2f}")
                    rows.append({"dtype": str(dtype), "states": states, "batch": batch,
                                 "draft": draft, "half_block": half_block,
                                 "num_warps": num_warps, "graph_us": us})
                    if best is None or us < best[0]:
                        best = (us, half_block, num_warps)
            default = time_in_graph(case.run_fused, rep_ms=10)["median_us"]
            print(f"{str(dtype):15s} {states},{batch},{draft}: default {default:.2f} µs, best "
                  f"{best[0]:.2f} µs at HALF_BLOCK={best[1]} warps={best[2]} | " + " ".join(line),
                  flush=True)
            rows.append({"dtype": str(dtype), "states": states, "batch": batch, "draft": draft,
                         "default": True, "graph_us": default})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cleanup_sweep.json").write_text(json.dumps(
        {"environment": common.environment(), "rows": rows}, indent=1))
    return 0
