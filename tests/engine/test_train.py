"""``dsv4spec train-tiny`` end to end at a few steps: the trainer, the checkpoint it writes, and
the model factory loading it back."""

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from dsv4spec.cli import main
from dsv4spec.engine.train import corpus, train
from dsv4spec.model.build import build_model


def test_corpus_is_bytes():
    data = corpus(limit_bytes=10_000)
    assert data.dtype == torch.long and len(data) >= 10_000
    assert int(data.min()) >= 0 and int(data.max()) < 256


def test_train_returns_a_frozen_model_and_finite_losses():
    model, history = train(steps=3, batch_size=2, seq_len=16, lr=1e-3, progress=False)
    assert len(history) == 3 and all(torch.isfinite(torch.tensor(h)).all() for h in history)
    assert not any(p.requires_grad for p in model.parameters())


def test_train_tiny_writes_a_checkpoint_the_factory_loads(tmp_path, capsys):
    out = tmp_path / "tiny.safetensors"
    assert main(["train-tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
                 "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    loaded = build_model("tiny", out)
    trained, _ = train(steps=2, batch_size=2, seq_len=16, lr=3e-3, progress=False)
    for (name, a), b in zip(loaded.named_parameters(), trained.parameters()):
        assert torch.equal(a, b), name


TINY = ["train-tiny", "--steps", "3", "--batch-size", "2", "--seq-len", "16"]


def test_an_unwritable_out_is_refused_before_torch_is_imported(tmp_path):
    # /proc refuses new entries even to root: the folder cannot be created
    code = ("import sys\nfrom dsv4spec.cli import main\n"
            "rc = main(['train-tiny', '--out', '/proc/nosuch/tiny.safetensors'])\n"
            "print(rc, 'torch' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.stdout.split() == ["2", "False"], res.stdout + res.stderr
    assert res.stderr.count("\n") == 1
    assert "argument --out: cannot write in /proc/nosuch" in res.stderr, res.stderr


@pytest.mark.parametrize("failure", ["read-only", "full disk"])
def test_a_folder_that_cannot_take_the_checkpoint_is_refused_before_training(
        failure, tmp_path, monkeypatch, capsys):
    import dsv4spec.engine.train as train_module

    def no_training(*args, **kwargs):
        raise AssertionError("trained before refusing --out")

    monkeypatch.setattr(train_module, "train", no_training)
    if failure == "read-only":  # as root, chmod does not stop writes: fail the probe itself
        def refuse(*args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
        expected = "Read-only file system"
    else:
        monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(
            10**9, 10**9 - 1000, 1000))
        expected = "0.0 MB free"
    assert main([*TINY, "--out", str(tmp_path / "tiny.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "argument --out:" in err and expected in err, err
    assert list(tmp_path.iterdir()) == []


def test_written_files_take_the_umask_mode_and_leave_no_temporary_file(tmp_path, capsys):
    out = tmp_path / "tiny.safetensors"
    old = os.umask(0o027)
    try:
        assert main([*TINY, "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert stat.S_IMODE(out.with_suffix(".png").stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.png", "tiny.safetensors"]


def test_a_file_another_run_wrote_meanwhile_is_kept(tmp_path, monkeypatch, capsys):
    import dsv4spec.engine.train as train_module

    out = tmp_path / "tiny.safetensors"
    real = train_module.train

    def train_while_another_run_finishes(*args, **kwargs):
        result = real(*args, **kwargs)
        out.write_bytes(b"the other run's checkpoint")
        return result

    monkeypatch.setattr(train_module, "train", train_while_another_run_finishes)
    assert main([*TINY, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert out.read_bytes() == b"the other run's checkpoint"
    kept = tmp_path / f"tiny.{os.getpid()}.safetensors"
    assert f"this run's checkpoint is {kept}" in captured.err, captured.err
    build_model("tiny", kept)


@pytest.mark.parametrize("spare_room", [True, False], ids=["kept elsewhere", "lost"])
def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_it_and_the_copy_kept(
        spare_room, tmp_path, monkeypatch, capsys):
    import dsv4spec.model.weights as weights

    real = weights.save_weights
    out = tmp_path / "out" / "tiny.safetensors"
    spare = tmp_path / "spare"
    spare.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spare))

    def disk_full(model, path):
        if spare_room and Path(path).parent == spare:
            return real(model, path)
        raise SafetensorError(f"Error while serializing: I/O error: No space left on device (os "
                              f"error 28) at path \"{path}\"")

    monkeypatch.setattr(weights, "save_weights", disk_full)
    assert main([*TINY, "--out", str(out)]) == 1
    captured = capsys.readouterr()
    line = captured.err.split("\n")[-2]  # after the progress bar (tqdm's "\r" lines)
    assert captured.err.count("dsv4spec train-tiny") == 1, captured.err
    assert line.startswith(f"dsv4spec train-tiny: error: cannot write {out}: No space left on "
                           f"device; "), captured.err
    assert list(out.parent.iterdir()) == []  # neither a partial file nor a plot
    if spare_room:
        assert line.endswith(f"; the trained weights were saved to {spare / out.name} instead")
        trained, _ = train(steps=3, batch_size=2, seq_len=16, lr=3e-3, progress=False)
        loaded = build_model("tiny", spare / out.name)
        for (name, a), b in zip(loaded.named_parameters(), trained.parameters()):
            assert torch.equal(a, b), name
    else:
        assert f"; nor in {spare} (No space left on device): the trained weights are lost" in line
        assert list(spare.iterdir()) == []


@pytest.mark.parametrize("interrupt_at", [1, 3])
def test_ctrl_c_saves_the_steps_trained_or_says_nothing_was_saved(interrupt_at, tmp_path,
                                                                  monkeypatch, capsys):
    import dsv4spec.engine.train as train_module

    calls = []
    real = train_module.losses

    def losses_until_ctrl_c(*args):
        calls.append(1)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(train_module, "losses", losses_until_ctrl_c)
    out = tmp_path / "tiny.safetensors"
    assert main([*TINY, "--steps", "5", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    if interrupt_at == 1:
        assert "interrupted before the first step ended; nothing was saved" in err, err
        assert not out.exists()
        return
    assert "interrupted after 2 steps of 5" in err, err
    monkeypatch.setattr(train_module, "losses", real)
    trained, _ = train(steps=2, batch_size=2, seq_len=16, lr=3e-3, progress=False)
    for (name, a), b in zip(build_model("tiny", out).named_parameters(), trained.parameters()):
        assert torch.equal(a, b), name
