"""Find vLLM's source and load single files of it, without importing ``vllm``.

``import vllm`` needs CUDA libraries and torch 2.14.0; tests and benchmarks need only a few
self-contained files of it: the DeepSeek-V4 model files (read as text for the structural checks),
the mHC kernel wrappers and their torch reference (executed by path over small stand-ins). They
come from vLLM's wheels, unpacked by :func:`unpack_wheel` (``make setup`` runs it once per
supported version into the ignored ``.vllm-src/<version>/``); ``$DSV4SPEC_VLLM_SRC`` points
elsewhere (a directory holding ``vllm/``).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import zipfile
from pathlib import Path
from types import ModuleType

from dsv4spec.integrations.source import load_module_from_path, package_file

SRC_ENV = "DSV4SPEC_VLLM_SRC"
# The versions whose sources `make setup` unpacks (each into DEFAULT_DIR/<version>/), and the one
# the benchmarks and tools read by default (the version their measurements were made on).
SOURCE_VERSIONS = ("0.33.0", "0.34.0")
SUPPORTED_VLLM_VERSION = "0.33.0"
# The unpacked copies `make setup` writes, relative to the repository root.
DEFAULT_DIR = ".vllm-src"
VERSION_FILE = "VLLM_VERSION"
# The files of vLLM's wheel the plugin's tests and benchmarks read or execute.
NEEDED = (
    "vllm/models/deepseek_v4/",  # the model modules: every platform's, as text
    "vllm/model_executor/kernels/mhc/",  # the mHC wrappers, TileLang kernels, torch reference
    "vllm/model_executor/layers/mhc.py",  # the CustomOps of the AMD/XPU/CPU models
    "vllm/model_executor/warmup/jit_warmup.py",  # what the TileLang kernel classes derive from
    "vllm/model_executor/warmup/jit_warmup_tilelang_helper.py",
    "vllm/tilelang_utils/__init__.py",
    "vllm/utils/math_utils.py",
    "vllm/utils/deep_gemm.py",  # the DeepGEMM wrappers the mHC functions call where supported
    "vllm/config/vllm.py",  # DSV4's compilation and CUDA-graph defaults
    "vllm/compilation/breakable_cudagraph.py",
    "vllm/plugins/__init__.py",  # how general plugins are loaded
    "vllm/v1/spec_decode/llm_base_proposer.py",  # the MTP draft passes of one step (0.33.0)
)


def _repo_default(version: str = SUPPORTED_VLLM_VERSION) -> Path:
    return Path(__file__).resolve().parents[4] / DEFAULT_DIR / version


def unpacked_source(version: str) -> Path | None:
    """The checkout's ``.vllm-src/<version>/`` where ``make setup`` has unpacked it, else None."""
    root = _repo_default(version)
    return root if _is_root(root) else None


def _is_root(root: Path) -> bool:
    return (root / "vllm" / "model_executor" / "kernels" / "mhc" / "tilelang.py").is_file()


def vllm_src() -> Path | None:
    """The directory holding vLLM's ``vllm/`` source folder, or ``None`` if none is found.

    ``$DSV4SPEC_VLLM_SRC`` wins; then the checkout's ``.vllm-src/<SUPPORTED_VLLM_VERSION>/``;
    then an installed ``vllm`` located on ``sys.path`` (nothing is imported).
    """
    env = os.environ.get(SRC_ENV)
    candidates = [Path(env)] if env else [_repo_default()]
    if not env:
        spec = importlib.machinery.PathFinder.find_spec("vllm")
        if spec is not None and spec.submodule_search_locations:
            candidates.append(Path(next(iter(spec.submodule_search_locations))).parent)
    for root in candidates:
        if _is_root(root):
            return root
    return None


def vllm_file(relpath: str, root: str | os.PathLike | None = None) -> Path:
    """Path of one file of vLLM's source, ``relpath`` inside the ``vllm/`` package folder of
    ``root`` (default :func:`vllm_src`).

    Raises ``FileNotFoundError`` if vLLM's source is not found or has no such file.
    """
    return package_file(vllm_src() if root is None else Path(root), "vllm", relpath, "vLLM",
                        f"run `make setup` or set {SRC_ENV}", vllm_version)


def vllm_version() -> str | None:
    """The version of the source :func:`vllm_src` found (its unpack record or metadata)."""
    root = vllm_src()
    if root is None:
        return None
    recorded = root / VERSION_FILE
    if recorded.is_file():
        return recorded.read_text().strip()
    for info in root.glob("vllm-*.dist-info"):
        return info.name.removeprefix("vllm-").removesuffix(".dist-info")
    return None


def load_vllm_module(relpath: str, name: str, root: str | os.PathLike | None = None) -> ModuleType:
    """Execute one ``.py`` file of vLLM by path as module ``name`` (registered in
    ``sys.modules`` before it runs, reused when already loaded from the same file). Whatever it
    imports from ``vllm`` must already be in ``sys.modules`` (stand-ins or files loaded so)."""
    return load_module_from_path(vllm_file(relpath, root), name)


def unpack_wheel(wheel: str | os.PathLike, dest: str | os.PathLike) -> int:
    """Unpack the :data:`NEEDED` ``.py`` files of vLLM's wheel into ``dest``; returns how many.

    The version (from the wheel's name) goes to ``dest/VLLM_VERSION``.
    """
    wheel, dest = Path(wheel), Path(dest)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py") and any(
                    name == n or (n.endswith("/") and name.startswith(n)) for n in NEEDED):
                archive.extract(name, dest)
                count += 1
    (dest / VERSION_FILE).write_text(wheel.name.split("-")[1] + "\n")
    return count


def main(argv: list[str] | None = None) -> int:
    """``python -m dsv4spec.integrations.vllm.source WHEEL DEST``: :func:`unpack_wheel`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m dsv4spec.integrations.vllm.source WHEEL DEST", file=sys.stderr)
        return 2
    count = unpack_wheel(*args)
    print(f"vLLM source: {count} files of {Path(args[0]).name} unpacked into {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
