"""The MTP draft phases as device-side steps (CUDA-graph capturable), as SGLang 0.5.23 runs them.

``draft_extend``: the MTP block over the ``W`` verified positions of each request (fixed width,
accepted or not), fed the target's pre-hc_head hiddens; the first draft is the argmax at row
``accept_len - 1``. ``draft_chain``: ``W - 2`` MTP decodes (one token per request each), each fed
the previous draft and that step's own hidden, completing the chain of ``W - 1`` drafts. Padding
rows (``valid`` False) carry the scratch slot and write nothing anyone reads.
"""

from __future__ import annotations

import torch

from dsv4spec.cache.model_state import ModelState
from dsv4spec.engine.graphs import BUCKETS, BucketRunner
from dsv4spec.model.model import Transformer


def _rows_at(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[b, rows[b]]`` for ``x [B, n, ...]`` without a host sync."""
    return x[torch.arange(x.shape[0], device=x.device), rows]


def draft_extend(model: Transformer, state: ModelState, tokens: torch.Tensor,
                 hidden: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
                 lengths: torch.Tensor, rows_at: torch.Tensor, *, hc_head_impl: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """MTP extend of ``tokens [B, n]`` (position ``starts + i`` takes the token at the next
    position) over ``lengths`` rows; returns the first draft ``[B]`` (argmax at ``rows_at``) and
    the MTP hidden there ``[B, 1, hc * H]`` (the chain's input)."""
    logits, h = model.draft(tokens, hidden, state, slots, starts, lengths,
                            hc_head_impl=hc_head_impl)
    return _rows_at(logits, rows_at).argmax(-1), _rows_at(h, rows_at)[:, None]


def draft_chain(model: Transformer, state: ModelState, first: torch.Tensor,
                hidden: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor,
                valid: torch.Tensor, num_draft_tokens: int, *, hc_head_impl: str | None = None
                ) -> torch.Tensor:
    """``W - 2`` MTP decodes from the first draft (its input at position ``starts``); returns the
    ``[B, W - 1]`` drafts."""
    drafts = [first]
    lengths = valid.long()
    for k in range(num_draft_tokens - 2):
        logits, hidden = model.draft(drafts[-1][:, None], hidden, state, slots, starts + k,
                                     lengths, hc_head_impl=hc_head_impl)
        drafts.append(logits[:, 0].argmax(-1))
    return torch.stack(drafts, 1)


class DraftRunner:
    """Both draft phases per batch-size bucket, each its own :class:`BucketRunner` (so each can
    be captured and timed on its own, as SGLang captures them). ``hc_head_impl``: the MTP
    block's hc_head (``None``: the model's)."""

    def __init__(self, model: Transformer, state: ModelState, num_draft_tokens: int, *,
                 buckets: tuple[int, ...] = BUCKETS, graphs: bool = False,
                 hc_head_impl: str | None = None) -> None:
        self.model, self.state, self.W = model, state, num_draft_tokens
        self.hc_head_impl = hc_head_impl
        cfg, long = model.cfg, torch.long
        width = cfg.hc_mult * cfg.hidden_size
        dtype = model.embed.weight.dtype
        common = dict(buckets=buckets, max_batch=state.num_slots,
                      device=model.embed.weight.device, graphs=graphs)
        scratch = state.num_slots
        W = num_draft_tokens
        self.extend = BucketRunner(self._extend, {
            "tokens": ((W,), long, 0), "hidden": ((W, width), dtype, 0),
            "slots": ((), long, scratch), "starts": ((), long, 0), "lengths": ((), long, 0),
            "rows_at": ((), long, 0)}, **common)
        self.chain = BucketRunner(self._chain, {
            "first": ((), long, 0), "hidden": ((1, width), dtype, 0),
            "slots": ((), long, scratch), "starts": ((), long, 0),
            "valid": ((), torch.bool, False)}, **common)

    def _extend(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return draft_extend(self.model, self.state, **inputs, hc_head_impl=self.hc_head_impl)

    def _chain(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (draft_chain(self.model, self.state, **inputs, num_draft_tokens=self.W,
                            hc_head_impl=self.hc_head_impl),)
