"""Registration: what :func:`register` patches, when, how often, and what it never touches."""

import importlib
import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from dsv4spec.integrations.vllm import plugin, register

from . import standins
from .conftest import NAMES

LOGGER = "dsv4spec.integrations.vllm"


def targets(modules=plugin.MODEL_MODULES, hooks=None):
    """The ``module.name`` targets the plugin patches in this version's modules."""
    return sorted(f"{module}.{hook.attr}" for hook in plugin.HOOKS for module in modules
                  if module in plugin.BOUND_IN[hook.name] and (hooks is None or hook.name in hooks)
                  and hasattr(sys.modules[module], hook.attr))


def bound(vllm):
    """module -> name -> the function the module binds now."""
    return {m: {name: getattr(mod, name) for name in vars(mod) if name.endswith("_tilelang")}
            for m, mod in vllm.models.items()}


def test_register_patches_the_bound_names_of_imported_modules(vllm):
    before = bound(vllm)
    assert sorted(register()) == targets()
    after = bound(vllm)
    for module, names in after.items():
        for name, fn in names.items():
            hooked = any(name == hook.attr and module in plugin.BOUND_IN[hook.name]
                         for hook in plugin.HOOKS)
            assert plugin.is_hooked(fn) == hooked, f"{module}.{name}"
            if hooked:
                assert fn.__wrapped__ is before[module][name]
                assert fn.__name__ == name and fn.__module__ == plugin.KERNELS_MODULE
            else:
                assert fn is before[module][name]
    assert len({id(g) for g in plugin.installed().values()}) == len(plugin.HOOKS)
    # vLLM's kernels module keeps its own functions: other models call them
    for hook in plugin.HOOKS:
        assert not plugin.is_hooked(getattr(vllm.peer.module, hook.attr, None))


def test_register_twice_patches_nothing_twice(vllm):
    first = register()
    functions = bound(vllm)
    guards = plugin.installed()
    assert sorted(register()) == sorted(first)
    assert bound(vllm) == functions and plugin.installed() == guards
    for names in functions.values():
        for fn in names.values():
            assert not plugin.is_hooked(getattr(fn, "__wrapped__", None))


def test_one_guard_per_hook_shared_by_the_modules(vllm):
    register()
    guard = plugin.installed()["mhc_post"]
    for module in plugin.BOUND_IN["mhc_post"]:
        assert getattr(vllm.models[module], NAMES["mhc_post"])._dsv4spec_guard is guard


@pytest.mark.parametrize("switch,left", [
    ("DSV4SPEC_VLLM", ()),
    ("DSV4SPEC_VLLM_HC_HEAD", ("mhc_pre", "mhc_post", "mhc_fused_post_pre",
                               "mhc_fused_post_pre_reuse_residual")),
    ("DSV4SPEC_VLLM_MHC", ("hc_head",)),
])
@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_switches_leave_vllms_functions_untouched(vllm, monkeypatch, caplog, switch, left,
                                                  value):
    monkeypatch.setenv(switch, value)
    before = bound(vllm)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert sorted(register()) == targets(hooks=left)
    after = bound(vllm)
    for module, names in after.items():
        for name, fn in names.items():
            if not plugin.is_hooked(fn):
                assert fn is before[module][name]
    assert set(plugin.installed()) == set(left)
    assert f"({switch}={value})" in caplog.text  # as set, not as a canonical 0


def test_a_switch_value_that_is_not_one_is_shown_as_set_and_as_taken(vllm, monkeypatch, caplog):
    monkeypatch.setenv(plugin.MASTER_SWITCH, "maybe")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert register() == []
    (line,) = [r.getMessage() for r in caplog.records if "vLLM plugin" in r.getMessage()]
    assert "off: " + ", ".join(f"{hook.name} (DSV4SPEC_VLLM='maybe', not a switch value: taken "
                               f"as off)" for hook in plugin.HOOKS) + ";" in line, line


def test_the_announcement_says_when_vllm_is_not_installed(vllm, monkeypatch, caplog):
    for version, says in ((None, "vLLM plugin (vLLM is not installed): hooks "),
                          ("0.34.0", "vLLM plugin on vLLM 0.34.0: hooks ")):
        monkeypatch.setattr(plugin, "installed_vllm_version", lambda: version)
        monkeypatch.setattr(plugin, "_announced", False)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            register()
        (line,) = [r.getMessage() for r in caplog.records if "vLLM plugin" in r.getMessage()]
        assert says in line and "None" not in line, line


def is_summary(message: str) -> bool:
    return " vLLM plugin " in message and ": hooks " in message


def the_summary(caplog) -> str:
    (line,) = [r.getMessage() for r in caplog.records if is_summary(r.getMessage())]
    return line


def summary_fields(line: str) -> tuple[list[str], str]:
    """The summary's hooks (those that act) and its ``off`` field."""
    hooks, rest = line.split(": hooks ", 1)[1].split("; off: ", 1)
    return hooks.split(", "), rest.split("; patched now: ", 1)[0]


REUSE = "mhc_fused_post_pre_reuse_residual"


def test_the_summary_names_the_hooks_that_act(vllm, vllm_source, caplog):
    """Printed after the manifest verdicts: 0.33.0 has no reuse_residual boundary, so that hook
    is named as stepping aside, not among the hooks."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        patched = register()
    acting, off = summary_fields(the_summary(caplog))
    absent = {REUSE} if vllm_source == "0.33.0" else set()
    assert set(acting) == {hook.name for hook in plugin.HOOKS} - absent
    assert off == ", ".join(f"{name} (not in this vLLM)" for name in absent) or "none"
    hooked = {hook.name for hook in plugin.HOOKS for target in patched
              if target.endswith(f".{hook.attr}")}
    assert set(acting) == hooked


@pytest.mark.parametrize("allow", [False, True])
def test_the_summary_follows_a_verdict_that_steps_a_hook_aside(vllm, monkeypatch, caplog,
                                                               allow):
    from dsv4spec.integrations import manifest

    real = manifest.verdicts

    def mhc_post_differs(spec, root, manifests):
        verdicts = real(spec, root, manifests)
        verdicts["mhc_post"] = manifest.Verdict("mhc_post", [], reason="mhc_post (changed)")
        return verdicts

    monkeypatch.setattr(manifest, "verdicts", mhc_post_differs)
    if allow:
        monkeypatch.setenv(plugin.ALLOW_UNTESTED, "1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    messages = [r.getMessage() for r in caplog.records]
    line = the_summary(caplog)
    acting, off = summary_fields(line)
    verdict = next(i for i, m in enumerate(messages) if "matches no tested" in m)
    assert verdict < messages.index(line), "the summary comes after the verdicts"
    if allow:
        assert f"mhc_post (untested: {plugin.ALLOW_UNTESTED}=1)" in acting
        assert "mhc_post" not in off
    else:
        assert "mhc_post" not in acting and "hc_head" in acting
        assert "mhc_post (untested vLLM source)" in off.split(", ")


def unimport_model_modules(tmp_path) -> None:
    """vLLM's DeepSeek-V4 model modules not imported yet, importable from ``tmp_path`` (their
    imports only), as in a process that has not loaded the model."""
    package = "vllm.models.deepseek_v4.nvidia"
    for name in plugin.MODEL_MODULES:
        del sys.modules[name]
        source = "\n".join(ast_unparse(node) for node in
                           standins.model_imports(standins.MODEL_FILES[name]))
        (tmp_path / f"{name.rsplit('.', 1)[1]}.py").write_text(source + "\n")
    sys.modules[package].__path__ = [str(tmp_path)]


def test_the_summary_waits_for_deepseek_v4s_import(vllm, tmp_path, caplog):
    """Registered before vLLM imports DeepSeek-V4: one INFO line then, the summary once the
    first model module is imported and its hooks' verdicts are known."""
    unimport_model_modules(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        register()
        register()
        assert not [r for r in caplog.records if is_summary(r.getMessage())]
        assert caplog.text.count("decided when vLLM imports DeepSeek-V4") == 1
        for name in plugin.MODEL_MODULES:
            importlib.import_module(name)
        register()
    acting, _ = summary_fields(the_summary(caplog))
    assert set(acting) == {hook.name for hook in plugin.HOOKS
                           if not plugin.verdicts(vllm.model)[hook.name].absent}


def test_modules_imported_after_register_are_patched_on_import(vllm, tmp_path):
    """The plugin runs before vLLM imports DeepSeek-V4 (a worker's ``load_model``): the model
    modules are patched when they execute."""
    unimport_model_modules(tmp_path)
    assert register() == []
    assert plugin._watcher in sys.meta_path
    for name in plugin.MODEL_MODULES:
        module = importlib.import_module(name)
        for hook in plugin.HOOKS:
            if name in plugin.BOUND_IN[hook.name] and hasattr(vllm.peer.module, hook.attr):
                fn = getattr(module, hook.attr)
                assert plugin.is_hooked(fn)
                assert fn.__wrapped__ is getattr(vllm.peer.module, hook.attr)
    assert sorted(register()) == targets()
    assert plugin._watcher.find_spec("os", None) is None, "other imports are not touched"


def test_each_module_patched_on_import_is_logged(vllm, tmp_path, caplog):
    """One INFO line per DeepSeek-V4 module patched on import, naming the names replaced; one
    WARNING for a module imported that binds none of the names hooked there."""
    package = "vllm.models.deepseek_v4.nvidia"
    for name in plugin.MODEL_MODULES:
        del sys.modules[name]
        source = "\n".join(ast_unparse(node) for node in
                           standins.model_imports(standins.MODEL_FILES[name]))
        if name == plugin.DSPARK_MODULE:  # a vLLM that moved dspark's kernels elsewhere
            source = "HIDDEN = 7168"
        (tmp_path / f"{name.rsplit('.', 1)[1]}.py").write_text(source + "\n")
    sys.modules[package].__path__ = [str(tmp_path)]
    register()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for name in plugin.MODEL_MODULES:
            importlib.import_module(name)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in caplog.records if "binds none" in r.getMessage()]
    for name in (plugin.TARGET_MODULE, plugin.MTP_MODULE):
        (line,) = [m for m in infos if f"{name} patched on import" in m]
        assert sorted(line.split(": ", 2)[2].split(", ")) == [
            t.rsplit(".", 1)[1] for t in targets([name])]
    assert not [m for m in infos if plugin.DSPARK_MODULE in m]
    (warning,) = warnings
    assert plugin.DSPARK_MODULE in warning and "hc_head_fused_kernel_tilelang" in warning
    assert [r.levelno for r in caplog.records if "binds none" in r.getMessage()] == [
        logging.WARNING]


def ast_unparse(node):
    import ast

    return ast.unparse(node)


def test_a_changed_target_is_skipped_with_a_warning(vllm, caplog):
    model = vllm.model

    def mhc_post_tilelang(x, residual, post_layer_mix, comb_res_mix, extra=None):
        return None

    mhc_post_tilelang.__module__ = plugin.KERNELS_MODULE
    model.mhc_post_tilelang = mhc_post_tilelang
    model.hc_head_fused_kernel_tilelang = lambda *a: None  # not vLLM's function
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        patched = register()
    assert f"{plugin.TARGET_MODULE}.mhc_post_tilelang" not in patched
    assert f"{plugin.TARGET_MODULE}.hc_head_fused_kernel_tilelang" not in patched
    assert model.mhc_post_tilelang is mhc_post_tilelang
    assert f"{plugin.MTP_MODULE}.mhc_post_tilelang" in patched
    assert sum("hook skipped" in r.getMessage() for r in caplog.records) == 2


def test_a_function_with_vllms_parameters_defined_elsewhere_is_not_replaced(vllm, caplog):
    """Only vLLM's own function is wrapped: one with the same name and parameters from another
    module (another plugin's replacement, say) is left in place with a warning."""
    theirs = vllm.model.mhc_post_tilelang

    def mhc_post_tilelang(x, residual, post_layer_mix, comb_res_mix):
        return theirs(x, residual, post_layer_mix, comb_res_mix)

    mhc_post_tilelang.__module__ = "another_plugin.kernels"
    vllm.model.mhc_post_tilelang = mhc_post_tilelang
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        patched = register()
    assert f"{plugin.TARGET_MODULE}.mhc_post_tilelang" not in patched
    assert vllm.model.mhc_post_tilelang is mhc_post_tilelang
    assert f"{plugin.MTP_MODULE}.mhc_post_tilelang" in patched
    (message,) = [r.getMessage() for r in caplog.records if "hook skipped" in r.getMessage()]
    assert "defined in another_plugin.kernels" in message


def test_register_never_raises(vllm, monkeypatch, caplog):
    def broken():
        raise ImportError("no module named dsv4spec.kernels.mhc")

    monkeypatch.setattr(plugin, "_register", broken)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert register() == []
    assert "vLLM plugin not installed" in caplog.text
    for module, names in bound(vllm).items():
        assert not any(plugin.is_hooked(fn) for fn in names.values())


def test_import_and_register_import_nothing_of_vllm():
    code = textwrap.dedent("""
        import sys
        import dsv4spec, dsv4spec.integrations.vllm
        assert not [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]
        from dsv4spec.integrations.vllm import register
        assert register() == []
        assert not [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_register_imports_nothing_heavy():
    """vLLM loads general plugins in its API-server and CLI processes too, which run no model:
    there :func:`register` imports neither Triton nor dsv4spec's ops and kernels (they are
    imported at a hook's first call)."""
    code = textwrap.dedent("""
        import sys, torch
        before = set(sys.modules)
        from dsv4spec.integrations.vllm import register
        assert register() == []
        new = sorted(set(sys.modules) - before)
        heavy = [m for m in new if m == "triton" or m.startswith(("triton.", "dsv4spec.ops",
                 "dsv4spec.kernels.", "dsv4spec.integrations.vllm.mhc",
                 "dsv4spec.integrations.vllm.hc_head"))]
        assert not heavy, heavy
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_fast_path_that_cannot_be_imported_leaves_vllms_function(vllm, monkeypatch, caplog):
    register()

    def broken(name):
        raise ImportError("no module named triton")

    monkeypatch.setattr(plugin, "fast_path", broken)
    fn = vllm.model.mhc_post_tilelang
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    residual = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    post, comb = torch.zeros(2, 4, 1), torch.zeros(2, 4, 4)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = fn(x, residual, post, comb)
    assert torch.equal(got, vllm.peer.module.mhc_post_tilelang(x, residual, post, comb))
    assert not plugin.installed()["mhc_post"].enabled
    assert "no module named triton" in caplog.text
