"""``dsv4spec train-tiny``: train the ``tiny`` target and its MTP block, byte-level, on CPU.

The corpus is text every machine with Python has: the standard library's own ``.py`` files. The
target learns next-byte prediction; the MTP block, fed the target's pre-hc_head hidden at ``p`` and
the byte at ``p + 1``, learns the byte at ``p + 2`` (DSV4's MTP objective), so its drafts are
accepted often enough for speculative decoding to show. Saves safetensors and a loss plot.
"""

from __future__ import annotations

import argparse
import random
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dsv4spec.model import preset
from dsv4spec.model.model import Transformer, init_weights
from dsv4spec.model.weights import save_weights

CHECKPOINT = Path(__file__).with_name("checkpoints") / "tiny.safetensors"


def encode(text: str) -> list[int]:
    """Byte-level tokens (0..255)."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


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
          progress: bool = True) -> tuple[Transformer, list[tuple[float, float]]]:
    torch.manual_seed(seed)
    data = corpus(seed=seed)
    model = init_weights(Transformer(preset("tiny")), seed=seed)
    model.hc_head_impl = "eager"  # the fused kernel has no backward
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.05)
    g = torch.Generator().manual_seed(seed)
    history = []
    bar = _progress(steps) if progress else None
    for step in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 3, (batch_size,), generator=g)
        batch = torch.stack([data[s:s + seq_len + 2] for s in starts.tolist()])
        target, mtp = losses(model, batch)
        opt.zero_grad(set_to_none=True)
        (target + 0.5 * mtp).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        history.append((target.item(), mtp.item()))
        if bar is not None:
            bar.set_postfix(target=f"{target.item():.3f}", mtp=f"{mtp.item():.3f}")
            bar.update()
    if bar is not None:
        bar.close()
    return model.requires_grad_(False), history


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="train-tiny", unit="step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=96)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", default=str(CHECKPOINT), help="safetensors path")


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    model, history = train(args.steps, args.batch_size, args.seq_len, args.lr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(model, out)
    last = history[-50:]
    target = sum(h[0] for h in last) / len(last)
    mtp = sum(h[1] for h in last) / len(last)
    print(f"trained {args.steps} steps in {time.time() - t0:.0f} s: target {target:.3f}, "
          f"MTP {mtp:.3f} nats/byte (mean of the last 50 steps); wrote {out} "
          f"({out.stat().st_size / 1e6:.2f} MB)")
    from dsv4spec.plot import pyplot

    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([h[0] for h in history], label="target (next byte)")
        ax.plot([h[1] for h in history], label="MTP (byte after next)")
        ax.set(xlabel="step", ylabel="cross entropy, nats/byte", title="train-tiny")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.savefig(out.with_suffix(".png"), dpi=100)
        print(f"wrote {out.with_suffix('.png')}")
    return 0
