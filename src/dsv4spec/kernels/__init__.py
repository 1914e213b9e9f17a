"""Triton device code and launchers. Import-light: nothing here imports ``dsv4spec.ops``, and
this module imports no Triton (a CPU-only torch brings none; ``dsv4spec doctor`` still answers)."""

import importlib
import os

import torch

# The Triton releases whose C launcher :mod:`dsv4spec.kernels.launch` binds directly, each with
# its argument layout (see there).
DIRECT_LAUNCH_LAYOUTS = {"3.6.0": "per_signature", "3.8.0": "generic"}


def triton_version() -> str | None:
    """The importable Triton's version, or None where none is installed."""
    try:
        return importlib.import_module("triton").__version__
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        return None


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
