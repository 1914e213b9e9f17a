"""Hardware counters of the mHC launches, ours beside the engines' DeepGEMM path, at decode and
verify sizes: what bounds each kernel (Nsight Compute on one call after warm-up).

    PYTHONPATH=src python3 scripts/mhc_ncu.py OUT_DIR [--tokens 16 32 64 256] [--widths 7168]
        [--ops pre post_pre] [--providers ours vllm sglang] [--variants default tok64 ...]

One ncu process per case (op, H, T, provider, and for ours a tiling variant): the case runs
three warm-up calls outside the profiled range (``--profile-from-start off``) and one call
inside it, so that every kernel of one call is profiled once; ``--clock-control none`` (the
GPU's clocks stay as they are) and ncu's default cache control (caches flushed before each
kernel: DSV4's ``fn`` is another tensor per layer, so cold is its usual state). Each case's report
is kept as ``OUT_DIR/ncu/<case>.ncu-rep`` (``ncu --import`` it for the source and details
pages), and per kernel the metrics of :data:`METRICS` go to ``OUT_DIR/mhc_ncu.json`` and
``.md`` as they come. Under ncu kernels run one at a time, so programmatic dependent launches do
not overlap: the durations are per kernel, not the op's time in a CUDA graph (``bench mhc``).

The engines' peers need what ``scripts/deepgemm_gpu.sh`` sets up (its ``ncu`` step runs this
program): ``deep_gemm``, TileLang and the engines' source on PYTHONPATH. A peer that cannot load
is skipped with a line saying why. ``--dry-run`` prints the ncu command of every case and runs
nothing (no GPU needed).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time

# name -> overrides of our planner ({}: its defaults). The tensor-core partials with tokens as
# rows (tok) and rows (t, i) (ti), the CUDA-core partials with 8-token blocks and the TMA
# prototype (tma), beside the plan, at the sizes where DeepGEMM's path is faster
# (benchmarks/results/deepgemm_h200/README.md)
VARIANTS = {
    "default": {},
    "tok64": {"mma": True, "token_rows": True, "block_t": 64, "block_k": 32, "warps": (4, 1),
              "stages": 3, "presplit": False},
    "ti16": {"mma": True, "token_rows": False, "block_t": 16, "block_k": 64, "warps": (4, 1),
             "num_splits": 112},
    "cuda8": {"mma": False, "block_t": 8, "block_k": 64},
    # the TMA partials of scripts/mhc_tma_ab.py (a prototype): one of its TILINGS
    "tma16": {"tma": "tma t64 k16 c4 s4 w8"},
    "tma32": {"tma": "tma t64 k32 c2 s2 w8"},
}

# ncu sections (stable identifiers) whose metrics the report keeps, and the metrics each kernel's
# row takes from them (missing ones are left out of the row)
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis",
            "ComputeWorkloadAnalysis", "WarpStateStats", "SchedulerStats")
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
                 "sm__inst_executed.sum")
METRICS = {
    "us": "gpu__time_duration.sum",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "registers": "launch__registers_per_thread",
    "smem_dynamic": "launch__shared_mem_per_block_dynamic",
    "smem_static": "launch__shared_mem_per_block_static",
    "waves": "launch__waves_per_multiprocessor",
    "occupancy_limit_registers": "launch__occupancy_limit_registers",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "l2_bytes": "lts__t_bytes.sum",
    "instructions": "sm__inst_executed.sum",
    "issue_active_pct": "sm__inst_issued.avg.pct_of_peak_sustained_active",
}
# warp stall reasons, cycles per issued instruction (WarpStateStats; either spelling)
STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)"
                   r"(?:_per_issue_active)?\.ratio$")
# ncu reports these units; the rows hold µs and bytes
# time in µs; ncu names units both ways across releases ("nsecond" and "ns")
_TIME_SCALE = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
               "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_SCALE = {**_TIME_SCALE, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "B": 1,
          "KB": 1e3, "MB": 1e6, "GB": 1e9}
_TIME_UNITS = tuple(_TIME_SCALE)


def case_name(op: str, H: int, T: int, provider: str, variant: str) -> str:
    return f"{op}_H{H}_T{T}_{provider}" + (f"_{variant}" if provider == "ours" else "")


def ncu_command(ncu: str, report: str, driver: list[str], sections=SECTIONS,
                metrics=EXTRA_METRICS) -> list[str]:
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--target-processes",
           "all", "--force-overwrite", "--export", report]
    for s in sections:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return cmd + driver


def missing_metrics(stderr: str) -> set[str]:
    """The metric names ncu says it cannot find (it then profiles nothing)."""
    return set(re.findall(r"Failed to find metric (?:regex:\^?)?([\w.]+?)\$?(?:\s|$)", stderr))


def _number(value: str, unit: str) -> float | None:
    try:
        v = float(value.replace(",", ""))
    except ValueError:
        return None
    return v * _SCALE.get(unit, 1)


def parse_raw_csv(text: str) -> list[dict]:
    """``ncu --import R --csv --page raw``: a header row of metric names, a row of units, then a
    row per profiled kernel -> a dict per kernel: name, the :data:`METRICS` found (µs, bytes, as
    ncu counts the rest) and ``stalls`` (reason -> cycles per issued instruction, largest
    first)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2:
        return []
    header, units, kernels = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    out = []
    for values in kernels:
        if len(values) != len(header):
            continue
        kernel = {"kernel": values[col["Kernel Name"]] if "Kernel Name" in col else "?"}
        for key, metric in METRICS.items():
            if metric in col:
                i = col[metric]
                unit = units[i]
                v = _number(values[i], unit)
                if v is not None and key == "us" and unit not in _TIME_UNITS:
                    v = None  # a time in another unit than expected: not guessed, but named
                    kernel["us_unit_unknown"] = unit
                if v is not None:
                    kernel[key] = round(v, 3) if isinstance(v, float) else v
        stalls = {}
        for name, i in col.items():
            match = STALL.match(name)
            if match:
                v = _number(values[i], units[i])
                if v:
                    stalls[match[1]] = round(v, 2)
        kernel["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
        out.append(kernel)
    return out


def markdown(record: dict) -> str:
    env = record["environment"]
    lines = [
        "# mHC launches under Nsight Compute",
        "",
        f"- device: {env.get('device')}, torch {env.get('torch')}, Triton {env.get('triton')}, "
        f"ncu {env.get('ncu')}; {env.get('date')}",
        "- program: `scripts/mhc_ncu.py` (one call after three warm-up calls, per kernel; "
        "kernels serialised, caches flushed before each: not a CUDA graph's time)",
        "",
        "| case | kernel | µs | grid x block | regs | occupancy % | SM % | memory % | DRAM MB "
        "| L2 MB | top stalls (cycles per instruction) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in record["cases"]:
        if "error" in case:
            lines.append(f"| {case['case']} | {case['error'][:120]} | | | | | | | | | |")
            continue
        for k in case["kernels"]:
            dram = (k.get("dram_read", 0) + k.get("dram_write", 0)) / 1e6
            stalls = ", ".join(f"{r} {v}" for r, v in list(k.get("stalls", {}).items())[:3])
            lines.append(
                f"| {case['case']} | {k['kernel'][:48]} | {k.get('us', '')} | "
                f"{k.get('grid', '')} x {k.get('block', '')} | {k.get('registers', '')} | "
                f"{k.get('achieved_occupancy_pct', '')} | {k.get('sm_pct', '')} | "
                f"{k.get('memory_pct', '')} | {dram:.2f} | "
                f"{k.get('l2_bytes', 0) / 1e6:.2f} | {stalls} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The driver: one case, warm-up outside the profiled range, one call inside


def _provider_call(op: str, H: int, T: int, provider: str, variant: str):
    from dsv4spec.bench import deepgemm, sglang_mhc, vllm_kernels
    from dsv4spec.bench import mhc as bench_mhc
    from dsv4spec.kernels import mhc as K

    inp = bench_mhc.make_inputs(T, H, seed=1000 * H + T)
    if provider == "ours":
        ov = VARIANTS[variant]
        if "tma" in ov:  # launch 1 from the prototype, the library's finalize after it
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import mhc_tma_ab

            boundary = None if op == "pre" else (inp["f"], inp["post"], inp["comb"])
            return mhc_tma_ab.TmaOp(inp["residual"], inp["fn"], inp["scale"], inp["base"],
                                    inp["norm_weight"], mhc_tma_ab.TILINGS[ov["tma"]],
                                    K.num_sms(inp["residual"].get_device()), boundary)
        args = (inp["fn"], inp["scale"], inp["base"], bench_mhc.RMS_EPS, bench_mhc.HC_EPS,
                bench_mhc.SINKHORN_ITERS, bench_mhc.POST_MULT, inp["norm_weight"],
                bench_mhc.NORM_EPS)
        if op == "pre":
            return lambda: K.mhc_pre_triton(inp["residual"], *args, **ov)
        return lambda: K.mhc_post_pre_triton(inp["f"], inp["residual"], inp["post"],
                                             inp["comb"], *args, **ov)
    dg = deepgemm.resolve("on", provider)
    if provider == "vllm":
        peer = vllm_kernels.vllm_mhc_peer(dg)
        make = bench_mhc.vllm_provider
    else:
        peer = sglang_mhc.sglang_mhc_peer(dg)
        make = bench_mhc.sglang_provider
    if peer is None:
        raise RuntimeError(f"{provider}'s mHC kernels could not be loaded")
    return make(peer, op, inp, True)


def drive(op: str, H: int, T: int, provider: str, variant: str) -> None:
    import torch

    call = _provider_call(op, H, T, provider, variant)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


# ---------------------------------------------------------------------------------------------


def _environment(ncu: str) -> dict:
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import torch
        import triton
        env.update(torch=torch.__version__, triton=triton.__version__,
                   device=torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
    except Exception as err:  # noqa: BLE001 - the record says what could not be read
        env["error"] = repr(err)
    try:
        env["ncu"] = subprocess.run([ncu, "--version"], capture_output=True, text=True,
                                    timeout=60).stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError) as err:
        env["ncu"] = f"not run: {err}"
    return env


def profile(ncu: str, out_dir: str, name: str, driver: list[str]) -> dict:
    """Run one case under ncu (retrying without metrics it does not know), read its report."""
    os.makedirs(os.path.join(out_dir, "ncu"), exist_ok=True)
    report = os.path.join(out_dir, "ncu", name)
    metrics = list(EXTRA_METRICS)
    for _ in range(3):
        res = subprocess.run(ncu_command(ncu, report, driver, metrics=metrics),
                             capture_output=True, text=True, timeout=300)
        gone = missing_metrics(res.stderr + res.stdout)
        if res.returncode == 0 or not gone:
            break
        metrics = [m for m in metrics if m not in gone]
    with open(report + ".log", "w") as fh:
        fh.write(res.stdout[-20000:] + res.stderr[-20000:])
    if res.returncode != 0:
        return {"case": name, "error": f"ncu exited {res.returncode}: "
                + (res.stderr or res.stdout).strip().splitlines()[-1][-300:]}
    raw = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", "raw",
                          "--print-units", "base"],
                         capture_output=True, text=True, timeout=300)
    kernels = parse_raw_csv(raw.stdout)
    if not kernels:
        return {"case": name, "error": "no kernel profiled: " + raw.stderr.strip()[-300:]}
    return {"case": name, "kernels": kernels}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    # the sizes where DeepGEMM's path is faster first, so that a time limit cuts the rest
    p.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 16])
    p.add_argument("--widths", type=int, nargs="+", default=[7168])
    p.add_argument("--ops", nargs="+", default=["pre", "post_pre"], choices=["pre", "post_pre"])
    p.add_argument("--providers", nargs="+", default=["ours", "vllm"],
                   choices=["ours", "vllm", "sglang"])
    p.add_argument("--variants", nargs="+", default=["default", "tok64", "ti16", "tma16", "tma32"],
                   choices=list(VARIANTS))
    p.add_argument("--seconds", type=float, default=None,
                   help="start no case after this many seconds (the rest are listed as skipped)")
    p.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    p.add_argument("--dry-run", action="store_true", help="print the ncu commands, run nothing")
    p.add_argument("--case", help=argparse.SUPPRESS)  # the driver: op,H,T,provider,variant
    a = p.parse_args(argv)
    if a.case:
        op, H, T, provider, variant = a.case.split(",")
        drive(op, int(H), int(T), provider, variant)
        return 0
    if not a.out:
        p.error("OUT_DIR is required")
    cases = []
    for T in a.tokens:
        for op in a.ops:
            for H in a.widths:
                for provider in a.providers:
                    for variant in (a.variants if provider == "ours" else ["-"]):
                        cases.append((op, H, T, provider, variant))
    record = {"environment": {} if a.dry_run else _environment(a.ncu), "cases": []}
    start = time.monotonic()
    for op, H, T, provider, variant in cases:
        name = case_name(op, H, T, provider, variant)
        driver = [sys.executable, os.path.abspath(__file__), "--case",
                  f"{op},{H},{T},{provider},{variant}"]
        if a.dry_run:
            print(shlex.join(ncu_command(a.ncu, os.path.join(a.out, "ncu", name), driver)))
            continue
        if a.seconds is not None and time.monotonic() - start > a.seconds:
            result = {"case": name, "error": "skipped: past --seconds"}
        else:
            result = profile(a.ncu, a.out, name, driver)
        print(json.dumps(result), flush=True)
        record["cases"].append(result)
        with open(os.path.join(a.out, "mhc_ncu.json"), "w") as fh:
            json.dump(record, fh, indent=1)
        with open(os.path.join(a.out, "mhc_ncu.md"), "w") as fh:
            fh.write(markdown(record))
    return 0 if a.dry_run or all("error" not in c for c in record["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
