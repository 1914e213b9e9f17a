"""Every mistake a user can make on the command line: the exit status (2: a bad argument; 1: a
failure at run time), one line on stderr that names the argument, no traceback, nothing written.

The mistakes users reported run through the real command in a subprocess (``python -m
dsv4spec``, about 2 s each for torch's import); the rest of argparse's own refusals run in this
process through ``main``, the same code without the process around it."""

import argparse
import errno
import io
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsv4spec.cli import build_parser, main
from dsv4spec.engine.generate import MAX_NUM_DRAFT_TOKENS
from dsv4spec.engine.run import needed_bytes
from dsv4spec.model.build import TINY_CHECKPOINT, build_model
from dsv4spec.model.config import preset

CUDA = torch.cuda.is_available()
GEN = ["generate", "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu"]


def bad_checkpoints(folder):
    """name -> path of each kind of checkpoint `generate --checkpoint` must refuse."""
    tensors = load_file(str(TINY_CHECKPOINT))
    paths = {"missing file": folder / "nosuch.safetensors", "directory": folder / "dir"}
    paths["directory"].mkdir()
    (folder / "random.safetensors").write_bytes(os.urandom(4096))
    (folder / "text.safetensors").write_text("not a checkpoint\n" * 50)
    (folder / "empty.safetensors").write_bytes(b"")
    raw = TINY_CHECKPOINT.read_bytes()
    (folder / "truncated.safetensors").write_bytes(raw[:len(raw) // 2])
    for name in ("random", "text", "empty", "truncated"):
        paths[name] = folder / f"{name}.safetensors"
    edits = {
        "missing tensor": lambda t: t.pop("embed.weight"),
        "unexpected tensor": lambda t: t.update({"extra.weight": torch.zeros(2)}),
        "wrong shape": lambda t: t.update({"norm.weight": torch.zeros(3)}),
        "wrong dtype": lambda t: t.update({"norm.weight": torch.zeros(64, dtype=torch.int32)}),
    }
    for name, edit in edits.items():
        edited = dict(tensors)
        edit(edited)
        paths[name] = folder / f"{name.replace(' ', '_')}.safetensors"
        save_file(edited, str(paths[name]))
    return paths


def cases(folder):
    """(id, argv, exit status, text the one line must contain); ids in IN_PROCESS run through
    ``main`` in this process, the others in a subprocess."""
    out = []
    fifo = folder / "fifo.safetensors"
    os.mkfifo(fifo)
    for name, path in bad_checkpoints(folder).items():
        out.append((f"checkpoint: {name}", [*GEN, "--checkpoint", str(path)], 2,
                    f"argument --checkpoint: checkpoint {path}"))
    out.append(("checkpoint of another preset",
                ["generate", "--prompt", "x", "--preset", "flash-shape", "--device", "cpu",
                 "--checkpoint", str(TINY_CHECKPOINT)], 2, "argument --checkpoint: checkpoint"))
    for value in ("0", "-1", "1.5"):
        out.append((f"max-new-tokens {value}", [*GEN[:3], "--max-new-tokens", value], 2,
                    "argument --max-new-tokens: must be an integer >= 1"))
    out.append(("max-new-tokens past the context", [*GEN[:3], "--max-new-tokens", "100000000"],
                2, "argument --max-new-tokens: must be <= "))
    many = [a for _ in range(32) for a in ("--prompt", "x")]
    out.append(("memory it cannot fit", ["generate", *many, "--preset", "pro-shape",
                                         "--max-new-tokens", "1000000", "--device", "cpu"],
                2, "argument --max-new-tokens: 1000000 new tokens"))
    for value in ("0", "1", "-3", str(MAX_NUM_DRAFT_TOKENS + 1), "100"):
        out.append((f"num-draft-tokens {value}", [*GEN, "--num-draft-tokens", value], 2,
                    f"argument --num-draft-tokens: must be an integer in [2, "
                    f"{MAX_NUM_DRAFT_TOKENS}]"))
    out += [
        ("empty prompt", ["generate", "--prompt", "", "--device", "cpu"], 2,
         "argument --prompt: must not be empty"),
        ("a lone surrogate in the prompt", [*GEN[:1], "--prompt", "a\ud800b"], 2,
         "argument --prompt: holds '\\ud800', a lone surrogate"),
        ("prompt file missing", [*GEN[:1], "--prompt-file", str(folder / "nosuch.txt")], 2,
         f"argument --prompt-file: cannot read {folder / 'nosuch.txt'}: No such file"),
        ("prompt file empty", [*GEN[:1], "--prompt-file", str(folder / "empty.safetensors")],
         2, f"argument --prompt-file: {folder / 'empty.safetensors'} is empty"),
        ("no-spec with the default draft tokens", [*GEN, "--no-spec", "--num-draft-tokens", "4"],
         2, "argument --no-spec: not allowed with argument --num-draft-tokens"),
        ("checkpoint empty", [*GEN, "--checkpoint", ""], 2,
         "argument --checkpoint: must not be empty"),
        ("no prompt", ["generate"], 2, "--prompt"),
        ("draft tokens and no-spec", [*GEN, "--num-draft-tokens", "3", "--no-spec"], 2,
         "argument --no-spec: not allowed with argument --num-draft-tokens"),
        ("preset nosuch", [*GEN, "--preset", "nosuch"], 2,
         "argument --preset: invalid choice: 'nosuch' (choose from 'tiny', 'flash-shape', "
         "'pro-shape')"),
        ("dtype nosuch", [*GEN, "--dtype", "float8"], 2, "argument --dtype: invalid choice"),
        ("device tpu", [*GEN[:-2], "--device", "tpu"], 2,
         "argument --device: must be cpu, cuda or cuda:N, got 'tpu'"),
        ("demo device tpu", ["demo", "--device", "tpu"], 2, "argument --device: must be cpu"),
        ("train-tiny steps 0", ["train-tiny", "--steps", "0"], 2,
         "argument --steps: must be an integer >= 1, got 0"),
        ("train-tiny steps -5", ["train-tiny", "--steps", "-5"], 2, "argument --steps:"),
        ("train-tiny batch-size 0", ["train-tiny", "--batch-size", "0"], 2,
         "argument --batch-size: must be an integer >= 1"),
        ("train-tiny lr 0", ["train-tiny", "--lr", "0"], 2, "argument --lr: must be a number > 0"),
        ("train-tiny out is a directory", ["train-tiny", "--steps", "1", "--out", str(folder)],
         2, f"argument --out: {folder} is a directory"),
        ("train-tiny out exists", ["train-tiny", "--steps", "1", "--out",
                                   str(folder / "text.safetensors")], 2,
         "argument --out: " + str(folder / "text.safetensors") + " exists; pass --force"),
        # a rename onto a node replaces the node: with --force too, only a regular file is
        # replaced (a device is tried without --force only: as root a regression would replace
        # /dev/null)
        ("train-tiny out is a FIFO", ["train-tiny", "--steps", "1", "--out", str(fifo)], 2,
         f"argument --out: {fifo} is not a regular file"),
        ("train-tiny out is a FIFO, with --force", ["train-tiny", "--steps", "1", "--force",
                                                    "--out", str(fifo)], 2,
         f"argument --out: {fifo} is not a regular file"),
        ("train-tiny out is a device", ["train-tiny", "--steps", "1", "--out", os.devnull], 2,
         f"argument --out: {os.devnull} is not a regular file"),
        ("unknown command", ["nosuch"], 2, "argument COMMAND: invalid choice: 'nosuch'"),
        ("no command", [], 2, "the following arguments are required: COMMAND"),
        ("unknown benchmark", ["bench", "nosuch"], 2, "argument BENCHMARK: invalid choice"),
        # the command's own parser refuses what it does not know, naming the command
        ("unknown option", ["generate", "--prompt", "x", "--nosuch"], 2,
         "dsv4spec generate: error: unrecognized arguments: --nosuch (see dsv4spec generate "
         "--help)"),
        ("a short option generate lacks", ["generate", "-p", "hi"], 2,
         "dsv4spec generate: error: unrecognized arguments: -p hi (see dsv4spec generate "
         "--help)"),
        ("unknown benchmark option", ["bench", "cleanup", "--nosuch"], 2,
         "dsv4spec bench cleanup: error: unrecognized arguments: --nosuch"),
    ]
    if not CUDA:
        out += [
            ("device cuda without CUDA", [*GEN[:-2], "--device", "cuda"], 2,
             "argument --device: cuda asked for, but"),
            ("demo device cuda without CUDA", ["demo", "--device", "cuda"], 2,
             "argument --device: cuda asked for"),
            ("cuda-graphs without CUDA", [*GEN[:-2], "--cuda-graphs"], 2,
             "argument --cuda-graphs: needs a CUDA device"),
            ("triton hc_head without CUDA", [*GEN, "--draft-hc-head-impl", "triton"], 2,
             "argument --draft-hc-head-impl: triton needs a CUDA device"),
            ("bench without CUDA", ["bench", "cleanup", "--quick"], 2,
             "bench cleanup needs a CUDA GPU"),
        ]
    return out


IN_PROCESS = {"max-new-tokens 1.5", "num-draft-tokens 0", f"num-draft-tokens "
              f"{MAX_NUM_DRAFT_TOKENS + 1}", "no prompt", "draft tokens and no-spec",
              "dtype nosuch", "demo device tpu", "train-tiny steps -5", "train-tiny batch-size 0",
              "train-tiny lr 0", "train-tiny out is a directory", "train-tiny out is a FIFO",
              "train-tiny out is a FIFO, with --force", "train-tiny out is a device",
              "unknown command",
              "no command", "unknown benchmark", "unknown option", "a short option generate lacks",
              "unknown benchmark option", "demo device cuda without CUDA",
              "checkpoint: truncated", "checkpoint: unexpected tensor",
              "a lone surrogate in the prompt", "prompt file missing", "prompt file empty",
              "no-spec with the default draft tokens", "checkpoint empty"}


def run_cli(argv, cwd, env=None):
    env = {**os.environ, **(env or {})}
    env.pop("TRITON_INTERPRET", None)  # a user's shell: no interpreter unless asked for
    return subprocess.run([sys.executable, "-m", "dsv4spec", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def run_in_process(argv, capsys):
    try:
        status = main(argv)
    except SystemExit as e:  # argparse
        status = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, out.out, out.err)


def test_every_bad_input_gets_one_line_naming_the_argument(tmp_path, monkeypatch, capsys):
    inputs, cwd = tmp_path / "inputs", tmp_path / "cwd"
    inputs.mkdir()
    cwd.mkdir()
    table = cases(inputs)
    assert {n for n in IN_PROCESS if "CUDA" not in n} <= {case[0] for case in table}
    before = {p: p.stat().st_mtime_ns for p in inputs.rglob("*")}
    packaged = {p: p.stat().st_mtime_ns for p in TINY_CHECKPOINT.parent.iterdir()}
    results = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {case[0]: pool.submit(run_cli, case[1], cwd) for case in table
                   if case[0] not in IN_PROCESS}
        monkeypatch.chdir(cwd)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        for name, argv, _, _ in table:
            if name in IN_PROCESS:
                results[name] = run_in_process(argv, capsys)
        results.update({name: f.result() for name, f in futures.items()})
    problems = []
    for name, argv, status, text in table:
        res = results[name]
        err = res.stderr.strip()
        if (res.returncode != status or "\n" in err or text not in err or "Traceback" in err
                or res.stdout.strip()):
            problems.append(f"{name}: {argv}\n  exit {res.returncode}, stdout "
                            f"{res.stdout[-300:]!r}\n  stderr {res.stderr[-1500:]!r}")
    assert not problems, "\n".join(problems)
    assert list(cwd.iterdir()) == [], "a refused command wrote into the working directory"
    assert {p: p.stat().st_mtime_ns for p in inputs.rglob("*")} == before
    assert {p: p.stat().st_mtime_ns for p in TINY_CHECKPOINT.parent.iterdir()} == packaged


def test_failures_at_run_time_are_one_line_with_status_1_and_debug_shows_the_traceback(
        monkeypatch, capsys):
    import dsv4spec.engine.run as run

    def boom(args):
        raise RuntimeError("the kernel failed\nsecond line of detail")

    monkeypatch.setattr(run, "main", boom)
    monkeypatch.delenv("DSV4SPEC_DEBUG", raising=False)
    assert main(["generate", "--prompt", "x"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("dsv4spec generate: error: RuntimeError: the kernel failed second line of "
                   "detail (--debug shows the traceback)")
    for argv, env in ((["--debug", "generate", "--prompt", "x"], None),
                      (["generate", "--prompt", "x", "--debug"], None),
                      (["generate", "--prompt", "x"], "1"), (["generate", "--prompt", "x"], "yes"),
                      (["generate", "--prompt", "x"], "TRUE")):
        if env:
            monkeypatch.setenv("DSV4SPEC_DEBUG", env)
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback" in err and "in boom" in err, err
        assert err.strip().splitlines()[-1] == ("dsv4spec generate: error: RuntimeError: the "
                                                "kernel failed second line of detail")
    for off in ("0", "false", "no", "off", "N", ""):
        monkeypatch.setenv("DSV4SPEC_DEBUG", off)
        assert main(["generate", "--prompt", "x"]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1, (off, err)


def test_a_switch_value_that_is_neither_on_nor_off_is_named_in_a_warning_and_is_off(
        monkeypatch, caplog):
    from dsv4spec.usage import env_switch

    monkeypatch.setenv("DSV4SPEC_TEST_SWITCH", "maybe")
    with caplog.at_level("WARNING", logger="dsv4spec"):
        assert env_switch("DSV4SPEC_TEST_SWITCH", True) is False
    assert "DSV4SPEC_TEST_SWITCH='maybe' is not a switch value" in caplog.text
    monkeypatch.delenv("DSV4SPEC_TEST_SWITCH")
    assert env_switch("DSV4SPEC_TEST_SWITCH", True) and not env_switch("DSV4SPEC_TEST_SWITCH",
                                                                       False)


def test_a_switch_is_shown_as_set_and_otherwise_as_what_it_is_taken_as(monkeypatch):
    from dsv4spec.usage import switch_setting

    name = "DSV4SPEC_TEST_SWITCH"
    monkeypatch.delenv(name, raising=False)
    assert switch_setting(name, True) == f"{name} unset: on"
    for value, shown in (("0", f"{name}=0"), ("No", f"{name}=No"), ("  ", f"{name} empty: on"),
                         ("maybe", f"{name}='maybe', not a switch value: taken as off")):
        monkeypatch.setenv(name, value)
        assert switch_setting(name, True) == shown, value


def test_debug_keeps_the_exit_status_of_a_usage_error(capsys):
    assert main(["--debug", "generate", "--prompt", "x", "--device", "tpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith(
        "dsv4spec generate: error: argument --device: must be cpu, cuda or cuda:N")


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "dsv4spec", *GEN[:3], "--max-new-tokens",
                             "8", "--no-spec", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.close()  # `| head -c 0`: the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err


def test_a_full_standard_output_is_named(tmp_path):
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "dsv4spec", *GEN, "--no-spec"], stdout=full,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        "dsv4spec generate: error: cannot write to standard output: No space left on device")


class FullStream(io.StringIO):
    """A standard output on a full disk: every write fails as /dev/full's does."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_help_and_version_on_a_full_standard_output_exit_1_with_one_line(monkeypatch, capsys):
    for argv in (["--help"], ["--version"], ["generate", "--help"], ["bench", "--help"]):
        monkeypatch.setattr(sys, "stdout", FullStream())
        try:
            main(argv)
        except SystemExit as e:
            status = e.code
        assert status == 1, argv
        assert capsys.readouterr().err == ("dsv4spec: error: cannot write to standard output: "
                                           "No space left on device\n"), argv
    with open("/dev/full", "w") as full:  # the real command, its buffered stdout included
        res = subprocess.run([sys.executable, "-m", "dsv4spec", "--help"], stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=300)
    assert res.returncode == 1 and res.stderr == (
        "dsv4spec: error: cannot write to standard output: No space left on device\n")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_generate_prints_its_message_on_a_line_of_its_own(tmp_path):
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dsv4spec", *GEN[:3],
                                 "--max-new-tokens", "1000000", "--device", "cpu"],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path,
                                # a shell's background job (`make test &`) ignores SIGINT, and
                                # a Python started so never raises KeyboardInterrupt
                                preexec_fn=_default_sigint)
        deadline = time.monotonic() + 120
        while "tok/s" not in err_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)  # the progress bar has drawn a rate: inside the loop
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    text = err_path.read_text()
    assert text.endswith("\ndsv4spec generate: interrupted\n") and "tok/s" in text, text[-500:]


def test_memory_the_machine_lacks_names_what_needs_it(monkeypatch, capsys, tmp_path):
    import dsv4spec.engine.run as run

    long_prompt = tmp_path / "long.txt"
    long_prompt.write_bytes(b"x = 1\n" * 150_000)  # 900 kB: its request state and prefill
    (tmp_path / "short.txt").write_text("y")
    cases = {  # the argument blamed: (budget, flags, message)
        "--preset": (6 * 2**30, ["--prompt", "x", "--preset", "pro-shape", "--dtype", "float64"],
                     "preset pro-shape in float64 does not fit: about "),
        "--prompt-file": (400 * 2**20, ["--prompt", "x", "--prompt-file", str(long_prompt)],
                          f"the 900000-byte prompt of {long_prompt} does not fit"),
        "--prompt": (400 * 2**20, ["--prompt", long_prompt.read_text(), "--prompt-file",
                                   str(tmp_path / "short.txt")],
                     "a 900000-byte prompt does not fit"),
        "--prefill-chunk": (6 * 2**30, ["--prefill-chunk", "2048", "--prompt-file",
                                        str(long_prompt)],
                            "2048 tokens per prefill forward do not fit: about 19.9 GiB needed "
                            "(parameters 1 MiB, request state 137 MiB, prefill 15.6 GiB, with "
                            "headroom), cpu has 6.0 GiB available; try --prefill-chunk 512"),
        "--max-new-tokens": (6 * 2**30, ["--max-new-tokens", "1000000"] + ["--prompt", "x"] * 64,
                             "1000000 new tokens for 64 prompt(s) do not fit"),
    }
    for argument, (budget, flags, text) in cases.items():
        monkeypatch.setattr(run, "available_bytes", lambda device: (budget, "available"))
        assert main(["generate", "--device", "cpu", *flags]) == 2, argument
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"argument {argument}: {text}" in err, err
        shown = f"{budget / 2**30:.1f} GiB" if budget >= 2**30 else f"{budget // 2**20} MiB"
        assert f"cpu has {shown} available" in err, err


def test_a_prompt_past_the_context_names_the_argument_it_came_from(monkeypatch, capsys,
                                                                    tmp_path):
    import dataclasses

    import dsv4spec.engine.run as run

    small = dataclasses.replace(preset("tiny"), max_position_embeddings=64)
    monkeypatch.setattr(run, "preset", lambda name: small)
    (tmp_path / "long.txt").write_text("z" * 100)
    for flags, text in (
            (["--prompt", "x" * 100, "--prompt-file", str(tmp_path / "long.txt")],
             "argument --prompt: a 100-byte prompt is longer than preset tiny's context of 64"),
            (["--prompt", "x", "--prompt-file", str(tmp_path / "long.txt")],
             f"argument --prompt-file: the 100-byte prompt of {tmp_path / 'long.txt'} is longer "
             f"than preset tiny's context of 64")):
        assert main(["generate", "--device", "cpu", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err, err


def test_version_and_module_entry_point(tmp_path):
    from dsv4spec import __version__

    res = run_cli(["--version"], tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == f"dsv4spec {__version__}"


def test_every_option_has_help_and_choices_are_listed():
    parser = build_parser()

    def children(p):
        return next((a.choices for a in p._actions
                     if isinstance(a, argparse._SubParsersAction)), {})

    missing, seen = [], 0
    for name, sub in children(parser).items():
        for bench, p in (children(sub).items() if name == "bench" else [(None, sub)]):
            for action in p._actions:
                if action.option_strings and action.help != argparse.SUPPRESS:
                    seen += 1
                    if not action.help:
                        missing.append(f"{name} {bench or ''} {action.option_strings}")
            help_text = " ".join(p.format_help().split())
            if name == "generate":
                assert "--preset {tiny,flash-shape,pro-shape}" in help_text
                assert "(default: 64)" in help_text and "(default: tiny)" in help_text
            if name == "train-tiny":
                assert "(default: 1500)" in help_text and "0.2 s per step" in help_text
            if name == "demo":
                assert "rollback is timed on CUDA only" in help_text
            assert "``" not in help_text and ":class:" not in help_text, (name, bench)
            assert "(default: )" not in help_text, (name, bench)
    assert seen > 50 and not missing, missing


def test_memory_estimate_covers_the_state_the_engine_allocates():
    cfg = preset("tiny")
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        model = build_model(cfg, dtype=dtype)
        state = model.new_state(3, 500, 4)
        tensors = {id(t): t for t in [*state.window, *state.rows, *state.entries,
                                      *state.c128.states] if t is not None}
        allocated = sum(t.numel() * t.element_size() for t in tensors.values())
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        assert needed_bytes(cfg, dtype, 3, 500, 4) >= allocated + params


def test_ctrl_c_while_a_command_imports_its_modules_prints_the_same_line(monkeypatch, capsys):
    from dsv4spec import cli

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    monkeypatch.delenv("DSV4SPEC_DEBUG", raising=False)
    for argv, prog in ((["doctor"], "dsv4spec doctor"), (GEN, "dsv4spec generate"),
                       (["--debug", "train-tiny", "--steps", "1"], "dsv4spec train-tiny"),
                       (["bench", "cleanup", "--quick"], "dsv4spec bench cleanup")):
        try:
            status = main(argv)
        except KeyboardInterrupt:  # not left to pytest, which would stop the whole run
            pytest.fail(f"{argv}: KeyboardInterrupt escaped main")
        err = capsys.readouterr().err
        assert status == 130 and err.strip().splitlines()[-1] == f"{prog}: interrupted", err
        assert ("Traceback" in err) == ("--debug" in argv), err


def test_ctrl_c_as_the_command_starts_exits_130_without_a_traceback(tmp_path):
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        # -X importtime: a line per module imported, so the signal lands once dsv4spec.cli is
        # imported and main() imports the command's modules (torch: a second or more)
        proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "dsv4spec", "doctor"],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path,
                                preexec_fn=_default_sigint)
        deadline = time.monotonic() + 60
        while "| dsv4spec.cli\n" not in err_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, err_path.read_text()[-2000:]
    text = err_path.read_text()
    assert "| torch\n" not in text, "torch was imported before the signal arrived"
    assert text.endswith("\ndsv4spec doctor: interrupted\n"), text[-2000:]
    assert "Traceback" not in text, text[-2000:]


def test_a_missing_triton_is_one_line_that_says_how_to_install_it(monkeypatch, capsys):
    from dsv4spec import cli

    def no_triton(name):
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    monkeypatch.setattr(cli.importlib, "import_module", no_triton)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsv4spec demo: error: Triton is not installed") and err.count("\n") == 1
    assert f": {cli.triton_hint()}\n" in err, err


def test_train_tiny_refuses_a_step_the_memory_cannot_hold_before_training(monkeypatch, capsys,
                                                                          tmp_path):
    import dsv4spec.engine.run as run
    import dsv4spec.engine.train as train
    from dsv4spec.engine.train_tiny import step_bytes

    def never(*args, **kwargs):
        raise AssertionError("trained past the memory check")

    monkeypatch.setattr(train, "train", never)
    out = tmp_path / "out" / "tiny.safetensors"
    argv = ["train-tiny", "--steps", "1", "--out", str(out)]
    assert main([*argv, "--batch-size", "100000000"]) == 2  # this machine's own budget
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("argument --batch-size: 100000000 sequences of 96 bytes "
                                     "per step do not fit: about ") in err, err
    budget = 2 * 2**30
    monkeypatch.setattr(run, "available_bytes", lambda device: (budget, "available"))
    assert main([*argv, "--batch-size", "100000"]) == 2
    err = capsys.readouterr().err
    fits = int(err.rsplit("try --batch-size ", 1)[1].split()[0])
    assert step_bytes(fits, 96) <= budget < step_bytes(fits + 1, 96), err
    assert f"cpu has 2.0 GiB available; try --batch-size {fits}" in err, err
    monkeypatch.setattr(run, "available_bytes", lambda device: (400 * 2**20, "available"))
    assert main([*argv, "--batch-size", "1", "--seq-len", "4096"]) == 2
    err = capsys.readouterr().err
    assert "argument --seq-len: 4096 bytes per sequence do not fit even one to a step" in err, err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_train_tiny_memory_estimate_covers_a_measured_step():
    from dsv4spec.engine.train_tiny import step_bytes

    # VmHWM, the peak of this process's own memory: Linux carries ru_maxrss over exec, so a
    # child of a large pytest process would start from pytest's peak
    code = ("import re, torch\n"
            "from dsv4spec.engine.train import train\n"
            "def peak():\n"
            "    status = open('/proc/self/status').read()\n"
            "    return int(re.search(r'VmHWM:\\s+(\\d+) kB', status)[1]) * 1024\n"
            "before = peak()\n"
            "train(1, 8, 512, 3e-3, progress=False)\n"
            "print(peak() - before)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    used = int(res.stdout)
    # under memory pressure the kernel may drop torch's library pages, which lowers the peak
    # seen past the process's own: the estimate's excess is bounded loosely
    assert used <= step_bytes(8, 512) <= 3 * used, (used, step_bytes(8, 512))


def test_train_tiny_without_matplotlib_says_the_plot_was_skipped(monkeypatch, capsys, tmp_path):
    import dsv4spec.engine.train_tiny as train_tiny

    monkeypatch.setattr(train_tiny, "pyplot", lambda: None)
    out = tmp_path / "tiny.safetensors"
    assert main(["train-tiny", "--steps", "1", "--batch-size", "1", "--seq-len", "8",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (f"dsv4spec train-tiny: no loss plot ({tmp_path / 'tiny.png'}): matplotlib is not "
            f"installed (python -m pip install matplotlib)\n") in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.safetensors"]
