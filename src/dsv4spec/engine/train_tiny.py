"""``dsv4spec train-tiny``: train the ``tiny`` target and its MTP block on the CPU and write its
checkpoint (safetensors) and loss plot; use it with ``dsv4spec generate --checkpoint PATH``.

Time: about 0.2 s per step at the default batch and sequence length on a 2-core CPU (measured:
100 steps in 21-29 s, the first few slower), so the default 1,500 steps take about five minutes
there; ``--steps 1`` is a quick check. Fewer than 40
steps train at a constant learning rate (too short to warm up), from 40 on with a one-cycle
schedule. Existing files are not replaced without ``--force``. A checkpoint that cannot be
written where asked (a disk filled during training) is saved in the temporary directory instead,
and the error names both paths. To refresh the checkpoint shipped
with the package, from a source checkout:
``dsv4spec train-tiny --out src/dsv4spec/model/checkpoints/tiny.safetensors --force``."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dsv4spec.plot import pyplot
from dsv4spec.usage import UsageError, int_in, positive_float

DEFAULT_OUT = "dsv4spec-tiny.safetensors"
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
NEEDED_BYTES = 4 * 2**20  # the tiny checkpoint (1.3 MB) and its plot (40 kB), with room to spare
# One training step's peak memory on the CPU past the process's own (ru_maxrss), measured at batch
# x seq-len 16x96, 256x96, 4x1024 and 2x4096 and fitted within 3 %: per token, the activations
# autograd keeps (every layer and the MTP block); per token and key attended to (the window and
# the compressed entries), the attention scores kept; the corpus, the model and AdamW's state
# (tests/test_cli_errors.py measures a step against it).
STEP_BYTES_PER_TOKEN = 95_700
STEP_BYTES_PER_SCORE = 262
STEP_BASE_BYTES = 143 * 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int_in(1), default=1500,
                        help="optimizer steps, >= 1 (about 0.2 s each on a 2-core CPU)")
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
    """Refuse (:class:`UsageError`) an ``--out`` that is a directory or anything else but a
    regular file (a device, a FIFO, a socket: ``force`` too, since a rename would replace the node
    itself), that exists with its plot unless ``force``, or whose folder cannot be created or
    written (a temporary file created and removed there) or lacks room for the checkpoint:
    checked before training, so a refused run writes nothing and a run that trains can save."""
    if out.suffix == ".png":
        raise UsageError("--out", f"{out} would be overwritten by its own loss plot; use a "
                         f".safetensors path")
    for path in (out, out.with_suffix(".png")):
        if path.is_dir():
            raise UsageError("--out", f"{path} is a directory; give a file path such as "
                             f"{path / DEFAULT_OUT}")
        if path.exists() and not path.is_file():
            raise UsageError("--out", f"{path} is not a regular file (a device, a FIFO or a "
                             f"socket), which is never replaced; choose another path")
        if path.exists() and not force:
            raise UsageError("--out", f"{path} exists; pass --force to replace it, or choose "
                             f"another path")
    parent = out.parent if str(out.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UsageError("--out", f"{parent} is not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{out.name}.", suffix=".check"):
            pass
        free = shutil.disk_usage(parent).free
    except OSError as e:
        raise UsageError("--out", f"cannot write in {parent}: {e.strerror or e}") from None
    if free < NEEDED_BYTES:
        raise UsageError("--out", f"{parent} has {free / 1e6:.1f} MB free, the checkpoint and "
                         f"its plot need about {NEEDED_BYTES / 1e6:.0f} MB")


def step_bytes(batch_size: int, seq_len: int) -> int:
    """The memory one training step of the tiny preset takes, with ``generate``'s ``HEADROOM``."""
    base, per_sequence = _step_parts(seq_len)
    return int(base + batch_size * per_sequence)


def _step_parts(seq_len: int) -> tuple[float, float]:
    """:func:`step_bytes` as its part for any batch and its part per sequence."""
    from dsv4spec.engine.run import HEADROOM
    from dsv4spec.model.config import preset

    cfg = preset("tiny")
    keys = cfg.sliding_window + seq_len // min(r for r in cfg.compress_ratios if r) + 1
    per_token = STEP_BYTES_PER_TOKEN + keys * STEP_BYTES_PER_SCORE
    return STEP_BASE_BYTES * HEADROOM, seq_len * per_token * HEADROOM


def check_memory(batch_size: int, seq_len: int) -> None:
    """Refuse (:class:`UsageError`) a step the CPU's memory cannot hold, as ``generate`` does
    (:func:`dsv4spec.engine.run.available_bytes`), naming the largest batch that fits, or
    ``--seq-len`` when not one sequence does."""
    import torch

    from dsv4spec.engine import run

    budget = run.available_bytes(torch.device("cpu"))
    need = step_bytes(batch_size, seq_len)
    if budget is None or need <= budget[0]:
        return
    free, where = budget
    base, per_sequence = _step_parts(seq_len)
    fits = max(0, int((free - base) // per_sequence))
    head = f"about {run._bytes(need)} needed, cpu has {run._bytes(free)} {where}"
    if fits:
        raise UsageError("--batch-size", f"{batch_size} sequences of {seq_len} bytes per step do "
                         f"not fit: {head}; try --batch-size {fits}")
    raise UsageError("--seq-len", f"{seq_len} bytes per sequence do not fit even one to a step: "
                     f"{head}; try a shorter --seq-len")


def write_replacing(path: Path, write, exclusive: bool) -> Path:
    """``write(tmp)`` into a temporary file beside ``path``, given the mode the umask gives a new
    file, then renamed to ``path`` (a reader never sees half a file). ``exclusive``: a ``path``
    that appeared meanwhile (another run) is kept, and this run's file is renamed beside it
    instead. Returns where the file went."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        if not exclusive:
            os.replace(tmp, path)
            return path
        try:
            os.link(tmp, path)  # fails if path exists: no run silently replaces another's file
            return path
        except FileExistsError:
            kept = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
            os.replace(tmp, kept)
            return kept
    finally:
        tmp.unlink(missing_ok=True)


def _why(e: Exception) -> str:
    """A failed write's reason: an OSError's ``strerror``, the OS message safetensors wraps
    (``I/O error: No space left on device (os error 28) at path ...``), else the message."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    found = re.search(r"I/O error: (.*?) \(os error \d+\)", str(e))
    return found[1] if found else " ".join(str(e).split())


def save_checkpoint(model, out: Path, exclusive: bool) -> tuple[Path | None, str]:
    """``model``'s weights written to ``out`` (:func:`write_replacing`); where that fails (a
    full disk, a folder gone read-only during training), to the temporary directory instead, so
    the training is not lost. Returns where they went (None: nowhere) and, on a failure, one
    line that names the path that could not be written, why, and what was done instead."""
    from safetensors import SafetensorError

    from dsv4spec.model.weights import save_weights

    try:
        return write_replacing(out, lambda tmp: save_weights(model, tmp), exclusive), ""
    except (OSError, SafetensorError) as e:
        failed = f"cannot write {out}: {_why(e)}"
    kept = Path(tempfile.gettempdir()) / out.name
    try:
        kept = write_replacing(kept, lambda tmp: save_weights(model, tmp), exclusive=True)
    except (OSError, SafetensorError) as e:
        return None, (f"{failed}; nor in {kept.parent} ({_why(e)}): the trained weights are "
                      f"lost, free some space and train again")
    return kept, f"{failed}; the trained weights were saved to {kept} instead"


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
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return True


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_out(out, args.force)  # before torch is imported: a refusal takes no time
    check_memory(args.batch_size, args.seq_len)
    import torch

    from dsv4spec.engine.train import train

    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    model, history = train(args.steps, args.batch_size, args.seq_len, args.lr,
                           stop_on_interrupt=True)
    done = len(history)
    if done == 0:
        print("dsv4spec train-tiny: interrupted before the first step ended; nothing was saved",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    wrote, failed = save_checkpoint(model, out, exclusive=not args.force)
    if failed:
        print(f"dsv4spec train-tiny: error: {failed}", file=sys.stderr)
        return EXIT_FAILED
    last = history[-50:]
    target = sum(h[0] for h in last) / len(last)
    mtp = sum(h[1] for h in last) / len(last)
    steps = f"{done} step{'s' * (done != 1)}"
    if done < args.steps:
        print(f"dsv4spec train-tiny: interrupted after {steps} of {args.steps}; saving the "
              f"model as trained so far", file=sys.stderr)
    print(f"trained {steps} in {time.time() - t0:.0f} s: target {target:.3f}, "
          f"MTP {mtp:.3f} nats/byte (mean of the last {len(last)}); wrote {wrote} "
          f"({wrote.stat().st_size / 1e6:.2f} MB)")
    if wrote != out:
        print(f"dsv4spec train-tiny: {out} appeared during training (another run?) and was "
              f"kept; this run's checkpoint is {wrote}", file=sys.stderr)
    png = wrote.with_suffix(".png")
    plot = pyplot()
    if plot is not None:
        written = write_replacing(png, lambda tmp: plot_losses(history, tmp),
                                  exclusive=not args.force)
        print(f"wrote {written}")
    else:
        print(f"dsv4spec train-tiny: no loss plot ({png}): matplotlib is not installed "
              f"(python -m pip install matplotlib)", file=sys.stderr)
    return EXIT_INTERRUPTED if done < args.steps else 0
