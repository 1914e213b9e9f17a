"""The hooks run dsv4spec's path only while SGLang serves DeepSeek-V4 (the HF config's
``model_type`` from SGLang's ``process_model_config()``); SGLang's source pinned to what the check
reads."""

import ast
import importlib.util
import logging
import sys
import types

import pytest
import torch

from dsv4spec.integrations.hooks import STEP_ASIDE
from dsv4spec.integrations.sglang import served_model

from . import standins
from .conftest import DRAFT, ROLLBACK, TARGET
from .test_guards import measured_table  # noqa: F401 - the fixture
from .test_hc_head import HC_EPS, NORM_EPS, make_inputs
from .test_rollback import batch, check, kv_pool

LOGGER = "dsv4spec.integrations.sglang"
RUNTIME_CONTEXT_FILE = "srt/runtime_context.py"
DSV41_CONFIG_FILE = "srt/configs/deepseek_v41.py"
DSV4_CONFIG_FILE = "srt/configs/deepseek_v4.py"
OTHER_MODELS = ["deepseek_v41", "glm5_next", "deepseek_v3"]


def spy():
    calls = []

    def fast(*args, **kwargs):
        calls.append(args)
        return "ours"

    return calls, served_model.only_for_dsv4(fast)


def remembered():
    """The verdicts the gate remembers, oldest first."""
    return [verdict for _, verdict in served_model._verdicts.values()]


def test_dsv4_runs_the_fast_path(serves):
    serves("deepseek_v4")
    calls, gated = spy()
    assert gated(1, 2) == "ours" and calls == [(1, 2)]
    assert remembered() == [True]


@pytest.mark.parametrize("model_type", OTHER_MODELS)
def test_other_models_step_aside_with_one_warning(serves, caplog, model_type):
    serves(model_type)
    calls, gated = spy()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert gated(1) is STEP_ASIDE and gated(2) is STEP_ASIDE
    assert calls == []
    assert remembered() == [False]
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and repr(model_type) in said[0]


def test_unpublished_configuration_steps_aside_and_asks_again(serves):
    serves(None)  # process_model_config() raises, as before SGLang publishes its arguments
    calls, gated = spy()
    assert gated() is STEP_ASIDE and calls == [] and remembered() == []
    standins.serve_model(sys.modules[standins.RUNTIME_CONTEXT_MOD])
    assert gated() == "ours" and len(calls) == 1


def test_published_but_unreadable_is_remembered_with_one_warning(serves, monkeypatch, caplog):
    """Once SGLang has published its arguments the model config is not rebuilt at every call:
    an unreadable one counts as another model, for good."""
    serves()
    context = sys.modules[standins.RUNTIME_CONTEXT_MOD]
    asked = []

    def broken():
        asked.append(1)
        raise OSError("config.json unreadable")

    monkeypatch.setattr(context, "process_model_config", broken)
    published = types.SimpleNamespace(_server_args=types.SimpleNamespace())
    monkeypatch.setattr(context, "_CONTEXT", published, raising=False)
    calls, gated = spy()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert gated() is STEP_ASIDE and gated() is STEP_ASIDE
    assert calls == [] and asked == [1] and remembered() == [False]
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1


def test_without_sglang_runtime_context_steps_aside(monkeypatch):
    monkeypatch.delitem(sys.modules, standins.RUNTIME_CONTEXT_MOD, raising=False)
    monkeypatch.setattr(served_model, "_verdicts", {})
    calls, gated = spy()
    assert gated() is STEP_ASIDE and calls == [] and remembered() == []


@pytest.mark.parametrize("model_type", [None, 4, ["deepseek_v4"], b"deepseek_v4"])
def test_unreadable_model_type_steps_aside(serves, monkeypatch, model_type):
    """A model type that is not a string is unreadable (never passed on as a model type)."""
    serves()
    context = sys.modules[standins.RUNTIME_CONTEXT_MOD]
    monkeypatch.setattr(context, "process_model_config",
                        lambda: types.SimpleNamespace(hf_config=types.SimpleNamespace(
                            model_type=model_type)))
    assert served_model.served_model_type() is None
    calls, gated = spy()
    assert gated() is STEP_ASIDE and calls == []


def test_a_string_model_type_is_read_as_is(serves):
    serves("glm5_next")
    assert served_model.served_model_type() == "glm5_next"
    serves()
    assert served_model.served_model_type() == served_model.DSV4_MODEL_TYPE


def test_under_torch_compile_nothing_is_read(dsv4_served, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(served_model, "serves_dsv4", lambda: pytest.fail("read while tracing"))
    calls, gated = spy()
    assert gated() is STEP_ASIDE and calls == []


def test_every_installed_hook_is_gated(sgl):
    sgl.install()
    hooks = [entry[1] for entries in sgl.registry._hooks.values() for entry in entries]
    assert len(hooks) == 13  # plugin.HOOKS, every one registered
    gate = served_model.only_for_dsv4(lambda: None).__code__
    for hook in hooks:
        assert hook.fast.__code__ is gate, f"{hook.name} is not gated on the served model"


def hooked_calls(sgl):
    """For installed hooks: a function that makes one rollback and one target and draft hc_head
    call each, calls the DSV4 tests give to ours (the target's table filled for the test width),
    and returns SGLang's call counts so far."""
    pool = kv_pool(sgl)
    target = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    draft = sgl.nextn.DeepseekV4ModelNextN(rms_norm_eps=NORM_EPS, hc_eps=HC_EPS)
    x, *weights = make_inputs(3, 40, torch.bfloat16)

    def calls():
        check(pool, *batch())
        target.hc_head(x, *weights)
        draft.hc_head(x, *weights)
        return [sgl.originals[t].calls for t in (ROLLBACK, TARGET, DRAFT)]

    return calls


def hc_head_and_rollback_calls(sgl):
    """SGLang's call counts after one rollback and one target and draft hc_head each."""
    sgl.install()
    return hooked_calls(sgl)()


@pytest.mark.parametrize("model_type", OTHER_MODELS + [None])
def test_other_models_keep_sglang_hc_head_and_rollback(sgl, serves, measured_table,  # noqa: F811
                                                       model_type):
    serves(model_type)
    assert hc_head_and_rollback_calls(sgl) == [1, 1, 1]


def test_dsv4_gives_the_same_calls_to_ours(sgl, measured_table):  # noqa: F811
    assert hc_head_and_rollback_calls(sgl) == [0, 0, 0]


# --- one process, several engines: SGLang's own runtime context -------------------------------


@pytest.fixture
def sglang_context(sgl, monkeypatch):
    """SGLang's own runtime context (:func:`standins.runtime_context_module`) in place of the
    stand-in one, nothing published yet; the gate's remembered verdicts emptied."""
    # SGLang's runtime_context.py imports msgspec.structs: the real package (the SGLang pins
    # environment has none, and dsv4spec.bench.metadata may have stood a plain module in for it)
    try:
        found = importlib.util.find_spec("msgspec.structs") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        pytest.skip("SGLang's runtime_context.py needs msgspec, which is not installed")
    context = standins.runtime_context_module()
    monkeypatch.setattr(served_model, "_verdicts", {})
    return context


def publish(context, model_type):
    """Publish arguments for a server of ``model_type`` into SGLang's process context, as
    ``publish`` does after resolving them (last publish wins); returns them."""
    server_args = standins.ServerArgs(model_type)
    context.get_context().set_server_args(server_args)
    assert context.get_server_args() is server_args
    return server_args


def step_aside_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and "every dsv4spec hook steps aside" in r.getMessage()]


def test_the_hooks_follow_each_engine_sglang_publishes(sgl, sglang_context, measured_table,  # noqa: F811
                                                       caplog):
    """A DeepSeek-V4 engine, then a GLM-5-next engine rebuilt in the same process, then a
    DeepSeek-V4 one again: the hooks run ours, step aside (SGLang's own code runs, one warning
    for the GLM-5-next engine however many calls), then run ours again."""
    sgl.install()
    calls = hooked_calls(sgl)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert calls() == [1, 1, 1]  # nothing published: not known to be DeepSeek-V4
        publish(sglang_context, "deepseek_v4")
        assert calls() == [1, 1, 1]
        publish(sglang_context, "glm5_next")
        assert calls() == [2, 2, 2] and calls() == [3, 3, 3]
        publish(sglang_context, "deepseek_v4")
        assert calls() == [3, 3, 3]
    said = step_aside_warnings(caplog)
    assert len(said) == 1 and "'glm5_next'" in said[0]


def test_the_gate_follows_the_active_context(sglang_context, caplog):
    """``use_context`` activates a model-owned context (``create_context``'s) and gives the
    process one back: the gate answers for whichever is active, warns once for the GLM-5-next
    context however often it is switched to, and steps aside once the context is reset."""
    publish(sglang_context, "deepseek_v4")
    glm = sglang_context.RuntimeContext(parallel=sglang_context.ParallelContext())
    glm.set_server_args(standins.ServerArgs("glm5_next"))
    calls, gated = spy()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for step in range(2):
            assert gated(step) == "ours"
            with sglang_context.use_context(glm):
                assert gated(-1) is STEP_ASIDE
        assert gated(2) == "ours"
        sglang_context.reset_context()
        assert gated(-1) is STEP_ASIDE
    assert calls == [(0,), (1,), (2,)]
    said = step_aside_warnings(caplog)
    assert len(said) == 1 and "'glm5_next'" in said[0]


def test_the_remembered_verdicts_are_bounded(sglang_context):
    """Engine after engine, the gate remembers the newest few verdicts, not every engine's."""
    calls, gated = spy()
    for _ in range(served_model.VERDICTS_LIMIT + 3):
        publish(sglang_context, "deepseek_v4")
        assert gated() == "ours"
    assert remembered() == [True] * served_model.VERDICTS_LIMIT
    assert len(calls) == served_model.VERDICTS_LIMIT + 3


# --- SGLang's source: what the check reads -------------------------------------------------------


def test_sglang_process_model_config_is_the_published_model_config():
    tree, _ = standins.parse(RUNTIME_CONTEXT_FILE)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "process_model_config")
    assert not fn.args.args
    assert "model_config_of(get_server_args())" in ast.unparse(fn)


def test_sglang_server_args_raise_until_published():
    tree, _ = standins.parse(RUNTIME_CONTEXT_FILE)
    context = next(n for n in tree.body if isinstance(n, ast.ClassDef)
                   and n.name == "RuntimeContext")
    prop = next(n for n in context.body if isinstance(n, ast.FunctionDef)
                and n.name == "server_args")
    assert "raise ValueError" in ast.unparse(prop) and "is None" in ast.unparse(prop)
    getter = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
                  and n.name == "get_server_args")
    assert ast.unparse(getter).strip().endswith("return _CONTEXT.server_args")


def test_sglang_model_types_of_dsv4_and_dsv41():
    _, dsv4 = standins.parse(DSV4_CONFIG_FILE)
    assert 'model_type: str = "deepseek_v4"' in dsv4
    _, dsv41 = standins.parse(DSV41_CONFIG_FILE)
    # DSV4.1 keeps its own model_type while its architecture becomes DSV4's
    assert 'values["model_type"] = "deepseek_v41"' in dsv41
    assert 'values["architectures"] = ["DeepseekV4ForCausalLM"]' in dsv41
