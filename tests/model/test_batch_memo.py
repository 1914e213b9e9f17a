"""Batch-only quantities (rope tables, compressor index math) are built once per forward and
shared by every layer of a kind, and never carried into the next forward."""

import torch

from dsv4spec.model import model as model_module
from dsv4spec.model import preset
from dsv4spec.model.model import Transformer, init_weights


def counting(monkeypatch, name):
    calls = []
    fn = getattr(model_module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    monkeypatch.setattr(model_module, name, wrapper)
    return calls


def test_rope_tables_and_block_index_are_built_once_per_forward_and_kind(monkeypatch):
    cfg = preset("tiny")
    m = init_weights(Transformer(cfg), seed=0).requires_grad_(False)
    ratios = cfg.layer_ratios
    assert len(ratios) > len(set(ratios)) and all(ratios)  # layers share kinds
    tables, blocks = counting(monkeypatch, "rope_table"), counting(monkeypatch, "block_index")
    state = m.new_state(num_slots=2, max_seq_len=64, max_num_draft_tokens=4)
    slots, toks = torch.tensor([0, 1]), torch.randint(0, 256, (2, 4))
    for step in range(2):  # a new Batch per forward: built again, not reused
        m(toks, state, slots, torch.tensor([4 * step] * 2), torch.tensor([4, 3]))
        # one table for the attention's rope kind, one per ratio for the entries' positions
        assert len(tables) == (1 + len(set(ratios))) * (step + 1)
        assert len(blocks) == len(set(ratios)) * (step + 1)
    tables.clear()
    _, hidden = m(toks, state, slots, torch.tensor([8, 8]), torch.tensor([4, 4]))
    tables.clear()
    m.draft(toks, hidden, state, slots, torch.tensor([8, 8]), torch.tensor([4, 4]))
    assert len(tables) == 1  # the MTP layer: window-only
