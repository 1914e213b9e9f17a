"""The ``dsv4spec`` command: ``demo``, ``generate``, ``train-tiny`` and ``bench <name>``."""

from __future__ import annotations

import argparse
import importlib
import sys

# bench name -> module under dsv4spec.bench; each module has add_arguments(parser) and main(args).
BENCHMARKS = {"cleanup": "cleanup", "hc-head": "hc_head", "eager-cost": "eager_cost",
              "model-step": "model_step", "e2e": "e2e", "mhc": "mhc"}
# command -> module with add_arguments(parser) and main(args)
COMMANDS = {"generate": ("dsv4spec.engine.run", "generate text with the reference model, with "
                         "or without MTP speculative decoding"),
            "train-tiny": ("dsv4spec.engine.train_tiny", "train the tiny model and its MTP "
                           "block on the Python standard library's source (CPU, minutes)")}


def argv_command(argv: list[str] | None) -> str | None:
    """The subcommand named on the command line (None when asking for help)."""
    argv = sys.argv[1:] if argv is None else argv
    return argv[0] if argv and not argv[0].startswith("-") else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsv4spec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the C128 rollback on a reference pool and time it")
    demo.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if argv_command(argv) in (name, None):
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(run=mod.main)
    bench = sub.add_parser("bench", help="run a benchmark (needs a CUDA GPU)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    argv = sys.argv[1:] if argv is None else argv
    # Import only the benchmark asked for (all of them for --help).
    chosen = [argv[1]] if len(argv) > 1 and argv[0] == "bench" and argv[1] in BENCHMARKS else None
    if argv[:1] == ["demo"]:
        chosen = []
    for name, module in BENCHMARKS.items():
        if chosen is not None and name not in chosen:
            continue
        mod = importlib.import_module(f"dsv4spec.bench.{module}")
        p = bench_sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--out", default="benchmarks/results", help="results folder")
        p.add_argument("--quick", action="store_true", help="fewer shapes, shorter timing")
        mod.add_arguments(p)
        p.set_defaults(run=mod.main)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dsv4spec.demo import run_demo

        return run_demo(args.device)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
