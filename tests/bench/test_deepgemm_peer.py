"""The engines' DeepGEMM-on mHC peers: ``--deepgemm``, which ``deep_gemm`` the peers get, and
that SGLang's and vLLM's own files then hand their pre-norm GEMM to it (a stand-in ``deep_gemm``
here: the real one needs a Hopper GPU)."""

import importlib.machinery
import os
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from dsv4spec import cli
from dsv4spec.bench import deepgemm, sglang_mhc, vllm_kernels
from dsv4spec.integrations.vllm.source import (
    SOURCE_VERSIONS,
    SRC_ENV,
    unpacked_source,
    vllm_file,
    vllm_version,
)


class Called(Exception):
    """Raised by the stand-in GEMM, carrying its arguments (nothing after it runs on a CPU)."""


def stand_in_deep_gemm() -> ModuleType:
    module = ModuleType("deep_gemm")
    module.__spec__ = importlib.machinery.ModuleSpec("deep_gemm", None)
    module.__file__ = "/stand-in/deep_gemm/__init__.py"
    module.__version__ = "0.2.3.post2"
    module.pdl = []

    def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
        raise Called(a, b, d, sqr_sum, num_splits)

    module.tf32_hc_prenorm_gemm = tf32_hc_prenorm_gemm
    module.set_pdl = module.pdl.append
    return module


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: SimpleNamespace(multi_processor_count=132))


@pytest.fixture
def installed(monkeypatch):
    module = stand_in_deep_gemm()
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    return module


@pytest.fixture
def absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # `import deep_gemm` raises ImportError


@pytest.mark.parametrize("command", [["tune"], ["bench", "mhc"], ["bench", "vllm"]])
def test_the_option_parses_with_the_engines_choice_as_default(command):
    assert cli.build_parser(command).parse_args(command).deepgemm == "auto"
    for choice in deepgemm.CHOICES:
        args = command + ["--deepgemm", choice]
        assert cli.build_parser(args).parse_args(args).deepgemm == choice
    with pytest.raises(SystemExit):
        bad = command + ["--deepgemm", "yes"]
        cli.build_parser(bad).parse_args(bad)


def test_auto_picks_deepgemm_where_it_imports_on_hopper(installed, hopper):
    assert deepgemm.resolve("auto") is installed
    assert deepgemm.resolve("on") is installed
    assert deepgemm.resolve("off") is None
    assert deepgemm.describe(installed) == "deep_gemm 0.2.3.post2 (/stand-in/deep_gemm)"
    assert deepgemm.describe(None) == "off"


def test_auto_keeps_tilelang_before_hopper_and_on_forces_deepgemm(installed, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert deepgemm.resolve("auto") is None
    assert deepgemm.resolve("on") is installed


def test_on_without_deep_gemm_is_a_clear_error(absent, hopper):
    assert deepgemm.resolve("auto") is None and deepgemm.resolve("off") is None
    with pytest.raises(deepgemm.DeepGemmUnavailable, match="deepgemm-bundle.sh"):
        deepgemm.resolve("on")
    with pytest.raises(ValueError, match="deepgemm"):
        deepgemm.resolve("yes")


def test_tune_on_without_deep_gemm_writes_nothing(absent, hopper, tmp_path, capsys):
    from dsv4spec.bench import tune

    args = ["tune", "--deepgemm", "on", "--hooks", "mhc_pre", "--out-dir", str(tmp_path)]
    assert tune.main(cli.build_parser(args).parse_args(args)) == tune.EXIT_USAGE
    err = capsys.readouterr().err
    assert "deep_gemm does not import" in err and "nothing was written" in err
    assert list(tmp_path.iterdir()) == []


def test_gemm_path_follows_the_engines_thresholds():
    for op in ("pre", "mhc_pre"):
        assert deepgemm.gemm_path(op, 1, True) == deepgemm.gemm_path(op, 4096, True) == "deepgemm"
        assert deepgemm.gemm_path(op, 1, False) == "tilelang"
    for op in ("post_pre", "mhc_fused_post_pre", "mhc_fused_post_pre_reuse_residual"):
        assert deepgemm.gemm_path(op, 32, True) == "tilelang"
        assert deepgemm.gemm_path(op, 33, True) == "deepgemm"
        assert deepgemm.gemm_path(op, 33, False) == "tilelang"
    assert deepgemm.gemm_path("mhc_post", 64, True) == deepgemm.gemm_path("hc_head", 64, True) \
        == "tilelang"
    assert sglang_mhc.sglang_kernels("pre", 16, 7168, deep_gemm=True).startswith(
        "tf32_hc_prenorm_gemm")
    assert sglang_mhc.sglang_kernels("post_pre", 33, 7168, deep_gemm=True) == \
        "post+tf32_hc_prenorm_gemm+big_fuse_norm"
    assert sglang_mhc.sglang_kernels("post_pre", 32, 7168, deep_gemm=True).startswith("fma")


def _mhc_inputs(T: int, H: int = 256):
    g = torch.Generator().manual_seed(T)
    return {"x": torch.randn(T, H, generator=g).bfloat16(),
            "residual": torch.randn(T, 4, H, generator=g).bfloat16(),
            "post": torch.rand(T, 4, 1, generator=g), "comb": torch.rand(T, 4, 4, generator=g),
            "fn": torch.randn(24, 4 * H, generator=g), "scale": torch.rand(3, generator=g),
            "base": torch.randn(24, generator=g)}


def test_sglang_peer_runs_deepgemms_gemm_where_given(sgl_mhc, installed, hopper, monkeypatch):
    monkeypatch.delenv("SGLANG_DEEPGEMM_PDL", raising=False)
    assert not sgl_mhc._use_deep_gemm_hc_prenorm()
    peer = sglang_mhc.load_sglang_mhc(installed)  # the same file, DeepGEMM switched on
    assert peer is sgl_mhc and peer._use_deep_gemm_hc_prenorm() and installed.pdl == [True]
    t = _mhc_inputs(5)
    with pytest.raises(Called) as called:  # mhc_pre, at any token count
        peer.mhc_pre(t["residual"], t["fn"], t["scale"], t["base"], 1e-6, 1e-6, 1e-6, 2.0, 20)
    x, fn, out, sqrsum, splits = called.value.args
    assert x.shape == (5, 4 * 256) and fn is t["fn"]
    assert splits == peer._compute_num_split_for_mhc_pre(5, 4 * 256)
    assert out.shape == (splits, 5, 24) and sqrsum.shape == (splits, 5)
    # the boundary above its one-launch kernel's 32 tokens: post, then DeepGEMM's GEMM
    monkeypatch.setattr(peer, "mhc_post_tilelang", lambda *a: None)
    t = _mhc_inputs(33)
    with pytest.raises(Called) as called:
        peer.mhc_fused_post_pre(t["x"], t["residual"], t["post"], t["comb"], t["fn"],
                                t["scale"], t["base"], 1e-6, 1e-6, 1e-6, 2.0, 20)
    assert called.value.args[0].shape == (33, 4 * 256)
    # without a module, DeepGEMM is off again in the same process
    assert sglang_mhc.load_sglang_mhc(None) is peer and not peer._use_deep_gemm_hc_prenorm()


@pytest.fixture(params=SOURCE_VERSIONS)
def vllm_source(request, monkeypatch, tmp_path):
    """vLLM's source of one version with its ``utils/deep_gemm.py`` (``$DSV4SPEC_VLLM_SRC``,
    where set, serves the version it holds); ``vllm`` modules (and ``regex``) restored
    afterwards."""
    version = request.param
    if SRC_ENV in os.environ:
        if vllm_version() != version:
            pytest.skip(f"${SRC_ENV} holds vLLM {vllm_version()}, not {version}")
    elif unpacked_source(version) is None:
        pytest.skip(f"vLLM {version}'s source is not unpacked (`make setup`)")
    else:
        monkeypatch.setenv(SRC_ENV, str(unpacked_source(version)))
    try:
        vllm_file(vllm_kernels.DEEP_GEMM_FILE)
    except FileNotFoundError:
        pytest.skip("vLLM's utils/deep_gemm.py is not unpacked yet (run `make setup` again)")
    # 0.34.0 turns DeepGEMM on only with an nvcc of CUDA 12.9 or newer: a stand-in one
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    names = lambda: [n for n in sys.modules  # noqa: E731
                     if n in ("vllm", "regex") or n.startswith("vllm.")]
    saved = {n: sys.modules.pop(n) for n in names()}
    try:
        yield version
    finally:
        for name in names():
            del sys.modules[name]
        sys.modules.update(saved)
        os.environ.pop("DG_JIT_CACHE_DIR", None)


def test_vllm_peer_runs_its_own_deep_gemm_wrapper_over_the_given_module(vllm_source, installed,
                                                                         hopper, tmp_path):
    from tests.integrations.vllm import standins

    peer = vllm_kernels.load_vllm_mhc_kernels(kernels=standins.kernels_module(),
                                              deep_gemm=installed)
    assert peer.deep_gemm is installed
    wrapper = sys.modules["vllm.utils.deep_gemm"]
    assert wrapper.__file__ == str(vllm_file(vllm_kernels.DEEP_GEMM_FILE))  # vLLM's own file
    assert wrapper.is_deep_gemm_supported()
    t = _mhc_inputs(3)
    with pytest.raises(Called) as called:  # vLLM's mhc_pre, through vLLM's wrapper
        peer.mhc_pre(t["residual"], t["fn"], t["scale"], t["base"], 1e-6, 1e-6, 1e-6, 2.0, 20)
    x, fn, out, sqrsum, splits = called.value.args
    assert x.shape == (3, 4 * 256) and fn is t["fn"] and out.shape == (splits, 3, 24)
    # vLLM's _lazy_init: PDL on (compute capability 9.0), its JIT cache under VLLM_CACHE_ROOT
    assert installed.pdl == [True]
    assert os.environ["DG_JIT_CACHE_DIR"] == str(tmp_path / "cache" / "deep_gemm")
    # off again: the stand-in, which vLLM's functions read at their next call
    vllm_kernels.load_vllm_mhc_kernels(kernels=standins.kernels_module())
    assert not sys.modules["vllm.utils.deep_gemm"].is_deep_gemm_supported()
