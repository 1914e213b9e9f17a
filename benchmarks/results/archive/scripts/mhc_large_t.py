"""The mHC ops at prefill sizes on the GPU: the tensor-core partials' tilings (tokens as rows,
with ``fn`` split by its own launch or per chunk, against rows (t, i)) timed whole in a CUDA graph,
each checked against the float64 reference first, and the finalize launch alone at large T.

    PYTHONPATH=src python3 benchmarks/results/archive/scripts/mhc_large_t.py OUT_DIR [--sweep pre boundary finalize]

Writes OUT_DIR/mhc_large_t.json as it goes (a row per variant) and prints each row. It sweeps
the grid behind benchmarks/results/mhc/mhc_large_t.md (docs/design.md, mHC, tokens as rows) in
one run; that file's rows came from the working scripts this program was written from (the same
inputs, checks and timing, the grid in three runs), and this program has not itself run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from dsv4spec.kernels import mhc as K
from dsv4spec.ops import mhc_post_pre_reference, mhc_pre_reference
from dsv4spec.timing import time_in_graph

EPS = {"rms_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20, "post_mult": 2.0}


def token_rows(block_t: int, block_k: int, warps: int, stages: int, presplit: bool, **more):
    return dict(mma=True, token_rows=True, presplit=presplit, block_t=block_t, block_k=block_k,
                warps=(warps, 1), stages=stages, **more)


# name -> overrides of the planner ({}: its defaults)
PRE_VARIANTS = {"default": {}}
for _bt in (64, 128):
    for _bk in (32, 64):
        for _w in (4, 8):
            for _st in (2, 3, 4):
                for _split in (False, True):
                    PRE_VARIANTS[f"{'split' if _split else 'tok'} t{_bt} k{_bk} w{_w} s{_st}"] = (
                        token_rows(_bt, _bk, _w, _st, _split))
PRE_VARIANTS["tok t32 k32 w4 s3"] = token_rows(32, 32, 4, 3, False)
PRE_VARIANTS["tok t64 k16 w4 s3"] = token_rows(64, 16, 4, 3, False)
BOUNDARY_VARIANTS = {"rows (t, i)": {"token_rows": False},
                     "tok t64 k32 w4 s2": token_rows(64, 32, 4, 2, False),
                     "tok t64 k32 w4 s3": token_rows(64, 32, 4, 3, False),
                     "split t64 k32 w4 s2": token_rows(64, 32, 4, 2, True)}


class Case:
    """Random bf16 streams, fp32 parameters and the float64 reference of one (T, H)."""

    def __init__(self, T: int, H: int):
        g = torch.Generator().manual_seed(T + H)
        self.T, self.H = T, H
        self.x = torch.randn(T, 4, H, generator=g).to("cuda", torch.bfloat16)
        self.fn = (torch.randn(24, 4 * H, generator=g) * (4 * H) ** -0.5).cuda()
        self.scale = (torch.rand(3, generator=g) + 0.5).cuda()
        self.base = torch.randn(24, generator=g).cuda()
        self.norm_weight = (torch.rand(H, generator=g) + 0.5).cuda()
        self.f = torch.randn(T, H, generator=g).to("cuda", torch.bfloat16)
        self.kw = {**EPS, "norm_weight": self.norm_weight, "norm_eps": 1e-6}
        self.ref = mhc_pre_reference(self.x, self.fn, self.scale, self.base, **self.kw)

    def args(self):
        return (self.fn, self.scale, self.base, 1e-6, 1e-6, 20, 2.0, self.norm_weight, 1e-6)


class Sweep:
    """One sweep's record: the device and versions, the rows (each printed, and the JSON at
    ``path`` rewritten, as it comes) and the inputs of each (T, H), made once."""

    def __init__(self, path: str):
        self.path = path
        self.record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "cuda": torch.version.cuda,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
        self.rows = self.record["rows"]
        self.cases: dict = {}

    def case(self, T: int, H: int) -> Case:
        if (T, H) not in self.cases:
            self.cases[(T, H)] = Case(T, H)
        return self.cases[(T, H)]

    def emit(self, row: dict) -> None:
        print(json.dumps(row), flush=True)
        self.rows.append(row)
        with open(self.path, "w") as fh:
            json.dump(self.record, fh, indent=1)


def rel_err(got, ref) -> dict:
    return {name: ((g.double() - r.double()).abs().max() / r.double().abs().max()).item()
            for name, g, r in zip(("post", "comb", "layer_input"), got, ref)}


def time_variant(case: Case, op: str, name: str, overrides: dict) -> dict:
    row = {"op": op, "T": case.T, "H": case.H, "variant": name,
           "overrides": {k: str(v) for k, v in overrides.items()}}
    try:
        if op == "pre":
            def call():
                return K.mhc_pre_triton(case.x, *case.args(), **overrides)
            row["err"] = rel_err(call(), case.ref)
        else:
            post, comb = case.ref[0].float(), case.ref[1].float()

            def call():
                return K.mhc_post_pre_triton(case.f, case.x, post, comb, *case.args(),
                                             **overrides)
            got = call()
            ref = mhc_post_pre_reference(case.f, case.x, post, comb, case.fn, case.scale,
                                         case.base, **case.kw)
            row["err_residual"] = (got[0].double() - ref[0].double()).abs().max().item()
            row["err"] = rel_err(got[1:], ref[1:])
        torch.cuda.synchronize()
        row["us"] = round(time_in_graph(call)["median_us"], 2)
        row["cfg"] = K.plan(case.T, case.H, 0, dtype=torch.bfloat16, boundary=op != "pre",
                            **overrides)._asdict()
    except Exception as e:  # noqa: BLE001 - a sweep reports a variant that fails and goes on
        row["error"] = repr(e)[:300]
    return row


def finalize_alone(case: Case, block_h: int | None, warps: int) -> dict:
    cfg = K.plan(case.T, case.H, 0, dtype=torch.bfloat16)
    block_h = block_h or cfg.block_h
    nh = triton.cdiv(case.H, block_h)
    ws = torch.randn(case.T, 34, cfg.num_splits, device="cuda").abs()
    post, comb, out = K.pre_outputs(case.x, case.T, case.H)
    grid = (case.T * (nh + 1),)
    args = (case.x, ws, case.scale, case.base, case.norm_weight, post, comb, out, case.T,
            case.H, cfg.num_splits, nh, 1e-6, 1e-6, 1e-6, 2.0, ws.stride(0), ws.stride(1))
    kw = dict(SINKHORN_ITERS=20, RMSNORM=True, X_EARLY=True,
              BLOCK_S=triton.next_power_of_2(cfg.num_splits), BLOCK_H=block_h, PDL=False,
              FAST_MATH=True, VECTOR_SUMS=cfg.vector_sums, HEAD=False, SLOT_D=K.NMIX,
              num_warps=warps)
    kernel = K.JIT_KERNELS["finalize"]
    compiled = kernel[grid](*args, **kw)
    us = time_in_graph(lambda: kernel[grid](*args, **kw))["median_us"]
    return {"op": "finalize", "T": case.T, "H": case.H, "variant": f"h{block_h} w{warps}",
            "us": round(us, 2), "regs": compiled.n_regs, "spills": compiled.n_spills}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--sweep", nargs="+", default=["pre", "boundary", "finalize"],
                   choices=["pre", "boundary", "finalize"])
    a = p.parse_args(argv)
    sweep = Sweep(f"{a.out}/mhc_large_t.json")
    case, emit, rows = sweep.case, sweep.emit, sweep.rows

    if "pre" in a.sweep:
        for name, ov in PRE_VARIANTS.items():
            emit(time_variant(case(4096, 7168), "pre", name, ov))
        timed = [r for r in rows
                 if r["op"] == "pre" and "us" in r and r["variant"] != "default"]
        best = sorted(timed, key=lambda r: r["us"])[:3]
        for T, H in ((128, 7168), (256, 7168), (1024, 7168), (1024, 4096), (4096, 4096)):
            emit(time_variant(case(T, H), "pre", "default", {}))
            for r in best:
                emit(time_variant(case(T, H), "pre", r["variant"], PRE_VARIANTS[r["variant"]]))
    if "boundary" in a.sweep:
        for T, H in ((256, 7168), (512, 7168), (1024, 7168), (2048, 7168), (4096, 7168),
                     (1024, 4096), (4096, 4096)):
            for name, ov in BOUNDARY_VARIANTS.items():
                emit(time_variant(case(T, H), "post_pre", name, ov))
    if "finalize" in a.sweep:
        for block_h in (512, 1024, 2048):
            for warps in (1, 2, 4):
                emit(finalize_alone(case(4096, 7168), block_h, warps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
