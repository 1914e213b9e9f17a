"""What the SGLang plugin costs a serving process: hc_head eager calls as SGLang makes them
(weights as ``nn.Parameter``, through the guarded hook) beside plain-tensor calls, and the
first-sight compilation of every hc_head kernel variant (T = 1..16384).

Eager numbers are host wall time per call of back-to-back calls with one synchronize at the end,
the callables interleaved repeat by repeat (``common.time_eager_side_by_side``): what an eager
caller pays. Variants: the op with plain tensors, the op with Parameters, the target hook (its
guard and step-aside checks included) with Parameters, and SGLang's ``fused_hc_head`` where its
source is found.

The hooks run dsv4spec's path only while SGLang serves DeepSeek-V4
(:mod:`dsv4spec.integrations.sglang.served_model`); the benchmark has no SGLang server, so its
hook calls run under a stand-in runtime context that reports DeepSeek-V4's ``model_type``
(:func:`serving_dsv4`), restored afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import types
from collections.abc import Iterator

import torch

from dsv4spec.bench import common
from dsv4spec.bench.hc_head import EPS, make_inputs
from dsv4spec.integrations.sglang import served_model
from dsv4spec.integrations.sglang.hc_head import make_target_hook
from dsv4spec.kernels import hc_head_precompile as hc_head_kernels
from dsv4spec.ops import hc_head

COLUMNS = ["what", "H", "T", "median_us", "p20_us", "p80_us"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 64],
                        help="token counts T of the eager calls")
    parser.add_argument("--hidden", type=int, nargs="+", default=[7168],
                        help="hidden sizes H of the eager calls")
    parser.add_argument("--compile-hidden", type=int, nargs="*", default=[7168, 4096],
                        help="hidden sizes whose first-sight compilation is timed (run first, "
                             "in a fresh process, so nothing is cached in memory)")


def _sglang_fused_hc_head():
    try:
        return common.sglang_peer("kernels/ops/layernorm/mhc_head.py").fused_hc_head
    except Exception as e:  # noqa: BLE001 - the peer is optional
        print(f"SGLang's fused_hc_head not loaded ({type(e).__name__}: {e})")
        return None


_MISSING = object()


@contextlib.contextmanager
def serving_dsv4() -> Iterator[None]:
    """SGLang's runtime context, as the served-model gate reads it, reports a DeepSeek-V4 server
    (``process_model_config().hf_config.model_type == "deepseek_v4"``) inside the block: on the
    loaded ``sglang.srt.runtime_context`` (a stand-in's) or on a new module where none is loaded,
    whose active context holds published arguments as a server's does (the gate reads them at
    every call). The gate's remembered verdicts are set aside on entry; the module, its
    ``process_model_config`` and the verdicts are restored on exit."""
    name = served_model.RUNTIME_CONTEXT_MODULE
    context = sys.modules.get(name)
    added = context is None
    if added:
        context = types.ModuleType(name)
        context._CONTEXT = types.SimpleNamespace(_server_args=types.SimpleNamespace())
        sys.modules[name] = context
    saved = getattr(context, "process_model_config", _MISSING)
    verdicts = served_model._verdicts
    config = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(model_type=served_model.DSV4_MODEL_TYPE))
    context.process_model_config = lambda: config
    served_model._verdicts = {}
    try:
        yield
    finally:
        served_model._verdicts = verdicts
        if saved is _MISSING:
            del context.process_model_config
        else:
            context.process_model_config = saved
        if added and sys.modules.get(name) is context:
            del sys.modules[name]


def main(args: argparse.Namespace) -> int:
    with serving_dsv4():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    env = common.environment()
    index = torch.cuda.current_device()
    rows = []
    for H in args.compile_hidden:
        start = time.perf_counter()
        count = hc_head_kernels.precompile(H, torch.bfloat16, index)
        seconds = time.perf_counter() - start
        tokens = len(hc_head_kernels.variant_tokens(H, index, False, torch.bfloat16))
        print(f"precompile H={H}: {count} variants ({tokens} token counts) in {seconds:.1f} s")
        rows.append({"what": "first-sight compile (variants)", "H": H, "T": "1..16384",
                     "median_us": seconds * 1e6, "p20_us": count, "p80_us": tokens})
    sglang = _sglang_fused_hc_head()
    hook = make_target_hook()
    model = types.SimpleNamespace(**EPS)

    def unused_original(*a, **k):
        raise AssertionError("the hook stepped aside")

    for H in args.hidden:
        for T in args.tokens:
            x, fn, scale, base, _ = make_inputs(T, H, torch.bfloat16, "cuda")
            params = [torch.nn.Parameter(t, requires_grad=False) for t in (fn, scale, base)]
            fns = {
                "op, plain tensors": lambda: hc_head(x, fn, scale, base, **EPS),
                "op, nn.Parameter": lambda: hc_head(x, *params, **EPS),
                "target hook, nn.Parameter": lambda: hook(unused_original, model, x, *params),
            }
            if sglang is not None:
                fns["SGLang fused_hc_head, nn.Parameter"] = lambda: sglang(x, *params, **EPS)
            for f in fns.values():
                f()
            torch.cuda.synchronize()
            timings = common.time_eager_side_by_side(fns)
            for what, t in timings.items():
                rows.append({"what": what, "H": H, "T": T,
                             **{k: t[k] for k in ("median_us", "p20_us", "p80_us")}})
                print(f"H={H} T={T} {what}: {t['median_us']:.1f} us")
    notes = ("Eager wall per call (host dispatch included), medians of interleaved repeats. "
             "First-sight compile rows: median_us = seconds x 1e6 of precompile(), p20_us = "
             "variants compiled, p80_us = distinct token counts they cover.")
    common.write_results(args.out, "plugin_eager", {"environment": env}, rows, COLUMNS, notes)
    return 0
