"""The verify row-expansion hook through SGLang's own hook registry, on a stand-in backend class
carrying SGLang's own ``expand_extend_with_same_length`` and its two callers
(``make_forward_metadata_from_raw_verify``, ``init_forward_metadata_draft_extend``), whose
``self.expand_extend_with_same_length(...)`` finds the hooked class attribute."""

import ast
import logging
from types import SimpleNamespace

import pytest
import torch

from dsv4spec.bench.metadata import BACKEND_FILE, EXPAND_METHOD
from dsv4spec.integrations.hooks import GuardedHook
from dsv4spec.integrations.sglang import metadata as hooks

from ...kernels.attention_metadata_support import interpreter_loop_bounds
from . import standins
from .conftest import EXPAND as TARGET
from .standins import DEVICE, class_node, function_node

LOGGER = "dsv4spec.integrations.sglang"
BACKEND = "DeepseekV4AttnBackend"
CALLERS = ("make_forward_metadata_from_raw_verify", "init_forward_metadata_draft_extend")
TRTLLM_FILE = "srt/layers/attention/deepseek_v4_trtllm_backend.py"


@pytest.fixture
def backend(sgl):
    with interpreter_loop_bounds():
        yield sgl, sgl.backend


def fill_table(monkeypatch, requests=(1, 10_000), widths=(1, 2, 3, 4, 5, 7)):
    """A table that prefers dsv4spec's kernel at these draft widths, in both modes."""
    spans = {width: (requests,) for width in widths}
    monkeypatch.setitem(hooks.TABLES, hooks.EXPAND,
                        {(9, 0): {"graph": dict(spans), "eager": dict(spans)}})


def counted(monkeypatch):
    calls = []
    original = hooks.expand_same_length

    def wrapper(*args, **kwargs):
        calls.append(kwargs["qo_len"])
        return original(*args, **kwargs)

    monkeypatch.setattr(hooks, "expand_same_length", wrapper)
    return calls


def raw_verify(bs, length_dtype=torch.int64, slot_dtype=torch.int64, seed=0):
    """What init_forward_metadata_target_verify hands the verify graph (fixed width)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, 1 << 20, (bs,), generator=g).to(length_dtype)
    slots = torch.randperm(max(bs, 1) * 3, generator=g)[:bs].to(slot_dtype)
    return SimpleNamespace(req_pool_indices=slots.to(DEVICE), seq_lens=seq_lens.to(DEVICE),
                           out_cache_loc=torch.zeros(bs * 4, dtype=torch.int64, device=DEVICE),
                           extend_seq_lens=torch.full((bs,), 4, dtype=torch.int32,
                                                      device=DEVICE),
                           verify_lens=None, c128_compress_metadata=None)


def verify_rows(instance, raw):
    """SGLang's verify metadata build up to make_core_attn_metadata: the rows it was given."""
    instance.core_calls.clear()
    instance.make_forward_metadata_from_raw_verify(raw)
    (call,) = instance.core_calls
    return call["seq_lens_casual"], call["req_pool_indices_repeated"]


def draft_extend_rows(instance, seq_lens, slots, width):
    instance.core_calls.clear()
    instance.init_forward_metadata_draft_extend(slots, seq_lens, width)
    (call,) = instance.core_calls
    return call["seq_lens_casual"], call["req_pool_indices_repeated"]


def sglang_rows(sgl, instance, seq_lens, slots, width):
    return sgl.originals[TARGET](instance, bs=seq_lens.shape[0], qo_len=width, seq_lens=seq_lens,
                                req_pool_indices=slots)


def assert_same(actual, expected):
    for a, b in zip(actual, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# --- SGLang's source: the target, its callers, no override ------------------------------------

def test_target_callers_and_no_override_in_sglang_source():
    method = function_node(BACKEND_FILE, EXPAND_METHOD, BACKEND)
    assert [a.arg for a in method.args.args] == ["self"]
    assert [a.arg for a in method.args.kwonlyargs] == ["bs", "qo_len", "seq_lens",
                                                       "req_pool_indices"]
    # What the method reads besides its arguments: torch and self.cuda_int32_kwargs (the hook
    # checks that device).
    names = {n.id for statement in method.body for n in ast.walk(statement)
             if isinstance(n, ast.Name)}
    assert names == {"self", "bs", "qo_len", "seq_lens", "req_pool_indices", "torch",
                     "seq_lens_casual", "idx_to_req_repeated", "req_pool_indices_repeated"}
    assert {ast.unparse(n) for n in ast.walk(method) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self"} == {
        "self.cuda_int32_kwargs"}
    # Its callers call it on self with the four keywords.
    callers = set()
    for node in class_node(BACKEND_FILE, BACKEND).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == EXPAND_METHOD):
                assert ast.unparse(call.func.value) == "self" and not call.args
                assert [k.arg for k in call.keywords] == ["bs", "qo_len", "seq_lens",
                                                          "req_pool_indices"]
                callers.add(node.name)
    assert callers == set(CALLERS)
    # No class of the CUDA backends defines its own: the hooked class attribute is what runs.
    for relpath in (BACKEND_FILE, TRTLLM_FILE):
        tree, _ = standins.parse(relpath)
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name != BACKEND):
            assert EXPAND_METHOD not in {n.name for n in cls.body
                                         if isinstance(n, ast.FunctionDef)}, cls.name


# --- registration ------------------------------------------------------------------------------

def test_register_installs_an_around_hook_on_the_class(backend):
    sgl, module = backend
    assert TARGET in sgl.install()
    hooked = module.DeepseekV4AttnBackend.expand_extend_with_same_length
    assert hooked is not sgl.originals[TARGET] and hooked.__wrapped__ is sgl.originals[TARGET]
    assert module.DeepseekV4MultiStepBackend.expand_extend_with_same_length is hooked
    entries = [h for _, h, _ in sgl.registry._hooks[TARGET]]
    assert len(entries) == 1 and isinstance(entries[0], GuardedHook)


# --- behaviour through SGLang's callers --------------------------------------------------------

def test_shipped_table_follows_the_h200_results():
    """benchmarks/results/tune/NVIDIA_H200.md: at qo_len 2 to 8 ours won at every batch measured,
    1 to 512, in a graph and eagerly; nothing beyond was measured."""
    for in_graph in (True, False):
        for bs, width in ((1, 2), (4, 4), (32, 5), (128, 4), (512, 8)):
            assert hooks.prefers_dsv4spec(hooks.EXPAND, bs, width, in_graph, (9, 0)), (bs, in_graph)
        for bs, width in ((0, 4), (513, 4), (1, 1), (8, 9), (1, 16)):
            assert not hooks.prefers_dsv4spec(hooks.EXPAND, bs, width, in_graph, (9, 0)), (
                bs, width)
        for architecture in ((8, 0), (10, 0), None):
            assert not hooks.prefers_dsv4spec(hooks.EXPAND, 1, 4, in_graph, architecture)


def test_empty_table_keeps_sglang(backend, monkeypatch):
    sgl, module = backend
    monkeypatch.setitem(hooks.TABLES, hooks.EXPAND, {})
    sgl.install()
    calls = counted(monkeypatch)
    instance = module.DeepseekV4AttnBackend(DEVICE)
    raw = raw_verify(5)
    original = sgl.originals[TARGET]
    before = original.calls
    rows = verify_rows(instance, raw)
    assert original.calls == before + 1 and calls == []
    assert_same(rows, sglang_rows(sgl, instance, raw.seq_lens + 4, raw.req_pool_indices, 4))


@pytest.mark.parametrize("length_dtype,slot_dtype", [(torch.int64, torch.int64),
                                                     (torch.int32, torch.int32),
                                                     (torch.int32, torch.int64)])
def test_filled_table_runs_ours_with_sglang_results(backend, monkeypatch, length_dtype,
                                                    slot_dtype):
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch)
    original = sgl.originals[TARGET]
    for width in (1, 4, 7):
        instance = module.DeepseekV4MultiStepBackend(DEVICE, num_draft_tokens=width)
        for bs in (1, 3, 40, 65):
            raw = raw_verify(bs, length_dtype, slot_dtype, seed=bs * width)
            before = original.calls
            rows = verify_rows(instance, raw)
            assert original.calls == before, "SGLang's method did not run"
            expected = sglang_rows(sgl, instance, raw.seq_lens + width, raw.req_pool_indices,
                                   width)
            assert_same(rows, expected)
            # Draft extend: the same expansion of the unshifted lengths.
            rows = draft_extend_rows(instance, raw.seq_lens, raw.req_pool_indices, width)
            assert_same(rows, sglang_rows(sgl, instance, raw.seq_lens, raw.req_pool_indices,
                                          width))
    assert len(calls) == 3 * 4 * 2


def test_a_failing_fast_path_falls_back_once_and_switches_off(backend, monkeypatch, caplog):
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("injected fault")

    monkeypatch.setattr(hooks, "expand_same_length", broken)
    instance = module.DeepseekV4AttnBackend(DEVICE)
    raw = raw_verify(6, seed=3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = verify_rows(instance, raw)
        second = verify_rows(instance, raw)
    expected = sglang_rows(sgl, instance, raw.seq_lens + 4, raw.req_pool_indices, 4)
    assert_same(first, expected)
    assert_same(second, expected)
    assert calls == [1], "ours ran once, then the hook stayed off"
    records = [r for r in caplog.records if r.name == LOGGER and "failed" in r.getMessage()]
    assert len(records) == 1 and "injected fault" in records[0].getMessage()
    assert sgl.registry._hooks[TARGET][0][1].enabled is False


def test_inputs_ours_reject_run_sglang_with_one_warning(backend, monkeypatch, caplog):
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    instance = module.DeepseekV4AttnBackend(DEVICE)
    # A strided view of the lengths: SGLang's method takes it, ours does not.
    lengths = torch.arange(10, 22, dtype=torch.int64, device=DEVICE)[::2]
    slots = torch.arange(6, dtype=torch.int64, device=DEVICE)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):
            rows = draft_extend_rows(instance, lengths, slots, 3)
    assert_same(rows, sglang_rows(sgl, instance, lengths, slots, 3))
    rejected = [r for r in caplog.records if "rejected the inputs" in r.getMessage()]
    assert len(rejected) == 1 and "seq_lens" in rejected[0].getMessage()
    assert sgl.registry._hooks[TARGET][0][1].enabled


def test_arange_on_another_device_steps_aside(backend, monkeypatch):
    """SGLang's own runs (and raises its own error) where its aranges would not land on the
    lengths' device: ours would have answered where SGLang fails."""
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch)
    instance = module.DeepseekV4AttnBackend("meta")
    lengths = torch.arange(1, 4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - whatever SGLang's add raises
        instance.expand_extend_with_same_length(bs=3, qo_len=4, seq_lens=lengths,
                                                req_pool_indices=lengths)
    assert "dsv4spec" not in str(raised.value)
    del instance.cuda_int32_kwargs
    with pytest.raises(AttributeError, match="cuda_int32_kwargs"):
        instance.expand_extend_with_same_length(bs=3, qo_len=4, seq_lens=lengths,
                                                req_pool_indices=lengths)
    assert calls == [] and sgl.registry._hooks[TARGET][0][1].enabled
    cpu = torch.device("cpu")
    assert hooks._arange_device_matches({"device": "cpu"}, cpu)
    assert not hooks._arange_device_matches({"device": "cuda:0"}, cpu)
    assert not hooks._arange_device_matches({}, cpu)
    assert hooks._arange_device_matches({"device": "cuda:1"}, torch.device("cuda", 1))
    assert not hooks._arange_device_matches({"device": "cuda:0"}, torch.device("cuda", 1))


def test_first_sight_inside_a_capture_steps_aside(backend, monkeypatch):
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch)
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    instance = module.DeepseekV4AttnBackend(DEVICE)
    raw = raw_verify(4, seed=5)
    expected = sglang_rows(sgl, instance, raw.seq_lens + 4, raw.req_pool_indices, 4)
    assert_same(verify_rows(instance, raw), expected)
    assert calls == [], "not compiled before the capture: SGLang's"
    monkeypatch.setattr(hooks, "_capturing", lambda index: False)
    verify_rows(instance, raw)  # eager: ours runs, and is compiled
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    assert_same(verify_rows(instance, raw), expected)
    assert calls == [4, 4]


def test_graph_table_compiles_ours_eagerly_and_runs_it_in_the_capture(backend, monkeypatch):
    sgl, module = backend
    monkeypatch.setitem(hooks.TABLES, hooks.EXPAND,
                        {(9, 0): {"graph": {4: ((1, 64),)}, "eager": {}}})
    sgl.install()
    calls = counted(monkeypatch)
    instance = module.DeepseekV4AttnBackend(DEVICE)
    raw = raw_verify(8, seed=6)
    expected = sglang_rows(sgl, instance, raw.seq_lens + 4, raw.req_pool_indices, 4)
    original = sgl.originals[TARGET]
    before = original.calls
    assert_same(verify_rows(instance, raw), expected)  # eager: SGLang's result
    assert original.calls == before + 1 and calls == [4], "ours compiled, its result dropped"
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    assert_same(verify_rows(instance, raw), expected)
    assert original.calls == before + 1 and calls == [4, 4]
    assert_same(verify_rows(instance, raw_verify(65, seed=6)),
                sglang_rows(sgl, instance, raw_verify(65, seed=6).seq_lens + 4,
                            raw_verify(65, seed=6).req_pool_indices, 4))
    assert calls == [4, 4], "65 requests: outside the measured range"


def test_rocm_and_torch_compile_step_aside(backend, monkeypatch):
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch)
    instance = module.DeepseekV4AttnBackend(DEVICE)
    raw = raw_verify(3, seed=7)
    expected = sglang_rows(sgl, instance, raw.seq_lens + 4, raw.req_pool_indices, 4)
    monkeypatch.setattr(hooks, "on_rocm", lambda: True)
    assert_same(verify_rows(instance, raw), expected)
    monkeypatch.setattr(hooks, "on_rocm", lambda: False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert_same(verify_rows(instance, raw), expected)
    assert calls == []


# --- GPU: SGLang's verify build captured in a CUDA graph, replayed with new lengths -------------

@pytest.mark.gpu
def test_gpu_hook_inside_a_cuda_graph(backend, monkeypatch):
    sgl, module = backend
    fill_table(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch)
    instance = module.DeepseekV4AttnBackend("cuda")
    raw = raw_verify(16, seed=8)
    verify_rows(instance, raw)  # SGLang's warm-up before capture: compiles ours eagerly
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = verify_rows(instance, raw)
    assert len(calls) == 2, "ours ran in the warm-up and in the capture"
    for seed in range(3):
        new = raw_verify(16, seed=seed + 20)
        raw.seq_lens.copy_(new.seq_lens)
        raw.req_pool_indices.copy_(new.req_pool_indices)
        graph.replay()
        assert_same(rows, sglang_rows(sgl, instance, raw.seq_lens + 4, raw.req_pool_indices, 4))


# --- the benchmark's entries -------------------------------------------------------------------

def test_bench_cites_the_call_sites_and_checks_both_providers_equal():
    import re

    from dsv4spec.bench import metadata as bench
    from dsv4spec.integrations.sglang.source import sglang_file, sglang_root

    if sglang_root() is None:
        pytest.skip("SGLang's source is not installed")

    lines = sglang_file(BACKEND_FILE).read_text().splitlines()
    steps = {s["phase"]: s for s in bench.calls_per_mtp_step()}
    for phase, caller in (("target verify, row expansion", CALLERS[0]),
                          ("draft extend, row expansion", CALLERS[1])):
        line = int(re.search(r"deepseek_v4_backend\.py:(\d+)", steps[phase]["source"])[1])
        assert "self.expand_extend_with_same_length(" in lines[line - 1]
        assert caller in steps[phase]["source"] and steps[phase]["calls"] == 1
    method = bench.load_sglang_expand()
    with interpreter_loop_bounds():
        for op in bench.EXPAND_OPS:
            for bs in (1, 9):
                x = bench.expand_inputs(bs, 4, device="cpu", seed=bs)
                fns = bench.expand_providers(op, x, bs, 4, method)
                bench.expand_refcheck(op, fns["dsv4spec"](), fns["sglang"]())
        with pytest.raises(AssertionError, match="differ"):
            bench.expand_refcheck("expand", fns["dsv4spec"](), fns["sglang"]()[::-1])
