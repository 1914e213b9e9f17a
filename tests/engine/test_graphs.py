"""BucketRunner: bucket choice, padding values, output slicing, refusals (CPU, no graphs)."""

import pytest
import torch

from dsv4spec.engine.graphs import BUCKETS, BucketRunner


def runner(seen):
    def step(inputs):
        seen.append({k: v.clone() for k, v in inputs.items()})
        return inputs["x"] * 2, inputs["slot"] + 1

    return BucketRunner(step, {"x": ((3,), torch.float32, -1.0), "slot": ((), torch.long, 9)},
                        buckets=(2, 4, 8, 16), max_batch=8, device=torch.device("cpu"))


def test_pads_to_the_next_bucket_and_slices_the_outputs():
    seen = []
    r = runner(seen)
    assert r.buckets == (2, 4, 8)  # buckets above max_batch dropped
    x = torch.arange(9.0).view(3, 3)
    doubled, slots = r(x=x, slot=torch.tensor([0, 1, 2]))
    assert seen[-1]["x"].shape == (4, 3)  # bucket 4
    assert torch.equal(seen[-1]["x"][:3], x) and torch.all(seen[-1]["x"][3] == -1.0)
    assert seen[-1]["slot"].tolist() == [0, 1, 2, 9]
    assert torch.equal(doubled, 2 * x) and slots.tolist() == [1, 2, 3]
    # a smaller batch afterwards: stale rows of the previous call are padded again
    r(x=x[:1], slot=torch.tensor([5]))
    assert seen[-1]["slot"].tolist() == [5, 9]
    assert torch.all(seen[-1]["x"][1] == -1.0)


def test_refuses_missing_inputs_and_oversized_batches():
    r = runner([])
    with pytest.raises(TypeError, match="expected inputs"):
        r(x=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="largest bucket"):
        r(x=torch.zeros(9, 3), slot=torch.zeros(9, dtype=torch.long))


def test_sglang_buckets():
    assert BUCKETS[:8] == tuple(range(1, 9)) and BUCKETS[-1] == 256 and len(BUCKETS) == 51
    assert 34 not in BUCKETS and 36 not in BUCKETS and 40 in BUCKETS and 72 in BUCKETS
