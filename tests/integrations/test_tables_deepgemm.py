"""Rows measured against the engines' DeepGEMM path, in their own ``.deepgemm`` files: where the
engine runs DeepGEMM the mHC hooks decide from them (each measured count as its own point says),
and from the plain rows where it does not or where no such file covers the GPU."""

import json

import pytest

from dsv4spec.integrations import tables
from dsv4spec.integrations.sglang import mhc as sglang_mhc
from dsv4spec.integrations.vllm import mhc as vllm_mhc

from .test_tables import SM90, fresh  # noqa: F401

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
HOOKS = ("mhc_pre", "mhc_fused_post_pre")
PLUGINS = {"sglang": sglang_mhc, "vllm": vllm_mhc}


def packaged_deepgemm_files():
    return sorted(p for p in tables.PACKAGED_DIR.glob(f"*{tables.DEEPGEMM_INFIX}.*.json"))


def test_the_deepgemm_chain_is_its_own_files(monkeypatch, tmp_path):
    monkeypatch.setenv(tables.TABLES_DIR_ENV, str(tmp_path))
    on = [p.name for p in tables.candidates(H200, SM90, "3.8", deepgemm=True)]
    # the user's plain device files after its own .deepgemm file: an earlier tune wrote rows
    # measured against DeepGEMM there (hook_entry takes only those)
    assert on == ["NVIDIA_H200.deepgemm.triton3.8.json", "NVIDIA_H200.triton3.8.json",
                  "NVIDIA_H200.json", "NVIDIA_H200.deepgemm.triton3.8.json",
                  "sm_90.deepgemm.triton3.8.json"]
    assert not any(tables.DEEPGEMM_INFIX in p.name for p in tables.candidates(H200, SM90, "3.8"))
    # every packaged .deepgemm file holds rows of the ops that run DeepGEMM's GEMM, labelled so
    files = packaged_deepgemm_files()
    assert {p.name for p in files} >= {"NVIDIA_H200.deepgemm.triton3.6.json",
                                       "NVIDIA_H200.deepgemm.triton3.8.json",
                                       "NVIDIA_H100_80GB_HBM3.deepgemm.triton3.6.json"}
    for path in files:
        for engine, hooks in tables.read_file(path).items():
            assert set(hooks) <= set(HOOKS), (path.name, engine)
            for hook, entry in hooks.items():
                assert entry["deepgemm_above"] is not None, (path.name, engine, hook)


@pytest.mark.parametrize("device, stack", [(H200, "3.6"), (H200, "3.8"), (H100, "3.6")])
def test_with_deepgemm_on_each_measured_count_is_decided_by_its_own_point(fresh, device,  # noqa: F811
                                                                          stack):
    """A GPU's decisions with DeepGEMM on, at every count its .deepgemm file measured: ours
    exactly where ours was faster than the engine's DeepGEMM path there."""
    data = json.loads((tables.PACKAGED_DIR / tables.device_file_name(device, stack, True))
                      .read_text())
    checked = 0
    with tables.assuming(device, stack):
        for engine, hooks in data["engines"].items():
            for hook, entry in hooks.items():
                for mode, keyed in entry["points"].items():
                    for H, rows in keyed.items():
                        for count, ours, theirs in rows:
                            served = PLUGINS[engine].prefers_dsv4spec(
                                hook, count, int(H), mode == "graph", SM90, deep_gemm=True)
                            assert served == (ours < theirs), (engine, hook, mode, H, count)
                            checked += 1
    assert checked > 200


def test_deepgemm_on_and_off_read_different_rows_on_the_h200(fresh):  # noqa: F811
    with tables.assuming(H200, "3.8"):
        # vLLM's mhc_pre at 64 tokens, H 7168: faster than vLLM's TileLang GEMM, slower than
        # its DeepGEMM path (13.6 vs 9.3 us, benchmarks/results/deepgemm_h200)
        assert vllm_mhc.prefers_dsv4spec("mhc_pre", 64, 7168, True, SM90, deep_gemm=False)
        assert not vllm_mhc.prefers_dsv4spec("mhc_pre", 64, 7168, True, SM90, deep_gemm=True)
        assert vllm_mhc.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90, deep_gemm=True)
        assert vllm_mhc.DEEPGEMM_TABLES["mhc_pre"].sources[SM90] == (
            tables.PACKAGED_DIR / "NVIDIA_H200.deepgemm.triton3.8.json")
        assert vllm_mhc.TABLES["mhc_pre"].sources[SM90] == (
            tables.PACKAGED_DIR / "NVIDIA_H200.triton3.8.json")
        # SGLang's mhc_pre with DeepGEMM on: served where measured faster than DeepGEMM's path
        assert sglang_mhc.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90, deep_gemm=True)
        assert not sglang_mhc.prefers_dsv4spec("mhc_pre", 32, 7168, True, SM90, deep_gemm=True)


def test_without_a_deepgemm_file_the_plain_rows_decide_where_their_path_is_the_engines(fresh):  # noqa: F811
    """SGLang under Triton 3.6 has no .deepgemm rows: with DeepGEMM on, the boundary to 32 tokens
    (TileLang either way) follows its plain rows; mhc_pre (DeepGEMM at every count) steps aside."""
    with tables.assuming(H200, "3.6"):
        assert sglang_mhc.DEEPGEMM_TABLES["mhc_pre"].get(SM90) is None
        for deep_gemm in (False, True):
            assert sglang_mhc.prefers_dsv4spec("mhc_fused_post_pre", 1, 7168, True, SM90,
                                               deep_gemm=deep_gemm)
        assert sglang_mhc.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90, deep_gemm=False)
        assert not sglang_mhc.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90, deep_gemm=True)


def test_a_malformed_deepgemm_file_leaves_the_plain_rows_to_decide(fresh, caplog):  # noqa: F811
    fresh(H200)
    path = tables.user_dir() / tables.device_file_name(H200, "3.6", deepgemm=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with caplog.at_level("WARNING", logger="dsv4spec"):
        # the packaged .deepgemm file after it is not read either: the chain is taken whole
        assert not vllm_mhc.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90, deep_gemm=True)
        assert vllm_mhc.prefers_dsv4spec("mhc_pre", 1, 7168, True, SM90, deep_gemm=False)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert str(path) in text and "none of the rows measured against DeepGEMM's path" in text
