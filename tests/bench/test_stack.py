"""bench stack's checks (what ``dsv4spec doctor`` runs on the GPU): every case but the rollback
(CUDA only) runs on the CPU in the interpreter and passes, and a wrong output fails it."""

import pytest

from dsv4spec.bench import metadata, stack

from ..kernels.attention_metadata_support import interpreter_loop_bounds


@pytest.fixture(autouse=True)
def _loop_bounds():
    with interpreter_loop_bounds():
        yield


def test_every_op_the_plugins_launch_has_a_case():
    assert set(stack.OP_CASES.values()) == set(stack.OPS)
    assert set(stack.WIDTHLESS) <= set(stack.OPS)


@pytest.mark.parametrize("case", [c for c in stack.OPS if c != "rollback"])
def test_each_case_passes_against_its_reference(case):
    H = None if case in stack.WIDTHLESS else 256
    _, err = stack.checked(case, 2, H, seed=1, device="cpu")
    assert 0.0 <= err <= max(stack.RTOL.values())
    assert (err == 0.0) == (case in stack.WIDTHLESS), "the metadata cases are bit for bit"


def wrong(fn):
    """``fn`` with the first element of its first tensor output changed."""
    def call(*args, **kwargs):
        out = fn(*args, **kwargs)
        first = next(t for t in out if t is not None) if isinstance(out, tuple) else out
        first.view(-1)[0] += 1
        return out
    return call


@pytest.mark.parametrize("case, module, name", [
    ("mhc_pre", "dsv4spec.ops", "mhc_pre"),
    ("page_table", None, "build_page_table_positions"),
    ("expand", "dsv4spec.ops.attention_metadata", "expand_same_length"),
])
def test_a_wrong_output_fails_the_case(case, module, name, monkeypatch):
    import importlib

    owner = metadata if module is None else importlib.import_module(module)
    monkeypatch.setattr(owner, name, wrong(getattr(owner, name)))
    H = None if case in stack.WIDTHLESS else 256
    with pytest.raises(AssertionError, match=case if case != "mhc_pre" else "mhc_pre H=256"):
        stack.checked(case, 2, H, seed=1, device="cpu")
