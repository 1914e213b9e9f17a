"""Greedy generation with MTP speculative decoding over the reference model."""

import importlib

__all__ = ["ROLLBACKS", "Engine", "Request"]


def __getattr__(name: str):
    # Imported on first use, so `dsv4spec train-tiny` checks its arguments before torch loads.
    if name in __all__:
        return getattr(importlib.import_module("dsv4spec.engine.generate"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
