"""What the vLLM plugin logs and where it goes: dsv4spec's records reach the root logger as every
library's do, show in vLLM's output while the root has no handler, never twice; the summary
WARNING names as acting only the hooks a table serves on this process's GPUs."""

import contextlib
import logging

import pytest

from dsv4spec import kernels
from dsv4spec.integrations.vllm import mhc as vllm_mhc
from dsv4spec.integrations.vllm import plugin, register

from .test_plugin import is_summary, summary_fields, the_summary

LOGGER = "dsv4spec.integrations.vllm"


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def vllm_logging(monkeypatch):
    """vLLM's logging as ``vllm.logger`` configures it by default (a handler on the ``vllm``
    logger, INFO, not propagated); the ``dsv4spec`` logger as it is, restored after the test.
    Yields vLLM's handler."""
    for name in (plugin.VLLM_LOGGER, plugin.DSV4SPEC_LOGGER):
        log = logging.getLogger(name)
        monkeypatch.setattr(log, "handlers", list(log.handlers))  # the original list kept
        for attr in ("level", "propagate"):
            monkeypatch.setattr(log, attr, getattr(log, attr))
    engine = logging.getLogger(plugin.VLLM_LOGGER)
    handler = Collect()
    engine.handlers = [handler]
    engine.setLevel(logging.INFO)
    engine.propagate = False
    return handler


@contextlib.contextmanager
def root_handlers(*handlers: logging.Handler):
    """The root logger with only ``handlers`` (none: bare, as vLLM leaves it), pytest's own put
    back after."""
    root = logging.getLogger()
    saved = list(root.handlers)
    root.handlers[:] = handlers
    try:
        yield
    finally:
        root.handlers[:] = saved


def test_dsv4spec_lines_reach_vllms_handlers_while_the_root_is_bare(vllm, vllm_logging):
    root = logging.getLogger()
    engine = logging.getLogger(plugin.VLLM_LOGGER)
    engine_state = (list(engine.handlers), engine.level, engine.propagate)
    with root_handlers():
        root_state = (list(root.handlers), root.level)
        register()
        logging.getLogger("dsv4spec.integrations.vllm").info("an INFO line of a hook")
        logging.getLogger("dsv4spec.ops").debug("below vLLM's level")
        messages = vllm_logging.messages()
        assert any(is_summary(m) for m in messages)
        assert "an INFO line of a hook" in messages and "below vLLM's level" not in messages
        assert (list(root.handlers), root.level) == root_state, "the root logger is untouched"
        assert (list(engine.handlers), engine.level, engine.propagate) == engine_state
        register()  # once per process: no second handler
        logging.getLogger("dsv4spec").warning("once")
        assert vllm_logging.messages().count("once") == 1
    assert logging.getLogger(plugin.DSV4SPEC_LOGGER).propagate


def test_dsv4spec_records_reach_an_application_handler_on_the_root(vllm, vllm_logging):
    """An application that configured the root logger (``logging.basicConfig``) receives
    dsv4spec's records there, once, and vLLM's handler does not print them a second time."""
    application = Collect()
    with root_handlers(application):
        register()
        logging.getLogger("dsv4spec.integrations.vllm").warning("a WARNING of a hook")
    assert application.messages().count("a WARNING of a hook") == 1
    assert any(is_summary(m) for m in application.messages())
    assert not vllm_logging.messages()


def test_no_line_twice_where_vllms_handler_is_on_the_root_too(vllm, vllm_logging):
    with root_handlers(vllm_logging):
        register()
        logging.getLogger("dsv4spec.integrations.vllm").warning("a WARNING of a hook")
    assert vllm_logging.messages().count("a WARNING of a hook") == 1
    assert len([m for m in vllm_logging.messages() if is_summary(m)]) == 1


def test_a_dsv4spec_logging_configuration_of_the_application_is_kept(vllm, vllm_logging):
    own = logging.NullHandler()
    logging.getLogger(plugin.DSV4SPEC_LOGGER).handlers = [own]
    with root_handlers():
        register()
    assert logging.getLogger(plugin.DSV4SPEC_LOGGER).handlers == [own]
    assert not vllm_logging.records


def test_the_summary_names_no_hook_acting_on_a_gpu_without_a_table(vllm, monkeypatch, caplog):
    """An sm_100 GPU (no table): every hook installs, but its first call puts vLLM's function
    back, so the summary lists none as acting and says why."""
    monkeypatch.setattr(vllm_mhc, "visible_architectures", lambda: [(10, 0)])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    acting, off = summary_fields(the_summary(caplog))
    assert acting == ["none"]
    made = [name for name in plugin.installed()
            if plugin.installs(plugin.verdicts(vllm.model).get(name))]
    assert made and all(f"{name} (no measured-faster table for this process's GPUs: sm_100)"
                        in off for name in made), off


def test_the_summary_names_the_hooks_a_table_serves_on_an_sm_90_gpu(vllm, monkeypatch, caplog):
    monkeypatch.setattr(vllm_mhc, "visible_architectures", lambda: [(9, 0), (10, 0)])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    acting, _ = summary_fields(the_summary(caplog))
    assert set(acting) == {name for name in plugin.installed()
                           if plugin.installs(plugin.verdicts(vllm.model).get(name))}


def test_the_summary_names_no_hook_acting_without_a_cuda_gpu(vllm, monkeypatch, caplog):
    """Without CUDA (and outside Triton's interpreter) every call keeps vLLM's function."""
    monkeypatch.setattr(vllm_mhc, "visible_architectures", lambda: None)
    monkeypatch.setattr(kernels, "interpreter_enabled", lambda: False)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        register()
    acting, off = summary_fields(the_summary(caplog))
    assert acting == ["none"] and "mhc_post (no CUDA GPU)" in off, off
