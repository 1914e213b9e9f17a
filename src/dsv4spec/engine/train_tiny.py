"""``dsv4spec train-tiny``: train the ``tiny`` target and its MTP block on the CPU and write its
checkpoint (safetensors) and loss plot; use it with ``dsv4spec generate --checkpoint PATH``.

Time: 2-4 s per step at the default batch and sequence length on a 2-core CPU (measured), so the
default 1,500 steps take one to two hours there; ``--steps 1`` is a quick check. Fewer than 40
steps train at a constant learning rate (too short to warm up), from 40 on with a one-cycle
schedule. Existing files are not replaced without ``--force``. To refresh the checkpoint shipped
with the package, from a source checkout:
``dsv4spec train-tiny --out src/dsv4spec/model/checkpoints/tiny.safetensors --force``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from dsv4spec.engine.train import train
from dsv4spec.model.weights import save_weights
from dsv4spec.plot import pyplot
from dsv4spec.usage import UsageError, int_in, positive_float

DEFAULT_OUT = "dsv4spec-tiny.safetensors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int_in(1), default=1500,
                        help="optimizer steps, >= 1 (2-4 s each on a 2-core CPU)")
    parser.add_argument("--batch-size", type=int_in(1), default=16,
                        help="sequences per step, >= 1")
    parser.add_argument("--seq-len", type=int_in(1, 4096), default=96,
                        help="bytes per training sequence, 1..4096")
    parser.add_argument("--lr", type=positive_float, default=3e-3,
                        help="peak learning rate, > 0")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"safetensors path; the loss plot goes beside it as .png (default: "
                        f"{DEFAULT_OUT} in the working directory)")
    parser.add_argument("--force", action="store_true",
                        help="replace --out and its .png if they exist")


def check_out(out: Path, force: bool) -> None:
    """Refuse (:class:`UsageError`) an ``--out`` that is a directory, or that exists with its
    plot unless ``force``: checked before training, so a refused run writes nothing."""
    if out.suffix == ".png":
        raise UsageError("--out", f"{out} would be overwritten by its own loss plot; use a "
                         f".safetensors path")
    for path in (out, out.with_suffix(".png")):
        if path.is_dir():
            raise UsageError("--out", f"{path} is a directory; give a file path such as "
                             f"{path / DEFAULT_OUT}")
        if path.exists() and not force:
            raise UsageError("--out", f"{path} exists; pass --force to replace it, or choose "
                             f"another path")
    parent = out.parent if str(out.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError("--out", f"{parent} is not a directory")


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
    out = Path(args.out)
    check_out(out, args.force)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    model, history = train(args.steps, args.batch_size, args.seq_len, args.lr)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(model, out)
    last = history[-50:]
    target = sum(h[0] for h in last) / len(last)
    mtp = sum(h[1] for h in last) / len(last)
    steps = f"{args.steps} step{'s' * (args.steps != 1)}"
    print(f"trained {steps} in {time.time() - t0:.0f} s: target {target:.3f}, "
          f"MTP {mtp:.3f} nats/byte (mean of the last {len(last)}); wrote {out} "
          f"({out.stat().st_size / 1e6:.2f} MB)")
    if plot_losses(history, out.with_suffix(".png")):
        print(f"wrote {out.with_suffix('.png')}")
    return 0
