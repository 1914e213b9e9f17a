"""The rollback hook, installed through SGLang's registry, on stand-in KV pools with real buffers.

The stand-in's original is SGLang's own method source calling SGLang's own per-layer kernel
(Triton interpreter on CPU). Every result is compared bit for bit, on whole buffers, with the
contract (dsv4spec's reference per C128 pool) and with SGLang's kernel per C128 pool.
"""

import pytest
import torch

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import rollback
from dsv4spec.ops import clear_unaccepted_c128_draft_states_reference

from . import standins
from .conftest import ROLLBACK
from .standins import DEVICE, CompressStatePool

RING, HALF, SLOTS, W = 8, 4, 3, 4
ROWS = SLOTS * RING + RING + 1  # request rings, the spare ring, the sentinel row
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
# b=0: slot 2, accepts 1 of 4: positions 6, 7, 8 (-> ring row 0) rejected;
# b=1: slot 0, accepts 2: positions 15, 16 (wraps to ring row 0) rejected;
# b=2: slot 1, a CUDA-graph padding row (accept == W): nothing.
BATCH = ([2, 0, 1], [5, 13, 7], [1, 2, W])


def batch(rows=BATCH, dtype=torch.int64):
    return tuple(torch.tensor(r, dtype=dtype, device=DEVICE) for r in rows)


def buffer(dtype, seed, rows=ROWS, width=2 * HALF):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g).to(DEVICE, dtype)  # finite poison everywhere


def kv_pool(sgl, dtype=torch.float32, layout="C0 C128 C4 C128 C0 C128", rings=None, dtypes=None,
            ring=RING, half=HALF, slots=SLOTS):
    """A DeepSeekV4TokenToKVPool over a Pro-like layer pattern: C0 (no state), C4, C128.

    The C4 buffers have the C128 shape and dtype, so a hook that took them would not be stopped
    by the fused helper's checks: only the comparison catches it.
    """
    pools, k = [], 0
    for i, kind in enumerate(layout.split()):
        if kind == "C0":
            pools.append(None)
            continue
        ratio = int(kind[1:])
        r = rings[k] if rings and ratio == 128 else ring
        dt = dtypes[k] if dtypes and ratio == 128 else dtype
        k += ratio == 128
        state = buffer(dt, seed=i, rows=slots * r + r + 1, width=2 * half)
        pools.append(CompressStatePool(ratio, r, state))
    return sgl.pool.DeepSeekV4TokenToKVPool(pools)


def buffers(pool):
    return [p.kv_score_buffer.kv_score for p in pool.compress_state_pools if p is not None]


def expected(pool, idx, seq, acc, num_draft, kernel):
    """Clones of every buffer, with ``kernel`` applied to the C128 ones, as SGLang's loop does."""
    out = []
    for p in pool.compress_state_pools:
        if p is None:
            continue
        t = p.kv_score_buffer.kv_score.clone()
        if p.ratio == 128:
            kernel(t, idx, seq, acc, ring_size=p.ring_size, num_draft_tokens=num_draft)
        out.append(t)
    return out


def assert_bits_equal(actual, expected_, what):
    assert len(actual) == len(expected_)
    for i, (a, e) in enumerate(zip(actual, expected_)):
        assert a.dtype == e.dtype and a.shape == e.shape
        diff = (a.view(BITS[a.dtype]) != e.view(BITS[e.dtype])).any(-1).nonzero().flatten()
        assert diff.numel() == 0, f"{what}: buffer {i} differs in rows {diff.tolist()}"


def check(pool, idx, seq, acc, num_draft=W):
    """Run the hooked method; compare with the contract and with SGLang's kernel."""
    before = [t.clone() for t in buffers(pool)]
    ref = expected(pool, idx, seq, acc, num_draft, clear_unaccepted_c128_draft_states_reference)
    sgl_kernel = expected(pool, idx, seq, acc, num_draft, standins.sglang_cleanup_kernel())
    pool.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    assert_bits_equal(buffers(pool), ref, "hooked vs reference")
    assert_bits_equal(buffers(pool), sgl_kernel, "hooked vs SGLang's kernel")
    return before


def plan(pool):
    return getattr(pool, rollback.CACHE_ATTR, None)


def changed_rows(a, b):
    return sorted({int(r) for r in (a.view(BITS[a.dtype]) != b.view(BITS[b.dtype])).any(-1)
                   .nonzero().flatten()})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_rollback_matches_reference_and_sglang_kernel(sgl, dtype):
    sgl.install()
    pool = kv_pool(sgl, dtype)
    before = check(pool, *batch())
    assert sgl.originals[ROLLBACK].calls == 0
    assert plan(pool).cleanup.backend == "triton" and plan(pool).cleanup.num_states == 3
    after = buffers(pool)
    # Slot 2: rows 16 + {6, 7, 0}; slot 0: rows {7, 0}; in every C128 buffer (0, 2, 3).
    for i in (0, 2, 3):
        assert changed_rows(before[i], after[i]) == [0, 7, 16, 22, 23]
    assert changed_rows(before[1], after[1]) == []  # the C4 buffer


def test_random_batch_with_int32_indices(sgl):
    sgl.install()
    pool = kv_pool(sgl)
    g = torch.Generator().manual_seed(1)
    idx = torch.randperm(SLOTS + 1, generator=g).to(DEVICE, torch.int32)  # the spare ring too
    seq = torch.randint(0, 5 * RING, (SLOTS + 1,), generator=g).to(DEVICE, torch.int32)
    acc = torch.randint(1, W + 1, (SLOTS + 1,), generator=g).to(DEVICE, torch.int32)
    check(pool, idx, seq, acc)
    assert sgl.originals[ROLLBACK].calls == 0


@pytest.mark.parametrize("case", ["ONLINE_C128", "one draft token", "empty batch"])
def test_early_returns_leave_buffers_untouched(sgl, case):
    sgl.install()
    pool = kv_pool(sgl)
    idx, seq, acc = batch()
    num_draft = W
    if case == "ONLINE_C128":
        sgl.pool.ONLINE_C128 = True  # read at call time, like the original reads its global
    elif case == "one draft token":
        num_draft, acc = 1, torch.zeros_like(acc)  # j = 0 would be "rejected" without the return
    else:
        idx, seq, acc = (t[:0] for t in (idx, seq, acc))
    before = [t.clone() for t in buffers(pool)]
    pool.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    assert_bits_equal(buffers(pool), before, case)
    assert plan(pool) is None and sgl.originals[ROLLBACK].calls == 0


def test_graph_padding_rows_write_nothing(sgl):
    sgl.install()
    pool = kv_pool(sgl, torch.bfloat16)
    before = [t.clone() for t in buffers(pool)]
    check(pool, *batch(([0, 1, 2, 3], [0, 7, 255, 9], [W] * 4)))
    assert_bits_equal(buffers(pool), before, "padding rows")


def test_helper_is_built_once_and_reused(sgl):
    sgl.install()
    pool = kv_pool(sgl)
    check(pool, *batch())
    first = plan(pool)
    check(pool, *batch(([1, 2], [30, 3], [2, 3])))
    check(pool, *batch(([0], [0], [1])), num_draft=2)
    assert plan(pool) is first and plan(pool).cleanup is first.cleanup
    assert sgl.originals[ROLLBACK].calls == 0


def test_replaced_buffer_is_cleared_not_the_old_one(sgl):
    sgl.install()
    pool = kv_pool(sgl)
    check(pool, *batch())
    cleanup = plan(pool).cleanup
    c128 = pool.compress_state_pools[3]
    old = c128.kv_score_buffer.kv_score
    old_snapshot = old.clone()
    c128.kv_score_buffer.kv_score = buffer(torch.float32, seed=99)
    check(pool, *batch(([1], [2], [1])))
    assert_bits_equal([old], [old_snapshot], "the replaced buffer")
    assert plan(pool).cleanup is cleanup  # refreshed in place
    assert any(s is c128.kv_score_buffer.kv_score for s in cleanup.states)
    assert not any(s is old for s in cleanup.states)


def test_pools_replaced_with_another_ring_size(sgl):
    sgl.install()
    pool = kv_pool(sgl)
    check(pool, *batch())
    pool.compress_state_pools[:] = kv_pool(sgl, ring=2 * RING).compress_state_pools
    check(pool, *batch(([2, 1], [11, 30], [1, 2])))
    assert plan(pool).cleanup.ring_size == 2 * RING
    assert sgl.originals[ROLLBACK].calls == 0


def test_reallocated_buffer_is_cleared(sgl):
    # The same tensor object moved to new storage: what C128DraftCleanup.is_stale() reports.
    sgl.install()
    pool = kv_pool(sgl, torch.bfloat16)
    check(pool, *batch())
    state = pool.compress_state_pools[1].kv_score_buffer.kv_score
    old_storage = state.data
    state.data = buffer(torch.bfloat16, seed=98)
    assert plan(pool).cleanup.is_stale()
    snapshot = old_storage.clone()
    check(pool, *batch(([0], [4], [2])))
    assert_bits_equal([old_storage], [snapshot], "the old storage")
    assert not plan(pool).cleanup.is_stale()


def _mixed_rings(sgl):
    return kv_pool(sgl, rings=[RING, 2 * RING, RING])


def _mixed_dtypes(sgl):
    return kv_pool(sgl, dtypes=[torch.float32, torch.bfloat16, torch.float32])


def _no_c128(sgl):
    return kv_pool(sgl, layout="C0 C4 C4 C0")


def _no_triton(sgl, monkeypatch):
    monkeypatch.setattr(rollback, "triton_runs_on", lambda device: False)
    return kv_pool(sgl)


def _unvalidated_triton(sgl, monkeypatch):
    # a Triton release no packaged or user table was measured under
    monkeypatch.setattr(tables, "running_stack", lambda: "3.99")
    return kv_pool(sgl)


@pytest.mark.parametrize("make, reason", [
    pytest.param(lambda sgl, mp: _mixed_rings(sgl), "mix ring sizes", id="mixed ring sizes"),
    pytest.param(lambda sgl, mp: _mixed_dtypes(sgl), "mix dtypes", id="mixed dtypes"),
    pytest.param(lambda sgl, mp: _no_c128(sgl), "no C128", id="no C128 pools"),
    pytest.param(_no_triton, "Triton cannot run", id="device Triton cannot run on"),
    pytest.param(_unvalidated_triton, "no table validates Triton 3.99",
                 id="a Triton no table validates"),
])
def test_fallback_runs_the_original_and_remembers_the_verdict(sgl, monkeypatch, make, reason):
    sgl.install()
    pool = make(sgl, monkeypatch)
    check(pool, *batch())
    verdict = plan(pool)
    assert verdict.cleanup is None and reason in verdict.reason
    check(pool, *batch(([1, 0], [9, 17], [3, 1])))
    assert plan(pool) is verdict  # not re-examined while the buffers stay the same
    assert sgl.originals[ROLLBACK].calls == 2


def test_capture_without_helper_runs_the_original_and_builds_later(sgl, monkeypatch):
    sgl.install()
    pool = kv_pool(sgl)
    with monkeypatch.context() as capture:  # undoes only this (the fixture's patches stay)
        capture.setattr(rollback, "_capturing", lambda device: True)
        check(pool, *batch())
        assert plan(pool) is None and sgl.originals[ROLLBACK].calls == 1
    check(pool, *batch(([2], [3], [2])))
    assert plan(pool).cleanup is not None and sgl.originals[ROLLBACK].calls == 1


def test_more_drafts_than_the_default_grid(sgl):
    sgl.install()
    pool = kv_pool(sgl)
    num_draft = rollback.MIN_MAX_DRAFT_TOKENS + 2
    check(pool, *batch(([2, 0], [5, 13], [3, num_draft])), num_draft=num_draft)
    assert plan(pool).cleanup.max_num_draft_tokens == num_draft
    assert sgl.originals[ROLLBACK].calls == 0


def test_index_tensors_the_op_rejects_fall_back(sgl, caplog):
    sgl.install()
    pool = kv_pool(sgl)
    idx, seq, acc = batch()
    check(pool, idx, seq, acc.to(torch.int16))  # SGLang's kernel takes int16; ours does not
    assert sgl.originals[ROLLBACK].calls == 1
    assert plan(pool).cleanup is not None  # the helper stays for well-formed calls
    assert any("rejected the inputs" in r.getMessage() for r in caplog.records)
    check(pool, idx, seq, acc)
    assert sgl.originals[ROLLBACK].calls == 1


# ------------------------------------------------------------ CUDA: DSV4-Pro geometry, graphs

PRO_LAYOUT = " ".join(f"C{r}" for r in [128, 128] + [4, 128] * 29 + [4])  # 61 layers, 31 C128
PRO = {"layout": PRO_LAYOUT, "ring": 256, "half": 512, "slots": 64}


def pro_batch(bs, num_draft, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(PRO["slots"], generator=g)[:bs]
    seq = torch.randint(0, 8 * PRO["ring"], (bs,), generator=g)
    acc = torch.randint(1, num_draft + 1, (bs,), generator=g)
    return tuple(t.to(DEVICE) for t in (idx, seq, acc))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_pro_geometry_one_kernel_matches_sglang_loop(sgl, dtype):
    from dsv4spec.bench.common import count_kernels

    sgl.install()
    pool = kv_pool(sgl, dtype, **PRO)
    for seed, bs in enumerate((1, 8, 64)):
        check(pool, *pro_batch(bs, W, seed))
    assert sgl.originals[ROLLBACK].calls == 0 and plan(pool).cleanup.num_states == 31
    idx, seq, acc = pro_batch(8, W, 9)
    assert count_kernels(lambda: pool.clear_unaccepted_c128_draft_states(idx, seq, acc, W)) == 1
    original = sgl.originals[ROLLBACK].__wrapped__
    assert count_kernels(lambda: original(pool, idx, seq, acc, W)) == 31


@pytest.mark.gpu
@pytest.mark.parametrize("built_before_capture", [True, False], ids=["helper", "no helper"])
def test_gpu_hook_captured_in_a_cuda_graph_replays_current_indices(sgl, built_before_capture):
    # SGLang calls the rollback eagerly; a capture must still be safe: with a helper it records
    # the fused launch, without one (nothing may be built while capturing) SGLang's own loop.
    sgl.install()
    pool = kv_pool(sgl, torch.float32, **PRO)
    idx, seq, acc = pro_batch(16, W, 0)
    expected(pool, idx, seq, acc, W, standins.sglang_cleanup_kernel())  # JIT before capture
    if built_before_capture:
        pool.clear_unaccepted_c128_draft_states(idx, seq, acc, W)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pool.clear_unaccepted_c128_draft_states(idx, seq, acc, W)
    assert (plan(pool) is not None) == built_before_capture
    for step in range(1, 4):
        for state in buffers(pool):
            state.copy_(torch.randn_like(state, dtype=torch.float32))
        for static, new in zip((idx, seq, acc), pro_batch(16, W, step)):
            static.copy_(new)
        expect = expected(pool, idx, seq, acc, W, clear_unaccepted_c128_draft_states_reference)
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(buffers(pool), expect, f"replay {step}")
