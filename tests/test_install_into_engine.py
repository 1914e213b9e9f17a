"""Installing dsv4spec into a serving engine's environment moves nothing there: pyproject
declares no upper bound, no engine and no Triton of its own, and pip, asked to install the wheel
(extras included) into environments that hold an engine, its torch and its Triton (validated
releases or not, under the name torch's build gives it), would install dsv4spec and nothing else.

Offline: the wheel is built from a copy of the source tree with this environment's setuptools,
and pip resolves with ``--no-index`` against environments whose installed distributions are
metadata only (``*.dist-info/METADATA``), so a requirement that an installed release does not
satisfy fails the resolution instead of downloading."""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from .test_install import copy_source_tree

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {"sglang", "vllm"}
# What an engine's environment already holds and installing the plugin must leave as it is.
STACK = {"torch", "triton", *ENGINES}
# pip as a fresh machine runs it: no configuration file, no PIP_* variable (a machine's own
# constraints or find-links would change what is resolved).
# pip without its configuration, and without PYTHONPATH: a checkout's src/ on it (with its
# dsv4spec.egg-info) would show pip a dsv4spec already installed
PIP_ENV = {**{k: v for k, v in os.environ.items()
              if not k.startswith("PIP_") and k != "PYTHONPATH"},
           "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
# Specifiers that can refuse a newer release than some engine's (an upper bound, an exact pin).
UPPER = {"<", "<=", "==", "===", "~="}


def project() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_requirements_bound_nothing_from_above_and_bring_no_engine():
    declared = {"dependencies": project()["dependencies"],
                **{f"extra {k}": v for k, v in project()["optional-dependencies"].items()}}
    problems = []
    for where, texts in declared.items():
        for req in map(Requirement, texts):
            upper = [str(s) for s in req.specifier if s.operator in UPPER]
            if upper:
                problems.append(f"{where}: {req} bounds {req.name} from above ({upper})")
            if req.name.lower() in ENGINES:
                problems.append(f"{where}: {req} would install or upgrade an engine")
            if where.startswith("extra") and req.name.lower() in STACK:
                problems.append(f"{where}: {req} would move the engine's {req.name}")
    assert not problems, "\n".join(problems)
    assert set(project()["optional-dependencies"]) >= ENGINES  # `dsv4spec[sglang]` still works


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """dsv4spec's wheel, built offline from a copy of the source tree (nothing is written into
    the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = copy_source_tree(tmp / "source")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", "-w", str(tmp / "dist"), str(source)],
                         capture_output=True, text=True, timeout=300, env=PIP_ENV)
    if res.returncode != 0 and "No module named setuptools" in res.stderr:
        pytest.skip("this environment has no setuptools to build the wheel offline")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    (built,) = (tmp / "dist").glob("dsv4spec-*.whl")
    return built


def environment(folder: Path, installed: dict[str, tuple[str, list[str]]]) -> Path:
    """A virtual environment (no pip) whose site-packages lists ``installed``: name ->
    (version, its requirements), as metadata only. Returns its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for name, (version, requires) in installed.items():
        # the name's hyphens as underscores: the folder's one hyphen is before the version
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\n" f"Name: {name}\n" f"Version: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires))
        (info / "INSTALLER").write_text("pip\n")
    return python


# What every engine's environment holds besides torch and Triton.
OTHERS = {"numpy": ("2.2.0", []), "safetensors": ("0.6.2", []), "tqdm": ("4.67.1", [])}


def engine_environment(torch: str, triton: str, engine: tuple[str, str] | None):
    """What an engine's environment holds that the plugin's requirements name: torch pinning
    its Triton as torch's wheels do, and the engine pinning its torch."""
    held = {"torch": (torch, [f"triton=={triton}"]), "triton": (triton, []), **OTHERS}
    if engine is not None:
        held[engine[0]] = (engine[1], [f"torch=={torch}", "numpy", "tqdm", "safetensors"])
    return held


# (torch, Triton, engine): the validated stacks, a torch whose Triton is past every validated
# release, and an older engine whose hooks step aside at run time
CASES = {
    "SGLang 0.5.23 (torch 2.14.1, Triton 3.8)": ("2.14.1", "3.8.0", ("sglang", "0.5.23")),
    "vLLM 0.34.0 (torch 2.14.0, Triton 3.8)": ("2.14.0", "3.8.0", ("vllm", "0.34.0")),
    "torch 2.15 with Triton 3.9": ("2.15.0", "3.9.0", None),
    "an older SGLang (torch 2.9, Triton 3.5)": ("2.9.1", "3.5.1", ("sglang", "0.5.4")),
    "this environment's torch and Triton": (None, None, None),
}


def would_install(python: Path, requirement: str, tmp_path: Path) -> list[tuple[str, str]]:
    """(name, version) of what pip, offline, would install into ``python``'s environment for
    ``requirement``; fails the test where pip needs more than the environment holds (offline, a
    refusal means a requirement the environment does not meet: online, pip would download and
    install, or upgrade, it)."""
    report = tmp_path / "report.json"
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                          "--dry-run", "--no-index", "--report", str(report), "-q", requirement],
                         capture_output=True, text=True, timeout=300, env=PIP_ENV)
    assert res.returncode == 0, (f"pip would need more than the environment holds\n"
                                 f"{res.stdout[-2000:]}{res.stderr[-3000:]}")
    return [(i["metadata"]["name"], i["metadata"]["version"])
            for i in json.loads(report.read_text())["install"]]


def version_of(wheel: Path) -> str:
    return re.search(r"dsv4spec-([^-]+)-", wheel.name)[1]


@pytest.mark.parametrize("case", list(CASES))
def test_pip_would_install_dsv4spec_alone_into_an_engines_environment(case, wheel, tmp_path):
    import importlib.metadata

    torch, triton, engine = CASES[case]
    torch = torch or importlib.metadata.version("torch")
    triton = triton or importlib.metadata.version("triton")
    python = environment(tmp_path / "venv", engine_environment(torch, triton, engine))
    extras = "[sglang,vllm]" if engine is not None else ""
    installs = would_install(python, f"dsv4spec{extras} @ {wheel.as_uri()}", tmp_path)
    assert installs == [("dsv4spec", version_of(wheel))], f"{case}: pip would install {installs}"


# torch builds whose Triton is a distribution of another name holding the same `triton` package,
# required as their wheels require it: (torch, its Triton's distribution, version)
RENAMED_TRITON = {
    "ROCm torch": ("2.9.1+rocm6.4", "pytorch-triton-rocm", "3.5.1"),
    "XPU torch": ("2.9.1+xpu", "pytorch-triton-xpu", "3.5.0"),
    "nightly CUDA torch": ("2.11.0.dev20260105+cu128", "pytorch-triton", "3.6.0+git5261b273"),
}


@pytest.mark.parametrize("case", list(RENAMED_TRITON))
def test_pip_would_not_install_triton_over_torchs_triton_of_another_name(case, wheel, tmp_path):
    torch, distribution, version = RENAMED_TRITON[case]
    python = environment(tmp_path / "venv", {
        "torch": (torch, [f'{distribution}=={version}; platform_system == "Linux"']),
        distribution: (version, []), **OTHERS})
    installs = would_install(python, f"dsv4spec[sglang,vllm] @ {wheel.as_uri()}", tmp_path)
    assert installs == [("dsv4spec", version_of(wheel))], f"{case}: pip would install {installs}"


def test_the_wheel_requires_torch_and_no_triton_of_its_own(wheel):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(name).decode()
    requires = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    assert "torch" in {r.name for r in requires}
    assert not [str(r) for r in requires if "triton" in r.name.lower()]
