"""The parts of the docs that the code decides, written by the code: doctor sample blocks and
hook range claims (and, through ``dsv4spec.bench.headline``, the README's headline table).

    python scripts/regen_docs.py          # rewrite them in place
    python scripts/regen_docs.py --check  # compare only: exit 1 naming each stale file

A *sample block* is a fenced block right after a comment naming the command that prints it::

    <!-- dsv4spec doctor --device-name "NVIDIA H200" --capability 9.0 -->
    ```
    $ dsv4spec doctor --device-name "NVIDIA H200" --capability 9.0
    ...
    ```

run as a machine without a GPU and without SGLang or vLLM installed would run it (the packaged
tables only, the user directory shown as ``~/.cache/dsv4spec/tables``); its ``torch`` line is the
machine's that ran it and is not compared.

A *range claim* states where a hook gives calls to dsv4spec, in one form::

    SGLang's `mhc_pre` serves T 1–4, 8, 16 at H 7168 (graph, Triton 3.6)
    vLLM's `mhc_fused_post_pre` serves T 1–16, 21–32 at H 7168 (graph, Triton 3.6, DeepGEMM on)

(``hc_head`` is SGLang's target hc_head, ``dspark_hc_head`` its DSpark draft hc_head; ``serves
no T`` where none); its counts are what the plugin's decision function gives on an H200 under
that Triton stack (the ranges ``dsv4spec doctor`` prints). ``tests/test_docs_generated.py``
checks both.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/doctor.md", "docs/sglang.md", "docs/vllm.md", "docs/tables.md",
        "docs/cli.md"]
USER_DIR = "~/.cache/dsv4spec/tables"
SAMPLE = re.compile(r"^<!-- (dsv4spec doctor[^\n]*?) -->\n```\n(.*?)```$", re.M | re.S)
SPANS = r"(?:no\s+T|T\s+\d+(?:[–-]\d+)?(?:,\s+\d+(?:[–-]\d+)?)*)"
CLAIM = re.compile(rf"(SGLang|vLLM)'s\s+`(\w+)`\s+serves\s+({SPANS})\s+at\s+H\s+(\d+)\s+"
                   rf"\((graph|eager),\s+Triton\s+(\d+\.\d+)(?:,\s+DeepGEMM\s+(on|off))?\)")
# a claim's op -> the doctor's hook name, per engine
HOOKS = {"SGLang": {"mhc_pre": "mHC mhc_pre", "mhc_post": "mHC mhc_post",
                    "mhc_fused_post_pre": "mHC mhc_fused_post_pre", "hc_head": "target hc_head",
                    "dspark_hc_head": "DSpark draft hc_head"},
         "vLLM": {op: op for op in ("hc_head", "mhc_pre", "mhc_post", "mhc_fused_post_pre",
                                    "mhc_fused_post_pre_reuse_residual")}}


@contextlib.contextmanager
def docs_machine() -> Iterator[None]:
    """The machine the samples are written for: no CUDA GPU, neither engine installed, the
    packaged tables only."""
    import torch

    from dsv4spec import doctor
    from dsv4spec.integrations import tables

    with mock.patch.object(torch.cuda, "is_available", lambda: False), \
            mock.patch.object(doctor, "_installed", lambda engine, plugin: (None, None)), \
            mock.patch.object(tables, "user_dir", lambda: Path(USER_DIR)):
        tables.clear_cache()
        try:
            yield
        finally:
            tables.clear_cache()


def run_sample(command: str) -> str:
    """``$ command`` and what it prints on :func:`docs_machine`."""
    from dsv4spec.cli import main

    argv = shlex.split(command)
    if argv[:2] != ["dsv4spec", "doctor"]:
        raise ValueError(f"command: not a dsv4spec doctor command: {command!r}")
    out = io.StringIO()
    with docs_machine(), contextlib.redirect_stdout(out):
        main(argv[1:])
    return f"$ {command}\n{out.getvalue()}"


def comparable(block: str) -> str:
    """A sample block without its torch line (the machine's own)."""
    return "\n".join(line for line in block.splitlines() if not line.startswith("torch "))


def _spans_text(spans: list[list[int]]) -> str:
    if not spans:
        return "no T"
    return "T " + ", ".join(f"{lo}–{hi}" if hi > lo else f"{lo}" for lo, hi in spans)


_reports: dict[str, dict] = {}


def served(engine: str, op: str, H: int, mode: str, stack: str,
           deep_gemm: str | None = None) -> list[list[int]]:
    """The counts a hook gives to dsv4spec on an H200 under ``stack``, as the doctor asks its
    decision function."""
    from dsv4spec import doctor

    if stack not in _reports:
        with docs_machine():
            _reports[stack] = doctor.build_report(
                device_name="NVIDIA H200", capability=(9, 0), triton_stack=stack, numerics=False,
                engines=doctor.engine_versions(["sglang", "vllm==0.34.0"]))
    hooks = {e["name"]: e["hooks"] for e in _reports[stack]["assumed_engines"]}
    try:
        ranges = hooks[engine][HOOKS[engine][op]]["ranges"]
    except KeyError:
        raise ValueError(f"no hook {op!r} of {engine}") from None
    label = f"DeepGEMM {deep_gemm}" if deep_gemm else ""
    if label not in ranges:
        raise ValueError(f"{engine} {op}: the cases are {sorted(ranges)}, not {label!r}")
    return ranges[label][mode].get(str(H), [])


def claim_text(m: re.Match) -> str:
    engine, op, _, H, mode, stack, deep_gemm = m.groups()
    spans = _spans_text(served(engine, op, int(H), mode, stack, deep_gemm))
    return (f"{engine}'s `{op}` serves {spans} at H {H} ({mode}, Triton {stack}"
            + (f", DeepGEMM {deep_gemm}" if deep_gemm else "") + ")")


def regenerated(text: str) -> str:
    """``text`` with every sample block and range claim written by the code."""
    text = SAMPLE.sub(lambda m: f"<!-- {m[1]} -->\n```\n{run_sample(m[1])}```", text)
    # a claim that still holds keeps its line breaks
    return CLAIM.sub(lambda m: m[0] if " ".join(m[0].split()) == claim_text(m)
                     else claim_text(m), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only (exit 1 if stale)")
    args = parser.parse_args(argv)
    stale = []
    for name in DOCS:
        path = ROOT / name
        text = path.read_text()
        new = regenerated(text)
        if (comparable(new) if args.check else new) != (comparable(text) if args.check
                                                          else text):
            stale.append(name)
            if not args.check:
                path.write_text(new)
    from dsv4spec.bench import headline

    status = headline.main(["--check"] if args.check else [])
    for name in stale:
        print(f"{'stale' if args.check else 'wrote'} {name}")
    return 1 if args.check and (stale or status) else 0


if __name__ == "__main__":
    sys.exit(main())
