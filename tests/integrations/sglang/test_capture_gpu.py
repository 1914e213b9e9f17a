"""The three hooks as SGLang's CUDA-graph runner uses them, on the GPU.

The runner warms each batch bucket up twice eagerly, then captures one graph per bucket, largest
first, all buckets sharing one memory pool, and replays them in whatever order the traffic asks.
Here the hooks are installed on stand-ins whose methods are SGLang's own source (and SGLang's own
kernels), a step of (target hc_head, C128 rollback, draft hc_head) is captured per bucket, and
random replays are compared with SGLang's originals run eagerly on the same inputs. Nothing may
compile after the warm-up: every hc_head variant for T = 1..4096 is compiled at first sight.
"""

import random

import pytest
import torch

from dsv4spec.integrations.sglang import hc_head as hooks
from dsv4spec.kernels import hc_head_precompile as hc_head_kernels

from .conftest import DRAFT, ROLLBACK, TARGET
from .test_hc_head import EPS, HC_EPS, NORM_EPS, assert_matches, make_inputs
from .test_rollback import PRO, W, assert_bits_equal, buffers, expected, kv_pool, pro_batch

pytestmark = pytest.mark.gpu
BUCKETS = (64, 48, 32, 24, 16, 12, 8, 4, 2, 1)  # largest first, as SGLang captures
H = 7168


def test_gpu_nothing_compiles_after_the_first_call(sgl):
    sgl.install()
    target = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    draft = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    big = make_inputs(4096, H, torch.bfloat16)
    target.hc_head(big[0][:1], *big[1:])  # first sight: compiles every variant
    index = torch.cuda.current_device()
    compiled = hc_head_kernels.compiled_variants(index)
    assert compiled > 0
    for T in range(1, 4097):
        x = big[0][:T]
        target.hc_head(x, *big[1:])
        draft.hc_head(x, *big[1:])
    torch.cuda.synchronize()
    assert hc_head_kernels.compiled_variants(index) == compiled, "compiled while serving"
    assert sgl.originals[TARGET].calls == 0 and sgl.originals[DRAFT].calls == 0


def test_gpu_hooks_under_sglang_capture_pattern(sgl):
    sgl.install()
    target = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    draft = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    pool = kv_pool(sgl, torch.float32, **PRO)
    weights = [torch.nn.Parameter(w, requires_grad=False)
               for w in make_inputs(1, H, torch.bfloat16)[1:]]
    # static inputs per bucket: T = bs * W tokens for verify, bs for the draft's hc_head
    static = {}
    for bs in BUCKETS:
        x = make_inputs(bs * W, H, torch.bfloat16, seed=bs)[0]
        static[bs] = (x, x[:bs].clone(), *pro_batch(bs, W, bs))
    pool_handle = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    graphs, outputs = {}, {}

    def step(bs):
        x, x_draft, idx, seq, acc = static[bs]
        y = target.hc_head(x, *weights)
        pool.clear_unaccepted_c128_draft_states(idx, seq, acc, W)
        return y, draft.hc_head(x_draft, *weights)

    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for bs in BUCKETS:
            for _ in range(2):  # SGLang's two warm-up passes per bucket
                step(bs)
            torch.cuda.synchronize()
            graphs[bs] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[bs], pool=pool_handle, stream=stream):
                outputs[bs] = step(bs)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert sgl.originals[TARGET].calls == 0 and sgl.originals[DRAFT].calls == 0
    assert sgl.originals[ROLLBACK].calls == 0
    rng = random.Random(0)
    for replay in range(3 * len(BUCKETS)):
        bs = rng.choice(BUCKETS)
        x, x_draft, idx, seq, acc = static[bs]
        x.copy_(make_inputs(bs * W, H, torch.bfloat16, seed=1000 + replay)[0])
        x_draft.copy_(x[:bs])
        for s, new in zip((idx, seq, acc), pro_batch(bs, W, 1000 + replay)):
            s.copy_(new)
        for state in buffers(pool):
            state.copy_(torch.randn_like(state))
        torch.cuda.synchronize()
        want_rows = expected(pool, idx, seq, acc, W, _sglang_loop(sgl))
        want_target = sgl.originals[TARGET].__wrapped__(target, x, *weights)
        want_draft = sgl.originals[DRAFT].__wrapped__(draft, x_draft, *weights)
        graphs[bs].replay()
        torch.cuda.synchronize()
        y, y_draft = outputs[bs]
        assert_matches(y, want_target, f"replay {replay} bs {bs}: target vs SGLang")
        assert_matches(y_draft, want_draft, f"replay {replay} bs {bs}: draft vs SGLang")
        assert_bits_equal(buffers(pool), want_rows, f"replay {replay} bs {bs}: rollback")
    assert all(h.enabled for h in (_hook(sgl, t) for t in (TARGET, DRAFT, ROLLBACK)))


def _sglang_loop(sgl):
    from . import standins

    return standins.sglang_cleanup_kernel()


def _hook(sgl, target):
    return sgl.registry._hooks[target][0][1]


def test_gpu_parameter_weights_give_the_plain_tensor_result(sgl):
    x, *weights = make_inputs(64, H, torch.bfloat16)
    params = [torch.nn.Parameter(w, requires_grad=False) for w in weights]
    plain = hooks.hc_head(x, *weights, **EPS)
    assert torch.equal(hooks.hc_head(x, *params, **EPS), plain)


def test_gpu_rollback_compiles_nothing_after_its_first_call(sgl):
    from dsv4spec.kernels import c128_cleanup

    sgl.install()
    pool = kv_pool(sgl, torch.float32, **PRO)
    kernel = c128_cleanup._FUSED.kernel
    index = torch.cuda.current_device()
    pool.clear_unaccepted_c128_draft_states(*pro_batch(1, W, 0), W)
    compiled = len(kernel.device_caches[index][0])
    for bs in (2, 7, 8, 9, 16, 33, 48, 64):
        idx, seq, acc = pro_batch(bs, W, bs)
        pool.clear_unaccepted_c128_draft_states(idx, seq, acc, W)
    torch.cuda.synchronize()
    assert len(kernel.device_caches[index][0]) == compiled, "compiled while serving"
    assert sgl.originals[ROLLBACK].calls == 0
