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
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from dsv4spec.engine.draft import DraftRunner, draft_extend
from dsv4spec.engine.graphs import BUCKETS, BucketRunner
from dsv4spec.engine.verify import VerifyRunner
from dsv4spec.model.model import Transformer
from dsv4spec.ops.hc_head import IMPLS as HC_HEAD_IMPLS

ROLLBACKS = ("fused", "loop", "none")
# The widest speculative step: W = 8 fills one block of the overlapping (ratio-4) compressor's
# ring, which holds two blocks under speculation (SGLang's 16 rows), and is the C128 rollback's
# default max_num_draft_tokens; the engine's tests cover W = 2..8.
MAX_NUM_DRAFT_TOKENS = 8
# Prompt tokens per request per prefill forward: the attention scores of a chunk are
# chunk x (window + chunk + entries), so a long prompt no longer holds its square at once.
PREFILL_CHUNK = 512
# Engine.measure: the first prefill chunk it times, in tokens, and the time under which it times
# one four times larger next (up to the engine's chunk): a big model on a CPU is timed on a small
# chunk, where one whole chunk could take minutes, a small or fast one on a whole chunk.
PROBE_TOKENS = 16
PROBE_S = 0.25


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

    ``num_draft_tokens`` ``W`` in ``[2, MAX_NUM_DRAFT_TOKENS]`` turns on speculative decoding (0 or
    1: plain greedy).
    ``rollback`` selects the C128 rollback after each verify: ``"fused"`` (one launch),
    ``"loop"`` (one launch per layer) or ``"none"`` (outputs do not change; state does), run
    inside the device-side verify step (``rollback_in_verify=True``, so inside its graph) or after
    it (SGLang's arrangement: the loop, eagerly, after the verify graph). The verify with greedy
    acceptance, the draft-extend and the draft decode chain each run per batch-size bucket
    (``buckets``, rows padded), captured in CUDA graphs with ``cuda_graphs=True``.
    ``draft_hc_head_impl`` picks the MTP block's hc_head (``None``: the model's).
    ``prefill_chunk``: prompt tokens per request in one prefill forward (:meth:`admit`).
    ``draft_override`` and ``on_step`` are test hooks (forced acceptance, per-step checks).
    """

    def __init__(self, model: Transformer, *, num_slots: int = 8, max_seq_len: int = 1024,
                 num_draft_tokens: int = 0, rollback: str = "fused",
                 rollback_in_verify: bool = True, draft_hc_head_impl: str | None = None,
                 draft_override=None, on_step=None, buckets: tuple[int, ...] = BUCKETS,
                 cuda_graphs: bool = False, prefill_chunk: int = PREFILL_CHUNK) -> None:
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback must be one of {ROLLBACKS}, got {rollback!r}")
        if not 0 <= num_draft_tokens <= MAX_NUM_DRAFT_TOKENS:
            raise ValueError(f"num_draft_tokens must lie in [0, {MAX_NUM_DRAFT_TOKENS}] (0 or 1: "
                             f"plain greedy), got {num_draft_tokens}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        if num_draft_tokens >= 2 and not model.mtp:
            raise ValueError("num_draft_tokens >= 2 needs a model with an MTP block")
        self.model = model
        self.W = num_draft_tokens if num_draft_tokens >= 2 else 0
        self.rollback, self.rollback_in_verify = rollback, rollback_in_verify
        if draft_hc_head_impl is not None and draft_hc_head_impl not in HC_HEAD_IMPLS:
            raise ValueError(f"draft_hc_head_impl must be None or one of {HC_HEAD_IMPLS}, got "
                             f"{draft_hc_head_impl!r}")
        self.draft_hc_head_impl = draft_hc_head_impl
        self.device = model.embed.weight.device
        self.state = model.new_state(num_slots, max_seq_len, max(self.W, 2), self.device)
        self.state.c128.cleanup_impl = "loop" if rollback == "loop" else "fused"
        self.free = list(range(num_slots))
        # Forced acceptance for tests: draft_override(request) -> the W - 1 drafts to verify
        # (e.g. the target's own greedy continuation with mismatches injected). on_step(engine,
        # requests) runs after every step (state checks).
        self.draft_override = draft_override
        self.on_step = on_step
        self.on_prefill = None  # on_prefill(engine, prompt tokens prefilled so far): progress
        self.phase_walls: dict[str, list[float]] = defaultdict(list)
        self.phase_events: dict[str, list] = defaultdict(list)
        self.verify = self.drafts = None
        long = torch.long
        self.decoder = BucketRunner(self._decode, {
            "tokens": ((), long, 0), "slots": ((), long, self.state.num_slots),
            "starts": ((), long, 0), "valid": ((), torch.bool, False)},
            buckets=buckets, max_batch=num_slots, device=self.device, graphs=cuda_graphs)
        if self.W:
            inside = rollback != "none" and rollback_in_verify
            self.verify = VerifyRunner(model, self.state, self.W, rollback=inside,
                                       buckets=buckets, graphs=cuda_graphs)
            self.drafts = DraftRunner(model, self.state, self.W, buckets=buckets,
                                      graphs=cuda_graphs, hc_head_impl=draft_hc_head_impl)

    @contextlib.contextmanager
    def _phase(self, name: str):
        """Wall time per call of a phase (``phase_walls``), the device synchronised at both ends
        (so phases add up); on CUDA also events at the phase's start and end (``phase_events``)."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        start = time.perf_counter()
        yield
        if cuda:
            events[1].record()
            torch.cuda.synchronize()
            self.phase_events[name].append(events)
        self.phase_walls[name].append(time.perf_counter() - start)

    @property
    def phase_seconds(self) -> dict[str, float]:
        """Total wall time per phase."""
        return {name: sum(walls) for name, walls in self.phase_walls.items()}

    # ------------------------------------------------------------------ phases
    def _check_room(self, end: int) -> None:
        """``end``: one past the last position a call writes (checked on the host: no sync)."""
        if end > self.state.max_seq_len:
            raise ValueError(f"a request reaches position {end}, past max_seq_len="
                             f"{self.state.max_seq_len} of the engine's state")

    def _target(self, reqs, rows, starts):
        end = max(s + len(r) for r, s in zip(rows, starts))
        self._check_room(end)
        toks, lengths = _pad(rows, self.device)
        slots = torch.tensor([r.slot for r in reqs], device=self.device)
        return self.model(toks, self.state, slots, torch.tensor(starts, device=self.device),
                          lengths, max_end=end), slots, lengths

    def _slots(self, reqs) -> torch.Tensor:
        return torch.tensor([r.slot for r in reqs], device=self.device)

    def _draft_chain(self, reqs, first, hidden):
        """``W - 2`` MTP decodes after the first drafts ``first [B]`` (the k-th at position
        ``length + k``, fed the previous draft and that draft step's hidden)."""
        self._check_room(max(r.length for r in reqs) + self.W - 1)
        with self._phase("draft-decode"):
            starts = torch.tensor([r.length for r in reqs], device=self.device)
            valid = torch.ones(len(reqs), dtype=torch.bool, device=self.device)
            (drafts,) = self.drafts.chain(first=first, hidden=hidden, slots=self._slots(reqs),
                                          starts=starts, valid=valid)
            drafts = drafts.tolist()
        for r, d in zip(reqs, drafts):
            r.drafts = d
        if self.draft_override is not None:
            for r in reqs:
                r.drafts = list(self.draft_override(r))

    def admit(self, reqs: list[Request]) -> None:
        """Prefill new requests (slots reset) in chunks of ``prefill_chunk`` tokens each, emit
        their first token, start their drafts. Each chunk extends the state the previous one
        left (as a decode step does), so the output equals one prefill of the whole prompt while
        the attention scores held at once shrink from the prompt's square to chunk x prompt."""
        self._take_slots(reqs)
        firsts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        c = self.prefill_chunk
        for start in range(0, max(len(r.prompt) for r in reqs), c):
            self._prefill_chunk(reqs, start, firsts)
            if self.on_prefill is not None:
                self.on_prefill(self, sum(min(len(r.prompt), start + c) for r in reqs))
        if self.W:
            self._draft_chain(reqs, torch.stack([firsts[id(r)][0] for r in reqs]),
                              torch.stack([firsts[id(r)][1] for r in reqs]))

    def _take_slots(self, reqs: list[Request]) -> None:
        for r in reqs:
            if not self.free:
                raise RuntimeError("no free slot")
            r.slot = self.free.pop(0)
            self.state.reset_slot(r.slot)

    def _prefill_chunk(self, reqs: list[Request], start: int,
                       firsts: dict[int, tuple[torch.Tensor, torch.Tensor]],
                       size: int | None = None) -> None:
        """The prompt tokens ``start .. start + size`` (default ``prefill_chunk``) of the
        requests that have them: the target, then (speculative) the MTP over the chunk. A request
        whose prompt ends in the chunk gets its first token, and its first draft and hidden in
        ``firsts``."""
        c = size or self.prefill_chunk
        part = [r for r in reqs if len(r.prompt) > start]
        with self._phase("prefill"):
            (logits, hidden), slots, lengths = self._target(
                part, [r.prompt[start:start + c] for r in part], [start] * len(part))
        ending = [b for b, r in enumerate(part) if len(r.prompt) <= start + c]
        for b in ending:
            r = part[b]
            r.length = len(r.prompt)
            r.next_token = int(logits[b, r.length - 1 - start].argmax())
            r.emit([r.next_token])
        if not self.W:
            return
        # The MTP over the chunk (eager, any length): position p takes token p + 1, the
        # verified-in token after a prompt's last position.
        with self._phase("prefill"):
            toks, _ = _pad([(r.prompt + [r.next_token])[start + 1:start + 1 + c]
                            for r in part], self.device)
            last = [min(len(r.prompt) - 1 - start, c - 1) for r in part]
            first, h = draft_extend(self.model, self.state, toks, hidden, slots,
                                    torch.full_like(lengths, start), lengths,
                                    torch.tensor(last, device=self.device),
                                    hc_head_impl=self.draft_hc_head_impl)
        for b in ending:
            firsts[id(part[b])] = first[b], h[b]

    @torch.no_grad()
    def measure(self, prompts: list[list[int]], max_new_tokens: int) -> dict[str, float]:
        """Seconds of the work that generating ``max_new_tokens`` after ``prompts`` (one
        request each, all in free slots at once) does, timed on scratch requests before it
        starts. ``prefill_first`` and ``prefill_last``: a prefill chunk of ``prefill_tokens``
        tokens at the start of the prompts and one that ends where the longest ends; the chunk
        is ``PROBE_TOKENS`` long, four times longer while one takes less than ``PROBE_S``, up to
        ``prefill_chunk`` and the longest prompt. ``step_first`` and ``step_last``: one step
        (plain: a decode; speculative: verify, rollback, draft-extend and draft chain) where the
        first and where the last token is generated (0 where no step runs, ``max_new_tokens``
        1). The cost of a chunk or a step grows with its position (the compressed entries
        attended to), so the first and the last bound it. The first chunk and the first step run
        twice, the faster timed (the first call's warm-up: kernel compilation, graph capture),
        and so does a larger chunk at the start that takes ``PROBE_S`` or more (its size's first
        call). The slots are reset and the phase times cleared afterwards: a run then goes as on
        a fresh engine."""
        if len(prompts) > len(self.free):
            raise ValueError(f"{len(prompts)} prompts, {len(self.free)} free slots")
        reqs = [Request(list(p), max_new_tokens + 1) for p in prompts]
        hooks = self.on_prefill, self.on_step, self.draft_override
        self.on_prefill = self.on_step = self.draft_override = None
        self._take_slots(reqs)
        try:
            longest = max(len(p) for p in prompts)
            widest = min(self.prefill_chunk, longest)
            firsts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

            def chunk(start: int, size: int, again_from: float) -> float:
                wall = self._timed(self._prefill_chunk, reqs, start, firsts, size)
                if wall >= again_from:
                    wall = min(wall, self._timed(self._prefill_chunk, reqs, start, firsts, size))
                return wall

            size = min(PROBE_TOKENS, widest)
            first = chunk(0, size, 0.0)
            while size < widest and first < PROBE_S:
                size = min(4 * size, widest)
                first = chunk(0, size, PROBE_S)
            times = {"prefill_tokens": size, "prefill_first": first,
                     "prefill_last": chunk(longest - size, size, math.inf) if longest > size
                     else first, "step_first": 0.0, "step_last": 0.0}
            if max_new_tokens > 1:
                step = self.speculative_step if self.W else self.decode_step
                room = self.state.max_seq_len - 2 * max(self.W, 1)  # a step's and its drafts'
                for key, offset in (("step_first", 0), ("step_last", max_new_tokens - 2)):
                    walls = []
                    for _ in range(2 if offset == 0 else 1):
                        for r in reqs:
                            r.length = min(len(r.prompt) + offset, room)
                            r.next_token, r.drafts = r.prompt[-1], [0] * max(self.W - 1, 0)
                        walls.append(self._timed(step, reqs))
                    times[key] = min(walls)
        finally:
            for r in reqs:
                self.release(r)
            self.phase_walls.clear()
            self.phase_events.clear()
            self.on_prefill, self.on_step, self.draft_override = hooks
        return times

    def _timed(self, fn, *args) -> float:
        """Wall seconds of ``fn(*args)``, the device synchronised at both ends."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        fn(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def _decode(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor]:
        logits, _ = self.model(inputs["tokens"][:, None], self.state, inputs["slots"],
                               inputs["starts"], inputs["valid"].long())
        return (logits[:, 0].argmax(-1),)

    def decode_step(self, reqs: list[Request]) -> None:
        """Plain greedy: one target token per request (per bucket, in a graph if enabled)."""
        starts = [r.length for r in reqs]
        self._check_room(max(starts) + 1)
        with self._phase("decode"):
            (nxt,) = self.decoder(
                tokens=torch.tensor([r.next_token for r in reqs], device=self.device),
                slots=self._slots(reqs), starts=torch.tensor(starts, device=self.device),
                valid=torch.ones(len(reqs), dtype=torch.bool, device=self.device))
            nxt = nxt.tolist()
        for r, t in zip(reqs, nxt):
            r.length += 1
            r.next_token = t
            r.emit([t])

    def speculative_step(self, reqs: list[Request]) -> None:
        """Verify (+ acceptance, + rollback inside), rollback after, draft-extend, draft chain:
        SGLang's order."""
        W = self.W
        starts = [r.length for r in reqs]
        rows = [[r.next_token] + r.drafts for r in reqs]
        self._check_room(max(starts) + W)
        tokens = torch.tensor(rows, device=self.device)
        slots = self._slots(reqs)
        starts_t = torch.tensor(starts, device=self.device)
        with self._phase("verify"):
            res = self.verify(tokens, slots, starts_t)
            accept, bonuses = res.accept_lens.tolist(), res.bonus.tolist()
        if self.rollback != "none" and not self.rollback_in_verify:
            with self._phase("rollback"):
                self.state.clear_unaccepted_draft_rows(slots, starts_t, res.accept_lens, W)
        committed = []
        for b, r in enumerate(reqs):
            a = accept[b]
            seq = [r.next_token] + r.drafts[:a - 1] + [bonuses[b]]  # positions L .. L + a
            committed.append(seq)
            r.accept_lens.append(a)
            r.emit(seq[1:])
        # Draft-extend over the W verified positions, fixed width: position L + i takes the
        # token at L + i + 1 (committed for i < a; anything beyond, the rows are not used).
        nxt = torch.tensor([(seq[1:] + [seq[-1]] * W)[:W] for seq in committed],
                           device=self.device)
        with self._phase("draft-extend"):
            first, h = self.drafts.extend(
                tokens=nxt, hidden=res.hidden, slots=slots, starts=starts_t,
                lengths=torch.full_like(starts_t, W), rows_at=res.accept_lens - 1)
        for b, r in enumerate(reqs):
            r.length += accept[b]
            r.next_token = committed[b][-1]
        self._draft_chain(reqs, first, h)

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
