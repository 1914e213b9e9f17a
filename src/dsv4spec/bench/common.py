"""Benchmark plumbing on top of :mod:`dsv4spec.timing`: the launch floor, copy bandwidth, the
environment stored with every result, result files and SGLang's own kernels as peers.

Timing and kernel counting live in :mod:`dsv4spec.timing` and plotting in :mod:`dsv4spec.plot`
(the demo and scripts use them without importing the benchmarks); they are re-exported here for
the benchmark modules. How to run and read the results: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import datetime
import json
import platform
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import triton

from dsv4spec.plot import pyplot
from dsv4spec.timing import (
    count_kernels,
    time_device,
    time_eager,
    time_eager_side_by_side,
    time_host,
    time_in_graph,
)

__all__ = [
    "copy_bandwidth", "count_kernels", "environment", "launch_floor", "markdown_table",
    "print_table", "pyplot", "sglang_peer", "time_device", "time_eager", "time_eager_side_by_side",
    "time_host", "time_in_graph", "write_results",
]


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
