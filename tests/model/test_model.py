"""The tiny model in float64: every way of feeding the same tokens gives the same logits and state.

Verify of W tokens equals W decodes; a prefill in chunks equals one prefill; a padded batch of
prompts of different lengths equals each prompt alone; the MTP draft's extend equals its decodes;
and the entries compressed incrementally from state rings equal the compressor math
(docs/design.md) over the whole sequence. Positions are chosen so block ends of both compressors
(ratio 16 and the overlapping 4) fall inside the batches.
"""

import copy

import pytest
import torch

from dsv4spec.model import preset
from dsv4spec.model.compressor import compress_rows
from dsv4spec.model.model import Transformer, init_weights
from dsv4spec.model.rope import apply_rope

TOL = dict(rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def model():
    return init_weights(Transformer(preset("tiny")).double(), seed=0).requires_grad_(False)


def tokens(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def extend(model, state, rows, slots, starts):
    """One extend of a padded batch: ``rows`` is a list of 1-D token tensors."""
    n = max(len(r) for r in rows)
    toks = torch.zeros(len(rows), n, dtype=torch.long)
    for b, r in enumerate(rows):
        toks[b, :len(r)] = r
    return model(toks, state, torch.tensor(slots), torch.tensor(starts),
                 torch.tensor([len(r) for r in rows]))


def state_tensors(state, slot):
    out = {}
    for i, (w, rows, ent) in enumerate(zip(state.window, state.rows, state.entries)):
        out[f"window{i}"] = w[slot]
        if rows is not None:
            ring = state.ring_size[state.layer_ratios[i]]
            out[f"rows{i}"] = rows[slot * ring:(slot + 1) * ring]
            out[f"entries{i}"] = ent[slot]
    return out


def assert_states_equal(a, b, slot_a, slot_b=None):
    sa, sb = state_tensors(a, slot_a), state_tensors(b, slot_a if slot_b is None else slot_b)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], **TOL, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("start,W", [(29, 4), (30, 3), (14, 6)])
def test_verify_equals_sequential_decodes(model, start, W):
    prompt, drafts = tokens(start, 1), tokens(W, 2)
    state = model.new_state(num_slots=3, max_seq_len=128, max_num_draft_tokens=8)
    extend(model, state, [prompt], [1], [0])
    seq = copy.deepcopy(state)
    verify_logits, _ = extend(model, state, [drafts], [1], [start])
    for t in range(W):
        logits, _ = extend(model, seq, [drafts[t:t + 1]], [1], [start + t])
        torch.testing.assert_close(verify_logits[0, t], logits[0, 0], **TOL)
    assert_states_equal(state, seq, 1)


def test_chunked_prefill_and_decodes_equal_one_prefill(model):
    seq = tokens(45, 3)
    one = model.new_state(num_slots=2, max_seq_len=128)
    full, _ = extend(model, one, [seq], [0], [0])
    chunked = model.new_state(num_slots=2, max_seq_len=128)
    a, _ = extend(model, chunked, [seq[:20]], [0], [0])
    b, _ = extend(model, chunked, [seq[20:37]], [0], [20])
    decoded = [extend(model, chunked, [seq[p:p + 1]], [0], [p])[0][0] for p in range(37, 45)]
    torch.testing.assert_close(torch.cat((a[0], b[0], *decoded)), full[0], **TOL)
    assert_states_equal(one, chunked, 0)


def test_padded_batch_equals_each_request_alone(model):
    prompts = [tokens(n, 10 + n) for n in (7, 33, 18)]
    batch = model.new_state(num_slots=4, max_seq_len=128)
    logits, _ = extend(model, batch, prompts, [2, 0, 3], [0, 0, 0])
    for b, (slot, p) in enumerate(zip([2, 0, 3], prompts)):
        alone = model.new_state(num_slots=4, max_seq_len=128)
        ref, _ = extend(model, alone, [p], [slot], [0])
        torch.testing.assert_close(logits[b, :len(p)], ref[0], **TOL)
        assert_states_equal(batch, alone, slot)


def test_draft_extend_equals_draft_decodes(model):
    prompt = tokens(30, 4)
    state = model.new_state(num_slots=2, max_seq_len=128, max_num_draft_tokens=8)
    _, hidden = extend(model, state, [prompt], [0], [0])
    nxt = tokens(30, 5)  # the "next tokens" fed to the MTP block at each position
    ext = copy.deepcopy(state)
    slots, lens = torch.tensor([0]), torch.tensor([30])
    logits, _ = model.draft(nxt[None], hidden, ext, slots, torch.tensor([0]), lens)
    for p in range(30):
        step, _ = model.draft(nxt[None, p:p + 1], hidden[:, p:p + 1], state, slots,
                              torch.tensor([p]), torch.tensor([1]))
        torch.testing.assert_close(logits[0, p], step[0, 0], **TOL)
    assert_states_equal(ext, state, 0)


def test_incremental_entries_equal_the_compression_math(model):
    """Entries built step by step from the rings equal the compressor math applied to all rows
    at once."""
    cfg = model.cfg
    captured = {}
    hooks = [layer.attn.compressor.register_forward_pre_hook(
        lambda mod, args, i=i: captured.setdefault(i, []).append(args[0].detach().clone()))
        for i, layer in enumerate(model.layers) if layer.attn.compressor is not None]
    try:
        state = model.new_state(num_slots=1, max_seq_len=128)
        seq = tokens(50, 6)
        extend(model, state, [seq[:21]], [0], [0])
        for p in range(21, 50):
            extend(model, state, [seq[p:p + 1]], [0], [p])
    finally:
        for h in hooks:
            h.remove()
    for i, hs in captured.items():
        comp, r = model.layers[i].attn.compressor, cfg.layer_ratios[i]
        h = torch.cat([x.view(-1, x.shape[-1]) for x in hs])  # positions 0..49 in order
        pos = torch.arange(h.shape[0])
        kv = comp.wkv(h).float().double()
        score = (comp.wgate(h) + comp.ape[pos % r]).float().double()
        nb = h.shape[0] // r
        expected = comp.norm(compress_rows(kv[:nb * r], score[:nb * r], r))
        expected = apply_rope(expected[:, None], torch.arange(nb) * r,
                              model.layers[i].attn.freqs)[:, 0]
        torch.testing.assert_close(state.entries[i][0, :nb], expected, **TOL)


def test_bf16_cast_keeps_fp32_parameters_and_the_fused_hc_head_agrees():
    m = init_weights(Transformer(preset("tiny")), seed=3).requires_grad_(False).cast(torch.bfloat16)
    assert m.hc_head_fn.dtype == m.layers[0].hc_attn_fn.dtype == torch.float32
    assert m.layers[0].attn.compressor.ape.dtype == m.layers[0].attn.attn_sink.dtype
    assert m.layers[0].attn.wq_a.weight.dtype == m.embed.weight.dtype == torch.bfloat16
    prompt = tokens(12, 7)
    outs = {}
    for impl in ("eager", "triton"):  # the Triton kernel runs in the interpreter on CPU
        m.hc_head_impl = impl
        state = m.new_state(num_slots=1, max_seq_len=64)
        outs[impl], _ = extend(m, state, [prompt], [0], [0])
    a, b = outs["triton"].double(), outs["eager"].double()
    assert torch.isfinite(b).all()
    # bf16 activations: hc_head's outputs may round one ulp apart, carried through the head
    assert (a - b).norm() / b.norm() < 1e-2
    assert not torch.equal(outs["eager"], extend(m, m.new_state(1, 64), [tokens(12, 8)], [0],
                                                 [0])[0])


def test_serving_build_on_cpu():
    from dsv4spec.model.build import build_model

    m = build_model("tiny", dtype=torch.bfloat16)
    assert m.embed.weight.dtype == torch.bfloat16 and m.hc_head_fn.dtype == torch.float32
    assert not any(p.requires_grad for p in m.parameters())


def test_rollback_neutralises_rejected_c128_rows_and_outputs_do_not_depend_on_it(model):
    """The rollback contract: rejected drafts' rows become neutral in every ratio-16 ring; the
    next step's outputs are the same with or without the rollback (no rejected row is ever read)."""
    start, W, accept = 29, 4, 2
    state = model.new_state(num_slots=2, max_seq_len=128, max_num_draft_tokens=4)
    extend(model, state, [tokens(start, 1)], [1], [0])
    extend(model, state, [tokens(W, 2)], [1], [start])
    kept = copy.deepcopy(state)
    state.clear_unaccepted_draft_rows(torch.tensor([1]), torch.tensor([start]),
                                      torch.tensor([accept]), W)
    ring = state.ring_size[model.cfg.compress_ratio]
    rejected = {1 * ring + (start + j) % ring for j in range(accept, W)}
    for i, r in enumerate(model.cfg.compress_ratios):
        if r != model.cfg.compress_ratio:
            continue
        rows, before = state.rows[i], kept.rows[i]
        for row in range(rows.shape[0]):
            if row in rejected:
                assert torch.all(rows[row, :rows.shape[1] // 2] == 0)
                assert torch.all(rows[row, rows.shape[1] // 2:] == float("-inf"))
            else:
                assert torch.equal(rows[row], before[row]), (i, row)
    nxt = tokens(3, 9)  # the next step starts at the committed length
    a, _ = extend(model, state, [nxt], [1], [start + accept])
    b, _ = extend(model, kept, [nxt], [1], [start + accept])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
