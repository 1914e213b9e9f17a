"""hc_head's tilings swept as its plan (``dsv4spec.kernels.hc_head_plan``) was chosen, each
tiling checked against the default or the reference before it is timed in a CUDA graph.

The sweeps (``--sweeps``):

- ``launches``: the partials and finalize launches timed apart at H = 7168, then the partials'
  block_k x K-split multiplier x warps and the finalize's block_h x warps (stdout only; the plan
  cites benchmarks/results/logs/tune_hc_head.log);
- ``partials-2d``: the CUDA-core partials with 2-D accumulators (block_t x block_k x warps x
  K-split multiplier) against the default, then with the RMSNorm and at H = 4096
  (DIR/sweep_hc_head_partials.json);
- ``tensor-cores``: the tensor-core partials (block_t x block_k x warps x stages x K-split
  multiplier) at T = 1024, H = 7168 against the CUDA-core ones, the three best then at every
  (T, H), with the RMSNorm, sum(x^2) summed, the partials alone (DIR/sweep_hc_head_mma.json,
  rewritten after every row: a run cut short keeps what it measured).

    dsv4spec bench hc-head-sweep --out DIR [--sweeps launches partials-2d tensor-cores]
        [--tokens T ...] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from dsv4spec.bench.common import environment, time_in_graph
from dsv4spec.bench.hc_head import make_inputs
from dsv4spec.kernels import hc_head as kernels
from dsv4spec.kernels.hc_head import hc_head_triton, launch_finalize, launch_partials
from dsv4spec.kernels.hc_head_plan import hc_head_config, num_sms
from dsv4spec.ops.hc_head import hc_head_reference, hc_head_rmsnorm_reference
from dsv4spec.usage import int_in

H = 7168
EPS = (1e-6, 1e-6)
# token counts per sweep (--tokens replaces them); --quick keeps the first two
TOKENS = {"launches": [1, 4, 16, 64, 256, 1024], "partials-2d": [64, 256, 1024, 4096],
          "tensor-cores": [64, 128, 256, 1024, 4096]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweeps", nargs="+", choices=list(TOKENS), default=list(TOKENS),
                        help="which sweeps to run")
    parser.add_argument("--tokens", nargs="+", type=int_in(1), default=None,
                        help="token counts T (default: each sweep's own)")


def main(args: argparse.Namespace) -> int:
    sweeps = {"launches": sweep_launches, "partials-2d": sweep_partials_2d,
              "tensor-cores": sweep_tensor_cores}
    for name in args.sweeps:
        tokens = args.tokens or TOKENS[name][:2 if args.quick else None]
        sweeps[name](tokens, Path(args.out))
    return 0


def _us(fn) -> float:
    return time_in_graph(fn, rep_ms=5)["median_us"]


def _us2(fn) -> float:
    return round(time_in_graph(fn, rep_ms=4)["median_us"], 2)


def sweep_launches(tokens: list[int], out: Path) -> None:
    """The two launches timed apart, then their tilings swept (H = 7168); prints only."""
    for T in tokens:
        x, fn, sc, base, nw = make_inputs(T, H)
        sms = num_sms(x.get_device())
        for norm in (None, nw):
            tag = f"T={T:5d} {'norm' if norm is not None else 'head'}"
            cfg = hc_head_config(T, H, sms)
            ws = torch.empty((T, 14 if norm is not None else 8, cfg.num_splits), device="cuda")
            y = torch.empty((T, H), device="cuda", dtype=x.dtype)
            full = _us(lambda: hc_head_triton(x, fn, sc, base, *EPS, norm_weight=norm))
            p = _us(lambda: launch_partials(x, fn, ws, cfg, norm is not None))
            f = _us(lambda: launch_finalize(x, ws, sc, base, norm, y, *EPS, cfg))
            print(f"{tag}: full {full:.2f} | partials {p:.2f} | finalize {f:.2f} | {cfg}",
                  flush=True)
            if norm is not None:
                continue  # the plain hc_head is swept; the norm's cost shows in the split times
            best_p = (p, "default")
            for block_k, split_mul, warps in itertools.product((64, 128, 256, 512),
                                                               (0.5, 1, 2), (1, 2, 4, 8)):
                c0 = hc_head_config(T, H, sms, block_k=block_k)
                c = hc_head_config(T, H, sms, block_k=block_k,
                                   num_splits=max(1, int(c0.num_splits * split_mul)))
                w = torch.empty((T, ws.shape[1], c.num_splits), device="cuda")
                t = _us(lambda: launch_partials(x, fn, w, c, False, warps))
                if t < best_p[0]:
                    best_p = (t, f"block_k={block_k} splits={c.num_splits} "
                                 f"chunks={c.chunks_per_split} warps={warps}")
            best_f = (f, "default")
            for block_h, warps in itertools.product((128, 256, 512, 1024, 2048), (1, 2, 4, 8)):
                c = cfg._replace(block_h=block_h)
                t = _us(lambda: launch_finalize(x, ws, sc, base, norm, y, *EPS, c, warps))
                if t < best_f[0]:
                    best_f = (t, f"block_h={block_h} warps={warps}")
            print(f"{tag}: best partials {best_p[0]:.2f} ({best_p[1]}) | best finalize "
                  f"{best_f[0]:.2f} ({best_f[1]})", flush=True)

def _close_2d(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a.float() - b.float()).abs() <= 2 * 2**-8 * b.float().abs() + 1e-3).all())


def sweep_partials_2d(tokens: list[int], out: Path) -> None:
    """The 2-D-accumulator partials against the default; writes sweep_hc_head_partials.json."""
    results = {"environment": environment(), "rows": []}
    for T in tokens:
        x, fn, sc, base, nw = make_inputs(T, 7168)
        ref = hc_head_triton(x, fn, sc, base, *EPS)
        default = _us2(lambda: hc_head_triton(x, fn, sc, base, *EPS))
        n_splits = hc_head_config(T, 7168, num_sms(x.get_device())).num_splits
        best = (float("inf"), None)
        for block_t, block_k, warps, mul in itertools.product((4, 8), (64, 128), (2, 4), (1, 2)):
            kw = dict(partials_2d=True, block_t=block_t, block_k=block_k,
                      num_splits=max(1, int(n_splits * mul)), warps=(warps, 1))
            if not _close_2d(hc_head_triton(x, fn, sc, base, *EPS, **kw), ref):
                print(f"T={T} {kw}: MISMATCH", flush=True)
                continue
            t = _us2(lambda: hc_head_triton(x, fn, sc, base, *EPS, **kw))
            if t < best[0]:
                best = (t, kw)
        kw = best[1]
        if kw is None:
            print(f"T={T}: every 2-D tiling mismatched", flush=True)
            continue
        row = {"T": T, "default_us": default, "best_2d_us": best[0], "best_2d": kw,
               "default_norm_us": _us2(lambda: hc_head_triton(x, fn, sc, base, *EPS,
                                                             norm_weight=nw)),
               "best_2d_norm_us": _us2(lambda: hc_head_triton(x, fn, sc, base, *EPS,
                                                             norm_weight=nw, **kw))}
        x4, fn4, sc4, base4, _ = make_inputs(T, 4096)
        kw4 = dict(kw, num_splits=None)
        row["default_4096_us"] = _us2(lambda: hc_head_triton(x4, fn4, sc4, base4, *EPS))
        row["best_2d_4096_us"] = _us2(lambda: hc_head_triton(x4, fn4, sc4, base4, *EPS, **kw4))
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep_hc_head_partials.json").write_text(json.dumps(results, indent=1))

def _close_ulps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Within 2 bf16 ulps of the larger value, as tests/ops/test_hc_head.py counts them."""
    a, b = a.float(), b.float()
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(a.abs(), b.abs()).clamp_min(1e-30))) - 7)
    return not bool(((a - b).abs() > 2 * ulp + 1e-6 * b.abs().max()).any())


def _partials_only(x, fn, rmsnorm, **kw):
    return kernels.partials_launch(x, fn, rmsnorm, **kw)[0]


def _save(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep_hc_head_mma.json").write_text(json.dumps(results, indent=1))


def sweep_tensor_cores(tokens: list[int], out: Path) -> None:
    """Tensor-core tilings at T = 1024, H = 7168, the best three at every (T, H); writes
    sweep_hc_head_mma.json after every row."""
    results = {"environment": environment(), "sweep": [], "rows": []}
    x, fn, sc, base, nw = make_inputs(1024, 7168)
    ref = hc_head_reference(x, fn, sc, base, norm_eps=EPS[0], hc_eps=EPS[1])
    base_splits = hc_head_config(1024, 7168, num_sms(0), mma=True).num_splits
    timed = []
    for block_t, block_k, warps, stages, mul in itertools.product(
            (16, 32), (64, 128), (4, 8), (2, 3, 4), (0.5, 1, 2)):
        if block_k == 128 and warps == 4:
            continue  # ptxas: 255 registers and spills at 4 warps (docs/design.md, hc_head)
        kw = dict(mma=True, block_t=block_t, block_k=block_k, warps=(warps, 1), stages=stages,
                  num_splits=max(1, round(base_splits * mul * 16 / block_t)))
        try:
            y = kernels.hc_head_triton(x, fn, sc, base, *EPS, **kw)
        except Exception as e:  # a tiling that does not compile (shared memory): skip it
            print(json.dumps({"kw": kw, "error": str(e)[:200]}), flush=True)
            continue
        if not _close_ulps(y, ref):
            print(json.dumps({"kw": kw, "error": "mismatch"}), flush=True)
            continue
        t = _us2(lambda: kernels.hc_head_triton(x, fn, sc, base, *EPS, **kw))
        timed.append((t, kw))
        results["sweep"].append({"us": t, **{k: v for k, v in kw.items() if k != "warps"},
                                 "warps": warps})
        print(json.dumps(results["sweep"][-1]), flush=True)
    timed.sort(key=lambda r: r[0])
    best = [kw for _, kw in timed[:3]]
    results["best"] = best
    _save(out, results)
    for H, T in itertools.product((7168, 4096), tokens):
        x, fn, sc, base, nw = make_inputs(T, H)
        ref = hc_head_reference(x, fn, sc, base, norm_eps=EPS[0], hc_eps=EPS[1])
        ref_norm = hc_head_rmsnorm_reference(x, fn, sc, base, nw, norm_eps=EPS[0], hc_eps=EPS[1])
        row = {"T": T, "H": H,
               "cuda_core_us": _us2(lambda: kernels.hc_head_triton(x, fn, sc, base, *EPS,
                                                                  mma=False)),
               "cuda_core_norm_us": _us2(lambda: kernels.hc_head_triton(
                   x, fn, sc, base, *EPS, norm_weight=nw, mma=False)),
               "cuda_core_partials_us": _us2(_partials_only(x, fn, False, mma=False))}
        for i, kw in enumerate(best):
            kw = dict(kw, num_splits=None) if (T, H) != (1024, 7168) else kw
            y = kernels.hc_head_triton(x, fn, sc, base, *EPS, **kw)
            y_norm = kernels.hc_head_triton(x, fn, sc, base, *EPS, norm_weight=nw, **kw)
            if not (_close_ulps(y, ref) and _close_ulps(y_norm, ref_norm)):
                row[f"mma{i}_error"] = "mismatch"
                continue
            row[f"mma{i}_us"] = _us2(lambda: kernels.hc_head_triton(x, fn, sc, base, *EPS, **kw))
            row[f"mma{i}_norm_us"] = _us2(lambda: kernels.hc_head_triton(
                x, fn, sc, base, *EPS, norm_weight=nw, **kw))
            if i == 0:
                row["mma0_sumsq_sum_us"] = _us2(lambda: kernels.hc_head_triton(
                    x, fn, sc, base, *EPS, sumsq_dot=False, **kw))
                row["mma0_partials_us"] = _us2(_partials_only(x, fn, False, **kw))
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        _save(out, results)
