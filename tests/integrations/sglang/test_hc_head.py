"""The hc_head hooks, installed through SGLang's registry, on stand-in draft and target modules.

The stand-ins' originals are SGLang's own ``hc_head`` methods (the target's calls SGLang's
``fused_hc_head``, loaded by path, in Triton's interpreter). The epsilons are large and distinct
(0.25 and 1.0) so a swapped or dropped epsilon fails the comparison.
"""

import logging

import pytest
import torch

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import hc_head as hooks
from dsv4spec.ops import hc_head_reference

from . import standins
from .conftest import DRAFT, TARGET
from .standins import DEVICE

SM90 = (9, 0)  # the architecture the tables were measured on, and the interpreter's stand-in
NORM_EPS, HC_EPS = 0.25, 1.0
EPS = {"norm_eps": NORM_EPS, "hc_eps": HC_EPS}
WRONG_EPS = {  # what a hook reading the wrong attributes would compute
    "swapped": {"norm_eps": HC_EPS, "hc_eps": NORM_EPS},
    "dropped norm_eps": {"norm_eps": 1e-6, "hc_eps": HC_EPS},
    "dropped hc_eps": {"norm_eps": NORM_EPS, "hc_eps": 1e-6},
}
SHAPES = [
    pytest.param(3, 40, id="T=3 H=40"),
    pytest.param(5, 100, id="T=5 H=100 odd width, masked tail"),
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def make_inputs(T, H, dtype, hc=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, hc, H, generator=g).to(dtype)
    hc_fn = torch.randn(hc, hc * H, generator=g) * (hc * H) ** -0.5  # logits ~ N(0, 1)
    hc_scale = torch.rand(1, generator=g) + 0.5
    hc_base = torch.randn(hc, generator=g)
    return tuple(t.to(DEVICE) for t in (x, hc_fn, hc_scale, hc_base))


def within_rounding(actual, expected):
    """fp32: relative 1e-5 of the row's scale; bf16: one bf16 ulp (2**-7 relative) + 1e-5."""
    a, e = actual.float(), expected.float()
    if actual.dtype == torch.float32:
        bound = 1e-5 * e.abs().amax(-1, keepdim=True) + 1e-6
    else:
        bound = 2.0**-7 * torch.maximum(a.abs(), e.abs()) + 1e-5
    return bool(((a - e).abs() <= bound).all())


def assert_matches(actual, expected, what):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    worst = (actual.float() - expected.float()).abs().max().item() if actual.numel() else 0.0
    assert within_rounding(actual, expected), f"{what}: max |diff| {worst}"


def assert_eps_used(y, inputs):
    for name, eps in WRONG_EPS.items():
        assert not within_rounding(y, hc_head_reference(*inputs, **eps)), f"{name} would pass"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, H", SHAPES)
def test_draft_hook_matches_reference_and_sglang_kernel(sgl, T, H, dtype):
    sgl.install()
    model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(T, H, dtype)
    y = model.hc_head(*inputs)
    assert sgl.originals[DRAFT].calls == 0
    assert_matches(y, hc_head_reference(*inputs, **EPS), "vs reference")
    assert_matches(y, standins.sglang_fused_hc_head()(*inputs, **EPS), "vs SGLang fused_hc_head")
    assert_matches(y, sgl.originals[DRAFT].__wrapped__(model, *inputs), "vs SGLang's draft")
    assert_eps_used(y, inputs)


def test_draft_hook_empty_and_non_contiguous_input(sgl):
    sgl.install()
    model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    x, *params = make_inputs(0, 40, torch.bfloat16)
    y = model.hc_head(x, *params)
    assert y.shape == (0, 40) and y.dtype == torch.bfloat16
    assert sgl.originals[DRAFT].calls == 1  # empty: SGLang's own
    wide, *params = make_inputs(3, 80, torch.bfloat16)
    x = wide[:, :, ::2]  # [3, 4, 40], strided
    y = model.hc_head(x, params[0][:, :160].contiguous(), *params[1:])
    assert sgl.originals[DRAFT].calls == 1
    assert_matches(y, hc_head_reference(x, params[0][:, :160], *params[1:], **EPS), "strided x")


def test_draft_hook_falls_back_on_inputs_the_op_rejects(sgl, caplog, launches):
    sgl.install()
    model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    x, hc_fn, hc_scale, hc_base = make_inputs(3, 40, torch.bfloat16)
    scalar_scale = hc_scale.reshape(())  # SGLang broadcasts a 0-d scale; ours wants [1]
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations.sglang"):
        y = model.hc_head(x, hc_fn, scalar_scale, hc_base)  # first sight: compiles, then checks
        launches.clear()
        model.hc_head(x, hc_fn, scalar_scale, hc_base)
    assert launches == [], "rejected before any launch (nothing to undo inside a capture)"
    assert sgl.originals[DRAFT].calls == 2
    assert torch.equal(y, sgl.originals[DRAFT].__wrapped__(model, x, hc_fn, scalar_scale, hc_base))
    assert len([r for r in caplog.records if "rejected the inputs" in r.getMessage()]) == 1
    model.hc_head(x, hc_fn, hc_scale, hc_base)
    assert launches, "the count sees ours where it runs"


def test_draft_hook_runs_the_original_where_triton_cannot_run(sgl, monkeypatch):
    sgl.install()
    monkeypatch.setattr(hooks, "triton_runs_on", lambda device: False)
    model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(3, 40, torch.float32)
    y = model.hc_head(*inputs)
    assert sgl.originals[DRAFT].calls == 1
    assert torch.equal(y, sgl.originals[DRAFT].__wrapped__(model, *inputs))


def test_draft_hook_runs_the_original_under_a_triton_no_table_validates(sgl, monkeypatch):
    sgl.install()
    monkeypatch.setattr(tables, "running_stack", lambda: "3.99")
    monkeypatch.setattr(hooks, "_ready", {})
    model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(3, 40, torch.float32)
    y = model.hc_head(*inputs)
    assert sgl.originals[DRAFT].calls == 1
    assert torch.equal(y, sgl.originals[DRAFT].__wrapped__(model, *inputs))
    monkeypatch.setattr(tables, "running_stack", lambda: "3.6")
    monkeypatch.setattr(hooks, "_ready", {})
    model.hc_head(*inputs)
    assert sgl.originals[DRAFT].calls == 1  # ours under the stack the tables hold


@pytest.mark.parametrize("H", [pytest.param(4096, id="H=4096 DSV4-Flash"),
                               pytest.param(7168, id="H=7168 DSV4-Pro")])
def test_target_hook_in_the_table_matches_sglang_kernel(sgl, H):
    # 4 tokens: served eagerly at both widths by the sm_90 file (won by 1.25x or more there)
    assert hooks.target_prefers_dsv4spec(4, H, in_graph=False)
    sgl.install()
    model = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(4, H, torch.bfloat16)
    y = model.hc_head(*inputs)
    assert sgl.originals[TARGET].calls == 0
    assert_matches(y, standins.sglang_fused_hc_head()(*inputs, **EPS), "vs SGLang fused_hc_head")
    assert_matches(y, hc_head_reference(*inputs, **EPS), "vs reference")
    assert_eps_used(y, inputs)


@pytest.mark.parametrize("T, H, hc, ours", [
    pytest.param(2, 40, 4, True, id="T=2 first in range"),
    pytest.param(4, 40, 4, True, id="T=4 last in range"),
    pytest.param(1, 40, 4, False, id="T=1 below range"),
    pytest.param(5, 40, 4, False, id="T=5 above range"),
    pytest.param(0, 40, 4, False, id="T=0 empty"),
    pytest.param(3, 48, 4, False, id="H=48 not in the table"),
    pytest.param(3, 40, 2, False, id="hc_mult=2"),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_target_hook_follows_the_table(sgl, monkeypatch, T, H, hc, ours, dtype):
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["eager"], 40, ((2, 2), (3, 4)))
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["graph"], 40, ())  # CPU: no capture
    sgl.install()
    model = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(T, H, dtype, hc=hc)
    y = model.hc_head(*inputs)
    assert sgl.originals[TARGET].calls == (0 if ours else 1)
    upstream = sgl.originals[TARGET].__wrapped__(model, *inputs)
    assert y.shape == (T, H)
    if ours:
        assert_matches(y, upstream, "vs SGLang's target hc_head")
        assert_eps_used(y, inputs)
    else:
        assert torch.equal(y, upstream)


def test_target_prefers_dsv4spec_exactly_inside_each_range():
    for mode in ("graph", "eager"):
        table = hooks.TARGET_HC_HEAD_FASTER[SM90][mode]
        assert set(table) == {4096, 7168}, f"{mode}: both DSV4 widths measured"
        for H, spans in table.items():
            for lo, hi in spans:
                assert 1 <= lo <= hi
                for T, inside in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
                    covered = any(a <= T <= b for a, b in spans)
                    assert hooks.target_prefers_dsv4spec(T, H, mode == "graph") == covered
                    assert covered or not inside
        assert not hooks.target_prefers_dsv4spec(4, 5120, mode == "graph")
        assert not hooks.target_prefers_dsv4spec(4, 7168, mode == "graph", (10, 0))
    # the two modes are decided separately
    graph_only = {40: ((1, 8),)}
    for mode, table in (("graph", graph_only), ("eager", {})):
        hooks.TARGET_HC_HEAD_FASTER[SM90][mode].update(table)
    try:
        assert hooks.target_prefers_dsv4spec(3, 40, True)
        assert not hooks.target_prefers_dsv4spec(3, 40, False)
    finally:
        hooks.TARGET_HC_HEAD_FASTER[SM90]["graph"].pop(40)


def test_target_hook_asks_whether_it_is_captured(sgl, monkeypatch):
    seen = []
    monkeypatch.setattr(hooks, "_capturing", lambda x: seen.append(x.shape) or True)
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["graph"], 40, ((1, 8),))
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["eager"], 40, ())
    sgl.install()
    model = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(3, 40, torch.bfloat16)
    y = model.hc_head(*inputs)
    assert seen == [(3, 4, 40)] and sgl.originals[TARGET].calls == 0
    assert_matches(y, hc_head_reference(*inputs, **EPS), "vs reference")


@pytest.mark.parametrize("switch, target", [
    pytest.param("DSV4SPEC_SGLANG_DRAFT_HC_HEAD", DRAFT, id="draft"),
    pytest.param("DSV4SPEC_SGLANG_TARGET_HC_HEAD", TARGET, id="target"),
])
def test_switched_off_hook_leaves_sglang_original(sgl, monkeypatch, switch, target):
    monkeypatch.setenv(switch, "0")
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["eager"], 40, ((1, 8),))
    sgl.install()
    if target == DRAFT:
        model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    else:
        model = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    inputs = make_inputs(3, 40, torch.bfloat16)
    y = model.hc_head(*inputs)
    assert sgl.originals[target].calls == 1
    assert torch.equal(y, sgl.originals[target].__wrapped__(model, *inputs))


@pytest.mark.gpu
@pytest.mark.parametrize("H", [4096, 7168])
def test_gpu_target_hook_captured_in_a_cuda_graph_is_ours(sgl, monkeypatch, H):
    """Under capture the target hook takes the graph table (ours everywhere measured), eagerly
    the eager table; a replay with new x equals SGLang's own kernel within bf16 rounding."""
    # eager: SGLang's own
    monkeypatch.setitem(hooks.TARGET_HC_HEAD_FASTER[SM90]["eager"], H, ())
    sgl.install()
    model = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    x, hc_fn, hc_scale, hc_base = make_inputs(16, H, torch.bfloat16)
    model.hc_head(x, hc_fn, hc_scale, hc_base)  # eager warm-up: the original
    assert sgl.originals[TARGET].calls == 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile ours before capture
        hooks.hc_head(x, hc_fn, hc_scale, hc_base, **EPS)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = model.hc_head(x, hc_fn, hc_scale, hc_base)
    assert sgl.originals[TARGET].calls == 1, "captured the original, not ours"
    for seed in (1, 2):
        x.copy_(make_inputs(16, H, torch.bfloat16, seed=seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(y, standins.sglang_fused_hc_head()(x, hc_fn, hc_scale, hc_base, **EPS),
                       f"replay {seed} vs SGLang fused_hc_head")
