"""Shared benchmark plumbing: timing, the launch floor, copy bandwidth, kernel counts, results.

Method (see README "Benchmarks"): medians with p20/p80; warm-up before timing; in-graph numbers
come from ``triton.testing.do_bench_cudagraph`` (many calls unrolled in one CUDA graph, so the
number is the device time per call with graph launch gaps); eager numbers come from a loop of
back-to-back calls timed by the host clock with one synchronize at the end, so they include the
host dispatch cost that bounds a launch-bound op (the same quantity the upstream "eager" rows
measure).
"""

from __future__ import annotations

import datetime
import gc
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import triton
from triton.testing import do_bench, do_bench_cudagraph


def _timing(samples_ms: Sequence[float]) -> dict[str, float]:
    qs = statistics.quantiles(samples_ms, n=10) if len(samples_ms) > 1 else [samples_ms[0]] * 9
    return {
        "median_us": statistics.median(samples_ms) * 1e3,
        "p20_us": qs[1] * 1e3,
        "p80_us": qs[7] * 1e3,
    }


def time_in_graph(fn: Callable[[], object], rep_ms: int = 30) -> dict[str, float]:
    """Device time per call of ``fn`` replayed from a CUDA graph (median, p20, p80 in µs)."""
    samples = do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
    return _timing(samples)


def _calls_for(fn: Callable[[], object], seconds: float) -> int:
    """After a warm-up, how many back-to-back calls of ``fn`` last about ``seconds``."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - start) / 20
    return max(20, min(2000, int(seconds / max(per_call, 1e-7))))


def _wall_ms_per_call(fn: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / calls


def time_eager(fn: Callable[[], object], calls: int | None = None,
               repeats: int = 15) -> dict[str, float]:
    """Host wall time per call of ``calls`` back-to-back eager calls, one sync at the end (µs).

    What an eager caller pays: host dispatch included, device work overlapped with the next
    call's dispatch. Median, p20 and p80 over ``repeats`` loops; ``calls=None`` sizes each loop
    to about 20 ms.
    """
    return time_eager_side_by_side({"fn": fn}, repeats, calls=calls, loop_seconds=0.02)["fn"]


def time_eager_side_by_side(fns: dict[str, Callable[[], object]], repeats: int = 15, *,
                            calls: int | None = None, loop_seconds: float = 0.01
                            ) -> dict[str, dict[str, float]]:
    """:func:`time_eager` for several callables, their loops interleaved repeat by repeat.

    The host's speed drifts between modes over seconds (seen on the lent H200's host: the same
    call at ~25 or ~35-50 µs); interleaving gives each callable the same mix, so ratios between
    them hold within one run even when absolute numbers drift.
    """
    counts = {name: calls or _calls_for(fn, loop_seconds) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a loop would land in one sample (as timeit does)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_wall_ms_per_call(fns[name], counts[name]))
    if gc_was_enabled:
        gc.enable()
    return {name: _timing(v) for name, v in samples.items()}


def time_host(fn: Callable[[], object], calls: int = 64, repeats: int = 25) -> float:
    """Median host time per call (µs) of bursts of ``calls`` calls, no synchronize inside.

    Bursts are short enough that the launch queue never fills, so the device never throttles the
    host: this is the dispatch cost alone (compare with :func:`time_eager`).
    """
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(samples)


def time_device(fn: Callable[[], object]) -> dict[str, float]:
    """Device time of one call with L2 flushed before each (``triton.testing.do_bench``)."""
    samples = do_bench(fn, warmup=25, rep=100, return_mode="all")
    return _timing(samples)


@triton.jit
def _empty_kernel(x_ptr):
    pass


def launch_floor() -> dict[str, float]:
    """The empty Triton kernel: eager per-call time and in-graph device time (µs)."""
    x = torch.empty(1, device="cuda")

    def launch():
        _empty_kernel[(1,)](x)

    return {
        "empty_kernel_eager_us": time_eager(launch)["median_us"],
        "empty_kernel_graph_us": time_in_graph(launch)["median_us"],
    }


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = time_device(lambda: dst.copy_(src))["median_us"] / 1e3
    return 2 * nbytes / (ms * 1e-3)


def count_kernels(fn: Callable[[], object]) -> int:
    """Number of device kernels one call of ``fn`` launches (torch profiler, after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [
        e for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower()
        and "memset" not in e.name.lower()
    ]
    return len(kernels)


def environment() -> dict[str, str]:
    """Device, library versions, date and the command line: stored with every result."""
    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {
        "device": torch.cuda.get_device_name(0) if props else "cpu",
        "sm_count": str(props.multi_processor_count) if props else "",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in ["dsv4spec", *sys.argv[1:]]),
    }


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_results(
    out_dir: str | Path, name: str, payload: dict, rows: Sequence[dict], columns: Sequence[str],
    notes: str = "",
) -> list[Path]:
    """Write ``<name>.json`` (payload + rows) and ``<name>.md`` (environment + table)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = payload.get("environment", {})
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps({**payload, "rows": list(rows)}, indent=1))
    md = [f"# {name}", ""]
    md += [f"- {k}: `{v}`" for k, v in env.items()]
    if notes:
        md += ["", notes]
    md += ["", markdown_table(rows, columns), ""]
    md_path = out / f"{name}.md"
    md_path.write_text("\n".join(md))
    return [json_path, md_path]


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib (extra ``bench``) is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def print_table(rows: Sequence[dict], columns: Sequence[str]) -> None:
    print(markdown_table(rows, columns), flush=True)


def sglang_peer(relpath: str):
    """SGLang's own kernel file ``sglang/<relpath>``, loaded by path (never imported as a
    package), or None with a message when SGLang's source is not found."""
    from dsv4spec.integrations.sglang.source import load_sglang_module

    try:
        return load_sglang_module(relpath)
    except (FileNotFoundError, ImportError) as err:
        print(f"--peer sglang: skipped, SGLang 0.5.23's source not found ({err}); install the "
              "wheel (pip install --no-deps sglang==0.5.23) or set DSV4SPEC_SGLANG_ROOT")
        return None
