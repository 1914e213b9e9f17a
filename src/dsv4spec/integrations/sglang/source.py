"""Find SGLang's installed source and load single files of it, without importing ``sglang``.

``import sglang`` pulls in CUDA-only libraries; tests and benchmarks need a few self-contained
files of it (the peer kernels, the hook registry) and the source text for structural checks.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
from pathlib import Path
from types import ModuleType

from dsv4spec.integrations.source import load_module_from_path, package_file

ROOT_ENV = "DSV4SPEC_SGLANG_ROOT"
# SGLang 0.5.23's mHC ops (mhc_pre, mhc_post, mhc_fused_post_pre and its DeepGEMM decision)
MHC_MODULE = "sglang.kernels.ops.layernorm.mhc"


def sglang_root() -> Path | None:
    """The directory holding SGLang's ``sglang/`` package folder, or ``None`` if not found.

    ``$DSV4SPEC_SGLANG_ROOT`` wins (a directory containing ``sglang/``, e.g. an unpacked wheel);
    otherwise the installed package is located on ``sys.path``. Nothing is imported: finding the
    spec of a top-level package does not execute its ``__init__.py``.
    """
    env = os.environ.get(ROOT_ENV)
    if env:
        root = Path(env)
        return root if (root / "sglang" / "__init__.py").is_file() else None
    # PathFinder searches sys.path only; importlib.util.find_spec would consult sys.modules
    # first, where a test may have put stand-in modules without a spec.
    spec = importlib.machinery.PathFinder.find_spec("sglang")
    if spec is None:
        try:
            spec = importlib.util.find_spec("sglang")
        except (ValueError, ImportError):
            spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def sglang_file(relpath: str) -> Path:
    """Path of one file of SGLang's source, ``relpath`` inside the package.

    Parameters
    ----------
    relpath : str
        Relative to the ``sglang/`` package folder, e.g. ``"kernels/ops/layernorm/mhc_head.py"``.

    Raises
    ------
    FileNotFoundError
        If SGLang's source is not found, or has no such file.
    """
    return package_file(sglang_root(), "sglang", relpath, "SGLang",
                        f"install sglang or set {ROOT_ENV}", sglang_version)


def load_sglang_module(relpath: str, name: str | None = None) -> ModuleType:
    """Execute one ``.py`` file of SGLang by path and return it as a module.

    The file must import only what is importable without ``sglang`` (torch, triton, stdlib).
    The module is registered in ``sys.modules`` under ``name`` (default: a private name derived
    from ``relpath``) and reused when that name is already loaded from the same file.

    Parameters
    ----------
    relpath : str
        As in :func:`sglang_file`, e.g. ``"kernels/ops/kvcache/dsv4_c128_cleanup.py"``.
    name : str, optional
        Module name; pass ``"sglang.srt.plugins.hook_registry"`` to stand in for the real one.
    """
    path = sglang_file(relpath)
    if name is None:
        name = "_dsv4spec_sglang_" + relpath.removesuffix(".py").replace("/", "_")
    return load_module_from_path(path, name)


def sglang_version() -> str | None:
    """Version of the SGLang found by :func:`sglang_root` (from its metadata), else ``None``."""
    root = sglang_root()
    if root is not None:
        for dist in importlib.metadata.distributions(name="sglang", path=[str(root)]):
            return dist.version
        # a source tree without its wheel's metadata: the version file its build generated
        version_file = root / "sglang" / "_version.py"
        if version_file.is_file():
            m = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
                          version_file.read_text(errors="replace"), re.MULTILINE)
            if m:
                return m[1]
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
