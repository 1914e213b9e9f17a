"""The folder-level import graph of ``src/dsv4spec``, its layer check, and line counts.

    python scripts/import_graph.py            # the working tree
    python scripts/import_graph.py --at REV   # the tree of a git revision (git show REV:path)

Prints which unit imports which (a unit is a subpackage or a top-level module: ``kernels``,
``capture``), then the lines of Python per unit, then every upward or sibling import and every
import cycle between modules; exits 1 if there is any. Layers import only downward::

    capture, timing, plot, usage -> kernels -> ops -> cache -> model -> engine -> integrations
    -> demo, bench -> doctor -> cli -> __main__

Units of one layer do not import each other. The benchmarks are a leaf: they measure everything
below them, the SGLang plugin included. Within a unit, modules import each other without a
cycle. Every ``import`` counts, at module level or inside a function, and so does
``importlib.import_module("literal")``. ``LAYERS`` below is the one table;
``tests/test_layering.py`` runs this check.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = "src/dsv4spec"  # relative to ROOT, as git names it

LAYERS: list[set[str]] = [
    {"capture", "timing", "plot", "usage"},  # helpers: only torch / triton / matplotlib
    {"kernels"},       # Triton device code and launchers
    {"ops"},           # public ops: checks, dispatch, references, torch.library registration
    {"cache"},         # request state: the C128 pool, the model's state
    {"model"},         # the DSV4-style reference model
    {"engine"},        # the MTP engine, generate, train-tiny
    {"integrations"},  # engine plugins: adapters over ops/ (and capture) for a serving engine
    {"demo", "bench"},  # leaves: the demo and the benchmarks
    {"doctor"},        # the report of what the plugins would do: reuses bench stack's checks
    {"cli"},
    {"__main__"},      # `python -m dsv4spec`: the command
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}

# (importing unit, imported module or a prefix of it) pairs allowed to break the rule, each with
# its reason. None today.
EXCEPTIONS: set[tuple[str, str]] = set()


def unit_of(module: str) -> str | None:
    """``dsv4spec.bench.e2e`` -> ``bench``; None for the package root and other packages."""
    parts = module.split(".")
    return parts[1] if parts[0] == "dsv4spec" and len(parts) > 1 else None


def module_name(rel: str) -> str:
    """``dsv4spec/bench/e2e.py`` -> ``dsv4spec.bench.e2e``; a package's ``__init__.py`` names
    the package."""
    parts = rel[:-len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, package: str = "dsv4spec",
                     filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) for each import statement and ``importlib.import_module("literal")`` in
    ``source``, a module of ``package`` (relative imports resolve against it)."""
    tree = ast.parse(source, filename=filename)
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


def private_names(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, ``module.name``) for each ``_private`` name imported from a dsv4spec module by
    ``from dsv4spec... import _name`` (dunders excepted)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dsv4spec":
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


# Reading a tree: {path relative to src/ ("dsv4spec/ops/hc_head.py"): source}


def working_tree(package: Path = ROOT / SRC) -> dict[str, str]:
    return {path.relative_to(package.parent).as_posix(): path.read_text()
            for path in sorted(package.rglob("*.py"))}


def tree_at(rev: str, root: Path = ROOT) -> dict[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                              text=True).stdout

    names = git("ls-tree", "-r", "--name-only", rev, "--", SRC).split("\n")
    prefix = SRC.rsplit("/", 1)[0] + "/"
    return {name[len(prefix):]: git("show", f"{rev}:{name}")
            for name in sorted(names) if name.endswith(".py")}


# The checks and the reports


def units(tree: Mapping[str, str]) -> set[str]:
    return {unit_of(module_name(rel)) for rel in tree} - {None}


def edges(tree: Mapping[str, str]) -> dict[str, set[str]]:
    """unit -> the other units it imports."""
    known = units(tree)
    graph: dict[str, set[str]] = {unit: set() for unit in known}
    for rel, source in tree.items():
        unit = unit_of(module_name(rel))
        if unit is None:
            continue
        for _, target in imported_modules(source, _package(rel), rel):
            target_unit = _target_unit(target, known)
            if target_unit is not None and target_unit != unit:
                graph[unit].add(target_unit)
    return graph


def upward_imports(tree: Mapping[str, str]) -> list[str]:
    """One line per import of a unit of the same or a higher layer, and per unit without a
    layer."""
    bad = [f"{SRC}: unit {unit!r} has no layer in LAYERS (scripts/import_graph.py)"
           for unit in sorted(units(tree) - set(LAYER))]
    known = units(tree)
    for rel, source in sorted(tree.items()):
        unit = unit_of(module_name(rel))
        if unit not in LAYER:
            continue
        for line, target in imported_modules(source, _package(rel), rel):
            target_unit = _target_unit(target, known)
            if target_unit is None or target_unit == unit or _excepted(unit, target):
                continue
            if LAYER.get(target_unit, -1) >= LAYER[unit]:
                bad.append(f"src/{rel}:{line}: {unit} (layer {LAYER[unit]}) imports {target} "
                           f"(layer {LAYER.get(target_unit)})")
    return bad


def module_edges(tree: Mapping[str, str]) -> dict[str, set[str]]:
    """module -> the other modules of ``tree`` it imports (``from pkg import name`` counts as
    ``pkg.name`` where that is a module, else as ``pkg``)."""
    modules = {module_name(rel) for rel in tree}
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for rel, source in tree.items():
        module = module_name(rel)
        for _, target in imported_modules(source, _package(rel), rel):
            parts = target.split(".")
            found = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                          if ".".join(parts[:i]) in modules), None)
            if found is not None and found != module:
                graph[module].add(found)
    return graph


def import_cycles(tree: Mapping[str, str]) -> list[list[str]]:
    """The modules of each import cycle (a strongly connected group of two or more modules),
    sorted; [] where the imports form no cycle."""
    graph = module_edges(tree)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for start in sorted(graph):
        if start in order:
            continue
        # Tarjan's strongly connected components, iteratively (no recursion limit)
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return sorted(cycles)


def line_counts(tree: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """unit -> (files, lines): a subpackage's ``.py`` files at any depth, or one top-level
    module; ``__init__`` for the package's own ``__init__.py``."""
    counts: dict[str, tuple[int, int]] = {}
    for rel, source in tree.items():
        unit = unit_of(module_name(rel)) or "__init__"
        files, lines = counts.get(unit, (0, 0))
        counts[unit] = (files + 1, lines + len(source.splitlines()))
    return counts


def _target_unit(target: str, known: set[str]) -> str | None:
    """The unit ``target`` lies in; None outside dsv4spec and for names of the package root
    (``from dsv4spec import __version__``)."""
    unit = unit_of(target)
    return unit if unit in known else None


def _package(rel: str) -> str:
    module = module_name(rel)
    return module if rel.endswith("/__init__.py") else module.rsplit(".", 1)[0]


def _excepted(unit: str, target: str) -> bool:
    parts = target.split(".")
    return any((unit, ".".join(parts[:i])) in EXCEPTIONS for i in range(2, len(parts) + 1))


def _order(unit: str) -> tuple[int, str]:
    return (LAYER.get(unit, len(LAYERS)), unit)


def _label(tree: Mapping[str, str], unit: str) -> str:
    return f"{unit}/" if any(rel.startswith(f"dsv4spec/{unit}/") for rel in tree) else f"{unit}.py"


def report(tree: Mapping[str, str], title: str) -> list[str]:
    lines = [f"import graph of {title} (unit: layer, then the units it imports)"]
    for unit, imported in sorted(edges(tree).items(), key=lambda kv: _order(kv[0])):
        names = ", ".join(sorted(imported, key=_order)) or "-"
        lines.append(f"  {_label(tree, unit):<16} {LAYER.get(unit, '?')!s:>2}  -> {names}")
    lines.append(f"\nlines of Python per unit ({title})")
    counts = line_counts(tree)
    for unit in sorted(counts, key=lambda u: (u != "__init__", _order(u))):
        files, n = counts[unit]
        label = "__init__.py" if unit == "__init__" else _label(tree, unit)
        lines.append(f"  {label:<16} {files:>3} files {n:>7,} lines")
    lines.append(f"  {'total':<16} {sum(f for f, _ in counts.values()):>3} files "
                 f"{sum(n for _, n in counts.values()):>7,} lines")
    return lines


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", metavar="REV",
                        help="read src/dsv4spec from this git revision instead of the working "
                             "tree")
    args = parser.parse_args(argv)
    tree = tree_at(args.at) if args.at else working_tree()
    print("\n".join(report(tree, f"{SRC} at {args.at}" if args.at else SRC)))
    bad = upward_imports(tree)
    print(f"\nupward or sibling imports: {len(bad)}")
    print("\n".join(f"  {line}" for line in bad))
    cycles = import_cycles(tree)
    print(f"\nimport cycles: {len(cycles)}")
    print("\n".join(f"  {' <-> '.join(cycle)}" for cycle in cycles))
    return 1 if bad or cycles else 0


if __name__ == "__main__":
    sys.exit(main())
