"""Time the two hc_head launches separately and sweep their tiling at H = 7168 (GPU)."""

import itertools
import sys

import torch

from dsv4spec.bench.common import time_in_graph
from dsv4spec.bench.hc_head import make_inputs
from dsv4spec.kernels.hc_head import hc_head_triton, launch_finalize, launch_partials
from dsv4spec.kernels.hc_head_plan import hc_head_config, num_sms

H = 7168
EPS = (1e-6, 1e-6)


def us(fn):
    return time_in_graph(fn, rep_ms=5)["median_us"]


def main() -> None:
    tokens = [int(t) for t in sys.argv[1:]] or [1, 4, 16, 64, 256, 1024]
    for T in tokens:
        x, fn, sc, base, nw = make_inputs(T, H)
        for norm in (None, nw):
            tag = f"T={T:5d} {'norm' if norm is not None else 'head'}"
            cfg = hc_head_config(T, H, num_sms(x.get_device()))
            ws = torch.empty((T, 14 if norm is not None else 8, cfg.num_splits), device="cuda")
            out = torch.empty((T, H), device="cuda", dtype=x.dtype)
            full = us(lambda: hc_head_triton(x, fn, sc, base, *EPS, norm_weight=norm))
            p = us(lambda: launch_partials(x, fn, ws, cfg, norm is not None))
            f = us(lambda: launch_finalize(x, ws, sc, base, norm, out, *EPS, cfg))
            print(f"{tag}: full {full:.2f} | partials {p:.2f} | finalize {f:.2f} | {cfg}",
                  flush=True)
            if norm is not None:
                continue  # sweep the plain hc_head only; the norm's cost shows in the split times
            best_p = (p, "default")
            for block_k, split_mul, warps in itertools.product((64, 128, 256, 512),
                                                               (0.5, 1, 2), (1, 2, 4, 8)):
                c0 = hc_head_config(T, H, num_sms(x.get_device()), block_k=block_k)
                c = hc_head_config(T, H, num_sms(x.get_device()), block_k=block_k,
                                   num_splits=max(1, int(c0.num_splits * split_mul)))
                w = torch.empty((T, ws.shape[1], c.num_splits), device="cuda")
                t = us(lambda: launch_partials(x, fn, w, c, norm is not None, warps))
                if t < best_p[0]:
                    best_p = (t, f"block_k={block_k} splits={c.num_splits} "
                                 f"chunks={c.chunks_per_split} warps={warps}")
            best_f = (f, "default")
            for block_h, warps in itertools.product((128, 256, 512, 1024, 2048), (1, 2, 4, 8)):
                c = cfg._replace(block_h=block_h)
                t = us(lambda: launch_finalize(x, ws, sc, base, norm, out, *EPS, c, warps))
                if t < best_f[0]:
                    best_f = (t, f"block_h={block_h} warps={warps}")
            print(f"{tag}: best partials {best_p[0]:.2f} ({best_p[1]}) | best finalize "
                  f"{best_f[0]:.2f} ({best_f[1]})", flush=True)


if __name__ == "__main__":
    main()
