"""``dsv4spec train-tiny``: train the ``tiny`` target and its MTP block on the CPU (minutes) and
write the packaged checkpoint (safetensors) and its loss plot."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from dsv4spec.engine.train import train
from dsv4spec.model.build import TINY_CHECKPOINT
from dsv4spec.model.weights import save_weights
from dsv4spec.plot import pyplot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=96)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", default=str(TINY_CHECKPOINT), help="safetensors path")


def plot_losses(history: list[tuple[float, float]], path: Path) -> bool:
    """The training curve as a PNG at ``path``; False when matplotlib is absent."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h[0] for h in history], label="target (next byte)")
    ax.plot([h[1] for h in history], label="MTP (byte after next)")
    ax.set(xlabel="step", ylabel="cross entropy, nats/byte", title="train-tiny")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return True


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
    if plot_losses(history, out.with_suffix(".png")):
        print(f"wrote {out.with_suffix('.png')}")
    return 0
