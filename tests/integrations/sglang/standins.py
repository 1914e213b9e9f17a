"""Stand-ins for the SGLang modules the plugin hooks, built from SGLang's installed source.

``import sglang`` needs CUDA libraries, so the tests never import it. Instead they put stand-in
modules at the dotted paths the plugin resolves, whose hooked methods are SGLang's own method
source (parsed from the installed files, executed here) and whose kernels are SGLang's own files
loaded by path and run in Triton's interpreter. The stand-in classes carry only the attributes
those methods read.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
import types

import torch
import torch.nn.functional as F

from dsv4spec.integrations.sglang.source import load_sglang_module, sglang_file

POOL_FILE = "srt/mem_cache/deepseek_v4_memory_pool.py"
STATE_FILE = "srt/mem_cache/deepseek_v4_compress_state.py"
NEXTN_FILE = "srt/models/deepseek_v4_nextn.py"
DSPARK_FILE = "srt/models/deepseek_v4_dspark.py"
TARGET_FILE = "srt/models/deepseek_v4.py"
CLEANUP_FILE = "kernels/ops/kvcache/dsv4_c128_cleanup.py"
MHC_HEAD_FILE = "kernels/ops/layernorm/mhc_head.py"
REGISTRY_FILE = "srt/plugins/hook_registry.py"
BACKEND_FILE = "srt/layers/attention/deepseek_v4_backend.py"

POOL_MOD = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
NEXTN_MOD = "sglang.srt.models.deepseek_v4_nextn"
DSPARK_MOD = "sglang.srt.models.deepseek_v4_dspark"
TARGET_MOD = "sglang.srt.models.deepseek_v4"
MHC_HEAD_MOD = "sglang.kernels.ops.layernorm.mhc_head"
REGISTRY_MOD = "sglang.srt.plugins.hook_registry"
PAGE_METADATA_MOD = "sglang.kernels.ops.attention.dsv4.attn_metadata_kernels"
C128_METADATA_MOD = "sglang.kernels.ops.attention.dsv4.metadata_kernel"
RUNTIME_CONTEXT_MOD = "sglang.srt.runtime_context"
PYNCCL_ALLOCATOR_MOD = "sglang.srt.distributed.device_communicators.pynccl_allocator"
BACKEND_MOD = "sglang.srt.layers.attention.deepseek_v4_backend"
# CUDA where present (SGLang's kernels and ours run for real), else the CPU in Triton's interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PACKAGES = ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.mem_cache",
            "sglang.srt.models", "sglang.srt.layers", "sglang.srt.layers.attention",
            "sglang.kernels", "sglang.kernels.ops",
            "sglang.kernels.ops.layernorm", "sglang.kernels.ops.attention",
            "sglang.kernels.ops.attention.dsv4")


@functools.cache
def parse(relpath: str) -> tuple[ast.Module, str]:
    source = sglang_file(relpath).read_text()
    return ast.parse(source), source


def class_node(relpath: str, name: str) -> ast.ClassDef:
    tree, _ = parse(relpath)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"class {name} not in {relpath}")


def function_node(relpath: str, name: str, cls: str | None = None) -> ast.FunctionDef:
    body = class_node(relpath, cls).body if cls else parse(relpath)[0].body
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{cls + '.' if cls else ''}{name} not in {relpath}")


def upstream_function(relpath: str, name: str, cls: str | None, module: types.ModuleType):
    """SGLang's own source of ``[cls.]name``, executed with ``module``'s dict as its globals."""
    node = function_node(relpath, name, cls)
    source = textwrap.dedent(ast.get_source_segment(parse(relpath)[1], node))
    namespace: dict = {}
    # Defined into a separate namespace: the pool module's global of the same name is the kernel.
    exec(compile(source, str(sglang_file(relpath)), "exec"), module.__dict__, namespace)
    return namespace[name]


def counted(fn):
    """``fn`` with a call counter (``.calls``); the signature stays ``fn``'s (``__wrapped__``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return fn(*args, **kwargs)

    wrapper.calls = 0
    return wrapper


def install_packages() -> None:
    for name in PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = []  # a package with nothing on disk: no real sglang file is reachable
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def add_module(name: str, module: types.ModuleType) -> types.ModuleType:
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)
    return module


def sglang_cleanup_kernel():
    """SGLang's per-layer C128 cleanup launcher, loaded by path."""
    return load_sglang_module(CLEANUP_FILE).clear_unaccepted_c128_draft_states


def sglang_fused_hc_head():
    """SGLang's ``fused_hc_head`` (the target's hc_head kernel), loaded by path."""
    return load_sglang_module(MHC_HEAD_FILE).fused_hc_head


class KVAndScore:
    def __init__(self, kv_score: torch.Tensor) -> None:
        self.kv_score = kv_score


class CompressStatePool:
    def __init__(self, ratio: int, ring_size: int, kv_score: torch.Tensor) -> None:
        self.ratio = ratio
        self.ring_size = ring_size
        self.kv_score_buffer = KVAndScore(kv_score)


def pool_module() -> types.ModuleType:
    """``deepseek_v4_memory_pool`` with ``DeepSeekV4TokenToKVPool`` and SGLang's own method."""
    module = types.ModuleType(POOL_MOD)
    module.torch = torch
    module.ONLINE_C128 = False
    module.clear_unaccepted_c128_draft_states = sglang_cleanup_kernel()
    method = upstream_function(POOL_FILE, "clear_unaccepted_c128_draft_states",
                               "DeepSeekV4TokenToKVPool", module)

    class DeepSeekV4TokenToKVPool:
        clear_unaccepted_c128_draft_states = counted(method)

        def __init__(self, compress_state_pools: list) -> None:
            self.compress_state_pools = compress_state_pools

    DeepSeekV4TokenToKVPool.__module__ = POOL_MOD
    module.DeepSeekV4TokenToKVPool = DeepSeekV4TokenToKVPool
    return module


def nextn_module() -> types.ModuleType:
    """``deepseek_v4_nextn`` with ``DeepseekV4ModelNextN`` and SGLang's own ``hc_head``."""
    module = types.ModuleType(NEXTN_MOD)
    module.torch, module.F = torch, F
    method = upstream_function(NEXTN_FILE, "hc_head", "DeepseekV4ModelNextN", module)

    class DeepseekV4ModelNextN:
        hc_head = counted(method)

        def __init__(self, rms_norm_eps: float, hc_eps: float) -> None:
            self.rms_norm_eps = rms_norm_eps
            self.hc_eps = hc_eps

    DeepseekV4ModelNextN.__module__ = NEXTN_MOD
    module.DeepseekV4ModelNextN = DeepseekV4ModelNextN
    return module


def dspark_module() -> types.ModuleType:
    """``deepseek_v4_dspark`` with ``DeepseekV4ForCausalLMDSpark`` and SGLang's own
    ``collapse_hc_head``, which calls SGLang's own ``hc_head_torch`` (from ``deepseek_v4.py``,
    as the real module imports it) with the last stage's ``hc_head_*`` weights."""
    module = types.ModuleType(DSPARK_MOD)
    module.torch, module.F = torch, F
    module.hc_head_torch = upstream_function(TARGET_FILE, "hc_head_torch", None, module)
    method = upstream_function(DSPARK_FILE, "collapse_hc_head", "DeepseekV4ForCausalLMDSpark",
                               module)

    class DeepseekV4ForCausalLMDSpark:
        collapse_hc_head = counted(method)

        def __init__(self, norm_eps: float, hc_eps: float, hc_fn=None, hc_scale=None,
                     hc_base=None, hc_pre_from_prev_sublayer: bool = False,
                     num_stages: int = 3) -> None:
            # SGLang's __init__ (deepseek_v4_dspark.py): norm_eps = config.rms_norm_eps,
            # hc_eps = config.hc_eps; the last stage alone holds hc_head_{fn,base,scale}, and
            # None under DSV4.1's hc_pre_from_prev_sublayer.
            self.norm_eps = norm_eps
            self.hc_eps = hc_eps
            self.hc_pre_from_prev_sublayer = hc_pre_from_prev_sublayer
            self.stages = [types.SimpleNamespace() for _ in range(num_stages - 1)]
            self.stages.append(types.SimpleNamespace(hc_head_fn=hc_fn, hc_head_scale=hc_scale,
                                                     hc_head_base=hc_base))

    DeepseekV4ForCausalLMDSpark.__module__ = DSPARK_MOD
    module.DeepseekV4ForCausalLMDSpark = DeepseekV4ForCausalLMDSpark
    return module


def target_module() -> types.ModuleType:
    """``deepseek_v4`` with ``DeepseekV4Model`` and SGLang's own ``hc_head`` and ``hc_head_torch``;
    the method's ``from sglang.kernels.ops.layernorm.mhc_head import fused_hc_head`` finds
    SGLang's file, loaded by path."""
    add_module(MHC_HEAD_MOD, load_sglang_module(MHC_HEAD_FILE, name=MHC_HEAD_MOD))
    module = types.ModuleType(TARGET_MOD)
    module.torch, module.F, module._is_xpu = torch, F, False
    module.hc_head_torch = upstream_function(TARGET_FILE, "hc_head_torch", None, module)
    method = upstream_function(TARGET_FILE, "hc_head", "DeepseekV4Model", module)

    class DeepseekV4Model:
        hc_head = counted(method)

        def __init__(self, norm_eps: float, hc_eps: float) -> None:
            self.norm_eps = norm_eps
            self.hc_eps = hc_eps

    DeepseekV4Model.__module__ = TARGET_MOD
    module.DeepseekV4Model = DeepseekV4Model
    return module


# --- mHC: SGLang's kernels file and the DeepSeek-V4 code that calls it ---------------------------

MHC_FILE = "kernels/ops/layernorm/mhc.py"
MHC_CFG_FILE = "srt/models/deepseek_v4_mhc.py"
FUSED_MHC_FILE = "srt/models/deepseek_common/amd/deepseek_v4_fused_mhc.py"
MHC_MOD = "sglang.kernels.ops.layernorm.mhc"
MHC_CFG_MOD = "sglang.srt.models.deepseek_v4_mhc"
FUSED_MHC_MOD = "sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc"
# SGLang's TileLang mHC kernels take only these hc_mult * H (DSV4-Flash and DSV4-Pro).
TILELANG_HC_HIDDEN = (16384, 28672)


def tilelang_runs(residual: torch.Tensor) -> bool:
    """Whether SGLang's TileLang mHC kernels can run on ``residual`` here."""
    import importlib.util

    return (residual.is_cuda and importlib.util.find_spec("tilelang") is not None
            and residual.shape[-2] * residual.shape[-1] in TILELANG_HC_HIDDEN)


def _torch_mhc_pre(module: types.ModuleType):
    """SGLang's ``mhc_pre`` contract on SGLang's own torch path (``_mhc_pre_torch``), with the
    fused RMSNorm as SGLang's kernel applies it (weight rounded to bf16, fp32 math)."""

    def mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                hc_post_mult_value, sinkhorn_repeat, n_splits=1, n_splits_pre=32, *,
                norm_weight=None, norm_eps=None):
        assert residual.dtype == torch.bfloat16 and fn.dtype == torch.float32  # SGLang's asserts
        hc, H = residual.shape[-2:]
        outer = residual.shape[:-2]
        post, comb, y = module._mhc_pre_torch(
            residual.view(-1, hc, H), fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
            hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat)
        if norm_weight is not None:
            assert norm_eps is not None and norm_weight.shape == (H,)
            yf = y.float()
            yf = yf * torch.rsqrt(yf.square().mean(-1, keepdim=True) + norm_eps)
            y = (yf * norm_weight.bfloat16().float()).bfloat16()
        return post.view(*outer, hc, 1), comb.view(*outer, hc, hc), y.view(*outer, H)

    return mhc_pre


def _torch_mhc_post(module: types.ModuleType):
    """SGLang's ``mhc_post`` contract on SGLang's own torch path (``_mhc_post_torch``)."""

    def mhc_post(x, residual, post_layer_mix, comb_res_mix):
        post = post_layer_mix.reshape(*residual.shape[:-1], 1)  # SGLang takes [T,hc,1] or [T,hc]
        return module._mhc_post_torch(x, residual, post, comb_res_mix)

    return mhc_post


def _torch_mhc_fused_post_pre(module: types.ModuleType):
    """SGLang's ``mhc_fused_post_pre`` contract: its torch post, then its torch pre on the
    rounded new residual (what its kernels compute), and its empty-batch early return."""
    post_fn, pre_fn = _torch_mhc_post(module), _torch_mhc_pre(module)

    def mhc_fused_post_pre(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale, hc_base,
                           rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                           sinkhorn_repeat, n_splits=1, tile_n=1, *, norm_weight=None,
                           norm_eps=None):
        hc, H = residual.shape[-2:]
        outer = residual.shape[:-2]
        if residual.numel() == 0:
            f32 = torch.float32
            return (torch.empty_like(residual),
                    residual.new_empty((*outer, hc, 1), dtype=f32),
                    residual.new_empty((*outer, hc, hc), dtype=f32),
                    residual.new_empty((*outer, H), dtype=torch.bfloat16))
        T = residual.numel() // (hc * H)  # SGLang's kernels take the leading dims flattened
        new = post_fn(x.reshape(T, H), residual.reshape(T, hc, H),
                      post_layer_mix.reshape(T, hc, 1), comb_res_mix.reshape(T, hc, hc))
        new = new.view(residual.shape)
        return (new, *pre_fn(new, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                             hc_post_mult_value, sinkhorn_repeat, norm_weight=norm_weight,
                             norm_eps=norm_eps))

    return mhc_fused_post_pre


def _sglang_or_torch(real, torch_path):
    """``real`` (SGLang's function, whose signature it keeps) where TileLang can run it, else
    ``torch_path`` with the same arguments; counted."""
    signature = inspect.signature(real)

    @functools.wraps(real)
    def dispatch(*args, **kwargs):
        residual = signature.bind(*args, **kwargs).arguments["residual"]
        return (real if tilelang_runs(residual) else torch_path)(*args, **kwargs)

    return counted(dispatch)


def mhc_module() -> types.ModuleType:
    """SGLang's own ``kernels/ops/layernorm/mhc.py`` at its dotted path, executed by path over
    the benchmark's stand-ins for the ``sglang.srt`` helpers it imports
    (:func:`dsv4spec.bench.sglang_mhc.install_stubs`).

    Its ``mhc_pre``, ``mhc_post`` and ``mhc_fused_post_pre`` (the hooked targets) are replaced by
    counted functions with SGLang's signatures that run SGLang's own function where its TileLang
    kernels can run (CUDA with TileLang installed, hc_mult * H in 16384 or 28672) and otherwise
    SGLang's own torch path from the same file (``_mhc_pre_torch``, ``_mhc_post_torch``, the two in
    sequence for the fused boundary, the RMSNorm as its kernel applies it). Everything else in the
    module (``_mhc_pre_dispatch``, ``hc_pre``, ``prewarm_mhc_pre``, ...) is SGLang's own code.
    """
    from dsv4spec.bench.sglang_mhc import MHC_FILE as bench_file
    from dsv4spec.bench.sglang_mhc import install_stubs

    assert bench_file == MHC_FILE
    install_stubs()
    # SGLang's allocator answers whether --enable-symm-mem is on; a stand-in server has it off.
    sys.modules[PYNCCL_ALLOCATOR_MOD].is_symmetric_memory_enabled = lambda: False
    module = add_module(MHC_MOD, load_sglang_module(MHC_FILE, name=MHC_MOD))
    for name, make in (("mhc_pre", _torch_mhc_pre), ("mhc_post", _torch_mhc_post),
                       ("mhc_fused_post_pre", _torch_mhc_fused_post_pre)):
        setattr(module, name, _sglang_or_torch(getattr(module, name), make(module)))
    return module


def upstream_class(relpath: str, name: str, module: types.ModuleType) -> type:
    """SGLang's own source of class ``name``, executed with ``module``'s dict as its globals."""
    node = class_node(relpath, name)
    source = textwrap.dedent(ast.get_source_segment(parse(relpath)[1], node))
    namespace: dict = {}
    exec(compile(source, str(sglang_file(relpath)), "exec"), module.__dict__, namespace)
    cls = namespace[name]
    cls.__module__ = module.__name__
    return cls


def add_get_mhc_ops(target: types.ModuleType) -> None:
    """Give the ``deepseek_v4`` stand-in SGLang's own ``MhcOps`` and ``get_mhc_ops`` (its source,
    ``functools.cache``'d as SGLang declares it; CUDA: not XPU)."""
    from typing import Any, Callable, NamedTuple, Optional

    node = function_node(TARGET_FILE, "get_mhc_ops")
    assert [ast.unparse(d) for d in node.decorator_list] == ["functools.cache"]
    target.functools, target._is_xpu = functools, False
    target.NamedTuple, target.Callable, target.Any, target.Optional = (
        NamedTuple, Callable, Any, Optional)
    target.MhcOps = upstream_class(TARGET_FILE, "MhcOps", target)
    target.get_mhc_ops = functools.cache(
        upstream_function(TARGET_FILE, "get_mhc_ops", None, target))


def _envs():
    return sys.modules["sglang.srt.environ"].envs  # SGLang's own environ.py (install_stubs)


def fused_mhc_module() -> types.ModuleType:
    """``deepseek_v4_fused_mhc`` with SGLang's own ``apply_mhc_post_pre_boundary`` and
    ``_is_fused_mhc_post_pre_enabled``; its aiter/Triton attempt (``try_mhc_fused_post_pre_
    boundary``) answers None, as it does on CUDA (it fires only on gfx95 / gfx1250)."""
    module = types.ModuleType(FUSED_MHC_MOD)
    module.torch, module.envs = torch, _envs()
    module._is_gfx95_supported = module._is_gfx1250_supported = False
    module.get_platform = sys.modules["sglang.srt.runtime_context"].get_platform
    module.try_mhc_fused_post_pre_boundary = lambda *args, **kwargs: None
    for name in ("_is_fused_mhc_post_pre_enabled", "apply_mhc_post_pre_boundary"):
        setattr(module, name, upstream_function(FUSED_MHC_FILE, name, None, module))
    for package in ("sglang.srt.models.deepseek_common",
                    "sglang.srt.models.deepseek_common.amd"):
        if package not in sys.modules:
            parent = types.ModuleType(package)
            parent.__path__ = []
            add_module(package, parent)
    return add_module(FUSED_MHC_MOD, module)


def mhc_cfg_module() -> types.ModuleType:
    """``deepseek_v4_mhc`` with SGLang's own ``post`` (the hc_post dispatch) on CUDA sm_90
    defaults: not NPU, XPU or ROCm, FlashInfer off, TileLang post on."""
    module = types.ModuleType(MHC_CFG_MOD)
    module.torch, module.envs = torch, _envs()
    module._is_npu = module._is_xpu = module._is_hip = False
    module.get_platform = sys.modules["sglang.srt.runtime_context"].get_platform
    module.compile_in_capture_mode = lambda fn: fn
    module.MHC_POST_MULT_VALUE = 2.0

    def mhc_post_split_h(*args, **kwargs):
        raise AssertionError("SGLang's split-H post is for hc_pre_from_prev models only")

    module.mhc_post_split_h = mhc_post_split_h
    module.post = upstream_function(MHC_CFG_FILE, "post", None, module)
    return add_module(MHC_CFG_MOD, module)


def decoder_layer_class(target: types.ModuleType) -> type:
    """``DeepseekV4DecoderLayerBase`` (DSV4's decoder layers) with SGLang's own ``hc_pre`` and
    ``hc_post`` (CUDA defaults: TileLang pre on, FlashInfer off), in the ``deepseek_v4``
    stand-in ``target``."""
    target.envs, target._is_npu, target._is_hip = _envs(), False, False
    target.compile_in_capture_mode = lambda fn: fn
    target.MHC_POST_MULT_VALUE = 2.0
    target.mhc = sys.modules[MHC_CFG_MOD]
    hc_pre = upstream_function(TARGET_FILE, "hc_pre", "DeepseekV4DecoderLayerBase", target)
    hc_post = upstream_function(TARGET_FILE, "hc_post", "DeepseekV4DecoderLayerBase", target)

    class DeepseekV4DecoderLayerBase:
        def __init__(self, hidden_size: int, rms_norm_eps: float, hc_eps: float,
                     hc_sinkhorn_iters: int) -> None:
            self.hc_mult = 4
            self.rms_norm_eps, self.hc_eps = rms_norm_eps, hc_eps
            self.hc_sinkhorn_iters = hc_sinkhorn_iters
            self.hc_cfg = types.SimpleNamespace(mult=4, hidden=hidden_size, pre_from_prev=False)

    DeepseekV4DecoderLayerBase.hc_pre = hc_pre
    DeepseekV4DecoderLayerBase.hc_post = hc_post
    DeepseekV4DecoderLayerBase.__module__ = TARGET_MOD
    target.DeepseekV4DecoderLayerBase = DeepseekV4DecoderLayerBase
    return DeepseekV4DecoderLayerBase


def metadata_modules(topk_backend: str = "sgl-kernel",
                     draft_topk_backend: str = "sgl-kernel") -> tuple[types.ModuleType,
                                                                   types.ModuleType]:
    """SGLang's own DSV4 metadata kernel files (``attn_metadata_kernels.py``,
    ``metadata_kernel.py``) at their dotted paths, executed by path over the benchmark's
    stand-ins; the stand-in runtime context answers ``get_exec()`` and ``get_spec()`` with the
    given DSA top-k backends (SGLang's defaults unless told), as a server publishes them."""
    from dsv4spec.bench.metadata import load_sglang_metadata_kernels

    page, c128 = load_sglang_metadata_kernels(PAGE_METADATA_MOD, C128_METADATA_MOD)
    add_module(PAGE_METADATA_MOD, page)
    add_module(C128_METADATA_MOD, c128)
    set_topk_backends(topk_backend, draft_topk_backend)
    return page, c128


def model_config(model_type: str) -> types.SimpleNamespace:
    """What SGLang's ``process_model_config()`` returns, as far as the hooks read it."""
    return types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type=model_type))


def serve_model(context: types.ModuleType, model_type: str | None = "deepseek_v4") -> None:
    """The stand-in runtime ``context`` answers ``process_model_config()`` for a server of
    ``model_type`` (None: configuration not published, SGLang's ValueError)."""
    def process_model_config():
        if model_type is None:
            raise ValueError("server args are not published")
        return model_config(model_type)

    context.process_model_config = process_model_config


RUNTIME_CONTEXT_FILE = "srt/runtime_context.py"
ARG_GROUPS_MOD = "sglang.srt.arg_groups"
# SGLang's own files the runtime context imports: (file, dotted name), in import order
ARG_GROUPS_FILES = (
    ("srt/arg_groups/prefill_buffer_ceiling.py", f"{ARG_GROUPS_MOD}.prefill_buffer_ceiling"),
    ("srt/arg_groups/arg_utils.py", f"{ARG_GROUPS_MOD}.arg_utils"),
    ("srt/arg_groups/fields/parallel.py", f"{ARG_GROUPS_MOD}.fields.parallel"),
)


def runtime_context_module() -> types.ModuleType:
    """SGLang's own ``srt/runtime_context.py`` at its dotted path, executed by path: its
    ``RuntimeContext.set_server_args`` (what ``publish`` and ``create_context`` install the
    arguments with), ``use_context``, ``reset_context``, ``get_server_args`` and
    ``process_model_config`` run as SGLang's.

    The ``arg_groups`` files it imports are SGLang's own too (:data:`ARG_GROUPS_FILES`), but for
    ``arg_groups.overrides``, stood in here: ``resolution_result`` answers the field as given,
    ``model_config_of`` the ``ModelConfig`` memoised on the arguments, as SGLang's returns it once
    built, and ``resolved_view`` is the arguments (imported, not called: :class:`ServerArgs`
    declares no config namespaces, so a publish projects no bags). ``publish`` itself also
    places ranks in the parallel topology, which needs SGLang's resolved configuration; the tests
    publish with ``set_server_args``."""
    for package in (ARG_GROUPS_MOD, f"{ARG_GROUPS_MOD}.fields"):
        add_module(package, types.ModuleType(package)).__path__ = []
    for relpath, name in ARG_GROUPS_FILES:
        add_module(name, load_sglang_module(relpath, name=name))
    overrides = add_module(f"{ARG_GROUPS_MOD}.overrides",
                           types.ModuleType(f"{ARG_GROUPS_MOD}.overrides"))
    overrides.resolution_result = (
        lambda server_args, field, default=None: getattr(server_args, field, default))
    overrides.model_config_of = lambda server_args: server_args._model_config
    overrides.resolved_view = lambda server_args: server_args
    return add_module(RUNTIME_CONTEXT_MOD,
                      load_sglang_module(RUNTIME_CONTEXT_FILE, name=RUNTIME_CONTEXT_MOD))


class ServerArgs:
    """Server arguments to publish, as far as the hooks read them: the memoised ``ModelConfig``
    of a server of ``model_type``."""

    def __init__(self, model_type: str) -> None:
        self._model_config = model_config(model_type)


def set_topk_backends(topk_backend: str, draft_topk_backend: str) -> None:
    """The DSA top-k backends the stand-in runtime context publishes (target, draft)."""
    context = sys.modules[RUNTIME_CONTEXT_MOD]
    kernel = types.SimpleNamespace(dsa_topk_backend=topk_backend)
    context.get_exec = lambda: types.SimpleNamespace(kernel=kernel)
    spec = types.SimpleNamespace(speculative_dsa_topk_backend=draft_topk_backend)
    context.get_spec = lambda: spec


# --- the DSV4 attention backend: the row expansion and the two methods that call it ------------

def backend_module() -> types.ModuleType:
    """``deepseek_v4_backend`` with ``DeepseekV4AttnBackend`` carrying SGLang's own
    ``expand_extend_with_same_length`` (counted) and its two callers,
    ``make_forward_metadata_from_raw_verify`` and ``init_forward_metadata_draft_extend`` (SGLang's
    source), and ``DeepseekV4MultiStepBackend`` inheriting them as SGLang's does. The callers run
    up to ``make_core_attn_metadata``, which records its arguments in ``self.core_calls`` and
    returns a stand-in core metadata without compressed ratios (``has_c4``/``has_c128`` off)."""
    from typing import List, Optional, Tuple

    module = types.ModuleType(BACKEND_MOD)
    module.torch, module.functools = torch, functools
    module.Optional, module.List, module.Tuple = Optional, List, Tuple
    module.DSV4Metadata = lambda *args, **kwargs: types.SimpleNamespace(args=args, **kwargs)
    module.DSV4RawVerifyMetadata = types.SimpleNamespace

    def create_paged_compressor_data(**kwargs):
        raise AssertionError("no compressed ratios in the stand-in")

    module.create_paged_compressor_data = create_paged_compressor_data
    names = ("expand_extend_with_same_length", "make_forward_metadata_from_raw_verify",
             "init_forward_metadata_draft_extend")
    methods = {name: upstream_function(BACKEND_FILE, name, "DeepseekV4AttnBackend", module)
               for name in names}

    class DeepseekV4AttnBackend:
        expand_extend_with_same_length = counted(methods["expand_extend_with_same_length"])
        make_forward_metadata_from_raw_verify = methods["make_forward_metadata_from_raw_verify"]
        init_forward_metadata_draft_extend = methods["init_forward_metadata_draft_extend"]
        MAX_SEQ_LEN_FOR_CAPTURE = 1 << 20
        has_c4 = has_c128 = trtllm_attn = False
        page_size = 256

        def __init__(self, device: str, num_draft_tokens: int = 4) -> None:
            self.device = device
            self.cuda_int32_kwargs = {"device": device, "dtype": torch.int32}
            self.speculative_num_draft_tokens = num_draft_tokens
            self.req_to_token = torch.zeros((1, 1), dtype=torch.int32, device=device)
            self.token_to_kv_pool = types.SimpleNamespace(request_window=None)
            self.core_calls: list[dict] = []

        def _fill_cuda_graph_swa_out_cache_loc(self, out_cache_loc):
            return None  # SGLang's eager miss: no graph buffer

        def make_core_attn_metadata(self, **kwargs):
            self.core_calls.append(kwargs)
            return types.SimpleNamespace(low_ratios=(), swa_out_cache_loc=None)

    class DeepseekV4MultiStepBackend(DeepseekV4AttnBackend):
        # SGLang's own loop over the step backends (tests/integrations/sglang/
        # test_draft_metadata.py drives it; here it only has to be there to be hooked)
        init_forward_metadata_in_graph = counted(upstream_function(
            BACKEND_FILE, "init_forward_metadata_in_graph", "DeepseekV4MultiStepBackend",
            module))

    for cls in (DeepseekV4AttnBackend, DeepseekV4MultiStepBackend):
        cls.__module__ = BACKEND_MOD
    module.DeepseekV4AttnBackend = DeepseekV4AttnBackend
    module.DeepseekV4MultiStepBackend = DeepseekV4MultiStepBackend
    add_attn_metadata(module)
    return module


def add_attn_metadata(module: types.ModuleType) -> None:
    """``module.DSV4AttnMetadata``: a stand-in carrying SGLang's own ``init_compression_metadata``
    and ``init_flashmla_related`` (counted) over SGLang's ``metadata_kernel.py`` where it is
    loaded at its dotted path (``_pad_last_dim`` and the other helpers they call: SGLang's source,
    in ``module``)."""
    from dsv4spec.bench.metadata import load_sglang_attn_metadata

    c128 = sys.modules.get(C128_METADATA_MOD)
    if c128 is None or not hasattr(c128, "init_compression_metadata"):
        return
    cls = load_sglang_attn_metadata(c128, module)
    for name in ("init_compression_metadata", "init_flashmla_related"):
        setattr(cls, name, counted(getattr(cls, name)))
    module.DSV4AttnMetadata = cls


# --- the multi-step DSV4 draft backend: SGLang's orchestration of the per-step metadata ---------

FORWARD_BATCH_FILE = "srt/model_executor/forward_batch_info.py"
EAGLE_UTILS_FILE = "srt/speculative/eagle_utils.py"
CAPTURE_MODE_MOD = "sglang.srt.model_executor.runner_utils.capture_mode"
MULTI_STEP = "DeepseekV4MultiStepBackend"
# SGLang's own methods the draft-decode capture and replay run, per class.
MULTI_STEP_METHODS = ("init_forward_metadata_in_graph", "init_forward_metadata_out_graph",
                      "on_after_cuda_graph_warmup")
STEP_METHODS = ("init_forward_metadata_in_graph", "init_forward_metadata_out_graph",
                "init_forward_metadata_decode", "replay_cuda_graph_metadata_from",
                "on_after_cuda_graph_warmup")


def upstream_class_postponed(relpath: str, name: str, module: types.ModuleType) -> type:
    """As :func:`upstream_class`, with the file's ``from __future__ import annotations`` (SGLang's
    classes annotate with names defined later in the file)."""
    import __future__

    node = class_node(relpath, name)
    source = textwrap.dedent(ast.get_source_segment(parse(relpath)[1], node))
    namespace: dict = {}
    exec(compile(source, str(sglang_file(relpath)), "exec",
                 flags=__future__.annotations.compiler_flag, dont_inherit=True),
         module.__dict__, namespace)
    cls = namespace[name]
    cls.__module__ = module.__name__
    return cls


def draft_backend_module() -> types.ModuleType:
    """``deepseek_v4_backend`` whose ``DeepseekV4AttnBackend`` (a step) and
    ``DeepseekV4MultiStepBackend`` carry SGLang's own capture/replay methods
    (:data:`STEP_METHODS`, :data:`MULTI_STEP_METHODS`), with SGLang's own ``ForwardMode``,
    ``_GraphBucket``, ``DSV4RawDecodeMetadata`` and ``per_step_draft_out_cache_loc``.

    The raw -> full upgrade a step records, ``make_forward_metadata_from_raw_decode``, is a stand-in
    that logs ``(step id, raw)`` in ``module.upgrades`` and returns full metadata whose tensors
    are fresh functions of the raw buffers (DSV4 ratios: no low ratios, no request window).
    Call after :func:`install_packages`.
    """
    import enum
    import logging
    from dataclasses import dataclass

    for name in ("sglang.srt.model_executor", "sglang.srt.model_executor.runner_utils"):
        package = types.ModuleType(name)
        package.__path__ = []
        add_module(name, package)
    capture_mode = types.ModuleType(CAPTURE_MODE_MOD)
    capture_mode.skip_low_ratio_indexer = lambda ratio: False  # no candidate variant captured
    add_module(CAPTURE_MODE_MOD, capture_mode)

    module = types.ModuleType(BACKEND_MOD)
    module.torch, module.enum, module.dataclass = torch, enum, dataclass
    module.logger = logging.getLogger(BACKEND_MOD)
    module.IntEnum, module.auto = enum.IntEnum, enum.auto
    module.ForwardMode = upstream_class(FORWARD_BATCH_FILE, "ForwardMode", module)
    module._GraphBucket = upstream_class_postponed(BACKEND_FILE, "_GraphBucket", module)
    raw_node = class_node(BACKEND_FILE, "DSV4RawDecodeMetadata")
    assert [ast.unparse(d) for d in raw_node.decorator_list] == ["dataclass"]
    module.DSV4RawDecodeMetadata = dataclass(
        upstream_class_postponed(BACKEND_FILE, "DSV4RawDecodeMetadata", module))
    module.per_step_draft_out_cache_loc = upstream_function(
        EAGLE_UTILS_FILE, "per_step_draft_out_cache_loc", None, module)

    class DSV4RawVerifyMetadata:  # never built in draft decode
        pass

    class DSV4AttnMetadata(types.SimpleNamespace):
        has_c4 = has_c128 = False  # DSV4 ratios 4/128 off: the FlashMLA schedules stay one

    class DSV4Metadata:
        low_ratio_req_indices = low_ratio_pos_i64 = None

        def __init__(self, core_attn_metadata) -> None:
            self.core_attn_metadata = core_attn_metadata

        @property
        def core_metadata(self):
            return self.core_attn_metadata

    def forbidden(*args, **kwargs):
        raise AssertionError("not reached in DSV4 draft decode")

    module.DSV4RawVerifyMetadata, module.DSV4AttnMetadata = DSV4RawVerifyMetadata, DSV4AttnMetadata
    module.DSV4Metadata = DSV4Metadata
    module._replan_topk_in_graph = module.fill_all_compressed_indices = forbidden
    module.token_req_indices = forbidden
    module._create_flashmla_metadata = lambda: object()
    module.upgrades = []

    step_methods = {name: upstream_function(BACKEND_FILE, name, "DeepseekV4AttnBackend", module)
                    for name in STEP_METHODS}
    multi_methods = {name: upstream_function(BACKEND_FILE, name, MULTI_STEP, module)
                     for name in MULTI_STEP_METHODS}

    class Pool:
        request_window = swa_req_ring_size = None

        @staticmethod
        def translate_loc_from_full_to_swa(loc):
            return loc * 2 + 1

    class OnlineC128:
        def prepare_forward(self, *args, **kwargs):
            return 0

        def clear(self):
            pass

        def state_slot_offset(self):
            return 0

    class DeepseekV4AttnBackend:
        MAX_SEQ_LEN_FOR_CAPTURE = 1 << 20
        is_dspark_draft = needs_cpu_seq_lens = trtllm_attn = False

        def __init__(self, speculative_step_id: int = 0, topk: int = 1,
                     speculative_num_steps: int = 0) -> None:
            self.speculative_step_id = speculative_step_id
            self.topk = topk
            self.speculative_num_steps = speculative_num_steps
            self.token_to_kv_pool = Pool()
            self.online_c128_mtp = OnlineC128()
            self._early_verify_metadata_ids: set = set()
            self.forward_metadata = None
            self.tail_forward_metadata = None
            self.cuda_graph_metadata_of_bucket_and_bs = {b: {} for b in module._GraphBucket}

        def make_forward_metadata_from_raw_decode(self, raw_metadata):
            module.upgrades.append((self.speculative_step_id, raw_metadata))
            core = DSV4AttnMetadata(
                low_ratios=(), swa_out_cache_loc=None,
                page_table=raw_metadata.req_pool_indices * 1000 + raw_metadata.seq_lens,
                raw_out_loc=raw_metadata.out_cache_loc.clone())
            return DSV4Metadata(core)

    for name, method in step_methods.items():
        setattr(DeepseekV4AttnBackend, name, method)

    class DeepseekV4MultiStepBackend(DeepseekV4AttnBackend):
        def __init__(self, topk: int, speculative_num_steps: int) -> None:
            super().__init__()
            self.topk = topk
            self.speculative_num_steps = speculative_num_steps
            self.attn_backends = [
                DeepseekV4AttnBackend(speculative_step_id=i, topk=topk,
                                      speculative_num_steps=speculative_num_steps)
                for i in range(speculative_num_steps)]

    for name, method in multi_methods.items():
        setattr(DeepseekV4MultiStepBackend, name, method)
    for cls in (DeepseekV4AttnBackend, DeepseekV4MultiStepBackend):
        cls.__module__, cls.__qualname__ = BACKEND_MOD, cls.__name__  # as SGLang's classes
    module.DeepseekV4AttnBackend = DeepseekV4AttnBackend
    module.DeepseekV4MultiStepBackend = DeepseekV4MultiStepBackend
    return module
