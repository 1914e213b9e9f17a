"""Layers import only downward: every ``import`` in ``src/dsv4spec`` (module level or inside a
function) names a module of its own unit or of a lower layer.

``capture, timing, plot, usage -> kernels -> ops -> cache -> model -> engine -> integrations ->
demo, bench -> cli -> __main__``. A unit is a subpackage or top-level module (``dsv4spec.bench``,
``dsv4spec.capture``); units of one layer do not import each other. The benchmarks are a leaf: they
measure everything below them, the SGLang plugin included.
"""

import ast
from pathlib import Path

import dsv4spec

PACKAGE = Path(dsv4spec.__file__).parent

LAYERS = [
    {"capture", "timing", "plot", "usage"},  # helpers: only torch / triton / matplotlib
    {"kernels"},
    {"ops"},
    {"cache"},
    {"model"},
    {"engine"},
    {"integrations"},  # engine plugins: adapters over ops/ (and capture) for a serving engine
    {"demo", "bench"},  # leaves: the demo and the benchmarks
    {"cli"},
    {"__main__"},  # `python -m dsv4spec`: the command
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}

# (importing unit, imported module) pairs that break the rule, each with its reason. None today.
EXCEPTIONS: set[tuple[str, str]] = set()


def unit_of(module: str) -> str | None:
    """``dsv4spec.bench.e2e`` -> ``bench``; None for the package root and other packages."""
    parts = module.split(".")
    return parts[1] if parts[0] == "dsv4spec" and len(parts) > 1 else None


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_modules(path: Path, package: str = "dsv4spec") -> list[tuple[int, str]]:
    """(line, module) for each import statement and ``importlib.import_module("literal")`` in
    ``path``, a module of ``package`` (relative imports resolve against it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from dsv4spec.bench import common`` imports dsv4spec.bench.common
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def upward_imports() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        if source is None:
            continue
        assert source in LAYER, f"{path}: unit {source!r} has no layer in tests/test_layering.py"
        module = module_name(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for line, target in imported_modules(path, package):
            target_unit = unit_of(target)
            if target_unit is None or target_unit == source:
                continue
            if (source, target) in EXCEPTIONS or any(
                    (source, prefix) in EXCEPTIONS for prefix in _prefixes(target)):
                continue
            if LAYER.get(target_unit, -1) >= LAYER[source]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {source} (layer "
                           f"{LAYER[source]}) imports {target} (layer {LAYER.get(target_unit)})")
    return bad


def _prefixes(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def test_every_unit_has_a_layer():
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")} - {None}
    assert units <= set(LAYER), sorted(units - set(LAYER))


def test_no_module_imports_a_higher_or_sibling_layer():
    bad = upward_imports()
    assert not bad, "\n".join(bad)


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from dsv4spec.bench.common import pyplot\n"
                 "    importlib.import_module('dsv4spec.engine.run')\n")
    assert [m for _, m in imported_modules(f)] == ["dsv4spec.bench.common.pyplot",
                                                   "dsv4spec.engine.run"]
