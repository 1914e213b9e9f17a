"""The served model's type as read from SGLang's model config: a string or nothing, never
another value passed on as a model type."""

import sys
import types

import pytest

from dsv4spec.integrations.sglang import served_model

from . import standins


@pytest.mark.parametrize("model_type", [None, 4, ["deepseek_v4"], b"deepseek_v4"])
def test_a_model_type_that_is_not_a_string_is_unreadable(serves, monkeypatch, model_type):
    serves()
    context = sys.modules[standins.RUNTIME_CONTEXT_MOD]
    monkeypatch.setattr(context, "process_model_config",
                        lambda: types.SimpleNamespace(hf_config=types.SimpleNamespace(
                            model_type=model_type)))
    assert served_model.served_model_type() is None


def test_a_string_model_type_is_read_as_is(serves):
    serves("glm5_next")
    assert served_model.served_model_type() == "glm5_next"
    serves()
    assert served_model.served_model_type() == served_model.DSV4_MODEL_TYPE
