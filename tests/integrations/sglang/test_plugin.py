"""Registration: SGLang's own hook registry (loaded by path) with stand-in target modules."""

import importlib.metadata
import logging
import subprocess
import sys

import pytest

from dsv4spec.integrations.sglang import plugin, source

from . import standins
from .conftest import (
    COMPRESSED,
    COMPRESSION_METHOD,
    DRAFT,
    DRAFT_METADATA,
    DSPARK,
    EXPAND,
    FLASHMLA_METHOD,
    MHC_POST,
    MHC_POST_PRE,
    MHC_PRE,
    PAGE_TABLE,
    ROLLBACK,
    TARGET,
)

TARGETS = (ROLLBACK, DRAFT, TARGET, MHC_PRE, MHC_POST, MHC_POST_PRE, PAGE_TABLE, COMPRESSED,
           EXPAND, COMPRESSION_METHOD, FLASHMLA_METHOD, DRAFT_METADATA, DSPARK)
LOGGER = "dsv4spec.integrations.sglang"
OWNERS = {  # hook target -> (module, class or None for a module-level function, name)
    ROLLBACK: (standins.POOL_MOD, "DeepSeekV4TokenToKVPool", "clear_unaccepted_c128_draft_states"),
    DRAFT: (standins.NEXTN_MOD, "DeepseekV4ModelNextN", "hc_head"),
    TARGET: (standins.TARGET_MOD, "DeepseekV4Model", "hc_head"),
    MHC_PRE: (standins.MHC_MOD, None, "mhc_pre"),
    MHC_POST: (standins.MHC_MOD, None, "mhc_post"),
    MHC_POST_PRE: (standins.MHC_MOD, None, "mhc_fused_post_pre"),
    PAGE_TABLE: (standins.PAGE_METADATA_MOD, None, "build_page_table_positions_triton"),
    COMPRESSED: (standins.C128_METADATA_MOD, None, "_init_compressed_attn_metadata_triton"),
    EXPAND: (standins.BACKEND_MOD, "DeepseekV4AttnBackend", "expand_extend_with_same_length"),
    COMPRESSION_METHOD: (standins.BACKEND_MOD, "DSV4AttnMetadata", "init_compression_metadata"),
    FLASHMLA_METHOD: (standins.BACKEND_MOD, "DSV4AttnMetadata", "init_flashmla_related"),
    DRAFT_METADATA: (standins.BACKEND_MOD, "DeepseekV4MultiStepBackend",
                     "init_forward_metadata_in_graph"),
    DSPARK: (standins.DSPARK_MOD, "DeepseekV4ForCausalLMDSpark", "collapse_hc_head"),
}


def current(target):
    module, cls, name = OWNERS[target]
    owner = sys.modules[module] if cls is None else getattr(sys.modules[module], cls)
    return getattr(owner, name)


def registered(sgl):
    return {target: [hook_type for hook_type, _, _ in hooks]
            for target, hooks in sgl.registry._hooks.items() if hooks}


def test_register_installs_one_around_hook_per_target(sgl):
    assert len(TARGETS) == len(plugin.HOOKS) == 13
    installed = sgl.install()
    assert installed == list(TARGETS)
    assert registered(sgl) == {t: [sgl.hook_type.AROUND] for t in TARGETS}
    for target in TARGETS:
        hooked = current(target)
        assert hooked is not sgl.originals[target]
        assert hooked.__wrapped__ is sgl.originals[target]


@pytest.mark.parametrize("switch_off", list(dict.fromkeys(hook.switch for hook in plugin.HOOKS)))
def test_each_switch_turns_off_only_its_own_hooks(sgl, monkeypatch, switch_off):
    monkeypatch.setenv(switch_off, "0")
    off = [hook.target for hook in plugin.HOOKS if hook.switch == switch_off]
    installed = sgl.install()
    assert installed == [t for t in TARGETS if t not in off]
    assert set(registered(sgl)) == set(installed)
    for target in off:
        assert current(target) is sgl.originals[target]
    for target in installed:
        assert current(target).__wrapped__ is sgl.originals[target]


@pytest.mark.parametrize("value,shown", [
    ("0", "DSV4SPEC_SGLANG_MHC=0"), ("Off", "DSV4SPEC_SGLANG_MHC=Off"),
    ("maybe", "DSV4SPEC_SGLANG_MHC='maybe', not a switch value: taken as off"),
])
def test_the_announcement_shows_a_switch_as_it_is_set(sgl, monkeypatch, caplog, value, shown):
    monkeypatch.setenv("DSV4SPEC_SGLANG_MHC", value)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sgl.install()
    (line,) = [r.getMessage() for r in caplog.records if "SGLang plugin on" in r.getMessage()]
    off = line.split("; off: ", 1)[1].split("; skipped: ", 1)[0]
    assert off == ", ".join(f"{hook.name} ({shown})" for hook in plugin.HOOKS
                            if hook.switch == "DSV4SPEC_SGLANG_MHC"), line


def test_switch_values(monkeypatch):
    for value, on in (("1", True), ("0", False), ("off", False), ("FALSE", False), ("", True)):
        monkeypatch.setenv("DSV4SPEC_SGLANG_ROLLBACK", value)
        assert plugin.switch_on("DSV4SPEC_SGLANG_ROLLBACK") is on, value
    monkeypatch.delenv("DSV4SPEC_SGLANG_ROLLBACK")
    assert plugin.switch_on("DSV4SPEC_SGLANG_ROLLBACK")


def _drop_method(sgl):
    del sgl.nextn.DeepseekV4ModelNextN.hc_head
    return DRAFT


def _drop_module(sgl):
    del sys.modules[standins.TARGET_MOD]
    return TARGET


def _change_parameters(sgl):
    def clear_unaccepted_c128_draft_states(self, req_pool_indices, seq_lens, accept_lens,
                                           num_draft_tokens, extra):
        raise AssertionError("never called")

    cls = sgl.pool.DeepSeekV4TokenToKVPool
    cls.clear_unaccepted_c128_draft_states = clear_unaccepted_c128_draft_states
    return ROLLBACK


def _drop_online_c128(sgl):
    del sgl.pool.ONLINE_C128
    return ROLLBACK


def _drop_metadata_module(sgl):
    del sys.modules[standins.C128_METADATA_MOD]
    return COMPRESSED


def _change_metadata_parameters(sgl):
    def build_page_table_positions_triton(*, req_to_token, req_pool_indices_repeated,
                                          seq_lens_casual, max_seq_len, page_size):
        raise AssertionError("never called")

    sgl.page_metadata.build_page_table_positions_triton = build_page_table_positions_triton
    return PAGE_TABLE


@pytest.mark.parametrize("break_target", [
    pytest.param(_drop_method, id="class without the method"),
    pytest.param(_drop_module, id="module absent"),
    pytest.param(_change_parameters, id="method with other parameters"),
    pytest.param(_drop_online_c128, id="pool module without ONLINE_C128"),
    pytest.param(_drop_metadata_module, id="metadata module absent"),
    pytest.param(_change_metadata_parameters, id="metadata function with other parameters"),
])
def test_missing_target_is_skipped_with_a_log_line(sgl, caplog, break_target):
    broken = break_target(sgl)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        installed = sgl.install()
    assert installed == [t for t in TARGETS if t != broken]
    assert set(registered(sgl)) == set(installed)
    skips = [r for r in caplog.records if r.name == LOGGER and "hook skipped" in r.getMessage()]
    assert len(skips) == 1 and broken in skips[0].getMessage()
    assert skips[0].levelno == logging.WARNING


def test_register_twice_registers_nothing_twice_and_logs_once(sgl, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sgl.install() == list(TARGETS)
        assert sgl.install() == list(TARGETS)
    assert registered(sgl) == {t: [sgl.hook_type.AROUND] for t in TARGETS}
    summary = [m for m in (r.getMessage() for r in caplog.records) if "plugin on SGLang" in m]
    assert len(summary) == 1
    assert f"on SGLang {plugin.installed_sglang_version()}" in summary[0]
    assert all(t in summary[0] for t in TARGETS)


def test_untested_version_string_is_logged_and_a_matching_source_still_hooks(sgl, caplog,
                                                                              monkeypatch):
    monkeypatch.setattr(plugin, "installed_sglang_version", lambda: "0.6.0")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert sgl.install() == list(TARGETS)
    assert any("0.6.0 is not a tested version" in r.getMessage() for r in caplog.records)


def test_sglang_load_plugins_runs_the_entry_point(sgl, monkeypatch):
    # SGLang's own loader (srt/plugins/__init__.py, by path) discovers the installed entry point.
    class Env:
        def __init__(self, value):
            self.value = value

        def get(self):
            return self.value

    environ = standins.add_module("sglang.srt.environ", type(sys)("sglang.srt.environ"))
    environ.envs = type("envs", (), {"SGLANG_PLUGINS": Env("dsv4spec"),
                                     "SGLANG_PLATFORM": Env("")})
    loader = source.load_sglang_module("srt/plugins/__init__.py", name="sglang.srt.plugins")
    loader.load_plugins()
    assert registered(sgl) == {t: [sgl.hook_type.AROUND] for t in TARGETS}
    assert all(current(t).__wrapped__ is sgl.originals[t] for t in TARGETS)


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    ours = [ep for ep in eps if ep.name == "dsv4spec"]
    assert len(ours) == 1
    assert ours[0].value == "dsv4spec.integrations.sglang:register"
    assert ours[0].load() is plugin.register


def test_importing_dsv4spec_does_not_import_sglang():
    code = (
        "import sys\n"
        "import dsv4spec, dsv4spec.ops, dsv4spec.integrations.sglang\n"
        "from dsv4spec.integrations.sglang import hc_head, metadata, mhc, rollback, source\n"
        "root, version = source.sglang_root(), source.sglang_version()\n"
        "leaked = sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.'))\n"
        "assert not leaked, leaked\n"
        "print(root is not None, version)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if source.sglang_root() is not None:
        assert out.stdout.split() == ["True", importlib.metadata.version("sglang")]
