"""Stand-ins for the parts of vLLM 0.33.0 that cannot run here, around vLLM's own source.

- vLLM's ``kernels/mhc/tilelang.py`` (the functions the model calls, with their shape, dtype and
  view handling) is executed by path (``dsv4spec.bench.vllm_kernels``); where TileLang cannot run
  (CPU) its kernel objects (``tilelang_kernels``) are stood in by :func:`kernels_module`, whose
  kernels write what vLLM's TileLang kernels write, computed with vLLM's own torch reference
  (``kernels/mhc/torch.py``: ``mhc_pre_torch``, ``mhc_post_torch``) and, for hc_head (which has
  no torch reference in vLLM), the formula of vLLM's TileLang kernel in float64;
- the three NVIDIA DeepSeek-V4 model modules are modules at their dotted names that execute the
  model files' own module-level ``from vllm.model_executor.kernels.mhc.tilelang import ...``
  statements (extracted from vLLM's source), so they bind what vLLM's modules bind.
"""

from __future__ import annotations

import ast
import sys
from types import ModuleType, SimpleNamespace

import torch

from dsv4spec.bench.vllm_kernels import KERNELS_MOD, load_vllm_mhc_kernels
from dsv4spec.integrations.vllm.plugin import KERNELS_MODULE, MODEL_MODULES
from dsv4spec.integrations.vllm.source import load_vllm_module, vllm_file

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TORCH_REF_MOD = "vllm.model_executor.kernels.mhc.torch"
MODEL_FILES = {
    "vllm.models.deepseek_v4.nvidia.model": "models/deepseek_v4/nvidia/model.py",
    "vllm.models.deepseek_v4.nvidia.mtp": "models/deepseek_v4/nvidia/mtp.py",
    "vllm.models.deepseek_v4.nvidia.dspark": "models/deepseek_v4/nvidia/dspark.py",
}
assert tuple(MODEL_FILES) == MODEL_MODULES


def is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def _rmsnorm_bf16(y: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's fused RMSNorm in ``mhc_pre_big_fuse_with_norm_tilelang``: on the bf16-rounded
    collapsed input, in fp32, times the bf16 weight, rounded to bf16."""
    yf = y.to(torch.bfloat16).float()
    return (yf * torch.rsqrt(yf.square().mean(-1, keepdim=True) + eps) * weight.float()).bfloat16()


class _Kernels:
    """The kernel objects ``tilelang.py`` calls, in its calling conventions. The pre-norm GEMM
    (alone or fused with post) keeps its input and ``fn`` by output buffer, so the big-fuse
    epilogue can run vLLM's ``mhc_pre_torch`` on the same residual with the same ``fn``."""

    def __init__(self, ref: ModuleType) -> None:
        self.ref = ref
        self.gemm_inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.launches: list[str] = []

    def prenorm_gemm(self, x, fn, out, sqrsum, hidden_size, hc_mult):
        self.launches.append("prenorm_gemm")
        xf = x.float()
        out.zero_()
        sqrsum.zero_()
        out[0] = xf @ fn.t()
        sqrsum[0] = xf.square().sum(-1)
        self.gemm_inputs[out.data_ptr()] = (x, fn)

    def big_fuse(self, gemm_out_mul, gemm_out_sqrsum, hc_scale, hc_base, residual, post_mix,
                 comb_mix, layer_input, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                 hc_post_mult_value, sinkhorn_repeat, residual_out=None, norm_weight=None,
                 norm_eps=1e-6):
        self.launches.append("big_fuse")
        x, fn = self.gemm_inputs.pop(gemm_out_mul.data_ptr())
        T, hc, H = residual.shape
        assert x.reshape(T, -1).shape[1] == hc * H, "broadcast pre is not stood in"
        post, comb, y = self.ref.mhc_pre_torch(
            residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
            hc_post_mult_value, sinkhorn_repeat)
        if norm_weight is not None:
            y = _rmsnorm_bf16(y, norm_weight, norm_eps)
        post_mix.copy_(post.view(T, hc))
        comb_mix.copy_(comb.view(T, hc * hc))
        layer_input.copy_(y)

    def post(self, comb_mix, residual, post_mix, layer_input, out, hc_mult, hidden_size):
        self.launches.append("post")
        out.copy_(self.ref.mhc_post_torch(layer_input, residual, post_mix.unsqueeze(-1),
                                          comb_mix))

    def fused(self, comb_mix, residual_in, post_mix, x_in, weight_t, hc_mult, hidden_size,
              hc_mult3):
        self.launches.append("fused")
        T = residual_in.shape[0]
        residual_out = self.ref.mhc_post_torch(x_in, residual_in, post_mix.unsqueeze(-1),
                                               comb_mix)
        fn = weight_t.reshape(hc_mult3, hc_mult * hidden_size)
        mixes = residual_in.new_empty((8, T, hc_mult3), dtype=torch.float32)
        sqrsum = residual_in.new_empty((8, T), dtype=torch.float32)
        self.launches.pop()
        self.prenorm_gemm(residual_out.view(T, -1), fn, mixes, sqrsum, hidden_size, hc_mult)
        self.launches[-1] = "fused"
        return mixes, sqrsum, residual_out

    def hc_head(self, residual, fn, hc_scale, hc_base, out, hidden_size, rms_eps, hc_eps,
                hc_mult):
        """vLLM's ``hc_head_fuse_tilelang``: ``pre = sigmoid(mix * rsqrt(sqrsum / hc_dim +
        rms_eps) * scale + base) + hc_eps``, ``out = sum_c pre_c * residual_c`` (float64 here)."""
        self.launches.append("hc_head")
        xd = residual.double().flatten(1)
        rsqrt = torch.rsqrt(xd.square().sum(-1, keepdim=True) / xd.shape[1] + rms_eps)
        pre = torch.sigmoid((xd @ fn.double().t()) * rsqrt * hc_scale.double()[0]
                            + hc_base.double()) + hc_eps
        out.copy_((pre.unsqueeze(-1) * residual.double()).sum(1))


def kernels_module() -> ModuleType:
    """A stand-in ``tilelang_kernels`` (see the module docstring); ``.impl`` holds the kernels
    and the list of launches made through them."""
    ref = load_vllm_module("model_executor/kernels/mhc/torch.py", TORCH_REF_MOD)
    impl = _Kernels(ref)
    module = ModuleType(KERNELS_MOD)
    module.impl = impl
    module._HC_PRENORM_GEMM_TILELANG_KERNEL = impl.prenorm_gemm
    module._MHC_PRE_BIG_FUSE_TILELANG_KERNEL = impl.big_fuse
    module._MHC_POST_TILELANG_KERNEL = impl.post
    module._MHC_FUSED_TILELANG_KERNEL = impl.fused
    module._HC_HEAD_FUSED_TILELANG_KERNEL = impl.hc_head

    def split_config(num_tokens, hidden_size, hc_mult):
        # vLLM's rule on Hopper: the one-launch fused kernel up to 32 tokens where the width is
        # a multiple of its 128-thread block
        return None if num_tokens > 32 or hidden_size % 128 else (2, 8, 128)

    module.mhc_fused_post_pre_split_config = split_config
    module.compute_num_split = lambda block_k, k, grid_size: 1
    return module


def model_imports(relpath: str) -> list[ast.ImportFrom]:
    """The model file's module-level imports from vLLM's mHC kernels module."""
    tree = ast.parse(vllm_file(relpath).read_text())
    return [node for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == KERNELS_MODULE]


def model_module(name: str) -> ModuleType:
    """A module at ``name`` that has run the model file's own imports of the mHC kernels."""
    module = ModuleType(name)
    module.__file__ = str(vllm_file(MODEL_FILES[name]))
    code = compile(ast.Module(body=model_imports(MODEL_FILES[name]), type_ignores=[]),
                   module.__file__, "exec")
    exec(code, module.__dict__)
    return module


def install(tilelang: bool) -> SimpleNamespace:
    """vLLM's mHC functions (TileLang's kernels where ``tilelang``, else the stand-ins) and
    the model modules, as vLLM has them after importing DeepSeek-V4."""
    kernels = None if tilelang else kernels_module()
    peer = load_vllm_mhc_kernels(kernels=kernels)
    models = {}
    for name in MODEL_MODULES:
        parts = name.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if package not in sys.modules:
                sys.modules[package] = ModuleType(package)
                sys.modules[package].__path__ = []  # resolves through sys.modules only
        models[name] = model_module(name)
        sys.modules[name] = models[name]
    return SimpleNamespace(peer=peer, kernels=peer.kernels, models=models,
                           model=models[MODEL_MODULES[0]], mtp=models[MODEL_MODULES[1]],
                           dspark=models[MODEL_MODULES[2]])


def vllm_method(module: ModuleType, relpath: str, cls: str, name: str):
    """vLLM's own ``cls.name`` from ``relpath``, compiled with its file name and line numbers
    into ``module``'s namespace (so its calls resolve through the module's globals, as in vLLM),
    annotations dropped (their types are not imported here)."""
    tree = ast.parse(vllm_file(relpath).read_text())
    node = next(n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.returns = None
    for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
        arg.annotation = None
    node.decorator_list = []
    namespace = module.__dict__
    exec(compile(ast.Module(body=[node], type_ignores=[]), module.__file__, "exec"), namespace)
    return namespace.pop(name)
