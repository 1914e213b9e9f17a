import argparse
import re
import sys

import pytest
import torch

from dsv4spec.bench import common, vllm_kernels
from dsv4spec.bench import hc_head as bench
from dsv4spec.integrations.vllm.source import vllm_src
from dsv4spec.model.model import rms_norm


def test_bytes_moved_counts_x_params_and_y():
    # T=4, H=7168, bf16: x 229,376 B + hc_fn 458,752 B + scale/base 20 B + y 57,344 B
    assert bench.bytes_moved(4, 7168, 2) == 4 * 4 * 7168 * 2 + 4 * 4 * 7168 * 4 + 20 + 4 * 7168 * 2
    assert bench.bytes_moved(4, 7168, 2, rmsnorm=True) - bench.bytes_moved(4, 7168, 2) == 7168 * 4


def _rows():
    # (graph µs, eager µs) at T = 0, scaled by (1 + T / 64)
    times = {"eager": (40.0, 300.0), "compiled": (19.0, 300.0), "triton": (5.0, 25.0),
             "eager+norm": (45.0, 400.0), "triton+norm": (5.3, 26.0), "sglang": (50.0, 55.0)}
    return [{"H": 7168, "T": T, "provider": p, "median_us": g * (1 + T / 64),
             "eager_us": e * (1 + T / 64),
             "bytes": bench.bytes_moved(T, 7168, 2, p.endswith("+norm"))}
            for T in (4, 64, 1024) for p, (g, e) in times.items()]


def test_derive_and_targets():
    rows = bench.derive(_rows(), copy_bw=4.27e12)
    r = {(x["T"], x["provider"]): x for x in rows}
    assert r[4, "compiled"]["speedup_vs_eager"] == pytest.approx(40 / 19)
    assert r[4, "triton"]["triton_over_compiled"] == pytest.approx(5 / 19)
    assert r[4, "triton+norm"]["speedup_vs_eager"] == pytest.approx(45 / 5.3)
    assert r[4, "triton+norm"]["norm_overhead_us"] == pytest.approx(0.3 * (1 + 4 / 64))
    gbps = r[1024, "triton"]["bytes"] / (r[1024, "triton"]["median_us"] * 1e-6) / 1e9
    assert r[1024, "triton"]["GB/s"] == pytest.approx(gbps)
    assert r[4, "sglang"]["sglang_over_triton"] == pytest.approx(10)
    assert r[4, "sglang"]["sglang_over_triton_eager"] == pytest.approx(55 / 25)
    assert r[4, "triton+norm"]["norm_overhead_pct"] == pytest.approx(6)
    targets = bench.check_targets(rows)
    assert not targets["triton eager <= 30 us, H = 7168, T <= 64"]  # 25 * 2 µs at T = 64
    assert targets["triton eager never slower than sglang, every H and T"]
    assert not targets["triton <= 3.0 us in a graph, T = 1"]  # T = 1 not measured
    assert not targets["triton <= 30 us in a graph, T = 1024"]  # 5 * 17 = 85 µs
    assert targets["triton >= 4x faster than sglang in a graph, T >= 64"]
    assert targets["norm overhead <= 10 %, every T"]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "hc_head.png"
    assert bench.plot(bench.derive(_rows(), 4.27e12), path)
    assert path.stat().st_size > 0


# vLLM's hc_head as a peer ("vllm", "vllm+norm")


def test_vllm_providers_are_listed_and_selectable():
    assert bench.PEER_PROVIDERS["vllm"] == ("vllm", False)
    assert bench.PEER_PROVIDERS["vllm+norm"] == ("vllm", True)
    assert bench.peer_providers({"vllm": object()}) == ["vllm", "vllm+norm"]
    assert bench.peer_providers({"sglang": object(), "vllm": object()}) == [
        "sglang", "vllm", "vllm+norm"]
    assert bench.peer_providers({}) == []
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args(["--peer", "sglang", "vllm"]).peer == ["sglang", "vllm"]
    vllm = object()
    assert bench.peer_of("vllm+norm", {"vllm": vllm}) is vllm
    assert bench.peer_of("triton", {"vllm": vllm}) is None


def _vllm_modules() -> set[str]:
    return {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}


def test_vllm_peer_is_skipped_in_one_line_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = _vllm_modules()
    assert bench.load_peers(["vllm"]) == {}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm peer: skipped"), lines
    assert _vllm_modules() == before  # nothing of vLLM's was loaded


def test_vllm_peer_is_skipped_in_one_line_without_vllms_source(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(vllm_kernels.SRC_ENV, str(tmp_path))  # a directory with no vllm/ in it
    before = _vllm_modules()
    assert bench.load_peers(["vllm"]) == {}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm peer: skipped"), lines
    assert vllm_kernels.SRC_ENV in lines[0]
    assert _vllm_modules() == before


@pytest.fixture
def vllm_stand_in():
    """vLLM's ``tilelang.py`` executed from its source over stand-in kernels that write what its
    TileLang kernels write (tests/integrations/vllm/standins.py), its modules removed after."""
    if vllm_src() is None:
        pytest.skip("vLLM 0.33.0's source is not unpacked (`make setup`, or set "
                    "DSV4SPEC_VLLM_SRC)")
    from tests.integrations.vllm import standins

    saved = {name: sys.modules.pop(name) for name in _vllm_modules()}
    try:
        yield vllm_kernels.load_vllm_mhc_kernels(kernels=standins.kernels_module())
    finally:
        for name in _vllm_modules():
            del sys.modules[name]
        sys.modules.update(saved)


def test_vllm_providers_run_vllms_hc_head_and_pass_the_float64_refcheck(vllm_stand_in):
    inputs = bench.make_inputs(5, 512, device="cpu", seed=3)
    launches = vllm_stand_in.kernels.impl.launches
    outputs = {}
    for provider in ("vllm", "vllm+norm"):
        fn, ref = bench.setup(provider, inputs, vllm_stand_in)
        assert ref.dtype == torch.float64
        launches.clear()
        out = fn()
        assert launches == ["hc_head"]  # vLLM's kernel ran, once
        assert out.shape == (5, 512) and out.dtype == torch.bfloat16
        bench.refcheck(provider, out, ref)
        with pytest.raises(RuntimeError, match=re.escape(f"refcheck failed for {provider}:")):
            bench.refcheck(provider, (out.float() * 1.05).bfloat16(), ref)
        outputs[provider] = out
    # "+norm": vLLM's output, then the bench's RMSNorm (the model's rms_norm) on it
    norm_weight = inputs[-1]
    expected = rms_norm(outputs["vllm"], norm_weight, bench.EPS["norm_eps"])
    assert torch.equal(outputs["vllm+norm"], expected)


def _rows_with_vllm():
    times = {"vllm": (9.0, 30.0), "vllm+norm": (10.6, 52.0)}
    return _rows() + [{"H": 7168, "T": T, "provider": p, "median_us": g * (1 + T / 64),
                       "eager_us": e * (1 + T / 64),
                       "bytes": bench.bytes_moved(T, 7168, 2, p.endswith("+norm"))}
                      for T in (4, 64, 1024) for p, (g, e) in times.items()]


def test_derive_gives_vllm_over_ours_with_the_same_work():
    rows = bench.derive(_rows_with_vllm(), copy_bw=4.27e12)
    r = {(x["T"], x["provider"]): x for x in rows}
    assert r[4, "vllm"]["vllm_over_triton"] == pytest.approx(9 / 5)
    assert r[4, "vllm"]["vllm_over_triton_eager"] == pytest.approx(30 / 25)
    assert r[64, "vllm+norm"]["vllm_over_triton"] == pytest.approx(10.6 / 5.3)  # over triton+norm
    assert r[64, "vllm+norm"]["vllm_over_triton_eager"] == pytest.approx(52 / 26)
    assert r[4, "vllm+norm"]["speedup_vs_eager"] == pytest.approx(45 / 10.6)
    assert all("vllm_over_triton" not in x for x in rows if not x["provider"].startswith("vllm"))
    # ours is faster than vLLM here, and the targets read no vLLM row
    assert bench.check_targets(rows) == bench.check_targets(bench.derive(_rows(), 4.27e12))


def test_derive_without_ours_leaves_the_vllm_ratios_out():
    rows = [r for r in _rows_with_vllm() if r["provider"] in ("eager", "vllm", "vllm+norm")]
    rows = bench.derive(rows, copy_bw=4.27e12)
    assert all("vllm_over_triton" not in r and "vllm_over_triton_eager" not in r for r in rows)


def test_table_shows_each_peers_columns_only_where_it_ran():
    without = bench.derive(_rows(), copy_bw=4.27e12)
    columns = bench.table_columns(without)
    assert "sglang_over_triton" in columns and "vllm_over_triton" not in columns
    assert "vllm_over_triton_eager" not in columns
    with_vllm = bench.derive(_rows_with_vllm(), copy_bw=4.27e12)
    columns = bench.table_columns(with_vllm)
    assert columns == bench.COLUMNS
    table = common.markdown_table(with_vllm, columns).splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == columns
    cells = {(row[1], row[2]): row for row in
             ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
    at = header.index("vllm_over_triton")
    assert cells["4", "vllm"][at] == "1.8"
    assert cells["4", "triton"][at] == ""  # ours' rows have no vLLM ratio
    only_vllm = [r for r in with_vllm if r["provider"] != "sglang"]
    columns = bench.table_columns(only_vllm)
    assert "vllm_over_triton" in columns and "sglang_over_triton" not in columns
    assert len(common.markdown_table(only_vllm, columns).splitlines()) == 2 + len(only_vllm)
