"""Summarise `dsv4spec bench e2e` results: per preset and batch size, all optimisations on vs
SGLang's arrangement, and each phase's saving measured as docs/benchmarks.md describes.

    python scripts/e2e_summary.py benchmarks/results/e2e.json [more.json ...] > summary.md
"""

import json
import sys


def main(paths: list[str]) -> None:
    rows = [r for p in paths for r in json.load(open(p))["rows"]]
    by = {(r["preset"], r["batch"], r["config"]): r for r in rows}
    print("| preset | bs | step ms: SGLang arr. → all on | tokens/s: SGLang arr. → all on | "
          "rollback host µs/step (SGLang loop after → inside) | rollback device µs/step (loop "
          "inside → fused inside, span) | draft-extend graph µs (eager → compiled → triton) | "
          "draft chain graph µs (eager → triton) | kernels/step | same tokens as greedy |")
    print("|" + "---|" * 10)
    for preset, bs in sorted({(r["preset"], r["batch"]) for r in rows}):
        g = lambda c: by[(preset, bs, c)]  # noqa: E731
        s, a = g("sglang"), g("all-on")
        same = all(g(c)["identical_to_greedy"] for c in
                   {r["config"] for r in rows if (r["preset"], r["batch"]) == (preset, bs)})
        print(f"| {preset} | {bs} | {s['step_ms']:.1f} → {a['step_ms']:.1f} | "
              f"{s['tokens_per_s']:.0f} → {a['tokens_per_s']:.0f} | "
              f"{s['rollback_host_us']:.0f} → 0 | "
              f"{g('loop-inside')['rollback_span_us']:.1f} → {a['rollback_span_us']:.1f} | "
              f"{g('fused-inside/eager')['extend_graph_us']:.0f} → "
              f"{g('fused-inside/compiled')['extend_graph_us']:.0f} → "
              f"{a['extend_graph_us']:.0f} | "
              f"{g('fused-inside/eager')['chain_graph_us']:.0f} → {a['chain_graph_us']:.0f} | "
              f"{s['kernels_per_step']:.0f} → {a['kernels_per_step']:.0f} | "
              f"{'yes' if same else 'no'} |")


if __name__ == "__main__":
    main(sys.argv[1:])
