"""The committed results: one folder per benchmark (plus logs/, cpu/ and archive/ with its index)
under benchmarks/results, and every results file the docs, the code's comments and the tests cite
by path exists."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# what `make bench` and the README write into each folder: folder -> the bench command's stem
CURRENT = {"cleanup": "cleanup", "hc_head": "hc_head", "eager_cost": "eager_cost",
           "model_step": "model_step", "e2e": "e2e", "mhc": "mhc", "plugin": "plugin_eager",
           "metadata": "metadata"}
# benchmarks/results/<path> or a relative results/<path>, up to a space, quote or bracket
CITATION = re.compile(r"(?:benchmarks/)?(?<![\w.])results/([\w./{},*<>-]+)")


def test_results_are_grouped_by_benchmark():
    top = sorted(p.name for p in RESULTS.iterdir())
    files = [n for n in top if (RESULTS / n).is_file()]
    assert files == [] or files == ["README.md"], f"files at the top of results/: {files}"
    for folder, stem in CURRENT.items():
        assert (RESULTS / folder / f"{stem}.json").exists(), folder
    assert (RESULTS / "archive" / "README.md").exists()


def expand(path: str) -> list[str]:
    """``a.{json,md}`` -> ``a.json``, ``a.md``."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m[1].split(",") for p in expand(path[:m.start()] + alt + path[m.end():])]


def cited() -> dict[str, set[str]]:
    """Each cited results path -> the files citing it."""
    files = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.sh", "*.json", "Makefile"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out: dict[str, set[str]] = {}
    for name in files:
        if name.startswith("benchmarks/results/") and not name.endswith("README.md"):
            continue  # results files record the commands they ran, then and there
        path = ROOT / name
        if not path.is_file():
            continue
        for m in CITATION.finditer(path.read_text(errors="replace")):
            target = m[1].rstrip(".,:;)`'\"")
            if not target or any(c in target for c in "<*") or target.startswith("..."):
                continue
            base = (path.parent if name.startswith("benchmarks/results/") else RESULTS)
            if name.startswith("benchmarks/results/") and not m[0].startswith("benchmarks/"):
                base = RESULTS  # an index names files from results/ down
            for one in expand(target):
                out.setdefault(str((base / one).relative_to(ROOT)) if (base / one).is_relative_to(
                    ROOT) else one, set()).add(name)
    return out


def test_every_cited_results_file_exists():
    missing = {path: sorted(by) for path, by in cited().items() if not (ROOT / path).exists()}
    assert not missing, "cited but absent:\n" + "\n".join(f"  {p} (in {', '.join(b)})"
                                                           for p, b in sorted(missing.items()))
