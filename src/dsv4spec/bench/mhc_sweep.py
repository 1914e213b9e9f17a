"""The mHC kernels' tilings and paths timed whole, in a CUDA graph, each checked first: the fused
boundary and ``mhc_pre`` at decode sizes over the partials' dependent launch with fn loaded
before the wait, the finalize's split sums, splits and warps; the tensor-core partials at prefill
sizes; ``mhc_post`` over H-blocks, warps and its dependent launch; the model tail
``mhc_post_head`` (2 launches) beside ``mhc_post`` then ``hc_head_rmsnorm`` (3). The defaults of
``dsv4spec.kernels.mhc`` cite the file this writes.

    dsv4spec bench mhc-sweep --out DIR [--quick]

Writes DIR/mhc_sweep.json: every point (variant, op, H, T, graph µs, max error against the
float64 reference) and the best per op, H and T beside the default's time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dsv4spec.bench import common
from dsv4spec.bench.mhc import HC_EPS, NORM_EPS, POST_MULT, RMS_EPS, SINKHORN_ITERS, make_inputs
from dsv4spec.kernels import mhc as K
from dsv4spec.ops import (
    hc_head_rmsnorm,
    mhc_post,
    mhc_post_head_reference,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre_reference,
)

DECODE_VARIANTS = {
    "default": {},
    "vector": {"vector_sums": True},
    "wait": {"wait": True, "pdl": True},
    "wait+vector": {"wait": True, "pdl": True, "vector_sums": True},
    "wait+vector w4": {"wait": True, "pdl": True, "vector_sums": True, "warps": (4, 1)},
    "wait+vector k128 w4": {"wait": True, "pdl": True, "vector_sums": True, "block_k": 128,
                            "warps": (4, 1)},
    "wait+vector k128 w8": {"wait": True, "pdl": True, "vector_sums": True, "block_k": 128,
                            "warps": (8, 1)},
    "wait+vector k32 w2f2": {"wait": True, "pdl": True, "vector_sums": True, "block_k": 32,
                             "warps": (2, 2)},
    "wait w4": {"wait": True, "pdl": True, "warps": (4, 1)},
    "wait+vector h512": {"wait": True, "pdl": True, "vector_sums": True, "block_h": 512},
    "wait+vector h128": {"wait": True, "pdl": True, "vector_sums": True, "block_h": 128},
}
PREFILL_VARIANTS = {
    "cuda cores": {"mma": False},
    "mma t16 k32 w4": {"mma": True, "block_t": 16, "block_k": 32, "warps": (4, 1)},
    "mma t16 k32 w8": {"mma": True, "block_t": 16, "block_k": 32, "warps": (8, 1)},
    "mma t16 k64 w8": {"mma": True, "block_t": 16, "block_k": 64, "warps": (8, 1)},
    "mma t32 k32 w8": {"mma": True, "block_t": 32, "block_k": 32, "warps": (8, 1)},
    "mma t32 k64 w8": {"mma": True, "block_t": 32, "block_k": 64, "warps": (8, 1)},
    "mma t16 k32 w4 s4": {"mma": True, "block_t": 16, "block_k": 32, "warps": (4, 1),
                          "num_splits": 4},
}
# the model tail: the fused op, and the sequence it replaces (the baseline)
TAIL_BASELINE = "post then hc_head_rmsnorm"


def tail_calls(inp: dict) -> dict:
    """The last layer's post then hc_head and the final norm, fused and as the sequence, on
    ``make_inputs``' tensors (hc_head's parameters: 4 rows of ``fn`` and of ``base``)."""
    f, x, post, comb = (inp[k] for k in ("f", "residual", "post", "comb"))
    nw = inp["norm_weight"].float()  # hc_head_rmsnorm takes an fp32 weight
    hc_fn, scale, base = inp["fn"][:4].contiguous(), inp["scale"][:1], inp["base"][:4]
    eps = {"norm_eps": RMS_EPS, "hc_eps": HC_EPS}

    def fused():  # the 2 launches at every T (the op's default is the sequence above a bound)
        return K.mhc_post_head_triton(f, x, post, comb, hc_fn, scale, base, RMS_EPS, HC_EPS, nw,
                                      RMS_EPS, fused=True)

    def sequence():
        new = mhc_post(f, x, post, comb)
        return new, hc_head_rmsnorm(new, hc_fn, scale, base, nw, **eps)

    def reference():
        return mhc_post_head_reference(f, x, post, comb, hc_fn, scale, base, **eps,
                                       norm_weight=nw, final_norm_eps=RMS_EPS)

    return {"fused tail": fused, TAIL_BASELINE: sequence, "reference": reference}


POST_VARIANTS = {f"h{h} w{w}{' pdl' if pdl else ''}": {"block_h": h, "num_warps": w, "pdl": pdl}
                 for pdl in (False, True) for h in (256, 512, 1024) for w in (2, 4)}


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _pre_call(op: str, inp: dict, overrides: dict):
    x, fn, sc, base, nw = (inp[k] for k in ("residual", "fn", "scale", "base", "norm_weight"))
    args = (RMS_EPS, HC_EPS, SINKHORN_ITERS, POST_MULT, nw, NORM_EPS)
    if op == "pre":
        return lambda: K.mhc_pre_triton(x, fn, sc, base, *args, **overrides)
    return lambda: K.mhc_post_pre_triton(inp["f"], x, inp["post"], inp["comb"], fn, sc, base,
                                         *args, **overrides)


def _pre_reference(op: str, inp: dict):
    x, fn, sc, base, nw = (inp[k] for k in ("residual", "fn", "scale", "base", "norm_weight"))
    kw = {"rms_eps": RMS_EPS, "hc_eps": HC_EPS, "sinkhorn_iters": SINKHORN_ITERS,
          "post_mult": POST_MULT, "norm_weight": nw, "norm_eps": NORM_EPS}
    if op == "pre":
        return mhc_pre_reference(x, fn, sc, base, **kw)
    return mhc_post_pre_reference(inp["f"], x, inp["post"], inp["comb"], fn, sc, base, **kw)


def _point(variant: str, op: str, H: int, T: int, call, ref, rep_ms: int) -> dict:
    row = {"variant": variant, "op": op, "H": H, "T": T}
    try:
        out = call()
        torch.cuda.synchronize()
        outs = out if isinstance(out, tuple) else (out,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        row["max_err"] = max(_rel_err(o, r) for o, r in zip(outs, refs))
        row["graph_us"] = round(common.time_in_graph(call, rep_ms=rep_ms)["median_us"], 3)
    except Exception as e:  # noqa: BLE001 - a sweep records the failure and goes on
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(row), flush=True)
    return row


def _best(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["H"], r["T"]), []).append(r)
    best = []
    for (op, H, T), rs in groups.items():
        ok = [r for r in rs if "graph_us" in r and r["max_err"] < 2e-2]
        if not ok:
            continue
        top = min(ok, key=lambda r: r["graph_us"])
        default = next((r for r in rs if r["variant"] in ("default", "cuda cores", "h256 w4",
                                                           TAIL_BASELINE)
                        and "graph_us" in r), None)
        best.append({"op": op, "H": H, "T": T, "best": top["variant"], "best_us": top["graph_us"],
                     "default_us": default and default["graph_us"]})
    return best


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options beyond the shared ``--out`` and ``--quick`` (fewer token counts)."""


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("error: bench mhc-sweep needs a CUDA GPU")
        return 2
    rep_ms = 10
    decode = [(7168, T) for T in (1, 2, 4, 8, 16, 32)] + [(4096, T) for T in (1, 4, 16)]
    prefill = [(7168, T) for T in (64, 256, 1024, 4096)] + [(4096, T) for T in (64, 1024)]
    post = [(7168, T) for T in (1, 4, 16, 32, 64, 256)]
    tail = [(7168, T) for T in (1, 4, 16, 64, 256, 1024)] + [(4096, T) for T in (1, 16)]
    if args.quick:
        decode, prefill, post, tail = decode[:3:2], prefill[:2], post[:2], tail[:2]
    start = time.perf_counter()
    record = {"environment": common.environment(), "rows": []}
    rows = record["rows"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every shape: a time limit keeps what was measured
        record["best"] = _best(rows)
        record["seconds"] = round(time.perf_counter() - start, 1)
        (out / "mhc_sweep.json").write_text(json.dumps(record, indent=1))

    for table, variants in ((decode, DECODE_VARIANTS), (prefill, PREFILL_VARIANTS)):
        for H, T in table:
            inp = make_inputs(T, H, seed=1000 * H + T)
            for op in ("post_pre", "pre"):
                ref = _pre_reference(op, inp)
                for name, overrides in variants.items():
                    rows.append(_point(name, op, H, T, _pre_call(op, inp, overrides), ref,
                                       rep_ms))
            save()
    for H, T in post:
        inp = make_inputs(T, H, seed=1000 * H + T)
        ref = mhc_post_reference(inp["f"], inp["residual"], inp["post"], inp["comb"])
        for name, kw in POST_VARIANTS.items():
            def call(kw=kw, inp=inp):
                return K.mhc_post_triton(inp["f"], inp["residual"], inp["post"], inp["comb"],
                                         **kw)

            rows.append(_point(name, "post", H, T, call, ref, rep_ms))
        save()
    for H, T in tail:
        inp = make_inputs(T, H, seed=1000 * H + T)
        calls = tail_calls(inp)
        ref = calls.pop("reference")()
        for name, call in calls.items():
            rows.append(_point(name, "tail", H, T, call, ref, rep_ms))
        save()
    for b in record["best"]:
        print(f"{b['op']:>8} H={b['H']} T={b['T']:>4}: best {b['best']:<24} {b['best_us']:8.2f} "
              f"us (default {b['default_us']})")
    print(f"wrote {out / 'mhc_sweep.json'} in {record['seconds']} s")
    return 0
