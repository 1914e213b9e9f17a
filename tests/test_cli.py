import pytest
import torch

from dsv4spec.cli import main

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
def test_bench_cleanup_without_cuda_fails_clearly(capsys, tmp_path):
    out_dir = tmp_path / "results"
    rc = main(["bench", "cleanup", "--out", str(out_dir)])
    out = capsys.readouterr().out
    assert rc == 2
    assert "bench cleanup needs a CUDA GPU" in out
    assert not out_dir.exists(), "no results may be written without a GPU"
