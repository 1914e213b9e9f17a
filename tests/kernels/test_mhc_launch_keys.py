"""The mHC launchers' cached-launch keys and two of the planner's bounds.

A cached (direct) launch passes only the pointers: everything else its first launch bound must be
in its key (``kernels/launch.py``). The launches are recorded instead of run, for calls that
differ in one bound value each, and every key must stand for one launch. The CPU interpreter
never launches directly, so this is where a key missing a field shows. Then: the partials wait
as a dependent launch only with one chunk per split, and the tail's fused bound is inclusive."""

import pytest
import torch

from dsv4spec.kernels import mhc as K
from dsv4spec.kernels.launch import LaunchCache
from tests.ops.test_mhc import make_inputs
from tests.ops.test_mhc_post_head import tail_inputs


@pytest.fixture
def recorded(monkeypatch):
    """(cache, key) -> the set of launches recorded under that key."""
    seen: dict = {}

    def launch(self, key, grid, args, constexprs, num_warps, num_stages=None, launch_pdl=False):
        bound = tuple(("ptr", a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        seen.setdefault((id(self), key), set()).add(
            (grid, bound, tuple(constexprs.items()), num_warps, num_stages, launch_pdl))

    monkeypatch.setattr(LaunchCache, "launch", launch)
    monkeypatch.setattr(LaunchCache, "get", lambda self, key: None)
    monkeypatch.setattr(K, "_DIRECT", {})
    return seen


BASE = {"rms_eps": 1e-6, "hc_eps": 1e-6, "sinkhorn_iters": 20, "post_mult": 2.0,
        "norm": True, "norm_eps": 1e-6}
CHANGES = [{}, {"rms_eps": 0.25}, {"hc_eps": 0.5}, {"sinkhorn_iters": 3}, {"post_mult": 1.5},
           {"norm_eps": 0.5}, {"norm": False}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pre_or_boundary_key_stands_for_one_launch(recorded, dtype):
    x, fn, sc, base, nw, f = make_inputs(3, 40, dtype)
    post, comb = torch.rand(3, 4), torch.rand(3, 4, 4)
    for change in CHANGES:
        a = {**BASE, **change}
        args = (a["rms_eps"], a["hc_eps"], a["sinkhorn_iters"], a["post_mult"],
                nw if a["norm"] else None, a["norm_eps"])
        K.mhc_pre_triton(x, fn, sc, base, *args)
        K.mhc_post_pre_triton(f, x, post, comb, fn, sc, base, *args)
    assert recorded and all(len(launches) == 1 for launches in recorded.values())
    # one key per call for each kernel: partials and finalize, pre and boundary
    assert len(recorded) == 2 * 2 * len(CHANGES)


def test_a_tail_key_stands_for_one_launch(recorded):
    f, x, post, comb, hc_fn, sc, base, nw = tail_inputs(3, 40, torch.float32)
    for norm_eps, hc_eps, final in ((1e-6, 1e-6, 1e-6), (0.25, 1e-6, 1e-6), (1e-6, 0.5, 1e-6),
                                    (1e-6, 1e-6, 0.5)):
        K.mhc_post_head_triton(f, x, post, comb, hc_fn, sc, base, norm_eps, hc_eps, nw, final)
    assert all(len(launches) == 1 for launches in recorded.values()) and len(recorded) == 8


def test_a_post_key_stands_for_one_launch(recorded):
    x, _, _, _, _, f = make_inputs(3, 600, torch.bfloat16)
    post, comb = torch.rand(3, 4), torch.rand(3, 4, 4)
    for tiling in ({}, {"block_h": 1024}, {"block_h": 256}, {"num_warps": 2}, {"pdl": True}):
        K.mhc_post_triton(f, x, post, comb, **tiling)
    assert all(len(launches) == 1 for launches in recorded.values()) and len(recorded) == 5


def test_the_partials_wait_only_with_one_chunk_per_split(monkeypatch):
    """A dependent partials launch loads its one chunk of fn before it waits: with a run of
    chunks per split it would multiply every chunk by the first one's fn."""
    monkeypatch.setattr(K, "supports_pdl", lambda device_index: True)
    default = K.tiling(4, 7168, 132, device_index=0)
    assert default.wait and default.prefetch_fn and default.chunks_per_split == 1
    runs = K.tiling(4, 7168, 132, device_index=0, num_splits=16)
    assert runs.chunks_per_split > 1 and runs.pdl
    assert not runs.wait and not runs.prefetch_fn


def test_the_tail_is_fused_up_to_its_bound_inclusive(monkeypatch):
    monkeypatch.setattr(K, "TAIL_FUSED_MAX_TOKENS", 3)  # small grids for the interpreter
    heads = []
    real = K.hc_head_triton
    monkeypatch.setattr(K, "hc_head_triton", lambda *a, **kw: heads.append(a[0].shape[0]) or
                        real(*a, **kw))
    for T in (3, 4):
        f, x, post, comb, hc_fn, sc, base, _ = tail_inputs(T, 40, torch.float32)
        K.mhc_post_head_triton(f, x, post, comb, hc_fn, sc, base, 1e-6, 1e-6)
    assert heads == [4]
