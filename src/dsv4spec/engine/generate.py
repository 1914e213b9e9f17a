"""Batched greedy generation, plain and with MTP chain speculative decoding (eager, any device).

The speculative step mirrors SGLang 0.5.23's DSV4 step with ``W = num_draft_tokens``:
verify ``[t, d_1 .. d_{W-1}]`` with the target, greedy acceptance (``accept_len`` in ``[1, W]``
counts the verified-in token), the C128 rollback of the rejected positions, then the MTP
draft-extend over the ``W`` verified positions (fixed width) whose row ``accept_len - 1`` gives the
next first draft, and ``W - 2`` MTP decodes for the rest of the chain. Emitted tokens are always
the target's greedy choices, so the output equals plain greedy decoding token for token.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from dsv4spec.engine.verify import BUCKETS, VerifyRunner
from dsv4spec.model.model import Transformer

ROLLBACKS = ("fused", "loop", "none")


@dataclass
class Request:
    """One generation: its prompt, limits, and what the engine has produced for it."""

    prompt: list[int]
    max_new_tokens: int
    eos_token_id: int | None = None
    output: list[int] = field(default_factory=list)
    accept_lens: list[int] = field(default_factory=list)
    slot: int = -1
    length: int = 0  # tokens whose target state is written and committed
    next_token: int = -1  # the verified-in token at position `length`, emitted already
    drafts: list[int] = field(default_factory=list)
    done: bool = False

    def emit(self, tokens: list[int]) -> None:
        for t in tokens:
            if self.done:
                return
            self.output.append(t)
            if len(self.output) >= self.max_new_tokens or t == self.eos_token_id:
                self.done = True


def _pad(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    toks = torch.zeros(len(rows), n, dtype=torch.long, device=device)
    for b, r in enumerate(rows):
        toks[b, :len(r)] = torch.tensor(r, dtype=torch.long)
    return toks, torch.tensor([len(r) for r in rows], device=device)


class Engine:
    """Greedy generation over a :class:`Transformer` with per-request slots.

    ``num_draft_tokens`` ``W`` >= 2 turns on speculative decoding (0 or 1: plain greedy).
    ``rollback`` selects the C128 rollback after each verify: ``"fused"`` (one launch),
    ``"loop"`` (one launch per layer) or ``"none"`` (outputs do not change; state does).
    The verify, the greedy acceptance and the fused rollback run as one device-side step per
    batch-size bucket (``buckets``, rows padded), captured in CUDA graphs with
    ``cuda_graphs=True``; the per-layer loop runs after it. ``draft_override`` and ``on_step``
    are test hooks (forced acceptance, per-step checks).
    """

    def __init__(self, model: Transformer, *, num_slots: int = 8, max_seq_len: int = 1024,
                 num_draft_tokens: int = 0, rollback: str = "fused", draft_override=None,
                 on_step=None, buckets: tuple[int, ...] = BUCKETS, cuda_graphs: bool = False
                 ) -> None:
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {ROLLBACKS}, got {rollback!r}")
        if num_draft_tokens >= 2 and not model.mtp:
            raise ValueError("num_draft_tokens >= 2 needs a model with an MTP block")
        self.model = model
        self.W = num_draft_tokens if num_draft_tokens >= 2 else 0
        self.rollback = rollback
        self.device = model.embed.weight.device
        self.state = model.new_state(num_slots, max_seq_len, max(self.W, 2), self.device)
        self.state.c128.cleanup_impl = "loop" if rollback == "loop" else "fused"
        self.free = list(range(num_slots))
        # Forced acceptance for tests: draft_override(request) -> the W - 1 drafts to verify
        # (e.g. the target's own greedy continuation with mismatches injected). on_step(engine,
        # requests) runs after every step (state checks).
        self.draft_override = draft_override
        self.on_step = on_step
        self.phase_seconds: dict[str, float] = defaultdict(float)
        # verify + greedy acceptance (+ the fused rollback, inside) per batch-size bucket
        self.verify = VerifyRunner(model, self.state, max(self.W, 2),
                                   rollback=rollback == "fused", buckets=buckets,
                                   graphs=cuda_graphs) if self.W else None

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Wall time per phase, the device synchronised at both ends (so phases add up)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.phase_seconds[name] += time.perf_counter() - start

    # ------------------------------------------------------------------ phases
    def _check_room(self, rows, starts) -> None:
        end = max(s + len(r) for r, s in zip(rows, starts))
        if end > self.state.max_seq_len:
            raise ValueError(f"a request reaches position {end}, past max_seq_len="
                             f"{self.state.max_seq_len} of the engine's state")

    def _target(self, reqs, rows, starts):
        self._check_room(rows, starts)
        toks, lengths = _pad(rows, self.device)
        slots = torch.tensor([r.slot for r in reqs], device=self.device)
        return self.model(toks, self.state, slots, torch.tensor(starts, device=self.device),
                          lengths), slots, lengths

    def _draft(self, reqs, rows, hidden, starts, lengths):
        self._check_room(rows, starts)
        toks, _ = _pad(rows, self.device)
        slots = torch.tensor([r.slot for r in reqs], device=self.device)
        return self.model.draft(toks, hidden, self.state, slots,
                                torch.tensor(starts, device=self.device), lengths)

    def _draft_chain(self, reqs, logits, hidden, rows_at):
        """First drafts from ``logits[b, rows_at[b]]``, then ``W - 2`` MTP decodes: the k-th
        at position ``length + k``, fed the previous draft and that draft step's hidden."""
        b_idx = torch.arange(len(reqs), device=self.device)
        at = torch.tensor(rows_at, device=self.device)
        first = logits[b_idx, at].argmax(-1)
        h = hidden[b_idx, at][:, None]
        for r, d in zip(reqs, first.tolist()):
            r.drafts = [d]
        ones = torch.ones(len(reqs), dtype=torch.long, device=self.device)
        with self._phase("draft-decode"):
            for k in range(self.W - 2):
                starts = [r.length + k for r in reqs]  # the position of the draft's input
                step_logits, step_hidden = self._draft(reqs, [[r.drafts[-1]] for r in reqs],
                                                       h, starts, ones)
                h = step_hidden
                for r, d in zip(reqs, step_logits[:, 0].argmax(-1).tolist()):
                    r.drafts.append(d)
        if self.draft_override is not None:
            for r in reqs:
                r.drafts = list(self.draft_override(r))

    def admit(self, reqs: list[Request]) -> None:
        """Prefill new requests (slots reset), emit their first token, start their drafts."""
        for r in reqs:
            if not self.free:
                raise RuntimeError("no free slot")
            r.slot = self.free.pop(0)
            self.state.reset_slot(r.slot)
        with self._phase("prefill"):
            (logits, hidden), _, lengths = self._target(reqs, [r.prompt for r in reqs],
                                                        [0] * len(reqs))
        last = [len(r.prompt) - 1 for r in reqs]
        for b, r in enumerate(reqs):
            r.length = len(r.prompt)
            r.next_token = int(logits[b, last[b]].argmax())
            r.emit([r.next_token])
        if self.W:  # the MTP over the prompt: position p takes token p + 1
            nxt = [r.prompt[1:] + [r.next_token] for r in reqs]
            with self._phase("draft-extend"):
                d_logits, d_hidden = self._draft(reqs, nxt, hidden, [0] * len(reqs), lengths)
            self._draft_chain(reqs, d_logits, d_hidden, last)

    def decode_step(self, reqs: list[Request]) -> None:
        """Plain greedy: one target token per request."""
        with self._phase("decode"):
            (logits, _), _, _ = self._target(reqs, [[r.next_token] for r in reqs],
                                             [r.length for r in reqs])
        for b, r in enumerate(reqs):
            r.length += 1
            r.next_token = int(logits[b, 0].argmax())
            r.emit([r.next_token])

    def speculative_step(self, reqs: list[Request]) -> None:
        """Verify, accept, roll back, draft-extend, draft decodes (SGLang's order)."""
        W = self.W
        starts = [r.length for r in reqs]
        rows = [[r.next_token] + r.drafts for r in reqs]
        self._check_room(rows, starts)
        tokens = torch.tensor(rows, device=self.device)
        slots = torch.tensor([r.slot for r in reqs], device=self.device)
        starts_t = torch.tensor(starts, device=self.device)
        with self._phase("verify"):  # + acceptance, + the fused rollback
            res = self.verify(tokens, slots, starts_t)
            accept, bonuses = res.accept_lens.tolist(), res.bonus.tolist()
        if self.rollback == "loop":
            with self._phase("rollback"):
                self.state.clear_unaccepted_draft_rows(slots, starts_t, res.accept_lens, W)
        hidden = res.hidden
        lengths = torch.full((len(reqs),), W, device=self.device)
        committed = []
        for b, r in enumerate(reqs):
            a = accept[b]
            seq = [r.next_token] + r.drafts[:a - 1] + [bonuses[b]]  # positions L .. L + a
            committed.append(seq)
            r.accept_lens.append(a)
            r.emit(seq[1:])
        # Draft-extend over the W verified positions, fixed width: position L + i takes the
        # token at L + i + 1 (committed for i < a; anything beyond, the rows are not used).
        nxt = [(seq[1:] + [seq[-1]] * W)[:W] for seq in committed]
        with self._phase("draft-extend"):
            d_logits, d_hidden = self._draft(reqs, nxt, hidden, starts, lengths)
        for b, r in enumerate(reqs):
            r.length += accept[b]
            r.next_token = committed[b][-1]
        self._draft_chain(reqs, d_logits, d_hidden, [a - 1 for a in accept])

    def release(self, r: Request) -> None:
        self.state.reset_slot(r.slot)
        self.free.append(r.slot)

    # ------------------------------------------------------------------ loop
    @torch.no_grad()
    def generate(self, requests: list[Request], *, join_after: dict[int, list[Request]] | None
                 = None) -> list[Request]:
        """Run ``requests`` to completion; ``join_after[k]`` joins after step ``k``."""
        join_after = dict(join_after or {})
        active: list[Request] = []
        pending = list(requests)
        step = 0
        while pending or active or join_after:
            room = len(self.free)
            if pending and room:
                new, pending = pending[:room], pending[room:]
                self.admit(new)
                active += new
            for r in [r for r in active if r.done]:
                self.release(r)
                active.remove(r)
            if active:
                (self.speculative_step if self.W else self.decode_step)(active)
                if self.on_step is not None:
                    self.on_step(self, active)
            for r in [r for r in active if r.done]:
                self.release(r)
                active.remove(r)
            pending += join_after.pop(step, [])
            step += 1
        return requests
