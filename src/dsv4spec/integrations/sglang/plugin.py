"""Registration of dsv4spec's hooks with SGLang's plugin system (``sglang.srt.plugins``).

SGLang calls :func:`register` in every process that runs ``load_plugins()`` (each scheduler, per
TP rank), then applies the registered hooks. Each hook is a
:class:`~dsv4spec.integrations.hooks.GuardedHook` AROUND hook: SGLang's original stays at hand,
runs wherever dsv4spec's path steps aside, and takes over for good if dsv4spec's path raises.
Each has its own environment switch (``0`` turns it off; default on).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable
from types import ModuleType

from dsv4spec.integrations import manifest
from dsv4spec.integrations.hooks import OFF_VALUES, Gate, Hook, switch_on
from dsv4spec.integrations.sglang.source import MHC_MODULE
from dsv4spec.usage import env_switch, switch_setting

logger = logging.getLogger("dsv4spec.integrations.sglang")

# The versions whose manifests dsv4spec ships (manifests/sglang-<version>.json): a hook registers
# where the running SGLang's source matches one of them, whatever its version string says.
SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)
# Register hooks whose source matches no manifest anyway.
ALLOW_UNTESTED = "DSV4SPEC_SGLANG_ALLOW_UNTESTED"
__all__ = ["HOOKS", "OFF_VALUES", "Hook", "register", "switch_on"]


def _rollback_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.rollback import make_rollback_hook

    return make_rollback_hook(module)


def _draft_hc_head_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.hc_head import make_draft_hook

    return make_draft_hook(module)


def _dspark_hc_head_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.hc_head import make_dspark_hook

    return make_dspark_hook(module)


def _target_hc_head_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.hc_head import make_target_hook

    return make_target_hook(module)


def _page_table_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.metadata import make_page_table_hook

    return make_page_table_hook(module)


def _compressed_metadata_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.metadata import make_compressed_metadata_hook

    return make_compressed_metadata_hook(module)


def _expand_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.metadata import make_expand_hook

    return make_expand_hook(module)


def _compression_metadata_method_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.metadata import make_compression_metadata_hook

    return make_compression_metadata_hook(module)


def _flashmla_related_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.metadata import make_flashmla_related_hook

    return make_flashmla_related_hook(module)


def _draft_metadata_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.draft_metadata import make_draft_metadata_hook

    return make_draft_metadata_hook(module)


def _mhc_hook(name: str) -> Callable[[ModuleType], Callable]:
    """The maker of the hook on ``sglang.kernels.ops.layernorm.mhc.<name>``."""

    def make(module: ModuleType) -> Callable:
        from dsv4spec.integrations.sglang import mhc

        return getattr(mhc, f"make_{name}_hook")(module)

    return make


_HC_HEAD_PARAMS = ("self", "x", "hc_fn", "hc_scale", "hc_base")
# SGLang 0.5.23's mHC entry points (one switch for the three; see integrations/sglang/mhc.py).
_MHC_PRE_PARAMS = ("residual", "fn", "hc_scale", "hc_base", "rms_eps", "hc_pre_eps",
                   "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat", "n_splits",
                   "n_splits_pre", "norm_weight", "norm_eps")
_MHC_POST_PARAMS = ("x", "residual", "post_layer_mix", "comb_res_mix")
_MHC_FUSED_POST_PRE_PARAMS = ("x", "residual", "post_layer_mix", "comb_res_mix", "fn",
                              "hc_scale", "hc_base", "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps",
                              "hc_post_mult_value", "sinkhorn_repeat", "n_splits", "tile_n",
                              "norm_weight", "norm_eps")
HOOKS = (
    Hook("C128 rollback", "DSV4SPEC_SGLANG_ROLLBACK",
         "sglang.srt.mem_cache.deepseek_v4_memory_pool",
         "DeepSeekV4TokenToKVPool.clear_unaccepted_c128_draft_states",
         ("self", "req_pool_indices", "seq_lens", "accept_lens", "num_draft_tokens"),
         _rollback_hook),
    Hook("draft hc_head", "DSV4SPEC_SGLANG_DRAFT_HC_HEAD", "sglang.srt.models.deepseek_v4_nextn",
         "DeepseekV4ModelNextN.hc_head", _HC_HEAD_PARAMS, _draft_hc_head_hook),
    Hook("target hc_head", "DSV4SPEC_SGLANG_TARGET_HC_HEAD", "sglang.srt.models.deepseek_v4",
         "DeepseekV4Model.hc_head", _HC_HEAD_PARAMS, _target_hc_head_hook),
    Hook("mHC mhc_pre", "DSV4SPEC_SGLANG_MHC", MHC_MODULE, "mhc_pre", _MHC_PRE_PARAMS,
         _mhc_hook("mhc_pre")),
    Hook("mHC mhc_post", "DSV4SPEC_SGLANG_MHC", MHC_MODULE, "mhc_post", _MHC_POST_PARAMS,
         _mhc_hook("mhc_post")),
    Hook("mHC mhc_fused_post_pre", "DSV4SPEC_SGLANG_MHC", MHC_MODULE, "mhc_fused_post_pre",
         _MHC_FUSED_POST_PRE_PARAMS, _mhc_hook("mhc_fused_post_pre")),
    # DSV4 attention metadata: the builders bounded by the live length and the verify row
    # expansion in one launch (one switch for the three; see integrations/sglang/metadata.py).
    Hook("DSV4 page table", "DSV4SPEC_SGLANG_METADATA",
         "sglang.kernels.ops.attention.dsv4.attn_metadata_kernels",
         "build_page_table_positions_triton",
         ("req_to_token", "req_pool_indices_repeated", "seq_lens_casual", "max_seq_len",
          "page_size", "swa_window"),
         _page_table_hook),
    Hook("DSV4 compressed metadata", "DSV4SPEC_SGLANG_METADATA",
         "sglang.kernels.ops.attention.dsv4.metadata_kernel",
         "_init_compressed_attn_metadata_triton",
         ("seq_lens", "positions", "raw_out_loc", "page_table", "page_size",
          "compute_page_indices"),
         _compressed_metadata_hook),
    Hook("DSV4 verify row expansion", "DSV4SPEC_SGLANG_METADATA",
         "sglang.srt.layers.attention.deepseek_v4_backend",
         "DeepseekV4AttnBackend.expand_extend_with_same_length",
         ("self", "bs", "qo_len", "seq_lens", "req_pool_indices"), _expand_hook),
    # DSV4AttnMetadata's compression and FlashMLA fields in one launch (the second hook only
    # hands over what the first computed; see integrations/sglang/metadata.py).
    Hook("DSV4 compression metadata in one launch", "DSV4SPEC_SGLANG_METADATA",
         "sglang.srt.layers.attention.deepseek_v4_backend",
         "DSV4AttnMetadata.init_compression_metadata",
         ("self", "num_tokens", "low_ratio_buffers"), _compression_metadata_method_hook),
    Hook("DSV4 FlashMLA metadata", "DSV4SPEC_SGLANG_METADATA",
         "sglang.srt.layers.attention.deepseek_v4_backend",
         "DSV4AttnMetadata.init_flashmla_related",
         ("self", "is_prefill", "low_ratio_buffers"), _flashmla_related_hook),
    # The draft-decode graph's metadata for the draft steps that run (all but the last; see
    # integrations/sglang/draft_metadata.py).
    Hook("DSV4 draft-decode metadata", "DSV4SPEC_SGLANG_METADATA",
         "sglang.srt.layers.attention.deepseek_v4_backend",
         "DeepseekV4MultiStepBackend.init_forward_metadata_in_graph", ("self", "forward_batch"),
         _draft_metadata_hook),
    # DSpark's draft hc_head (SGLang's hc_head_torch over the draft block's bs * N rows).
    Hook("DSpark draft hc_head", "DSV4SPEC_SGLANG_DSPARK_HC_HEAD",
         "sglang.srt.models.deepseek_v4_dspark", "DeepseekV4ForCausalLMDSpark.collapse_hc_head",
         ("self", "x"), _dspark_hc_head_hook),
)

# The DeepSeek-V4 model modules: which names of the mHC kernels module they bind and call is
# part of each manifest; their functions that call a hooked name are part of its fingerprint.
MODEL_FILES = {
    "sglang.srt.models.deepseek_v4": "srt/models/deepseek_v4.py",
    "sglang.srt.models.deepseek_v4_nextn": "srt/models/deepseek_v4_nextn.py",
    "sglang.srt.models.deepseek_v4_mhc": "srt/models/deepseek_v4_mhc.py",
    "sglang.srt.models.deepseek_v4_dspark": "srt/models/deepseek_v4_dspark.py",
}
# Where the hooked functions are called beside the model modules: the sublayer boundary
# (mhc_fused_post_pre, through get_mhc_ops()), the attention backend (the metadata hooks) and
# the speculative worker (the C128 rollback, through a getattr).
_BACKEND_FILE = "srt/layers/attention/deepseek_v4_backend.py"
_CALLER_FILES = (*MODEL_FILES.values(), "srt/models/deepseek_common/amd/deepseek_v4_fused_mhc.py",
                 _BACKEND_FILE, "srt/speculative/eagle_worker_common.py")


def _relpath(module: str) -> str:
    return module.split(".", 1)[1].replace(".", "/") + ".py"


# Files beside its own whose definitions a hook's function reaches by name, the engine code its
# fast path reproduces: the C128 cleanup kernel the pool method launches per layer, the fused
# hc_head kernel the target's hc_head calls, the compression-metadata wrapper and kernel the
# metadata method calls (imported as _init_compression_metadata_triton), and DSpark's
# hc_head_torch, imported from the target model's file.
_HELPER_FILES = {
    "C128 rollback": ("kernels/ops/kvcache/dsv4_c128_cleanup.py",),
    "target hc_head": ("kernels/ops/layernorm/mhc_head.py",),
    "DSV4 compression metadata in one launch": ("kernels/ops/attention/dsv4/metadata_kernel.py",),
    "DSpark draft hc_head": ("srt/models/deepseek_v4.py",),
}

# What a hook's fast path assumes of code that neither its function reaches nor calls it: the
# draft-decode metadata builds only the steps the draft loop runs (the EAGLE runner builds the
# metadata, then runs the worker's draft_forward, which breaks before the last step, as its idle
# loop stops; replay refreshes the same steps; no multi-step backend for one step; see
# integrations/sglang/draft_metadata.py).
_RELIES_ON = {
    "DSV4 draft-decode metadata": (
        "srt/speculative/eagle_draft_cuda_graph_runner.py:"
        "EAGLEDraftCudaGraphRunner.capture_one_shape",
        "srt/speculative/eagle_worker_v2.py:EagleDraftWorker.draft_forward",
        "srt/speculative/eagle_worker_v2.py:EagleDraftWorker._draft_forward_idle",
        "srt/speculative/draft_utils.py:DraftBackendFactory.create_decode_backend",
        f"{_BACKEND_FILE}:DeepseekV4MultiStepBackend.init_forward_metadata",
        f"{_BACKEND_FILE}:DeepseekV4MultiStepBackend.init_forward_metadata_out_graph",
    ),
}

ENGINE_SPEC = manifest.EngineSpec(
    "sglang", "sglang", (MHC_MODULE,), MODEL_FILES,
    {hook.name: manifest.HookSource(_relpath(hook.module), hook.attr,
                                    helper_files=_HELPER_FILES.get(hook.name, ()),
                                    caller_files=_CALLER_FILES,
                                    relies_on=_RELIES_ON.get(hook.name, ()))
     for hook in HOOKS})

# The modules of the hooks' fast paths (dsv4spec.integrations.sglang.<name>), each with GATES,
# how each of its hooks decides.
HOOK_MODULES = ("rollback", "hc_head", "mhc", "metadata", "draft_metadata")

_announced = False
_verdicts: dict[str, manifest.Verdict] | None = None


def gates() -> dict[str, Gate]:
    """How each hook decides where it runs dsv4spec's ops, by hook name (imports the hooks'
    modules: dsv4spec's ops and Triton, not SGLang)."""
    found: dict[str, Gate] = {}
    for name in HOOK_MODULES:
        found.update(importlib.import_module(f"dsv4spec.integrations.sglang.{name}").GATES)
    return found


def installed_sglang_version() -> str | None:
    """``importlib.metadata.version("sglang")`` (no import of sglang), ``None`` if absent."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _registered(registry: type, target: str) -> bool:
    entries = getattr(registry, "_hooks", {}).get(target, ())
    return any(getattr(entry[1], "_dsv4spec_hook", False) for entry in entries)


def register() -> list[str]:
    """SGLang plugin entry point: register dsv4spec's AROUND hooks with SGLang's HookRegistry.

    A hook whose switch is ``0`` is not registered. A target missing from the installed SGLang
    (module, class or method renamed, parameters changed) is logged and skipped, never fatal.
    Calling it again in the same process registers nothing twice.

    Returns
    -------
    list of str
        The dotted targets registered (or already registered) by this call.
    """
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as e:  # noqa: BLE001 - a plugin must never stop the server from starting
        logger.warning("dsv4spec: SGLang plugin not installed: SGLang's hook registry is not "
                       "importable (%s: %s)", type(e).__name__, e)
        return []
    version = installed_sglang_version()
    installed, off, skipped = [], [], []
    checked = verdicts()
    for hook in HOOKS:
        if not switched_on(hook):
            off.append(f"{hook.name} ({switch_setting(hook.switch, True)})")
            continue
        if not installs(checked.get(hook.name)):
            skipped.append(hook.name)
            continue
        try:
            fn = hook.make(hook.resolve())
        except Exception as e:  # another SGLang version: renamed, moved or changed
            logger.warning("dsv4spec: %s hook skipped: %s is not usable in SGLang %s (%s: %s)",
                           hook.name, hook.target, version, type(e).__name__, e)
            skipped.append(hook.name)
            continue
        if not _registered(HookRegistry, hook.target):
            HookRegistry.register(hook.target, fn, HookType.AROUND)
        installed.append(hook.target)
    _announce(version, installed, off, skipped)
    return installed


def switched_on(hook: Hook) -> bool:
    """Whether ``hook``'s environment switch leaves it on."""
    return switch_on(hook.switch)


def installs(verdict: manifest.Verdict | None) -> bool:
    """Whether a hook with this manifest verdict registers: its SGLang source matches a tested
    version's, or ``DSV4SPEC_SGLANG_ALLOW_UNTESTED=1``."""
    return verdict is not None and (verdict.ok or env_switch(ALLOW_UNTESTED, False))


def manifests() -> list[dict]:
    """The packaged SGLang manifests; [] where they cannot be read."""
    try:
        return manifest.packaged_manifests("sglang")
    except Exception as e:  # noqa: BLE001 - a broken install steps aside, never fails SGLang
        logger.warning("dsv4spec: the SGLang manifests could not be read (%s: %s); every hook "
                       "steps aside", type(e).__name__, e)
        return []


def verdicts() -> dict[str, manifest.Verdict]:
    """Each hook's verdict for the running SGLang's source (decided once per process, read from
    its files: nothing imported), with one WARNING per hook whose source matches no manifest,
    naming what differs, and one per DSV4 module binding an mHC kernel name no manifest lists."""
    global _verdicts
    if _verdicts is not None:
        return _verdicts
    from dsv4spec.integrations.sglang.source import sglang_root

    try:
        root = sglang_root()
    except Exception:  # noqa: BLE001
        root = None
    tested = manifests()
    _verdicts = manifest.verdicts(ENGINE_SPEC, root, tested)
    allow = env_switch(ALLOW_UNTESTED, False)
    versions = ", ".join(m["version"] for m in tested) or "none"
    for verdict in _verdicts.values():
        if verdict.ok:
            continue
        logger.warning(
            "dsv4spec: SGLang %s hook %s: the SGLang source it rests on (%s) matches no tested "
            "SGLang (%s): %s%s", verdict.hook, "registered anyway" if allow else "steps aside",
            root, versions, verdict.reason,
            f" ({switch_setting(ALLOW_UNTESTED, False)})" if allow else
            f"; SGLang's own code serves it ({ALLOW_UNTESTED}=1 registers it anyway)")
    for module in MODEL_FILES:
        new = manifest.uncovered(ENGINE_SPEC, root, tested, module)
        if new:
            logger.warning("dsv4spec: SGLang coverage changed: %s binds %s from %s, which no "
                           "tested SGLang (%s) binds there; dsv4spec hooks none of it",
                           module, ", ".join(new), MHC_MODULE, versions)
    return _verdicts


def _announce(version: str | None, installed: list[str], off: list[str],
              skipped: list[str]) -> None:
    global _announced
    if _announced:
        return
    _announced = True
    from dsv4spec import __version__

    if version not in SUPPORTED_SGLANG_VERSIONS:
        logger.warning("dsv4spec: SGLang %s is not a tested version (%s); hooks are "
                       "registered only where their source matches a tested version's", version,
                       ", ".join(SUPPORTED_SGLANG_VERSIONS))
    # WARNING: SGLang configures logging after loading plugins, so a lower level is lost.
    logger.warning("dsv4spec %s SGLang plugin on SGLang %s: installed %s; off: %s; skipped: %s",
                   __version__, version, ", ".join(installed) or "nothing",
                   ", ".join(off) or "none", ", ".join(skipped) or "none")
