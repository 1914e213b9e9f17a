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


def stream_capturing(device: torch.device | str | int | None = None) -> bool:
    """Whether the current CUDA stream is being captured into a CUDA graph.

    False for non-CUDA devices, without asking CUDA: ``torch.cuda.is_current_stream_capturing``
    raises on CPU-only torch builds. ``device`` is a device, a device index (a tensor's
    ``get_device()``, -1 for the CPU: the cheapest form), or ``None`` for the current device.
    """
    if isinstance(device, int):  # a tensor's get_device(): -1 for the CPU
        if device < 0:
            return False
    elif device is not None:
        if torch.device(device).type != "cuda":
            return False
    elif not torch.cuda.is_available():
        return False
    return torch._C._cuda_isCurrentStreamCapturing()
