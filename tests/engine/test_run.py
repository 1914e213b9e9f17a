"""``dsv4spec generate`` and the packaged trained checkpoint."""

import io
import json
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from dsv4spec.cli import main
from dsv4spec.engine import run
from dsv4spec.engine.generate import Engine
from dsv4spec.engine.run import BASE_BYTES, duration, memory_need, run_estimate
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
    # state, are what the process grows by (about 0.6 GB; 0.25 GB without the prefill term).
    # VmHWM, the peak of this process's own memory: Linux carries ru_maxrss over exec, so a child
    # of a pytest process whose peak passed the child's (after the demo test, say) grew by 0.
    code = ("import re, torch\n"
            "from dsv4spec.engine import Engine, Request\n"
            "from dsv4spec.model.build import build_model\n"
            "def peak():\n"
            "    status = open('/proc/self/status').read()\n"
            "    return int(re.search(r'VmHWM:\\s+(\\d+) kB', status)[1]) * 1024\n"
            "model = build_model('tiny'); model.hc_head_impl = 'eager'\n"
            "engine = Engine(model, num_slots=1, max_seq_len=4112, num_draft_tokens=4,\n"
            "                prefill_chunk=4096)\n"
            "before = peak()\n"
            "engine.generate([Request([i % 256 for i in range(4096)], 2)])\n"
            "print(peak() - before)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=900)  # about 10 s alone; generous for a loaded shared machine
    assert res.returncode == 0, res.stderr[-2000:]
    grown = int(res.stdout.split()[-1])
    need = memory_need(preset("tiny"), torch.float32, 1, 4112, 4, 4096)
    assert grown <= need["total"] - need["parameters"], (grown, need)
    assert grown > BASE_BYTES, "the case no longer exercises the prefill term"


# A step made slower than any machine's (0.2 s more), so that a run of 100,000 tokens is
# estimated at hours wherever the test runs; a marker on stderr where generation begins.
SLOW_RUN = """
import sys, time
from dsv4spec.cli import main
from dsv4spec.engine.generate import Engine
step = Engine.decode_step
def slow_step(self, reqs):
    time.sleep(0.2)
    step(self, reqs)
Engine.decode_step = slow_step
generate = Engine.generate
def announced(self, reqs, **kw):
    print("<generation starts>", file=sys.stderr, flush=True)
    return generate(self, reqs, **kw)
Engine.generate = announced
sys.exit(main(sys.argv[1:]))
"""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_run_of_hours_states_its_estimate_first_shows_progress_and_ctrl_c_interrupts_it(
        tmp_path):
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, "generate", "--prompt", "def ",
                                 "--max-new-tokens", "100000", "--no-spec", "--device", "cpu"],
                                stdout=subprocess.PIPE, stderr=err, cwd=tmp_path,
                                preexec_fn=_default_sigint)  # a background job ignores SIGINT
        deadline = time.monotonic() + 240
        while "tok/s" not in err_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)  # stderr is a file, the run is long: a progress line 5 s in
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    text = err_path.read_text()
    assert proc.returncode == 130 and out == b"", text
    lines = text.splitlines()
    estimates = [i for i, line in enumerate(lines) if line.startswith("generate: about")]
    assert len(estimates) == 1, text
    assert re.fullmatch(r"generate: about \d+ h( \d+ min)? on this CPU \(100,000 tokens, [\d.]+ "
                        r"m?s( rising to [\d.]+ m?s)? per token measured\); Ctrl-C interrupts it",
                        lines[estimates[0]]), text
    assert estimates[0] < lines.index("<generation starts>"), text
    progress = lines[lines.index("<generation starts>") + 1]
    assert re.fullmatch(r"generate: [\d,]+ of 100,000 tok \(\d+ %\), [\d.]+ tok/s, about .+ left",
                        progress), text
    assert lines[-1] == "dsv4spec generate: interrupted", text


SHORT = ["generate", "--prompt", "def ", "--max-new-tokens", "4", "--no-spec", "--device", "cpu"]


def test_a_short_run_prints_no_estimate_and_no_progress_where_stderr_is_no_terminal(capsys):
    assert main(SHORT) == 0
    out = capsys.readouterr()
    assert out.err == "" and "tokens/s on cpu" in out.out


def test_a_short_run_on_a_terminal_shows_its_progress_bar_without_an_estimate(capsys,
                                                                              monkeypatch):
    monkeypatch.setattr(run, "_stderr_is_terminal", lambda: True)
    assert main(SHORT) == 0
    err = capsys.readouterr().err
    assert "generate: 100%" in err and "about" not in err and "building" not in err, err


def test_the_estimate_comes_from_the_measured_times_before_generation(capsys, monkeypatch):
    def measure(self, prompts, max_new_tokens):  # slower than any model: 33 to 67 min a step
        return {"prefill_tokens": 16, "prefill_first": 1.0, "prefill_last": 1.0,
                "step_first": 2000.0, "step_last": 4000.0}

    seen = {}
    generate = Engine.generate

    def announced(self, reqs, **kw):
        seen["err"] = capsys.readouterr().err  # what was on stderr as generation began
        return generate(self, reqs, **kw)

    monkeypatch.setattr(Engine, "measure", measure)
    monkeypatch.setattr(Engine, "generate", announced)
    assert main(SHORT) == 0
    assert seen["err"] == ("generate: about 2 h 30 min on this CPU (4 tokens, 33 min rising to 1 h "
                           "7 min per token measured); Ctrl-C interrupts it\n")
    out = capsys.readouterr()
    assert "tokens/s on cpu" in out.out and out.err == ""  # the run itself is short


def test_long_phases_show_progress_lines_where_stderr_is_no_terminal(capsys, monkeypatch):
    # An hour's estimate and a clock 20 s on at each reading: the build, the prefill of a prompt
    # of five chunks and the decoding each report as lines
    monkeypatch.setattr(Engine, "measure", lambda self, prompts, n: dict.fromkeys(
        ("prefill_first", "prefill_last", "step_first", "step_last"), 1000.0,
    ) | {"prefill_tokens": 16})
    clock = iter(range(0, 10**9, 20))
    monkeypatch.setattr(run, "_clock", lambda: next(clock))
    assert main([*SHORT, "--prompt", "x" * 80, "--prefill-chunk", "16"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"building tiny: \d+ %, about .+ left", lines[0]), lines
    for phase in ("prefill", "generate"):
        assert any(re.fullmatch(rf"{phase}: [\d,]+ of [\d,]+ tok \(\d+ %\), [\d.]+ tok/s, "
                                rf"about .+ left", line) for line in lines), (phase, lines)
    assert sum(line.startswith("generate: about") for line in lines) == 1, lines


def test_a_big_build_on_a_terminal_shows_a_bar(capsys, monkeypatch):
    monkeypatch.setattr(run, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(run, "BAR_DELAY_S", 0.0)  # tiny builds in less than the bar's delay
    assert main(SHORT) == 0
    assert "building tiny: 100%|" in capsys.readouterr().err


def test_the_estimate_adds_the_prefill_and_the_steps_growing_with_the_context():
    times = {"prefill_tokens": 256, "prefill_first": 0.128, "prefill_last": 0.384,
             "step_first": 0.01, "step_last": 0.03}
    seconds, what = run_estimate(times, 10_240, 1_001, 4)
    assert seconds == pytest.approx(40 * 0.256 + 1_000 * 0.02)
    assert what == ("prefill 10 s: 10,240 tokens, 500 µs rising to 1.5 ms per token measured; "
                    "1,001 tokens, 10 ms rising to 30 ms per step measured, one step per token "
                    "at most")
    seconds, what = run_estimate({**times, "prefill_tokens": 100}, 100, 1, 0)
    assert seconds == 0.128 and what == "1 token, from the prefill"
    seconds, what = run_estimate({**times, "step_last": 0.011}, 100, 3, 0)
    assert seconds == pytest.approx(0.128 + 2 * 0.0105)
    assert what == "3 tokens, 10 ms per token measured"
    assert [duration(s) for s in (45, 89.6, 750, 3 * 3600 + 20 * 60, 3600, 290 * 3600)] == [
        "45 s", "90 s", "12 min", "3 h 20 min", "1 h", "12 days (290 h)"]
