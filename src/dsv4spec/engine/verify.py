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


# SGLang's batch-size buckets with speculation on
BUCKETS = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8))


class VerifyRunner:
    """:func:`verify_accept_rollback` per batch-size bucket, rows padded to the bucket.

    With ``graphs=True`` (CUDA) each bucket's step is captured once in a CUDA graph, warmed up
    and captured under ``capture_mode()``, over static input buffers; a call copies its inputs
    into the buffers' prefix, pads the rest (scratch slot, ``valid`` False) and replays. Without
    graphs the same padded step runs eagerly (what the CPU tests exercise).
    """

    def __init__(self, model: Transformer, state: ModelState, num_draft_tokens: int, *,
                 rollback: bool = True, buckets: tuple[int, ...] = BUCKETS,
                 graphs: bool = False) -> None:
        self.model, self.state, self.W = model, state, num_draft_tokens
        self.rollback, self.graphs = rollback, graphs
        self.buckets = tuple(sorted(b for b in buckets if b <= state.num_slots)) or (
            state.num_slots,)
        device = model.embed.weight.device
        top = self.buckets[-1]
        self.tokens = torch.zeros(top, num_draft_tokens, dtype=torch.long, device=device)
        self.slots = torch.full((top,), state.num_slots, dtype=torch.long, device=device)
        self.starts = torch.zeros(top, dtype=torch.long, device=device)
        self.valid = torch.zeros(top, dtype=torch.bool, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, VerifyResult]] = {}

    def bucket(self, batch: int) -> int:
        for b in self.buckets:
            if b >= batch:
                return b
        raise ValueError(f"batch {batch} exceeds the largest bucket {self.buckets[-1]}")

    def _step(self, n: int) -> VerifyResult:
        return verify_accept_rollback(self.model, self.state, self.tokens[:n], self.slots[:n],
                                      self.starts[:n], self.valid[:n], rollback=self.rollback)

    def _capture(self, n: int) -> tuple[torch.cuda.CUDAGraph, VerifyResult]:
        from dsv4spec.capture import capture_mode

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), capture_mode():
            for _ in range(2):  # compile the captured functions before capture
                self._step(n)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with capture_mode(), torch.cuda.graph(graph):
            out = self._step(n)
        return graph, out

    def __call__(self, tokens: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor
                 ) -> VerifyResult:
        B = tokens.shape[0]
        n = self.bucket(B)
        self.tokens[:B].copy_(tokens)
        self.slots[:B].copy_(slots)
        self.starts[:B].copy_(starts)
        self.valid[:B] = True
        self.tokens[B:n] = 0
        self.slots[B:n] = self.state.num_slots  # padding rows: the scratch slot
        self.starts[B:n] = 0
        self.valid[B:n] = False
        if not self.graphs:
            out = self._step(n)
        else:
            if n not in self._graphs:
                self._graphs[n] = self._capture(n)
            graph, out = self._graphs[n]
            graph.replay()
        return VerifyResult(out.accept_lens[:B], out.bonus[:B], out.greedy[:B], out.hidden[:B])
