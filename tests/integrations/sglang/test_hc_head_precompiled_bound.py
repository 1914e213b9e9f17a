"""The draft hc_head hooks at the largest precompiled count: the MTP draft's and DSpark's run
ours at ``PRECOMPILE_MAX_TOKENS`` rows (compiled before capture) and SGLang's one row past it."""

import pytest
import torch

from dsv4spec.integrations.hooks import INTERPRETER_ARCHITECTURE
from dsv4spec.integrations.sglang import hc_head as hooks

from .conftest import DRAFT, DSPARK
from .test_dspark_hc_head import N, dspark_model
from .test_hc_head import HC_EPS, NORM_EPS, make_inputs


def test_the_draft_gate_serves_up_to_the_largest_precompiled_count():
    top = hooks.PRECOMPILE_MAX_TOKENS
    arch = INTERPRETER_ARCHITECTURE
    assert [T for T in (0, 1, top - 1, top, top + 1) if hooks.draft_prefers_dsv4spec(T, arch)] \
        == [1, top - 1, top]


@pytest.mark.parametrize("top,ours", [(3, True), (2, False)], ids=["T = the bound", "one past"])
def test_the_mtp_draft_hook_runs_ours_up_to_the_bound(sgl, monkeypatch, launches, top, ours):
    monkeypatch.setattr(hooks, "PRECOMPILE_MAX_TOKENS", top)
    sgl.install()
    model = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    launches.clear()
    model.hc_head(*make_inputs(3, 40, torch.float32))
    assert sgl.originals[DRAFT].calls == (0 if ours else 1)
    assert bool(launches) is ours


@pytest.mark.parametrize("top,ours", [(N, True), (N - 1, False)], ids=["T = the bound", "one past"])
def test_the_dspark_hook_runs_ours_up_to_the_bound(sgl, monkeypatch, launches, top, ours):
    monkeypatch.setattr(hooks, "PRECOMPILE_MAX_TOKENS", top)
    monkeypatch.setattr(hooks, "dspark_prefers_dsv4spec", lambda T, H, in_graph, arch: True)
    sgl.install()
    x, *params = make_inputs(N, 40, torch.bfloat16)
    model = dspark_model(sgl, params)
    launches.clear()
    model.collapse_hc_head(x)
    assert sgl.originals[DSPARK].calls == (0 if ours else 1)
    assert bool(launches) is ours
