"""A model forward and its MTP draft over random tokens, as several tests run them."""

import torch


def forward_and_draft(model, seed: int, bs: int = 2, n: int = 9):
    """Target logits and draft logits of ``bs`` fresh requests of ``n`` random tokens."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, model.cfg.vocab_size, (bs, n), generator=g)
    state = model.new_state(num_slots=bs, max_seq_len=32)
    slots, starts, lengths = torch.arange(bs), torch.zeros(bs, dtype=torch.long), torch.full(
        (bs,), n)
    logits, hidden = model(toks, state, slots, starts, lengths)
    draft_logits, _ = model.draft(toks, hidden, state, slots, starts, lengths)
    return logits, draft_logits
