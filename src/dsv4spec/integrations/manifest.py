"""Engine versions as data: per tested engine version, a packaged manifest (``manifests/*.json``)
generated from that version's source, and the check a plugin makes at registration against the
running engine's source.

A manifest holds

- ``modules``: for each DSV4 model module of the engine, the names it binds from the kernels
  module(s) the hooks replace (``binds``) and the names it calls (``calls``: directly, or
  through a local name assigned only such names, as vLLM 0.34.0's ``fused_post_pre``);
- ``hooks``: for each hook, a fingerprint of the source its correctness rests on, with the hash
  of each part: the hooked function (or method), the module-level definitions it reaches by name
  in its own file and the helper files named for it (functions, classes, assignments, followed
  transitively), every function of the caller files that calls it (whose use of the results
  the hook relies on), and the definitions elsewhere named for it (``HookSource.relies_on``).
  A hook whose function the version does not define has ``null``.

Each part is hashed from its syntax tree with docstrings dropped (comments never reach the
tree), without line numbers, and with empty fields left out (so the hash does not depend on the
Python that parsed it): moving code or editing a comment keeps the fingerprint, a change of a
default or an expression changes it.

The running engine's source is read from the files (``ast``), never imported. Nothing here raises
into a caller that asks for a verdict: :func:`verdicts` turns any failure into "step aside" with
the reason. The packaged manifests are written by :mod:`dsv4spec.integrations.write_manifest`,
which holds both plugins' specs.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

MANIFEST_DIR = "manifests"


@dataclass(frozen=True)
class HookSource:
    """Where one hook's function is defined and what else its fingerprint covers.

    ``file``: the defining file, relative to the engine's package folder; ``qualname``: the
    function, or ``Class.method``; ``name``: the name callers call it by (default: the last part
    of ``qualname``); ``helper_files``: other files whose module-level definitions the closure
    may reach by name; ``caller_files``: files whose functions calling ``name`` are parts;
    ``relies_on``: definitions (``file:qualname``) neither reached by name nor calling it whose
    behaviour the hook's fast path reproduces or assumes, each a part by itself.
    """

    file: str
    qualname: str
    helper_files: tuple[str, ...] = ()
    caller_files: tuple[str, ...] = ()
    name: str | None = None
    relies_on: tuple[str, ...] = ()

    @property
    def called_as(self) -> str:
        return self.name or self.qualname.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class EngineSpec:
    """One engine: its package, the kernels modules whose names its DSV4 modules bind, those
    modules (dotted name -> file), and the hooks' sources."""

    engine: str
    package: str
    kernels_modules: tuple[str, ...]
    model_modules: dict[str, str]
    hooks: dict[str, HookSource] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Canonical hashing


def _strip_docstring(body: list) -> list:
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return body[1:]
    return body


def _canonical(node: Any) -> Any:
    """A JSON-able form of ``node``: type name and non-empty fields, docstrings dropped."""
    if isinstance(node, ast.AST):
        out: list = [type(node).__name__]
        for name in node._fields:
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                    ast.ClassDef, ast.Module)):
                value = _strip_docstring(value)
            if value is None or value == []:
                continue
            out.append([name, _canonical(value)])
        return out
    if isinstance(node, list):
        return [_canonical(v) for v in node]
    if isinstance(node, (str, int, float, bool, type(None))):
        return [type(node).__name__, repr(node)]
    return [type(node).__name__, repr(node)]  # bytes, complex, Ellipsis


def node_hash(node: ast.AST) -> str:
    text = json.dumps(_canonical(node), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def combined(parts: dict[str, str]) -> str:
    text = json.dumps(sorted(parts.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Reading the source


# Parsed files by (path, mtime, size), and the hashes of their nodes (the trees stay alive in
# this cache, so a node's id identifies it): a process parses and hashes each file once.
_parsed: dict[tuple, ast.Module] = {}
_hashes: dict[int, str] = {}


class SourceTree:
    """Parsed files of one engine source tree (``root`` holds the package folder), each parsed
    once per process (while unchanged on disk)."""

    def __init__(self, root: Path, package: str) -> None:
        self.root = Path(root)
        self.package = package
        self._trees: dict[str, ast.Module | None] = {}

    def path(self, relpath: str) -> Path:
        return self.root / self.package / relpath

    def tree(self, relpath: str) -> ast.Module | None:
        """The file's tree, or None where the file does not exist."""
        if relpath not in self._trees:
            path = self.path(relpath)
            if not path.is_file():
                self._trees[relpath] = None
            else:
                stat = path.stat()
                key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
                if key not in _parsed:
                    _parsed[key] = ast.parse(path.read_text(encoding="utf-8"), str(path))
                self._trees[relpath] = _parsed[key]
        return self._trees[relpath]


_memo: dict[tuple, Any] = {}


def _cached(kind: str, node: ast.AST, compute, *key: Any) -> Any:
    """``compute()`` once per ``kind``, node of a cached tree and ``key``."""
    index = (kind, id(node), *key)
    if index not in _memo:
        _memo[index] = compute()
    return _memo[index]


def cached_hash(node: ast.AST) -> str:
    """:func:`node_hash` of a node of a cached tree, computed once."""
    if id(node) not in _hashes:
        _hashes[id(node)] = node_hash(node)
    return _hashes[id(node)]


def top_level(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level name -> the definition binding it (def, class, or assignment)."""
    defs: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defs[name.id] = node
    return defs


def find_qualname(tree: ast.Module, qualname: str) -> ast.AST | None:
    node: Any = tree
    for part in qualname.split("."):
        node = next((n for n in getattr(node, "body", ())
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node


def import_sources(tree: ast.Module, relpath: str, package: str) -> dict[str, tuple[str, str]]:
    """Local name -> (file, name there) of each ``from M import f [as g]`` in ``tree`` (the file
    ``relpath`` of ``package``, anywhere in it) whose ``M`` is a module of ``package``: its file
    relative to the package folder, as ``relpath`` is."""
    folder = relpath.split("/")[:-1]
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module.split(".") if node.module else []
        if node.level:
            if node.level - 1 > len(folder):
                continue
            parts = [*folder[:len(folder) - (node.level - 1)], *module]
        elif module[:1] == [package]:
            parts = module[1:]
        else:
            continue
        if parts:
            found.update({a.asname or a.name: ("/".join(parts) + ".py", a.name)
                          for a in node.names})
    return found


def _names_in(node: ast.AST) -> set[str]:
    """Names ``node`` reads, and names its ``from ... import`` statements bring in."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.ImportFrom):
            names.update(a.name for a in child.names)
    return names


def _getattr_name(value: ast.AST) -> str | None:
    """``name`` where ``value`` is ``getattr(obj, "name")`` or ``getattr(obj, "name", default)``
    (SGLang's speculative worker reaches the C128 rollback so); None otherwise."""
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "getattr" and len(value.args) in (2, 3) and not value.keywords
            and isinstance(value.args[1], ast.Constant) and isinstance(value.args[1].value, str)):
        return value.args[1].value
    return None


def _held_names(value: ast.AST) -> set[str] | None:
    """The names an expression may evaluate to, if it is a name, a ``getattr`` of a literal
    attribute name, or a conditional between such expressions; None otherwise."""
    if isinstance(value, ast.Name):
        return {value.id}
    attribute = _getattr_name(value)
    if attribute is not None:
        return {attribute}
    if isinstance(value, ast.IfExp):
        body, orelse = _held_names(value.body), _held_names(value.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def imported_as(tree: ast.Module) -> dict[str, str]:
    """Local name -> the name it was imported as, for every ``from x import f as g`` in ``tree``
    (anywhere in the module)."""
    return {a.asname: a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for a in node.names if a.asname and a.asname != a.name}


def call_index(tree: ast.Module) -> dict[str, list[tuple[str, int]]]:
    """Called name -> (enclosing qualname, line) of each call in ``tree``: a plain name, an
    attribute (``self.hc_head(...)``, ``module.f(...)``), a name imported under another
    (``from x import f as g``: ``g(...)`` calls ``f``), ``getattr(obj, "f")(...)``, or a local
    name that a function assigns only such names or ``getattr``s (as vLLM 0.34.0's
    ``fused_post_pre``, SGLang's ``clear_unaccepted_c128 = getattr(pool, "clear_...", None)``),
    once per name it may hold."""
    index: dict[str, list[tuple[str, int]]] = {}
    renamed = imported_as(tree)

    def aliases(function: ast.AST) -> dict[str, set[str]]:
        local: dict[str, set[str]] = {}
        rejected: set[str] = set()
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                held = _held_names(node.value)
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        if held is None:
                            rejected.add(target.id)
                        else:
                            local.setdefault(target.id, set()).update(held)
        return {k: v for k, v in local.items() if k not in rejected}

    def visit(node: ast.AST, scope: list[str], local: dict[str, set[str]]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = {} if isinstance(child, ast.ClassDef) else aliases(child)
                visit(child, [*scope, child.name], inner)
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = (func.id if isinstance(func, ast.Name)
                          else func.attr if isinstance(func, ast.Attribute)
                          else _getattr_name(func))
                site = (".".join(scope), child.lineno)
                if called is not None:
                    index.setdefault(called, []).append(site)
                if isinstance(func, ast.Name):
                    held = {*local.get(func.id, ()), *((renamed[func.id],)
                                                       if func.id in renamed else ())}
                    for name in sorted(held - {called}):
                        index.setdefault(name, []).append(site)
            visit(child, scope, local)

    visit(tree, [], {})
    return index


def call_sites(tree: ast.Module, names: set[str]) -> list[tuple[str, str, int]]:
    """(called name, enclosing qualname, line) of every call of one of ``names`` in ``tree``
    (see :func:`call_index`)."""
    index = _cached("calls", tree, lambda: call_index(tree))
    return sorted((name, scope, line) for name in names for scope, line in index.get(name, ()))


def module_bindings(tree: ast.Module, kernels_modules: Iterable[str]) -> dict[str, list[str]]:
    """``binds``: the names ``tree`` imports from the kernels modules (anywhere in the module);
    ``calls``: those of them it calls (see :func:`call_sites`)."""
    kernels = set(kernels_modules)
    binds = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in kernels and node.level == 0:
            binds.update(a.asname or a.name for a in node.names)
    calls = {name for name, _, _ in call_sites(tree, binds) if name in binds}
    return {"binds": sorted(binds), "calls": sorted(calls)}


def hook_parts(source: SourceTree, hook: HookSource) -> dict[str, str] | None:
    """Part label -> hash of what ``hook``'s correctness rests on; None where the defining file
    has no such function (this version does not define it)."""
    tree = source.tree(hook.file)
    if tree is None:
        return None
    node = find_qualname(tree, hook.qualname)
    if node is None:
        return None
    parts = {f"{hook.file}:{hook.qualname}": cached_hash(node)}
    scopes = {hook.file: _cached("defs", tree, lambda: top_level(tree))}
    imports = {hook.file: _cached("imports", tree, lambda: import_sources(
        tree, hook.file, source.package), hook.file)}
    for relpath in hook.helper_files:
        helper = source.tree(relpath)
        if helper is not None:
            scopes[relpath] = _cached("defs", helper, lambda: top_level(helper))
            imports[relpath] = _cached("imports", helper, lambda: import_sources(
                helper, relpath, source.package), relpath)
    seen: set[int] = {id(node)}
    pending = [(hook.file, node)]
    while pending:
        here, current = pending.pop()
        for name in sorted(_cached("names", current, lambda: _names_in(current))):
            # a name resolves in the file that uses it first (vLLM's tilelang.py and
            # tilelang_kernels.py both define a mhc_post_tilelang), then where that file imports
            # it from (SGLang's backend imports init_compression_metadata as
            # _init_compression_metadata_triton), then in the others
            candidates = [(r, name) for r in (here, *(r for r in scopes if r != here))]
            imported = imports[here].get(name)
            if imported is not None and imported[0] in scopes:
                candidates.insert(1, imported)
            for relpath, defined_as in candidates:
                definition = scopes[relpath].get(defined_as)
                if definition is None:
                    continue
                if id(definition) not in seen:
                    seen.add(id(definition))
                    label = getattr(definition, "name", None) or defined_as
                    parts[f"{relpath}:{label}"] = cached_hash(definition)
                    pending.append((relpath, definition))
                break
    for relpath in hook.caller_files:
        caller = source.tree(relpath)
        if caller is None:
            continue
        for _, scope, _ in call_sites(caller, {hook.called_as}):
            function = find_qualname(caller, scope) if scope else None
            if function is not None and function is not node:
                parts[f"{relpath}:{scope}"] = cached_hash(function)
    for label in hook.relies_on:
        relpath, qualname = label.split(":", 1)
        other = source.tree(relpath)
        definition = find_qualname(other, qualname) if other is not None else None
        if definition is not None:  # one a version lacks is a part gone, or new where it comes
            parts[label] = cached_hash(definition)
    return parts


def generate(spec: EngineSpec, root: Path, version: str) -> dict:
    """The manifest of ``spec``'s engine at ``version`` from its source under ``root``."""
    source = SourceTree(root, spec.package)
    modules = {}
    for module, relpath in spec.model_modules.items():
        tree = source.tree(relpath)
        if tree is not None:
            modules[module] = module_bindings(tree, spec.kernels_modules)
    hooks = {}
    for name, hook in spec.hooks.items():
        parts = hook_parts(source, hook)
        hooks[name] = None if parts is None else {"fingerprint": combined(parts),
                                                  "parts": dict(sorted(parts.items()))}
    return {"engine": spec.engine, "version": version,
            "kernels_modules": list(spec.kernels_modules), "modules": modules, "hooks": hooks}


def manifest_name(engine: str, version: str) -> str:
    return f"{engine}-{version}.json"


def packaged_manifests(engine: str) -> list[dict]:
    """The manifests shipped with dsv4spec for ``engine``, oldest version first."""
    folder = resources.files("dsv4spec.integrations").joinpath(MANIFEST_DIR)
    found = []
    for entry in folder.iterdir():
        if entry.name.startswith(f"{engine}-") and entry.name.endswith(".json"):
            found.append(json.loads(entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: tuple(int(p) if p.isdigit() else 0
                                             for p in m["version"].split(".")))


# ---------------------------------------------------------------------------------------------
# The check at registration


@dataclass
class Verdict:
    """Whether a hook may install on the running engine: ``matches`` (the tested versions whose
    fingerprint equals the running source's), ``absent`` (the running engine does not define the
    hooked function), ``reason`` (why it steps aside, naming what differs)."""

    hook: str
    matches: list[str]
    absent: bool = False
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.matches)


def _differs(parts: dict[str, str], manifests: list[dict], hook: str) -> str:
    """The tested versions closest to ``parts`` (fewest differing parts; all of them on a tie)
    and the parts that differ from the newest of them."""
    diffs = {}
    for manifest in manifests:
        entry = manifest["hooks"].get(hook)
        if entry:
            tested = entry["parts"]
            diffs[manifest["version"]] = sorted(
                k for k in set(parts) | set(tested) if parts.get(k) != tested.get(k))
    if not diffs:
        return "no tested version defines it"
    fewest = min(len(d) for d in diffs.values())
    closest = [v for v, d in diffs.items() if len(d) == fewest]
    tested = manifests[[m["version"] for m in manifests].index(closest[-1])]["hooks"][hook]
    labels = []
    for label in diffs[closest[-1]]:
        state = ("changed" if label in parts and label in tested["parts"]
                 else "new" if label in parts else "gone")
        labels.append(f"{label} ({state})")
    return f"closest tested version {' / '.join(closest)}; differs in {', '.join(labels)}"


def verdicts(spec: EngineSpec, root: Path | None, manifests: list[dict]) -> dict[str, Verdict]:
    """Each hook's verdict for the source under ``root``; never raises: where the source cannot
    be found or read every hook steps aside with the reason."""
    names = list(spec.hooks)
    if root is None:
        return {h: Verdict(h, [], reason=f"{spec.engine}'s source files were not found")
                for h in names}
    try:
        source = SourceTree(root, spec.package)
        out = {}
        for hook_name, hook in spec.hooks.items():
            parts = hook_parts(source, hook)
            if parts is None:
                out[hook_name] = Verdict(hook_name, [], absent=True,
                                         reason=f"{hook.file} defines no {hook.qualname}")
                continue
            fingerprint = combined(parts)
            matches = [m["version"] for m in manifests
                       if (m["hooks"].get(hook_name) or {}).get("fingerprint") == fingerprint]
            out[hook_name] = Verdict(hook_name, matches, reason=None if matches else
                                     _differs(parts, manifests, hook_name))
        return out
    except Exception as e:  # noqa: BLE001 - an unreadable source must never stop the engine
        return {h: Verdict(h, [], reason=f"its source could not be read ({type(e).__name__}: "
                                        f"{e})") for h in names}


def uncovered(spec: EngineSpec, root: Path | None, manifests: list[dict],
              module: str) -> list[str]:
    """The names ``module`` binds from the kernels modules that no manifest lists for it (what
    would have said that 0.34.0's target binds a new boundary); [] where it cannot tell."""
    relpath = spec.model_modules.get(module)
    if root is None or relpath is None:
        return []
    try:
        tree = SourceTree(root, spec.package).tree(relpath)
        if tree is None:
            return []
        listed = set()
        for manifest in manifests:
            listed.update((manifest["modules"].get(module) or {}).get("binds", ()))
        return sorted(set(module_bindings(tree, spec.kernels_modules)["binds"]) - listed)
    except Exception:  # noqa: BLE001
        return []


def source_root(file: str | None, package: str, relpath: str) -> Path | None:
    """The directory holding ``package``'s folder, from the file a module was loaded from
    (``.../<package>/<relpath>``); None where it does not end so."""
    if not file:
        return None
    path = Path(file)
    tail = Path(package, relpath).parts
    if path.parts[-len(tail):] != tail:
        return None
    return Path(*path.parts[:-len(tail)])
