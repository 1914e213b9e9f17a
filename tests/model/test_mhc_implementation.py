"""The layers' pluggable mHC implementation (``Layer.mhc_implementation``) on CPU in float32.

Set, it carries every boundary of the target's layers and the MTP block (on any device); unset,
the layers keep their default path, here the reference ``hc_pre`` / ``hc_post`` with separate
RMSNorms.
"""

import pytest
import torch

from dsv4spec.model import preset
from dsv4spec.model.model import FusedMhcOps, Layer, Transformer, init_weights

from . import runs


class Recording:
    """Our ops (on CPU: their float64 references) with a count of the calls per op."""

    def __init__(self) -> None:
        self.calls = {"pre": 0, "post_pre": 0, "post": 0}

    def pre(self, *args, **kwargs):
        self.calls["pre"] += 1
        return FusedMhcOps.pre(*args, **kwargs)

    def post_pre(self, *args, **kwargs):
        self.calls["post_pre"] += 1
        return FusedMhcOps.post_pre(*args, **kwargs)

    def post(self, *args, **kwargs):
        self.calls["post"] += 1
        return FusedMhcOps.post(*args, **kwargs)


class DroppedOutput(Recording):
    """A wrong implementation: the FFN's output never reaches the streams."""

    def post(self, f, residual, post, comb):
        super().post(f, residual, post, comb)
        return residual


@pytest.fixture(autouse=True)
def _references_on_cpu(monkeypatch):
    # The ops' own dispatch sends CPU tensors to their float64 references unless Triton's
    # interpreter is on (as in CI, for the kernel tests): the model's plumbing is under test
    # here, and the interpreted kernels (tests/ops, tests/kernels) cost these tests 20-43 s each
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(scope="module")
def model():
    return init_weights(Transformer(preset("tiny")), seed=1).requires_grad_(False)


def forward_and_draft(model):
    return runs.forward_and_draft(model, seed=2, n=9)


def set_on_every_layer(model, ops):
    for m in model.modules():
        if isinstance(m, Layer):
            m.mhc_implementation = ops


def test_default_is_unset():
    assert Layer.mhc_implementation is None


def test_a_set_implementation_carries_every_boundary_and_matches_the_default(model):
    default = forward_and_draft(model)
    ops = Recording()
    try:
        set_on_every_layer(model, ops)
        plugged = forward_and_draft(model)
    finally:
        set_on_every_layer(model, None)
    layers = model.cfg.num_hidden_layers + len(model.mtp)
    assert ops.calls == {"pre": layers, "post_pre": layers, "post": layers}
    for a, b in zip(plugged, default):
        assert torch.isfinite(a).all()
        # float32 compute on the default path, float64 references rounded to float32 here
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)
    assert forward_and_draft(model)[0].equal(default[0])  # unset again: the default path


def test_a_wrong_implementation_changes_the_output(model):
    default = forward_and_draft(model)
    try:
        set_on_every_layer(model, DroppedOutput())
        wrong = forward_and_draft(model)
    finally:
        set_on_every_layer(model, None)
    for a, b in zip(wrong, default):
        assert (a - b).norm() / b.norm() > 1e-2


def test_our_fused_ops_end_the_model_with_the_fused_tail(model, monkeypatch):
    """With our fused ops serving the layers, the target's and the MTP block's last post,
    hc_head and final norm are one mhc_post_head call each (fused_tail), and give the logits of
    the separate post, hc_head and norm; off, the tail is never called."""
    from dsv4spec.model import model as model_module

    calls = []
    real = model_module.mhc_post_head
    monkeypatch.setattr(model_module, "mhc_post_head",
                        lambda *a, **kw: calls.append(kw["norm_weight"]) or real(*a, **kw))
    try:
        set_on_every_layer(model, FusedMhcOps)
        fused = forward_and_draft(model)
        assert [id(w) for w in calls] == [id(model.norm.weight), id(model.mtp[0].norm.weight)]
        monkeypatch.setattr(Transformer, "fused_tail", False)
        separate = forward_and_draft(model)
        assert len(calls) == 2
    finally:
        set_on_every_layer(model, None)
    for a, b in zip(fused, separate):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-4)
