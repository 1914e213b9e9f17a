"""Declared dependencies are the imported ones, and in the test environment (``make setup``:
SGLang installed without its dependencies, plus the few its plugin registration imports) the
SGLang plugin's entry point reaches SGLang's own hook registry."""

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dsv4spec

ROOT = Path(__file__).resolve().parents[1]
MODULE = {"safetensors": "safetensors", "torch": "torch", "triton": "triton", "numpy": "numpy",
          "matplotlib": "matplotlib", "tqdm": "tqdm"}  # distribution -> top-level module
# Declared though no module of the package imports them: what its dependencies import at run
# time without declaring it (tests/test_install.py runs the commands without anything else).
IMPORTED_BY_DEPENDENCIES = {"numpy": "Triton's interpreter and safetensors' save_file"}
# Imported inside a try, with a stand-in where absent, so never a dependency.
OPTIONAL_IMPORTS = {"msgspec": "SGLang's own; bench/metadata.py stands in for it"}
# Imported but never declared: torch's wheel requires the build made for it, which on ROCm, XPU
# and nightly torch is a distribution of another name holding the same module (pyproject.toml).
BROUGHT_BY_TORCH = {"triton": "pytorch-triton-rocm, pytorch-triton-xpu, pytorch-triton or triton"}


def imported_top_level() -> set[str]:
    found = set()
    for path in Path(dsv4spec.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


def test_runtime_and_bench_dependencies_are_all_imported():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["bench"]]
    names = [re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0] for d in declared]
    imported = imported_top_level()
    unused = [n for n in names
              if MODULE.get(n, n) not in imported and n not in IMPORTED_BY_DEPENDENCIES]
    assert not unused, f"declared but never imported: {unused}"
    # engines: their own environment; Triton: torch's
    ours = {"dsv4spec", "sglang", "vllm", *OPTIONAL_IMPORTS, *BROUGHT_BY_TORCH}
    third_party = imported - set(sys.stdlib_module_names) - ours
    undeclared = sorted(m for m in third_party if m not in {MODULE.get(n, n) for n in names})
    assert not undeclared, f"imported but not declared as a dependency or the bench extra: " \
        f"{undeclared}"
    assert set(IMPORTED_BY_DEPENDENCIES) <= set(names)
    assert not set(BROUGHT_BY_TORCH) & set(names), "torch brings its own Triton build"
    assert project["optional-dependencies"]["sglang"] == []  # the engine is never installed


def test_sglang_plugin_entry_point_reaches_the_hook_registry():
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("SGLang is not installed")
    code = ("from sglang.srt.plugins.hook_registry import HookRegistry\n"
            "from dsv4spec.integrations.sglang import register\n"
            "print('registered', register())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, (
        "SGLang's plugin registration path is not importable: `make setup` installs what "
        "sglang.srt.plugins imports through sglang/__init__ (orjson psutil pybase64 requests "
        "starlette msgspec pydantic pyzmq ipython aiohttp)\n" + res.stderr[-2000:])
    assert "registered" in res.stdout and "not importable" not in res.stderr, res.stderr
