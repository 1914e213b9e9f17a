"""The rollback hook grows its fused helper when a call brings more drafts than it was built for.

The helper's grid is sized at build time (``max(MIN_MAX_DRAFT_TOKENS, num_draft_tokens)``), so a
server that first verifies few drafts and later more must get a rebuilt helper, not SGLang's
per-layer loop for every later step. Checked on the public behaviour: the original is never
called, the helper's maximum grows, and the rows are cleared as the contract and SGLang's own
kernel clear them (every buffer compared bit for bit).
"""

import torch

from dsv4spec.integrations.sglang import rollback
from dsv4spec.ops import clear_unaccepted_c128_draft_states_reference

from . import standins
from .conftest import ROLLBACK
from .standins import DEVICE, CompressStatePool
from .test_rollback import buffers, expected

# A ring longer than the largest draft count here, so every rejected row is a distinct row.
RING, HALF, SLOTS = 2 * (rollback.MIN_MAX_DRAFT_TOKENS + 4), 4, 3
ROWS = SLOTS * RING + RING + 1  # request rings, the spare ring, the sentinel row
GROWN = rollback.MIN_MAX_DRAFT_TOKENS + 3


def kv_pool(sgl):
    """C0, C128, C4, C128: the C4 buffer must stay untouched, the C128 ones cleared."""
    pools = []
    for i, ratio in enumerate((0, 128, 4, 128)):
        if not ratio:
            pools.append(None)
            continue
        g = torch.Generator().manual_seed(i)
        state = torch.randn(ROWS, 2 * HALF, generator=g).to(DEVICE)  # finite poison everywhere
        pools.append(CompressStatePool(ratio, RING, state))
    return sgl.pool.DeepSeekV4TokenToKVPool(pools)


def hooked_call(pool, rows, num_draft):
    """One call of the hooked method; every buffer must equal the reference's and SGLang's."""
    idx, seq, acc = (torch.tensor(r, device=DEVICE) for r in rows)
    before = [t.clone() for t in buffers(pool)]
    ref = expected(pool, idx, seq, acc, num_draft, clear_unaccepted_c128_draft_states_reference)
    sgl_kernel = expected(pool, idx, seq, acc, num_draft, standins.sglang_cleanup_kernel())
    pool.clear_unaccepted_c128_draft_states(idx, seq, acc, num_draft)
    for i, (a, r, s) in enumerate(zip(buffers(pool), ref, sgl_kernel)):
        assert torch.equal(a.view(torch.int32), r.view(torch.int32)), f"buffer {i} vs reference"
        assert torch.equal(a.view(torch.int32), s.view(torch.int32)), f"buffer {i} vs SGLang"
    return before


def cleared_rows(before, after):
    return sorted({int(r) for r in (before.view(torch.int32) != after.view(torch.int32))
                   .any(-1).nonzero().flatten()})


def test_more_drafts_than_the_built_helper_rebuilds_it(sgl):
    sgl.install()
    pool = kv_pool(sgl)
    original = sgl.originals[ROLLBACK]

    hooked_call(pool, ([2, 0], [5, 13], [1, 4]), num_draft=4)
    first = getattr(pool, rollback.CACHE_ATTR).cleanup
    assert first is not None and original.calls == 0
    assert first.max_num_draft_tokens == rollback.MIN_MAX_DRAFT_TOKENS < GROWN

    # Slot 1 accepts 1 of GROWN: positions 41 .. 40 + GROWN - 1 rejected, past the old grid.
    seq = 40
    before = hooked_call(pool, ([1, 2], [seq, 3], [1, GROWN]), num_draft=GROWN)
    assert original.calls == 0, "more drafts than the helper's grid fell back to SGLang's loop"
    grown = getattr(pool, rollback.CACHE_ATTR).cleanup
    assert grown is not None and grown.max_num_draft_tokens >= GROWN
    rows = sorted(RING + p % RING for p in range(seq + 1, seq + GROWN))
    assert len(rows) == GROWN - 1 > rollback.MIN_MAX_DRAFT_TOKENS
    after = buffers(pool)
    assert cleared_rows(before[0], after[0]) == rows
    assert cleared_rows(before[2], after[2]) == rows
    assert cleared_rows(before[1], after[1]) == []  # the C4 buffer

    # Fewer drafts again: the grown helper serves them as it is.
    hooked_call(pool, ([0], [7], [2]), num_draft=4)
    assert getattr(pool, rollback.CACHE_ATTR).cleanup is grown and original.calls == 0
