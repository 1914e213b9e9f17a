"""``--deepgemm auto`` resolves as each engine decides: SGLang's switches, vLLM's switch, its
vendored DeepGEMM where none is installed and, in 0.34.0, its nvcc check."""

import sys
import types

import pytest

from dsv4spec.bench import deepgemm


@pytest.fixture
def hopper_with(monkeypatch):
    """``hopper_with(installed=..., vendored=...)``: a Hopper GPU, an nvcc of 13.0, and the
    named deep_gemm modules importable (the others not)."""

    def make(installed: bool, vendored: bool = False, nvcc=(13, 0)):
        monkeypatch.setattr(deepgemm, "_capability", lambda: (9, 0))
        monkeypatch.setattr(deepgemm, "_nvcc_version", lambda: nvcc)
        for name, present in (("deep_gemm", installed),
                              ("vllm.third_party.deep_gemm", vendored)):
            monkeypatch.setitem(sys.modules, name,
                                types.ModuleType(name) if present else None)
        for switch in ("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "SGLANG_ENABLE_JIT_DEEPGEMM",
                       "VLLM_USE_DEEP_GEMM"):
            monkeypatch.delenv(switch, raising=False)

    return make


def test_auto_runs_deepgemm_where_each_engine_would(hopper_with):
    hopper_with(installed=True)
    assert deepgemm.resolve("auto", "sglang").__name__ == "deep_gemm"
    assert deepgemm.resolve("auto", "vllm").__name__ == "deep_gemm"


def test_vllm_takes_its_vendored_copy_where_none_is_installed(hopper_with):
    hopper_with(installed=False, vendored=True)
    assert deepgemm.resolve("auto", "vllm").__name__ == "vllm.third_party.deep_gemm"
    assert deepgemm.resolve("on", "vllm").__name__ == "vllm.third_party.deep_gemm"
    assert deepgemm.resolve("auto", "sglang") is None  # SGLang imports deep_gemm alone
    with pytest.raises(deepgemm.DeepGemmUnavailable, match="--deepgemm on"):
        deepgemm.resolve("on", "sglang")


@pytest.mark.parametrize("engine, switch", [
    ("sglang", "SGLANG_OPT_DEEPGEMM_HC_PRENORM"), ("sglang", "SGLANG_ENABLE_JIT_DEEPGEMM"),
    ("vllm", "VLLM_USE_DEEP_GEMM")])
def test_an_engines_switch_set_off_means_its_tilelang_gemm(hopper_with, monkeypatch, engine,
                                                           switch):
    hopper_with(installed=True)
    monkeypatch.setenv(switch, "0")
    assert deepgemm.engine_declines(engine) == f"{switch}=0"
    assert deepgemm.resolve("auto", engine) is None
    assert deepgemm.resolve("on", engine) is not None  # asked for: measured anyway
    other = "vllm" if engine == "sglang" else "sglang"
    assert deepgemm.resolve("auto", other) is not None


@pytest.mark.parametrize("nvcc", [None, (12, 8)])
def test_vllm_without_an_nvcc_of_12_9_runs_tilelang(hopper_with, nvcc):
    hopper_with(installed=True, nvcc=nvcc)
    assert "nvcc" in deepgemm.engine_declines("vllm")
    assert deepgemm.resolve("auto", "vllm") is None
    assert deepgemm.resolve("auto", "sglang") is not None


def test_nvcc_is_found_as_deepgemms_jit_finds_it(monkeypatch, tmp_path):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("DG_JIT_NVCC_COMPILER", raising=False)
    monkeypatch.delenv("DJ_JIT_NVCC_COMPILER", raising=False)
    assert deepgemm._nvcc_version() == (12, 8)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "absent"))
    assert deepgemm._nvcc_version() is None
