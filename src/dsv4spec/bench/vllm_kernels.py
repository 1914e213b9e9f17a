"""vLLM's own mHC and hc_head kernels (``vllm/model_executor/kernels/mhc/tilelang.py`` and
``tilelang_kernels.py`` of 0.33.0 or 0.34.0, whichever source is found), loaded by path.

``import vllm`` needs CUDA libraries and vLLM's torch; the two files need only a few vLLM
helpers, so this module executes vLLM's own files for most of them (``utils/math_utils.py``,
``model_executor/warmup/jit_warmup.py`` and ``jit_warmup_tilelang_helper.py``,
``tilelang_utils/__init__.py``) and puts small stand-ins at the other dotted paths, answering as
vLLM does on one NVIDIA GPU:

- ``vllm.platforms.current_platform``: CUDA unless torch is a ROCm build; PDL from compute
  capability 9.0 (vLLM's rule); ``has_device_capability`` from the device;
- ``vllm.utils.deep_gemm``: with DeepGEMM off (the default), a stand-in answering
  ``is_deep_gemm_supported() -> False``, so ``mhc_pre_tilelang`` and the large-batch branch of
  ``mhc_fused_post_pre_tilelang`` run vLLM's TileLang pre-norm GEMM; with a ``deep_gemm``
  module given (:mod:`dsv4spec.bench.deepgemm`), vLLM's own ``utils/deep_gemm.py``, executed by
  path over stand-ins for ``vllm.envs`` (vLLM's defaults, environment overrides honoured),
  ``vllm.logger`` and ``quant_utils`` (and ``regex`` by the standard ``re`` where the package is
  absent): it imports ``deep_gemm`` by name as vLLM does (an
  installed one before the vendored copy), turns DeepGEMM's PDL on, and its
  ``tf32_hc_prenorm_gemm`` runs there;
- ``vllm.utils.torch_utils.direct_register_custom_op`` does nothing: DeepSeek-V4's model calls
  the Python functions, not the ``torch.ops.vllm`` registrations;
- ``vllm.utils.import_utils.has_tilelang`` / ``has_deep_gemm``: whether ``tilelang`` /
  ``deep_gemm`` imports (vLLM's vendored ``vllm.third_party.deep_gemm`` is never reachable here:
  ``scripts/deepgemm-bundle.sh`` carries it as ``deep_gemm``).

TileLang is imported by vLLM's ``tilelang_utils`` when the kernels file loads (CUDA only).

Call signatures (vLLM's, unchanged; bf16 activations, float32 mixes and weights, ``T`` tokens,
``hc = 4`` streams of width ``H``):

- ``mhc_pre(residual [T, hc, H], fn [hc*(hc+2), hc*H], hc_scale [3], hc_base [hc*(hc+2)],
  rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits=1,
  norm_weight=None [H] bf16, norm_eps=1e-6) -> (post_mix [T, hc, 1], comb_mix [T, hc, hc],
  layer_input [T, H])``;
- ``mhc_post(x [T, H], residual [T, hc, H], post_layer_mix [T, hc, 1], comb_res_mix [T, hc, hc])
  -> residual' [T, hc, H]``;
- ``mhc_fused_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base, rms_eps,
  hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits=1, tile_n=1,
  norm_weight=None, norm_eps=1e-6) -> (residual', post_mix, comb_mix, layer_input)``;
- ``hc_head(hs_flat [T, hc, H], fn [hc, hc*H], hc_scale [1], hc_base [hc], rms_eps, hc_eps)
  -> [T, H] bf16`` (no RMSNorm: vLLM runs its own after it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import sys
from types import ModuleType, SimpleNamespace

import torch

from dsv4spec.integrations.source import link_to_parent, stand_in_package
from dsv4spec.integrations.vllm.source import (
    SRC_ENV,
    load_vllm_module,
    vllm_file,
    vllm_src,
    vllm_version,
)

__all__ = ["DEEP_GEMM_FILE", "KERNELS_FILE", "TILELANG_FILE", "install_stubs",
           "load_vllm_mhc_kernels", "use_deep_gemm", "vllm_mhc_peer"]

TILELANG_FILE = "model_executor/kernels/mhc/tilelang.py"
KERNELS_FILE = "model_executor/kernels/mhc/tilelang_kernels.py"
TILELANG_MOD = "vllm.model_executor.kernels.mhc.tilelang"
KERNELS_MOD = "vllm.model_executor.kernels.mhc.tilelang_kernels"
DEEP_GEMM_FILE = "utils/deep_gemm.py"
DEEP_GEMM_MOD = "vllm.utils.deep_gemm"
# vLLM's own files the kernels file imports, executed by path in this order.
_HELPERS = (
    ("utils/math_utils.py", "vllm.utils.math_utils"),
    ("model_executor/warmup/jit_warmup.py", "vllm.model_executor.warmup.jit_warmup"),
    ("model_executor/warmup/jit_warmup_tilelang_helper.py",
     "vllm.model_executor.warmup.jit_warmup_tilelang_helper"),
    ("tilelang_utils/__init__.py", "vllm.tilelang_utils"),
)


def _capability() -> tuple[int, int]:
    if torch.version.hip is None and torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (0, 0)


class _Platform:
    """The ``current_platform`` answers vLLM's mHC files read."""

    def is_cuda(self) -> bool:
        return torch.version.hip is None and torch.cuda.is_available()

    def is_rocm(self) -> bool:
        return torch.version.hip is not None

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return not torch.cuda.is_available()

    def is_arch_support_pdl(self) -> bool:
        return _capability()[0] >= 9

    def has_device_capability(self, capability: int) -> bool:
        major, minor = _capability()
        return major * 10 + minor >= capability

    def is_device_capability(self, capability: int) -> bool:
        major, minor = _capability()
        return major * 10 + minor == capability

    def is_device_capability_family(self, capability: int) -> bool:
        major, minor = _capability()
        return (major * 10 + minor) // 10 == capability // 10

    def support_deep_gemm(self) -> bool:
        """vLLM's CUDA rule: Hopper (9.0) and the Blackwell families."""
        return (self.is_device_capability(90) or self.is_device_capability_family(100)
                or self.is_device_capability_family(120))

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    simple_compile_backend = "inductor"


def _no_deep_gemm(*args, **kwargs):
    raise RuntimeError("DeepGEMM is off in dsv4spec's loading of vLLM's mHC kernels")


def _imports(name: str) -> bool:
    """vLLM's ``_has_module``: ``name`` is found and its import succeeds."""
    if sys.modules.get(name) is not None:
        return True
    try:
        if importlib.util.find_spec(name) is None:
            return False
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any failure means unavailable, as in vLLM
        return False
    return True


def _stub_attributes() -> dict[str, dict[str, object]]:
    return {
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.utils.import_utils": {
            "has_tilelang": lambda: importlib.util.find_spec("tilelang") is not None,
            "has_deep_gemm": lambda: _imports("deep_gemm")},
        "vllm.utils.torch_utils": {"direct_register_custom_op": lambda *a, **k: None},
        DEEP_GEMM_MOD: {"is_deep_gemm_supported": lambda: False,
                        "tf32_hc_prenorm_gemm": _no_deep_gemm},
    }


def _cache_root() -> str:
    """``envs.VLLM_CACHE_ROOT`` as vLLM computes it."""
    default = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "vllm")
    return os.path.expanduser(os.getenv("VLLM_CACHE_ROOT", default))


# the ``vllm.envs`` entries ``utils/deep_gemm.py`` reads, each as vLLM's envs.py computes it
_ENVS = {
    "VLLM_USE_DEEP_GEMM": lambda: bool(int(os.getenv("VLLM_USE_DEEP_GEMM", "1"))),
    "VLLM_USE_DEEP_GEMM_E8M0": lambda: bool(int(os.getenv("VLLM_USE_DEEP_GEMM_E8M0", "1"))),
    "VLLM_CACHE_ROOT": _cache_root,
}


def _envs_getattr(name: str):
    if name in _ENVS:
        return _ENVS[name]()
    raise AttributeError(f"vllm.envs stand-in: {name} is not stood in")


class _OnceLogger(logging.LoggerAdapter):
    """``vllm.logger.logger``'s ``*_once`` methods over a standard logger."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("vllm"), {})
        self._seen: set[tuple[str, str]] = set()

    def _once(self, level: int, msg: str, *args) -> None:
        if (str(level), msg) not in self._seen:
            self._seen.add((str(level), msg))
            self.log(level, msg, *args)

    def debug_once(self, msg, *args, **kwargs):
        self._once(logging.DEBUG, msg, *args)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args)


def _fp8_min_max() -> tuple[float, float]:
    info = torch.finfo(torch.float8_e4m3fn)
    return info.min, info.max


def _deep_gemm_file_stubs() -> dict[str, dict[str, object]]:
    """What vLLM's ``utils/deep_gemm.py`` imports besides the kernels' stand-ins."""
    return {
        "vllm.envs": {"__getattr__": _envs_getattr},
        "vllm.logger": {"logger": _OnceLogger()},
        "vllm.model_executor.layers.quantization.utils.quant_utils": {
            "get_fp8_min_max": _fp8_min_max},
    }


def install_stubs(stubs: dict[str, dict[str, object]] | None = None) -> list[str]:
    """Put the stand-ins (default: the kernels'; and empty parent packages) in ``sys.modules``;
    return the names added. Names already present (the real package, or other stand-ins) are
    left alone."""
    added: list[str] = []
    for name, attrs in (_stub_attributes() if stubs is None else stubs).items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            stand_in_package(".".join(parts[:i]), added)
        if name not in sys.modules:
            module = stand_in_package(name, added)
            for key, value in attrs.items():
                setattr(module, key, value)
    for name in ("vllm.model_executor.kernels.mhc", "vllm.model_executor.warmup"):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            stand_in_package(".".join(parts[:i]), added)
    for name in added:
        link_to_parent(name)
    return sorted(added)


def _load(relpath: str, name: str, root) -> ModuleType:
    module = load_vllm_module(relpath, name, root)
    link_to_parent(name)
    return module


def use_deep_gemm(deep_gemm: ModuleType | None, root: str | os.PathLike | None = None) -> None:
    """Put at ``vllm.utils.deep_gemm`` vLLM's own ``utils/deep_gemm.py`` run over ``deep_gemm``
    (registered as ``deep_gemm``, the name vLLM imports), or with None the DeepGEMM-off
    stand-in. vLLM's mHC functions import from it at each call. Under a real ``vllm`` package
    nothing changes.

    Raises ``FileNotFoundError`` where the source has no ``utils/deep_gemm.py`` (unpacked before
    it was needed: run ``make setup`` again).
    """
    if getattr(sys.modules.get("vllm"), "__file__", None) is not None:
        return
    if deep_gemm is not None:
        vllm_file(DEEP_GEMM_FILE, root)  # fail before touching sys.modules
    previous = sys.modules.pop(DEEP_GEMM_MOD, None)
    parent = sys.modules.get("vllm.utils")
    if previous is not None and getattr(parent, "deep_gemm", None) is previous:
        delattr(parent, "deep_gemm")
    if deep_gemm is None:
        install_stubs()
        return
    sys.modules["deep_gemm"] = deep_gemm
    if "regex" not in sys.modules and importlib.util.find_spec("regex") is None:
        # 0.34.0's file imports the regex package for one pattern the standard module reads alike
        sys.modules["regex"] = re
    install_stubs(_deep_gemm_file_stubs())
    _load(DEEP_GEMM_FILE, DEEP_GEMM_MOD, root)


def load_vllm_mhc_kernels(root: str | os.PathLike | None = None, *,
                          kernels: ModuleType | None = None,
                          deep_gemm: ModuleType | None = None) -> SimpleNamespace:
    """vLLM's ``tilelang.py`` executed by path over the stand-ins, with its TileLang kernels.

    Parameters
    ----------
    root : path, optional
        The directory holding ``vllm/`` (default: :func:`~dsv4spec.integrations.vllm.source.
        vllm_src`, i.e. ``$DSV4SPEC_VLLM_SRC`` or the checkout's ``.vllm-src/``).
    kernels : module, optional
        Put at ``vllm.model_executor.kernels.mhc.tilelang_kernels`` instead of vLLM's file
        (tests stand TileLang's kernels in with vLLM's torch reference where TileLang is absent).
    deep_gemm : module, optional
        The ``deep_gemm`` vLLM's pre-norm GEMM runs (:func:`use_deep_gemm`); None: vLLM's
        TileLang GEMM.

    Returns
    -------
    types.SimpleNamespace
        ``mhc_pre``, ``mhc_post``, ``mhc_fused_post_pre``, ``mhc_pre_broadcast``, ``hc_head``
        (vLLM's functions, signatures in the module docstring),
        ``mhc_fused_post_pre_reuse_residual`` (0.34.0's, the boundary's signature; None where
        the version has none), ``module`` (the executed
        ``tilelang.py``, registered as ``vllm.model_executor.kernels.mhc.tilelang``), ``kernels``
        and ``version``.

    Raises ``FileNotFoundError`` without vLLM's source, ``ImportError`` without TileLang (unless
    ``kernels`` is given).
    """
    if root is None and vllm_src() is None:
        raise FileNotFoundError(f"vLLM's source not found: run `make setup` or set {SRC_ENV}")
    install_stubs()
    _load(*_HELPERS[0], root)
    use_deep_gemm(deep_gemm, root)
    if kernels is not None:
        sys.modules[KERNELS_MOD] = kernels
        link_to_parent(KERNELS_MOD)
    elif KERNELS_MOD not in sys.modules:
        for relpath, name in _HELPERS[1:]:
            _load(relpath, name, root)
        _load(KERNELS_FILE, KERNELS_MOD, root)
    module = _load(TILELANG_FILE, TILELANG_MOD, root)
    return SimpleNamespace(
        mhc_pre=module.mhc_pre_tilelang, mhc_post=module.mhc_post_tilelang,
        mhc_fused_post_pre=module.mhc_fused_post_pre_tilelang,
        # 0.34.0's target boundary (may overwrite ``residual``); None on 0.33.0
        mhc_fused_post_pre_reuse_residual=getattr(
            module, "mhc_fused_post_pre_tilelang_reuse_residual", None),
        mhc_pre_broadcast=module.mhc_pre_broadcast_tilelang,
        hc_head=module.hc_head_fused_kernel_tilelang, module=module,
        kernels=sys.modules[KERNELS_MOD], version=vllm_version(), deep_gemm=deep_gemm)


def vllm_mhc_peer(deep_gemm: ModuleType | None = None) -> SimpleNamespace | None:
    """:func:`load_vllm_mhc_kernels`, or None with a message (a benchmark then skips the peer)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return load_vllm_mhc_kernels(deep_gemm=deep_gemm)
    except (FileNotFoundError, ImportError) as err:
        print(f"vllm peer: skipped, vLLM's mHC kernels could not be loaded ({err}); run "
              f"`make setup` (unpacks vLLM's source into .vllm-src/) or set {SRC_ENV}, and "
              "install TileLang 0.1.12")
        return None
