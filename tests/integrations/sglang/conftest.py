import sys
from dataclasses import dataclass
from types import ModuleType

import pytest

from dsv4spec.integrations import hooks as common_hooks
from dsv4spec.integrations.sglang import hc_head as hc_head_hooks
from dsv4spec.integrations.sglang import metadata as metadata_hooks
from dsv4spec.integrations.sglang import mhc as mhc_hooks
from dsv4spec.integrations.sglang import plugin, register, served_model
from dsv4spec.integrations.sglang.source import load_sglang_module, sglang_root

from . import standins

SWITCHES = tuple(dict.fromkeys(hook.switch for hook in plugin.HOOKS))
(ROLLBACK, DRAFT, TARGET, MHC_PRE, MHC_POST, MHC_POST_PRE, PAGE_TABLE,
 COMPRESSED, EXPAND) = (hook.target for hook in plugin.HOOKS[:9])
COMPRESSION_METHOD, FLASHMLA_METHOD = (
    next(hook.target for hook in plugin.HOOKS if hook.attr == f"DSV4AttnMetadata.{name}")
    for name in ("init_compression_metadata", "init_flashmla_related"))
DRAFT_METADATA = next(hook.target for hook in plugin.HOOKS
                      if hook.attr == "DeepseekV4MultiStepBackend.init_forward_metadata_in_graph")
DSPARK = next(hook.target for hook in plugin.HOOKS
              if hook.attr == "DeepseekV4ForCausalLMDSpark.collapse_hc_head")
MHC_TARGETS = (MHC_PRE, MHC_POST, MHC_POST_PRE)
METADATA_TARGETS = (PAGE_TABLE, COMPRESSED, EXPAND)


@dataclass
class FakeSGLang:
    """SGLang's hook registry (its own file) and the stand-in modules, at their dotted paths."""

    registry: type
    hook_type: type
    pool: ModuleType
    nextn: ModuleType
    target: ModuleType
    originals: dict  # hook target -> SGLang's method with a call counter, taken before hooking
    mhc: ModuleType | None = None  # sglang.kernels.ops.layernorm.mhc (SGLang's own file)
    # sglang.kernels.ops.attention.dsv4.{attn_metadata_kernels,metadata_kernel} (SGLang's files)
    page_metadata: ModuleType | None = None
    c128_metadata: ModuleType | None = None
    # sglang.srt.layers.attention.deepseek_v4_backend (SGLang's methods on a stand-in class)
    backend: ModuleType | None = None
    # sglang.srt.models.deepseek_v4_dspark (SGLang's collapse_hc_head on a stand-in class)
    dspark: ModuleType | None = None

    def install(self) -> list[str]:
        """What SGLang's ``load_plugins()`` does with the plugin: register, then apply."""
        installed = register()
        self.registry.apply_hooks()
        return installed


def _is_sglang(name: str) -> bool:
    return name == "sglang" or name.startswith("sglang.")


@pytest.fixture
def launches(monkeypatch):
    """The names of dsv4spec's Triton kernels launched while the test runs: through Triton's
    launch entry (the interpreter's on the CPU, the JIT's on CUDA) and the direct launches of
    ``LaunchCache``. ``launches.clear()`` starts a count."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from dsv4spec.kernels.launch import LaunchCache

    launched: list[str] = []
    for cls in (InterpretedFunction, JITFunction):
        def run(self, *args, _run=cls.run, **kwargs):
            if getattr(self.fn, "__module__", "").startswith("dsv4spec."):
                launched.append(self.fn.__name__)
            return _run(self, *args, **kwargs)

        monkeypatch.setattr(cls, "run", run)

    def get(self, key, _get=LaunchCache.get):
        direct = _get(self, key)
        if direct is None:
            return None

        def counted(*args):
            launched.append(self.kernel.fn.__name__)
            return direct(*args)

        return counted

    monkeypatch.setattr(LaunchCache, "get", get)
    return launched


@pytest.fixture
def serves(monkeypatch):
    """``serves(model_type)``: SGLang's runtime context (the stand-in's, or a new module where
    none is loaded) reports that model as served (None: not published); the hooks' remembered
    verdicts are emptied."""
    def serve(model_type: str | None = served_model.DSV4_MODEL_TYPE) -> None:
        context = sys.modules.get(standins.RUNTIME_CONTEXT_MOD)
        if context is None:
            context = ModuleType(standins.RUNTIME_CONTEXT_MOD)
            monkeypatch.setitem(sys.modules, standins.RUNTIME_CONTEXT_MOD, context)
        monkeypatch.setattr(context, "process_model_config", None, raising=False)
        standins.serve_model(context, model_type)
        monkeypatch.setattr(served_model, "_verdicts", {})

    return serve


@pytest.fixture
def dsv4_served(serves):
    """SGLang serves DeepSeek-V4 (for hooks called without the ``sgl`` stand-ins)."""
    serves()


@pytest.fixture
def sgl(monkeypatch, serves):
    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed (`make setup` installs sglang==0.5.23)")
    for switch in SWITCHES:
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setattr(plugin, "_announced", False)
    monkeypatch.setattr(plugin, "_verdicts", None)
    monkeypatch.delenv(plugin.ALLOW_UNTESTED, raising=False)
    monkeypatch.setattr(hc_head_hooks, "_warned", set())
    monkeypatch.setattr(hc_head_hooks, "_ready", {})
    monkeypatch.setattr(hc_head_hooks, "_deterministic", None)
    monkeypatch.setattr(mhc_hooks, "_warned", set())
    monkeypatch.setattr(mhc_hooks, "_compiled", set())
    monkeypatch.setattr(mhc_hooks, "_original_warmed", set())
    monkeypatch.setattr(mhc_hooks, "_warm_pending", None)
    monkeypatch.setattr(mhc_hooks, "_deep_gemm", None)
    monkeypatch.setattr(mhc_hooks, "_deep_gemm_unread", False)
    monkeypatch.setattr(common_hooks, "_told_paths", set())
    monkeypatch.delenv("SGLANG_OPT_DEEPGEMM_HC_PRENORM", raising=False)
    monkeypatch.setattr(metadata_hooks, "_warned", set())
    monkeypatch.setattr(metadata_hooks, "_compiled", set())
    monkeypatch.setattr(metadata_hooks, "_pending_sparse", None)
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _is_sglang(name)}
    try:
        standins.install_packages()
        registry = load_sglang_module(standins.REGISTRY_FILE, name=standins.REGISTRY_MOD)
        standins.add_module(standins.REGISTRY_MOD, registry)
        registry.HookRegistry.reset()
        pool = standins.add_module(standins.POOL_MOD, standins.pool_module())
        nextn = standins.add_module(standins.NEXTN_MOD, standins.nextn_module())
        dspark = standins.add_module(standins.DSPARK_MOD, standins.dspark_module())
        target = standins.add_module(standins.TARGET_MOD, standins.target_module())
        mhc = standins.mhc_module()
        page_metadata, c128_metadata = standins.metadata_modules()
        backend = standins.add_module(standins.BACKEND_MOD, standins.backend_module())
        serves()  # the stand-ins present themselves as DeepSeek-V4, as SGLang's context would
        originals = {
            ROLLBACK: pool.DeepSeekV4TokenToKVPool.clear_unaccepted_c128_draft_states,
            DRAFT: nextn.DeepseekV4ModelNextN.hc_head,
            TARGET: target.DeepseekV4Model.hc_head,
            MHC_PRE: mhc.mhc_pre,
            MHC_POST: mhc.mhc_post,
            MHC_POST_PRE: mhc.mhc_fused_post_pre,
            PAGE_TABLE: page_metadata.build_page_table_positions_triton,
            COMPRESSED: c128_metadata._init_compressed_attn_metadata_triton,
            EXPAND: backend.DeepseekV4AttnBackend.expand_extend_with_same_length,
            COMPRESSION_METHOD: backend.DSV4AttnMetadata.init_compression_metadata,
            FLASHMLA_METHOD: backend.DSV4AttnMetadata.init_flashmla_related,
            DRAFT_METADATA: backend.DeepseekV4MultiStepBackend.init_forward_metadata_in_graph,
            DSPARK: dspark.DeepseekV4ForCausalLMDSpark.collapse_hc_head,
        }
        yield FakeSGLang(registry.HookRegistry, registry.HookType, pool, nextn, target, originals,
                         mhc, page_metadata, c128_metadata, backend, dspark)
        registry.HookRegistry.reset()
    finally:
        for name in [name for name in sys.modules if _is_sglang(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
