"""Save and load the model's weights as safetensors, with DSV4's checkpoint tensor names.

Names are the module's parameter names, laid out to match DSV4's checkpoint (``embed.weight``,
``layers.N.attn.wq_a.weight``, ``layers.N.hc_attn_fn``, ``layers.N.attn.compressor.ape``,
``mtp.0.e_proj.weight``, ``hc_head_fn``, ...); the dense FFN's ``layers.N.ffn.w{1,2,3}.weight`` are
this reference model's own (DSV4 has experts there). Loading refuses a missing, unexpected or
mis-shaped tensor by name, and a file that is not safetensors by its path
(:class:`CheckpointError`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn


def save_weights(model: nn.Module, path: str | Path) -> None:
    """Write every parameter (contiguous, on CPU) to ``path``."""
    tensors = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}
    save_file(tensors, str(path))


class CheckpointError(ValueError):
    """A checkpoint that cannot serve the model: the message names the file and the first
    problem (missing, unreadable, not safetensors, a missing, unexpected, mis-shaped or
    non-floating-point tensor)."""


def _header(path: Path) -> dict[str, tuple[list[int], str]]:
    """Name -> (shape, safetensors dtype such as ``F32``) of each tensor in ``path``, from the
    header alone; :class:`CheckpointError` when ``path`` is missing, a directory, unreadable or
    not a safetensors file."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a safetensors file")
    try:
        size = path.stat().st_size
        with open(path, "rb"):
            pass
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e.strerror or e}") from e
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty, not a safetensors file")
    try:
        with safe_open(str(path), "pt") as f:
            return {name: (list(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                    for name in f.keys()}
    except Exception as e:  # safetensors raises SafetensorError (and OSError) on bad files
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file "
                              f"({_detail(e)})") from e


def _detail(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def check_weights(model: nn.Module, path: str | Path) -> None:
    """Check that ``path`` holds exactly ``model``'s parameters, with their shapes and a
    floating-point dtype, reading the file's header only (``model`` may live on the meta device).

    Raises
    ------
    CheckpointError
        A ``ValueError`` naming the file and its first problem: not a readable safetensors file,
        or the first missing, unexpected, mis-shaped or non-floating-point tensor.
    """
    path = Path(path)
    header = _header(path)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(header))
    if missing:
        more = (f" (and {len(missing) - 1} more of the model's {len(params)} tensors)"
                if len(missing) > 1 else "")
        raise CheckpointError(f"checkpoint {path} is missing {missing[0]!r}{more}")
    for name in sorted(header):
        shape, dtype = header[name]
        if name not in params:
            raise CheckpointError(f"checkpoint {path} has unexpected tensor {name!r}")
        if tuple(shape) != tuple(params[name].shape):
            raise CheckpointError(f"checkpoint {path}: {name!r} has shape {shape}, the model "
                                  f"expects {list(params[name].shape)}")
        if not dtype.startswith(("F", "BF")):
            raise CheckpointError(f"checkpoint {path}: {name!r} has dtype {dtype}, the model "
                                  f"expects a floating-point tensor")


@torch.no_grad()
def load_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Copy the tensors of ``path`` into ``model``'s parameters (cast to their dtype and device).

    Raises
    ------
    CheckpointError
        A ``ValueError`` from :func:`check_weights`, naming the file and its first problem;
        nothing is copied then.
    """
    check_weights(model, path)
    try:
        tensors = load_file(str(path))
    except Exception as e:  # a header that parses over data that does not
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file "
                              f"({_detail(e)})") from e
    for name, p in model.named_parameters():
        p.copy_(tensors[name].to(dtype=p.dtype, device=p.device))
    return model
