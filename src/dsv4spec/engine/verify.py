"""Verify + greedy acceptance + C128 rollback as ONE device-side function (CUDA-graph capturable).

SGLang runs acceptance and the per-layer rollback eagerly after its verify graph. Here the three
are tensor code with no host sync, so a runner can capture them in the verify graph. Rows of a
batch padded to a graph bucket use the scratch slot, ``lengths = 0`` and get ``accept = W``, so
they write nothing that any request reads and the rollback clears nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4spec.cache.model_state import ModelState
from dsv4spec.engine.graphs import BUCKETS, BucketRunner
from dsv4spec.model.model import Transformer


@dataclass
class VerifyResult:
    accept_lens: torch.Tensor  # [B] in [1, W]; W for padding rows
    bonus: torch.Tensor  # [B] the target's token after the accepted ones
    greedy: torch.Tensor  # [B, W] the target's argmax after each verified token
    hidden: torch.Tensor  # [B, W, hc * H] pre-hc_head hiddens (the draft-extend's input)


def greedy_accept(tokens: torch.Tensor, greedy: torch.Tensor, valid: torch.Tensor
                  ) -> torch.Tensor:
    """``accept_lens [B]``: 1 + the leading drafts ``tokens[:, 1:]`` equal to the target's
    ``greedy[:, :-1]``; ``W`` where ``valid`` is False (padding rows)."""
    W = tokens.shape[1]
    match = (tokens[:, 1:] == greedy[:, :-1]).long()
    accept = 1 + match.cumprod(-1).sum(-1)
    return torch.where(valid, accept, W)


def verify_accept_rollback(
    model: Transformer, state: ModelState, tokens: torch.Tensor, slots: torch.Tensor,
    starts: torch.Tensor, valid: torch.Tensor, *, rollback: bool = True,
) -> VerifyResult:
    """Verify ``tokens [B, W]`` (verified-in token, then ``W - 1`` drafts) at ``starts``, accept
    greedily and roll back the rejected drafts' C128 rows, all on the device.

    ``valid [B]`` marks real rows; padding rows should carry the scratch slot.
    """
    W = tokens.shape[1]
    lengths = torch.where(valid, W, 0)
    logits, hidden = model(tokens, state, slots, starts, lengths)
    greedy = logits.argmax(-1)
    accept = greedy_accept(tokens, greedy, valid)
    if rollback:
        state.clear_unaccepted_draft_rows(slots, starts, accept, W)
    bonus = greedy.gather(1, (accept - 1)[:, None])[:, 0]
    return VerifyResult(accept, bonus, greedy, hidden)


class VerifyRunner:
    """:func:`verify_accept_rollback` per batch-size bucket (a :class:`BucketRunner`), rows
    padded to the bucket with the scratch slot and ``valid = False``; with ``graphs=True`` each
    bucket's step is one CUDA graph (the rollback inside it when ``rollback=True``)."""

    def __init__(self, model: Transformer, state: ModelState, num_draft_tokens: int, *,
                 rollback: bool = True, buckets: tuple[int, ...] = BUCKETS,
                 graphs: bool = False) -> None:
        self.model, self.state, self.W, self.rollback = model, state, num_draft_tokens, rollback
        long = torch.long
        self.runner = BucketRunner(self._step, {
            "tokens": ((num_draft_tokens,), long, 0), "slots": ((), long, state.num_slots),
            "starts": ((), long, 0), "valid": ((), torch.bool, False)},
            buckets=buckets, max_batch=state.num_slots, device=model.embed.weight.device,
            graphs=graphs)

    def _step(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        res = verify_accept_rollback(self.model, self.state, **inputs, rollback=self.rollback)
        return res.accept_lens, res.bonus, res.greedy, res.hidden

    def __call__(self, tokens: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor
                 ) -> VerifyResult:
        valid = torch.ones(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        return VerifyResult(*self.runner(tokens=tokens, slots=slots, starts=starts, valid=valid))
