"""The mHC ops between decode and prefill sizes on the GPU, beside SGLang's kernels in the same run:
``mhc_pre``'s tilings at 32-256 tokens (CUDA-core partials with other blocks and splits, the
tensor-core partials with tokens as rows or rows (t, i) at sizes the planner does not yet give
them, the finalize's H-blocks), ``mhc_post``'s H-blocks, warps and PDL at 1-64 tokens, the
device time of each launch of the defaults and the fastest variants, and the boundary's
token-row partials against the float64 pre of their own new residual.

    PYTHONPATH=src python3 benchmarks/results/archive/scripts/mhc_mid_t.py OUT_DIR [--sweep pre post breakdown boundary-rows]

Every variant is checked against the float64 reference before it is timed (CUDA graph, median).
Writes OUT_DIR/mhc_mid_t.json as it goes and prints each row (docs/design.md, mHC).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch
from mhc_large_t import Case, Sweep, rel_err, time_variant

from dsv4spec.bench.mhc import make_inputs, sglang_provider
from dsv4spec.bench.sglang_mhc import sglang_mhc_peer
from dsv4spec.kernels import mhc as K
from dsv4spec.ops import mhc_post_reference, mhc_pre_reference
from dsv4spec.timing import time_in_graph


def cuda_cores(block_t: int, block_k: int, splits: int | None, warps=None, **more) -> dict:
    ov = dict(mma=False, block_t=block_t, block_k=block_k, num_splits=splits, **more)
    if warps is not None:
        ov["warps"] = warps
    return ov


def tensor_cores(token_rows: bool, block_t: int, block_k: int, warps: int, splits=None,
                 **more) -> dict:
    ov = dict(mma=True, token_rows=token_rows, block_t=block_t, block_k=block_k,
              warps=(warps, 1), num_splits=splits, **more)
    if token_rows:
        ov.setdefault("presplit", block_k == 32)
        ov.setdefault("stages", 3)
    return ov


PRE_VARIANTS = {"default": {}}
for _bt, _bk, _s in ((4, 64, None), (8, 64, None), (16, 64, None), (8, 64, 56), (8, 32, 112),
                     (8, 32, 224), (16, 32, 224), (16, 32, 112), (32, 32, 224)):
    PRE_VARIANTS[f"cuda t{_bt} k{_bk} s{_s or 'auto'}"] = cuda_cores(_bt, _bk, _s)
PRE_VARIANTS["cuda t8 k64 w2"] = cuda_cores(8, 64, None, warps=(2, 1))
PRE_VARIANTS["cuda t8 k64 w8"] = cuda_cores(8, 64, None, warps=(8, 1))
for _bt in (16, 32, 64):
    for _s in (None, 112, 224):
        for _st in (2, 3):
            PRE_VARIANTS[f"tok t{_bt} k32 s{_s or 'auto'} st{_st}"] = tensor_cores(
                True, _bt, 32, 4, _s, stages=_st)
PRE_VARIANTS["tok t32 k32 w2 s224"] = tensor_cores(True, 32, 32, 2, 224)
PRE_VARIANTS["tok t16 k64 nosplit s112"] = tensor_cores(True, 16, 64, 4, 112, presplit=False)
for _bt, _w in ((16, 4), (32, 8), (32, 4)):
    for _s in (None, 112):
        PRE_VARIANTS[f"ti t{_bt} k64 w{_w} s{_s or 'auto'}"] = tensor_cores(False, _bt, 64, _w,
                                                                              _s)
for _bh in (256, 512, 2048):
    PRE_VARIANTS[f"default h{_bh}"] = {"block_h": _bh}
PRE_VARIANTS["default finalize w2"] = {"warps": None}  # filled per T below

# the boundary's token-row partials (an override) against the float64 pre of their own residual
BOUNDARY_ROWS = {"default": {}, "rows (t, i)": {"mma": True, "token_rows": False}}
for _bt, _bk, _w, _st, _split in ((64, 32, 4, 2, False), (64, 32, 4, 1, False),
                                  (64, 32, 4, 3, False), (32, 32, 4, 2, False),
                                  (16, 32, 4, 2, False), (64, 32, 8, 2, False),
                                  (64, 16, 4, 2, False), (64, 32, 4, 2, True)):
    BOUNDARY_ROWS[f"tok t{_bt} k{_bk} w{_w} st{_st}{' split' if _split else ''}"] = tensor_cores(
        True, _bt, _bk, _w, presplit=_split, stages=_st)
BOUNDARY_ROWS["tok t64 k16 w4 st3"] = tensor_cores(True, 64, 16, 4, presplit=False, stages=3)
BOUNDARY_ROWS["tok t32 k16 w4 st2"] = tensor_cores(True, 32, 16, 4, presplit=False, stages=2)
# every variant at the first sizes; at the others the default, the (t, i) rows, the 32-wide
# chunks and the 16-wide with 3 stages
BOUNDARY_ROWS_ALL_AT = ((1024, 7168), (512, 4096))
BOUNDARY_ROWS_FEW_AT = ((512, 7168), (4096, 7168), (1024, 4096), (4096, 4096))
BOUNDARY_ROWS_FEW = ("default", "rows (t, i)", "tok t64 k32 w4 st2", "tok t64 k16 w4 st3")


def boundary_rows(case: Case, name: str, ov: dict) -> dict:
    row = {"op": "post_pre own", "T": case.T, "H": case.H, "variant": name}
    post, comb = case.ref[0].float(), case.ref[1].float()
    try:
        def call():
            return K.mhc_post_pre_triton(case.f, case.x, post, comb, *case.args(), **ov)
        got = call()
        own = mhc_pre_reference(got[0], case.fn, case.scale, case.base, **case.kw)
        row["err"] = rel_err(got[1:], own)
        torch.cuda.synchronize()
        row["us"] = round(time_in_graph(call)["median_us"], 2)
    except Exception as e:  # noqa: BLE001
        row["error"] = repr(e)[:300]
    return row


POST_BLOCKS = (256, 512, 1024, 2048, 4096)
POST_WARPS = (1, 2, 4, 8)


def sglang_row(peer, op: str, T: int, H: int) -> dict:
    row = {"op": op, "T": T, "H": H, "variant": "sglang"}
    if peer is None:
        row["error"] = "SGLang's kernels not found"
        return row
    try:
        inp = make_inputs(T, H, seed=T + H)
        call = sglang_provider(peer, op, inp, norm=True)
        call()
        torch.cuda.synchronize()
        row["us"] = round(time_in_graph(call)["median_us"], 2)
    except Exception as e:  # noqa: BLE001 - a sweep reports a peer that fails and goes on
        row["error"] = repr(e)[:300]
    return row


def post_variant(case: Case, block_h, warps, pdl) -> dict:
    row = {"op": "post", "T": case.T, "H": case.H,
           "variant": f"h{block_h or 'auto'} w{warps or 'auto'} pdl{pdl}"}
    post, comb = case.ref[0].float(), case.ref[1].float()
    try:
        def call():
            return K.mhc_post_triton(case.f, case.x, post, comb, block_h=block_h, pdl=pdl,
                                     num_warps=warps)
        ref = mhc_post_reference(case.f, case.x, post, comb)
        row["err"] = (call().double() - ref.double()).abs().max().item()
        torch.cuda.synchronize()
        row["us"] = round(time_in_graph(call)["median_us"], 2)
    except Exception as e:  # noqa: BLE001
        row["error"] = repr(e)[:300]
    return row


def kernel_times(call, iters: int = 50) -> dict:
    """Device µs per call of each kernel ``call`` launches (torch profiler, mean of ``iters``)."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    total: dict = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name[:60]] += ev.device_time / iters
    return {k: round(v, 2) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--sweep", nargs="+", default=["pre", "post", "breakdown"],
                   choices=["pre", "post", "breakdown", "boundary-rows"])
    a = p.parse_args(argv)
    sweep = Sweep(f"{a.out}/mhc_mid_t.json")
    case, emit, rows = sweep.case, sweep.emit, sweep.rows
    peer = sglang_mhc_peer()

    def breakdown(T, names):
        c = case(T, 7168)
        for name in names:
            ov = PRE_VARIANTS.get(name, {})
            emit({"op": "pre", "T": T, "H": 7168, "variant": name, "kernels": kernel_times(
                lambda c=c, ov=ov: K.mhc_pre_triton(c.x, *c.args(), **ov))})

    if "boundary-rows" in a.sweep:
        for T, H in BOUNDARY_ROWS_ALL_AT + BOUNDARY_ROWS_FEW_AT:
            names = BOUNDARY_ROWS if (T, H) in BOUNDARY_ROWS_ALL_AT else BOUNDARY_ROWS_FEW
            for name in names:
                emit(boundary_rows(case(T, H), name, BOUNDARY_ROWS[name]))
    if "breakdown" in a.sweep:  # the defaults first, the fastest variants after the sweep
        for T in (32, 64, 256):
            breakdown(T, ["default"])
    if "post" in a.sweep:
        for T in (1, 4, 16, 32, 64):
            emit(sglang_row(peer, "post", T, 7168))
            emit(post_variant(case(T, 7168), None, None, None))
            for bh in POST_BLOCKS:
                for w in POST_WARPS:
                    if bh // (32 * w) < 2:  # fewer than two elements a thread
                        continue
                    emit(post_variant(case(T, 7168), bh, w, None))
            emit(post_variant(case(T, 7168), None, None, False))
    best_pre: dict = {}
    if "pre" in a.sweep:
        for T in (32, 64, 128, 256):
            emit(sglang_row(peer, "pre", T, 7168))
            for name, ov in PRE_VARIANTS.items():
                if name == "default finalize w2":
                    ov = {"warps": (K.plan(T, 7168, 0, dtype=torch.bfloat16).partials_warps, 2)}
                emit(time_variant(case(T, 7168), "pre", name, ov))
            timed = sorted((r for r in rows if r["op"] == "pre" and r["T"] == T
                            and r["H"] == 7168 and "us" in r and r["variant"] != "sglang"),
                           key=lambda r: r["us"])
            best_pre[T] = [r["variant"] for r in timed[:3]]
        for T in (32, 64, 256):  # the best three of 7168 at the other width
            emit(sglang_row(peer, "pre", T, 4096))
            for name in dict.fromkeys(["default", *best_pre[T]]):
                emit(time_variant(case(T, 4096), "pre", name, PRE_VARIANTS.get(name, {})))
    if "breakdown" in a.sweep:
        for T in (32, 64, 256):
            breakdown(T, [n for n in best_pre.get(T, []) if n not in ("default",
                                                                      "default finalize w2")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
