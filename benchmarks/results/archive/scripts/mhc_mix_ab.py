"""The mHC ops at decode sizes with one kernels/mhc.py or another: graph µs of the boundary,
``mhc_pre`` and ``mhc_post`` at 1-64 tokens, both widths, one JSON line per (T, H).

    PYTHONPATH=src python3 benchmarks/results/archive/scripts/mhc_mix_ab.py new          # this tree
    PYTHONPATH=OLD_SRC python3 benchmarks/results/archive/scripts/mhc_mix_ab.py old      # a copy of src/ with another file

Run the sides in turn, each in its own process (new, old, new, old), so that the two share the
run. ``benchmarks/results/mhc/mhc_mix_ab.md``: the mix as explicit fmas against the compiler's
contraction of it (docs/design.md, mHC).
"""

import json
import sys

from dsv4spec.bench.mhc import make_inputs
from dsv4spec.ops import mhc_post, mhc_post_pre, mhc_post_pre_reference, mhc_pre
from dsv4spec.timing import time_in_graph

KW = {"rms_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20, "post_mult": 2.0, "norm_eps": 1e-6}


def main(tag: str) -> None:
    for H in (7168, 4096):
        for T in (1, 4, 16, 32, 64):
            i = make_inputs(T, H, seed=T * 7 + H)
            kw = {**KW, "norm_weight": i["norm_weight"]}
            params = (i["fn"], i["scale"], i["base"])
            mixes = (i["f"], i["residual"], i["post"], i["comb"])

            def boundary():
                return mhc_post_pre(*mixes, *params, **kw)

            def pre():
                return mhc_pre(i["residual"], *params, **kw)

            def post():
                return mhc_post(*mixes)

            got = boundary()
            d = {k: v.double() for k, v in i.items()}
            ref = mhc_post_pre_reference(d["f"], d["residual"], d["post"], d["comb"], d["fn"],
                                         d["scale"], d["base"], **{**kw, "norm_weight":
                                                                   d["norm_weight"]})
            err = max(float((g.double() - r).abs().max() / r.abs().max())
                      for g, r in zip(got[1:3], ref[1:3]))
            row = {"tag": tag, "H": H, "T": T, "err_post_comb": err}
            for name, fn in (("boundary", boundary), ("pre", pre), ("post", post)):
                row[name] = round(time_in_graph(fn, rep_ms=60)["median_us"], 3)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
