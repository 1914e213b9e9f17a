"""DeepGEMM for the engines' mHC peers: whether their pre-norm GEMM is DeepGEMM's or TileLang's.

SGLang 0.5.23 (which requires ``sgl-deep-gemm==0.2.3.post2``; ``SGLANG_OPT_DEEPGEMM_HC_PRENORM``
on by default) and vLLM 0.33.0 / 0.34.0 (which vendor DeepGEMM 2.8.1 and prefer an installed
``deep_gemm``) compute the mHC pre-norm GEMM with DeepGEMM's ``tf32_hc_prenorm_gemm`` wherever
``deep_gemm`` imports on a Hopper or newer GPU: ``mhc_pre`` at every token count, the fused
boundary above its one-launch TileLang kernel's 32 tokens. Elsewhere they run their TileLang GEMM.

``--deepgemm`` picks what the peers run: ``auto`` (the default) does what each engine does, DeepGEMM
where ``deep_gemm`` imports (vLLM: or its vendored copy) on a GPU of compute capability 9.0 or
newer, unless the engine's switches or vLLM 0.34.0's nvcc check decline it
(:func:`engine_declines`); ``on`` requires it
(:class:`DeepGemmUnavailable` when it does not import); ``off`` measures the TileLang GEMM.
``scripts/deepgemm-bundle.sh`` prepares a ``deep_gemm`` that imports on a GPU machine whose
torch the released wheels were not built for (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
from types import ModuleType

import torch

from dsv4spec.integrations import tables

__all__ = ["CHOICES", "DEEPGEMM", "TILELANG", "DeepGemmUnavailable", "add_argument",
           "deepgemm_above", "describe", "gemm_path", "measured_against", "resolve"]

CHOICES = ("auto", "on", "off")
# the two pre-norm GEMM paths a peer can measure, as results record them
DEEPGEMM, TILELANG = "deepgemm", "tilelang"
# Both engines' fused boundary runs its one-launch TileLang kernel up to this many tokens (SGLang's
# ``fma_token_threshold``, vLLM's ``mhc_fused_post_pre_split_config``), DeepGEMM's GEMM above.
FUSED_TILELANG_MAX_TOKENS = 32
# the exceptions SGLang's configurer treats as "DeepGEMM not installed"
_IMPORT_ERRORS = (ImportError, OSError, RuntimeError)


class DeepGemmUnavailable(RuntimeError):
    """``--deepgemm on`` where ``deep_gemm`` does not import."""


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deepgemm", choices=CHOICES, default="auto",
        help="the engines' mHC pre-norm GEMM: DeepGEMM's tf32_hc_prenorm_gemm (on), their "
             "TileLang GEMM (off), or what the engines do (auto, the default: DeepGEMM where "
             "deep_gemm imports on a GPU of compute capability 9.0 or newer)")


def _capability() -> tuple[int, int]:
    if torch.version.hip is None and torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (0, 0)


# vLLM imports an installed deep_gemm first, else the copy its wheel vendors
_VLLM_VENDORED = "vllm.third_party.deep_gemm"
# the environment switches each engine reads before it runs DeepGEMM's pre-norm GEMM, on unless
# set to one of its false values (SGLang's EnvBool; vLLM's envs.py reads an int)
_ENGINE_SWITCHES = {"sglang": ("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "SGLANG_ENABLE_JIT_DEEPGEMM"),
                    "vllm": ("VLLM_USE_DEEP_GEMM",)}
_FALSE = ("false", "0", "no", "n")
# DeepGEMM's JIT needs nvcc 12.9 or newer; vLLM 0.34.0 checks it and runs TileLang otherwise
_NVCC_MIN = (12, 9)


def _import(engine: str = "sglang") -> tuple[ModuleType | None, str]:
    errors = []
    for name in ("deep_gemm", *((_VLLM_VENDORED,) if engine == "vllm" else ())):
        try:
            return importlib.import_module(name), ""
        except _IMPORT_ERRORS as err:
            errors.append(f"{name}: {type(err).__name__}: {err}")
    return None, "; ".join(errors)


def _nvcc_version() -> tuple[int, int] | None:
    """The release of the nvcc DeepGEMM's JIT would run (``CUDA_HOME``/``CUDA_PATH``, else the
    one on PATH, else /usr/local/cuda; ``DG_JIT_NVCC_COMPILER`` wins), as vLLM 0.34.0's
    ``_deep_gemm_nvcc_path`` finds it; None where there is none or its version is unreadable."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        found = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(found)) if found else "/usr/local/cuda"
    nvcc = (os.environ.get("DG_JIT_NVCC_COMPILER") or os.environ.get("DJ_JIT_NVCC_COMPILER")
            or os.path.join(home, "bin", "nvcc"))
    nvcc = shutil.which(nvcc) if os.path.exists(home) else None
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2])) if match else None


def engine_declines(engine: str) -> str | None:
    """Why ``engine`` would run its TileLang GEMM although ``deep_gemm`` imports on a Hopper GPU,
    as its own decision reads (SGLang 0.5.23's ``_use_deep_gemm_hc_prenorm()``: its two switches;
    vLLM's ``is_deep_gemm_supported()``: ``VLLM_USE_DEEP_GEMM`` and, in 0.34.0, an nvcc of 12.9
    or newer), or None where it runs DeepGEMM's."""
    for switch in _ENGINE_SWITCHES[engine]:
        if os.environ.get(switch, "1").strip().lower() in _FALSE:
            return f"{switch}={os.environ[switch]}"
    if engine == "vllm":
        version = _nvcc_version()
        if version is None:
            return "no nvcc for DeepGEMM's JIT (vLLM 0.34.0 runs TileLang then)"
        if version < _NVCC_MIN:
            return (f"nvcc {version[0]}.{version[1]} (vLLM 0.34.0 needs "
                    f"{_NVCC_MIN[0]}.{_NVCC_MIN[1]} for DeepGEMM and runs TileLang)")
    return None


def resolve(choice: str, engine: str = "sglang") -> ModuleType | None:
    """The ``deep_gemm`` module ``engine``'s peers should run, or None for their TileLang GEMM:
    ``auto`` as the engine decides (:func:`engine_declines`; vLLM's vendored copy where no
    ``deep_gemm`` is installed).

    Raises ``ValueError`` for a ``choice`` not in :data:`CHOICES`, :class:`DeepGemmUnavailable`
    for ``"on"`` where ``deep_gemm`` does not import.
    """
    if choice not in CHOICES:
        raise ValueError(f"deepgemm: expected one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "off":
        return None
    module, error = _import(engine)
    if module is None:
        if choice == "on":
            raise DeepGemmUnavailable(
                f"--deepgemm on: deep_gemm does not import ({error}); build it with "
                "scripts/deepgemm-bundle.sh and put it on PYTHONPATH (docs/benchmarks.md), or "
                "pass --deepgemm off")
        return None
    if choice == "auto" and (_capability()[0] < 9 or engine_declines(engine) is not None):
        return None  # the engines enable it from Hopper on, where their switches allow
    return module


# the ops with a pre-norm GEMM, by the benchmarks' and the engines' names
PRE_OPS = ("pre", "mhc_pre")
BOUNDARY_OPS = ("post_pre", "mhc_fused_post_pre", "mhc_fused_post_pre_reuse_residual")


def deepgemm_above(op: str) -> int | None:
    """The count above which an engine's ``op`` computes its pre-norm GEMM with DeepGEMM where
    the engine runs DeepGEMM: 0 for :data:`PRE_OPS` (every count), the fused kernel's
    :data:`FUSED_TILELANG_MAX_TOKENS` for :data:`BOUNDARY_OPS`, None for an op without such a
    GEMM (``mhc_post``, ``hc_head``)."""
    if op in PRE_OPS:
        return 0
    if op in BOUNDARY_OPS:
        return FUSED_TILELANG_MAX_TOKENS
    return None


def gemm_path(op: str, T: int, deep_gemm: bool) -> str:
    """Which pre-norm GEMM an engine's ``op`` (:data:`PRE_OPS`, :data:`BOUNDARY_OPS`, or one
    without such a GEMM: ``mhc_post``, ``hc_head``) computes at ``T`` tokens: :data:`DEEPGEMM`
    or :data:`TILELANG` (TileLang's kernels alone)."""
    above = deepgemm_above(op)
    return DEEPGEMM if deep_gemm and above is not None and T > above else TILELANG


def measured_against(op: str, counts, deep_gemm: bool) -> str:
    """A table entry's ``measured_against`` for ``op`` timed at ``counts`` with the engines'
    DeepGEMM on or off: the engine path that actually ran at those counts (:func:`gemm_path`).
    ``"tilelang, DeepGEMM off"`` where DeepGEMM was off; with it on, ``"deepgemm"`` where every
    count ran DeepGEMM's GEMM, ``"tilelang, DeepGEMM on"`` where none did (the op has no
    pre-norm GEMM, or every count stayed in the fused one-launch kernel), and where both ran,
    ``"tilelang to 32 tokens, deepgemm above"`` (the fused boundary's hand-over)."""
    if not deep_gemm:
        return tables.TILELANG_DEEPGEMM_OFF
    above = deepgemm_above(op)
    ran = [above is not None and c > above for c in counts]
    if ran and all(ran):
        return tables.DEEPGEMM_PATH
    if not any(ran):
        return tables.TILELANG_DEEPGEMM_ON
    return tables.split_path(above)


def describe(module: ModuleType | None) -> str:
    """The DeepGEMM a result was measured with: version and location, or "off"."""
    if module is None:
        return "off"
    version = getattr(module, "__version__", None)
    where = os.path.dirname(getattr(module, "__file__", None) or "") or "?"
    if version is None:  # sgl-deep-gemm keeps its version in a file beside the package
        try:
            with open(os.path.join(where, "VERSION"), encoding="utf-8") as f:
                version = f.read().strip()
        except OSError:
            version = "unknown"
    return f"deep_gemm {version} ({where})"
