"""The one-launch, whole-rows hc_head kernel (large T) against the reference.

Interpreter on CPU: small widths with the tiles shrunk so every loop runs several times, masked
tails in tokens, columns and persistent blocks. GPU: the real widths at large T.
"""

import importlib

import pytest
import torch

from dsv4spec.kernels import hc_head_rows
from dsv4spec.kernels.hc_head_rows import hc_head_rows_triton
from dsv4spec.ops import hc_head, hc_head_reference, hc_head_rmsnorm, hc_head_rmsnorm_reference
from tests.ops.test_hc_head import EPS_SETS, assert_close, make_inputs

DSV4_EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}
SHAPES = [
    pytest.param(10, 100, 2, id="T=10 H=100: 3 blocks on 2 programs, the 4th masked"),
    pytest.param(1, 40, 4, id="T=1 H=40: one block, 3 idle programs"),
    pytest.param(9, 64, 1, id="T=9 H=64: one program loops over 3 blocks"),
]


@pytest.mark.parametrize("eps", EPS_SETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("T,H,programs", SHAPES)
def test_rows_kernel_matches_reference(T, H, programs, dtype, eps):
    x, fn, sc, base, nw = make_inputs(T, H, dtype, seed=T)
    tiles = {"block_t": 4, "block_k": 32, "block_h": 16, "programs": programs}
    y = hc_head_rows_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"], **tiles)
    assert_close(y, hc_head_reference(x, fn, sc, base, **eps), dtype)
    z = hc_head_rows_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"], nw, **tiles)
    assert_close(z, hc_head_rmsnorm_reference(x, fn, sc, base, nw, **eps), dtype, ulps=2)


def test_ops_use_the_rows_kernel_from_its_threshold(monkeypatch):
    calls = []
    real = hc_head_rows.hc_head_rows_triton
    ops_hc_head = importlib.import_module("dsv4spec.ops.hc_head")
    monkeypatch.setattr(ops_hc_head, "hc_head_rows_triton",
                        lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    monkeypatch.setattr(hc_head_rows, "ROWS_MIN_TOKENS", 5)
    for T in (4, 5, 9):
        x, fn, sc, base, nw = make_inputs(T, 40, torch.bfloat16, seed=T)
        assert_close(hc_head(x, fn, sc, base, **DSV4_EPS, impl="triton"),
                     hc_head_reference(x, fn, sc, base, **DSV4_EPS), torch.bfloat16)
        assert_close(hc_head_rmsnorm(x, fn, sc, base, nw, **DSV4_EPS),
                     hc_head_rmsnorm_reference(x, fn, sc, base, nw, **DSV4_EPS),
                     torch.bfloat16, ulps=2)
    assert calls == [5, 5, 9, 9]


@pytest.mark.gpu
@pytest.mark.parametrize("H", [4096, 7168])
def test_gpu_rows_kernel_matches_reference(H):
    for T in (1, 64, 256, 1000, 1024, 4096):
        x, fn, sc, base, nw = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
        for eps in ({"norm_eps": 1e-6, "hc_eps": 1e-6}, {"norm_eps": 0.25, "hc_eps": 1.0}):
            y = hc_head_rows_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"])
            assert_close(y, hc_head_reference(x, fn, sc, base, **eps), torch.bfloat16)
            z = hc_head_rows_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"], nw)
            assert_close(z, hc_head_rmsnorm_reference(x, fn, sc, base, nw, **eps),
                         torch.bfloat16, ulps=2)
