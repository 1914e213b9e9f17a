"""``dsv4spec generate`` and the packaged trained checkpoint."""

import io
import json
import subprocess
import sys

import torch

from dsv4spec.cli import main
from dsv4spec.engine.run import BASE_BYTES, memory_need
from dsv4spec.model.build import TINY_CHECKPOINT, packaged_checkpoint
from dsv4spec.model.config import preset
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


def test_json_says_what_ran_and_prompts_come_from_files_stdin_and_raw_bytes(
        capsys, monkeypatch, tmp_path):
    (tmp_path / "p.txt").write_bytes(b"def main(")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"import os\n")))
    argv = ["generate", "--prompt", "abc\udcff\udcfe", "--prompt-file", str(tmp_path / "p.txt"),
            "--prompt-file", "-", "--max-new-tokens", "3", "--no-spec", "--json",
            "--device", "cpu", "--dtype", "float64"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    # the argument's undecodable bytes (surrogate escapes) are served as those bytes
    assert out["prompt_tokens"] == [5, 9, 10]
    assert out["prompts"][1:] == ["def main(", "import os\n"]
    assert {k: out[k] for k in ("preset", "dtype", "device", "num_draft_tokens")} == {
        "preset": "tiny", "dtype": "float64", "device": "cpu", "num_draft_tokens": 0}
    assert out["seconds"] > 0 and out["prefill_chunk"] == 10 and out["max_new_tokens"] == 3
    assert encode("abc\udcff\udcfe") == [97, 98, 99, 255, 254]


def test_the_memory_estimate_covers_what_prefill_allocates():
    # A prefill of 4,096 tokens in one chunk: its attention scores, not the parameters or the
    # state, are what the process grows by (about 0.6 GB; 0.25 GB without the prefill term)
    code = ("import resource, torch\n"
            "from dsv4spec.engine import Engine, Request\n"
            "from dsv4spec.model.build import build_model\n"
            "model = build_model('tiny'); model.hc_head_impl = 'eager'\n"
            "engine = Engine(model, num_slots=1, max_seq_len=4112, num_draft_tokens=4,\n"
            "                prefill_chunk=4096)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "engine.generate([Request([i % 256 for i in range(4096)], 2)])\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=900)  # about 10 s alone; generous for a loaded shared machine
    assert res.returncode == 0, res.stderr[-2000:]
    grown = int(res.stdout.split()[-1])
    need = memory_need(preset("tiny"), torch.float32, 1, 4112, 4, 4096)
    assert grown <= need["total"] - need["parameters"], (grown, need)
    assert grown > BASE_BYTES, "the case no longer exercises the prefill term"
