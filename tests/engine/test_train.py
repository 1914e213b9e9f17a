"""``dsv4spec train-tiny`` end to end at a few steps: the trainer, the checkpoint it writes, and
the model factory loading it back."""

import torch

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
