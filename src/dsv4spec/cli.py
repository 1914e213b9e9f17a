"""The ``dsv4spec`` command: ``demo``, ``generate``, ``train-tiny``, ``tune`` and
``bench <name>``."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import re
import sys
import traceback

from dsv4spec import __version__
from dsv4spec.usage import UsageError, env_switch, triton_hint, use_cpu_threads

# Every command is a module with add_arguments(parser) and main(args) -> exit status; its help
# is the first paragraph of the module's docstring. Only the module of the command asked for is
# imported (all of a table's modules for --help, which reads the docstring from the source of one
# that cannot be imported without Triton). Every command runs dsv4spec's kernels: each needs
# Triton, which a CPU-only torch does not bring.
# command -> module
COMMANDS = {"demo": "dsv4spec.demo", "generate": "dsv4spec.engine.run",
            "train-tiny": "dsv4spec.engine.train_tiny", "tune": "dsv4spec.bench.tune",
            "doctor": "dsv4spec.doctor"}
# bench name -> module under dsv4spec.bench
BENCHMARKS = {"cleanup": "cleanup", "hc-head": "hc_head", "eager-cost": "eager_cost",
              "model-step": "model_step", "e2e": "e2e", "mhc": "mhc", "mhc-sweep": "mhc_sweep",
              "plugin": "plugin", "metadata": "metadata", "vllm": "vllm_plugin",
              "cleanup-sweep": "cleanup_sweep", "hc-head-sweep": "hc_head_sweep",
              "stack": "stack", "dspark": "dspark", "pdl": "pdl"}

EXIT_FAILED = 1  # a failure at run time (the demo: outputs differ from the reference)
EXIT_USAGE = 2  # a bad argument (argparse's convention), `bench` without a CUDA GPU, no Triton
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a Unix tool whose reader went away exits with
EPILOG = (f"exit status: 0 success; {EXIT_FAILED} a failure at run time (the demo: outputs "
          f"differ from the reference); {EXIT_USAGE} a bad argument, `bench` without a CUDA GPU, "
          f"or Triton not installed (one line on stderr, nothing written); {EXIT_INTERRUPTED} "
          f"interrupted. --debug or "
          f"DSV4SPEC_DEBUG=1: tracebacks too")
DEBUG_ENV = "DSV4SPEC_DEBUG"


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line: ``<prog>: error: <message> (see <prog> --help)``."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _CommandParser(_Parser):
    """A command's parser: an argument it does not know is its own error, so the message names
    the command and its help (argparse leaves them to the top-level parser)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def plain(doc: str | None) -> str:
    """A docstring as help text: reStructuredText's literals and roles as plain words."""
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc or "")
    return doc.replace("``", "")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Docstrings as written; every option's default after its help, unless the help says it
    or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default is None
                or action.default is False or action.default is argparse.SUPPRESS
                or action.default in ("", [], ())):
            return text
        default = action.default
        if isinstance(default, (list, tuple)):
            default = " ".join(str(d) for d in default)
        return f"{text} (default: {str(default).replace('%', '%%')})"


def _summary(doc: str | None) -> str:
    """A module docstring's first paragraph without its leading "``dsv4spec name``: "."""
    line = " ".join((doc or "").strip().split("\n\n")[0].split())
    line = line.split("``: ", 1)[1] if line.startswith("``dsv4spec") and "``: " in line else line
    return plain(line)


def _register(sub, table: dict[str, str], chosen: str | None, extra=None) -> None:
    """A subparser per entry of ``table``; imports the module of ``chosen`` only, or every
    module when ``chosen`` is None (help). ``extra(parser)`` adds the table's shared options."""
    for name, module in table.items():
        if chosen is not None and name != chosen:
            sub.add_parser(name)  # listed, not imported
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if chosen is not None or not _is_triton(e):
                raise
            sub.add_parser(name, help=_summary(_source_docstring(module)))  # listed for --help
            continue
        p = sub.add_parser(name, help=_summary(mod.__doc__), description=plain(mod.__doc__),
                           epilog=EPILOG, formatter_class=_Formatter)
        _debug_option(p, argparse.SUPPRESS)
        if extra is not None:
            extra(p)
        mod.add_arguments(p)
        p.set_defaults(run=mod.main)


def _source_docstring(module: str) -> str | None:
    """``module``'s docstring, read from its source without running it."""
    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read()))


def _is_triton(e: ModuleNotFoundError) -> bool:
    return e.name == "triton"


def _no_triton(prog: str) -> int:
    print(f"{prog}: error: Triton is not installed, and this command runs dsv4spec's Triton "
          f"kernels (a CPU-only torch brings no Triton): {triton_hint()}", file=sys.stderr)
    return EXIT_USAGE


def _debug_option(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--debug", action="store_true", default=default,
                   help=f"show the traceback of an error (also: {DEBUG_ENV}=1)")


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="dsv4spec-results",
                   help="results folder, created if absent; files of the same name in it are "
                   "replaced (default: dsv4spec-results in the working directory; the "
                   "repository's committed results are in benchmarks/results/<benchmark>)")
    p.add_argument("--quick", action="store_true", help="fewer shapes, shorter timing")


def _word(argv: list[str], i: int) -> str | None:
    return argv[i] if len(argv) > i and not argv[i].startswith("-") else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: only the module of the command (and benchmark) it names is
    imported; every module when ``argv`` is None (help, tests)."""
    if argv is not None:  # --debug, the one top-level option that lets a command run, may lead
        argv = argv[next((i for i, a in enumerate(argv) if a != "--debug"), len(argv)):]
    command = None if argv is None else _word(argv, 0)
    parser = _Parser(prog="dsv4spec", epilog=EPILOG, formatter_class=_Formatter,
                     description=f"The dsv4spec command: {', '.join(COMMANDS)} and bench <name>.")
    parser.add_argument("--version", action="version", version=f"dsv4spec {__version__}")
    _debug_option(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_CommandParser)
    # None: help, import every command; "" (bench, or a name argparse will refuse): none
    _register(sub, COMMANDS, command if command in COMMANDS or command is None else "")
    bench = sub.add_parser("bench", help="run a benchmark (needs a CUDA GPU)", epilog=EPILOG,
                           formatter_class=_Formatter)
    _debug_option(bench, argparse.SUPPRESS)
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK",
                                     parser_class=_CommandParser)
    chosen = None if argv is None else _word(argv, 1) if command == "bench" else ""
    _register(bench_sub, {k: f"dsv4spec.bench.{m}" for k, m in BENCHMARKS.items()}, chosen,
              _bench_options)
    return parser


class StdoutError(OSError):
    """Standard output refused a write (a full disk, a closed terminal)."""


class _NamedStdout:
    """Standard output whose write errors say it was standard output, and are remembered in
    ``error`` (argparse's --help and --version ignore them)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError as e:
            self.error = e
            raise
        except OSError as e:
            self.error = StdoutError(e.errno, e.strerror)
            raise self.error from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError as e:
            self.error = e
            raise
        except OSError as e:
            self.error = StdoutError(e.errno, e.strerror)
            raise self.error from e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed. argparse's own exits stay SystemExit (--help, --version: 0; a bad
    argument: 2), except that what --help or --version could not write to standard output (a
    full disk, a closed terminal), which argparse ignores, exits 1 with one line on stderr, and
    a reader that left exits 141 quietly."""
    stdout = sys.stdout
    sys.stdout = named = _NamedStdout(stdout)
    try:
        return build_parser(argv).parse_args(argv)
    except SystemExit:
        try:
            named.flush()
        except OSError:
            pass  # in named.error
        if isinstance(named.error, BrokenPipeError):
            _silence(stdout)
            raise SystemExit(EXIT_BROKEN_PIPE) from None
        if named.error is not None:
            _silence(stdout)
            print(f"dsv4spec: error: cannot write to standard output: "
                  f"{named.error.strerror or named.error}", file=sys.stderr)
            raise SystemExit(EXIT_FAILED) from None
        raise
    finally:
        sys.stdout = stdout


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    use_cpu_threads()
    try:
        return _run(argv)
    # before the command ran: importing its modules (torch: a second or so)
    except (KeyboardInterrupt, ModuleNotFoundError) as e:
        if isinstance(e, ModuleNotFoundError) and not _is_triton(e):
            raise
        _traceback("--debug" in argv or env_switch(DEBUG_ENV, False))
        if isinstance(e, KeyboardInterrupt):
            print(f"{_prog_of(argv)}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return _no_triton(_prog_of(argv))


# The commands that run without Triton.
WITHOUT_TRITON = ("doctor",)


def _prog_of(argv: list[str]) -> str:
    """``dsv4spec`` and the command (and benchmark) ``argv`` names, before it is parsed: the
    top-level options take no value, so the first word is the command."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in (*COMMANDS, "bench"):
        return "dsv4spec"
    if words[0] == "bench":
        return "dsv4spec bench" + (f" {words[1]}" if words[1:] and words[1] in BENCHMARKS else "")
    return f"dsv4spec {words[0]}"


def _run(argv: list[str]) -> int:
    args = parse_args(argv)
    prog = f"dsv4spec {args.command}" + (f" {args.bench}" if args.command == "bench" else "")
    debug = args.debug or env_switch(DEBUG_ENV, False)
    # before the command writes anything; doctor reports a missing Triton itself
    if args.command not in WITHOUT_TRITON and importlib.util.find_spec("triton") is None:
        raise ModuleNotFoundError("No module named 'triton'", name="triton")
    if args.command == "bench":
        import torch

        if not torch.cuda.is_available():
            print(f"{prog}: error: bench {args.bench} needs a CUDA GPU (none visible); nothing "
                  f"was written", file=sys.stderr)
            return EXIT_USAGE
    stdout = sys.stdout
    sys.stdout = _NamedStdout(stdout)
    try:
        status = args.run(args)
        sys.stdout.flush()
        return status
    except UsageError as e:
        _traceback(debug)
        print(f"{prog}: error: argument {e.argument}: {_one_line(e)} (see {prog} --help)",
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _traceback(debug)
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence(stdout)  # the reader left (`| head`): stop quietly, as Unix tools do
        return EXIT_BROKEN_PIPE
    except StdoutError as e:
        _silence(stdout)
        _traceback(debug)
        print(f"{prog}: error: cannot write to standard output: {e.strerror or e}",
              file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # noqa: BLE001 - one line for the user; --debug shows the traceback
        _traceback(debug)
        if isinstance(e, ModuleNotFoundError) and _is_triton(e):
            return _no_triton(prog)
        if isinstance(e, MemoryError) or "out of memory" in str(e).lower():
            what = f"out of memory ({_one_line(e)})" if str(e) else "out of memory"
        else:
            what = f"{type(e).__name__}: {_one_line(e)}"
        hint = "" if debug else " (--debug shows the traceback)"
        print(f"{prog}: error: {what}{hint}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        sys.stdout = stdout


def _traceback(debug: bool) -> None:
    if debug:
        traceback.print_exc()


def _silence(stream) -> None:
    """Point ``stream``'s descriptor at /dev/null, so the interpreter's own flush at exit does
    not report the same failure again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 400 else text[:397] + "..."


if __name__ == "__main__":
    raise SystemExit(main())
