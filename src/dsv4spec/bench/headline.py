"""The README's headline: what the plugins save per speculative step, per Triton stack and with
DeepGEMM off or on, computed from committed per-call times and the packaged tables' decisions.

No GPU: every figure is a sum of device times already measured on the H200, each hooked call
timed alone in a CUDA graph at its own size (what one step's calls cost, not a served request's
latency), re-derived for the tables as they ship whenever this is run.

- Per-call times (Triton 3.6, DeepGEMM off): vLLM's from ``bench vllm`` (its ``rows``:
  ``vllm_graph_us`` and ``hook_graph_us`` per op, H, T); SGLang's DSpark step from
  ``bench dspark --steps`` (the ``hook H=.. T=..: ours .. us, SGLang .. us`` lines of its log).
  The calls of a step are :func:`dsv4spec.bench.vllm_plugin.step_calls` and
  :func:`dsv4spec.bench.dspark.step_calls`.
- Triton 3.6: a call saves ``engine - ours`` of its measured time where the 3.6 tables give it
  to ours (a range a winning point extends to may hold a count measured slower: that call adds
  its loss), nothing elsewhere.
- Triton 3.8: which calls ours serves is asked of the 3.8 tables; what such a call saves is the
  3.8 table's own graph point at that count (``engine_us - ours_us``), or, at a count not
  measured there, the smaller saving of the two measured counts around it, which the table
  serves it between (:func:`point_saving`). The engine's step time is the 3.6 run's (the
  engines' TileLang kernels do not depend on Triton).
- DeepGEMM on (what vLLM on Hopper and SGLang with DeepGEMM installed run): which calls ours
  serves is each plugin's decision function's answer with ``deep_gemm`` (the rows measured
  against the engine's DeepGEMM path, the ``.deepgemm`` files, where they exist for the stack);
  what a call of such a row saves is that file's own graph point at its count (or the smaller
  of the two around it), against DeepGEMM's path; the other calls save as above. The engine's
  own step time under DeepGEMM was not measured: only the savings are given.

``python -m dsv4spec.bench.headline`` writes ``benchmarks/results/headline/headline.{json,md}``
and the tables between the ``headline`` markers of the README (its rows, :data:`ROWS`) and of
the plugin pages (every step summed there, :data:`DOC_ROWS`); ``--check`` only compares (exit 1
where a file differs). ``tests/bench/test_headline.py`` runs the comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from dsv4spec.integrations import tables
from dsv4spec.model.config import preset

ROOT = Path(__file__).resolve().parents[3]
DEVICE, ARCHITECTURE = "NVIDIA H200", (9, 0)
STACKS = ("3.6", "3.8")
MODELS = {"DSV4-Pro": "pro-shape", "DSV4-Flash": "flash-shape"}
VLLM_RESULTS = {7168: "benchmarks/results/vllm034/vllm_plugin_h7168.json",
                4096: "benchmarks/results/vllm034/vllm_plugin_h4096.json"}
SGLANG_LOG = "benchmarks/results/dspark/logs/bench_dspark_triton3.6.log"
SGLANG_RESULTS = "benchmarks/results/dspark/dspark_triton3.6.md"
OUT = "benchmarks/results/headline"
README = "README.md"
BEGIN = "<!-- headline: python -m dsv4spec.bench.headline -->"
END = "<!-- /headline -->"
# (engine, model, drafter, drafts k or block N, bs): the README's rows
ROWS = (
    ("sglang", "DSV4-Pro", "dspark", 7, 1),
    ("sglang", "DSV4-Pro", "dspark", 7, 8),
    ("sglang", "DSV4-Flash", "dspark", 7, 1),
    ("sglang", "DSV4-Flash", "dspark", 7, 8),
    ("vllm", "DSV4-Pro", "mtp", 3, 1),
    ("vllm", "DSV4-Pro", "mtp", 3, 8),
    ("vllm", "DSV4-Pro", "dspark", 7, 8),
    ("vllm", "DSV4-Flash", "mtp", 3, 1),
    ("vllm", "DSV4-Flash", "dspark", 7, 8),
)
# the plugin pages' per-step tables: every step the result files hold the calls of
DOC_ROWS = {
    "docs/vllm.md": tuple(("vllm", model, drafter, k, bs) for model in MODELS
                          for drafter, k in (("mtp", 1), ("mtp", 3), ("dspark", 7))
                          for bs in (1, 8, 32)),
    "docs/sglang.md": tuple(("sglang", model, "dspark", 7, bs) for model in MODELS
                            for bs in (1, 8)),
}
ENGINE_NAMES = {"sglang": "SGLang 0.5.23", "vllm": "vLLM 0.34.0"}
# the table hook a call's op reads (vLLM 0.34.0's reuse_residual boundary: the boundary's)
TABLE_HOOK = {"mhc_fused_post_pre_reuse_residual": "mhc_fused_post_pre"}
_LOG_LINE = re.compile(r"^(\w+) H=(\d+) T=(\d+): ours ([\d.]+) us, SGLang ([\d.]+) us$")

Point = tuple[float, float]  # (ours_us, engine_us)


def vllm_points(root: Path = ROOT) -> dict[tuple[str, int, int], Point]:
    """(op, H, T) -> (ours, vLLM) graph µs of ``bench vllm``'s rows."""
    out = {}
    for path in VLLM_RESULTS.values():
        for row in json.loads((root / path).read_text())["rows"]:
            out[(row["op"], row["H"], row["T"])] = (row["hook_graph_us"], row["vllm_graph_us"])
    return out


def sglang_points(root: Path = ROOT) -> dict[tuple[str, int, int], Point]:
    """(hook, H, T) -> (ours, SGLang) graph µs of ``bench dspark --steps``'s log."""
    out = {}
    for line in (root / SGLANG_LOG).read_text().splitlines():
        m = _LOG_LINE.match(line.strip())
        if m:
            out[(m[1], int(m[2]), int(m[3]))] = (float(m[4]), float(m[5]))
    return out


def step_calls(engine: str, model: str, drafter: str, k: int, bs: int) -> list[tuple[str, int,
                                                                                    int]]:
    """(op, T, calls) of one step, as the benchmarks that measured it count them."""
    layers = preset(MODELS[model]).num_hidden_layers
    if engine == "sglang":
        from dsv4spec.bench import dspark

        return dspark.step_calls(layers, bs, k)
    from dsv4spec.bench import vllm_plugin

    return vllm_plugin.step_calls(layers, bs, k, drafter, vllm_plugin.REUSE)


def decision(engine: str, deep_gemm: bool) -> Callable[[str, int, int], bool]:
    """``serves(op, T, H)``: whether the plugin gives that graph call to ours (the tables read
    are those of :func:`tables.assuming`'s stack), with the calls DeepGEMM takes saving
    nothing."""
    if engine == "sglang":
        from dsv4spec.bench import dspark

        def serves(op: str, T: int, H: int) -> bool:
            return dspark.served(op, T, H, ARCHITECTURE, deep_gemm)

        return serves
    from dsv4spec.integrations.vllm import hc_head, mhc

    def serves(op: str, T: int, H: int) -> bool:
        if op == "hc_head":
            return hc_head.hc_head_prefers_dsv4spec(T, H, True, ARCHITECTURE)
        return mhc.prefers_dsv4spec(TABLE_HOOK.get(op, op), T, H, True, ARCHITECTURE, deep_gemm)

    return serves


def table_points(engine: str, stack: str,
                 deepgemm: bool = False) -> dict[tuple[str, int], list[list[float]]]:
    """(hook, H) -> the packaged H200 file's graph points ``[count, ours_us, engine_us]`` of
    that stack (``deepgemm``: of its rows measured against DeepGEMM's path; none where no such
    file is packaged)."""
    name = tables.device_file_name(DEVICE, stack if deepgemm or stack != "3.6" else None,
                                   deepgemm)
    if deepgemm and not (tables.PACKAGED_DIR / name).is_file():
        return {}
    hooks = tables.read_file(tables.PACKAGED_DIR / name).get(engine, {})
    return {(hook, int(H)): sorted(points) for hook, entry in hooks.items()
            for H, points in entry.get("points", {}).get("graph", {}).items()}


def point_saving(points: dict[tuple[str, int], list[list[float]]], hook: str, H: int,
                 T: int) -> float:
    """``engine_us - ours_us`` of the table's point at ``T``; at a count not measured, the
    smaller saving of the measured counts on either side (a table serves such a count only
    between two points of its segment that both won clearly), else of the largest below."""
    rows = points.get((hook, H), [])
    below = [p for p in rows if p[0] <= T]
    if not below:
        raise LookupError(f"no table point for {hook} at H = {H} up to T = {T}")
    saving = below[-1][2] - below[-1][1]
    above = [p for p in rows if p[0] > T]
    if below[-1][0] == T or not above:
        return saving
    return min(saving, above[0][2] - above[0][1])


def row(engine: str, model: str, drafter: str, k: int, bs: int, measured: dict) -> dict:
    """One headline row: per (stack, DeepGEMM off/on) what the step saves; the engine's and the
    plugin's step times where DeepGEMM is off under Triton 3.6 (the measured configuration)."""
    H = preset(MODELS[model]).hidden_size
    calls = step_calls(engine, model, drafter, k, bs)
    missing = [(op, T) for op, T, _ in calls if (op, H, T) not in measured]
    if missing:
        raise LookupError(f"{engine} {model} {drafter} bs {bs}: no measured time for {missing}")
    engine_us = sum(n * measured[(op, H, T)][1] for op, T, n in calls)
    out = {"engine": ENGINE_NAMES[engine], "model": model, "drafter": drafter, "k": k, "bs": bs,
           "verify_T": bs * (k + 1), "draft_T": bs * k if drafter == "dspark" else bs,
           "engine_step_us": round(engine_us, 1), "saved_us": {}}
    for stack in STACKS:
        points = table_points(engine, stack)
        deepgemm_points = table_points(engine, stack, deepgemm=True)
        with tables.assuming(DEVICE, stack):
            for deep_gemm in (False, True):
                serves = decision(engine, deep_gemm)
                saved = 0.0
                for op, T, n in calls:
                    if not serves(op, T, H):
                        continue
                    hook = TABLE_HOOK.get(op, op)
                    if deep_gemm and (hook, H) in deepgemm_points:  # against DeepGEMM's path
                        saved += n * point_saving(deepgemm_points, hook, H, T)
                    elif stack == "3.6":
                        ours, theirs = measured[(op, H, T)]
                        saved += n * (theirs - ours)
                    else:
                        saved += n * point_saving(points, hook, H, T)
                out["saved_us"][f"triton{stack}_deepgemm_{'on' if deep_gemm else 'off'}"] = (
                    round(saved, 1))
    lab = out["saved_us"]["triton3.6_deepgemm_off"]
    out["plugin_step_us"] = round(engine_us - lab, 1)
    out["saved_pct"] = round(100 * lab / engine_us, 1)
    out["results"] = (SGLANG_RESULTS if engine == "sglang" else VLLM_RESULTS[H]).replace(
        ".json", ".md")
    return out


@contextlib.contextmanager
def packaged_tables_only() -> Iterator[None]:
    """The packaged tables decide, whatever this user's tables directory holds."""
    previous = os.environ.get(tables.TABLES_DIR_ENV)
    with tempfile.TemporaryDirectory() as empty:
        os.environ[tables.TABLES_DIR_ENV] = empty
        try:
            yield
        finally:
            if previous is None:
                del os.environ[tables.TABLES_DIR_ENV]
            else:
                os.environ[tables.TABLES_DIR_ENV] = previous
            tables.clear_cache()


def compute(root: Path = ROOT, specs=ROWS) -> list[dict]:
    measured = {"sglang": sglang_points(root), "vllm": vllm_points(root)}
    with packaged_tables_only():
        return [row(*spec, measured=measured[spec[0]]) for spec in specs]


def every_spec() -> list[tuple]:
    """The README's rows, then the plugin pages' others."""
    specs = list(ROWS)
    for rows in DOC_ROWS.values():
        specs += [spec for spec in rows if spec not in specs]
    return specs


def _us(value: float) -> str:
    return f"{value:,.1f} µs"


def readme_table(rows: list[dict], up: str = "") -> str:
    """The table between a page's markers; ``up`` leads its links to the repository root
    (``"../"`` from ``docs/``)."""
    drafters = {"mtp": "MTP {k} draft{s}", "dspark": "DSpark (N = {k})"}
    lines = ["| engine, model, drafter | bs | tokens per call: verify / draft | saved: Triton "
             "3.8, DeepGEMM on | saved: Triton 3.8, DeepGEMM off | Triton 3.6, DeepGEMM off: "
             "engine → with dsv4spec (saved) | results file |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        drafter = drafters[r["drafter"]].format(k=r["k"], s="s" if r["k"] > 1 else "")
        what = f"{r['engine']}, {r['model']}, {drafter}"
        saved = r["saved_us"]
        lab = (f"{_us(r['engine_step_us'])} → {_us(r['plugin_step_us'])} "
               f"({saved['triton3.6_deepgemm_off']:,.1f} µs, {r['saved_pct']} %)")
        lines.append(f"| {what} | {r['bs']} | {r['verify_T']} / {r['draft_T']} | "
                     f"{_us(saved['triton3.8_deepgemm_on'])} | "
                     f"{_us(saved['triton3.8_deepgemm_off'])} | {lab} | "
                     f"[`headline.md`]({up}{OUT}/headline.md), from "
                     f"[`{Path(r['results']).name}`]({up}{r['results']}) |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    columns = ["engine", "model", "drafter", "k", "bs", "verify_T", "draft_T", "engine_step_us",
               "plugin_step_us", "saved_pct", *rows[0]["saved_us"]]
    lines = ["# headline", "", (__doc__ or "").split("\n\n")[0].replace("\n", " "), "",
             "Saved per step, µs (device time in a CUDA graph on one H200, each hooked call "
             "timed alone, summed; not a served request's latency). engine_step_us and "
             "plugin_step_us: Triton 3.6, DeepGEMM off. How each column is derived: "
             "`src/dsv4spec/bench/headline.py`.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        flat = {**r, **r["saved_us"]}
        lines.append("| " + " | ".join(str(flat[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def readme_with(text: str, table: str) -> str:
    """``text`` (the README) with the table between its markers replaced."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return text[:start + len(BEGIN)] + "\n" + table + "\n" + text[end:]


def outputs(root: Path = ROOT) -> dict[Path, str]:
    """What this writes: path -> content."""
    specs = every_spec()
    rows = compute(root, specs)
    of = dict(zip(specs, rows))
    out = {root / OUT / "headline.json": json.dumps({"rows": rows}, indent=1) + "\n",
           root / OUT / "headline.md": markdown(rows)}
    for name, chosen in {README: ROWS, **DOC_ROWS}.items():
        path = root / name
        up = "../" * (len(Path(name).parts) - 1)
        out[path] = readme_with(path.read_text(), readme_table([of[s] for s in chosen], up))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4spec.bench.headline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the files, write nothing (exit 1 where one differs)")
    args = parser.parse_args(argv)
    stale = []
    for path, content in outputs().items():
        current = path.read_text() if path.is_file() else None
        if current == content:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
