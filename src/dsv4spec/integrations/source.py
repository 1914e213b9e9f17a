"""Single files of a serving engine's source, found and executed by path without importing the
engine's package, and the empty stand-in packages such files are executed under.

Importing SGLang or vLLM pulls in CUDA-only libraries; tests and benchmarks need only a few
self-contained files of either. Each engine's ``source`` module finds its source tree; this one
holds what does not depend on the engine: a file's path inside a package folder, executing a file
as a module, and the ``sys.modules`` entries for the dotted packages such a file imports from.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


def package_file(root: Path | None, package: str, relpath: str, engine: str, missing: str,
                 version: Callable[[], str | None]) -> Path:
    """Path of ``relpath`` inside the ``package`` folder of ``root``.

    Raises ``FileNotFoundError``: ``"{engine}'s source not found: {missing}"`` where ``root`` is
    None, or naming the path and ``version()`` where the file does not exist.
    """
    if root is None:
        raise FileNotFoundError(f"{engine}'s source not found: {missing}")
    path = root / package / relpath
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist ({engine} {version()})")
    return path


def load_module_from_path(path: Path, name: str) -> ModuleType:
    """Execute the ``.py`` file ``path`` as module ``name`` and return it, reused when ``name``
    is already loaded from the same file.

    The module is registered in ``sys.modules`` before it runs (dataclasses and Triton's JIT look
    it up by name) and removed again if it raises. Whatever it imports must be importable: the
    standard library, torch, or modules already in ``sys.modules``.
    """
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def stand_in_package(name: str, added: list[str]) -> ModuleType:
    """``sys.modules[name]``, created as an empty package when absent (its name then appended to
    ``added``). It has no search path: its children resolve through ``sys.modules`` only, never
    from disk, so nothing of the real engine is imported through it."""
    module = sys.modules.get(name)
    if module is None:
        module = ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
        added.append(name)
    return module


def link_to_parent(name: str) -> None:
    """Bind module ``name`` as an attribute of its parent package, as an import would, where the
    parent is loaded and has no such attribute yet."""
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and not hasattr(sys.modules[parent], child):
        setattr(sys.modules[parent], child, sys.modules[name])
