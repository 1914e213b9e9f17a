"""The ``dsv4spec`` command: ``demo``, ``generate``, ``train-tiny`` and ``bench <name>``."""

from __future__ import annotations

import argparse
import importlib
import sys

# Every command is a module with add_arguments(parser) and main(args) -> exit status; its help
# is the first paragraph of the module's docstring. Only the module of the command asked for is
# imported (all of a table's modules for --help).
# command -> module
COMMANDS = {"demo": "dsv4spec.demo", "generate": "dsv4spec.engine.run",
            "train-tiny": "dsv4spec.engine.train_tiny"}
# bench name -> module under dsv4spec.bench
BENCHMARKS = {"cleanup": "cleanup", "hc-head": "hc_head", "eager-cost": "eager_cost",
              "model-step": "model_step", "e2e": "e2e", "mhc": "mhc",
              "plugin": "plugin"}

EXIT_FAILED = 1  # a run whose outputs differ from the reference (the demo's comparison)
EXIT_USAGE = 2  # bad arguments, or a benchmark without a CUDA GPU
EPILOG = (f"exit status: 0 success; {EXIT_FAILED} outputs differ from the reference; "
          f"{EXIT_USAGE} bad arguments, or `bench` without a CUDA GPU (nothing is written then)")


def _summary(module) -> str:
    """The docstring's first paragraph without its leading "``dsv4spec name``: "."""
    line = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
    return line.split("``: ", 1)[1] if line.startswith("``dsv4spec") and "``: " in line else line


def _register(sub, table: dict[str, str], chosen: str | None, extra=None) -> None:
    """A subparser per entry of ``table``; imports the module of ``chosen`` only, or every
    module when ``chosen`` is None (help). ``extra(parser)`` adds the table's shared options."""
    for name, module in table.items():
        if chosen is not None and name != chosen:
            sub.add_parser(name)  # listed, not imported
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=_summary(mod), description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if extra is not None:
            extra(p)
        mod.add_arguments(p)
        p.set_defaults(run=mod.main)


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="benchmarks/results", help="results folder")
    p.add_argument("--quick", action="store_true", help="fewer shapes, shorter timing")


def _word(argv: list[str], i: int) -> str | None:
    return argv[i] if len(argv) > i and not argv[i].startswith("-") else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = _word(argv, 0)
    parser = argparse.ArgumentParser(prog="dsv4spec", description=__doc__, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    # None: help, import every command; "" (bench, or a name argparse will refuse): none
    _register(sub, COMMANDS, command if command in COMMANDS or command is None else "")
    bench = sub.add_parser("bench", help="run a benchmark (needs a CUDA GPU)", epilog=EPILOG)
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    chosen = _word(argv, 1) if command == "bench" else ""
    _register(bench_sub, {k: f"dsv4spec.bench.{m}" for k, m in BENCHMARKS.items()}, chosen,
              _bench_options)
    args = parser.parse_args(argv)
    if args.command == "bench":
        import torch

        if not torch.cuda.is_available():
            print(f"bench {args.bench} needs a CUDA GPU")
            return EXIT_USAGE
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
