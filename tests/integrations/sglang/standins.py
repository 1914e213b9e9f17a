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
import sys
import textwrap
import types

import torch
import torch.nn.functional as F

from dsv4spec.integrations.sglang.source import load_sglang_module, sglang_file

POOL_FILE = "srt/mem_cache/deepseek_v4_memory_pool.py"
STATE_FILE = "srt/mem_cache/deepseek_v4_compress_state.py"
NEXTN_FILE = "srt/models/deepseek_v4_nextn.py"
TARGET_FILE = "srt/models/deepseek_v4.py"
CLEANUP_FILE = "kernels/ops/kvcache/dsv4_c128_cleanup.py"
MHC_HEAD_FILE = "kernels/ops/layernorm/mhc_head.py"
REGISTRY_FILE = "srt/plugins/hook_registry.py"

POOL_MOD = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
NEXTN_MOD = "sglang.srt.models.deepseek_v4_nextn"
TARGET_MOD = "sglang.srt.models.deepseek_v4"
MHC_HEAD_MOD = "sglang.kernels.ops.layernorm.mhc_head"
REGISTRY_MOD = "sglang.srt.plugins.hook_registry"
# CUDA where present (SGLang's kernels and ours run for real), else the CPU in Triton's interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PACKAGES = ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.mem_cache",
            "sglang.srt.models", "sglang.kernels", "sglang.kernels.ops",
            "sglang.kernels.ops.layernorm")


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
