"""``pip install dsv4spec`` into a fresh virtual environment that holds torch (and what torch
itself requires) and nothing else: the commands a new user runs first must work with only the
declared dependencies, without a warning about a missing module.

torch comes from this environment (linked, not reinstalled: its wheel is most of a minute to
unpack); pip installs the package from a copy of the source tree with its declared dependencies,
and Triton at this environment's version beside it, so the wheels come from pip's cache or
index."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def requirement_closure(name: str) -> list[importlib.metadata.Distribution]:
    """``name``'s distribution and every distribution its requirements reach (markers
    evaluated for this interpreter, extras left out)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = todo.pop().lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist = importlib.metadata.distribution(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def link_preinstalled(name: str, into: Path) -> None:
    """Symlinks in ``into`` to the installed files of ``name``'s requirement closure."""
    into.mkdir()
    for dist in requirement_closure(name):
        site = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if (site / top).exists() and not (into / top).exists():
                (into / top).symlink_to(site / top)


def copy_source_tree(dest: Path) -> Path:
    """What pip builds dsv4spec from (pyproject, README, src/), copied to ``dest``: nothing is
    written into the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def test_pip_install_with_torch_only_runs_demo_generate_and_train_tiny(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    link_preinstalled("torch", tmp_path / "preinstalled")
    (site / "preinstalled.pth").write_text(str(tmp_path / "preinstalled") + "\n")

    source = copy_source_tree(tmp_path / "source")
    # a CPU-only torch requires no Triton: installed beside the package, as docs/install.md
    # says (a CUDA torch's, linked above, already satisfies it)
    triton = f"triton=={importlib.metadata.version('triton')}"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", triton,
         str(source)],
        capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV")}
    dsv4spec = str(venv / "bin" / "dsv4spec")
    runs = {
        "demo": [dsv4spec, "demo", "--device", "cpu"],
        "generate": [dsv4spec, "generate", "--prompt", "def ", "--max-new-tokens", "8",
                     "--device", "cpu"],
        "train-tiny": [dsv4spec, "train-tiny", "--steps", "2", "--batch-size", "2",
                       "--out", str(tmp_path / "tiny.safetensors")],
    }
    for name, argv in runs.items():
        res = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                             cwd=tmp_path)
        assert res.returncode == 0, f"{name}: {res.stdout[-1500:]}\n{res.stderr[-3000:]}"
        for warning in ("No module named", "Failed to initialize NumPy"):
            assert warning not in res.stderr, f"{name}: {res.stderr[-3000:]}"
        if name == "train-tiny":  # tqdm is a dependency: a plain install shows progress
            assert "train-tiny: 100%" in res.stderr, res.stderr[-2000:]
    assert (tmp_path / "tiny.safetensors").stat().st_size > 0


def test_readme_names_the_python_versions_pyproject_requires():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    low = project["requires-python"].removeprefix(">=")
    assert f"Python {low} or newer" in (ROOT / "README.md").read_text()
    assert sys.version_info[:2] >= tuple(int(p) for p in low.split("."))
