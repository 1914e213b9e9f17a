import pytest
import torch

from dsv4spec.cache import C128StatePool
from dsv4spec.cache.neutral import neutral_rows, neutralise
from dsv4spec.ops import clear_unaccepted_c128_draft_states_reference


def test_neutral_rows_split_each_row_into_kv_and_score_halves():
    rows = neutral_rows(3, 6, torch.float32, "cpu")
    assert torch.all(rows[:, :3] == 0) and torch.all(rows[:, 3:] == -torch.inf)
    x = torch.randn(2, 4, 8)
    assert neutralise(x[1, 1:3]) is not None
    assert torch.all(x[1, 1:3, :4] == 0) and torch.all(x[1, 1:3, 4:] == -torch.inf)
    assert torch.isfinite(x[0]).all() and torch.isfinite(x[1, 0]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layout_neutral_and_separate(dtype):
    pool = C128StatePool(3, 4, ring_size=8, head_dim=5, dtype=dtype)
    assert pool.num_rows == 4 * 8 + 8 + 1
    assert len({s.data_ptr() for s in pool.states}) == 3
    for s in pool.states:
        assert s.shape == (41, 10) and s.dtype == dtype
        assert torch.all(s[:, :5] == 0) and torch.all(s[:, 5:] == -torch.inf)


def test_reset_slot_touches_only_that_ring():
    pool = C128StatePool(2, 3, ring_size=4, head_dim=2)
    for s in pool.states:
        s.copy_(torch.randn_like(s))
    before = [s.clone() for s in pool.states]
    pool.reset_slot(1)
    for s, b in zip(pool.states, before):
        assert torch.all(s[4:8, :2] == 0) and torch.all(s[4:8, 2:] == -torch.inf)
        assert torch.equal(s[:4], b[:4]) and torch.equal(s[8:], b[8:])
    with pytest.raises(ValueError, match="slot"):
        pool.reset_slot(4)


@pytest.mark.parametrize("cleanup", ["fused", "loop"])
def test_pool_rollback_equals_reference(cleanup):
    pool = C128StatePool(2, 5, ring_size=16, head_dim=7, cleanup=cleanup)
    assert len(pool.states) == 2
    for s in pool.states:
        s.copy_(torch.randn_like(s))
    idx, seq, acc = torch.tensor([4, 0, 2]), torch.tensor([14, 3, 40]), torch.tensor([1, 3, 2])
    expected = [s.clone() for s in pool.states]
    for e in expected:
        clear_unaccepted_c128_draft_states_reference(e, idx, seq, acc, ring_size=16,
                                                     num_draft_tokens=4)
    pool.clear_unaccepted_c128_draft_states(idx, seq, acc, 4)
    for s, e in zip(pool.states, expected):
        assert torch.equal(s, e)


def test_pool_argument_errors():
    with pytest.raises(ValueError, match="cleanup"):
        C128StatePool(1, 1, ring_size=4, head_dim=2, cleanup="magic")
    with pytest.raises(ValueError, match="num_slots"):
        C128StatePool(1, 0, ring_size=4, head_dim=2)
    with pytest.raises(ValueError, match="num_layers"):
        C128StatePool(0, 1, ring_size=4, head_dim=2)
