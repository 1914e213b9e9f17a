"""Timing and kernel counting for any caller: the benchmarks, the demo, scripts and GPU tests.

Method: medians with p20/p80; warm-up before timing. In-graph numbers come from
``triton.testing.do_bench_cudagraph`` (many calls unrolled in one CUDA graph, so the number is the
device time per call with graph launch gaps); eager numbers come from a loop of back-to-back calls
timed by the host clock with one synchronize at the end, so they include the host dispatch cost
that bounds a launch-bound op. How to read them: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence

import torch


def _timing(samples_ms: Sequence[float]) -> dict[str, float]:
    qs = statistics.quantiles(samples_ms, n=10) if len(samples_ms) > 1 else [samples_ms[0]] * 9
    return {
        "median_us": statistics.median(samples_ms) * 1e3,
        "p20_us": qs[1] * 1e3,
        "p80_us": qs[7] * 1e3,
    }


def time_in_graph(fn: Callable[[], object], rep_ms: int = 30) -> dict[str, float]:
    """Device time per call of ``fn`` replayed from a CUDA graph (median, p20, p80 in µs)."""
    from triton.testing import do_bench_cudagraph

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

    A host's speed can drift between modes over seconds (the lent H200's host does);
    interleaving gives each callable the same mix, so ratios between them hold within one run
    even when absolute numbers drift.
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
    from triton.testing import do_bench

    samples = do_bench(fn, warmup=25, rep=100, return_mode="all")
    return _timing(samples)


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
