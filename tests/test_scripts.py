"""The GPU-run scripts as a user on the wrong machine sees them: one line saying why, a non-zero
exit status, nothing written."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

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


def _mhc_ncu():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mhc_ncu", ROOT / "scripts/mhc_ncu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ncu --import R --csv --page raw --print-units base, abridged: a header, the units, two kernels
NCU_RAW = """==PROF== a line of ncu's own
"ID","Kernel Name","gpu__time_duration.sum","launch__grid_size","lts__t_bytes.sum",\
"dram__bytes_read.sum","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",\
"smsp__average_warp_latency_issue_stalled_barrier.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","nsecond","","byte","Kbyte","ratio","ratio","ratio"
"0","_mhc_partials_kernel","9330","448","44000000","3,700","12.5","0.25","3"
"1","_mhc_finalize_kernel","4380","512","1000","2","0","7.75","1.5"
"""


def test_mhc_ncu_reads_each_kernels_metrics_in_us_and_bytes_and_its_stalls_largest_first():
    m = _mhc_ncu()
    kernels = m.parse_raw_csv(NCU_RAW)
    assert [k["kernel"] for k in kernels] == ["_mhc_partials_kernel", "_mhc_finalize_kernel"]
    first = kernels[0]
    assert first["us"] == 9.33 and first["grid"] == 448 and first["l2_bytes"] == 44e6
    assert first["dram_read"] == 3.7e6  # Kbyte, with a thousands separator
    assert list(first["stalls"].items()) == [("long_scoreboard", 12.5), ("wait", 3.0),
                                             ("barrier", 0.25)]
    assert list(kernels[1]["stalls"]) == ["barrier", "wait"]  # a zero is left out
    # a time in a unit it does not know is not guessed
    unknown = m.parse_raw_csv(NCU_RAW.replace('"nsecond"', '"cycle"'))[0]
    assert "us" not in unknown and unknown["us_unit_unknown"] == "cycle"
    assert m.parse_raw_csv(NCU_RAW.replace('"nsecond"', '"ns"'))[0]["us"] == 9.33
    assert m.parse_raw_csv("==PROF== no kernel profiled\n") == []
    assert m.missing_metrics("==ERROR== Failed to find metric lts__t_bytes.sum\n"
                             "==ERROR== Failed to find metric regex:^sm__x.sum$\n") == {
        "lts__t_bytes.sum", "sm__x.sum"}


def test_mhc_ncu_retries_without_a_metric_ncu_lacks_and_writes_a_row_per_kernel(tmp_path):
    # ncu stubbed: the first profile refuses lts__t_bytes.sum, the import prints NCU_RAW
    (tmp_path / "raw.csv").write_text(NCU_RAW)
    calls = tmp_path / "calls"
    stub(tmp_path / "bin", "ncu", f"""
case "$*" in
  --version) echo 'Version 2025.3.1.0' ;;
  *--import*) cat {tmp_path / 'raw.csv'} ;;
  *lts__t_bytes.sum*) echo "$*" >> {calls}
    echo '==ERROR== Failed to find metric lts__t_bytes.sum' >&2; exit 1 ;;
  *) echo "$*" >> {calls} ;;
esac""")
    m = _mhc_ncu()
    out = tmp_path / "out"
    assert m.main([str(out), "--ncu", str(tmp_path / "bin" / "ncu"), "--tokens", "64",
                   "--ops", "pre", "--providers", "ours", "vllm", "--variants", "default"]) == 0
    lines = calls.read_text().splitlines()
    assert len(lines) == 4  # each case: the refused try, then the one without that metric
    assert "lts__t_bytes.sum" in lines[0] and "lts__t_bytes.sum" not in lines[1]
    assert "--case pre,7168,64,ours,default" in lines[1]
    assert "--case pre,7168,64,vllm,-" in lines[3]
    import json

    record = json.loads((out / "mhc_ncu.json").read_text())
    assert [c["case"] for c in record["cases"]] == ["pre_H7168_T64_ours_default",
                                                    "pre_H7168_T64_vllm"]
    assert record["cases"][0]["kernels"][0]["us"] == 9.33
    assert record["environment"]["ncu"] == "Version 2025.3.1.0"
    md = (out / "mhc_ncu.md").read_text()
    assert "| pre_H7168_T64_vllm | _mhc_finalize_kernel | 4.38 |" in md, md


def test_mhc_mid_t_ab_table_takes_the_best_correct_tiling_against_the_faster_engine():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mhc_mid_t_ab", ROOT / "scripts/mhc_mid_t_ab.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    point = {"op": "post_pre", "H": 7168, "T": 64}
    rows = [{**point, "tiling": "planned", "us": 18.0, "errors": []},
            {**point, "tiling": "token rows t64 k32", "us": 9.0, "errors": []},
            {**point, "tiling": "rows (t, i) t16 k64", "us": 5.0, "errors": ["post: 3/256 off"]},
            {**point, "tiling": "vllm", "us": 13.5, "errors": []},
            {**point, "tiling": "sglang", "us": 14.0, "errors": []}]
    md = m.markdown({"device": "H200", "torch": "2.11", "triton": "3.6"}, rows,
                    ["post_pre T=64 H=7168 rows (t, i) t16 k64: post: 3/256 off"])
    assert "| post_pre | 7168 | 64 | 13.5 | 18.0 | 9.0 | token rows t64 k32 | 1.50x |" in md, md
    assert "- FAILURE post_pre T=64 H=7168 rows (t, i) t16 k64" in md
    assert set(m.candidates(64)) > {"planned", "token rows t64 k32", "planned pdl"}
    assert "planned pdl" not in m.candidates(65)  # a candidate up to 64 tokens


def test_mhc_tma_ab_partials_match_the_float64_reference_in_the_interpreter(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("mhc_tma_ab", ROOT / "scripts/mhc_tma_ab.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    # both ops, two widths, masked token blocks (17 of 32 and 40 of 64 rows), 2 chunks each
    assert m.main([str(tmp_path), "--interpret"]) == 0
    rows = json.loads((tmp_path / "mhc_tma_ab.json").read_text())["rows"]
    assert len(rows) == 8 and all(not r["errors"] for r in rows)
    # a tiling whose chunks do not cover H exactly is refused, not run past the stream's end
    x, fn, sc, base, nw, _ = m.make_inputs(17, 96, "cpu", seed=0, weight_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="do not tile it"):
        m.TmaOp(x, fn, sc, base, nw, (16, 64, 1, 1, 4), 132)
    # the Nsight Compute variants that profile it name tilings it has
    tma = [v["tma"] for v in _mhc_ncu().VARIANTS.values() if "tma" in v]
    assert tma and set(tma) <= set(m.TILINGS)
