"""The hooks against vLLM 0.33.0's own TileLang kernels, under the capture pattern of vLLM's
CUDA graphs, on the GPU (needs TileLang and vLLM's source; ``DSV4SPEC_VLLM_SRC`` may point at an
unpacked copy).

vLLM warms every size up eagerly before it captures it (its JIT warm-up and dummy runs), then
stream-captures the forward once per batch size into one shared memory pool, largest first, and
replays whichever size the traffic asks for. Here a step calls each of the four hooked names as
the model modules do, at DSV4-Pro's width with DSV4's epsilons; each replay's outputs are compared
with vLLM's TileLang kernels run eagerly on the same inputs, against a float64 reference: ours
may be off by no more than twice vLLM's own error (plus one bf16 rounding, or tf32's for the
float32 mixes). Nothing of ours may
compile after the warm-up.
"""

import random

import pytest
import torch

from dsv4spec.integrations.vllm import plugin, register
from dsv4spec.kernels import hc_head_precompile, launch
from dsv4spec.kernels import mhc as mhc_kernels
from dsv4spec.ops import (
    hc_head_reference,
    mhc_post_pre_reference,
    mhc_post_reference,
    mhc_pre_reference,
)

from .conftest import NAMES

pytestmark = pytest.mark.gpu
BUCKETS = (64, 48, 32, 24, 16, 8, 4, 2, 1)  # largest first, as vLLM captures
H, EPS, ITERS = 7168, 1e-6, 20
OPS = ("mhc_pre", "mhc_fused_post_pre", "mhc_post", "hc_head")


def inputs(T, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = {
        "residual": torch.randn(T, 4, H, generator=g, device="cuda").bfloat16(),
        "x": torch.randn(T, H, generator=g, device="cuda").bfloat16(),
        "post": torch.rand(T, 4, 1, generator=g, device="cuda") * 2,
        "comb": torch.rand(T, 4, 4, generator=g, device="cuda"),
    }
    t["comb"] /= t["comb"].sum(-1, keepdim=True)
    return t


def weights(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = 24
    return {
        "fn": torch.randn(n, 4 * H, generator=g, device="cuda") * (4 * H) ** -0.5,
        "hc_scale": torch.rand(3, generator=g, device="cuda") + 0.5,
        "hc_base": torch.randn(n, generator=g, device="cuda") * 0.5,
        "norm_weight": (1 + 0.25 * torch.randn(H, generator=g, device="cuda")).bfloat16(),
        "head_fn": torch.randn(4, 4 * H, generator=g, device="cuda") * (4 * H) ** -0.5,
        "head_scale": torch.rand(1, generator=g, device="cuda") + 0.5,
        "head_base": torch.randn(4, generator=g, device="cuda") * 0.5,
    }


def call(fns, op, t, w):
    """``op`` as DeepSeek-V4's modules call it (model.py 746 / 760, mtp.py 204 / 286)."""
    pre = (w["fn"], w["hc_scale"], w["hc_base"], EPS, EPS, EPS, 2.0, ITERS)
    norm = {"norm_weight": w["norm_weight"], "norm_eps": EPS}
    if op == "mhc_pre":
        return fns[op](t["residual"], *pre, **norm)
    if op == "mhc_fused_post_pre":
        return fns[op](t["x"], t["residual"], t["post"], t["comb"], *pre, n_splits=1, tile_n=1,
                       **norm)
    if op == "mhc_post":
        return fns[op](t["x"], t["residual"], t["post"], t["comb"])
    return fns[op](t["residual"], w["head_fn"], w["head_scale"], w["head_base"], EPS, EPS)


def reference(op, t, w):
    kw = dict(rms_eps=EPS, hc_eps=EPS, sinkhorn_iters=ITERS, post_mult=2.0,
              norm_weight=w["norm_weight"], norm_eps=EPS)
    pre = (w["fn"], w["hc_scale"], w["hc_base"])
    if op == "mhc_pre":
        post, comb, y = mhc_pre_reference(t["residual"], *pre, **kw)
        return post.unsqueeze(-1), comb, y
    if op == "mhc_fused_post_pre":
        new, post, comb, y = mhc_post_pre_reference(t["x"], t["residual"], t["post"][..., 0],
                                                    t["comb"], *pre, **kw)
        return new, post.unsqueeze(-1), comb, y
    if op == "mhc_post":
        return (mhc_post_reference(t["x"], t["residual"], t["post"][..., 0], t["comb"]),)
    return (hc_head_reference(t["residual"].double(), w["head_fn"].double(),
                              w["head_scale"].double(), w["head_base"].double(),
                              norm_eps=EPS, hc_eps=EPS),)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def assert_within_vllms_error(got, want, ref, what):
    for i, (g, v, r) in enumerate(zip(as_tuple(got), as_tuple(want), as_tuple(ref))):
        assert g.dtype == v.dtype and g.shape == v.shape and g.stride() == v.stride(), what
        r = r.double()
        # one bf16 rounding at the top of the range; for the float32 mixes, tf32's unit
        # roundoff (vLLM's production pre-norm GEMM is DeepGEMM's tf32 one)
        unit = 2.0 ** -7 if g.dtype == torch.bfloat16 else 2.0 ** -11
        floor = unit * r.abs().max().item()
        ours = (g.double() - r).abs().max().item()
        theirs = (v.double() - r).abs().max().item()
        assert ours <= 2 * theirs + floor, f"{what} output {i}: ours {ours:.3g}, vLLM {theirs:.3g}"


def counting(fn, counts, name):
    import functools

    @functools.wraps(fn)
    def counted(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return fn(*args, **kwargs)

    return counted


def compiled_variants(index):
    total = hc_head_precompile.compiled_variants(index)
    for value in vars(mhc_kernels).values():
        if isinstance(value, launch.LaunchCache):
            caches = getattr(value.kernel, "device_caches", {})
            if index in caches:
                total += len(caches[index][0])
    return total


def hooked_names(vllm_tilelang, counts):
    """vLLM's functions, counted, bound in the model modules as vLLM binds them, then hooked."""
    for module in vllm_tilelang.models.values():
        for op in OPS:
            if hasattr(module, NAMES[op]):
                setattr(module, NAMES[op], counting(getattr(module, NAMES[op]), counts, op))
    patched = register()
    assert len(patched) == sum(len(plugin.BOUND_IN[op]) for op in OPS)
    # as the calls are made: pre and the boundary through model.py, post and hc_head the MTP's
    return {op: getattr(vllm_tilelang.model if op in ("mhc_pre", "mhc_fused_post_pre")
                        else vllm_tilelang.mtp, NAMES[op]) for op in OPS}


def test_gpu_vllms_tilelang_kernels_load_and_match_the_reference(vllm_tilelang):
    peer = vllm_tilelang.peer
    fns = {"mhc_pre": peer.mhc_pre, "mhc_fused_post_pre": peer.mhc_fused_post_pre,
           "mhc_post": peer.mhc_post, "hc_head": peer.hc_head}
    w = weights()
    for T in (1, 33):
        t = inputs(T, T)
        for op in OPS:
            got = call(fns, op, t, w)
            for g, r in zip(as_tuple(got), reference(op, t, w)):
                torch.testing.assert_close(g.double(), r.double(), rtol=2e-2, atol=2e-2)


def test_gpu_hooks_under_vllms_capture_pattern(vllm_tilelang):
    counts = {}
    fns = hooked_names(vllm_tilelang, counts)
    peer = vllm_tilelang.peer
    originals = {"mhc_pre": peer.mhc_pre, "mhc_fused_post_pre": peer.mhc_fused_post_pre,
                 "mhc_post": peer.mhc_post, "hc_head": peer.hc_head}
    w = weights()
    static = {T: inputs(T, T) for T in BUCKETS}

    def step(T):
        return {op: call(fns, op, static[T], w) for op in OPS}

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for T in BUCKETS:  # vLLM's eager warm-up of every size before any capture
            for _ in range(2):
                step(T)
    torch.cuda.synchronize()
    index = torch.cuda.current_device()
    compiled = compiled_variants(index)
    assert compiled > 0
    counts.clear()
    pool = torch.cuda.graph_pool_handle()
    graphs, outputs = {}, {}
    with torch.cuda.stream(stream):
        for T in BUCKETS:
            graphs[T] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[T], pool=pool, stream=stream):
                outputs[T] = step(T)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert counts == {}, f"vLLM's kernels were captured: {counts}"
    rng = random.Random(0)
    for replay in range(3 * len(BUCKETS)):
        T = rng.choice(BUCKETS)
        for name, value in inputs(T, 1000 + replay).items():
            static[T][name].copy_(value)
        torch.cuda.synchronize()
        want = {op: call(originals, op, static[T], w) for op in OPS}
        graphs[T].replay()
        torch.cuda.synchronize()
        for op in OPS:
            assert_within_vllms_error(outputs[T][op], want[op], reference(op, static[T], w),
                                      f"replay {replay} T {T} {op}")
    assert compiled_variants(index) == compiled, "compiled after the warm-up"
    assert all(guard.enabled for guard in plugin.installed().values())


def test_gpu_eager_hooks_serve_measured_sizes_and_keep_vllms_elsewhere(vllm_tilelang):
    counts = {}
    fns = hooked_names(vllm_tilelang, counts)
    w = weights()
    for T in (1, 64):
        for op in OPS:
            call(fns, op, inputs(T, T), w)
    assert counts == {}, "ours served every measured size eagerly"
    # past the shipped tables' eager spans (read from them: the spans grow as runs measure more)
    from dsv4spec.integrations.vllm.mhc import prefers_dsv4spec

    beyond = {op: next(T for T in (65, 257, 4097)
                       if not prefers_dsv4spec(op, T, H, False, torch.cuda.get_device_capability()))
              for op in ("mhc_fused_post_pre", "mhc_post")}
    for op, T in beyond.items():
        call(fns, op, inputs(T, T), w)
    assert counts == {op: 1 for op in beyond}, f"vLLM's kernels past the spans: {beyond}"
