"""A measured number the user-facing docs quote next to a results file is in that file.

For each table row and each sentence of the docs below that cites a file under
`benchmarks/results/` (a markdown link or a backticked path; a folder or a `*` pattern cites
every file it holds; a bare file name backticked in the same row or sentence is read beside the
cited files; a table row also carries the citations of its table's header row; benchmarks/README.md
cites `results/...` relative to its folder, and in a table whose header says its files are under
`results/`, the first column's paths relative to that), every number
written right before µs/us or × / x (both ends of a range such as `3.7–14.1×`) must occur in
one of the cited files, as written or equal once thousands separators are removed. Versions,
dates, line numbers and counts carry no such unit and are not checked."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/sglang.md", "docs/vllm.md", "docs/tables.md", "docs/ops.md",
        "docs/design.md", "docs/install.md", "docs/doctor.md", "docs/cli.md", "docs/benchmarks.md",
        "docs/results.md", "benchmarks/README.md"]

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
QUOTE = re.compile(rf"(?<![\w.,])({NUMBER})(?:\s*[–-]\s*({NUMBER}))?"
                   r"(?:\s*(?:µs|us)(?!\w)|[×x](?!\w))")
CITE = re.compile(r"benchmarks/results/[\w./*<>-]*")
NAME = re.compile(r"`([\w.*-]+\.(?:md|json|log))`")
# under a templated citation, a results path relative to benchmarks/results (`mhc/mhc.md`)
RELATIVE = re.compile(r"`((?:[\w.-]+/)+[\w.*-]+\.(?:md|json|log))`")
# in benchmarks/README.md: a results path relative to benchmarks/ (`results/mhc/mhc.md`) and, in
# the first column of a table "under `results/`", one relative to results/ (`mhc/mhc.{json,md}`)
LOCAL = re.compile(r"(?<![\w./])results/(?=[\w*<>-])")
UNDER = re.compile(r"`(?!results/)([\w.-]+/[\w./*{},-]*)`")


def rooted(text: str) -> str:
    """benchmarks/README.md's text with its citations written from the repository root; a
    `{json,md}` choice of extensions is read as `*`."""
    lines, under, in_table = [], False, False
    for line in text.splitlines():
        if line.startswith("|"):
            under = under if in_table else "under `results/`" in line
            in_table = True
            if under:
                _, first, rest = line.split("|", 2)
                first = UNDER.sub(lambda m: "`benchmarks/results/"
                                  + re.sub(r"\{[\w,]+\}", "*", m[1]) + "`", first)
                line = f"|{first}|{rest}"
        else:
            in_table = under = False
        lines.append(LOCAL.sub("benchmarks/results/", line))
    return "\n".join(lines) + "\n"


def value(number: str) -> float:
    """A number as written, thousands separators removed: 1,134.9 and 1134.90 are equal."""
    return float(number.replace(",", ""))


def units(text: str) -> list[str]:
    """The table rows and the sentences of a markdown text, code blocks left out; a row also
    carries the citations of its table's header row."""
    out, paragraph, in_code, header = [], [], False, None
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("|") or not line.strip() or line.startswith("#"):
            if paragraph:
                out += re.split(r"(?<=\.)\s+(?=[A-Z(`*\[])", " ".join(paragraph))
                paragraph = []
            if line.startswith("|"):  # a row, with what the table's header row cites
                header = line if header is None else header
                cites = CITE.findall(header) + [f"`{n}`" for n in NAME.findall(header)]
                out.append(line if line is header else " ".join([line, *cites]))
            else:
                header = None
            continue
        header = None
        paragraph.append(line.strip())
    return out


def cited_files(unit: str) -> list[Path]:
    files: list[Path] = []
    templated = False
    for cite in CITE.findall(unit):
        cite = cite.rstrip(".,;:")
        if "<" in cite:  # `benchmarks/results/<benchmark>/`: the bare names beside it say which
            templated = True
            continue
        path = ROOT / cite
        if "*" in cite:
            found = sorted(ROOT.glob(cite))
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file())
        else:
            found = [path] if path.is_file() else []
        assert found, f"cites {cite}, which does not exist: {unit[:200]}"
        files += found
    files = list(dict.fromkeys(files))
    folders = {f.parent for f in files}
    for name in NAME.findall(unit):
        files += [folder / name for folder in folders if (folder / name).is_file()]
        if templated:  # the current results folders, not the archive
            found = [p for p in (ROOT / "benchmarks" / "results").rglob(name)
                     if "archive" not in p.parts]
            assert found, f"names {name}, which is in no results folder: {unit[:200]}"
            files += found
    if templated:
        for rel in RELATIVE.findall(unit):
            found = sorted((ROOT / "benchmarks" / "results").glob(rel))
            assert found, f"names {rel}, which is not under benchmarks/results: {unit[:200]}"
            files += found
    return list(dict.fromkeys(files))


def numbers_in(files: list[Path]) -> set[float]:
    found: set[float] = set()
    for f in files:
        text = f.read_text(errors="replace")
        found |= {value(n) for n in re.findall(rf"(?<![\w.])(?:{NUMBER})", text)}
    return found


def quoted(unit: str) -> list[str]:
    return [n for m in QUOTE.finditer(unit) for n in m.groups() if n]


def wrong_numbers(text: str) -> list[str]:
    wrong = []
    for unit in units(text):
        if not CITE.search(unit):
            continue
        files = cited_files(unit)
        known = numbers_in(files)
        missing = [n for n in quoted(unit) if value(n) not in known]
        if missing:
            wrong.append(f"{missing} not in {[str(f.relative_to(ROOT)) for f in files]}:\n"
                         f"    {unit[:300]}")
    return wrong


@pytest.mark.parametrize("doc", DOCS)
def test_quoted_numbers_are_in_the_cited_results(doc):
    text = (ROOT / doc).read_text()
    wrong = wrong_numbers(rooted(text) if doc.startswith("benchmarks/") else text)
    assert not wrong, "\n".join(wrong)


def test_the_readme_cites_results_for_its_numbers():
    readme = (ROOT / "README.md").read_text()
    checked = [u for u in units(readme) if CITE.search(u) and quoted(u)]
    assert len(checked) >= 8  # the step table's rows


def test_the_benchmarks_readme_cites_results_for_its_numbers():
    text = rooted((ROOT / "benchmarks" / "README.md").read_text())
    checked = [u for u in units(text) if CITE.search(u) and quoted(u)]
    assert len(checked) >= 20


def test_a_wrong_number_fails():
    cite = "[`benchmarks/results/cleanup/cleanup.md`](benchmarks/results/cleanup/cleanup.md)"
    assert not wrong_numbers(f"| fused | 1.24 µs | 37.9 µs | {cite} |\n")
    assert wrong_numbers(f"| fused | 1.25 µs | 37.9 µs | {cite} |\n")
    assert wrong_numbers(f"The loop takes 584.1 µs, 53× the fused 11.1 µs ({cite}).\n")
    absent = "benchmarks/" + "results" + "/no-such/file.md"  # not a citation of the repository
    with pytest.raises(AssertionError, match="does not exist"):
        wrong_numbers(f"It takes 1.24 µs (`{absent}`).\n")
    assert not wrong_numbers("It takes 1.25 µs, measured nowhere.\n")  # no citation: unchecked
    local = "[`results/cleanup/cleanup.md`](results/cleanup/cleanup.md)"  # benchmarks/README.md's
    assert not wrong_numbers(rooted(f"| fused | 1.24 µs | 37.9 µs | {local} |\n"))
    assert wrong_numbers(rooted(f"| fused | 1.25 µs | 37.9 µs | {local} |\n"))
    table = "| file (under `results/`) | what |\n|---|---|\n"
    assert not wrong_numbers(rooted(table + "| `cleanup/cleanup.{json,md}` | fused 1.24 µs |\n"))
    assert wrong_numbers(rooted(table + "| `cleanup/cleanup.{json,md}` | fused 1.25 µs |\n"))
