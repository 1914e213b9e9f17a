"""``dsv4spec bench dspark``: SGLang's DSpark draft hc_head (``hc_head_torch``, the unfused ATen
chain ``DeepseekV4ForCausalLMDSpark.collapse_hc_head`` runs over the draft block's ``bs * N``
rows) beside dsv4spec's fused hc_head, and what the SGLang plugin saves per DSpark step.

Providers, per width H and batch bs (T = bs * N rows, N = 7, the ``dspark_block_size`` of the
current DSV4 recipes):

- ``sglang``: SGLang 0.5.23's own ``hc_head_torch``, its source taken by path from
  ``srt/models/deepseek_v4.py`` (:func:`load_sglang_hc_head_torch`: the one function, executed
  over ``torch`` and ``torch.nn.functional``; the model module itself needs SGLang's CUDA stack);
- ``sglang_compiled``: the same function under ``torch.compile`` (``dynamic=False``), compiled
  before capture and captured as compiled kernels, as SGLang's PRs #32220 and #32497 propose for
  the MTP draft's chain;
- ``dsv4spec``: dsv4spec's fused hc_head (``hc_head(..., impl="triton")``), what the
  ``DSV4SPEC_SGLANG_DSPARK_HC_HEAD`` hook runs.

Each is checked against the float64 reference before timing. "graph" is device time per call
replayed from a CUDA graph (median), "eager" host wall time per call of back-to-back calls, the
providers interleaved. ``served_graph`` / ``served_eager`` say which one the shipped tables give
the call to.

Per step (``--steps``), for DSV4-Flash and DSV4-Pro at each ``--step-batch``, the calls the
SGLang plugin's hooks reach in one DSpark step (SGLang 0.5.23, defaults): the target's verify
forward over ``bs (N + 1)`` tokens (its first ``hc_pre``, ``2 L - 1`` fused boundaries, its last
``hc_post``, its fused hc_head) and the draft's forward over ``bs N`` rows (3 stages built with
``boundary_mhc_fusions=False``: ``hc_pre`` and ``hc_post`` apart for each of the 6 sublayers,
then ``collapse_hc_head``), each timed as ``dsv4spec tune`` times it (SGLang's kernels loaded by
path, DeepGEMM off), summed in a graph with SGLang's kernels and with the plugin as served.
The draft's stage ``hc_pre`` is timed with the fused RMSNorm weight, as the target's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch

from dsv4spec.bench import common
from dsv4spec.bench.sglang_hc_head_torch import FUNCTION, load_sglang_hc_head_torch, providers
from dsv4spec.model.config import preset

BLOCK = 7
STAGES = 3
WIDTHS = (4096, 7168)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
STEP_BATCHES = (1, 8)
MODELS = {"DSV4-Flash": "flash-shape", "DSV4-Pro": "pro-shape"}
COLUMNS = ["H", "bs", "T", "sglang_graph_us", "compiled_graph_us", "dsv4spec_graph_us",
           "sglang_eager_us", "compiled_eager_us", "dsv4spec_eager_us", "graph_speedup",
           "eager_speedup", "served_graph", "served_eager"]
STEP_COLUMNS = ["model", "bs", "verify_T", "draft_rows", "sglang_step_us", "plugin_step_us",
                "saved_us", "dspark_hc_head_saved_us"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hidden", type=int, nargs="+", default=list(WIDTHS),
                        help="hidden sizes H")
    parser.add_argument("--batch", type=int, nargs="+", default=list(BATCHES),
                        help="requests bs (T = bs * --block rows)")
    parser.add_argument("--block", type=int, default=BLOCK, help="DSpark's block size N")
    parser.add_argument("--steps", action="store_true",
                        help="also the per-step sums (needs SGLang's TileLang mHC kernels)")
    parser.add_argument("--step-batch", type=int, nargs="+", default=list(STEP_BATCHES),
                        help="requests bs of the per-step sums")


def measure(sglang_fn: Callable, H: int, bs: int, block: int) -> dict:
    from dsv4spec.integrations.sglang.hc_head import dspark_prefers_dsv4spec

    T = bs * block
    fns = providers(sglang_fn, H, T)
    graph = {name: common.time_in_graph(fn)["median_us"] for name, fn in fns.items()}
    eager = common.time_eager_side_by_side(fns)
    arch = torch.cuda.get_device_capability()
    return {"H": H, "bs": bs, "T": T,
            "sglang_graph_us": graph["sglang"], "compiled_graph_us": graph["sglang_compiled"],
            "dsv4spec_graph_us": graph["dsv4spec"],
            "sglang_eager_us": eager["sglang"]["median_us"],
            "compiled_eager_us": eager["sglang_compiled"]["median_us"],
            "dsv4spec_eager_us": eager["dsv4spec"]["median_us"],
            "graph_speedup": graph["sglang"] / graph["dsv4spec"],
            "eager_speedup": eager["sglang"]["median_us"] / eager["dsv4spec"]["median_us"],
            "served_graph": "dsv4spec" if dspark_prefers_dsv4spec(T, H, True, arch) else "sglang",
            "served_eager": ("dsv4spec" if dspark_prefers_dsv4spec(T, H, False, arch)
                             else "sglang")}


def step_calls(layers: int, bs: int, block: int) -> list[tuple[str, int, int]]:
    """(hook, T, calls) of one SGLang DSpark step that the plugin's hooks reach (see the module
    docstring); hooks are ``dsv4spec tune``'s names."""
    verify, rows = bs * (block + 1), bs * block
    return [("mhc_pre", verify, 1), ("mhc_fused_post_pre", verify, 2 * layers - 1),
            ("mhc_post", verify, 1), ("target_hc_head", verify, 1),
            ("mhc_pre", rows, 2 * STAGES), ("mhc_post", rows, 2 * STAGES),
            ("dspark_hc_head", rows, 1)]


def served(hook: str, T: int, H: int, architecture: tuple[int, int],
           deep_gemm: bool = False) -> bool:
    """Whether the shipped tables give the (captured) call to ours; ``deep_gemm``: where SGLang
    runs DeepGEMM's pre-norm GEMM (the mHC hooks' decision)."""
    from dsv4spec.integrations.sglang import hc_head as hc_head_hooks
    from dsv4spec.integrations.sglang import mhc as mhc_hooks

    if hook == "target_hc_head":
        return hc_head_hooks.target_prefers_dsv4spec(T, H, True, architecture)
    if hook == "dspark_hc_head":
        return hc_head_hooks.dspark_prefers_dsv4spec(T, H, True, architecture)
    return mhc_hooks.prefers_dsv4spec(hook, T, H, True, architecture, deep_gemm)


def step_rows(points: dict[tuple[str, int, int], list[float]], batches: Sequence[int],
              block: int, architecture: tuple[int, int],
              serves: Callable[[str, int, int, tuple[int, int]], bool] = served) -> list[dict]:
    """Per model and batch, the graph-time sums from ``points[(hook, H, T)] = [ours, sglang]``."""
    out = []
    for model, name in MODELS.items():
        cfg = preset(name)
        H, layers = cfg.hidden_size, cfg.num_hidden_layers
        for bs in batches:
            calls = step_calls(layers, bs, block)
            if any((hook, H, T) not in points for hook, T, _ in calls):
                continue
            engine = sum(n * points[(hook, H, T)][1] for hook, T, n in calls)
            plugin = sum(n * points[(hook, H, T)][0 if serves(hook, T, H, architecture) else 1]
                         for hook, T, n in calls)
            head = [(points[(h, H, T)], serves(h, T, H, architecture)) for h, T, _ in calls
                    if h == "dspark_hc_head"][0]
            out.append({"model": model, "bs": bs, "verify_T": bs * (block + 1),
                        "draft_rows": bs * block, "sglang_step_us": engine,
                        "plugin_step_us": plugin, "saved_us": engine - plugin,
                        "dspark_hc_head_saved_us": head[0][1] - head[0][0] if head[1] else 0.0})
    return out


def measure_steps(batches: Sequence[int], block: int, widths: Sequence[int]) -> list[dict]:
    from dsv4spec.bench.tune import GRIDS, Measure

    measure = Measure()
    points = {}
    for model, name in MODELS.items():
        cfg = preset(name)
        if cfg.hidden_size not in widths:
            continue
        for bs in batches:
            for hook, T, _ in step_calls(cfg.num_hidden_layers, bs, block):
                key = (hook, cfg.hidden_size, T)
                if key not in points:
                    points[key] = measure.point(GRIDS[hook], cfg.hidden_size, T, False)["graph"]
                    print(f"{hook} H={key[1]} T={T}: ours {points[key][0]:.2f} us, SGLang "
                          f"{points[key][1]:.2f} us", flush=True)
    return step_rows(points, batches, block, torch.cuda.get_device_capability())


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("dsv4spec bench dspark: needs a CUDA GPU")
        return 1
    try:
        sglang_fn = load_sglang_hc_head_torch()
    except (FileNotFoundError, ImportError) as err:
        print(f"dsv4spec bench dspark: SGLang's {FUNCTION} not loaded ({err}); install the "
              "wheel (pip install --no-deps sglang==0.5.23) or set DSV4SPEC_SGLANG_ROOT")
        return 1
    rows = []
    for H in args.hidden:
        for bs in args.batch:
            rows.append(measure(sglang_fn, H, bs, args.block))
            common.print_table(rows[-1:], COLUMNS)
    steps = measure_steps(args.step_batch, args.block, args.hidden) if args.steps else []
    common.print_table(rows, COLUMNS)
    if steps:
        common.print_table(steps, STEP_COLUMNS)
    from dsv4spec.integrations.sglang.source import sglang_version

    payload = {"environment": {**common.environment(), "sglang": sglang_version()},
               "block": args.block, "steps": steps}
    notes = (f"SGLang's {FUNCTION} (its source, eager and torch.compile'd) vs dsv4spec's fused "
             f"hc_head over bs * {args.block} rows; graph = device us per call in a CUDA graph, "
             "eager = host us per back-to-back call; served = what the shipped tables choose.")
    if steps:
        notes += ("\n\nPer DSpark step (graph us; SGLang's kernels vs the plugin as served):\n\n"
                  + common.markdown_table(steps, STEP_COLUMNS))
    for path in common.write_results(args.out, "dspark", payload, rows, COLUMNS, notes):
        print(f"wrote {path}")
    return 0
