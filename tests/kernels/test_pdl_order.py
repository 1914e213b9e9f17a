"""Programmatic dependent launch order around the mHC ops, on the GPU.

An engine kernel launched as a programmatic dependent launch (PDL) right after one of our mHC
ops may start before that op has finished. The harness: a slow producer writes the op's input
(the sublayer output ``f``, or ``x`` for ``mhc_pre``) after ~1 ms of arithmetic and lets its
dependents start at once, as a PDL-aware engine kernel may; the op follows; then a PDL reader
copies the producer's output before its own wait and the producer's and the op's outputs after
it. Every copy must hold the final values: the op does not let anything after it start before
everything before it has finished, early release of its finalize or not. The control puts a
kernel that releases without waiting where the op was, and the reader's early copy then holds the
poison, so the harness does see a launch that lets a dependent start too soon.
"""

import math

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from dsv4spec.kernels import mhc as mhc_kernels
from dsv4spec.kernels.mhc import mhc_post_pre_triton, mhc_pre_triton
from tests.ops.test_mhc import EPS, make_inputs

pytestmark = pytest.mark.gpu

SPINS = 200_000  # dependent FMAs before the producer writes: ~1 ms on an H200
BLOCK = 1024
H = 7168


@triton.jit
def _slow_producer_kernel(src_ptr, dst_ptr, n, spins, BLOCK: tl.constexpr):
    # lets dependents start now, then writes src into dst only after a chain of FMAs
    gdc_launch_dependents()
    acc = tl.program_id(0).to(tl.float32) * 0.0
    for _ in range(spins):
        acc = acc * 0.999 + 1.0
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask & (acc >= 0.0))


@triton.jit
def _release_only_kernel(ptr):
    # the control: a dependent launch that lets its own dependents start and never waits
    gdc_launch_dependents()


@triton.jit
def _pdl_reader_kernel(produced_ptr, new_ptr, out_ptr, early_ptr, late_ptr, new_late_ptr,
                       out_late_ptr, n_produced, n_new, n_out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mp = offs < n_produced
    # before the wait: past the L1, so a value read is what the GPU holds now
    early = tl.load(produced_ptr + offs, mask=mp, cache_modifier=".cg")
    tl.store(early_ptr + offs, early, mask=mp)
    gdc_wait()
    tl.store(late_ptr + offs, tl.load(produced_ptr + offs, mask=mp), mask=mp)
    mn = offs < n_new
    tl.store(new_late_ptr + offs, tl.load(new_ptr + offs, mask=mn), mask=mn)
    mo = offs < n_out
    tl.store(out_late_ptr + offs, tl.load(out_ptr + offs, mask=mo), mask=mo)


class _Case:
    """One op between the slow producer and the PDL reader, its buffers allocated once."""

    def __init__(self, op: str, T: int, early_release: bool):
        x, fn, sc, base, nw, f = make_inputs(T, H, torch.bfloat16, "cuda", seed=T)
        self.op, self.early_release = op, early_release
        self.params = (fn, sc, base, EPS["rms_eps"], EPS["hc_eps"], 20, 2.0, nw, 1e-6)
        if op == "boundary":
            post, comb, _ = mhc_pre_triton(x, *self.params)
            self.residual, self.post, self.comb = x, post, comb
            self.source = f  # the sublayer output the producer writes
            self.outs = (torch.empty_like(x), torch.empty_like(post), torch.empty_like(comb),
                         torch.empty_like(f))
        else:
            self.source = x  # the residual the producer writes
            post, comb, out = mhc_pre_triton(x, *self.params)
            self.outs = (torch.empty_like(post), torch.empty_like(comb), torch.empty_like(out))
        self.produced = torch.empty_like(self.source)
        self.new, self.out = (self.outs[0], self.outs[3]) if op == "boundary" else \
            (self.outs[0], self.outs[2])
        self.copies = [torch.empty_like(self.produced), torch.empty_like(self.produced),
                       torch.empty_like(self.new), torch.empty_like(self.out)]
        self.grid = (triton.cdiv(max(self.produced.numel(), self.new.numel(),
                                     self.out.numel()), BLOCK),)

    def run_op(self) -> None:
        if self.op == "boundary":
            mhc_post_pre_triton(self.produced, self.residual, self.post, self.comb, *self.params,
                                out=self.outs, early_release=self.early_release)
        else:
            mhc_pre_triton(self.produced, *self.params, out=self.outs,
                           early_release=self.early_release)

    def sequence(self, control: bool) -> None:
        for t in (self.produced, *self.outs, *self.copies):
            t.fill_(math.nan)
        n = self.source.numel()
        _slow_producer_kernel[(triton.cdiv(n, BLOCK),)](self.source, self.produced, n, SPINS,
                                                         BLOCK=BLOCK)
        if control:
            _release_only_kernel[(1,)](self.produced, launch_pdl=True)
        else:
            self.run_op()
        _pdl_reader_kernel[self.grid](self.produced, self.new, self.out, *self.copies, n,
                                      self.new.numel(), self.out.numel(), BLOCK=BLOCK,
                                      launch_pdl=True)

    def replay(self, mode: str, control: bool = False) -> None:
        self.sequence(control)  # compiles everything outside a capture
        torch.cuda.synchronize()
        if mode == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.sequence(control)
            graph.replay()
        else:
            self.sequence(control)
        torch.cuda.synchronize()


@pytest.fixture(scope="module", autouse=True)
def _needs_pdl():
    if not mhc_kernels.supports_pdl(torch.cuda.current_device()):
        pytest.skip("programmatic dependent launch needs an sm_90+ NVIDIA GPU")


def _expected(case: _Case):
    # the op's outputs with the producer's output in place from the start, no race possible
    case.produced.copy_(case.source)
    case.run_op()
    torch.cuda.synchronize()
    return [t.clone() for t in case.outs]


# 1-8 tokens: launch 1 is itself a dependent launch that waits before it releases;
# 12 and 16: launch 1 is an ordinary launch that releases at once
@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("early_release", [True, False], ids=["early release", "after wait"])
@pytest.mark.parametrize("op,T", [("boundary", 1), ("boundary", 4), ("boundary", 8),
                                  ("boundary", 12), ("boundary", 16), ("pre", 1), ("pre", 16)])
def test_dependent_of_an_mhc_op_sees_everything_before_it(op, T, early_release, mode):
    case = _Case(op, T, early_release)
    cfg = mhc_kernels._plan(T, H, torch.cuda.current_device(), dtype=torch.bfloat16,
                            boundary=op == "boundary", early_release=early_release)
    assert cfg.pdl and cfg.wait == (T <= mhc_kernels.WAIT_MAX_TOKENS)
    assert cfg.early_release == early_release
    expected = _expected(case)
    case.replay(mode)
    early, late, new_late, out_late = case.copies
    assert torch.equal(early, case.source), "read before its wait: the producer not finished"
    assert torch.equal(late, case.source)
    for got, want in zip(case.outs, expected):
        assert torch.equal(got, want)
    assert torch.equal(new_late, case.new) and torch.equal(out_late, case.out)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_harness_sees_a_dependent_that_starts_too_soon(mode):
    case = _Case("boundary", 4, True)
    case.replay(mode, control=True)
    early = case.copies[0]
    assert torch.isnan(early.float()).any(), (
        "the reader started after the producer had finished even behind a kernel that never "
        "waits: this harness cannot see an ordering bug on this device")
