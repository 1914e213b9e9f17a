"""SGLang versions as data: the packaged manifest is what SGLang 0.5.23's source gives, and a
hook registers only where the running SGLang's source matches a manifest."""

import copy
import json
import logging

import pytest

from dsv4spec.integrations import manifest
from dsv4spec.integrations.sglang import plugin
from dsv4spec.integrations.sglang.source import sglang_root

from .test_plugin import LOGGER, TARGETS, registered

MHC_POST = next(h for h in plugin.HOOKS if h.attr == "mhc_post")


def test_the_packaged_manifest_is_what_the_installed_sglangs_source_gives():
    version = plugin.installed_sglang_version()
    if sglang_root() is None or version not in plugin.SUPPORTED_SGLANG_VERSIONS:
        pytest.skip("SGLang 0.5.23 is not installed (`make setup`)")
    (packaged,) = [m for m in manifest.packaged_manifests("sglang") if m["version"] == version]
    regenerated = json.loads(json.dumps(manifest.generate(plugin.ENGINE_SPEC, sglang_root(),
                                                          version)))
    assert regenerated == packaged
    assert set(packaged["hooks"]) == {hook.name for hook in plugin.HOOKS}
    assert all(entry is not None for entry in packaged["hooks"].values())


def _tested(edit):
    tested = copy.deepcopy(manifest.packaged_manifests("sglang"))
    for m in tested:
        edit(m)
    return tested


def _change_mhc_post(m):
    entry = m["hooks"][MHC_POST.name]
    label = f"kernels/ops/layernorm/mhc.py:{MHC_POST.attr}"
    entry["parts"][label] = "0" * 16
    entry["fingerprint"] = manifest.combined(entry["parts"])


def test_a_hook_whose_source_changed_is_not_registered_with_one_warning(sgl, monkeypatch,
                                                                        caplog):
    monkeypatch.setattr(plugin, "manifests", lambda: _tested(_change_mhc_post))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        installed = sgl.install()
        sgl.install()
    assert installed == [t for t in TARGETS if t != MHC_POST.target]
    assert MHC_POST.target not in registered(sgl)
    (message,) = [r.getMessage() for r in caplog.records if "matches no tested" in r.getMessage()]
    assert f"{MHC_POST.name} hook steps aside" in message
    assert f"kernels/ops/layernorm/mhc.py:{MHC_POST.attr} (changed)" in message
    assert plugin.ALLOW_UNTESTED in message


def test_allow_untested_registers_it_anyway(sgl, monkeypatch, caplog):
    monkeypatch.setattr(plugin, "manifests", lambda: _tested(_change_mhc_post))
    monkeypatch.setenv(plugin.ALLOW_UNTESTED, "1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == list(TARGETS)
    assert "registered anyway" in caplog.text


def test_no_manifest_registers_nothing(sgl, monkeypatch, caplog):
    monkeypatch.setattr(plugin, "manifests", lambda: [])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == []
    assert registered(sgl) == {}
    assert len([r for r in caplog.records if "steps aside" in r.getMessage()]) == len(
        plugin.HOOKS)


def test_a_kernel_name_no_manifest_lists_warns_that_coverage_changed(sgl, monkeypatch, caplog):
    def drop(m):
        m["modules"]["sglang.srt.models.deepseek_v4"]["binds"].remove("mhc_fused_post_pre")

    monkeypatch.setattr(plugin, "manifests", lambda: _tested(drop))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == list(TARGETS)
    (message,) = [r.getMessage() for r in caplog.records if "coverage changed" in r.getMessage()]
    assert "sglang.srt.models.deepseek_v4 binds mhc_fused_post_pre" in message


def test_an_unreadable_source_registers_nothing_and_never_raises(sgl, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise SyntaxError("invalid syntax")

    monkeypatch.setattr(manifest, "hook_parts", broken)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sgl.install() == []
    assert "could not be read (SyntaxError" in caplog.text
