"""Host time of the mHC pre and hc_head input checks per call on the CPU, with the same weight
tensors every call and with the norm weight passed as ``param.data`` (a new tensor object each
call, as SGLang's and vLLM's DeepSeek-V4 pass it). Prints one JSON object."""
import json
import sys
import time

import torch

import dsv4spec
import importlib
hc_head_op = importlib.import_module("dsv4spec.ops.hc_head")
mhc_op = importlib.import_module("dsv4spec.ops.mhc")

T, HC, H = 4, 4, 7168
N = (2 + HC) * HC
residual = torch.randn(T, HC, H, dtype=torch.bfloat16)
fn = torch.nn.Parameter(torch.randn(N, HC * H))
scale, base = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(N))
norm = torch.nn.Parameter(torch.randn(H))
x = torch.randn(T, HC, H, dtype=torch.bfloat16)
head_fn = torch.nn.Parameter(torch.randn(HC, HC * H))
head_scale, head_base = torch.nn.Parameter(torch.randn(1)), torch.nn.Parameter(torch.randn(HC))


def mhc_pre(weight):
    mhc_op._pre_inputs_ok(residual, fn, scale, base, 1e-6, 1e-6, 20, 2.0, weight(), 1e-6,
                          "triton")


def hc_head(weight):
    assert hc_head_op.inputs_look_valid(x, head_fn, head_scale, head_base, weight(), 1e-6, 1e-6,
                                        "triton")


def best_us(call, weight, calls=10_000, repeats=5) -> float:
    call(weight)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            call(weight)
        best = min(best, (time.process_time() - start) / calls * 1e6)
    return round(best, 2)


same = lambda: norm  # noqa: E731
engines = lambda: norm.data  # noqa: E731
out = {"source": dsv4spec.__file__, "torch": torch.__version__, "T": T, "H": H,
       "us_per_call": {op.__name__: {"same tensors": best_us(op, same),
                                     "norm_weight.data each call": best_us(op, engines)}
                       for op in (mhc_pre, hc_head)}}
json.dump(out, sys.stdout)
print()
