"""Command-line arguments a user gets wrong: argparse types with ranges, the device check, and
:class:`UsageError` for what only the command can check (the model's context, this machine's
memory, a checkpoint's contents). The ``dsv4spec`` command reports each as one line."""

from __future__ import annotations

import argparse
import logging
import os
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
