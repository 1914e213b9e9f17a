"""Registration of dsv4spec's hooks with SGLang's plugin system (``sglang.srt.plugins``).

SGLang calls :func:`register` in every process (``load_plugins()``), then applies the registered
hooks. Each hook is an AROUND hook, so SGLang's original stays at hand for fallback, and has its
own environment switch (``0`` turns it off; default on).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

logger = logging.getLogger("dsv4spec.integrations.sglang")

SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)
OFF_VALUES = ("0", "false", "off", "no")


def _rollback_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.rollback import make_rollback_hook

    return make_rollback_hook(module)


def _draft_hc_head_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.hc_head import draft_hc_head

    return draft_hc_head


def _target_hc_head_hook(module: ModuleType) -> Callable:
    from dsv4spec.integrations.sglang.hc_head import target_hc_head

    return target_hc_head


@dataclass(frozen=True)
class Hook:
    """One AROUND hook: its switch, the SGLang method it wraps, and that method's parameters."""

    name: str
    switch: str
    module: str
    attr: str
    params: tuple[str, ...]
    make: Callable[[ModuleType], Callable]

    @property
    def target(self) -> str:
        return f"{self.module}.{self.attr}"


_HC_HEAD_PARAMS = ("self", "x", "hc_fn", "hc_scale", "hc_base")
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
)

_announced = False


def switch_on(switch: str) -> bool:
    """Whether the environment switch ``switch`` leaves its hook on (unset: on)."""
    return os.environ.get(switch, "1").strip().lower() not in OFF_VALUES


def installed_sglang_version() -> str | None:
    """``importlib.metadata.version("sglang")`` (no import of sglang), ``None`` if absent."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _resolve(hook: Hook) -> ModuleType:
    """The target's module, after checking the target exists with the expected parameters."""
    module = importlib.import_module(hook.module)
    fn = module
    for part in hook.attr.split("."):
        fn = getattr(fn, part)
    params = tuple(inspect.signature(fn).parameters)
    if params != hook.params:
        raise TypeError(f"parameters {params}, the hook expects {hook.params}")
    return module


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
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    version = installed_sglang_version()
    installed, off, skipped = [], [], []
    for hook in HOOKS:
        if not switch_on(hook.switch):
            off.append(f"{hook.name} ({hook.switch}=0)")
            continue
        try:
            fn = hook.make(_resolve(hook))
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


def _announce(version: str | None, installed: list[str], off: list[str],
              skipped: list[str]) -> None:
    global _announced
    if _announced:
        return
    _announced = True
    from dsv4spec import __version__

    if version not in SUPPORTED_SGLANG_VERSIONS:
        logger.warning("dsv4spec: SGLang %s is not a supported version (%s); hooks are "
                       "installed only where their targets match", version,
                       ", ".join(SUPPORTED_SGLANG_VERSIONS))
    logger.info("dsv4spec %s SGLang plugin on SGLang %s: installed %s; off: %s; skipped: %s",
                __version__, version, ", ".join(installed) or "nothing",
                ", ".join(off) or "none", ", ".join(skipped) or "none")
