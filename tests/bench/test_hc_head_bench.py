import pytest

from dsv4spec.bench import hc_head as bench


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
