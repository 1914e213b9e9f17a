"""Triton device code and launchers. Import-light: nothing here imports ``dsv4spec.ops``."""

import os

import torch


def interpreter_enabled() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_runs_on(device: torch.device) -> bool:
    """Whether a Triton kernel can run on tensors of ``device``: CUDA, or CPU in the interpreter."""
    device = torch.device(device)
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreter_enabled()


def on_rocm() -> bool:
    """True on a ROCm build of torch, whose ``cuda`` devices are AMD GPUs."""
    return torch.version.hip is not None
