"""When a compressed entry becomes visible to a query, checked against the rule itself.

Entry ``j`` pools block ``j`` (positions ``j*r .. (j+1)*r - 1``), so a query at position ``p``
may read it iff the block is complete at ``p``: ``j < (p + 1) // r``. The block's last token
already sees it; the token before does not. The model's other tests compare feeding modes
against each other, which agree with each other whatever this rule is, so it is checked here
directly: on the masks, and on the target's logits through the real state rings. Both for the
overlapping ratio 4 (C4) and the non-overlapping ratio 128 (C128), at the first blocks and where
the per-slot rings have wrapped (the window ring of ``sliding_window + max_num_draft_tokens`` rows,
and the compressor rings of two blocks, row ``p % ring``).
"""

import copy

import pytest
import torch

from dsv4spec.model import ModelConfig
from dsv4spec.model.model import Batch, Transformer, init_weights

DRAFTS = 8  # max_num_draft_tokens: speculative, so each compressor ring holds two blocks


def config(ratio: int) -> ModelConfig:
    """One target layer of ``ratio`` (plus the window-only MTP layer), tiny widths."""
    return ModelConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        q_lora_rank=16, o_lora_rank=16, o_groups=2, intermediate_size=32, head_dim=16,
        qk_rope_head_dim=8, sliding_window=8, compress_ratio=128, hc_mult=2,
        hc_sinkhorn_iters=3, compress_ratios=(ratio, 0))


def visible(pos: torch.Tensor, ratio: int, num_entries: int) -> torch.Tensor:
    """``[..., E]``: entry ``j`` visible at ``pos``, counted as complete blocks so far."""
    return torch.arange(num_entries) < ((pos + 1) // ratio)[..., None]


def batches(ratio: int, ring: int, window_ring: int):
    """(name, starts, lengths, n): prefills of the first blocks, and verify / decode batches
    across block ends past both rings' first wrap (several requests at once)."""
    r = ratio
    wrap = max(ring, window_ring)  # the first block end at or past it ends a wrapped block
    j = -(-wrap // r)  # blocks starting at or after the wrap
    end = (j + 1) * r - 1
    return [
        ("prefill", [0], [3 * r + 1], 3 * r + 1),
        ("prefill_ragged", [0, 0], [r, r - 1], r + 1),
        ("verify_wrap", [end - 2, end - 1, end, end + 1], [4, 4, 4, 3], 4),
        ("verify_second_wrap", [end + ring - 3, end + 2 * ring - 2], [4, 2], 4),
        ("decode_wrap", [end - 1, end, end + 1, end + ring], [1, 1, 1, 1], 1),
    ]


@pytest.mark.parametrize("ratio", [4, 128])
def test_entry_mask_is_block_completion(ratio):
    cfg = config(ratio)
    model = Transformer(cfg)
    attn = model.layers[0].attn
    state = model.new_state(num_slots=4, max_seq_len=16 * ratio, max_num_draft_tokens=DRAFTS)
    R, E = state.window_ring, state.entries[0].shape[1]
    ring = state.ring_size[ratio]
    assert ring == 2 * (2 * ratio if ratio == 4 else ratio)  # two blocks of rows
    for name, starts, lengths, n in batches(ratio, ring, R):
        b = len(starts)
        batch = Batch(torch.arange(b), torch.tensor(starts), torch.tensor(lengths), n, 4)
        hidden = attn._hidden_keys(batch, R, E)
        assert hidden.shape == (b, n, 1, R + n + E), name
        seen = ~hidden[:, :, 0, R + n:]  # the entry columns
        expect = visible(batch.pos, ratio, E)
        wrong = (seen != expect).nonzero().tolist()
        assert not wrong, f"{name}: entries seen differ at (request, token, entry) {wrong[:6]}"
        # The rule at each block end the batch reaches: its last token sees it, one earlier not.
        for i in range(b):
            for t in range(lengths[i]):
                p = starts[i] + t
                if (p + 1) % ratio == 0:
                    j = (p + 1) // ratio - 1
                    assert seen[i, t, j], f"{name}: position {p} does not see entry {j}"
                    if t > 0:
                        assert not seen[i, t - 1, j], (
                            f"{name}: position {p - 1} sees entry {j} before its block ends")


def wrapped_block(ratio: int, ring: int) -> int:
    """The first block whose own rows wrap to the start of the two-block ring (C4's also pools
    the previous block's rows, from the ring's end)."""
    return ring // ratio


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("where", ["first", "wrap"])
def test_logits_read_entry_from_its_block_end(ratio, where):
    """Perturb the ring rows that entry ``j`` pools before the step that completes it: the
    target's logits at the block's last position must move, the position before must not (a
    one-layer target: its compressed entries reach the logits only through this layer)."""
    model = init_weights(Transformer(config(ratio)).double(), seed=1).requires_grad_(False)
    state = model.new_state(num_slots=2, max_seq_len=8 * ratio, max_num_draft_tokens=DRAFTS)
    ring = state.ring_size[ratio]
    j = 0 if where == "first" else wrapped_block(ratio, ring)
    end = (j + 1) * ratio - 1  # block j's last position
    start = end - 2  # a verify batch of 4: end - 2, end - 1 (not yet), end, end + 1 (seen)
    seq = torch.randint(0, 64, (end + 2,), generator=torch.Generator().manual_seed(2))
    slot = torch.tensor([1])  # rows of slot 1 start at row `ring`
    model(seq[None, :start], state, slot, torch.tensor([0]), torch.tensor([start]))

    # Rows already in the ring that block j pools (C4: block j-1's positions too).
    first = max(j * ratio - (ratio if ratio == 4 else 0), 0)
    rows = state.rows[0]
    idx = torch.tensor([ring + p % ring for p in range(first, start)])
    if where == "wrap":
        assert start - 1 >= ring  # rows reused by the wrap
    perturbed = copy.deepcopy(state)
    width = rows.shape[1] // 2
    noise = torch.randn(len(idx), width, generator=torch.Generator().manual_seed(3))
    perturbed.rows[0][idx, :width] += 3 * noise.to(rows.dtype)  # the kv half

    def run(st, begin, length):
        return model(seq[None, begin:begin + length], st, slot, torch.tensor([begin]),
                     torch.tensor([length]))[0][0]

    # Verify of 4 across the block end, and the same positions as separate decodes.
    for mode in ("verify", "decode"):
        a, b = copy.deepcopy(state), copy.deepcopy(perturbed)
        if mode == "verify":
            base, moved = run(a, start, 4), run(b, start, 4)
        else:
            base = torch.stack([run(a, start + t, 1)[0] for t in range(4)])
            moved = torch.stack([run(b, start + t, 1)[0] for t in range(4)])
        for t in range(4):
            p = start + t
            diff = (moved[t] - base[t]).abs().max().item()
            if p < end:
                assert diff == 0, f"{mode}: position {p} reads entry {j} (block ends at {end})"
            else:
                assert diff > 1e-6, (
                    f"{mode}: position {p} does not read entry {j} (block ends at {end})")
