"""The fused model tail (``Transformer._tail``: the last post, hc_head and the final norm as one
``mhc_post_head``) takes each epsilon from where the separate path takes it: hc_head's
``rms_norm_eps`` and ``hc_eps`` from the config, the final norm's from the norm module, for the
target and the MTP block; and ``hc_head_impl = "triton"`` fuses the tail as ``"auto"`` does. On
CPU in float32, the ops' float64 references standing in for the kernels."""

import dataclasses

import pytest
import torch

from dsv4spec.model import preset
from dsv4spec.model.model import FusedMhcOps, Layer, Transformer, init_weights

from . import runs


@pytest.fixture(autouse=True)
def _references_on_cpu(monkeypatch):
    # the plumbing is under test: the ops' float64 references, not the interpreted kernels
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def model_with_distinct_epsilons():
    """The tiny model with every epsilon its own and large enough to move the logits: hc_head's
    two, and each final norm's (target 0.5, MTP 0.125)."""
    cfg = dataclasses.replace(preset("tiny"), rms_norm_eps=0.25, hc_eps=1.0)
    model = init_weights(Transformer(cfg), seed=1).requires_grad_(False)
    model.norm.eps, model.mtp[0].norm.eps = 0.5, 0.125
    return model


def fused_tail_calls(model, monkeypatch):
    """The outputs with our fused ops on every layer, and the keyword arguments of each
    ``mhc_post_head`` call they made."""
    from dsv4spec.model import model as model_module

    calls = []
    real = model_module.mhc_post_head
    monkeypatch.setattr(model_module, "mhc_post_head",
                        lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    for m in model.modules():
        if isinstance(m, Layer):
            monkeypatch.setattr(m, "mhc_implementation", FusedMhcOps, raising=False)
    fused = runs.forward_and_draft(model, seed=2, n=5)
    assert len(calls) == 2, "the target's and the MTP block's tails, fused"
    return fused, calls


def test_each_epsilon_reaches_the_fused_tail(monkeypatch):
    model = model_with_distinct_epsilons()
    fused, calls = fused_tail_calls(model, monkeypatch)
    monkeypatch.setattr(Transformer, "fused_tail", False)
    separate = runs.forward_and_draft(model, seed=2, n=5)
    assert [(kw["norm_eps"], kw["hc_eps"], kw["final_norm_eps"]) for kw in calls] == [
        (0.25, 1.0, 0.5), (0.25, 1.0, 0.125)]
    for a, b in zip(fused, separate):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)


def test_a_triton_hc_head_fuses_the_tail_as_auto_does(monkeypatch):
    model = init_weights(Transformer(preset("tiny")), seed=1).requires_grad_(False)
    model.hc_head_impl = "triton"
    fused, _ = fused_tail_calls(model, monkeypatch)  # the separate path would run the kernel
    for a in fused:
        assert torch.isfinite(a).all()
