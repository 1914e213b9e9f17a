"""CheckedParams' order of eviction, as documented: past ``limit`` entries the oldest goes (an
entry checked again counts as the newest), exactly ``limit`` are kept, and a dying tensor drops
only the entry that holds it, never a newer one under the same key."""

import torch

from dsv4spec.ops.checked_params import CheckedParams


def test_exactly_limit_entries_are_kept_the_oldest_going_first():
    checked = CheckedParams(3)
    tensors = [torch.zeros(1) for _ in range(5)]
    for i, t in enumerate(tensors[:3]):
        checked.remember(i, (t,))
    assert list(checked) == [0, 1, 2]
    checked.remember(3, (tensors[3],))
    assert list(checked) == [1, 2, 3]
    checked.remember(2, (tensors[2],))  # checked again: now the newest, nothing dropped
    assert list(checked) == [1, 3, 2]
    checked.remember(4, (tensors[4],))
    assert list(checked) == [3, 2, 4]


def test_an_entry_checked_again_below_the_limit_moves_to_the_newest():
    checked = CheckedParams(4)
    tensors = [torch.zeros(1) for _ in range(5)]
    for i in range(3):
        checked.remember(i, (tensors[i],))
    checked.remember(0, (tensors[0],))
    assert list(checked) == [1, 2, 0]
    checked.remember(3, (tensors[3],))
    checked.remember(4, (tensors[4],))
    assert list(checked) == [2, 0, 3, 4]


def test_a_limit_of_one_keeps_the_latest():
    checked = CheckedParams(1)
    a, b = torch.zeros(1), torch.zeros(1)
    checked.remember("a", (a,))
    checked.remember("b", (b,))
    assert list(checked) == ["b"]


def test_a_dying_tensor_drops_only_its_own_entry_not_a_newer_one_under_its_key():
    """A key's tensors replaced (the same key remembered with other tensors) while the old entry
    is still held (an op compares a looked-up entry, then checks and remembers the call's
    tensors): the old ones dying leave the new entry in place."""
    checked = CheckedParams(4)
    old, new = torch.zeros(1), torch.zeros(1)
    checked.remember("k", (old,))
    held = checked.get("k")
    checked.remember("k", (new,))
    del old
    assert held is not None
    assert list(checked) == ["k"] and checked["k"][1] == (new.data_ptr(),)
    del new
    assert list(checked) == []
