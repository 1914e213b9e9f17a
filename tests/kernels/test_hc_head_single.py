"""hc_head in one launch (split-K partials, then the last program of each token block finalizes).

On CPU the kernel runs in the Triton interpreter (tests/conftest.py), which runs the programs of
a grid one after another: the counters, their reset and the finalize are exercised, the memory
ordering between concurrent programs is not (the `gpu` tests compare with the two-launch kernel
at H = 7168, eagerly, inside replayed CUDA graphs and on two streams at once).
"""

import pytest
import torch

from dsv4spec.kernels import hc_head_single as hs
from dsv4spec.kernels.hc_head import hc_head_triton
from dsv4spec.kernels.hc_head_single import (
    counter_buffers,
    hc_head_single_launch_triton,
    reset_counters,
)
from dsv4spec.ops.hc_head import hc_head_reference, hc_head_rmsnorm_reference
from tests.ops.test_hc_head import assert_close, make_inputs

EPS = {"norm_eps": 1e-6, "hc_eps": 1e-6}
# mean(x^2) ~ 1 and each weight ~ 1: norm_eps 0.25 moves r by ~10%, hc_eps 1.0 moves each weight
# by 1; (1.0, 0.25) moves the RMSNorm's rstd by ~20%. Dropping either epsilon fails.
LARGE_EPS = [
    pytest.param({"norm_eps": 0.25, "hc_eps": 1.0}, id="norm_eps=0.25 hc_eps=1"),
    pytest.param({"norm_eps": 1.0, "hc_eps": 0.25}, id="norm_eps=1 hc_eps=0.25"),
]
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float32, id="fp32")]
NORM = [pytest.param(False, id="hc_head"), pytest.param(True, id="hc_head+rmsnorm")]


@pytest.fixture(autouse=True)
def _zero_counters():
    # A test that fails mid-way (or a seeded bug) must not leave stale counters to the next one.
    reset_counters()
    yield
    reset_counters()


def assert_counters_zero():
    for buf in counter_buffers():
        nonzero = buf.nonzero().flatten().tolist()
        assert not nonzero, f"counters left non-zero at {nonzero[:8]}: {buf[nonzero[:8]].tolist()}"


def run(x, fn, sc, base, nw, eps, rmsnorm, **tiling):
    return hc_head_single_launch_triton(x, fn, sc, base, eps["norm_eps"], eps["hc_eps"],
                                        nw if rmsnorm else None, **tiling)


def reference64(x, fn, sc, base, nw, eps, rmsnorm):
    """The reference on float64 copies of every input (unrounded, float64 result)."""
    args = [t.double() for t in (x, fn, sc, base)]
    if rmsnorm:
        return hc_head_rmsnorm_reference(*args, nw.double(), **eps)
    return hc_head_reference(*args, **eps)


def check(out, x, fn, sc, base, nw, eps, rmsnorm):
    assert out.dtype == x.dtype and out.shape == (x.shape[0], x.shape[2])
    # Half types: 1 ulp of the output; with the norm 2 (the kernel normalises y rounded to x.dtype,
    # the float64 reference the unrounded y). fp32: relative error < 1e-5.
    assert_close(out, reference64(x, fn, sc, base, nw, eps, rmsnorm), x.dtype,
                 ulps=2 if rmsnorm else 1)


# ------------------------------------------------------------------- interpreter: correctness


@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8])
def test_matches_float64_reference(T, dtype, rmsnorm):
    x, fn, sc, base, nw = make_inputs(T, 256, dtype, seed=T)
    out = run(x, fn, sc, base, nw, EPS, rmsnorm)
    check(out, x, fn, sc, base, nw, EPS, rmsnorm)
    assert_counters_zero()


@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", LARGE_EPS)
def test_large_epsilons_are_applied(eps, dtype, rmsnorm):
    x, fn, sc, base, nw = make_inputs(3, 256, dtype, seed=3)
    check(run(x, fn, sc, base, nw, eps, rmsnorm), x, fn, sc, base, nw, eps, rmsnorm)


@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("T", [1, 5])
def test_h_not_a_multiple_of_the_blocks(T, rmsnorm):
    # H = 300: 5 chunks of 64 in 2 splits of 3 (the second ends past H), 3 H-blocks of 128 (the
    # last one masked); then the default tiling (64-wide chunks, one per split; 512-wide block).
    x, fn, sc, base, nw = make_inputs(T, 300, torch.float32, seed=T)
    for tiling in ({"block_k": 64, "num_splits": 2, "block_h": 128}, {}):
        out = run(x, fn, sc, base, nw, EPS, rmsnorm, **tiling)
        check(out, x, fn, sc, base, nw, EPS, rmsnorm)
        assert_counters_zero()


@pytest.mark.parametrize("rmsnorm", NORM)
def test_tiling_overrides(rmsnorm):
    # 8 chunks of 32 in 3 splits of 3 (the last chunk past H), 4 H-blocks of 64, 2 warps.
    x, fn, sc, base, nw = make_inputs(6, 256, torch.bfloat16, seed=6)
    out = run(x, fn, sc, base, nw, EPS, rmsnorm, block_k=32, num_splits=3, block_h=64,
              num_warps=2, num_stages=1)
    check(out, x, fn, sc, base, nw, EPS, rmsnorm)
    assert_counters_zero()


@pytest.mark.parametrize("rmsnorm", NORM)
def test_several_token_blocks_use_one_counter_each(rmsnorm):
    # T = 11: two 8-token blocks (the second 3 rows), each with its own counter and finalizer.
    x, fn, sc, base, nw = make_inputs(11, 64, torch.float32, seed=11)
    out = run(x, fn, sc, base, nw, EPS, rmsnorm, num_splits=2)
    check(out, x, fn, sc, base, nw, EPS, rmsnorm)
    assert_counters_zero()


# ------------------------------------------------------ interpreter: counters, output, launch


@pytest.mark.parametrize("rmsnorm", NORM)
def test_counters_back_to_zero_and_second_call_identical(rmsnorm):
    x, fn, sc, base, nw = make_inputs(4, 256, torch.bfloat16, seed=4)
    first = run(x, fn, sc, base, nw, EPS, rmsnorm)
    assert_counters_zero()
    second = run(x, fn, sc, base, nw, EPS, rmsnorm)
    assert_counters_zero()
    assert torch.equal(first, second)
    check(second, x, fn, sc, base, nw, EPS, rmsnorm)


@pytest.mark.parametrize("rmsnorm", NORM)
def test_reused_workspace_is_fully_rewritten(rmsnorm):
    # Eager calls reuse the partials workspace per (stream, shape): poisoned between two calls
    # with different inputs, every slot the finalize reads must come from the second call.
    x, fn, sc, base, nw = make_inputs(5, 256, torch.float32, seed=5)
    run(x, fn, sc, base, nw, EPS, rmsnorm)
    assert hs._WORKSPACES, "the workspace was not cached"
    for ws in hs._WORKSPACES.values():
        ws.fill_(float("nan"))
    x2, fn2, sc2, base2, nw2 = make_inputs(5, 256, torch.float32, seed=55)
    out = run(x2, fn2, sc2, base2, nw2, EPS, rmsnorm)
    check(out, x2, fn2, sc2, base2, nw2, EPS, rmsnorm)


@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 5])
def test_poisoned_output_fully_overwritten(T, dtype, rmsnorm):
    x, fn, sc, base, nw = make_inputs(T, 300, dtype, seed=T)
    out = torch.full((T, 300), float("nan"), dtype=dtype)
    result = hc_head_single_launch_triton(x, fn, sc, base, 1e-6, 1e-6, nw if rmsnorm else None,
                                          out=out, block_h=128)
    assert result is out
    assert not out.isnan().any(), f"{int(out.isnan().sum())} NaN left"
    check(out, x, fn, sc, base, nw, EPS, rmsnorm)


def test_one_launch_per_call(monkeypatch):
    grids = []

    class Spy:
        def __init__(self, kernel):
            self.kernel, self.arg_names = kernel, kernel.arg_names

        def __getitem__(self, grid):
            grids.append(grid)
            return self.kernel[grid]

    monkeypatch.setattr(hs._SINGLE, "kernel", Spy(hs._SINGLE.kernel))
    x, fn, sc, base, nw = make_inputs(2, 256, torch.bfloat16)
    hc_head_single_launch_triton(x, fn, sc, base, 1e-6, 1e-6, nw)
    assert grids == [(4, 1, 1)]  # 256 / 64: one token block x 4 splits


def test_stale_counter_persists_until_reset_counters():
    """A counter left non-zero (as by an aborted kernel) makes a program finalize too early; the
    next calls stay wrong until reset_counters() zeroes it."""
    x, fn, sc, base, nw = make_inputs(2, 256, torch.float32, seed=2)
    counters = hs._counters(x, x.get_device(), 1)
    counters[0] = 1  # one split "already counted"
    run(x, fn, sc, base, nw, EPS, False)
    # split 2 of 4 finalized (and zeroed the counter), then split 3 counted itself
    assert counters[0].item() == 1
    reset_counters()
    assert_counters_zero()
    check(run(x, fn, sc, base, nw, EPS, False), x, fn, sc, base, nw, EPS, False)
    assert_counters_zero()


@pytest.mark.parametrize("kwargs,match", [
    pytest.param({"block_k": 48}, "block_k", id="block_k not a power of two"),
    pytest.param({"block_h": 100}, "block_h", id="block_h not a power of two"),
    pytest.param({"num_splits": 0}, "num_splits", id="num_splits 0"),
    pytest.param({"num_warps": 3}, "num_warps", id="num_warps 3"),
    pytest.param({"num_stages": 0}, "num_stages", id="num_stages 0"),
    pytest.param({"out": torch.empty(2, 255, dtype=torch.bfloat16)}, "out", id="out shape"),
    pytest.param({"out": torch.empty(2, 256)}, "out", id="out dtype"),
])
def test_bad_arguments_refused(kwargs, match):
    x, fn, sc, base, _ = make_inputs(2, 256, torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        hc_head_single_launch_triton(x, fn, sc, base, 1e-6, 1e-6, **kwargs)
    assert_counters_zero()


# ------------------------------------------------------------------------------- GPU (H200)

GPU_TOKENS = [1, 2, 4, 8]


def _two_launch(x, fn, sc, base, nw, rmsnorm):
    return hc_head_triton(x, fn, sc, base, 1e-6, 1e-6, nw if rmsnorm else None)


def _single(x, fn, sc, base, nw, rmsnorm):
    return hc_head_single_launch_triton(x, fn, sc, base, 1e-6, 1e-6, nw if rmsnorm else None)


def _assert_like_two_launch(out, expected, rmsnorm):
    # Both round fp32 values that differ by reduction order (block_k differs at T = 8): 1 ulp;
    # with the norm the rounded y's ulp is carried into the output: 2.
    assert_close(out, expected, torch.bfloat16, ulps=2 if rmsnorm else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("T", GPU_TOKENS)
def test_gpu_matches_two_launch(T, rmsnorm):
    for seed in range(3):
        x, fn, sc, base, nw = make_inputs(T, 7168, torch.bfloat16, "cuda", seed=100 * T + seed)
        out = _single(x, fn, sc, base, nw, rmsnorm)
        again = _single(x, fn, sc, base, nw, rmsnorm)  # the cached direct launch
        expected = _two_launch(x, fn, sc, base, nw, rmsnorm)
        torch.cuda.synchronize()
        _assert_like_two_launch(out, expected, rmsnorm)
        assert torch.equal(out, again)
        assert_close(out, reference64(x, fn, sc, base, nw, EPS, rmsnorm), torch.bfloat16,
                     ulps=2 if rmsnorm else 1)
    assert_counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("tiling", [
    pytest.param({"num_stages": 1}, id="finalize not pipelined"),
    pytest.param({"num_stages": 2, "block_h": 2048}, id="2 stages block_h 2048"),
    pytest.param({"block_k": 128, "num_warps": 8}, id="block_k 128 8 warps"),
    pytest.param({"num_splits": 7, "block_h": 512}, id="7 splits of 16 chunks"),
])
def test_gpu_tilings_match_two_launch(tiling, rmsnorm):
    for T in GPU_TOKENS:
        x, fn, sc, base, nw = make_inputs(T, 7168, torch.bfloat16, "cuda", seed=T)
        out = hc_head_single_launch_triton(x, fn, sc, base, 1e-6, 1e-6,
                                           nw if rmsnorm else None, **tiling)
        _assert_like_two_launch(out, _two_launch(x, fn, sc, base, nw, rmsnorm), rmsnorm)
    assert_counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("rmsnorm", NORM)
@pytest.mark.parametrize("T", GPU_TOKENS)
def test_gpu_cuda_graph_replay(T, rmsnorm):
    x, fn, sc, base, nw = make_inputs(T, 7168, torch.bfloat16, "cuda", seed=T)
    # Warm up (compile, take the side stream's counters) on a side stream, then capture on
    # torch.cuda.graph's own stream, which gets its slot without allocating.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            _single(x, fn, sc, base, nw, rmsnorm)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _single(x, fn, sc, base, nw, rmsnorm)
    for seed in (1, 2, 3):  # fresh data in the static input, replay, compare
        x.copy_(make_inputs(T, 7168, torch.bfloat16, "cuda", seed=1000 * seed + T)[0])
        graph.replay()
        torch.cuda.synchronize()
        _assert_like_two_launch(out, _two_launch(x, fn, sc, base, nw, rmsnorm), rmsnorm)
        assert_counters_zero()


@pytest.mark.gpu
def test_gpu_two_streams_at_once():
    """Back-to-back calls on two streams, no synchronisation between them: each stream has its
    own counters, so both give the two-launch result."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = [make_inputs(4, 7168, torch.bfloat16, "cuda", seed=i) for i in range(2)]
    torch.cuda.synchronize()  # the inputs were written on the default stream
    for s, args in zip(streams, inputs):  # warm up: compile and take each stream's counters
        with torch.cuda.stream(s):
            _single(*args, True)
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(50):
        for i, (s, args) in enumerate(zip(streams, inputs)):
            with torch.cuda.stream(s):
                outs[i].append(_single(*args, True))
    torch.cuda.synchronize()
    for i, args in enumerate(inputs):
        expected = _two_launch(*args, True)
        for out in outs[i]:
            _assert_like_two_launch(out, expected, True)
    assert_counters_zero()
