"""Tilings of the mHC ops timed whole, in a CUDA graph, at H = 7168: the fused boundary and
``mhc_pre`` over partials splits (``block_k``), partials warps and finalize H-blocks, and
``mhc_post`` over H-block widths and warps. The defaults in ``dsv4spec.kernels.mhc`` come from here.

    PYTHONPATH=src python3 scripts/mhc_sweep.py OUT_DIR [--tokens 1 2 4 8 16 32]

Writes OUT_DIR/mhc_sweep.json (every point, and the best per op and T beside the default's time).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
import triton

from dsv4spec.kernels import mhc as K
from dsv4spec.ops import mhc_post, mhc_post_pre, mhc_pre
from dsv4spec.timing import time_in_graph

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mhc_probe import H, boundary_inputs  # noqa: E402


def median_us(fn) -> float:
    return round(time_in_graph(fn)["median_us"], 2)


def boundary_points(T: int) -> list[dict]:
    """mhc_pre and mhc_post_pre under each tiling override (the planner patched for the call)."""
    x, fn, sc, base, nw, f, kw = boundary_inputs(T)
    post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
    ops = {"pre": lambda: mhc_pre(x, fn, sc, base, **kw),
           "post_pre": lambda: mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)}
    default = K.plan(T, H, 0)
    rows = [{"T": T, "variant": "default", "cfg": default._asdict(),
             **{op: median_us(call) for op, call in ops.items()}}]
    planner = K._plan
    grid = itertools.product((64, 128, 256), (2, 4, 8), (128, 256, 512))
    try:
        for block_k, warps, block_h in grid:
            overrides = {"block_k": block_k, "warps": (warps, 1), "block_h": block_h}
            cfg = planner(T, H, 0, **overrides)
            if cfg.block_t * block_k > 512:  # the FMA tile would not fit in registers
                continue
            K._plan = lambda t, h, d, _o=overrides: planner(t, h, d, **_o)
            row = {"T": T, "variant": f"k{block_k}_w{warps}_h{block_h}", "cfg": cfg._asdict()}
            try:
                for op, call in ops.items():
                    row[op] = median_us(call)
            except Exception as e:  # noqa: BLE001 - a sweep reports and goes on
                row["error"] = repr(e)[:160]
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        K._plan = planner
    return rows


def post_points(T: int) -> list[dict]:
    x, fn, sc, base, nw, f, kw = boundary_inputs(T)
    post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
    out = torch.empty_like(x)
    rows = [{"T": T, "variant": "default", "post": median_us(lambda: mhc_post(f, x, post, comb))}]
    for block_h, warps in itertools.product((256, 512, 1024, 2048), (1, 2, 4, 8)):
        nh = triton.cdiv(H, block_h)
        args = (f, x, post, comb, out, H, nh)

        def call(nh=nh, block_h=block_h, warps=warps, args=args):
            K.JIT_KERNELS["post"][(T * nh,)](*args, BLOCK_H=block_h, num_warps=warps)

        row = {"T": T, "variant": f"h{block_h}_w{warps}", "post": median_us(call)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def best(rows: list[dict], op: str) -> dict:
    timed = [r for r in rows if isinstance(r.get(op), float)]
    top = min(timed, key=lambda r: r[op])
    default = next(r for r in rows if r["variant"] == "default")
    return {"T": rows[0]["T"], "op": op, "default_us": default[op], "best_us": top[op],
            "best": top["variant"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--post-tokens", type=int, nargs="+", default=[1, 4, 16, 32, 64, 4096])
    a = p.parse_args(argv)
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "H": H, "boundary": [], "post": [], "best": []}
    for T in a.tokens:
        rows = boundary_points(T)
        res["boundary"] += rows
        res["best"] += [best(rows, "pre"), best(rows, "post_pre")]
    for T in a.post_tokens:
        rows = post_points(T)
        res["post"] += rows
        res["best"].append(best(rows, "post"))
    for row in res["best"]:
        print(json.dumps(row))
    with open(f"{a.out}/mhc_sweep.json", "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
