"""C128 draft-state rollback: fused, per-state and fallback paths against the reference.

On CPU the Triton paths run in the interpreter (tests/conftest.py); the `gpu` tests repeat the
equality at DSV4-Pro geometry on CUDA, inside a CUDA graph, and count kernels.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4spec.kernels import interpreter_enabled
from dsv4spec.ops import (
    C128DraftCleanup,
    clear_unaccepted_c128_draft_states,
    clear_unaccepted_c128_draft_states_reference,
)

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def assert_bit_identical(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    a, e = actual.view(BITS[actual.dtype]), expected.view(BITS[expected.dtype])
    diff = (a != e).nonzero()
    if diff.numel():
        rows = sorted({int(r) for r in diff[:, 0]})
        raise AssertionError(f"{what}: {diff.shape[0]} elements differ, rows {rows[:10]}...; "
                             f"first at {tuple(diff[0].tolist())}: "
                             f"{actual[tuple(diff[0])]} vs {expected[tuple(diff[0])]}")


def random_states(n, rows, half, dtype, device="cpu", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(rows, 2 * half, generator=g).to(dtype).to(device) for _ in range(n)]


def random_batch(batch, num_slots, ring, num_draft, index_dtype, device="cpu", seed=0,
                 near_wrap=False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    slots = torch.randperm(num_slots, generator=g)[:batch]
    if near_wrap:  # seq_lens just below a multiple of the ring: verify rows wrap around
        k = torch.randint(0, 4, (batch,), generator=g)
        seq = k * ring + ring - torch.randint(1, num_draft + 1, (batch,), generator=g)
    else:
        seq = torch.randint(0, 4 * ring, (batch,), generator=g)
    accept = torch.randint(1, num_draft + 1, (batch,), generator=g)
    return [t.to(index_dtype).to(device) for t in (slots, seq, accept)]


def reference_of(states, idx, seq, acc, ring, num_draft):
    expected = [s.clone() for s in states]
    for s in expected:
        clear_unaccepted_c128_draft_states_reference(s, idx, seq, acc, ring_size=ring,
                                                     num_draft_tokens=num_draft)
    return expected


# ---------------------------------------------------------------- reference: the contract itself


def test_reference_follows_contract_literally():
    ring, half, num_draft = 8, 3, 4
    state = torch.randn(3 * ring + 1, 2 * half, dtype=torch.float64).float()
    before = state.clone()
    idx, seq, acc = torch.tensor([2, 0]), torch.tensor([6, 3]), torch.tensor([2, 4])
    clear_unaccepted_c128_draft_states_reference(state, idx, seq, acc, ring_size=ring,
                                                 num_draft_tokens=num_draft)
    # b=0: slot 2, positions 6+2=8 -> 0 and 6+3=9 -> 1 are rejected; b=1 accepted everything.
    cleared = {2 * ring + 0, 2 * ring + 1}
    for row in range(state.shape[0]):
        if row in cleared:
            assert torch.all(state[row, :half] == 0) and torch.all(state[row, half:] == -torch.inf)
        else:
            assert torch.equal(state[row], before[row]), row


# --------------------------------------------------- Triton (interpreted on CPU) == reference


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_states=st.integers(1, 8),
    half=st.one_of(st.integers(1, 40), st.sampled_from([63, 128, 300, 513, 600])),
    ring=st.sampled_from([4, 7, 16, 128, 256]),
    num_draft=st.integers(2, 8),
    batch=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    near_wrap=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_and_per_state_equal_reference(num_states, half, ring, num_draft, batch, dtype,
                                             index_dtype, near_wrap, seed):
    num_slots = batch + 2
    rows = num_slots * ring + ring + 1
    states = random_states(num_states, rows, half, dtype, seed=seed)
    idx, seq, acc = random_batch(batch, num_slots, ring, num_draft, index_dtype, seed=seed,
                                 near_wrap=near_wrap)
    expected = reference_of(states, idx, seq, acc, ring, num_draft)

    fused = [s.clone() for s in states]
    C128DraftCleanup(fused, ring_size=ring).clear(idx, seq, acc, num_draft_tokens=num_draft)
    per_state = [s.clone() for s in states]
    for s in per_state:
        clear_unaccepted_c128_draft_states(s, idx, seq, acc, ring_size=ring,
                                           num_draft_tokens=num_draft)
    for i in range(num_states):
        assert_bit_identical(fused[i], expected[i], f"fused state {i}")
        assert_bit_identical(per_state[i], expected[i], f"per-state {i}")
    # The reference itself changed something unless every draft was accepted.
    if bool((acc < num_draft).any()):
        assert any(not torch.equal(e, s) for e, s in zip(expected, states))


def test_backend_is_triton_under_interpreter():
    assert interpreter_enabled() or torch.cuda.is_available()
    cleanup = C128DraftCleanup(random_states(2, 9, 2, torch.float32), ring_size=4)
    assert cleanup.backend == "triton"


def test_torch_fallback_equals_reference(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    states = random_states(3, 5 * 16 + 17, 24, torch.bfloat16, seed=3)
    idx, seq, acc = random_batch(4, 5, 16, 6, torch.int64, seed=3, near_wrap=True)
    expected = reference_of(states, idx, seq, acc, 16, 6)
    cleanup = C128DraftCleanup(states, ring_size=16)
    assert cleanup.backend == "torch"
    cleanup.clear(idx, seq, acc, num_draft_tokens=6)
    per_state = random_states(1, 5 * 16 + 17, 24, torch.bfloat16, seed=3)[0]
    clear_unaccepted_c128_draft_states(per_state, idx, seq, acc, ring_size=16, num_draft_tokens=6)
    for s, e in zip(states, expected):
        assert_bit_identical(s, e, "fallback")
    assert_bit_identical(per_state, expected[0], "per-state fallback")


# ---------------------------------------------------------------------------------- no-ops


@pytest.mark.parametrize("num_draft,batch", [
    pytest.param(1, 3, id="num_draft=1"),
    pytest.param(0, 3, id="num_draft=0"),
    pytest.param(4, 0, id="empty batch"),
])
def test_no_op(num_draft, batch):
    states = random_states(2, 4 * 8 + 9, 5, torch.float32)
    before = [s.clone() for s in states]
    idx, seq = torch.arange(batch), torch.full((batch,), 5)
    acc = torch.ones(batch, dtype=torch.long)
    C128DraftCleanup(states, ring_size=8).clear(idx, seq, acc, num_draft_tokens=num_draft)
    for s in states:
        clear_unaccepted_c128_draft_states(s, idx, seq, acc, ring_size=8,
                                           num_draft_tokens=num_draft)
    for s, b in zip(states, before):
        assert_bit_identical(s, b, "no-op")


def test_all_accepted_and_padded_rows_write_nothing():
    states = random_states(3, 4 * 8 + 9, 5, torch.float32)
    before = [s.clone() for s in states]
    idx, seq = torch.tensor([0, 1, 4]), torch.tensor([3, 9, 0])
    acc = torch.full((3,), 4)  # padded / fully accepted rows: accept == num_draft_tokens
    C128DraftCleanup(states, ring_size=8).clear(idx, seq, acc, num_draft_tokens=4)
    for s, b in zip(states, before):
        assert_bit_identical(s, b, "all accepted")


# ------------------------------------------------------- out-of-range indices never escape


@pytest.mark.parametrize("slot,seq", [
    pytest.param(7, 3, id="slot past the end"),
    pytest.param(-1, 3, id="negative slot"),
    pytest.param(2, -5, id="negative seq_len"),
    pytest.param(2**40, 0, id="huge slot"),
])
def test_out_of_range_rows_are_masked(slot, seq):
    ring, half, rows, guard = 4, 3, 3 * 4 + 5, 6
    big = torch.randn(3 * (rows + 2 * guard), 2 * half)
    original = big.clone()
    # Three states, each a contiguous view strictly inside `big` with guard rows on both sides.
    states = [big[(i * (rows + 2 * guard) + guard):(i * (rows + 2 * guard) + guard + rows)]
              for i in range(3)]
    idx, seqs, acc = torch.tensor([slot, 1]), torch.tensor([seq, 2]), torch.tensor([1, 1])
    C128DraftCleanup(states, ring_size=ring).clear(idx, seqs, acc, num_draft_tokens=4)
    for s in states:
        clear_unaccepted_c128_draft_states(s, idx, seqs, acc, ring_size=ring, num_draft_tokens=4)
    expected = original.clone()
    for i in range(3):
        view = expected[(i * (rows + 2 * guard) + guard):(i * (rows + 2 * guard) + guard + rows)]
        clear_unaccepted_c128_draft_states_reference(view, idx, seqs, acc, ring_size=ring,
                                                     num_draft_tokens=4)
    assert_bit_identical(big, expected, "guarded buffer")
    for i in range(3):
        lo = i * (rows + 2 * guard)
        assert_bit_identical(big[lo:lo + guard], original[lo:lo + guard], "guard before")
        hi = lo + guard + rows
        assert_bit_identical(big[hi:hi + guard], original[hi:hi + guard], "guard after")


def test_check_mode_raises_before_writing():
    states = random_states(2, 3 * 4 + 5, 3, torch.float32)
    before = [s.clone() for s in states]
    cleanup = C128DraftCleanup(states, ring_size=4)
    bad = [
        (torch.tensor([9]), torch.tensor([2]), torch.tensor([1]), "req_pool_indices"),
        (torch.tensor([0]), torch.tensor([-1]), torch.tensor([1]), "seq_lens"),
        (torch.tensor([0]), torch.tensor([2]), torch.tensor([0]), "accept_lens"),
        (torch.tensor([0]), torch.tensor([2]), torch.tensor([5]), "accept_lens"),
    ]
    for idx, seq, acc, name in bad:
        with pytest.raises(ValueError, match=name):
            cleanup.clear(idx, seq, acc, num_draft_tokens=4, check=True)
        with pytest.raises(ValueError, match=name):
            clear_unaccepted_c128_draft_states(states[0], idx, seq, acc, ring_size=4,
                                               num_draft_tokens=4, check=True)
    for s, b in zip(states, before):
        assert_bit_identical(s, b, "after rejected calls")


def test_stale_table_detected_and_refreshed():
    states = random_states(2, 3 * 4 + 5, 3, torch.float32)
    cleanup = C128DraftCleanup(states, ring_size=4)
    idx, seq, acc = torch.tensor([1]), torch.tensor([2]), torch.tensor([1])
    assert not cleanup.is_stale()
    states[1].set_(torch.randn_like(states[1]))  # reallocated in place: new storage
    assert cleanup.is_stale()
    with pytest.raises(ValueError, match="stale"):
        cleanup.clear(idx, seq, acc, num_draft_tokens=4, check=True)
    cleanup.refresh()
    assert not cleanup.is_stale()
    expected = reference_of(states, idx, seq, acc, 4, 4)
    cleanup.clear(idx, seq, acc, num_draft_tokens=4, check=True)
    for s, e in zip(states, expected):
        assert_bit_identical(s, e, "after refresh")


def test_graphed_clear_reads_its_buffers_and_pads_with_nothing():
    """The static-buffer clear (a CUDA graph on GPU, the plain clear on CPU) clears what its
    buffers name; rows left at their initial values clear nothing; refresh onto new buffers of
    the same layout keeps the same object working on them."""
    ring, num_draft, batch = 4, 4, 3
    states = random_states(3, 6 * ring + 1, 5, torch.float32)
    cleanup = C128DraftCleanup(states, ring_size=ring)
    graph = cleanup.graphed(batch, num_draft)
    assert cleanup.graphed(batch, num_draft) is graph
    assert graph.accept_lens.tolist() == [num_draft] * batch
    before = [s.clone() for s in states]
    graph.replay()  # initial values: nothing cleared
    for s, b in zip(states, before):
        assert_bit_identical(s, b, "initial buffers")
    idx, seq, acc = random_batch(batch - 1, 6, ring, num_draft, torch.int32, seed=5)
    graph.req_pool_indices[:2].copy_(idx)  # the last row stays padding
    graph.seq_lens[:2].copy_(seq)
    graph.accept_lens[:2].copy_(acc)
    expected = reference_of(states, idx, seq, acc, ring, num_draft)
    graph.replay()
    for i, (s, e) in enumerate(zip(states, expected)):
        assert_bit_identical(s, e, f"state {i}")
    new = random_states(3, 6 * ring + 1, 5, torch.float32, seed=9)
    old = [s.clone() for s in states]
    cleanup.refresh(new)
    assert cleanup.graphed(batch, num_draft) is graph  # same layout: kept
    expected = reference_of(new, idx, seq, acc, ring, num_draft)
    graph.replay()
    for i, (s, e, o) in enumerate(zip(new, expected, old)):
        assert_bit_identical(s, e, f"new state {i}")
        assert_bit_identical(states[i], o, f"old state {i}")
    cleanup.refresh(random_states(2, 6 * ring + 1, 5, torch.float32))
    assert cleanup.graphed(batch, num_draft) is not graph  # other layout: captured again


@pytest.mark.parametrize("args,error,match", [
    ((0, 4), ValueError, "batch_size"),
    ((2, 9), ValueError, "num_draft_tokens"),
    ((2, 0), ValueError, "num_draft_tokens"),
    ((2, 4, torch.float32), TypeError, "index_dtype"),
])
def test_graphed_clear_validation(args, error, match):
    cleanup = C128DraftCleanup(random_states(2, 9, 3, torch.float32), ring_size=4)
    with pytest.raises(error, match=match):
        cleanup.graphed(*args)


# ---------------------------------------------------------------------- validation, one rule each


def _state(rows=9, width=6, dtype=torch.float32):
    return torch.randn(rows, width).to(dtype)


@pytest.mark.parametrize("states,ring,match", [
    pytest.param([], 4, "empty", id="empty list"),
    pytest.param([_state(dtype=torch.float16)], 4, "float32 or bfloat16", id="fp16 dtype"),
    pytest.param([_state(), _state(dtype=torch.bfloat16)], 4, "mix dtypes", id="mixed dtypes"),
    pytest.param([_state(), _state(rows=10)], 4, "mix shapes", id="mixed shapes"),
    pytest.param([_state(), torch.randn(6, 9).t().contiguous().t()], 4, "contiguous",
                 id="non-contiguous"),
    pytest.param([torch.randn(9, 6)[:, :4], _state(width=4)], 4, "contiguous",
                 id="strided view"),
    pytest.param([torch.randn(9, 2, 3)], 4, "2-D", id="not 2-D"),
    pytest.param([_state(width=5)], 4, "even", id="odd width"),
    pytest.param([_state(width=0)], 4, "even", id="zero width"),
    pytest.param([_state()], 0, "ring_size", id="ring_size 0"),
    pytest.param([_state()], -3, "ring_size", id="ring_size negative"),
    pytest.param([_state(rows=3)], 4, "fewer than one ring", id="rows < ring"),
    pytest.param([_state(width=2)] * 70000, 4, "grid axis limit", id="grid limit"),
])
def test_cleanup_validation(states, ring, match):
    with pytest.raises(ValueError, match=match):
        C128DraftCleanup(states, ring_size=ring)


def test_mixed_strides_rejected():
    # Both contiguous (size-1 leading dim) yet with different strides: the table shares strides.
    a = torch.randn(1, 6)
    b = torch.randn(1, 12)[:, :6]
    assert b.is_contiguous() and a.stride() != b.stride()
    with pytest.raises(ValueError, match="strides"):
        C128DraftCleanup([a, b], ring_size=1)


def test_mixed_devices_rejected():
    a, b = _state(), _state().to("meta")
    with pytest.raises(ValueError, match="devices"):
        C128DraftCleanup([a, b], ring_size=4)


@pytest.mark.parametrize("kwargs,error,match", [
    pytest.param(dict(req_pool_indices=torch.tensor([0.0])), TypeError, "req_pool_indices",
                 id="float indices"),
    pytest.param(dict(seq_lens=torch.tensor([[1]])), ValueError, "seq_lens", id="2-D seq_lens"),
    pytest.param(dict(accept_lens=torch.tensor([1, 1, 1])), ValueError, "accept_lens",
                 id="length mismatch"),
    pytest.param(dict(seq_lens=[1]), TypeError, "seq_lens", id="list, not tensor"),
    pytest.param(dict(accept_lens=torch.tensor([1], device="meta")), ValueError, "accept_lens",
                 id="other device"),
    # Without this rule the kernel would read [0, 1] as slots [0, 9] and clear the wrong rows.
    pytest.param(dict(req_pool_indices=torch.tensor([0, 9, 1, 9])[::2]), ValueError,
                 "req_pool_indices must be contiguous", id="strided req_pool_indices"),
    pytest.param(dict(seq_lens=torch.tensor([1, 5, 2, 5])[::2]), ValueError,
                 "seq_lens must be contiguous", id="strided seq_lens"),
    pytest.param(dict(accept_lens=torch.tensor([1, 3, 1, 3])[::2]), ValueError,
                 "accept_lens must be contiguous", id="strided accept_lens"),
])
def test_index_validation(kwargs, error, match):
    args = dict(req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([1, 2]),
                accept_lens=torch.tensor([1, 1]))
    args.update(kwargs)
    states = [_state(rows=13) for _ in range(2)]
    before = [s.clone() for s in states]
    cleanup = C128DraftCleanup(states, ring_size=4)
    with pytest.raises(error, match=match):
        cleanup.clear(**args, num_draft_tokens=4)
    with pytest.raises(error, match=match):
        clear_unaccepted_c128_draft_states(states[0], **args, ring_size=4, num_draft_tokens=4)
    for s, b in zip(states, before):
        assert_bit_identical(s, b, "refused call wrote")


def test_num_draft_one_changes_nothing_even_with_out_of_range_accept_lens():
    states = random_states(2, 4 * 8 + 9, 5, torch.float32)
    before = [s.clone() for s in states]
    idx, seq, acc = torch.tensor([0, 3]), torch.tensor([5, 9]), torch.tensor([0, 7])
    cleanup = C128DraftCleanup(states, ring_size=8)
    for check in (False, True):
        cleanup.clear(idx, seq, acc, num_draft_tokens=1, check=check)
        clear_unaccepted_c128_draft_states(states[0], idx, seq, acc, ring_size=8,
                                           num_draft_tokens=1, check=check)
    for s, b in zip(states, before):
        assert_bit_identical(s, b, "num_draft_tokens=1")


def test_num_draft_above_max_rejected():
    cleanup = C128DraftCleanup([_state()], ring_size=4, max_num_draft_tokens=4)
    with pytest.raises(ValueError, match="max_num_draft_tokens"):
        cleanup.clear(torch.tensor([0]), torch.tensor([1]), torch.tensor([1]), num_draft_tokens=5)


# ------------------------------------------------------------------------------- GPU (H200)

PRO = dict(num_states=31, half=512, ring=256)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,num_draft", [(1, 4), (8, 4), (64, 8), (256, 8)])
def test_gpu_pro_geometry_equals_reference(dtype, batch, num_draft):
    num_slots = batch + 3
    rows = num_slots * PRO["ring"] + PRO["ring"] + 1
    states = random_states(PRO["num_states"], rows, PRO["half"], dtype, "cuda", seed=batch)
    for near_wrap in (False, True):
        idx, seq, acc = random_batch(batch, num_slots, PRO["ring"], num_draft, torch.int32,
                                     "cuda", seed=batch, near_wrap=near_wrap)
        expected = reference_of(states, idx, seq, acc, PRO["ring"], num_draft)
        C128DraftCleanup(states, ring_size=PRO["ring"]).clear(idx, seq, acc,
                                                              num_draft_tokens=num_draft)
        for s in states[:1]:
            clear_unaccepted_c128_draft_states(s, idx, seq, acc, ring_size=PRO["ring"],
                                               num_draft_tokens=num_draft)
        for i, (s, e) in enumerate(zip(states, expected)):
            assert_bit_identical(s, e, f"state {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_cuda_graph_replay_reads_current_indices(dtype):
    batch, num_draft, num_slots = 8, 4, 12
    rows = num_slots * PRO["ring"] + PRO["ring"] + 1
    states = random_states(PRO["num_states"], rows, PRO["half"], dtype, "cuda")
    cleanup = C128DraftCleanup(states, ring_size=PRO["ring"])
    idx, seq, acc = random_batch(batch, num_slots, PRO["ring"], num_draft, torch.int64, "cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cleanup.clear(idx, seq, acc, num_draft_tokens=num_draft)  # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cleanup.clear(idx, seq, acc, num_draft_tokens=num_draft)
    for seed in range(1, 4):
        fresh = random_states(PRO["num_states"], rows, PRO["half"], dtype, "cuda", seed=seed)
        for s, f in zip(states, fresh):
            s.copy_(f)
        new = random_batch(batch, num_slots, PRO["ring"], num_draft, torch.int64, "cuda",
                           seed=seed, near_wrap=seed % 2 == 1)
        for t, n in zip((idx, seq, acc), new):
            t.copy_(n)
        expected = reference_of(states, idx, seq, acc, PRO["ring"], num_draft)
        graph.replay()
        torch.cuda.synchronize()
        for i, (s, e) in enumerate(zip(states, expected)):
            assert_bit_identical(s, e, f"replay {seed} state {i}")


@pytest.mark.gpu
def test_gpu_one_kernel_per_clear():
    from dsv4spec.bench.common import count_kernels

    rows = 4 * PRO["ring"] + PRO["ring"] + 1
    states = random_states(PRO["num_states"], rows, PRO["half"], torch.float32, "cuda")
    cleanup = C128DraftCleanup(states, ring_size=PRO["ring"])
    idx, seq, acc = random_batch(4, 4, PRO["ring"], 4, torch.int32, "cuda")
    assert count_kernels(lambda: cleanup.clear(idx, seq, acc, num_draft_tokens=4)) == 1
    n_loop = count_kernels(lambda: [clear_unaccepted_c128_draft_states(
        s, idx, seq, acc, ring_size=PRO["ring"], num_draft_tokens=4) for s in states])
    assert n_loop == PRO["num_states"]


@pytest.mark.gpu
def test_gpu_num_draft_one_launches_nothing():
    from dsv4spec.bench.common import count_kernels

    rows = 4 * PRO["ring"] + PRO["ring"] + 1
    states = random_states(PRO["num_states"], rows, PRO["half"], torch.float32, "cuda")
    before = [s.clone() for s in states]
    cleanup = C128DraftCleanup(states, ring_size=PRO["ring"])
    idx, seq = torch.tensor([0, 2], device="cuda"), torch.tensor([7, 300], device="cuda")
    acc = torch.tensor([0, 9], device="cuda")  # out of range: must not matter
    assert count_kernels(lambda: cleanup.clear(idx, seq, acc, num_draft_tokens=1)) == 0
    assert count_kernels(lambda: clear_unaccepted_c128_draft_states(
        states[0], idx, seq, acc, ring_size=PRO["ring"], num_draft_tokens=1)) == 0
    for i, (s, b) in enumerate(zip(states, before)):
        assert_bit_identical(s, b, f"state {i}")


@pytest.mark.gpu
def test_gpu_cached_launch_after_refresh_and_shape_changes():
    """The cached compiled kernel is used (direct launches), and stays right after refresh()
    onto new buffers, a batch-size change and a num_draft_tokens change."""
    from dsv4spec.kernels.c128_cleanup import _FUSED

    num_slots = 10
    rows = num_slots * PRO["ring"] + PRO["ring"] + 1
    states = random_states(PRO["num_states"], rows, PRO["half"], torch.float32, "cuda", seed=3)
    cleanup = C128DraftCleanup(states, ring_size=PRO["ring"])
    for step, (batch, num_draft) in enumerate([(2, 4), (2, 4), (5, 4), (5, 6), (2, 4)]):
        if step == 3:  # new buffers: the old ones must stay untouched from here on
            old = states
            old_before = [s.clone() for s in old]
            states = random_states(PRO["num_states"], rows, PRO["half"], torch.float32, "cuda",
                                   seed=4)
            assert not cleanup.is_stale()
            cleanup.refresh(states)
        idx, seq, acc = random_batch(batch, num_slots, PRO["ring"], num_draft, torch.int32,
                                     "cuda", seed=step)
        expected = reference_of(states, idx, seq, acc, PRO["ring"], num_draft)
        direct = _FUSED.direct_launches
        cleanup.clear(idx, seq, acc, num_draft_tokens=num_draft)
        if step in (1, 4):  # a geometry seen before: the cached kernel is launched directly
            assert _FUSED.direct_launches == direct + 1
        for i, (s, e) in enumerate(zip(states, expected)):
            assert_bit_identical(s, e, f"step {step} state {i}")
    for i, (s, b) in enumerate(zip(old, old_before)):
        assert_bit_identical(s, b, f"old state {i} after refresh")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_repeated_clears_on_one_helper(dtype):
    """Repeated clears on one helper with changing index dtypes, alignments, batch sizes and
    draft counts all equal the reference."""
    num_slots = 20
    rows = num_slots * PRO["ring"] + PRO["ring"] + 1
    states = random_states(8, rows, PRO["half"], dtype, "cuda", seed=7)
    cleanup = C128DraftCleanup(states, ring_size=PRO["ring"])
    for step in range(12):
        batch = [1, 3, 8, 16][step % 4]
        num_draft = [4, 2, 8][step % 3]
        index_dtype = torch.int32 if step % 2 else torch.int64
        idx, seq, acc = random_batch(batch + 1, num_slots, PRO["ring"], num_draft, index_dtype,
                                     "cuda", seed=100 + step, near_wrap=step % 3 == 0)
        if step % 4 == 1:  # views at an odd element offset: not 16-byte aligned
            idx, seq, acc = idx[1:], seq[1:], acc[1:]
        else:
            idx, seq, acc = idx[:-1], seq[:-1], acc[:-1]
        expected = reference_of(states, idx, seq, acc, PRO["ring"], num_draft)
        cleanup.clear(idx, seq, acc, num_draft_tokens=num_draft)
        for i, (s, e) in enumerate(zip(states, expected)):
            assert_bit_identical(s, e, f"step {step} state {i}")


@pytest.mark.gpu
def test_gpu_graphed_clear_after_refresh_batch_and_draft_changes():
    """Static-buffer graph replays equal the reference at DSV4-Pro geometry, launch one kernel
    per replay, keep working after refresh() onto new buffers, and stay separate per batch size
    and num_draft_tokens."""
    from dsv4spec.bench.common import count_kernels

    num_slots = 10
    rows = num_slots * PRO["ring"] + PRO["ring"] + 1
    states = random_states(PRO["num_states"], rows, PRO["half"], torch.bfloat16, "cuda", seed=1)
    cleanup = C128DraftCleanup(states, ring_size=PRO["ring"])
    graphs = {(b, w): cleanup.graphed(b, w) for b, w in ((1, 4), (8, 4), (8, 6))}
    for step, (b, w) in enumerate([(1, 4), (8, 4), (8, 6), (1, 4), (8, 6)]):
        if step == 3:
            old, old_before = states, [s.clone() for s in states]
            states = random_states(PRO["num_states"], rows, PRO["half"], torch.bfloat16, "cuda",
                                   seed=2)
            cleanup.refresh(states)
        graph = graphs[b, w]
        idx, seq, acc = random_batch(b, num_slots, PRO["ring"], w, torch.int32, "cuda",
                                     seed=step, near_wrap=step % 2 == 0)
        for buffer, value in zip((graph.req_pool_indices, graph.seq_lens, graph.accept_lens),
                                 (idx, seq, acc)):
            buffer.copy_(value)
        expected = reference_of(states, idx, seq, acc, PRO["ring"], w)
        assert count_kernels(graph.replay) == 1  # replays are idempotent: runs may repeat
        torch.cuda.synchronize()
        for i, (s, e) in enumerate(zip(states, expected)):
            assert_bit_identical(s, e, f"step {step} state {i}")
    for i, (s, b) in enumerate(zip(old, old_before)):
        assert_bit_identical(s, b, f"old state {i} after refresh")
