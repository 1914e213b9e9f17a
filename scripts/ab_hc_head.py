"""A/B of hc_head's plan choices in a CUDA graph and eager (GPU).

    PYTHONPATH=src python3 scripts/ab_hc_head.py OUT_DIR [T ...]

For H in {4096, 7168} and T from 1 to 4096 (bf16): the two-launch call with the CUDA-core or the
tensor-core partials (``mma``; T >= 64 only, with and without its L2 eviction hints), each with
and without the finalize as a programmatic dependent launch (``pdl``); plain and with the
RMSNorm. Device time per call in a
CUDA graph (``time_in_graph``, median); at T <= 64 also the eager wall time per call (all
variants interleaved, ``time_eager_side_by_side``). Every variant's output is first checked
against the reference (2 bf16 ulps; the
elements beyond are counted, not skipped). Writes ``OUT_DIR/ab_hc_head.json`` after every row.
"""

import itertools
import json
import sys
from pathlib import Path

import torch

from dsv4spec.bench.common import environment, time_eager_side_by_side, time_in_graph
from dsv4spec.bench.hc_head import make_inputs
from dsv4spec.kernels.hc_head import hc_head_triton
from dsv4spec.ops.hc_head import hc_head_reference, hc_head_rmsnorm_reference

EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}
TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 4096]


def beyond_2_ulps(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Elements of ``a`` more than 2 bf16 ulps (of the larger value) from ``b``, as
    tests/ops/test_hc_head.py's assert_close counts them, and the largest distance in ulps."""
    a, b = a.float(), b.float()
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(a.abs(), b.abs()).clamp_min(1e-30))) - 7)
    dist = (a - b).abs() / ulp
    bad = (a - b).abs() > 2 * ulp + 1e-6 * b.abs().max()
    return {"count": int(bad.sum()), "max_ulps": round(float(dist.max()), 2)} if bad.any() else {}


def variants(T: int) -> dict[str, dict]:
    out = {"cuda_core": dict(mma=False, pdl=False), "cuda_core_pdl": dict(mma=False, pdl=True)}
    if T >= 64:
        out["mma"] = dict(mma=True, pdl=False)  # with the L2 hints (the default)
        out["mma_pdl"] = dict(mma=True, pdl=True)
        out["mma_no_evict"] = dict(mma=True, pdl=False, evict_hints=False)
    return out


def main() -> None:
    out = Path(sys.argv[1])
    tokens = [int(t) for t in sys.argv[2:]] or TOKENS
    out.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(), "rows": []}
    for H, T in itertools.product((7168, 4096), tokens):
        x, fn, sc, base, nw = make_inputs(T, H)
        refs = {False: hc_head_reference(x, fn, sc, base, **EPS),
                True: hc_head_rmsnorm_reference(x, fn, sc, base, nw, **EPS)}
        row = {"T": T, "H": H}
        calls = {}
        for (name, kw), norm in itertools.product(variants(T).items(), (False, True)):
            name += "_norm" if norm else ""

            def call(kw=kw, norm=norm):
                return hc_head_triton(x, fn, sc, base, EPS["norm_eps"], EPS["hc_eps"],
                                      nw if norm else None, **kw)

            if beyond := beyond_2_ulps(call(), refs[norm]):
                row[f"{name}_mismatch"] = beyond  # timed all the same; the GPU tests decide
            row[name] = round(time_in_graph(call, rep_ms=5)["median_us"], 2)
            calls[name] = call
        if T <= 64:
            eager = time_eager_side_by_side(calls)
            row.update({f"{k}_eager": round(v["median_us"], 2) for k, v in eager.items()})
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        (out / "ab_hc_head.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
