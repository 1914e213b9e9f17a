"""Train a target model and its MTP block, byte-level, on the CPU.

The corpus is text every machine with Python has: the standard library's own ``.py`` files. The
target learns next-byte prediction; the MTP block, fed the target's pre-hc_head hidden at ``p`` and
the byte at ``p + 1``, learns the byte at ``p + 2`` (DSV4's MTP objective), so its drafts are
accepted often enough for speculative decoding to show.
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F

from dsv4spec.model.build import build_model
from dsv4spec.model.model import Transformer


def corpus(limit_bytes: int = 4_000_000, seed: int = 0) -> torch.Tensor:
    """The standard library's ``.py`` files, shuffled by file, as one byte tensor."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    random.Random(seed).shuffle(files)
    chunks, total = [], 0
    for f in files:
        data = f.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()


def losses(model: Transformer, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target next-byte and MTP next-next-byte cross entropies of ``batch [B, n + 2]``."""
    B, n = batch.shape[0], batch.shape[1] - 2
    state = model.new_state(num_slots=B, max_seq_len=n + 2, max_num_draft_tokens=1)
    slots, zeros = torch.arange(B), torch.zeros(B, dtype=torch.long)
    lengths = torch.full((B,), n)
    logits, hidden = model(batch[:, :n], state, slots, zeros, lengths)
    target = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:n + 1].flatten())
    d_logits, _ = model.draft(batch[:, 1:n + 1], hidden, state, slots, zeros, lengths)
    mtp = F.cross_entropy(d_logits.flatten(0, 1), batch[:, 2:n + 2].flatten())
    return target, mtp


def train(steps: int, batch_size: int, seq_len: int, lr: float, seed: int = 0,
          progress: bool = True, preset: str = "tiny", stop_on_interrupt: bool = False
          ) -> tuple[Transformer, list[tuple[float, float]]]:
    """Train ``preset`` from random weights; returns the frozen model and (target, MTP) losses
    per step. ``stop_on_interrupt``: a KeyboardInterrupt ends training after the last completed
    step and returns the model as it is then (``len(history) < steps`` tells)."""
    torch.manual_seed(seed)
    data = corpus(seed=seed)
    model = build_model(preset, seed=seed, trainable=True)
    model.hc_head_impl = "eager"  # the fused kernel has no backward
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = schedule(opt, lr, steps)
    g = torch.Generator().manual_seed(seed)
    history = []
    bar = _progress(steps) if progress else None
    params = list(model.parameters())
    try:
        for step in range(steps):
            starts = torch.randint(0, len(data) - seq_len - 3, (batch_size,), generator=g)
            batch = torch.stack([data[s:s + seq_len + 2] for s in starts.tolist()])
            target, mtp = losses(model, batch)
            opt.zero_grad(set_to_none=True)
            (target + 0.5 * mtp).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            # An interrupt inside opt.step() could leave some parameters stepped: keep a copy
            # to return the weights of the last completed step.
            before = [p.detach().clone() for p in params] if stop_on_interrupt else None
            try:
                opt.step()
            except KeyboardInterrupt:
                with torch.no_grad():
                    for p, b in zip(params, before or []):
                        p.copy_(b)
                raise
            sched.step()
            history.append((target.item(), mtp.item()))
            if bar is not None:
                bar.set_postfix(target=f"{target.item():.3f}", mtp=f"{mtp.item():.3f}")
                bar.update()
    except KeyboardInterrupt:
        if not stop_on_interrupt:
            raise
    finally:
        if bar is not None:
            bar.close()
    return model.requires_grad_(False), history


def schedule(opt: torch.optim.Optimizer, lr: float, steps: int):
    """The learning rate over ``steps >= 1`` steps: a one-cycle schedule (5 % warm-up to ``lr``,
    cosine down) from 40 steps on, where the warm-up spans at least two steps; a constant ``lr``
    for shorter runs (OneCycleLR divides by the warm-up's length less one step: 20 steps raise
    ZeroDivisionError, fewer make it negative)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if steps >= 40:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                   pct_start=0.05)
    for group in opt.param_groups:
        group["lr"] = lr
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="train-tiny", unit="step")
