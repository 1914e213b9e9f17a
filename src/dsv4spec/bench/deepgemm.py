"""DeepGEMM for the engines' mHC peers: whether their pre-norm GEMM is DeepGEMM's or TileLang's.

SGLang 0.5.23 (which requires ``sgl-deep-gemm==0.2.3.post2``; ``SGLANG_OPT_DEEPGEMM_HC_PRENORM``
on by default) and vLLM 0.33.0 / 0.34.0 (which vendor DeepGEMM 2.8.1 and prefer an installed
``deep_gemm``) compute the mHC pre-norm GEMM with DeepGEMM's ``tf32_hc_prenorm_gemm`` wherever
``deep_gemm`` imports on a Hopper or newer GPU: ``mhc_pre`` at every token count, the fused
boundary above its one-launch TileLang kernel's 32 tokens. Elsewhere they run their TileLang GEMM.

``--deepgemm`` picks what the peers run: ``auto`` (the default) does what the engines do, DeepGEMM
where ``deep_gemm`` imports and the GPU is compute capability 9.0 or newer; ``on`` requires it
(:class:`DeepGemmUnavailable` when it does not import); ``off`` measures the TileLang GEMM.
``scripts/deepgemm-bundle.sh`` prepares a ``deep_gemm`` that imports on a GPU machine whose
torch the released wheels were not built for (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
from types import ModuleType

import torch

__all__ = ["CHOICES", "DEEPGEMM", "TILELANG", "DeepGemmUnavailable", "add_argument",
           "describe", "gemm_path", "measured_against", "resolve"]

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


def _import() -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module("deep_gemm"), ""
    except _IMPORT_ERRORS as err:
        return None, f"{type(err).__name__}: {err}"


def resolve(choice: str) -> ModuleType | None:
    """The ``deep_gemm`` module the peers should run, or None for their TileLang GEMM.

    Raises ``ValueError`` for a ``choice`` not in :data:`CHOICES`, :class:`DeepGemmUnavailable`
    for ``"on"`` where ``deep_gemm`` does not import.
    """
    if choice not in CHOICES:
        raise ValueError(f"deepgemm: expected one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "off":
        return None
    module, error = _import()
    if module is None:
        if choice == "on":
            raise DeepGemmUnavailable(
                f"--deepgemm on: deep_gemm does not import ({error}); build it with "
                "scripts/deepgemm-bundle.sh and put it on PYTHONPATH (docs/benchmarks.md), or "
                "pass --deepgemm off")
        return None
    if choice == "auto" and _capability()[0] < 9:  # the engines enable it from Hopper on
        return None
    return module


# the ops with a pre-norm GEMM, by the benchmarks' and the engines' names
PRE_OPS = ("pre", "mhc_pre")
BOUNDARY_OPS = ("post_pre", "mhc_fused_post_pre", "mhc_fused_post_pre_reuse_residual")


def gemm_path(op: str, T: int, deep_gemm: bool) -> str:
    """Which pre-norm GEMM an engine's ``op`` (:data:`PRE_OPS`, :data:`BOUNDARY_OPS`, or one
    without such a GEMM: ``mhc_post``, ``hc_head``) computes at ``T`` tokens: :data:`DEEPGEMM`
    or :data:`TILELANG` (TileLang's kernels alone)."""
    if deep_gemm and (op in PRE_OPS
                      or (op in BOUNDARY_OPS and T > FUSED_TILELANG_MAX_TOKENS)):
        return DEEPGEMM
    return TILELANG


def measured_against(op: str, counts, deep_gemm: bool) -> str:
    """A table entry's ``measured_against`` for ``op`` timed at ``counts`` with the engines'
    DeepGEMM on or off: the engine path that actually ran at those counts (:func:`gemm_path`).
    ``"tilelang, DeepGEMM off"`` where DeepGEMM was off; with it on, ``"deepgemm"`` where every
    count ran DeepGEMM's GEMM, ``"tilelang, DeepGEMM on"`` where none did (the op has no
    pre-norm GEMM, or every count stayed in the fused one-launch kernel), and where both ran,
    ``"tilelang to 32 tokens, deepgemm above"`` (the fused boundary's hand-over)."""
    if not deep_gemm:
        return "tilelang, DeepGEMM off"
    paths = {c: gemm_path(op, c, True) for c in counts}
    if paths and all(p == DEEPGEMM for p in paths.values()):
        return DEEPGEMM
    if DEEPGEMM not in paths.values():
        return "tilelang, DeepGEMM on"
    return f"tilelang to {FUSED_TILELANG_MAX_TOKENS} tokens, deepgemm above"


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
