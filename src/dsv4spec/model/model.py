"""The DSV4-style target model and its MTP draft block (docs/design.md), at any width.

Every forward is an *extend*: request ``b`` appends tokens at positions ``starts[b] + t`` for
``t < lengths[b]`` (prefill from 0 or continuing, decode with 1 token, verify and draft-extend with
``W``); columns ``t >= lengths[b]`` are padding and write nothing that is read. Shapes depend only
on ``[B, n]``, and masks replace data-dependent branches, so decode, verify and the draft modes
can be captured in CUDA graphs. Parameter names follow DSV4's checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, Protocol, TypeVar

import torch
from torch import nn

from dsv4spec.cache.model_state import ModelState
from dsv4spec.model.compressor import overlap_halves, pool
from dsv4spec.model.config import OVERLAP_RATIO, ModelConfig
from dsv4spec.model.mhc import hc_post_captured, hc_pre_captured
from dsv4spec.model.rope import rope_frequencies, rope_table, rotate
from dsv4spec.ops import hc_head as hc_head_op
from dsv4spec.ops import hc_head_reference, mhc_post, mhc_post_head, mhc_post_pre, mhc_pre


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    compute = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute)
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (y if weight is None else y * weight.to(compute)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def linear(d_in: int, d_out: int) -> nn.Linear:
    return nn.Linear(d_in, d_out, bias=False)


T = TypeVar("T")


class Batch:
    """Positions and masks of one extend: ``slots [B]``, ``starts [B]``, ``lengths [B]``, ``n``.

    Also a memo of what depends only on the batch and a layer's kind (rope tables, masks, index
    math): the layers of one kind share one computation, which cuts the kernels each layer
    launches. A new ``Batch`` per forward, so nothing stale survives into the next.
    """

    def __init__(self, slots: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, n: int,
                 scratch_slot: int, max_end: int | None = None) -> None:
        self.t = torch.arange(n, device=starts.device)
        self.max_end = max_end
        self.slots, self.starts, self.lengths, self.n = slots, starts, lengths, n
        self.pos = starts[:, None] + self.t  # [B, n]
        self.valid = self.t < lengths[:, None]
        self.scratch = scratch_slot
        self._memo: dict[Hashable, Any] = {}

    def memo(self, key: Hashable, fn: Callable[[], T]) -> T:
        """``fn()``, computed on the first call with ``key`` of this batch and then reused."""
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    def write_slots(self, keep: torch.Tensor) -> torch.Tensor:
        """Slot per write (``keep [B, ...]``): the request's, or the scratch slot."""
        return torch.where(keep, self.slots[:, None], self.scratch)

    def ring_writes(self, ring: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the tokens go in a per-slot ring of ``ring`` rows: slot and row ``[B, n]``.

        Only each request's last ``ring`` tokens are kept (a later one of the batch would
        overwrite the others); padding and the rest go to the scratch slot.
        """
        def compute() -> tuple[torch.Tensor, torch.Tensor]:
            keep = self.valid & (self.t >= self.lengths[:, None] - ring)
            return self.write_slots(keep), self.pos % ring

        return self.memo(("ring_writes", ring), compute)


class BlockIndex(NamedTuple):
    """A compressor's index math for one batch: depends only on the batch, ratio and ring.

    ``K = n // r + 1`` candidate blocks per request, each pooling ``span`` rows (``2r`` when
    overlapping, else ``r``).
    """

    ape_row: torch.Tensor     # [B, n] pos % r
    batch_row: torch.Tensor   # [B, K, span] row of the batch's new rows, flattened to [B * n]
    ring_row: torch.Tensor    # [B, K, span] row of the state ring
    from_batch: torch.Tensor  # [B, K, span, 1] the row is the batch's (else the ring's)
    in_seq: torch.Tensor      # [B, K, span, 1] position >= 0 (else a neutral row)
    entry_pos: torch.Tensor   # [B * K] rope position j * r of entry j
    entry_slot: torch.Tensor  # [B, K] slot of the entry write (scratch if the block is not done)
    entry_col: torch.Tensor   # [B, K] j, clamped into the entries buffer
    row_write: torch.Tensor   # [B, n] ring row of each new token's raw row


def block_index(batch: Batch, r: int, span: int, ring: int, max_entries: int) -> BlockIndex:
    """The index math of a compressor of ratio ``r`` (pooling ``span`` rows, state ring of
    ``ring`` rows per slot, ``max_entries`` entries per slot) for ``batch``."""
    B, n, device = batch.pos.shape[0], batch.n, batch.pos.device
    # Candidate block ends: positions p with (p + 1) % r == 0, K per request.
    K = n // r + 1
    first = (r - 1 - batch.starts) % r  # first t that ends a block
    t_end = first[:, None] + r * torch.arange(K, device=device)  # [B, K]
    end_ok = t_end < batch.lengths[:, None]
    p_end = batch.starts[:, None] + t_end
    q = p_end[:, :, None] - (span - 1) + torch.arange(span, device=device)  # [B, K, span]
    from_batch = q >= batch.starts[:, None, None]
    t_idx = (q - batch.starts[:, None, None]).clamp(0, n - 1)
    batch_row = torch.arange(B, device=device)[:, None, None] * n + t_idx
    j = (p_end + 1) // r - 1
    slot, row = batch.ring_writes(ring)
    return BlockIndex(
        ape_row=batch.pos % r, batch_row=batch_row,
        ring_row=batch.slots[:, None, None] * ring + q % ring,
        from_batch=from_batch[..., None], in_seq=(q >= 0)[..., None],
        entry_pos=(j * r).view(-1), entry_slot=batch.write_slots(end_ok),
        entry_col=j.clamp(0, max_entries - 1), row_write=slot * ring + row)


class Compressor(nn.Module):
    """Raw rows ``[kv | score]`` per token, and the entries that the batch's tokens complete."""

    def __init__(self, cfg: ModelConfig, ratio: int) -> None:
        super().__init__()
        self.ratio, self.overlap = ratio, ratio == OVERLAP_RATIO
        coff, D = 1 + self.overlap, cfg.head_dim
        self.wkv = linear(cfg.hidden_size, coff * D)
        self.wgate = linear(cfg.hidden_size, coff * D)
        self.ape = nn.Parameter(torch.zeros(ratio, coff * D))
        self.norm = RMSNorm(D, cfg.rms_norm_eps)
        self.head_dim = D

    def forward(self, h: torch.Tensor, batch: Batch, rows_buf: torch.Tensor, ring: int,
                entries: torch.Tensor, freqs: torch.Tensor) -> None:
        r, D, B, n = self.ratio, self.head_dim, batch.pos.shape[0], batch.n
        compute = torch.promote_types(h.dtype, torch.float32)
        span = 2 * r if self.overlap else r
        ix = batch.memo(("compressor", r, ring, entries.shape[1]),
                        lambda: block_index(batch, r, span, ring, entries.shape[1]))
        h = h.view(B, n, -1)
        kv = self.wkv(h).to(compute)
        score = self.wgate(h).to(compute) + self.ape.to(compute)[ix.ape_row]
        # Rows as the ring stores them, so an entry pooled from the batch equals one pooled
        # from the ring later (float64 runs included).
        stored = torch.cat((kv, score), -1).to(rows_buf.dtype)  # [B, n, 2W]
        new_rows = stored.to(compute)
        width = new_rows.shape[-1]
        neutral = batch.memo(("neutral_row", width, compute), lambda: torch.cat((
            new_rows.new_zeros(width // 2), new_rows.new_full((width // 2,), float("-inf")))))
        batch_rows = new_rows.view(B * n, width)[ix.batch_row]  # [B, K, span, 2W]
        ring_rows = rows_buf[ix.ring_row].to(compute)
        rows = torch.where(ix.from_batch, batch_rows,
                           torch.where(ix.in_seq, ring_rows, neutral))
        W = width // 2
        kv_rows, score_rows = rows[..., :W], rows[..., W:]
        if self.overlap:  # block j-1's first halves, then block j's second halves
            kv_rows, score_rows = overlap_halves(kv_rows, r), overlap_halves(score_rows, r)
        entry = self.norm(pool(kv_rows, score_rows))  # [B, K, D]
        K = entry.shape[1]
        cos, sin = batch.memo(("entry_rope", r, compute),
                              lambda: rope_table(ix.entry_pos, freqs, compute))
        entry = rotate(entry.view(B * K, 1, D), cos, sin).view(B, K, D)
        entries[ix.entry_slot, ix.entry_col] = entry.to(entries.dtype)
        # Then the raw rows of the new tokens (the last `ring` of each request are kept).
        rows_buf[ix.row_write] = stored


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int) -> None:
        super().__init__()
        H, D, nh = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
        self.cfg, self.ratio, self.head_dim, self.num_heads = cfg, ratio, D, nh
        self.wq_a = linear(H, cfg.q_lora_rank)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.wq_b = linear(cfg.q_lora_rank, nh * D)
        self.wkv = linear(H, D)
        self.kv_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.wo_a = linear(nh // cfg.o_groups * D, cfg.o_groups * cfg.o_lora_rank)
        self.wo_b = linear(cfg.o_groups * cfg.o_lora_rank, H)
        self.attn_sink = nn.Parameter(torch.zeros(nh))
        self.compressor = Compressor(cfg, ratio) if ratio else None
        # Two rope kinds, each fixed by the config: one table per kind and forward serves all.
        self.rope_kind = "compress" if ratio else "window"
        theta = cfg.compress_rope_theta if ratio else cfg.rope_theta
        scaling = cfg.rope_scaling if ratio else None
        self.register_buffer("freqs", rope_frequencies(cfg.qk_rope_head_dim, theta, scaling),
                             persistent=False)

    def forward(self, h: torch.Tensor, batch: Batch, state: ModelState, layer: int
                ) -> torch.Tensor:
        cfg, D, nh = self.cfg, self.head_dim, self.num_heads
        B, n = batch.pos.shape
        eps = cfg.rms_norm_eps
        compute = torch.promote_types(h.dtype, torch.float32)
        cos, sin = batch.memo(("rope", self.rope_kind, compute),
                              lambda: rope_table(batch.pos.reshape(-1), self.freqs, compute))
        q = self.wq_b(self.q_norm(self.wq_a(h))).view(B * n, nh, D)
        q = rotate(rms_norm(q, None, eps), cos, sin).view(B, n, nh, D)
        kv = rotate(self.kv_norm(self.wkv(h)).view(B * n, 1, D), cos, sin).view(B, n, D)
        if self.compressor is not None:
            self.compressor(h, batch, state.rows[layer], state.ring_size[self.ratio],
                            state.entries[layer], self.freqs)
        # Keys: the window ring (positions before the batch), the batch's own, the entries.
        window = state.window[layer]
        R = window.shape[1]
        parts = [window[batch.slots].to(kv.dtype), kv]  # [B, R, D], [B, n, D]
        E = 0
        if self.compressor is not None:
            entries = state.entries[layer]
            if batch.max_end is not None:  # entries past the batch's end are never complete
                entries = entries[:, :min(entries.shape[1], batch.max_end // self.ratio)]
            parts.append(entries[batch.slots].to(kv.dtype))  # [B, E, D]
            E = parts[-1].shape[1]
        keys = torch.cat(parts, 1)
        hidden = batch.memo(("hidden_keys", R, self.ratio, E),
                            lambda: self._hidden_keys(batch, R, E))
        scores = torch.einsum("bthd,bkd->bthk", q, keys) / math.sqrt(D)
        scores = scores.masked_fill(hidden, float("-inf"))
        sink = self.attn_sink.to(scores.dtype).view(1, 1, nh, 1).expand(B, n, nh, 1)
        probs = torch.softmax(torch.cat((scores, sink), -1), -1)[..., :-1]
        out = torch.einsum("bthk,bkd->bthd", probs, keys)
        out = rotate(out.reshape(B * n, nh, D), cos, sin, inverse=True)
        g = cfg.o_groups
        wo_a = self.wo_a.weight.view(g, cfg.o_lora_rank, -1)
        out = torch.einsum("tgi,gki->tgk", out.reshape(B * n, g, -1), wo_a)
        out = self.wo_b(out.reshape(B * n, -1))
        # Window writes after the reads: the last R tokens of each request, others to scratch.
        window[batch.ring_writes(R)] = kv.to(window.dtype)
        return out

    def _hidden_keys(self, batch: Batch, R: int, E: int) -> torch.Tensor:
        """``[B, n, 1, R + n + E]``: True where a query must not read the key."""
        B, n = batch.pos.shape
        qp = batch.pos[:, :, None]

        def window_mask() -> torch.Tensor:  # shared by all layer kinds
            last = batch.starts[:, None] - 1
            ring_pos = last - (last - torch.arange(R, device=qp.device)) % R  # [B, R]
            key_pos = torch.cat((ring_pos, batch.pos), 1)
            key_ok = torch.cat((ring_pos >= 0, batch.valid), 1)
            return (key_ok[:, None, :] & (key_pos[:, None, :] <= qp)
                    & (key_pos[:, None, :] > qp - self.cfg.sliding_window))

        mask = batch.memo(("window_mask", R), window_mask)
        if E:  # entry j is complete once its block's last position is reached
            ends = (torch.arange(E, device=qp.device) + 1) * self.ratio - 1
            mask = torch.cat((mask, (ends[None, None, :] <= qp).expand(B, n, E)), 2)
        return ~mask[:, :, None, :]


class FFN(nn.Module):
    """Dense SwiGLU (this reference model's stand-in for DSV4's MoE)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = linear(cfg.hidden_size, cfg.intermediate_size)
        self.w2 = linear(cfg.intermediate_size, cfg.hidden_size)
        self.w3 = linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class MhcImplementation(Protocol):
    """The three mHC boundary ops a layer calls, in ``dsv4spec.ops``' signatures and return
    orders: ``pre`` as ``mhc_pre`` ``(post [T, hc], comb, layer_input)``, ``post_pre`` as
    ``mhc_post_pre`` ``(residual', post', comb', layer_input)``, ``post`` as ``mhc_post``."""

    def pre(self, residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor,
            hc_base: torch.Tensor, *, rms_eps: float, hc_eps: float, sinkhorn_iters: int,
            norm_weight: torch.Tensor | None = None, norm_eps: float | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def post_pre(self, f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
                 comb: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor,
                 hc_base: torch.Tensor, *, rms_eps: float, hc_eps: float, sinkhorn_iters: int,
                 norm_weight: torch.Tensor | None = None, norm_eps: float | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def post(self, f: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> torch.Tensor: ...


class FusedMhcOps:
    """Our fused ops (``dsv4spec.ops``): the layers' mHC implementation by default on CUDA."""

    pre = staticmethod(mhc_pre)
    post_pre = staticmethod(mhc_post_pre)
    post = staticmethod(mhc_post)


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, ratio: int) -> None:
        super().__init__()
        hc, H = cfg.hc_mult, cfg.hidden_size
        self.cfg = cfg
        self.attn_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.ffn_norm = RMSNorm(H, cfg.rms_norm_eps)
        n = (2 + hc) * hc
        for part in ("attn", "ffn"):
            setattr(self, f"hc_{part}_fn", nn.Parameter(torch.zeros(n, hc * H)))
            setattr(self, f"hc_{part}_base", nn.Parameter(torch.zeros(n)))
            setattr(self, f"hc_{part}_scale", nn.Parameter(torch.ones(3)))
        self.attn = Attention(cfg, ratio)
        self.ffn = FFN(cfg)

    def _hc(self, part: str):
        return (getattr(self, f"hc_{part}_fn"), getattr(self, f"hc_{part}_scale"),
                getattr(self, f"hc_{part}_base"))

    # On CUDA with hc_mult 4 and fp32 mHC parameters each layer crosses its boundaries through
    # the fused ops (pre with the attention norm, post of the attention then pre of the FFN with
    # its norm, post of the FFN: 5 launches); elsewhere (CPU, float64 tests) through hc_pre /
    # hc_post, compiled per shape in capture mode. Benchmarks set it to False to compare.
    mhc_ops: bool = True
    # Another implementation of the boundary ops (a benchmark's peer kernels), set on a layer or
    # on the class; when set it is used on any device, so CPU tests can check an adapter.
    mhc_implementation: MhcImplementation | None = None

    def _use_mhc_ops(self, x: torch.Tensor) -> bool:
        return (self.mhc_ops and x.is_cuda and x.shape[1] == 4 and x.is_contiguous()
                and self.hc_attn_fn.dtype == torch.float32
                and x.dtype in (torch.bfloat16, torch.float16, torch.float32))

    def forward(self, x: torch.Tensor, batch: Batch, state: ModelState, layer: int,
                tail: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The layer's two sublayers and their boundaries: the new streams. ``tail`` (the model
        tail, ``mhc_post_head`` bound to a head: ``Transformer._tail``) replaces the FFN's post
        where our fused ops serve this layer, and its ``(streams, normed hidden)`` is returned
        instead."""
        cfg = self.cfg
        ops = self.mhc_implementation
        if ops is None and self._use_mhc_ops(x):
            ops = FusedMhcOps
        if ops is not None:
            kw = dict(rms_eps=float(cfg.rms_norm_eps), hc_eps=float(cfg.hc_eps),
                      sinkhorn_iters=cfg.hc_sinkhorn_iters)
            post, comb, y = ops.pre(x, *self._hc("attn"), norm_weight=self.attn_norm.weight,
                                    norm_eps=float(self.attn_norm.eps), **kw)
            f = self.attn(y, batch, state, layer)
            x, post, comb, y = ops.post_pre(f, x, post, comb, *self._hc("ffn"),
                                            norm_weight=self.ffn_norm.weight,
                                            norm_eps=float(self.ffn_norm.eps), **kw)
            if tail is not None and ops is FusedMhcOps and x.dtype != torch.float64:
                return tail(self.ffn(y), x, post, comb)
            return ops.post(self.ffn(y), x, post, comb)
        kw = dict(norm_eps=cfg.rms_norm_eps, hc_eps=cfg.hc_eps,
                  sinkhorn_iters=cfg.hc_sinkhorn_iters)
        y, post, comb = hc_pre_captured(x, *self._hc("attn"), **kw)
        x = hc_post_captured(self.attn(self.attn_norm(y), batch, state, layer), x, post, comb)
        y, post, comb = hc_pre_captured(x, *self._hc("ffn"), **kw)
        return hc_post_captured(self.ffn(self.ffn_norm(y)), x, post, comb)


class MTPBlock(Layer):
    """The MTP draft block: its own window-only layer, hc_head and shared-head norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, 0)
        H, hc = cfg.hidden_size, cfg.hc_mult
        self.e_proj = linear(H, H)
        self.h_proj = linear(H, H)
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.hc_head_fn = nn.Parameter(torch.zeros(hc, hc * H))
        self.hc_head_base = nn.Parameter(torch.zeros(hc))
        self.hc_head_scale = nn.Parameter(torch.ones(1))


class Transformer(nn.Module):
    """Target model (``layers``, ``hc_head_*``, ``norm``, ``head``) and ``mtp[0]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H, hc = cfg.hidden_size, cfg.hc_mult
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, H)
        self.layers = nn.ModuleList(Layer(cfg, r) for r in cfg.layer_ratios)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.head = linear(H, cfg.vocab_size)
        self.hc_head_fn = nn.Parameter(torch.zeros(hc, hc * H))
        self.hc_head_base = nn.Parameter(torch.zeros(hc))
        self.hc_head_scale = nn.Parameter(torch.ones(1))
        self.mtp = nn.ModuleList(MTPBlock(cfg) for _ in range(cfg.num_nextn_predict_layers))
        self.hc_head_impl = "auto"

    # Where our fused ops serve the last layer (target or MTP block) and its head's hc_head is
    # ours (impl "auto" or "triton"), the last post, hc_head and the final norm run as one op,
    # mhc_post_head: 2 launches where they take 3. Benchmarks set it to False to compare.
    fused_tail: bool = True

    def cast(self, dtype: torch.dtype) -> Transformer:
        """Cast to ``dtype`` (bf16 to serve), keeping in float32 what DSV4 stores in float32:
        the mHC and hc_head parameters, the compressors' ``ape`` and the attention sinks."""
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            keep = leaf.startswith("hc_") or leaf in ("ape", "attn_sink")
            p.data = p.data.to(torch.float32 if keep and dtype != torch.float64 else dtype)
        return self

    def new_state(self, num_slots: int, max_seq_len: int, max_num_draft_tokens: int = 8,
                  device: torch.device | str | None = None) -> ModelState:
        cfg = self.cfg
        ratios = cfg.compress_ratios
        speculative = max_num_draft_tokens > 1
        return ModelState(
            ratios, {r: cfg.state_ring_size(r, speculative) for r in set(ratios) if r},
            c128_ratio=cfg.compress_ratio, head_dim=cfg.head_dim,
            sliding_window=cfg.sliding_window, num_slots=num_slots, max_seq_len=max_seq_len,
            max_num_draft_tokens=max_num_draft_tokens, dtype=self.embed.weight.dtype,
            device=device if device is not None else self.embed.weight.device)

    def _tail(self, owner: nn.Module, norm: RMSNorm, impl: str
              ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
        """``owner``'s hc_head and ``norm`` after the last layer's post, as ``Layer.forward``'s
        ``tail``; None where the tail is not fused."""
        if not self.fused_tail or impl not in ("auto", "triton"):
            return None
        cfg = self.cfg
        params = (owner.hc_head_fn, owner.hc_head_scale, owner.hc_head_base)

        def tail(f, residual, post, comb):
            return mhc_post_head(f, residual, post, comb, *params, norm_eps=cfg.rms_norm_eps,
                                 hc_eps=cfg.hc_eps, norm_weight=norm.weight,
                                 final_norm_eps=norm.eps)
        return tail

    def _logits(self, out: torch.Tensor | tuple[torch.Tensor, torch.Tensor], owner: nn.Module,
                norm: RMSNorm, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, streams) from the last layer's output: the streams, or the fused tail's
        (streams, normed hidden)."""
        if isinstance(out, tuple):
            return self.head(out[1]), out[0]
        return self._head(out, owner, norm, impl), out

    def _head(self, x: torch.Tensor, owner: nn.Module, norm: RMSNorm, impl: str) -> torch.Tensor:
        cfg = self.cfg
        params = (owner.hc_head_fn, owner.hc_head_scale, owner.hc_head_base)
        eps = dict(norm_eps=cfg.rms_norm_eps, hc_eps=cfg.hc_eps)
        if x.dtype == torch.float64:  # exact CPU runs: the op serves bf16/fp16/fp32 only
            y = hc_head_reference(x, *params, **eps)
        else:
            y = hc_head_op(x, *params, **eps, impl=impl)
        return self.head(norm(y))

    def forward(self, tokens: torch.Tensor, state: ModelState, slots: torch.Tensor,
                starts: torch.Tensor, lengths: torch.Tensor, max_end: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target extend. Returns logits ``[B, n, V]`` and the pre-hc_head hidden
        ``[B, n, hc * H]`` (the MTP block's input). ``starts + lengths`` must not exceed the
        state's ``max_seq_len`` (not checked here: that would sync with the device; the engine
        checks it on the host). ``max_end``: an upper bound on ``starts + lengths`` known on
        the host (eager prefill), so attention reads only the entries complete by then; None
        (captured phases): every entry, masked, for shapes fixed by ``[B, n]`` alone."""
        B, n = tokens.shape
        batch = Batch(slots, starts, lengths, n, state.num_slots, max_end)
        hc = self.cfg.hc_mult
        x = self.embed(tokens).view(B * n, 1, -1).expand(-1, hc, -1).contiguous()
        tail = self._tail(self, self.norm, self.hc_head_impl)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, batch, state, i, tail if i == last else None)
        logits, x = self._logits(x, self, self.norm, self.hc_head_impl)
        return logits.view(B, n, -1), x.view(B, n, -1)

    def draft(self, tokens: torch.Tensor, hidden: torch.Tensor, state: ModelState,
              slots: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, *,
              hc_head_impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP extend: ``tokens [B, n]`` (the next tokens) and the target's (or the previous
        draft step's) pre-hc_head ``hidden [B, n, hc * H]`` at the same positions. Returns the
        draft logits and its own pre-hc_head hidden. ``hc_head_impl`` picks the MTP block's
        hc_head (``None``: the model's ``hc_head_impl``)."""
        cfg, mtp = self.cfg, self.mtp[0]
        B, n = tokens.shape
        hc, H = cfg.hc_mult, cfg.hidden_size
        batch = Batch(slots, starts, lengths, n, state.num_slots)
        e = mtp.e_proj(mtp.enorm(self.embed(tokens))).view(B * n, 1, H)
        x = e + mtp.h_proj(mtp.hnorm(hidden.view(B * n, hc, H)))
        impl = hc_head_impl or self.hc_head_impl
        x = mtp(x.to(self.embed.weight.dtype), batch, state, cfg.num_hidden_layers,
                self._tail(mtp, mtp.norm, impl))
        logits, x = self._logits(x, mtp, mtp.norm, impl)
        return logits.view(B, n, -1), x.view(B, n, -1)


@torch.no_grad()
def init_weights(model: Transformer, seed: int = 0) -> Transformer:
    """Random weights at DSV4-like scales, drawn on the parameters' device: projections
    ``N(0, 1/fan_in)``, embeddings ``N(0, 1)``, norms near 1, mHC ``fn`` ``N(0, 1/(hc*H))``
    (logits ~ N(0, 1)), ``base`` ``N(0, 0.5)``, ``scale`` in [0.5, 1.5], ``ape`` and
    ``attn_sink`` ``N(0, 0.5)``."""
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(p: torch.Tensor) -> torch.Tensor:
        dtype = p.dtype if p.dtype == torch.float64 else torch.float32
        return torch.randn(p.shape, generator=g, device=device, dtype=dtype)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("_fn"):
            p.copy_(randn(p) * p.shape[1] ** -0.5)
        elif leaf.endswith("_base") or leaf in ("ape", "attn_sink"):
            p.copy_(randn(p) * 0.5)
        elif leaf.endswith("_scale"):
            p.copy_(torch.rand(p.shape, generator=g, device=device, dtype=torch.float32) + 0.5)
        elif name.startswith("embed"):
            p.copy_(randn(p))
        elif p.dim() == 1:  # norm weights
            p.copy_(randn(p) * 0.1 + 1.0)
        else:
            p.copy_(randn(p) * p.shape[1] ** -0.5)
    return model
