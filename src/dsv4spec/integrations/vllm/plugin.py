"""Registration of dsv4spec's hooks with vLLM's general plugins (``vllm.general_plugins``).

vLLM calls every general plugin in each process that loads a model (the engine core, each
tensor-parallel worker before ``load_model``, the model registry's inspection subprocess),
possibly more than once per process, so :func:`register` is idempotent and cheap: it imports
nothing of vLLM.

vLLM has no hook registry: its DeepSeek-V4 model modules bind the mHC kernels with
``from vllm.model_executor.kernels.mhc.tilelang import ...`` at import time, so each hook
replaces those names in the modules that call them (:data:`MODEL_MODULES`), once a module is
imported, or at once if it already is. vLLM's kernels module itself is left alone: other models
(and the CustomOps of other platforms) keep calling vLLM's functions. Each replacement is a
:class:`~dsv4spec.integrations.hooks.GuardedHook` around vLLM's own function: vLLM's function
serves every call dsv4spec's path steps aside from, and all of them once that path has raised.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from dsv4spec.integrations import manifest
from dsv4spec.integrations.hooks import OFF_VALUES, Gate, GuardedHook, Hook, switch_on
from dsv4spec.usage import env_switch, switch_setting

logger = logging.getLogger("dsv4spec.integrations.vllm")

# The versions whose manifests dsv4spec ships (manifests/vllm-<version>.json): a hook installs
# where the running vLLM's source matches one of them, whatever its version string says.
SUPPORTED_VLLM_VERSIONS = ("0.33.0", "0.34.0")
MASTER_SWITCH = "DSV4SPEC_VLLM"
# Install hooks whose source matches no manifest anyway.
ALLOW_UNTESTED = "DSV4SPEC_VLLM_ALLOW_UNTESTED"
KERNELS_MODULE = "vllm.model_executor.kernels.mhc.tilelang"
# The NVIDIA DeepSeek-V4 modules that call the hooked functions (vLLM 0.33.0, 0.34.0): the target
# (DeepseekV4Model, whose DeepseekV4DecoderLayer.forward the MTP layer's block also runs), the
# MTP draft and the DSpark draft. The vision model wraps the target and calls none itself.
TARGET_MODULE = "vllm.models.deepseek_v4.nvidia.model"
MTP_MODULE = "vllm.models.deepseek_v4.nvidia.mtp"
DSPARK_MODULE = "vllm.models.deepseek_v4.nvidia.dspark"
MODEL_MODULES = (TARGET_MODULE, MTP_MODULE, DSPARK_MODULE)
__all__ = ["HOOKS", "MASTER_SWITCH", "MODEL_MODULES", "OFF_VALUES", "Hook", "installed",
           "register", "switch_on"]


# The module of each hook's fast path (dsv4spec.integrations.vllm.<area>.fast_<hook>).
_AREAS: dict[str, str] = {}


def fast_path(name: str) -> Callable:
    """Hook ``name``'s fast path (imports dsv4spec's ops and kernels, and Triton)."""
    return getattr(importlib.import_module(f"dsv4spec.integrations.vllm.{_AREAS[name]}"),
                   f"fast_{name}")


def gates() -> dict[str, Gate]:
    """How each hook decides where it runs dsv4spec's ops, by hook name (imports the fast paths'
    modules: dsv4spec's ops and Triton, not vLLM)."""
    return {hook.name: importlib.import_module(
        f"dsv4spec.integrations.vllm.{_AREAS[hook.name]}").GATES[hook.name] for hook in HOOKS}


def _make(area: str, name: str) -> Callable[[ModuleType], Callable]:
    """A GuardedHook whose fast path is imported at its first call: vLLM loads general plugins
    in processes that never run a model (the API server, the CLI), where :func:`register` must
    import nothing heavy (dsv4spec's ops import Triton and compile nothing, but take about
    0.2 s). A failed import is a fault of the fast path: logged once, vLLM's function serves."""
    _AREAS[name] = area

    def make(module: ModuleType | None = None) -> Callable:
        guard = GuardedHook(f"vLLM {name}", None, logger, "vLLM")
        loaded: list[Callable] = []

        def load(*args: Any, **kwargs: Any) -> Any:
            if not loaded:
                loaded.append(fast_path(name))
            if guard.fast is load:  # from now on the guard calls it directly
                guard.fast = loaded[0]
            return loaded[0](*args, **kwargs)

        guard.fast = load
        return guard

    return make


_PRE = ("residual", "fn", "hc_scale", "hc_base", "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps",
        "hc_post_mult_value", "sinkhorn_repeat", "n_splits", "norm_weight", "norm_eps")
_POST = ("x", "residual", "post_layer_mix", "comb_res_mix")
_FUSED = ("x", "residual", "post_layer_mix", "comb_res_mix", "fn", "hc_scale", "hc_base",
          "rms_eps", "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat",
          "n_splits", "tile_n", "norm_weight", "norm_eps")
_HC_HEAD = ("hs_flat", "fn", "hc_scale", "hc_base", "rms_eps", "hc_eps")
# Hook.module is where vLLM defines the function; BOUND_IN, the modules whose names are replaced.
HOOKS = (
    Hook("hc_head", "DSV4SPEC_VLLM_HC_HEAD", KERNELS_MODULE, "hc_head_fused_kernel_tilelang",
         _HC_HEAD, _make("hc_head", "hc_head")),
    Hook("mhc_pre", "DSV4SPEC_VLLM_MHC", KERNELS_MODULE, "mhc_pre_tilelang", _PRE,
         _make("mhc", "mhc_pre")),
    Hook("mhc_post", "DSV4SPEC_VLLM_MHC", KERNELS_MODULE, "mhc_post_tilelang", _POST,
         _make("mhc", "mhc_post")),
    Hook("mhc_fused_post_pre", "DSV4SPEC_VLLM_MHC", KERNELS_MODULE,
         "mhc_fused_post_pre_tilelang", _FUSED, _make("mhc", "mhc_fused_post_pre")),
    # vLLM 0.34.0: every boundary of the target's layers (DeepseekV4Model.forward passes
    # reuse_residual=True); the MTP block and DSpark's layers keep mhc_fused_post_pre_tilelang.
    # Same parameters, same kernels (tilelang_kernels.py is byte-identical in 0.33.0 and 0.34.0),
    # so it reads mhc_fused_post_pre's table rows.
    Hook("mhc_fused_post_pre_reuse_residual", "DSV4SPEC_VLLM_MHC", KERNELS_MODULE,
         "mhc_fused_post_pre_tilelang_reuse_residual", _FUSED,
         _make("mhc", "mhc_fused_post_pre_reuse_residual")),
)
BOUND_IN: dict[str, tuple[str, ...]] = {
    "hc_head": MODEL_MODULES,
    "mhc_pre": (TARGET_MODULE,),
    "mhc_post": MODEL_MODULES,
    "mhc_fused_post_pre": (TARGET_MODULE,),
    "mhc_fused_post_pre_reuse_residual": (TARGET_MODULE,),
}

# The mHC names those modules call that no hook replaces, and why.
NOT_HOOKED = {
    "mhc_pre_broadcast_tilelang": (
        "the target's first layer on the first pipeline rank (model.py, every forward): its "
        "residual is the [T, H] embedding broadcast to the 4 streams with fn folded to "
        "fn_broadcast [24, H]; dsv4spec has no broadcast mhc_pre and none was measured"),
}

_KERNELS_FILE = "model_executor/kernels/mhc/tilelang.py"
MODEL_FILES = {TARGET_MODULE: "models/deepseek_v4/nvidia/model.py",
               MTP_MODULE: "models/deepseek_v4/nvidia/mtp.py",
               DSPARK_MODULE: "models/deepseek_v4/nvidia/dspark.py"}
# What each hook's correctness rests on (manifests/vllm-*.json hold its fingerprint per version):
# vLLM's function and what it reaches in tilelang.py and tilelang_kernels.py (its kernels), and
# the model functions that call it.
ENGINE_SPEC = manifest.EngineSpec(
    "vllm", "vllm", (KERNELS_MODULE,), MODEL_FILES,
    {hook.name: manifest.HookSource(
        _KERNELS_FILE, hook.attr,
        helper_files=("model_executor/kernels/mhc/tilelang_kernels.py",),
        caller_files=tuple(MODEL_FILES.values())) for hook in HOOKS})

_guards: dict[str, GuardedHook] = {}  # one per hook, shared by every module it patches
# hook -> whether a table serves any GPU of this process (decided at the hook's first call; see
# _settle); False: vLLM's function is back in the modules
_settled: dict[str, bool] = {}
# The table each hook reads (the reuse_residual boundary runs the boundary's kernels).
_TABLE_OF = {"mhc_fused_post_pre_reuse_residual": "mhc_fused_post_pre"}
_announced = False
_switched_off: list[str] = []  # "<hook> (<switch as set>)", for the summary
# The hooks' verdicts against the packaged manifests, decided once per process at the first
# DeepSeek-V4 module patched (processes that never import one never read vLLM's source).
_verdicts: dict[str, manifest.Verdict] | None = None
_manifests: list[dict] | None = None
_covered: set[str] = set()  # modules whose bound names were compared with the manifests


def installed_vllm_version() -> str | None:
    """``importlib.metadata.version("vllm")`` (no import of vllm), ``None`` if absent."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def is_hooked(fn: Any) -> bool:
    return getattr(fn, "_dsv4spec_hook", False)


def _wrap(guard: GuardedHook, original: Callable, name: str) -> Callable:
    @functools.wraps(original)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        served = _settled.get(name)
        if served is None:
            served = _settle(name)
        if not served:
            return original(*args, **kwargs)
        return guard(original, *args, **kwargs)

    hooked._dsv4spec_hook = True
    hooked._dsv4spec_guard = guard
    return hooked


def _source_root(module: ModuleType) -> Path | None:
    """The directory holding the running vLLM's ``vllm/`` folder: from the file its mHC kernels
    module (which every DeepSeek-V4 module imports first) or ``module`` was loaded from, else
    vLLM located on ``sys.path`` (nothing imported)."""
    kernels = sys.modules.get(KERNELS_MODULE)
    for file, relpath in ((getattr(kernels, "__file__", None), _KERNELS_FILE),
                          (getattr(module, "__file__", None),
                           MODEL_FILES.get(module.__name__, ""))):
        root = manifest.source_root(file, "vllm", relpath)
        if root is not None:
            return root
    return installed_source_root()


def installed_source_root() -> Path | None:
    """The directory holding the ``vllm/`` folder of the vLLM on ``sys.path`` (found, not
    imported), or None."""
    spec = importlib.machinery.PathFinder.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).parent
    return None


def manifests() -> list[dict]:
    """The packaged vLLM manifests (read once); [] where they cannot be read."""
    global _manifests
    if _manifests is None:
        try:
            _manifests = manifest.packaged_manifests("vllm")
        except Exception as e:  # noqa: BLE001 - a broken install steps aside, never fails vLLM
            logger.warning("dsv4spec: the vLLM manifests could not be read (%s: %s); every "
                           "hook steps aside", type(e).__name__, e)
            _manifests = []
    return _manifests


def verdicts(module: ModuleType) -> dict[str, manifest.Verdict]:
    """Each hook's verdict for the running vLLM (decided once, from ``module``'s source tree):
    one WARNING per hook whose source matches no manifest, naming what differs."""
    global _verdicts
    if _verdicts is None:
        root = _source_root(module)
        _verdicts = manifest.verdicts(ENGINE_SPEC, root, manifests())
        allow = env_switch(ALLOW_UNTESTED, False)
        tested = ", ".join(m["version"] for m in manifests()) or "none"
        for verdict in _verdicts.values():
            if verdict.ok or verdict.absent or verdict.hook not in _guards:
                continue
            logger.warning(
                "dsv4spec: vLLM %s hook %s: the vLLM source it rests on (%s) matches no tested "
                "vLLM (%s): %s%s", verdict.hook,
                "installed anyway" if allow else "steps aside", root, tested, verdict.reason,
                f" ({switch_setting(ALLOW_UNTESTED, False)})" if allow else
                f"; vLLM's own function serves it ({ALLOW_UNTESTED}=1 installs it anyway)")
    return _verdicts


def _check_coverage(module: ModuleType) -> None:
    """One WARNING where ``module`` binds a name from vLLM's mHC kernels module that no
    manifest lists for it: a call dsv4spec has never seen, which vLLM's own function serves."""
    if module.__name__ in _covered:
        return
    _covered.add(module.__name__)
    new = manifest.uncovered(ENGINE_SPEC, _source_root(module), manifests(), module.__name__)
    if new:
        logger.warning("dsv4spec: vLLM coverage changed: %s binds %s from %s, which no tested "
                       "vLLM (%s) binds there; dsv4spec hooks none of it, vLLM's own functions "
                       "serve those calls", module.__name__, ", ".join(new), KERNELS_MODULE,
                       ", ".join(m["version"] for m in manifests()) or "none")


def _settle(name: str) -> bool:
    """Whether hook ``name`` may serve in this process, decided at its first call: where no
    measured-faster table serves any GPU this process sees (B200, MI300, any GPU under a Triton
    release no table was measured with) vLLM's own function is put back in every module the hook
    patched, so those calls no longer pay for the hook's checks, and the modules imported later
    are not patched for it. Undecided (and served) in a process without CUDA (the interpreter):
    the hook's per-call checks decide there. A failure to decide keeps the guarded hook."""
    try:
        from dsv4spec.integrations.vllm.mhc import process_served

        served, where = process_served(_TABLE_OF.get(name, name))
    except Exception as e:  # noqa: BLE001 - the guarded hook still decides per call
        logger.warning("dsv4spec: vLLM %s: could not tell whether a table serves this process's "
                       "GPUs (%s: %s); the hook decides per call", name, type(e).__name__, e)
        served, where = True, None
    _settled[name] = served
    if not served:
        restored = []
        for module_name in BOUND_IN[name]:
            module = sys.modules.get(module_name)
            attr = next(hook.attr for hook in HOOKS if hook.name == name)
            fn = getattr(module, attr, None)
            if is_hooked(fn) and getattr(fn, "_dsv4spec_guard", None) is _guards.get(name):
                setattr(module, attr, fn.__wrapped__)
                restored.append(module_name)
        logger.info("dsv4spec: vLLM %s: no measured-faster table serves this process's GPUs (%s); "
                    "vLLM's own function is back in %s", name, where,
                    ", ".join(restored) or "no module")
    return served


def installs(verdict: manifest.Verdict | None) -> bool:
    """Whether a hook with this manifest verdict installs: its vLLM source matches a tested
    version's, or ``DSV4SPEC_VLLM_ALLOW_UNTESTED=1``; never where this vLLM does not define the
    hooked function (0.33.0: the reuse_residual boundary)."""
    if verdict is None or verdict.absent:
        return False
    return verdict.ok or env_switch(ALLOW_UNTESTED, False)


def switched_on(hook: Hook, master: bool | None = None) -> bool:
    """Whether the environment leaves ``hook`` on: ``DSV4SPEC_VLLM`` (``master``, where already
    read) and its own switch."""
    return (switch_on(MASTER_SWITCH) if master is None else master) and switch_on(hook.switch)


def _may_install(hook: Hook, module: ModuleType) -> bool:
    return installs(verdicts(module).get(hook.name))


def _patch(module: ModuleType) -> list[str]:
    """Replace the hooked names ``module`` binds; returns the ``module.name`` targets patched
    now or before. A hook whose source matches no manifest steps aside (see :func:`verdicts`);
    a name whose function is not vLLM's with the expected parameters is skipped with a warning,
    never fatal."""
    patched = []
    _check_coverage(module)
    for hook in HOOKS:
        if (module.__name__ not in BOUND_IN[hook.name] or hook.name not in _guards
                or _settled.get(hook.name) is False):
            continue
        target = f"{module.__name__}.{hook.attr}"
        original = getattr(module, hook.attr, None)
        if is_hooked(original):
            patched.append(target)
            continue
        if not _may_install(hook, module):
            continue
        try:
            if original is None:
                raise AttributeError(f"{module.__name__} has no {hook.attr}")
            params = tuple(inspect.signature(original).parameters)
            if params != hook.params:
                raise TypeError(f"parameters {params}, the hook expects {hook.params}")
            if getattr(original, "__module__", None) != hook.module:
                raise TypeError(f"defined in {original.__module__}, not {hook.module}")
        except Exception as e:  # another vLLM version: renamed, moved or changed
            logger.warning("dsv4spec: vLLM %s hook skipped at %s (vLLM %s): %s: %s", hook.name,
                           target, installed_vllm_version(), type(e).__name__, e)
            continue
        setattr(module, hook.attr, _wrap(_guards[hook.name], original, hook.name))
        patched.append(target)
    return patched


def _patch_on_import(module: ModuleType) -> None:
    """:func:`_patch` on a DeepSeek-V4 module vLLM has just executed: one INFO line naming what
    was patched, one WARNING where the module binds none of the names the hooks replace there
    (vLLM moved or renamed them: its own functions serve every call of that module)."""
    try:
        patched = _patch(module)
        if _verdicts is not None:
            _announce(patched)
        expected = [hook.attr for hook in HOOKS
                    if hook.name in _guards and module.__name__ in BOUND_IN[hook.name]]
        found = [attr for attr in expected if hasattr(module, attr)]
        if patched:
            logger.info("dsv4spec: vLLM %s patched on import: %s", module.__name__,
                        ", ".join(target.rsplit(".", 1)[1] for target in patched))
        elif not found:
            logger.warning("dsv4spec: vLLM %s was imported but binds none of the names dsv4spec "
                           "hooks there (%s): vLLM's own functions serve all of its calls",
                           module.__name__, ", ".join(expected))
        else:
            logger.info("dsv4spec: vLLM %s imported, nothing patched (%s stepped aside)",
                        module.__name__, ", ".join(found))
    except Exception as e:  # noqa: BLE001 - never let a plugin break vLLM's import
        logger.warning("dsv4spec: could not hook %s (%s: %s); vLLM's kernels serve it",
                       module.__name__, type(e).__name__, e, exc_info=True)


class _PatchingLoader(importlib.abc.Loader):
    """A module's own loader, then :func:`_patch_on_import` on the executed module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch_on_import(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... as the original
        return getattr(self._loader, name)


class ImportWatcher(importlib.abc.MetaPathFinder):
    """Patches :data:`MODEL_MODULES` right after they execute: finds their spec with the finders
    after it and wraps the loader. Watches only names that were not imported yet."""

    def __init__(self) -> None:
        self.pending: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


_watcher = ImportWatcher()


def register() -> list[str]:
    """vLLM general-plugin entry point: hook the DeepSeek-V4 modules' mHC and hc_head calls.

    ``DSV4SPEC_VLLM=0`` turns every hook off, ``DSV4SPEC_VLLM_HC_HEAD=0`` / ``DSV4SPEC_VLLM_MHC=0``
    theirs. Modules already imported are patched now; the others when they are imported. Calling
    it again in the same process patches nothing twice.

    Returns
    -------
    list of str
        The ``module.name`` targets patched so far (modules imported later are patched then).
    """
    try:
        return _register()
    except Exception as e:  # noqa: BLE001 - vLLM calls plugins unguarded: never stop its start
        logger.warning("dsv4spec: vLLM plugin not installed (%s: %s); vLLM's own kernels serve "
                       "every call", type(e).__name__, e, exc_info=True)
        return []


def _register() -> list[str]:
    _log_through_vllm()
    master = switch_on(MASTER_SWITCH)
    off = []
    for hook in HOOKS:
        if not switched_on(hook, master):
            off.append(f"{hook.name} "
                       f"({switch_setting(hook.switch if master else MASTER_SWITCH, True)})")
        elif hook.name not in _guards:
            _guards[hook.name] = hook.make(None)
    if not _announced:
        _switched_off[:] = off
    patched = []
    for name in MODEL_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            patched += _patch(module)
        elif any(name in BOUND_IN[hook] for hook in _guards):
            _watcher.pending.add(name)
    watching = _watcher.pending and _watcher not in sys.meta_path
    if watching:
        sys.meta_path.insert(0, _watcher)
    if _verdicts is not None or not _watcher.pending:
        _announce(patched)
    elif watching:
        logger.info("dsv4spec vLLM plugin registered: its hooks are decided when vLLM imports "
                    "DeepSeek-V4 (%s)", ", ".join(sorted(_watcher.pending)))
    return patched


# vLLM's logger: vLLM configures it alone (vllm.logger, VLLM_CONFIGURE_LOGGING), not the root.
VLLM_LOGGER = "vllm"
DSV4SPEC_LOGGER = "dsv4spec"


class ThroughVllm(logging.Handler):
    """dsv4spec's records through vLLM's handlers while the root logger has none: where the
    application configured the root (or put vLLM's handler there), the records propagate to it
    as every library's do, and are handled there once."""

    def __init__(self, engine: logging.Logger) -> None:
        super().__init__()
        self.engine = engine

    def handle(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().handlers:
            return False
        for handler in self.engine.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # handle() passes records on
        self.handle(record)


def _log_through_vllm() -> None:
    """Show dsv4spec's lines in vLLM's output where vLLM configured its logger and nothing
    configured dsv4spec's: vLLM leaves the root logger bare, where INFO lines are dropped (and
    WARNINGs reach stderr unformatted). dsv4spec's loggers keep propagating to the root, so an
    application's handlers there receive every record; vLLM's handlers serve them only while the
    root has none (:class:`ThroughVllm`), so no line is printed twice. Neither the root logger
    nor vLLM's are touched; an application's own configuration of ``dsv4spec`` is kept, and so
    is the level of a root the application configured."""
    ours, engine = logging.getLogger(DSV4SPEC_LOGGER), logging.getLogger(VLLM_LOGGER)
    if ours.handlers or not engine.handlers:
        return
    ours.addHandler(ThroughVllm(engine))
    if ours.level == logging.NOTSET and not logging.getLogger().handlers:
        ours.setLevel(engine.getEffectiveLevel())


def installed() -> dict[str, GuardedHook]:
    """The hooks :func:`register` made in this process, by name (their state: ``enabled``,
    ``failure``)."""
    return dict(_guards)


def _acting() -> tuple[list[str], list[str]]:
    """The hooks made that act once their modules are patched (after the manifest verdicts, on
    the GPUs of this process), and "<hook> (<why not>)" for those switched off or stepping
    aside."""
    acting, off = [], list(_switched_off)
    for name in _guards:
        verdict = None if _verdicts is None else _verdicts.get(name)
        if _verdicts is not None and not installs(verdict):
            off.append(f"{name} (" + ("not in this vLLM" if verdict is None or verdict.absent
                                      else "untested vLLM source") + ")")
        elif (idle := _not_served(name)) is not None:
            off.append(f"{name} ({idle})")
        elif verdict is not None and not verdict.ok:
            acting.append(f"{name} (untested: {ALLOW_UNTESTED}=1)")
        else:
            acting.append(name)
    return acting, off


def _not_served(name: str) -> str | None:
    """Why hook ``name`` gives dsv4spec no call in this process, as its first call decides
    (:func:`_settle`): no CUDA GPU (outside Triton's interpreter), or no measured-faster table
    for any GPU the process sees; None where it may act, or where that cannot be told (the
    hook's per-call checks decide)."""
    if _settled.get(name) is not None:
        return None if _settled[name] else "no measured-faster table for this process's GPUs"
    try:
        from dsv4spec.integrations.vllm.mhc import process_served
        from dsv4spec.kernels import interpreter_enabled

        served, where = process_served(_TABLE_OF.get(name, name))
        if where is None:
            return None if interpreter_enabled() else "no CUDA GPU"
    except Exception:  # noqa: BLE001 - the summary never fails vLLM; the first call decides
        return None
    return None if served else f"no measured-faster table for this process's GPUs: {where}"


def _announce(patched: list[str]) -> None:
    """The summary WARNING, once per process: after the manifest verdicts (at register where
    the DeepSeek-V4 modules are already imported or no hook is on, else at the first one
    imported), so it names the hooks that act and those that step aside."""
    global _announced
    if _announced:
        return
    _announced = True
    from dsv4spec import __version__

    acting, off = _acting()

    version = installed_vllm_version()
    if version is not None and version not in SUPPORTED_VLLM_VERSIONS:
        logger.warning("dsv4spec: vLLM %s is not a supported version (%s); hooks are installed "
                       "only where their targets match", version,
                       ", ".join(SUPPORTED_VLLM_VERSIONS))
    running = "(vLLM is not installed)" if version is None else f"on vLLM {version}"
    logger.warning("dsv4spec %s vLLM plugin %s: hooks %s; off: %s; patched now: %s "
                   "(the other DeepSeek-V4 modules when imported)", __version__, running,
                   ", ".join(acting) or "none", ", ".join(off) or "none",
                   ", ".join(patched) or "nothing")
