"""Build a model: a preset's :class:`Transformer` on a device, its weights from a checkpoint or
random, cast for serving. The one place models are constructed (CLI, demo, trainer, benchmarks)."""

from __future__ import annotations

from pathlib import Path

import torch

from dsv4spec.model.config import ModelConfig, preset
from dsv4spec.model.model import Transformer, init_weights
from dsv4spec.model.weights import load_weights

# Trained checkpoints shipped with the package, one per preset name (``dsv4spec train-tiny``
# writes tiny's).
CHECKPOINTS = Path(__file__).with_name("checkpoints")
TINY_CHECKPOINT = CHECKPOINTS / "tiny.safetensors"


def packaged_checkpoint(name: str) -> Path | None:
    """The shipped checkpoint of preset ``name``, or None."""
    path = CHECKPOINTS / f"{name}.safetensors"
    return path if path.exists() else None


def build_model(config: str | ModelConfig, checkpoint: str | Path | None = None, *,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0, trainable: bool = False) -> Transformer:
    """A model of ``config`` (a preset name or a :class:`ModelConfig`) on ``device``.

    Weights come from ``checkpoint`` (safetensors), or are random (``init_weights(seed)``) when it
    is None. ``dtype``: float64 casts everything; other dtypes go through
    :meth:`Transformer.cast` (what DSV4 keeps in float32 stays float32). Parameters are frozen
    unless ``trainable``.
    """
    cfg = preset(config) if isinstance(config, str) else config
    with torch.device(device):
        model = Transformer(cfg)
    if checkpoint is None:
        init_weights(model, seed=seed)
    else:
        load_weights(model, Path(checkpoint))
    model.requires_grad_(trainable)
    return model.double() if dtype == torch.float64 else model.cast(dtype)
