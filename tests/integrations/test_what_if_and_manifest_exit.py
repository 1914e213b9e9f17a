"""A what-if for another Triton stack than the running one judges that stack's eager rows by the
release its file was measured under, not by the running Triton's direct launch; and the manifest
generator, run as a script on a source root without the engine's package, fails with exit code 2
and writes nothing."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import mhc as sglang_mhc
from dsv4spec.integrations.vllm import mhc as vllm_mhc
from dsv4spec.kernels.launch import direct_launch_supported

H200, SM90 = "NVIDIA H200", (9, 0)
# The packaged H200 files per stack, each measured with the direct launch (3.6.0, 3.8.0).
STACK_FILES = {"3.6": "NVIDIA_H200.json", "3.8": "NVIDIA_H200.triton3.8.json"}
MHC_HOOKS = ("mhc_pre", "mhc_post", "mhc_fused_post_pre")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def running_triton(monkeypatch, tmp_path):
    """``running_triton(version)``: this process runs Triton ``version``, whose stack is the
    running one, with an empty user tables directory (the packaged files decide)."""
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path / "user"))

    def run(version):
        monkeypatch.setattr(triton, "__version__", version)
        monkeypatch.setattr(tables, "running_stack",
                            lambda: tables.stack_of(triton.__version__))
        tables.clear_cache()

    yield run
    monkeypatch.undo()
    tables.clear_cache()


def eager_decisions() -> dict[tuple[str, str], bool]:
    """Whether each engine's plugin serves ours for each mHC hook at T = 1, H = 7168 eagerly (ours
    won there eagerly in both packaged H200 files)."""
    return {(engine, hook): plugin.prefers_dsv4spec(hook, 1, 7168, False, SM90)
            for engine, plugin in (("sglang", sglang_mhc), ("vllm", vllm_mhc))
            for hook in MHC_HOOKS}


def entries_read(stack: str) -> tuple[dict, dict]:
    """Every hook's entry as :func:`tables.hook_entry` answers it for the H200 (inside a what-if),
    and as the packaged file of ``stack`` holds it."""
    path = tables.PACKAGED_DIR / STACK_FILES[stack]
    file_stack, engines = tables.read_file_with_stack(path)
    assert file_stack == stack
    answered = {}
    for engine, hooks in engines.items():
        for hook in hooks:
            decided_by, entry = tables.hook_entry(engine, hook, SM90)
            assert decided_by == path, (engine, hook, decided_by)
            answered[engine, hook] = entry
    return answered, {(e, h): entry for e, hooks in engines.items() for h, entry in hooks.items()}


@pytest.mark.parametrize("version, other", [
    ("3.6.1", "3.8"), ("3.8.1", "3.6"), ("3.8.0+gitabc", "3.6"), ("3.6.0", "3.8"),
    ("3.8.0", "3.6")])
def test_a_what_if_for_another_stack_judges_eager_rows_by_that_stacks_release(
        running_triton, caplog, version, other):
    """``doctor --triton-stack`` for a stack other than the installed one answers for a process
    running that stack's measured release: its file's eager rows (measured with the direct launch)
    hold whether or not the running Triton has the direct launch. A what-if naming the running
    stack still judges them by the running Triton: dropped (one WARNING naming it) on a patch
    release or a local build."""
    running_triton(version)
    running = tables.stack_of(version)
    assert other != running
    with caplog.at_level(logging.WARNING, logger="dsv4spec.integrations"):
        with tables.assuming(H200, other):
            answered, in_file = entries_read(other)
            decided = eager_decisions()
        assert not caplog.records, [r.getMessage() for r in caplog.records]
        assert any(any(entry["eager"].values()) for entry in in_file.values())
        for key, entry in in_file.items():
            assert answered[key]["eager"] == entry["eager"], key
            assert answered[key]["graph"] == entry["graph"], key
        assert decided == dict.fromkeys(decided, True)

        holds = direct_launch_supported()
        with tables.assuming(H200, running):
            answered, in_file = entries_read(running)
            decided = eager_decisions()
    for key, entry in in_file.items():
        assert answered[key]["eager"] == (
            entry["eager"] if holds else dict.fromkeys(entry["eager"], ())), key
        assert answered[key]["graph"] == entry["graph"], key
    assert decided == dict.fromkeys(decided, holds)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if holds:
        assert warnings == []
    else:
        assert len(warnings) == 1 and f"Triton {version} is not a release" in warnings[0]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_write_manifest_on_a_root_without_the_package_exits_2_and_writes_nothing(engine,
                                                                                  tmp_path):
    """A script or CI step that regenerates the manifests reads the exit code: a failed write
    must not look like a success."""
    root, out = tmp_path / "checkout", tmp_path / "manifests"
    root.mkdir()
    (root / "README.md").write_text("a checkout without the package folder\n")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH"))
                                         if p)}
    done = subprocess.run(
        [sys.executable, "-m", "dsv4spec.integrations.write_manifest", engine, str(root),
         "0.0.1", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert f"{root} holds no {engine}/ folder" in done.stderr
    assert "manifest written" not in done.stdout
    assert not out.exists()
    assert [p.name for p in root.iterdir()] == ["README.md"]
