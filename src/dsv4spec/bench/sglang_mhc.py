"""SGLang 0.5.23's own mHC kernels (``sglang/kernels/ops/layernorm/mhc.py``), loaded by path.

That file imports a few ``sglang.srt`` helpers at module level (and two more inside functions at
run time). ``import sglang`` needs CUDA-only libraries, so instead of importing the package this
module puts small stand-ins at those dotted paths, answering as SGLang does on one NVIDIA GPU
with its defaults, then executes SGLang's file unchanged:

- ``sglang.srt.environ`` is SGLang's own ``environ.py`` (standard library only), so every flag
  has SGLang's default (``SGLANG_OPT_USE_TILELANG_MHC_PRE/POST`` on, ``SGLANG_USE_AITER`` off)
  and an environment variable set by the caller still overrides it, as in a server;
- DeepGEMM as the caller chooses (:mod:`dsv4spec.bench.deepgemm`): with a ``deep_gemm`` module
  given, ``ENABLE_JIT_DEEPGEMM`` is True and ``sglang.srt.layers.deep_gemm_wrapper.entrypoint``'s
  ``tf32_hc_prenorm_gemm`` hands the call to that module as SGLang's wrapper does, so
  ``SGLANG_OPT_DEEPGEMM_HC_PRENORM`` (default on) sends ``mhc_pre`` and the large-batch branch of
  ``mhc_fused_post_pre`` to DeepGEMM's ``tf32_hc_prenorm_gemm``, with DeepGEMM's PDL on where
  ``SGLANG_DEEPGEMM_PDL`` (default on) says so, as SGLang's model runner sets it; without one,
  ``ENABLE_JIT_DEEPGEMM`` is False and both take SGLang's TileLang GEMM;
- one process, one GPU: ``use_symmetric_memory`` is a null context (SGLang returns one when the
  tensor-parallel group has one rank), no DSA context parallelism, no DP attention;
- CUDA, not ROCm: ``is_hip`` / ``is_gfx95_supported`` / ``is_gfx1250_supported`` are False;
  ``is_arch_support_pdl`` is "compute capability >= 9" (SGLang's rule on CUDA), and
  ``get_platform()`` / ``is_sm120_supported`` read the device's capability.

TileLang is imported by SGLang's file itself, lazily, at the first kernel call.

How DSV4's model code reaches these functions on CUDA (SGLang 0.5.23, DeepSeek-V4 with
``hc_pre_from_prev_sublayer`` off, defaults; see :data:`CALL_SITES`): each sublayer boundary goes
through ``apply_mhc_post_pre_boundary`` which calls ``get_mhc_ops().mhc_fused_post_pre(...)``
(``get_mhc_ops`` is a ``functools.cache``'d function of ``sglang.srt.models.deepseek_v4`` that
imports the function from this file on first use) for every token count; the model's first
``hc_pre`` imports ``mhc_pre`` from this file inside the method; the last ``hc_post`` goes through
``sglang.srt.models.deepseek_v4_mhc.post`` which imports ``mhc_post`` inside the function.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import ModuleType, SimpleNamespace

import torch

from dsv4spec.integrations.sglang.source import load_sglang_module, sglang_file, sglang_version
from dsv4spec.integrations.source import link_to_parent, stand_in_package

__all__ = ["CALL_SITES", "install_stubs", "load_sglang_mhc", "sglang_kernels",
           "sglang_mhc_peer", "sglang_version", "use_deep_gemm"]

MHC_FILE = "kernels/ops/layernorm/mhc.py"
ENVIRON_FILE = "srt/environ.py"
CONFIGURER = "sglang.srt.layers.deep_gemm_wrapper.configurer"
ENTRYPOINT = "sglang.srt.layers.deep_gemm_wrapper.entrypoint"
# mhc_fused_post_pre: the one-launch TileLang FMA kernel up to this many tokens, SGLang's
# ``fma_token_threshold``; above it mhc_post + the pre-norm GEMM + big_fuse.
FUSED_FMA_MAX_TOKENS = 32
# mhc_pre: the split-K TileLang GEMM up to this many tokens, the plain TileLang GEMM above.
PRE_SPLITK_MAX_TOKENS = 2048

# Where SGLang 0.5.23's DeepSeek-V4 calls the three functions (CUDA, defaults).
CALL_SITES = {
    "mhc_fused_post_pre": (
        "sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc.apply_mhc_post_pre_boundary"
        " -> `from sglang.srt.models.deepseek_v4 import get_mhc_ops` (inside the function) -> "
        "get_mhc_ops().mhc_fused_post_pre(layer_input, residual, post[..., None], comb, fn, "
        "scale, base, rms_eps, hc_eps, hc_eps, 2.0, sinkhorn_iters, norm_weight=<bf16 norm "
        "weight>, norm_eps=...); called from deepseek_v4_boundary's HcRead.update_and_read when "
        "layer.boundary_mhc_fusions and layer.use_fused_mhc_post_pre (both on by default on "
        "CUDA), every token count"),
    "mhc_pre": (
        "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayer.hc_pre -> `from "
        "sglang.kernels.ops.layernorm.mhc import mhc_pre` (inside the method, each call) -> "
        "mhc_pre(residual=x, fn=..., hc_scale=..., hc_base=..., rms_eps=..., hc_pre_eps=..., "
        "hc_sinkhorn_eps=..., hc_post_mult_value=2.0, sinkhorn_repeat=..., norm_weight=..., "
        "norm_eps=...) when SGLANG_OPT_USE_TILELANG_MHC_PRE (default on): the first layer's "
        "attention input (no pending post)"),
    "mhc_post": (
        "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayer.hc_post -> "
        "sglang.srt.models.deepseek_v4_mhc.post(cfg, x, residual, post, comb) -> `from "
        "sglang.kernels.ops.layernorm.mhc import mhc_post` (inside the function, each call) -> "
        "mhc_post(x, residual, post, comb) when SGLANG_OPT_USE_TILELANG_MHC_POST (default on): "
        "the last layer's output (FinalRead) and the MTP layer's hc_post"),
}


def _capability() -> tuple[int, int]:
    if torch.version.hip is None and torch.cuda.is_available():
        return torch.cuda.get_device_capability()
    return (0, 0)


class _Platform:
    """``get_platform()``'s answers that SGLang's mhc file reads, from the current device."""

    @property
    def is_sm90(self) -> bool:
        return _capability()[0] == 9

    @property
    def is_sm100(self) -> bool:
        return _capability()[0] == 10

    @property
    def is_sm120(self) -> bool:
        return _capability()[0] == 12

    @property
    def is_blackwell(self) -> bool:
        return _capability()[0] in (10, 12)


_PLATFORM = _Platform()
_PARALLEL = SimpleNamespace(tp_group=SimpleNamespace(world_size=1))


def _strict_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.clone(memory_format=torch.contiguous_format)


def _stub_attributes() -> dict[str, dict[str, object]]:
    """Dotted module name -> the attributes SGLang's mhc file takes from it (besides
    ``sglang.srt.environ``, which is SGLang's own file)."""
    return {
        "sglang.kernels.jit.utils": {
            "is_arch_support_pdl": lambda: _capability()[0] >= 9,
        },
        "sglang.srt.distributed.device_communicators.pynccl_allocator": {
            # one tensor-parallel rank: SGLang returns nullcontext() itself
            "use_symmetric_memory": lambda group, disabled=False: contextlib.nullcontext(),
        },
        "sglang.srt.layers.attention.dsa.utils": {
            "is_dsa_prefill_cp_interleave": lambda: False,
        },
        "sglang.srt.layers.dp_attention": {"is_allocation_symmetric": lambda: True},
        "sglang.srt.layers.utils.common": {"strict_contiguous": _strict_contiguous},
        "sglang.srt.runtime_context": {
            "get_parallel": lambda: _PARALLEL,
            "get_platform": lambda: _PLATFORM,
        },
        "sglang.srt.utils": {
            "is_hip": lambda: torch.version.hip is not None,
            "is_gfx95_supported": lambda: False,
            "is_sm120_supported": lambda: _capability() == (12, 0),
        },
        "sglang.srt.utils.common": {"is_gfx1250_supported": lambda: False},
        CONFIGURER: {"ENABLE_JIT_DEEPGEMM": False},
        ENTRYPOINT: {"tf32_hc_prenorm_gemm": _no_deep_gemm},
    }


def _no_deep_gemm(*args, **kwargs):
    raise RuntimeError("DeepGEMM is off in dsv4spec's loading of SGLang's mhc.py")


def _deep_gemm_entrypoint(module: ModuleType):
    """``entrypoint.tf32_hc_prenorm_gemm`` handing the call to ``module`` as SGLang's does."""

    def tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits):
        if x.shape[0] == 0:
            return
        module.tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits=num_splits)

    return tf32_hc_prenorm_gemm


def use_deep_gemm(deep_gemm: ModuleType | None) -> None:
    """Point the DeepGEMM stand-ins at ``deep_gemm`` (None: DeepGEMM off). Only dsv4spec's
    stand-ins change (a real SGLang in ``sys.modules`` is left alone); SGLang's file reads
    them at each call. With a module, DeepGEMM's PDL and JIT compiler follow SGLang's
    ``SGLANG_DEEPGEMM_PDL`` and ``SGLANG_DG_USE_NVRTC``, as a server sets them."""
    configurer, entrypoint = sys.modules.get(CONFIGURER), sys.modules.get(ENTRYPOINT)
    if any(m is None or getattr(m, "__file__", None) is not None
           for m in (configurer, entrypoint)):
        return
    configurer.ENABLE_JIT_DEEPGEMM = deep_gemm is not None
    entrypoint.tf32_hc_prenorm_gemm = (
        _no_deep_gemm if deep_gemm is None else _deep_gemm_entrypoint(deep_gemm))
    if deep_gemm is None:
        return
    envs = sys.modules["sglang.srt.environ"].envs
    os.environ["DG_JIT_USE_NVRTC"] = "1" if envs.SGLANG_DG_USE_NVRTC.get() else "0"
    if envs.SGLANG_DEEPGEMM_PDL.get() and hasattr(deep_gemm, "set_pdl"):
        deep_gemm.set_pdl(True)


def install_stubs() -> list[str]:
    """Put the stand-ins in ``sys.modules``; return the names added.

    Names already present (the real package, or another test's stand-ins) are left alone. Parent
    packages are empty packages with no search path, so nothing of the real ``sglang`` is ever
    imported through them. The stand-ins stay installed: SGLang's functions import two of them
    at call time.
    """
    added: list[str] = []
    names = ["sglang.srt.environ", *_stub_attributes()]
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts)):
            stand_in_package(".".join(parts[:i]), added)
    if "sglang.srt.environ" not in sys.modules:
        load_sglang_module(ENVIRON_FILE, name="sglang.srt.environ")
        added.append("sglang.srt.environ")
    for name, attrs in _stub_attributes().items():
        if name not in sys.modules or name in added:  # ours (maybe made above as a parent)
            module = stand_in_package(name, added)
            for key, value in attrs.items():
                setattr(module, key, value)
    for name in added:  # link each new module to its parent, as an import would
        link_to_parent(name)
    return sorted(added)


def load_sglang_mhc(deep_gemm: ModuleType | None = None) -> ModuleType:
    """SGLang's ``mhc.py`` executed by path over the stand-ins (see the module docstring), its
    pre-norm GEMM DeepGEMM's from ``deep_gemm`` where given (:func:`use_deep_gemm`), else
    TileLang's.

    Raises ``FileNotFoundError`` when SGLang's source is not found.
    """
    sglang_file(MHC_FILE)  # fail before touching sys.modules
    install_stubs()
    use_deep_gemm(deep_gemm)
    return load_sglang_module(MHC_FILE)


def sglang_mhc_peer(deep_gemm: ModuleType | None = None) -> ModuleType | None:
    """:func:`load_sglang_mhc`, or None with a message (the benchmark then skips the peer)."""
    try:
        return load_sglang_mhc(deep_gemm)
    except (FileNotFoundError, ImportError) as err:
        print(f"sglang peer: skipped, SGLang 0.5.23's mhc.py could not be loaded ({err}); "
              "install the wheel (pip install --no-deps sglang==0.5.23) or set "
              "DSV4SPEC_SGLANG_ROOT")
        return None


def sglang_kernels(op: str, T: int, H: int, hc: int = 4, deep_gemm: bool = False) -> str:
    """The kernels SGLang 0.5.23 launches for ``op`` at ``T`` tokens (norm on), with DeepGEMM's
    pre-norm GEMM where ``deep_gemm``."""
    if op == "pre":
        if deep_gemm:
            return "tf32_hc_prenorm_gemm+big_fuse_norm"
        gemm = "splitk_gemm" if T <= PRE_SPLITK_MAX_TOKENS else "gemm_sqrsum"
        return f"{gemm}+big_fuse_norm"
    if op == "post":
        import math

        blocks = H // math.gcd(H, 1024) if T <= 256 else 1
        return f"post(h_blocks={blocks})"
    if op == "post_pre":
        if T <= FUSED_FMA_MAX_TOKENS:
            return "fma_post_gemm+big_fuse_norm"
        gemm = "tf32_hc_prenorm_gemm" if deep_gemm else "gemm_sqrsum"
        return f"post+{gemm}+big_fuse_norm"
    raise ValueError(op)
