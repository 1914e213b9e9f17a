"""Layers import only downward, and scripts and benchmarks use public names only.

The layer table and the import parser live in ``scripts/import_graph.py`` (one table; that script
also prints the graph and line counts): ``capture, timing, plot, usage -> kernels -> ops -> cache
-> model -> engine -> integrations -> demo, bench -> doctor -> cli -> __main__``. Every
``import`` in ``src/dsv4spec`` (module level or inside a function) names a module of its own unit
or of a lower layer; units of one layer do not import each other; and no two modules import each
other, directly or through others.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts/import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

@pytest.fixture(scope="module")
def tree():
    return import_graph.working_tree()


def test_every_unit_has_a_layer(tree):
    assert import_graph.units(tree) <= set(import_graph.LAYER), sorted(
        import_graph.units(tree) - set(import_graph.LAYER))


def test_no_module_imports_a_higher_or_sibling_layer(tree):
    bad = import_graph.upward_imports(tree)
    assert not bad, "\n".join(bad)


def test_the_check_sees_imports_inside_functions():
    source = ("def f():\n    from dsv4spec.bench.common import pyplot\n"
              "    importlib.import_module('dsv4spec.engine.run')\n")
    assert [m for _, m in import_graph.imported_modules(source)] == [
        "dsv4spec.bench.common.pyplot", "dsv4spec.engine.run"]


def test_the_check_flags_upward_and_sibling_imports():
    tree = {"dsv4spec/ops/a.py": "from dsv4spec.cache import C128StatePool\n",
            "dsv4spec/cache/__init__.py": "from ..ops import a\n",
            "dsv4spec/demo.py": "def main():\n    import dsv4spec.bench.common\n",
            "dsv4spec/bench/common.py": "from dsv4spec import __version__\n"}
    bad = import_graph.upward_imports(tree)
    assert [line.split(":")[0] for line in bad] == ["src/dsv4spec/demo.py",
                                                    "src/dsv4spec/ops/a.py"], bad
    assert import_graph.edges(tree) == {"ops": {"cache"}, "cache": {"ops"}, "demo": {"bench"},
                                        "bench": set()}


def test_no_modules_import_each_other(tree):
    cycles = import_graph.import_cycles(tree)
    assert not cycles, "\n".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_sees_imports_inside_functions_and_of_names():
    tree = {"dsv4spec/bench/a.py": "def f():\n    from dsv4spec.bench.b import g\n",
            "dsv4spec/bench/b.py": "from dsv4spec.bench import c\n",
            "dsv4spec/bench/c.py": ("import importlib\n"
                                    "importlib.import_module('dsv4spec.bench.a')\n"),
            "dsv4spec/bench/d.py": "from dsv4spec.bench.a import f\n",
            "dsv4spec/ops/__init__.py": "from dsv4spec.ops.e import h\n",
            "dsv4spec/ops/e.py": "from dsv4spec.ops import C\n"}
    assert import_graph.module_edges(tree)["dsv4spec.bench.b"] == {"dsv4spec.bench.c"}
    assert import_graph.import_cycles(tree) == [
        ["dsv4spec.bench.a", "dsv4spec.bench.b", "dsv4spec.bench.c"],
        ["dsv4spec.ops", "dsv4spec.ops.e"]]
    del tree["dsv4spec/bench/c.py"], tree["dsv4spec/ops/e.py"]
    assert import_graph.import_cycles(tree) == []


def test_scripts_and_benchmarks_import_no_private_names():
    files = sorted(ROOT.glob("scripts/*.py")) + sorted(ROOT.glob("src/dsv4spec/bench/*.py"))
    found = {(path.relative_to(ROOT).as_posix(), name)
             for path in files for _, name in import_graph.private_names(path.read_text())}
    assert not found, sorted(found)


def test_the_script_prints_the_graph_and_line_counts():
    res = subprocess.run([sys.executable, str(ROOT / "scripts/import_graph.py")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kernels/" in res.stdout and "upward or sibling imports: 0" in res.stdout
    assert "import cycles: 0" in res.stdout
    assert "total" in res.stdout


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs the git checkout")
def test_line_counts_at_a_revision_read_git():
    tree = import_graph.tree_at("HEAD")
    counts = import_graph.line_counts(tree)
    assert counts["kernels"][0] > 0 and counts["__init__"] == (1, len(
        tree["dsv4spec/__init__.py"].splitlines()))
