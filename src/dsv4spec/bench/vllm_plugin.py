"""``dsv4spec bench vllm``: per call the vLLM plugin hooks, vLLM's TileLang function vs the same
call through dsv4spec's hook, in a CUDA graph and eagerly, and the per-step sums for DSV4-Pro and
DSV4-Flash with MTP and with DSpark, as the running vLLM source (0.33.0 or 0.34.0) calls them.

Providers, for each hooked function (``hc_head_fused_kernel_tilelang``, ``mhc_pre_tilelang``,
``mhc_post_tilelang``, ``mhc_fused_post_pre_tilelang`` and, on 0.34.0,
``mhc_fused_post_pre_tilelang_reuse_residual``), width H and token count T: ``vllm``, vLLM's own
function (its ``tilelang.py`` and TileLang kernels loaded by path from vLLM's source, DeepGEMM
off: see ``dsv4spec.bench.vllm_kernels``); ``hook``, the plugin's guarded wrapper of it with
dsv4spec's op forced on (every step-aside check paid, the measured tables ignored), i.e. what the
plugin costs where it serves. Each call is made as DeepSeek-V4's modules make it (DSV4's
epsilons, Sinkhorn 20, the fused RMSNorm weight); both providers' outputs are compared with
dsv4spec's float64 reference before timing (vLLM's ``reuse_residual`` boundary on a copy of the
residual it may overwrite), and the hook's error may not exceed twice vLLM's (plus one rounding).
"graph" is device time per call replayed from a CUDA graph (median); "eager" is host wall time
per call of back-to-back calls, the two providers interleaved. ``served`` says which one the
shipped tables give the call to.

Per step, for ``bs`` requests (from vLLM's source: ``nvidia/model.py``, ``nvidia/mtp.py``,
``nvidia/dspark.py``). The target's verify forward runs over ``T_v`` tokens and calls the
boundary ``2 L - 1`` times (every sublayer but the first layer's attention, whose mhc_pre is the
unhooked broadcast one; on 0.34.0 through ``..._reuse_residual``, since ``DeepseekV4Model``
passes ``reuse_residual=True``), then mhc_post and hc_head once each.

- MTP with ``k`` drafts: ``T_v = bs (k + 1)``; the first draft pass runs over the same ``T_v``
  tokens (mhc_pre, one boundary, mhc_post) and hc_head over ``bs`` rows; each of the other
  ``k - 1`` draft passes runs all four over ``bs`` tokens.
- DSpark with block size ``N`` (``k = N`` drafts): ``T_v = bs (N + 1)``; one non-causal draft
  forward over ``bs N`` rows through its 3 ``DeepseekV4DecoderLayer`` stages (the first
  layer's mhc_pre, then ``2 * 3 - 1`` boundaries without ``reuse_residual``), mhc_post and
  hc_head once each.

The sums add graph times, each call timed at its own size, with vLLM's kernels and with the
plugin as served (ours where the tables say so).
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from dsv4spec.bench import common, deepgemm
from dsv4spec.bench.vllm_kernels import vllm_mhc_peer
from dsv4spec.integrations.hooks import GuardedHook
from dsv4spec.integrations.vllm import hc_head as hc_head_hooks
from dsv4spec.integrations.vllm import mhc as mhc_hooks
from dsv4spec.integrations.vllm.mhc import prefers_dsv4spec
from dsv4spec.model.config import preset
from dsv4spec.ops import (
    hc_head_reference,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre_reference,
)
from dsv4spec.timing import time_eager_side_by_side, time_in_graph

OPS = ("hc_head", "mhc_pre", "mhc_post", "mhc_fused_post_pre")
REUSE = "mhc_fused_post_pre_reuse_residual"  # 0.34.0's target boundary
EPS, ITERS = 1e-6, 20
WIDTHS = (4096, 7168)
BATCHES = (1, 8, 32)
MTP_DRAFTS = (1, 3)
DSPARK_BLOCK = 7  # dspark_block_size of the current vLLM DSV4 recipes
DSPARK_STAGES = 3
QUICK_TOKENS = (1, 4, 64)
MODELS = {"DSV4-Flash": "flash-shape", "DSV4-Pro": "pro-shape"}
COLUMNS = ["op", "H", "T", "vllm_graph_us", "hook_graph_us", "vllm_eager_us", "hook_eager_us",
           "graph_speedup", "eager_speedup", "served", "vllm_err", "hook_err", "path"]
STEP_COLUMNS = ["model", "boundary", "drafter", "bs", "k", "verify_T", "vllm_step_us",
                "plugin_step_us", "saved_us"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, nargs="+", default=None,
                        help="token counts T (default: every count the per-step sums of "
                             "--batch need)")
    parser.add_argument("--hidden", type=int, nargs="+", default=list(WIDTHS),
                        help="hidden sizes H")
    parser.add_argument("--batch", type=int, nargs="+", default=list(BATCHES),
                        help="requests per step bs for the per-step sums")
    parser.add_argument("--drafts", type=int, nargs="+", default=list(MTP_DRAFTS),
                        help="MTP draft tokens k per step for the per-step sums")
    parser.add_argument("--dspark-block", type=int, default=DSPARK_BLOCK,
                        help="DSpark's block size N (draft rows per request; 0: no DSpark sums)")
    deepgemm.add_argument(parser)


def make_inputs(T: int, H: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    d = {"device": "cuda"}
    t = {
        "residual": torch.randn(T, 4, H, generator=g, **d).bfloat16(),
        "x": torch.randn(T, H, generator=g, **d).bfloat16(),
        "post": torch.rand(T, 4, 1, generator=g, **d) * 2,
        "comb": torch.rand(T, 4, 4, generator=g, **d),
        "fn": torch.randn(24, 4 * H, generator=g, **d) * (4 * H) ** -0.5,
        "hc_scale": torch.rand(3, generator=g, **d) + 0.5,
        "hc_base": torch.randn(24, generator=g, **d) * 0.5,
        "norm_weight": (1 + 0.25 * torch.randn(H, generator=g, **d)).bfloat16(),
        "head_fn": torch.randn(4, 4 * H, generator=g, **d) * (4 * H) ** -0.5,
        "head_scale": torch.rand(1, generator=g, **d) + 0.5,
        "head_base": torch.randn(4, generator=g, **d) * 0.5,
    }
    t["comb"] /= t["comb"].sum(-1, keepdim=True)
    return t


def call(fn, op: str, t: dict):
    """``op`` as DeepSeek-V4's modules call it (nvidia/model.py, nvidia/mtp.py)."""
    pre = (t["fn"], t["hc_scale"], t["hc_base"], EPS, EPS, EPS, 2.0, ITERS)
    norm = {"norm_weight": t["norm_weight"], "norm_eps": EPS}
    if op == "mhc_pre":
        return fn(t["residual"], *pre, **norm)
    if op in ("mhc_fused_post_pre", REUSE):
        return fn(t["x"], t["residual"], t["post"], t["comb"], *pre, n_splits=1, tile_n=1, **norm)
    if op == "mhc_post":
        return fn(t["x"], t["residual"], t["post"], t["comb"])
    return fn(t["residual"], t["head_fn"], t["head_scale"], t["head_base"], EPS, EPS)


def reference(op: str, t: dict) -> tuple:
    kw = dict(rms_eps=EPS, hc_eps=EPS, sinkhorn_iters=ITERS, post_mult=2.0,
              norm_weight=t["norm_weight"], norm_eps=EPS)
    pre = (t["fn"], t["hc_scale"], t["hc_base"])
    if op == "mhc_pre":
        return mhc_pre_reference(t["residual"], *pre, **kw)
    if op in ("mhc_fused_post_pre", REUSE):
        return mhc_post_pre_reference(t["x"], t["residual"], t["post"][..., 0], t["comb"], *pre,
                                      **kw)
    if op == "mhc_post":
        return (mhc_post_reference(t["x"], t["residual"], t["post"][..., 0], t["comb"]),)
    return (hc_head_reference(t["residual"].double(), t["head_fn"].double(),
                              t["head_scale"].double(), t["head_base"].double(), norm_eps=EPS,
                              hc_eps=EPS),)


def max_error(out, ref: tuple) -> float:
    out = out if isinstance(out, tuple) else (out,)
    return max((o.double().reshape(r.shape) - r.double()).abs().max().item()
               for o, r in zip(out, ref))


@contextlib.contextmanager
def ours_forced():
    """The hooks with dsv4spec's op preferred at every size (the tables ignored)."""
    saved = (mhc_hooks.prefers_dsv4spec, hc_head_hooks.prefers_dsv4spec)
    mhc_hooks.prefers_dsv4spec = hc_head_hooks.prefers_dsv4spec = lambda *a, **k: True
    try:
        yield
    finally:
        mhc_hooks.prefers_dsv4spec, hc_head_hooks.prefers_dsv4spec = saved


def hooked(fn, op: str):
    """The plugin's wrapper of vLLM's ``fn`` (a GuardedHook around the fast path)."""
    area = hc_head_hooks if op == "hc_head" else mhc_hooks
    guard = GuardedHook(f"vLLM {op}", getattr(area, f"fast_{op}"), mhc_hooks.logger, "vLLM")

    def wrapper(*args, **kwargs):
        return guard(fn, *args, **kwargs)

    wrapper.guard = guard
    return wrapper


def measure(peer, op: str, H: int, T: int, seed: int) -> dict:
    vllm_fn = getattr(peer, op)
    stepped_aside = []
    hook = hooked(lambda *a, **k: stepped_aside.append(1) or vllm_fn(*a, **k), op)
    t = make_inputs(T, H, seed)
    ref = reference(op, t)
    # vLLM's reuse_residual boundary may write the new residual into its input: check each
    # provider on its own copy (the timed calls then reuse one residual, as replays do)
    fresh = lambda: {**t, "residual": t["residual"].clone()}  # noqa: E731
    with ours_forced():
        call(hook, op, fresh())  # first sight: compiles ours, eagerly
        if stepped_aside:
            raise RuntimeError(f"{op} H={H} T={T}: the hook stepped aside (vLLM's ran)")
        vllm_err = max_error(call(vllm_fn, op, fresh()), ref)
        hook_err = max_error(call(hook, op, fresh()), ref)
        if not hook.guard.enabled:
            raise RuntimeError(f"{op} H={H} T={T}: the hook failed ({hook.guard.failure})")
        floor = 2.0 ** -7 * max(r.double().abs().max().item() for r in ref)
        if hook_err > 2 * vllm_err + floor:
            raise RuntimeError(f"{op} H={H} T={T}: hook error {hook_err:.3g} > 2 x vLLM's "
                               f"{vllm_err:.3g}")
        graph = {name: time_in_graph(lambda f=f: call(f, op, t))["median_us"]
                 for name, f in (("vllm", vllm_fn), ("hook", hook))}
        eager = time_eager_side_by_side({"vllm": lambda: call(vllm_fn, op, t),
                                         "hook": lambda: call(hook, op, t)})
    index = torch.cuda.current_device()
    table_op = "mhc_fused_post_pre" if op == REUSE else op  # the plugin's _TABLE_OF
    architecture = torch.cuda.get_device_capability(index)
    served = "ours" if prefers_dsv4spec(table_op, T, H, True, architecture,
                                        mhc_hooks.vllm_deep_gemm()) else "vllm"
    return {"op": op, "H": H, "T": T, "vllm_graph_us": graph["vllm"],
            "hook_graph_us": graph["hook"], "vllm_eager_us": eager["vllm"]["median_us"],
            "hook_eager_us": eager["hook"]["median_us"],
            "graph_speedup": graph["vllm"] / graph["hook"],
            "eager_speedup": eager["vllm"]["median_us"] / eager["hook"]["median_us"],
            "served": served, "vllm_err": vllm_err, "hook_err": hook_err,
            "path": deepgemm.gemm_path(op, T, getattr(peer, "deep_gemm", None) is not None)}


def step_calls(layers: int, bs: int, k: int, drafter: str = "mtp",
               boundary: str = "mhc_fused_post_pre") -> list[tuple[str, int, int]]:
    """(op, T, calls) of one speculative step (see the module docstring): ``drafter`` "mtp"
    with ``k`` drafts or "dspark" with block size ``k``; ``boundary`` is the function the
    target's layers call (0.34.0: :data:`REUSE`)."""
    T = bs * (k + 1)
    calls = [(boundary, T, 2 * layers - 1), ("mhc_post", T, 1), ("hc_head", T, 1)]
    if drafter == "dspark":
        rows = bs * k
        return calls + [("mhc_pre", rows, 1), ("mhc_fused_post_pre", rows, 2 * DSPARK_STAGES - 1),
                        ("mhc_post", rows, 1), ("hc_head", rows, 1)]
    calls += [("mhc_pre", T, 1), ("mhc_fused_post_pre", T, 1), ("mhc_post", T, 1),
              ("hc_head", bs, 1)]
    for _ in range(k - 1):
        calls += [("mhc_pre", bs, 1), ("mhc_fused_post_pre", bs, 1), ("mhc_post", bs, 1),
                  ("hc_head", bs, 1)]
    return calls


def step_plans(layers: int, batches, drafts, dspark_block: int,
               boundary: str) -> list[tuple[str, int, int, list]]:
    """(drafter, bs, k, calls) of every per-step sum asked for."""
    plans = [("mtp", bs, k, step_calls(layers, bs, k, "mtp", boundary))
             for k in drafts for bs in batches]
    if dspark_block:
        plans += [("dspark", bs, dspark_block,
                   step_calls(layers, bs, dspark_block, "dspark", boundary)) for bs in batches]
    return plans


def needed_tokens(args: argparse.Namespace, boundary: str) -> dict[str, set[int]]:
    """Per op, the token counts the per-step sums of ``args`` call it at."""
    need: dict[str, set[int]] = {}
    layers = max(preset(name).num_hidden_layers for name in MODELS.values())
    for _, _, _, calls in step_plans(layers, args.batch, args.drafts, args.dspark_block,
                                     boundary):
        for op, T, _ in calls:
            need.setdefault(op, set()).add(T)
    return need


def step_rows(rows: list[dict], batches, drafts, dspark_block: int, boundary: str) -> list[dict]:
    by = {(r["op"], r["H"], r["T"]): r for r in rows}
    out = []
    for model, name in MODELS.items():
        cfg = preset(name)
        H, layers = cfg.hidden_size, cfg.num_hidden_layers
        for drafter, bs, k, calls in step_plans(layers, batches, drafts, dspark_block,
                                                boundary):
            if any((op, H, T) not in by for op, T, _ in calls):
                continue
            vllm = sum(n * by[(op, H, T)]["vllm_graph_us"] for op, T, n in calls)
            plugin = sum(n * by[(op, H, T)]["hook_graph_us" if by[(op, H, T)]["served"]
                                            == "ours" else "vllm_graph_us"]
                         for op, T, n in calls)
            out.append({"model": model, "boundary": boundary, "drafter": drafter, "bs": bs,
                        "k": k,
                        "verify_T": bs * (k + 1), "vllm_step_us": vllm,
                        "plugin_step_us": plugin, "saved_us": vllm - plugin})
    return out


def main(args: argparse.Namespace) -> int:
    dg = deepgemm.resolve(args.deepgemm, "vllm")
    peer = vllm_mhc_peer(dg)
    if peer is None:
        return 1
    # 0.34.0's target calls the reuse_residual boundary, 0.33.0's the plain one; with 0.34.0's
    # source both are measured (the same kernels), so the sums are given for both call patterns
    boundaries = (OPS[-1],) + ((REUSE,) if peer.mhc_fused_post_pre_reuse_residual else ())
    ops = OPS + boundaries[1:]
    need: dict[str, set[int]] = {}
    for boundary in boundaries:
        for op, counts in needed_tokens(args, boundary).items():
            need.setdefault(op, set()).update(counts)
    rows, failures = [], []
    for H in args.hidden:
        for op in ops:
            if args.quick or args.tokens:
                tokens = list(QUICK_TOKENS) if args.quick else args.tokens
            else:
                tokens = sorted(need.get(op, ()))
            for T in tokens:
                try:
                    rows.append(measure(peer, op, H, T, seed=T + H))
                except RuntimeError as e:
                    failures.append(str(e))
                    print(f"FAILED {e}")
                    continue
                common.print_table(rows[-1:], COLUMNS)
    steps = [r for boundary in boundaries[::-1]
             for r in step_rows(rows, args.batch, args.drafts, args.dspark_block, boundary)]
    common.print_table(rows, COLUMNS)
    if steps:
        common.print_table(steps, STEP_COLUMNS)
    payload = {"environment": {**common.environment(), "vllm": peer.version},
               "deep_gemm": deepgemm.describe(dg), "failures": failures, "steps": steps}
    notes = (f"vLLM's TileLang functions by path (DeepGEMM: {deepgemm.describe(dg)}; path = "
             "the pre-norm GEMM vLLM's function ran) vs the plugin's hook with dsv4spec's op "
             "forced; graph = device us per call in a CUDA graph, eager = host us per "
             "back-to-back call; served = what the shipped tables choose.")
    if steps:
        notes += "\n\n" + common.markdown_table(steps, STEP_COLUMNS)
    for path in common.write_results(args.out, "vllm_plugin", payload, rows, COLUMNS, notes):
        print(f"wrote {path}")
    return 1 if failures else 0
