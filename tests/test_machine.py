"""What the ``dsv4spec`` command takes from the machine: torch's CPU threads (no more than the
CPUs the process may use) and Triton (absent under a CPU-only torch: ``--help`` works, every
command says in one line which release to install). Each runs in a fresh interpreter, where torch
picks its own thread count and Triton can be hidden."""

import json
import os
import subprocess
import sys

import pytest

from dsv4spec.cli import BENCHMARKS, COMMANDS
from dsv4spec.usage import TRITON_FOR_TORCH, triton_hint


def python(code: str, *args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300, env={**base, **(env or {})}, cwd=cwd)


def affinity(n: int) -> str:
    return f"import os, sys\nos.sched_getaffinity = lambda pid: set(range({n}))\n"


def torch_default_threads(env: dict | None = None) -> int:
    return int(python("import torch; print(torch.get_num_threads())", env=env).stdout)


@pytest.mark.parametrize("cpus", [1, 64])
def test_torch_threads_are_capped_at_the_cpus_the_process_may_use(cpus):
    # called before torch is imported (as the command does): applied once torch loads, also
    # after a lookup that does not import it
    code = affinity(cpus) + ("import importlib.util\n"
                             "from dsv4spec.usage import use_cpu_threads\n"
                             "use_cpu_threads()\n"
                             "assert importlib.util.find_spec('torch') is not None\n"
                             "assert 'torch' not in sys.modules\n"
                             "import torch\n"
                             "print(torch.get_num_threads())\n")
    res = python(code)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) == min(cpus, torch_default_threads())


def test_the_command_caps_torch_threads_and_an_explicit_omp_num_threads_wins():
    code = affinity(1) + ("from dsv4spec.cli import main\n"
                          "try:\n"
                          "    main(['demo', '--help'])\n"  # the demo's module imports torch
                          "except SystemExit:\n"
                          "    pass\n"
                          "import torch\n"
                          "print(torch.get_num_threads(), file=sys.stderr)\n")
    res = python(code)
    assert res.stderr.strip() == "1", res.stderr
    # torch takes OMP_NUM_THREADS up to the cores it counts: 2 on the 2-core CI machine
    explicit = {"OMP_NUM_THREADS": "2"}
    assert torch_default_threads(explicit) == min(2, os.cpu_count())
    res = python(code, env=explicit)
    assert res.stderr.strip() == str(torch_default_threads(explicit)), res.stderr


def test_torch_already_imported_is_capped_at_once(monkeypatch):
    import torch

    from dsv4spec.usage import use_cpu_threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    try:
        use_cpu_threads()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# Triton hidden as a CPU-only torch leaves it: `import triton` fails, find_spec finds nothing.
NO_TRITON = ("import sys\nsys.modules['triton'] = None\n"
             "from dsv4spec.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def test_help_works_without_triton_and_lists_every_command():
    for argv, names in ((["--help"], COMMANDS), (["bench", "--help"], BENCHMARKS)):
        res = python(NO_TRITON, *argv)
        assert res.returncode == 0 and not res.stderr, res.stderr
        for name in names:
            assert f"    {name} " in res.stdout or f"    {name}\n" in res.stdout, (name,
                                                                                 res.stdout)


@pytest.mark.parametrize("argv", [["demo"], ["train-tiny", "--out", "sub/tiny.safetensors"],
                                  ["tune", "--report"], ["bench", "hc-head"]], ids=" ".join)
def test_a_command_without_triton_says_which_release_to_install(argv, tmp_path):
    res = python(NO_TRITON, *argv, cwd=tmp_path)
    prog = "dsv4spec " + " ".join(a for a in argv if not a.startswith(("-", "sub")))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and not res.stdout, res.stderr
    assert res.stderr.startswith(f"{prog}: error: Triton is not installed"), res.stderr
    assert f"python -m pip install {triton_hint().split('pip install ', 1)[1]}" in res.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_doctor_without_triton_reports_what_is_missing_and_what_it_costs(tmp_path):
    res = python(NO_TRITON, "doctor", cwd=tmp_path)
    assert res.returncode == 1 and not res.stderr, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("dsv4spec ") and lines[-1] == "result    not validated (exit 1)"
    text = " ".join(res.stdout.split())
    assert "Triton not installed" in text
    assert ("Triton is not installed (a CPU-only torch brings none): dsv4spec's ops are Triton "
            "kernels, so none of its hooks can load") in text
    assert f"python -m pip install {triton_hint().split('pip install ', 1)[1]}" in text
    for name in ("SGLang", "vLLM"):  # each engine: installed (its version) or not
        assert any(line.startswith(name) for line in lines), (name, res.stdout)
    assert list(tmp_path.iterdir()) == []

    res = python(NO_TRITON, "doctor", "--json", cwd=tmp_path)
    assert res.returncode == 1 and not res.stderr, res.stderr
    report = json.loads(res.stdout)
    from dsv4spec.integrations import tables
    from tests.test_doctor import KEYS

    assert set(report) == KEYS
    assert report["triton"]["version"] is None and report["exit"] == 1
    stack = report["triton"]["stack"]
    assert f"triton=={stack}." in triton_hint()  # the release the hint installs
    # the packaged files that Triton would read, each measured under it
    packaged = report["tables"]["packaged_for_stack"]
    assert packaged and all(tables.file_stack(json.loads((tables.PACKAGED_DIR / name)
                                                         .read_text())) == stack
                            for name in packaged)


@pytest.mark.parametrize("torch_version, hint", [
    ("2.13.0+cpu", "pip install triton==3.6.0 (the release dsv4spec's tables and direct launch "
                   "cover with torch 2.13)"),
    ("2.11.0", "pip install triton==3.6.0"),
    ("2.14.1+cpu", "pip install triton==3.8.0 (the release dsv4spec's tables and direct launch "
                   "cover with torch 2.14)"),
    ("2.15.0", "pip install triton (dsv4spec has tables for Triton 3.6 and 3.8 only, which pair "
               "with torch 2.11-2.14, not with this torch 2.15.0)"),
])
def test_the_hint_names_the_triton_release_of_the_installed_torch(torch_version, hint,
                                                                  monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: torch_version)
    assert hint in triton_hint()


def test_every_release_the_hint_names_has_packaged_tables_and_a_direct_launch():
    from dsv4spec.integrations import tables
    from dsv4spec.kernels.launch import DIRECT_LAUNCH_LAYOUTS

    packaged = {tables.file_stack(json.loads(p.read_text()))
                for p in tables.PACKAGED_DIR.glob("*.json")}
    for torch_minor, release in TRITON_FOR_TORCH.items():
        assert release in DIRECT_LAUNCH_LAYOUTS, (torch_minor, release)
        assert tables.stack_of(release) in packaged, (torch_minor, release, packaged)
