import os
import sys
from types import SimpleNamespace

import pytest

from dsv4spec.integrations.vllm import hc_head as hc_head_hooks
from dsv4spec.integrations.vllm import mhc as mhc_hooks
from dsv4spec.integrations.vllm import plugin
from dsv4spec.integrations.vllm.source import (
    SOURCE_VERSIONS,
    SRC_ENV,
    unpacked_source,
    vllm_src,
    vllm_version,
)

from . import standins

SWITCHES = (plugin.MASTER_SWITCH, *dict.fromkeys(hook.switch for hook in plugin.HOOKS))
NAMES = {hook.name: hook.attr for hook in plugin.HOOKS}  # hook -> vLLM's function name


@pytest.fixture(autouse=True, params=SOURCE_VERSIONS)
def vllm_source(request, monkeypatch):
    """Every test of the vLLM plugin runs once per supported vLLM version, on that version's
    source (``.vllm-src/<version>/``, unpacked by ``make setup``); ``$DSV4SPEC_VLLM_SRC``, where
    set, serves the version it holds and the other versions skip."""
    version = request.param
    if request.node.get_closest_marker("vllm_versions") is not None and version not in \
            request.node.get_closest_marker("vllm_versions").args:
        pytest.skip(f"not run on vLLM {version}")
    if SRC_ENV in os.environ:
        if vllm_version() != version:
            pytest.skip(f"${SRC_ENV} holds vLLM {vllm_version()}, not {version}")
        return version
    root = unpacked_source(version)
    if root is None:
        pytest.skip(f"vLLM {version}'s source is not unpacked (`make setup`, or set {SRC_ENV})")
    monkeypatch.setenv(SRC_ENV, str(root))
    assert vllm_src() == root and vllm_version() == version
    return version


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm_versions(*versions): run only on these vLLM "
                                       "versions' sources")


def fresh_plugin(monkeypatch) -> None:
    """The plugin as in a new process: no hooks made, nothing watched, nothing remembered."""
    for switch in SWITCHES:
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.setattr(plugin, "_guards", {})
    monkeypatch.setattr(plugin, "_announced", False)
    monkeypatch.setattr(plugin, "_switched_off", [])
    monkeypatch.setattr(plugin, "_verdicts", None)
    monkeypatch.setattr(plugin, "_covered", set())
    monkeypatch.delenv(plugin.ALLOW_UNTESTED, raising=False)
    monkeypatch.setattr(plugin, "_watcher", plugin.ImportWatcher())
    monkeypatch.setattr(mhc_hooks, "_warned", set())
    monkeypatch.setattr(mhc_hooks, "_compiled", set())
    monkeypatch.setattr(mhc_hooks, "_deep_gemm", None)
    monkeypatch.setattr(hc_head_hooks, "_ready", {})
    monkeypatch.setattr(mhc_hooks, "_prepared", set())
    monkeypatch.setattr(plugin, "_settled", {})


def _vllm_modules(tilelang: bool, monkeypatch):
    fresh_plugin(monkeypatch)
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if standins.is_vllm(name)}
    meta_path = list(sys.meta_path)
    try:
        yield standins.install(tilelang)
    finally:
        sys.meta_path[:] = meta_path
        for name in [name for name in sys.modules if standins.is_vllm(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture
def vllm(vllm_source, monkeypatch):
    """vLLM's mHC functions over the stand-in kernels (vLLM's torch reference) and the three
    model modules, before the plugin registers (as in a process that imported DeepSeek-V4)."""
    yield from _vllm_modules(False, monkeypatch)


@pytest.fixture
def vllm_tilelang(vllm_source, monkeypatch):
    """As :func:`vllm`, with vLLM's own TileLang kernels (a CUDA GPU and TileLang needed)."""
    pytest.importorskip("tilelang")
    yield from _vllm_modules(True, monkeypatch)


__all__ = ["NAMES", "SWITCHES", "SimpleNamespace", "fresh_plugin"]
