"""Speculative decoding over the tiny model in float64: lossless, every accept length, and the
request state after every step (C128 rows past the committed length neutral)."""

import itertools

import pytest
import torch

from dsv4spec.engine import Engine, Request
from dsv4spec.model import preset
from dsv4spec.model.model import Transformer, init_weights


@pytest.fixture(scope="module")
def model():
    return init_weights(Transformer(preset("tiny")).double(), seed=0).requires_grad_(False)


def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 23, 14)]


def run(model, W, max_new=(40, 25, 33), join=None, **kw):
    reqs = [Request(p, m) for p, m in zip(prompts(), max_new)]
    later = {2: [Request([7, 8, 9, 10, 11, 12, 13], 30)]} if join else None
    engine = Engine(model, num_slots=3, max_seq_len=160, num_draft_tokens=W, **kw)
    engine.generate(reqs, join_after=later)
    return reqs + (later[2] if later else []), engine


@pytest.fixture(scope="module")
def greedy(model):
    return [r.output for r in run(model, 0, join=True)[0]]


@pytest.mark.parametrize("W", [2, 3, 4, 6, 8])
def test_speculative_output_equals_greedy(model, greedy, W):
    reqs, _ = run(model, W, join=True)
    assert [r.output for r in reqs] == greedy
    assert all(1 <= a <= W for r in reqs for a in r.accept_lens)


def forced(greedy_outputs, W, schedule):
    """Drafts = the target's own greedy continuation, with a mismatch at the offset the
    schedule gives for each step (offset W - 1: no mismatch, every draft accepted)."""
    steps = itertools.count()

    def override(r):
        ref = greedy_outputs[r.prompt_key]
        drafts = ref[len(r.output):len(r.output) + W - 1]
        drafts += [0] * (W - 1 - len(drafts))
        k = schedule[next(steps) % len(schedule)]
        if k < W - 1:
            drafts[k] = (drafts[k] + 1) % 256
        return drafts

    return override


@pytest.mark.parametrize("W", [3, 4, 6])
def test_forced_acceptance_covers_every_accept_length(model, greedy, W):
    outputs = {tuple(p): out for p, out in zip(prompts(), greedy)}
    schedule = list(range(W))  # mismatch at 0 .. W-2, then none
    reqs = [Request(p, m) for p, m in zip(prompts(), (40, 25, 33))]
    for r in reqs:
        r.prompt_key = tuple(r.prompt)
    engine = Engine(model, num_slots=3, max_seq_len=160, num_draft_tokens=W,
                    draft_override=forced(outputs, W, schedule))
    engine.generate(reqs)
    assert [r.output for r in reqs] == greedy[:3]
    seen = {a for r in reqs for a in r.accept_lens}
    assert seen == set(range(1, W + 1)), seen


def c128_check(violations):
    """on_step hook: rows of committed positions equal plain decoding's; rows the last verify
    wrote for rejected drafts (``[committed, committed + W - accept)``) are neutral."""

    def check(engine, active):
        model, state = engine.model, engine.state
        ring = state.ring_size[model.cfg.compress_ratio]
        for r in active:
            committed = (r.prompt + r.output)[:r.length]
            plain = model.new_state(num_slots=1, max_seq_len=160)
            toks = torch.tensor([committed])
            zero = torch.tensor([0])
            model(toks, plain, zero, zero, torch.tensor([len(committed)]))
            for i, ratio in enumerate(model.cfg.compress_ratios):
                if ratio != model.cfg.compress_ratio:
                    continue
                rows = state.rows[i][r.slot * ring:(r.slot + 1) * ring]
                ref = plain.rows[i][:ring]
                for p in range(max(0, r.length - ring + engine.W), r.length):
                    if not torch.equal(rows[p % ring], ref[p % ring]):
                        violations.append(("committed", r.length, p))
                rejected = engine.W - r.accept_lens[-1]
                for p in range(r.length, r.length + rejected):
                    half = rows.shape[1] // 2
                    row = rows[p % ring]
                    if not (torch.all(row[:half] == 0) and torch.all(row[half:] == -torch.inf)):
                        violations.append(("not neutral", r.length, p))

    return check


@pytest.mark.parametrize("forced_acceptance", [False, True], ids=["model drafts", "forced"])
def test_state_after_every_step_equals_plain_decoding(model, greedy, forced_acceptance):
    violations = []
    kw = {}
    if forced_acceptance:  # every accept length, including all drafts accepted
        kw["draft_override"] = forced({tuple(p): o for p, o in zip(prompts(), greedy)}, 4,
                                      [0, 3, 1, 2])
    reqs = [Request(p, m) for p, m in zip(prompts(), (40, 25, 33))]
    for r in reqs:
        r.prompt_key = tuple(r.prompt)
    engine = Engine(model, num_slots=3, max_seq_len=160, num_draft_tokens=4,
                    on_step=c128_check(violations), **kw)
    engine.generate(reqs)
    assert [r.output for r in reqs] == greedy[:3]
    assert not violations, violations[:5]
    if forced_acceptance:
        assert {a for r in reqs for a in r.accept_lens} == {1, 2, 3, 4}


def test_without_rollback_the_state_check_fails_but_outputs_do_not_change(model, greedy):
    violations = []
    reqs, _ = run(model, 4, rollback="none", on_step=c128_check(violations))
    assert [r.output for r in reqs] == greedy[:3]  # outputs never read a rejected row
    assert any(v[0] == "not neutral" for v in violations)


@pytest.mark.parametrize("rollback,inside", [("fused", False), ("loop", True), ("loop", False)],
                         ids=["fused after", "loop inside", "loop after"])
def test_every_rollback_placement_keeps_the_state_of_plain_decoding(model, greedy, rollback,
                                                                     inside):
    violations = []
    reqs, engine = run(model, 4, rollback=rollback, rollback_in_verify=inside,
                       on_step=c128_check(violations))
    assert [r.output for r in reqs] == greedy[:3]
    assert not violations, violations[:5]
    assert engine.verify.rollback == inside
    assert bool(engine.phase_walls.get("rollback")) == (not inside)
    assert engine.state.c128.cleanup_impl == rollback


def test_a_request_past_max_seq_len_is_refused(model):
    engine = Engine(model, num_slots=1, max_seq_len=16, num_draft_tokens=4)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate([Request(list(range(10)), 20)])


def test_padded_buckets_change_nothing(model, greedy):
    """Every verify, draft-extend and draft chain padded to a bucket of 4 (padding rows: scratch
    slot, accept = W): the same outputs, and the state check still holds for every request."""
    violations = []
    reqs = [Request(p, m) for p, m in zip(prompts(), (40, 25, 33))]
    engine = Engine(model, num_slots=4, max_seq_len=160, num_draft_tokens=4, buckets=(4,),
                    on_step=c128_check(violations))
    padded = {}  # runner -> padding rows per call
    runners = {"verify": (engine.verify.runner, "valid"),
               "draft-extend": (engine.drafts.extend, "lengths"),
               "draft-chain": (engine.drafts.chain, "valid")}
    for name, (runner, flag) in runners.items():
        def step(inputs, real=runner.step, name=name, flag=flag):
            padded.setdefault(name, []).append(int((inputs[flag] == 0).sum()))
            return real(inputs)
        runner.step = step
    engine.generate(reqs)
    assert [r.output for r in reqs] == greedy[:3]
    assert not violations
    assert {name: max(v) >= 1 for name, v in padded.items()} == dict.fromkeys(runners, True)


def test_greedy_accept_counts_leading_matches():
    from dsv4spec.engine.verify import greedy_accept

    tokens = torch.tensor([[5, 1, 2, 3], [5, 1, 9, 3], [5, 7, 2, 3], [5, 1, 2, 3]])
    greedy = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [0, 0, 0, 0]])
    valid = torch.tensor([True, True, True, False])
    assert greedy_accept(tokens, greedy, valid).tolist() == [4, 2, 1, 4]


def test_each_engine_uses_its_own_draft_hc_head_impl(monkeypatch):
    """Two engines over one model: each engine's draft calls carry its own impl (no state is
    left on the shared model); the target keeps the model's."""
    import dsv4spec.model.model as model_module

    m = init_weights(Transformer(preset("tiny")), seed=0).requires_grad_(False)  # float32
    seen = []
    real = model_module.hc_head_op

    def spy(*args, impl, **kw):
        seen.append(impl)
        return real(*args, impl="eager", **kw)

    monkeypatch.setattr(model_module, "hc_head_op", spy)
    engines = {impl: Engine(m, num_slots=1, max_seq_len=64, num_draft_tokens=3,
                            draft_hc_head_impl=impl) for impl in ("compiled", "triton")}
    for impl, engine in engines.items():
        seen.clear()
        engine.generate([Request([1, 2, 3], 4)])
        assert set(seen) == {m.hc_head_impl, impl}, (impl, seen)
    with pytest.raises(ValueError, match="draft_hc_head_impl"):
        Engine(m, num_slots=1, num_draft_tokens=3, draft_hc_head_impl="fast")


@pytest.mark.parametrize("W,chunk", [(0, 5), (4, 5), (4, 16), (3, 7)])
def test_chunked_prefill_equals_one_prefill_of_the_whole_prompt(model, greedy, W, chunk):
    # chunk 5 splits every prompt (5, 23, 14 and 7 tokens) and crosses compressor blocks
    # (ratios 4 and 16) and the window (16 + W rows) at offsets no other test covers
    reqs, engine = run(model, W, join=True, prefill_chunk=chunk)
    assert [r.output for r in reqs] == greedy
    forwards = -(-23 // chunk) + -(-7 // chunk)  # the first three admitted together, one joins
    assert len(engine.phase_walls["prefill"]) == forwards * (2 if W else 1)


def test_a_full_bucket_of_128_requests_with_forced_drafts_equals_greedy(model):
    """The e2e benchmark's largest batch in float64: its forced-draft schedule (every accept
    length) over 128 requests of one bucket emits plain greedy's tokens in every request."""
    from dsv4spec.bench.e2e import forced_drafts

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 256, (128, 16), generator=g).tolist()
    plain = [Request(p, 30) for p in prompts]
    Engine(model, num_slots=128, max_seq_len=80).generate(plain)
    reqs = [Request(p, 30) for p in prompts]
    engine = Engine(model, num_slots=128, max_seq_len=80, num_draft_tokens=4, buckets=(128,),
                    draft_override=forced_drafts({id(r): q.output for r, q in zip(reqs, plain)},
                                                 256))
    engine.generate(reqs)
    assert [r.output for r in reqs] == [q.output for q in plain]
    assert {a for r in reqs for a in r.accept_lens} == {1, 2, 3, 4}


@pytest.mark.parametrize("W", [0, 4])
def test_measuring_a_run_first_leaves_the_engine_as_fresh(model, W):
    # Prompts of 5, 23 and 14 tokens in chunks of 8: a chunk at the start, one ending at the
    # longest prompt's end, and steps at the first and the 16th token, all on scratch requests
    def generated(measure: bool):
        reqs = [Request(p, 16) for p in prompts()]
        engine = Engine(model, num_slots=3, max_seq_len=160, num_draft_tokens=W,
                        prefill_chunk=8)
        times = engine.measure([r.prompt for r in reqs], 16) if measure else None
        engine.generate(reqs)
        return [r.output for r in reqs], engine, times

    fresh, plain, _ = generated(False)
    outputs, engine, times = generated(True)
    assert outputs == fresh
    assert set(times) == {"prefill_tokens", "prefill_first", "prefill_last", "step_first",
                          "step_last"}
    assert all(t > 0 for t in times.values()), times
    assert ({k: len(v) for k, v in engine.phase_walls.items()}
            == {k: len(v) for k, v in plain.phase_walls.items()})
    assert sorted(engine.free) == [0, 1, 2]
    one = Engine(model, num_slots=1, max_seq_len=40, num_draft_tokens=W).measure([[1, 2]], 1)
    assert one["step_first"] == one["step_last"] == 0 and one["prefill_last"] == one[
        "prefill_first"] > 0
