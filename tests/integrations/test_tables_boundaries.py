"""The measured-faster tables at their bounds: ranges that touch, a key of 0, a range starting at
the cap, the files remembered per Triton stack, the interpreter's silence where no table of its
stack exists, and a GPU of no architecture (ROCm) in the stack rule."""

import json
import logging

import pytest

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import mhc

from .test_tables import H200, SM90, fresh, one_hook_file, plugin_decides, write_user  # noqa: F401


@pytest.mark.parametrize("graph", [
    pytest.param({"4096": [[1, 8], [8, 16]]}, id="ranges sharing a count"),
    pytest.param({"0": [[1, 8]]}, id="key 0"),
])
def test_ranges_must_be_disjoint_and_keys_positive(graph):
    entry = one_hook_file("mhc_post", graph=graph)["engines"]["sglang"]["mhc_post"]
    with pytest.raises(ValueError, match="graph"):
        tables.validate_hook(entry, "mhc_post")
    # one count apart is the same ranges written in two parts, and valid
    split = one_hook_file("mhc_post", graph={"4096": [[1, 8], [9, 16]]})
    assert tables.validate_hook(split["engines"]["sglang"]["mhc_post"], "mhc_post")[
        "graph"][4096] == ((1, 8), (9, 16))


def test_a_range_starting_at_the_cap_serves_the_cap(fresh):  # noqa: F811
    write_user(H200, one_hook_file("mhc_post", max_count=20, graph={"4096": [[1, 8], [20, 64]]}))
    fresh(H200)
    assert mhc.SGLANG_MHC_POST_FASTER[SM90]["graph"][4096] == ((1, 8), (20, 20))
    assert [c for c in range(1, 70) if plugin_decides("mhc_post", 4096, c, True, SM90)] == [
        *range(1, 9), 20]


def test_the_files_read_are_remembered_per_stack(fresh, monkeypatch):  # noqa: F811
    """A process that asks under two stacks (as the suite does) gets each stack's file,
    whichever it asked first."""
    fresh(H200)
    for stack, name in (("3.8", "NVIDIA_H200.triton3.8.json"), ("3.6", "NVIDIA_H200.json"),
                        ("3.8", "NVIDIA_H200.triton3.8.json")):
        monkeypatch.setattr(tables, "running_stack", lambda stack=stack: stack)
        path, entry = tables.hook_entry("sglang", "mhc_fused_post_pre", SM90, H200)
        assert path == tables.PACKAGED_DIR / name, stack
        # the 3.8 run gave the boundary at 9-16 tokens (H = 7168) to SGLang in a graph
        assert tables.served(entry, 7168, 16, True) == (stack == "3.6"), stack


def test_no_table_of_the_stack_is_silent_in_the_interpreter(fresh, monkeypatch, caplog):  # noqa: F811
    """Without a GPU (the interpreter: tests, CPU runs) no table of the running stack means the
    engine's code, without the WARNING that tells a GPU's operator to run ``dsv4spec tune``."""
    monkeypatch.setattr(tables, "running_stack", lambda: "3.9")
    fresh(None)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert not plugin_decides("mhc_post", 7168, 1, True, SM90)
        assert not tables.stack_validated(SM90)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_no_architecture_is_never_validated(fresh):  # noqa: F811
    """A GPU without a compute capability (ROCm: ``gpu_architecture`` None) has no table."""
    fresh(None)
    assert tables.stack_validated(SM90)
    assert tables.stack_validated(None) is False
    assert tables.stack_validated(None, H200) is False


def test_touching_ranges_in_a_user_file_void_the_chain(fresh, caplog):  # noqa: F811
    path = write_user(H200, json.dumps(one_hook_file("mhc_post",
                                                     graph={"4096": [[1, 8], [8, 16]]})))
    fresh(H200)
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        assert not plugin_decides("mhc_pre", 4096, 1, True, SM90)
    assert any(str(path) in r.getMessage() for r in caplog.records)
