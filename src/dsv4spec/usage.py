"""Command-line arguments a user gets wrong: argparse types with ranges, the device check, and
:class:`UsageError` for what only the command can check (the model's context, this machine's
memory, a checkpoint's contents). The ``dsv4spec`` command reports each as one line. Also what
the command and the test suite take from the machine: torch's CPU threads
(:func:`use_cpu_threads`) and the Triton release to install where none is (:func:`triton_hint`)."""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads on first use: arguments are checked before its second of import
    import torch


ON_VALUES = ("1", "true", "on", "yes", "y")
OFF_VALUES = ("0", "false", "off", "no", "n", "")


def env_switch(name: str, default: bool) -> bool:
    """The boolean environment switch ``name`` (unset or empty: ``default``): ``ON_VALUES`` or
    ``OFF_VALUES``, any case; any other value is logged at WARNING, naming it, and is off."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    word = value.strip().lower()
    if word in ON_VALUES:
        return True
    if word not in OFF_VALUES:
        logging.getLogger("dsv4spec").warning(
            "%s=%r is not a switch value (on: %s; off: %s): treated as off", name, value,
            "/".join(ON_VALUES), "/".join(v for v in OFF_VALUES if v))
    return False


def switch_setting(name: str, default: bool) -> str:
    """The environment switch ``name`` as a report shows it: ``NAME=value`` as set, and
    otherwise what it is taken as (:func:`env_switch`): ``NAME unset: on``, ``NAME empty: on``,
    ``NAME='maybe', not a switch value: taken as off``."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return f"{name} {'unset' if value is None else 'empty'}: {'on' if default else 'off'}"
    if value.strip().lower() in ON_VALUES + OFF_VALUES:
        return f"{name}={value}"
    return f"{name}={value!r}, not a switch value: taken as off"


class UsageError(ValueError):
    """A bad command-line argument (``argument``, e.g. ``"--checkpoint"``) found after parsing:
    a value the model, the engine or this machine cannot serve. The command prints
    ``dsv4spec <command>: error: argument <argument>: <message>`` and exits with status 2."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def int_in(low: int, high: int | None = None, hint: str = ""):
    """An argparse ``type``: an int in ``[low, high]`` (``high`` None: no upper bound)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed}{hint}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in its own messages
    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def nonempty(text: str) -> str:
    """An argparse ``type``: a non-empty string."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def resolve_device(name: str | None, argument: str = "--device") -> torch.device:
    """``name`` (``cpu``, ``cuda`` or ``cuda:N``; None: CUDA if available, else the CPU) as a
    device this machine has, or :class:`UsageError`."""
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UsageError(argument, f"must be cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is built without CUDA" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise UsageError(argument, f"{name} asked for, but {why}; use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise UsageError(argument, f"{name} asked for, but this machine has {count} CUDA "
                             f"device(s): cuda:0..cuda:{count - 1}")
    return device


# Where either is set, torch takes its thread count from it, and so does this package.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def use_cpu_threads() -> None:
    """Cap torch's intra-op threads at the CPUs this process may use (``os.sched_getaffinity``):
    torch's default is a thread per core it counts, on some builds the machine's rather than the
    process's, and a thread without a core of its own waits for one (many times slower). Nothing
    changes where ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, or on a platform without
    affinity. If torch is not imported yet, the cap is applied right after its import, so a
    command that refuses its arguments first still does so without loading torch."""
    if any(os.environ.get(name, "").strip() for name in THREAD_ENV):
        return
    if "torch" in sys.modules:
        _cap_threads()
    elif not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())


def _cap_threads() -> None:
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity to read
        return
    if 0 < usable < torch.get_num_threads():
        torch.set_num_threads(usable)


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds torch as the other finders do, and runs :func:`_cap_threads` once its module has
    run (then leaves ``sys.meta_path``)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec = None if find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_cap(module) -> None:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            exec_module(module)
            _cap_threads()

        spec.loader.exec_module = exec_then_cap
        return spec


# The Triton release, per torch major.minor, that packaged tables were measured with and whose C
# launcher the direct launch binds (kernels.launch.DIRECT_LAUNCH_LAYOUTS): docs/tables.md,
# Validated stacks (3.6 with torch 2.11 on the GPU and 2.13 in CPU CI; 3.8, what torch 2.14.x
# requires). A plain `pip install triton` takes the newest release, which has neither.
TRITON_FOR_TORCH = {"2.11": "3.6.0", "2.12": "3.6.0", "2.13": "3.6.0", "2.14": "3.8.0"}


def triton_for_installed_torch() -> tuple[str, str | None, str | None]:
    """The installed torch's version (read from its distribution's metadata, without importing
    it), its major.minor, and the Triton release dsv4spec pairs with it (None: none)."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch built from source
        torch_version = sys.modules["torch"].__version__ if "torch" in sys.modules else "?"
    minor = re.match(r"(\d+\.\d+)", torch_version)
    minor = minor.group(1) if minor else None
    return torch_version, minor, TRITON_FOR_TORCH.get(minor or "")


def triton_hint() -> str:
    """What to install where Triton is missing, for the installed torch:
    ``python -m pip install triton==3.6.0`` and why that release."""
    torch_version, minor, release = triton_for_installed_torch()
    if release is not None:
        return (f"python -m pip install triton=={release} (the release dsv4spec's tables and "
                f"direct launch cover with torch {minor})")
    return (f"python -m pip install triton (dsv4spec has tables for Triton "
            f"{' and '.join(sorted({r.rsplit('.', 1)[0] for r in TRITON_FOR_TORCH.values()}))} "
            f"only, which pair with torch {min(TRITON_FOR_TORCH)}-{max(TRITON_FOR_TORCH)}, not "
            f"with this torch {torch_version})")
