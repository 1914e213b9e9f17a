"""Where the time of one mHC boundary goes on the GPU: each launch of ``mhc_pre`` /
``mhc_post_pre`` timed alone in a CUDA graph, tiling variants of each, the Sinkhorn's share,
registers and spills per kernel, the host time of an eager call by part, and how far the fp32
logits are from float64 (ours, and torch's fp32 GEMM for scale).

    PYTHONPATH=src python3 benchmarks/results/archive/scripts/mhc_probe.py OUT_DIR [--quick]

Writes OUT_DIR/mhc_probe.json and prints a table per part.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton

from dsv4spec.kernels import mhc as K
from dsv4spec.ops import mhc_post_pre, mhc_pre, mhc_pre_reference
from dsv4spec.timing import time_eager, time_in_graph

H = 7168
EPS = {"rms_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20, "post_mult": 2.0}


def make_inputs(T, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 4, H, generator=g).to(device=device, dtype=torch.bfloat16)
    fn = (torch.randn(24, 4 * H, generator=g) * (4 * H) ** -0.5).to(device)
    scale = (torch.rand(3, generator=g) + 0.5).to(device)
    base = torch.randn(24, generator=g).to(device)
    nw = (torch.rand(H, generator=g) + 0.5).to(device)
    f = torch.randn(T, H, generator=g).to(device=device, dtype=torch.bfloat16)
    return x, fn, scale, base, nw, f


def boundary_inputs(T):
    """make_inputs(T, seed=T) and the keyword arguments of a DSV4 boundary (RMSNorm fused)."""
    x, fn, sc, base, nw, f = make_inputs(T, T)
    return x, fn, sc, base, nw, f, {**EPS, "norm_weight": nw, "norm_eps": 1e-6}


@triton.jit
def _empty_kernel(x_ptr):
    pass


def us(d):
    return round(d["median_us"], 2)


def partials_call(x, fn, ws, cfg, T, warps=None):
    grid = (triton.cdiv(T, cfg.block_t) * cfg.num_splits,)
    args = (x, x, fn, fn, x, fn, ws, T, H, cfg.num_splits, fn.stride(0), ws.stride(0),
            ws.stride(1))
    kw = dict(POST=False, GRAM=True, CHUNKS_PER_SPLIT=cfg.chunks_per_split, BLOCK_T=cfg.block_t,
              BLOCK_K=cfg.block_k, PDL=False, PREFETCH_FN=False, WAIT=False, NROWS=K.NMIX,
              ROWS_PAD=32, num_warps=warps or cfg.partials_warps)
    compiled = K.JIT_KERNELS['partials'][grid](*args, **kw)
    return (lambda: K.JIT_KERNELS['partials'][grid](*args, **kw)), compiled


def finalize_call(x, ws, sc, base, nw, outs, cfg, T, iters=20, nh=None, block_h=None,
                  warps=1, fast=True):
    block_h = block_h or cfg.block_h
    nh = triton.cdiv(H, block_h) if nh is None else nh
    post, comb, out = outs
    grid = (T * (nh + 1),)
    args = (x, ws, sc, base, nw, post, comb, out, T, H, cfg.num_splits, nh, 1e-6, 1e-6, 1e-6,
            2.0, ws.stride(0), ws.stride(1))
    kw = dict(SINKHORN_ITERS=iters, RMSNORM=True, X_EARLY=True,
              BLOCK_S=triton.next_power_of_2(cfg.num_splits), BLOCK_H=block_h, PDL=False,
              FAST_MATH=fast, VECTOR_SUMS=cfg.vector_sums, HEAD=False, SLOT_D=K.NMIX,
              num_warps=warps)
    compiled = K.JIT_KERNELS['finalize'][grid](*args, **kw)
    return (lambda: K.JIT_KERNELS['finalize'][grid](*args, **kw)), compiled


def regs(compiled):
    return {"regs": compiled.n_regs, "spills": compiled.n_spills,
            "shared": compiled.metadata.shared}


def component_rows(tokens):
    rows = []
    for T in tokens:
        x, fn, sc, base, nw, f, kw = boundary_inputs(T)
        post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
        row = {"T": T,
               "pre_us": us(time_in_graph(lambda: mhc_pre(x, fn, sc, base, **kw))),
               "post_pre_us": us(time_in_graph(
                   lambda: mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)))}
        cfg = K.plan(T, H, 0, pdl=False)
        row["cfg"] = cfg._asdict()
        ws = torch.randn(T, 34, cfg.num_splits, device="cuda")
        outs = K.pre_outputs(x, T, H)
        call, compiled = partials_call(x, fn, ws, cfg, T)
        row["partials_us"] = us(time_in_graph(call))
        row["partials_regs"] = regs(compiled)
        # realistic partial sums for the finalize
        call()
        call, compiled = finalize_call(x, ws, sc, base, nw, outs, cfg, T)
        row["finalize_us"] = us(time_in_graph(call))
        row["finalize_regs"] = regs(compiled)
        call, _ = finalize_call(x, ws, sc, base, nw, outs, cfg, T, nh=0)
        row["finalize_sinkhorn_program_only_us"] = us(time_in_graph(call))
        call, _ = finalize_call(x, ws, sc, base, nw, outs, cfg, T, nh=0, iters=1)
        row["finalize_sinkhorn_program_iters1_us"] = us(time_in_graph(call))
        call, _ = finalize_call(x, ws, sc, base, nw, outs, cfg, T, iters=1)
        row["finalize_iters1_us"] = us(time_in_graph(call))
        for bh in (256, 1024):
            call, _ = finalize_call(x, ws, sc, base, nw, outs, cfg, T, block_h=bh)
            row[f"finalize_block_h{bh}_us"] = us(time_in_graph(call))
        call, _ = finalize_call(x, ws, sc, base, nw, outs, cfg, T, warps=4)
        row["finalize_4warps_us"] = us(time_in_graph(call))
        call, _ = finalize_call(x, ws, sc, base, nw, outs, cfg, T, nh=0, fast=False)
        row["finalize_sinkhorn_program_ieee_div_us"] = us(time_in_graph(call))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for bk in (64, 128):  # fewer splits for the finalize to sum
            c2 = K.tiling(T, H, sms, block_k=bk, pdl=False)
            ws2 = torch.randn(T, 34, c2.num_splits, device="cuda")
            call, _ = finalize_call(x, ws2, sc, base, nw, outs, c2, T)
            row[f"finalize_splits{c2.num_splits}_us"] = us(time_in_graph(call))
        # partials tilings
        for bt in (1, 2, 4, 8, 16):
            if bt > max(4, triton.next_power_of_2(T)) or (T >= 32 and bt < 4):
                continue
            for bk in (32, 64):
                for w in (1, 2, 4, 8):
                    key = f"partials_t{bt}_k{bk}_w{w}"
                    try:
                        c2 = K.tiling(T, H, sms, block_t=bt, block_k=bk, pdl=False)
                        ws2 = torch.empty(T, 34, c2.num_splits, device="cuda")
                        call, compiled = partials_call(x, fn, ws2, c2, T, warps=w)
                        row[key + "_us"] = round(
                            torch.tensor(triton.testing.do_bench_cudagraph(
                                call, rep=10, return_mode="all")).median().item() * 1e3, 2)
                        row[key + "_regs"] = regs(compiled)
                    except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                        row[key + "_us"] = repr(e)[:120]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def eager_rows(tokens):
    rows = []
    for T in tokens:
        x, fn, sc, base, nw, f, kw = boundary_inputs(T)
        post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
        mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)
        args = (x, fn, sc, base, 1e-6, 1e-6, 20, 2.0, nw, 1e-6)
        cfg = K.plan(T, H, 0)
        outs = K.pre_outputs(x, T, H)
        row = {"T": T,
               "pre_us": us(time_eager(lambda: mhc_pre(x, fn, sc, base, **kw))),
               "post_pre_us": us(time_eager(
                   lambda: mhc_post_pre(f, x, post, comb, fn, sc, base, **kw))),
               "pre_triton_us": us(time_eager(lambda: K.mhc_pre_triton(*args))),
               "pre_triton_given_out_us": us(time_eager(
                   lambda: K.mhc_pre_triton(*args, out=outs))),
               "launches_only_us": us(time_eager(lambda: K.pre_launches(
                   x, fn, sc, base, nw, *outs, 1e-6, 1e-6, 1e-6, 2.0, 20, cfg))),
               "outputs_only_us": us(time_eager(lambda: K.pre_outputs(x, T, H))),
               "empty_like_us": us(time_eager(lambda: torch.empty_like(x))),
               }
        n = 2000
        start = time.perf_counter()
        for _ in range(n):
            K.plan(T, H, 0)
        row["plan_host_us"] = round((time.perf_counter() - start) / n * 1e6, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def precision_rows(tokens):
    rows = []
    for T in tokens:
        x, fn, sc, base, nw, f, kw = boundary_inputs(T)
        post, comb, y = mhc_pre(x, fn, sc, base, **kw)
        rpost, rcomb, ry = mhc_pre_reference(x, fn, sc, base, **kw)
        xd = x.double().reshape(T, -1)
        md = xd @ fn.double().T
        absd = xd.abs() @ fn.double().abs().T
        # torch fp32 GEMM without tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        m32 = x.float().reshape(T, -1) @ fn.T
        # ours: the partial sums summed over splits
        cfg = K.plan(T, H, 0, pdl=False)
        ws = torch.zeros(T, 34, cfg.num_splits, device="cuda")
        call, _ = partials_call(x, fn, ws, cfg, T)
        call()
        mours = ws[:, :24].double().sum(-1)
        sq = (xd * xd).sum(-1)
        row = {
            "T": T, "cfg": cfg._asdict(),
            "post_rel_err": ((post.double() - rpost.double()).abs().max()
                             / rpost.abs().max()).item(),
            "comb_rel_err": ((comb.double() - rcomb.double()).abs().max()
                             / rcomb.abs().max()).item(),
            "logits_ours_max_abs_err": (mours - md).abs().max().item(),
            "logits_torch_fp32_max_abs_err": (m32.double() - md).abs().max().item(),
            "logits_max_abs": md.abs().max().item(),
            "logits_sum_abs_terms_max": absd.max().item(),
            "sumsq_rel_err": ((ws[:, 24:28].double().sum((-1, -2)) - sq).abs() / sq).max().item(),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--one", type=int, help="only call mhc_pre and mhc_post_pre at this T (ncu)")
    a = p.parse_args(argv)
    if a.one:
        x, fn, sc, base, nw, f = make_inputs(a.one, 0)
        kw = {**EPS, "norm_weight": nw, "norm_eps": 1e-6}
        for _ in range(3):
            post, comb, _ = mhc_pre(x, fn, sc, base, **kw)
            mhc_post_pre(f, x, post, comb, fn, sc, base, **kw)
        torch.cuda.synchronize()
        return 0
    torch.manual_seed(0)
    x = torch.empty(1, device="cuda")
    empty = us(time_in_graph(lambda: _empty_kernel[(1,)](x)))
    print("empty kernel in a graph", empty, flush=True)
    dev = torch.cuda.get_device_name()
    res = {"device": dev, "torch": torch.__version__, "triton": triton.__version__,
           "empty_kernel_graph_us": empty}
    tokens = (1, 4, 16, 32) if a.quick else (1, 4, 16, 32, 64)
    res["components"] = component_rows(tokens)
    res["eager"] = eager_rows((1, 4, 32))
    res["precision"] = precision_rows((16, 32, 33, 64, 256))
    res["large"] = []
    for T in (256, 1024, 4096):
        x, fn, sc, base, nw, f, kw = boundary_inputs(T)
        row = {"T": T, "pre_us": us(time_in_graph(lambda: mhc_pre(x, fn, sc, base, **kw)))}
        print(json.dumps(row), flush=True)
        res["large"].append(row)
    with open(f"{a.out}/mhc_probe.json", "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
