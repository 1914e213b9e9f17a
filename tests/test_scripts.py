"""The GPU-run scripts as a user on the wrong machine sees them: one line saying why, a non-zero
exit status, nothing written."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SGL_DEEP_GEMM = "0.2.3.post2"


def stub(folder: Path, name: str, script: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\n{script}\n")
    (folder / name).chmod(0o755)


def run(script: str, *args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / script), *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, **env})


@pytest.mark.parametrize("machine", ["nvidia-smi lists none", "torch sees no GPU"])
def test_gpu_check_without_a_gpu_says_so_in_one_line_and_writes_nothing(machine, tmp_path):
    if machine == "torch sees no GPU":
        stub(tmp_path / "bin", "nvidia-smi", "echo 'GPU 0: NVIDIA H200'")
    else:
        stub(tmp_path / "bin", "nvidia-smi", "echo 'No devices were found'; exit 6")
    env = {"PYTHON": sys.executable, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "CUDA_VISIBLE_DEVICES": ""}  # a CUDA torch sees no GPU either
    res = run("gpu_check.sh", "out", "tests", env=env, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert not res.stdout and res.stderr.count("\n") == 1, res.stderr
    why = ("no NVIDIA GPU here (nvidia-smi lists none)" if machine == "nvidia-smi lists none"
           else "sees no CUDA GPU")
    assert res.stderr.startswith("gpu_check.sh: ") and why in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def fake_sgl_wheel(folder: Path) -> None:
    """sgl-deep-gemm's wheel as pip finds it, with only what the check reads before the
    checkout."""
    folder.mkdir()
    info = f"sgl_deep_gemm-{SGL_DEEP_GEMM}.dist-info"
    with zipfile.ZipFile(folder / f"sgl_deep_gemm-{SGL_DEEP_GEMM}-py3-none-any.whl", "w") as z:
        z.writestr("deep_gemm/__init__.py", "")
        z.writestr("deep_gemm/VERSION", SGL_DEEP_GEMM)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: sgl-deep-gemm\n"
                   f"Version: {SGL_DEEP_GEMM}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


@pytest.mark.parametrize("missing", ["the DeepGEMM checkout", "the sgl-deep-gemm wheel"])
def test_deepgemm_bundle_check_fails_where_a_bundle_cannot_be_built(missing, tmp_path):
    (tmp_path / "wheels").mkdir()  # no vLLM wheel: the check says so, a build would download it
    links = tmp_path / "links"
    if missing == "the DeepGEMM checkout":
        fake_sgl_wheel(links)
    else:
        links.mkdir()
    stub(tmp_path / "bin", "apt-get", "exit 1")  # no package download from the test
    env = {"PYTHON": sys.executable, "VLLM_WHEELS": str(tmp_path / "wheels"), "DEEPGEMM_SRC": "",
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links),
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    res = run("deepgemm-bundle.sh", "--check", "all", "out", env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"vllm: no vLLM 0.33.0 wheel in {tmp_path / 'wheels'}" in res.stdout, res.stdout
    reason = ("sgl: cannot be built without that checkout" if missing == "the DeepGEMM checkout"
              else f"sgl: cannot be built: pip could not download sgl-deep-gemm=={SGL_DEEP_GEMM}")
    assert reason in res.stdout + res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "out").exists()
