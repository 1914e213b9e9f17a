import pytest
import torch

from dsv4spec.cli import BENCHMARKS, COMMANDS, EXIT_USAGE, main

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


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_without_cuda_fails_clearly_with_one_exit_status(name, capsys, tmp_path):
    out_dir = tmp_path / "results"
    rc = main(["bench", name, "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert rc == EXIT_USAGE == 2
    assert f"bench {name} needs a CUDA GPU" in out
    assert not out_dir.exists(), "no results may be written without a GPU"


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
