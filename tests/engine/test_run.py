"""``dsv4spec generate`` and the packaged trained checkpoint."""

import json

from dsv4spec.cli import main
from dsv4spec.model.build import TINY_CHECKPOINT, packaged_checkpoint
from dsv4spec.model.tokenizer import decode, encode


def generate(capsys, *flags):
    rc = main(["generate", "--prompt", "import os\n", "--prompt", "def main(",
               "--max-new-tokens", "24", "--json", "--dtype", "float64", "--device", "cpu",
               *flags])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_speculative_equals_greedy(capsys):
    spec = generate(capsys, "--num-draft-tokens", "4")
    plain = generate(capsys, "--no-spec")
    assert spec["tokens"] == plain["tokens"] and [len(t) for t in spec["tokens"]] == [24, 24]
    assert plain["accept_lens"] == [[], []]
    lens = [a for r in spec["accept_lens"] for a in r]
    assert lens and all(1 <= a <= 4 for a in lens)
    assert abs(spec["mean_accept_len"] - sum(lens) / len(lens)) < 1e-12
    assert spec["text"][0] == decode(spec["tokens"][0])
    sglang_like = generate(capsys, "--num-draft-tokens", "4", "--rollback", "loop",
                           "--rollback-after-verify", "--draft-hc-head-impl", "eager")
    assert sglang_like["tokens"] == plain["tokens"]
    assert sglang_like["accept_lens"] == spec["accept_lens"]
    assert "rollback" in sglang_like["phase_seconds"] and "rollback" not in spec["phase_seconds"]


def test_trained_checkpoint_is_packaged_small_and_accepts_drafts(capsys):
    assert packaged_checkpoint("tiny") == TINY_CHECKPOINT
    assert TINY_CHECKPOINT.stat().st_size <= 10 * 2**20
    assert packaged_checkpoint("pro-shape") is None
    spec = generate(capsys, "--num-draft-tokens", "4")
    # random weights accept ~1.0 (nothing but the verified-in token); the trained MTP block's
    # drafts are often right on Python source
    assert spec["mean_accept_len"] > 1.5, spec["mean_accept_len"]


def test_byte_tokens_round_trip():
    text = "déf f(x):\n    return x  # ✓"
    assert decode(encode(text)) == text and max(encode(text)) < 256
