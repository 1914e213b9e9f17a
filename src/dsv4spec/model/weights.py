"""Save and load the model's weights as safetensors, with DSV4's checkpoint tensor names.

Names are the module's parameter names, laid out to match DSV4's checkpoint (``embed.weight``,
``layers.N.attn.wq_a.weight``, ``layers.N.hc_attn_fn``, ``layers.N.attn.compressor.ape``,
``mtp.0.e_proj.weight``, ``hc_head_fn``, ...); the dense FFN's ``layers.N.ffn.w{1,2,3}.weight`` are
this reference model's own (DSV4 has experts there). Loading refuses a missing, unexpected or
mis-shaped tensor by name.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn


def save_weights(model: nn.Module, path: str | Path) -> None:
    """Write every parameter (contiguous, on CPU) to ``path``."""
    tensors = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}
    save_file(tensors, str(path))


@torch.no_grad()
def load_weights(model: nn.Module, path: str | Path) -> nn.Module:
    """Copy the tensors of ``path`` into ``model``'s parameters (cast to their dtype and device).

    Raises
    ------
    ValueError
        Naming the first missing, unexpected or mis-shaped tensor; nothing is copied then.
    """
    tensors = load_file(str(path))
    params = dict(model.named_parameters())
    for name in sorted(params):
        if name not in tensors:
            raise ValueError(f"checkpoint {path} is missing {name!r}")
    for name in sorted(tensors):
        if name not in params:
            raise ValueError(f"checkpoint {path} has unexpected tensor {name!r}")
        if tuple(tensors[name].shape) != tuple(params[name].shape):
            raise ValueError(f"{name!r} has shape {list(tensors[name].shape)} in {path}, the "
                             f"model expects {list(params[name].shape)}")
    for name, p in params.items():
        p.copy_(tensors[name].to(dtype=p.dtype, device=p.device))
    return model
