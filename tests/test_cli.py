import re
from pathlib import Path

import pytest
import torch

from dsv4spec.cli import BENCHMARKS, COMMANDS, EXIT_USAGE, build_parser, main

ROOT = Path(__file__).resolve().parents[1]

# With a GPU, conftest leaves TRITON_INTERPRET unset, so the kernels are compiled for CUDA and
# cannot take CPU tensors: the demo then runs on the GPU. Without one (CI) it runs on CPU with the
# Triton kernels in the interpreter, about 10 s.
DEMO_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_demo_fused_and_loop_equal_reference(capsys, monkeypatch):
    if DEMO_DEVICE == "cpu":
        # The demo sets TRITON_INTERPRET on CPU; monkeypatch restores the environment afterwards.
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    rc = main(["demo", "--device", DEMO_DEVICE])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "C128 state pool: 31 layers" in out, out
    assert "fused and per-layer loop equal the reference in all 31 layers: True" in out, out
    # slot 0, seq_len 10, accept 1 of 4: drafts 1..3 rejected -> rows 11, 12, 13.
    assert "neutralised rows [11, 12, 13]" in out, out
    # slot 3, seq_len 254, accept 2 of 4: positions 256, 257 wrap to ring rows 0, 1 of slot 3.
    assert "neutralised rows [768, 769]" in out, out
    # the trained tiny model: speculative decoding gives greedy's output
    assert "speculative output identical to greedy output: True" in out, out
    assert "accept lengths: 1:" in out, out


def test_the_demo_s_cpu_tokens_per_second_come_with_the_rollback_s_caveat(capsys):
    from dsv4spec.demo import generation_demo

    assert generation_demo(torch.device("cpu"), max_new_tokens=2)
    lines = capsys.readouterr().out.splitlines()
    rates = [i for i, line in enumerate(lines) if line.endswith("tokens/s)")]
    assert len(rates) == 2 and lines[rates[1] + 1].startswith("    accept lengths:"), lines
    assert lines[rates[1] + 2] == (
        "  timings need a GPU (CPU tokens/s say nothing about a GPU, and MTP may run slower than "
        "greedy here): run `dsv4spec demo` or `dsv4spec bench e2e` on a CUDA machine"), lines


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_without_cuda_fails_clearly_with_one_exit_status(name, capsys, tmp_path):
    out_dir = tmp_path / "results"
    rc = main(["bench", name, "--out", str(out_dir)])
    out = capsys.readouterr()
    assert rc == EXIT_USAGE == 2
    assert f"bench {name} needs a CUDA GPU" in out.err and "\n" not in out.err.strip()
    assert not out.out and not out_dir.exists(), "no results may be written without a GPU"


def test_help_lists_every_command_and_benchmark_with_its_summary(capsys):
    for argv, names in ((["--help"], [*COMMANDS, "bench"]), (["bench", "--help"], BENCHMARKS)):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "exit status:" in out
        for name in names:
            assert f" {name} " in out, (name, out)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "no-such-benchmark"])
    assert exit_.value.code == EXIT_USAGE


def test_the_summary_the_readme_and_the_cli_doc_name_every_command():
    summary = build_parser().description
    readme = (ROOT / "README.md").read_text()
    readme_list = next(p for p in readme.split("\n\n") if "`dsv4spec --help` lists" in p)
    section = (ROOT / "docs" / "cli.md").read_text().split("## The command line", 1)[1]
    listed = section.split("\n\n", 2)[1]  # the paragraph listing the commands
    for name in [*COMMANDS, "bench"]:
        assert re.search(rf"\b{name}\b", summary), (name, summary)
        assert f"`{name}" in listed, (name, listed)
        assert f"`{name}" in readme_list, (name, readme_list)


def test_train_tiny_one_step_writes_a_checkpoint_that_generate_reads(tmp_path, capsys,
                                                                     monkeypatch):
    from dsv4spec.engine.train_tiny import check_out

    monkeypatch.chdir(tmp_path)
    argv = ["train-tiny", "--steps", "1", "--batch-size", "2", "--seq-len", "16"]
    assert main(argv) == 0
    out = tmp_path / "dsv4spec-tiny.safetensors"  # the default: the working directory
    assert out.is_file() and "trained 1 step" in capsys.readouterr().out
    stamp = out.stat().st_mtime_ns
    assert main(argv) == EXIT_USAGE  # exists: not replaced without --force
    assert "exists; pass --force" in capsys.readouterr().err and out.stat().st_mtime_ns == stamp
    check_out(out, force=True)  # --force: replaced
    assert main(["generate", "--prompt", "def ", "--max-new-tokens", "3", "--json",
                 "--device", "cpu", "--checkpoint", str(out)]) == 0


def test_short_training_runs_have_a_schedule_at_every_length():
    from dsv4spec.engine.train import schedule

    for steps in range(1, 61):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=1e-3)
        sched = schedule(opt, 1e-3, steps)
        for _ in range(steps):
            opt.step()
            sched.step()
            assert 0 < opt.param_groups[0]["lr"] <= 1e-3 * (1 + 1e-9), steps


def test_every_help_summary_is_a_whole_sentence():
    import importlib

    from dsv4spec.cli import _summary

    modules = {**COMMANDS, **{f"bench {k}": f"dsv4spec.bench.{m}" for k, m in BENCHMARKS.items()}}
    for name, module in modules.items():
        summary = _summary(importlib.import_module(module).__doc__)
        assert summary.endswith("."), (name, summary)


def test_the_benchmarks_page_has_a_row_for_every_benchmark():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    rows = set(re.findall(r"^\| `bench ([\w-]+)` \|", text, re.M))
    assert rows == set(BENCHMARKS), (sorted(set(BENCHMARKS) - rows), sorted(rows - set(BENCHMARKS)))
