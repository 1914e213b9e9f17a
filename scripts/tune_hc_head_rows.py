"""Split-K (2 launches) vs the whole-rows kernel (1 launch) for hc_head at large T (GPU).

    python scripts/tune_hc_head_rows.py OUT.json [T ...]

Times both in a CUDA graph (median µs) at H 4096 and 7168, with and without the shared-head
RMSNorm, for a few row-kernel tilings; checks every output against the reference first.
"""

import json
import sys

from dsv4spec.bench.common import environment, time_in_graph
from dsv4spec.bench.hc_head import make_inputs, refcheck
from dsv4spec.kernels.hc_head import hc_head_triton
from dsv4spec.kernels.hc_head_rows import hc_head_rows_triton
from dsv4spec.ops import hc_head_reference, hc_head_rmsnorm_reference

EPS = (1e-6, 1e-6)
# (block_t, block_k, block_h, programs): programs None = one per SM
CONFIGS = [(4, 256, 512, None), (4, 128, 512, None), (2, 256, 512, None), (8, 128, 512, None),
           (4, 256, 512, 264)]


def main() -> None:
    out_path = sys.argv[1]
    tokens = [int(t) for t in sys.argv[2:]] or [64, 256, 1024, 4096]
    rows = []
    for H in (4096, 7168):
        for T in tokens:
            x, fn, sc, base, nw = make_inputs(T, H, seed=T)
            for norm in (None, nw):
                if norm is None:
                    ref, provider = hc_head_reference(x, fn, sc, base, norm_eps=EPS[0],
                                                      hc_eps=EPS[1]), "triton"
                else:
                    ref, provider = hc_head_rmsnorm_reference(
                        x, fn, sc, base, nw, norm_eps=EPS[0], hc_eps=EPS[1]), "triton+norm"
                row = {"H": H, "T": T, "norm": norm is not None,
                       "split_k_us": time_in_graph(
                           lambda: hc_head_triton(x, fn, sc, base, *EPS, norm), 10)["median_us"]}
                for bt, bk, bh, programs in CONFIGS:
                    def rows_fn():
                        return hc_head_rows_triton(x, fn, sc, base, *EPS, norm, block_t=bt,
                                                   block_k=bk, block_h=bh, programs=programs)
                    refcheck(provider, rows_fn(), ref)
                    key = f"rows_t{bt}_k{bk}_h{bh}_p{programs or 'sm'}_us"
                    row[key] = time_in_graph(rows_fn, 10)["median_us"]
                rows.append(row)
                best = min((v, k) for k, v in row.items() if k.startswith("rows_"))
                print(f"H={H} T={T:5d} norm={row['norm']!s:5}: split-K {row['split_k_us']:7.2f}"
                      f" | best rows {best[0]:7.2f} ({best[1]})", flush=True)
    with open(out_path, "w") as f:
        json.dump({"environment": environment(), "configs": CONFIGS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
