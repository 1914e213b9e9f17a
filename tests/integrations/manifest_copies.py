"""Copies of an engine's source with one definition changed, for the manifest tests: the files an
engine spec reads, copied into a temporary tree, and one fingerprint part's definition edited
there in place (a ``pass`` after a function's or class's last statement, ``or None`` after an
assignment's value)."""

import ast
import shutil
from pathlib import Path

from dsv4spec.integrations import manifest


def spec_files(spec: manifest.EngineSpec) -> set[str]:
    """Every file ``spec`` reads, relative to its package folder."""
    files = set(spec.model_modules.values())
    for hook in spec.hooks.values():
        files |= {hook.file, *hook.helper_files, *hook.caller_files}
        files |= {label.split(":", 1)[0] for label in hook.relies_on}
    return files


def copy_source(spec: manifest.EngineSpec, root: Path, dest: Path) -> Path:
    """``dest``, now holding a copy of the files of ``spec`` found under ``root``."""
    for relpath in spec_files(spec):
        source = Path(root) / spec.package / relpath
        if source.is_file():
            target = dest / spec.package / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return dest


def changed(text: str, qualname: str) -> str:
    """``text`` with the definition ``qualname`` (a function, class or method, or a module-level
    assignment) changed in meaning and nothing else."""
    tree = ast.parse(text)
    node = manifest.find_qualname(tree, qualname) or manifest.top_level(tree)[qualname]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        insert = "\n" + " " * node.body[-1].col_offset + "pass"
    else:
        insert = " or None"
    lines = text.splitlines(keepends=True)
    line = lines[node.end_lineno - 1]
    lines[node.end_lineno - 1] = line[:node.end_col_offset] + insert + line[node.end_col_offset:]
    return "".join(lines)


class EditedSource:
    """A copy of an engine's source in which :meth:`change` edits one part at a time (each
    change undoes the one before)."""

    def __init__(self, spec: manifest.EngineSpec, root: Path, dest: Path) -> None:
        self.spec = spec
        self.root = copy_source(spec, root, dest)
        self._restore: tuple[Path, str] | None = None

    def change(self, label: str) -> None:
        """Change the definition of part ``label`` (``file:qualname``)."""
        self.undo()
        relpath, qualname = label.split(":", 1)
        path = self.root / self.spec.package / relpath
        text = path.read_text(encoding="utf-8")
        self._restore = (path, text)
        path.write_text(changed(text, qualname), encoding="utf-8")

    def undo(self) -> None:
        if self._restore is not None:
            path, text = self._restore
            path.write_text(text, encoding="utf-8")
            self._restore = None

    def verdicts(self, manifests: list[dict]) -> dict[str, manifest.Verdict]:
        return manifest.verdicts(self.spec, self.root, manifests)
