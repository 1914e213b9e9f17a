"""bench mhc-sweep's model-tail rows, on CPU: the fused tail and the sequence it is timed against
compute the same thing (the interpreter runs both)."""

import torch

from dsv4spec.bench import mhc_sweep


def test_tail_calls_agree_with_the_reference():
    inp = mhc_sweep.make_inputs(3, 40, seed=1, device="cpu")
    calls = mhc_sweep.tail_calls(inp)
    ref = calls.pop("reference")()
    assert set(calls) == {"fused tail", mhc_sweep.TAIL_BASELINE}
    for name, call in calls.items():
        new, hidden = call()
        assert torch.equal(new, ref[0]), name  # the same mix, rounded once
        err = mhc_sweep._rel_err(hidden, ref[1])
        assert err < 2e-2, (name, err)  # bf16 rounding of the hidden state
        assert mhc_sweep._rel_err(hidden, torch.zeros_like(hidden)) > 0.5  # not trivially 0
