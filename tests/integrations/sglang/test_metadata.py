"""The DSV4 attention-metadata hooks through SGLang's own hook registry, on SGLang's own kernel
files (loaded by path at their dotted names) and reached through SGLang's own call chains
(``BuildPageTablePositions.triton`` and ``init_compression_metadata`` look the hooked names up
at call time)."""

import ast
import logging
import sys

import pytest
import torch

from dsv4spec.bench.metadata import BACKEND_FILE, C128_FILE, PAGE_FILE
from dsv4spec.integrations.hooks import GuardedHook
from dsv4spec.integrations.sglang import metadata as hooks
from dsv4spec.integrations.sglang import plugin
from dsv4spec.ops.attention_metadata import c128_index_extent, page_table_extent

from ...kernels.attention_metadata_support import (
    interpreter_loop_bounds,
    make_batch,
    written_mask,
)
from . import standins
from .conftest import COMPRESSED as C128_TARGET
from .conftest import COMPRESSION_METHOD, DRAFT_METADATA, FLASHMLA_METHOD
from .conftest import EXPAND as EXPAND_TARGET
from .conftest import PAGE_TABLE as PAGE_TARGET
from .standins import C128_METADATA_MOD as C128_MOD
from .standins import PAGE_METADATA_MOD as PAGE_MOD
from .standins import class_node, function_node

SWITCH = "DSV4SPEC_SGLANG_METADATA"
METADATA_HOOKS = tuple(hook for hook in plugin.HOOKS if hook.switch == SWITCH)
LOGGER = "dsv4spec.integrations.sglang"
PAGE, PAGES = 256, 64
CONTEXT = PAGE * PAGES
LENGTHS = [1, 2, 128, 256, 257, 3000, 3001, 3002, CONTEXT]
# A shape of the shipped tables (benchmarks/results/tune/NVIDIA_H200.md): 1M tokens of capacity
# in 256-token pages, where ours won both builders in a graph at every row count measured, 1 to
# 2,048 (bs 512 verifying 4 tokens); at 64 pages (PAGES) SGLang's won at one row.
MEASURED_PAGES = 4096
MEASURED_ROWS = (1, 2048)


@pytest.fixture
def meta(sgl):
    """``sgl`` (with SGLang's two metadata kernel files at their dotted paths), in Triton's
    interpreter where there is no GPU."""
    with interpreter_loop_bounds():
        yield sgl, sgl.page_metadata, sgl.c128_metadata


def fill_tables(monkeypatch, rows=(1, 10_000)):
    """Tables that prefer dsv4spec's kernels at this test's width, in both modes."""
    for op in (hooks.PAGE_TABLE, hooks.COMPRESSED):
        monkeypatch.setitem(hooks.TABLES, op, {(9, 0): {"graph": {PAGES: (rows,)},
                                                        "eager": {PAGES: (rows,)}}})


def counted(monkeypatch, name):
    calls = []
    original = getattr(hooks, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(hooks, name, wrapper)
    return calls


def batch(seed=0):
    return make_batch(3, LENGTHS, CONTEXT, seed=seed)


def page_call(page_mod, x, context=CONTEXT):
    """SGLang's own path from the backend: ``BuildPageTablePositions.triton`` (what ``execute``
    runs on CUDA inputs)."""
    return page_mod.BuildPageTablePositions.triton(
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], max_seq_len=context, page_size=PAGE, swa_window=128)


def page_original(sgl, x, context=CONTEXT):
    return sgl.originals[PAGE_TARGET](
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], max_seq_len=context, page_size=PAGE, swa_window=128)


def assert_page_result(actual, expected, seq_lens, page_mod):
    assert type(actual) is page_mod.PageTablePositionsResult
    for name in ("seq_lens_casual", "positions_casual", "swa_topk_lengths"):
        assert torch.equal(getattr(actual, name), getattr(expected, name)), name
    written = written_mask(tuple(actual.page_table.shape),
                           page_table_extent(seq_lens, actual.page_table.shape[1], PAGE))
    assert actual.page_table.shape == expected.page_table.shape
    assert torch.equal(actual.page_table[written], expected.page_table[written])


def assert_compressed_result(actual, expected, seq_lens):
    assert isinstance(actual, tuple) and len(actual) == 9
    assert all(torch.equal(a, b) for a, b in zip(actual[:8], expected[:8]))
    written = written_mask(tuple(actual[8].shape), c128_index_extent(seq_lens,
                                                                      actual[8].shape[1]))
    assert torch.equal(actual[8][written], expected[8][written])


# --- SGLang's source: the targets and how the backend reaches them ------------------------------

def test_targets_and_call_chains_in_sglang_source():
    assert [hook.target for hook in METADATA_HOOKS] == [
        PAGE_TARGET, C128_TARGET, EXPAND_TARGET, COMPRESSION_METHOD, FLASHMLA_METHOD,
        DRAFT_METADATA]
    for hook, relpath in zip(METADATA_HOOKS, (PAGE_FILE, C128_FILE)):
        fn = function_node(relpath, hook.attr)
        assert tuple(a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs) == (
            hook.params)
    # The callers look the hooked names up in their module's globals at call time.
    triton = next(n for n in class_node(PAGE_FILE, "BuildPageTablePositions").body
                  if isinstance(n, ast.FunctionDef) and n.name == "triton")
    assert "build_page_table_positions_triton" in {
        n.func.id for n in ast.walk(triton) if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)}
    wrapper = function_node(C128_FILE, "init_compression_metadata")
    assert "_init_compressed_attn_metadata_triton" in {
        n.func.id for n in ast.walk(wrapper) if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)}
    tree, _ = standins.parse(BACKEND_FILE)
    imported = {(n.module, a.name, a.asname) for n in tree.body if isinstance(n, ast.ImportFrom)
                for a in n.names}
    assert (PAGE_MOD, "BuildPageTablePositions", None) in imported
    assert (C128_MOD, "init_compression_metadata", "_init_compression_metadata_triton") in (
        imported)


# --- registration ------------------------------------------------------------------------------

def test_register_installs_both_around_hooks(meta):
    sgl, page_mod, c128_mod = meta
    installed = sgl.install()
    assert PAGE_TARGET in installed and C128_TARGET in installed
    for target, module, name in ((PAGE_TARGET, page_mod, "build_page_table_positions_triton"),
                                 (C128_TARGET, c128_mod, "_init_compressed_attn_metadata_triton")):
        hooked = getattr(module, name)
        assert hooked is not sgl.originals[target]
        assert hooked.__wrapped__ is sgl.originals[target]
        entries = [h for _, h, _ in sgl.registry._hooks[target]]
        assert len(entries) == 1 and isinstance(entries[0], GuardedHook)


def test_switch_off_installs_none_of_the_three(meta, monkeypatch):
    sgl, page_mod, c128_mod = meta
    monkeypatch.setenv(SWITCH, "0")
    installed = sgl.install()
    assert not {PAGE_TARGET, C128_TARGET, EXPAND_TARGET} & set(installed)
    assert page_mod.build_page_table_positions_triton is sgl.originals[PAGE_TARGET]
    assert c128_mod._init_compressed_attn_metadata_triton is sgl.originals[C128_TARGET]
    assert sgl.backend.DeepseekV4AttnBackend.expand_extend_with_same_length is (
        sgl.originals[EXPAND_TARGET])


# --- behaviour through SGLang's call chains ----------------------------------------------------

def test_widths_the_tables_lack_keep_sglang_everywhere(meta, monkeypatch):
    sgl, page_mod, c128_mod = meta
    sgl.install()  # the shipped tables: nothing measured at this width
    calls = counted(monkeypatch, "build_page_table_positions")
    calls += counted(monkeypatch, "init_compressed_attn_metadata")
    x = batch()
    prep = page_call(page_mod, x)
    expected = page_original(sgl, x)
    assert torch.equal(prep.page_table, expected.page_table)  # SGLang's, every column
    out = c128_mod.init_compression_metadata(x["seq_lens"], x["positions"], x["out_loc"],
                                             prep.page_table, PAGE, True)
    assert torch.equal(out[8], sgl.originals[C128_TARGET](
        x["seq_lens"], x["positions"], x["out_loc"], prep.page_table, PAGE, True)[8])
    assert calls == []


def test_measured_tables_run_ours_with_sglang_results(meta, monkeypatch):
    sgl, page_mod, c128_mod = meta
    fill_tables(monkeypatch)
    sgl.install()
    page_calls = counted(monkeypatch, "build_page_table_positions")
    c128_calls = counted(monkeypatch, "init_compressed_attn_metadata")
    x = batch(1)
    prep = page_call(page_mod, x)
    assert page_calls == [1]
    expected = page_original(sgl, x)
    assert_page_result(prep, expected, x["seq_lens"], page_mod)
    for out_loc in (x["out_loc"], x["out_loc"][:-2]):  # context-parallel padding rows
        out = c128_mod.init_compression_metadata(x["seq_lens"], x["positions"], out_loc,
                                                 prep.page_table, PAGE, True)
        want = sgl.originals[C128_TARGET](x["seq_lens"], x["positions"], out_loc,
                                          expected.page_table, PAGE, True)
        assert_compressed_result(out, want, x["seq_lens"])
    out = c128_mod.init_compression_metadata(x["seq_lens"], x["positions"], x["out_loc"],
                                             prep.page_table, PAGE, False)
    assert out[8] is None
    assert len(c128_calls) == 3


def test_rows_outside_the_measured_range_step_aside(meta, monkeypatch):
    sgl, page_mod, _ = meta
    fill_tables(monkeypatch, rows=(1, 4))
    sgl.install()
    calls = counted(monkeypatch, "build_page_table_positions")
    x = batch(2)  # 9 rows
    assert torch.equal(page_call(page_mod, x).page_table, page_original(sgl, x).page_table)
    assert calls == []


def test_a_failing_fast_path_falls_back_once_and_switches_off(meta, monkeypatch, caplog):
    sgl, page_mod, _ = meta
    fill_tables(monkeypatch)
    sgl.install()
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("injected fault")

    monkeypatch.setattr(hooks, "build_page_table_positions", broken)
    x = batch(3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = page_call(page_mod, x)
        second = page_call(page_mod, x)
    expected = page_original(sgl, x)
    for result in (first, second):
        assert torch.equal(result.page_table, expected.page_table)
    assert calls == [1], "ours ran once, then the hook stayed off"
    records = [r for r in caplog.records if r.name == LOGGER and "failed" in r.getMessage()]
    assert len(records) == 1 and "injected fault" in records[0].getMessage()
    hook = sgl.registry._hooks[PAGE_TARGET][0][1]
    assert hook.enabled is False


def test_inputs_ours_reject_run_sglang_with_one_warning(meta, monkeypatch, caplog, launches):
    sgl, page_mod, c128_mod = meta
    fill_tables(monkeypatch)
    sgl.install()
    x = batch(4)
    table = page_original(sgl, x).page_table.long()  # SGLang's kernel takes it, ours does not
    launches.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):
            out = c128_mod.init_compression_metadata(x["seq_lens"], x["positions"],
                                                     x["out_loc"], table, PAGE, True)
    assert launches == [], "rejected before any launch (nothing to undo inside a capture)"
    want = sgl.originals[C128_TARGET](x["seq_lens"], x["positions"], x["out_loc"], table, PAGE,
                                      True)
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    rejected = [r for r in caplog.records if "rejected the inputs" in r.getMessage()]
    assert len(rejected) == 1 and "page_table" in rejected[0].getMessage()
    assert sgl.registry._hooks[C128_TARGET][0][1].enabled


def test_sglang_own_assertions_still_raise(meta, monkeypatch):
    sgl, _, c128_mod = meta
    fill_tables(monkeypatch)
    sgl.install()
    x = batch(5)
    too_many = torch.cat([x["out_loc"], x["out_loc"]])
    with pytest.raises(AssertionError, match="raw_out_loc has"):
        c128_mod.init_compression_metadata(x["seq_lens"], x["positions"], too_many, None, PAGE,
                                           False)
    assert sgl.registry._hooks[C128_TARGET][0][1].enabled


def test_first_sight_inside_a_capture_steps_aside(meta, monkeypatch):
    sgl, page_mod, _ = meta
    fill_tables(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch, "build_page_table_positions")
    monkeypatch.setattr(hooks, "stream_capturing", lambda index: True)
    monkeypatch.setattr(hooks, "gpu_architecture", lambda index: (9, 0))
    cuda = torch.device("cuda", 0)
    assert hooks._run(hooks.PAGE_TABLE, cuda, 4, PAGES, ("k",), lambda: 1 / 0) is hooks.STEP_ASIDE
    hooks._compiled.add((hooks.PAGE_TABLE, 0, "k"))
    assert hooks._run(hooks.PAGE_TABLE, cuda, 4, PAGES, ("k",), lambda: "ours") == "ours"
    assert calls == []


# --- the shipped tables ------------------------------------------------------------------------

@pytest.mark.parametrize("op", [hooks.PAGE_TABLE, hooks.COMPRESSED])
def test_shipped_tables_prefer_ours_in_graphs_at_the_measured_shape_only(op, h200_tables):
    lo, hi = MEASURED_ROWS
    for rows in (lo, 4, 16, 64, 256, hi):  # measured there; between, only clear wins carry
        assert hooks.prefers_dsv4spec(op, rows, MEASURED_PAGES, True, (9, 0)), rows
        assert not hooks.prefers_dsv4spec(op, rows, MEASURED_PAGES, False, (9, 0)), rows
    for rows in (0, hi + 1, 4096):
        assert not hooks.prefers_dsv4spec(op, rows, MEASURED_PAGES, True, (9, 0)), rows
    for pages in (MEASURED_PAGES // 2, MEASURED_PAGES + 1, MEASURED_PAGES * 2):
        assert hooks.prefers_dsv4spec(op, lo, pages, True, (9, 0)), pages
    for pages in (PAGES // 2, PAGES, MEASURED_PAGES * 4):  # below, at 64, beyond the measured
        assert not hooks.prefers_dsv4spec(op, lo, pages, True, (9, 0)), pages
    for architecture in ((8, 0), (10, 0), (12, 0), None):
        assert not hooks.prefers_dsv4spec(op, lo, MEASURED_PAGES, True, architecture)


def test_shipped_tables_through_sglang_call_chains(meta, monkeypatch, h200_tables):
    """At the measured width: eagerly SGLang's results (ours launched once, to compile for the
    capture), inside a capture ours, with SGLang's values over every written extent."""
    sgl, page_mod, c128_mod = meta
    sgl.install()
    page_calls = counted(monkeypatch, "build_page_table_positions")
    c128_calls = counted(monkeypatch, "init_compressed_attn_metadata")
    capacity = PAGE * MEASURED_PAGES
    # 16 query rows, a count the H200 run measured (between measured counts only clear wins
    # carry)
    lengths = [1, 300, 70_000, 70_001, capacity - 1, capacity, *(5_003 * i for i in range(1, 11))]
    x = make_batch(3, lengths, capacity, seed=8)

    def step():  # make_core_attn_metadata's two calls
        prep = page_call(page_mod, x, capacity)
        return prep, c128_mod.init_compression_metadata(
            prep.seq_lens_casual, x["positions"], x["out_loc"], prep.page_table, PAGE, True)

    expected = page_original(sgl, x, capacity)
    want = sgl.originals[C128_TARGET](x["seq_lens"], x["positions"], x["out_loc"],
                                      expected.page_table, PAGE, True)
    prep, out = step()
    assert torch.equal(prep.page_table, expected.page_table)  # SGLang's, every column
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    assert page_calls == [1] and c128_calls == [1], "ours compiled, its result dropped"
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    prep, out = step()
    assert page_calls == [1, 1] and c128_calls == [1, 1]
    assert_page_result(prep, expected, x["seq_lens"], page_mod)
    assert_compressed_result(out, want, x["seq_lens"])


def test_shipped_tables_inside_a_capture_beyond_the_measured_rows_keep_sglang(meta, monkeypatch):
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    cpu = torch.device("cpu")
    lo, hi = MEASURED_ROWS
    for op in (hooks.PAGE_TABLE, hooks.COMPRESSED):
        hooks._compiled.add((op, -1, "k"))
        assert hooks._run(op, cpu, hi, MEASURED_PAGES, ("k",), lambda: "ours") == "ours"
        assert hooks._run(op, cpu, hi + 1, MEASURED_PAGES, ("k",), lambda: 1 / 0) is (
            hooks.STEP_ASIDE)
        assert hooks._run(op, cpu, lo, PAGES, ("k",), lambda: 1 / 0) is (
            hooks.STEP_ASIDE)


# --- page-table readers the source does not bound -----------------------------------------------

def _torch_paged_logits(monkeypatch):
    monkeypatch.setenv(hooks.TORCH_PAGED_LOGITS_ENV, "1")
    return hooks.TORCH_PAGED_LOGITS_ENV


def _flashinfer_topk(monkeypatch):
    standins.set_topk_backends("flashinfer", "sgl-kernel")
    return "flashinfer"


def _flashinfer_draft_topk(monkeypatch):
    standins.set_topk_backends("sgl-kernel", "flashinfer")
    return "flashinfer"


def _unpublished_configuration(monkeypatch):
    def get_exec():
        raise ValueError("exec is not published")

    monkeypatch.setattr(sys.modules[standins.RUNTIME_CONTEXT_MOD], "get_exec", get_exec)
    return "not published"


@pytest.mark.parametrize("configure", [
    pytest.param(_torch_paged_logits, id="torch paged MQA logits"),
    pytest.param(_flashinfer_topk, id="flashinfer top-k"),
    pytest.param(_flashinfer_draft_topk, id="flashinfer draft top-k"),
    pytest.param(_unpublished_configuration, id="configuration not readable"),
])
def test_unbounded_page_table_reader_keeps_sglang_page_table(meta, monkeypatch, caplog,
                                                             configure):
    sgl, page_mod, c128_mod = meta
    fill_tables(monkeypatch)
    sgl.install()
    page_calls = counted(monkeypatch, "build_page_table_positions")
    c128_calls = counted(monkeypatch, "init_compressed_attn_metadata")
    assert hooks.unbounded_reader() is None
    said = configure(monkeypatch)
    assert said in hooks.unbounded_reader()
    x = batch(6)
    expected = page_original(sgl, x)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):
            prep = page_call(page_mod, x)
            assert torch.equal(prep.page_table, expected.page_table)  # SGLang's, every column
    assert page_calls == []
    records = [r for r in caplog.records if r.name == LOGGER and "own runs" in r.getMessage()]
    assert len(records) == 1 and said in records[0].getMessage()
    assert sgl.registry._hooks[PAGE_TARGET][0][1].enabled
    # The C128 indices' readers are bounded whatever reads the page table: ours still runs.
    out = c128_mod.init_compression_metadata(x["seq_lens"], x["positions"], x["out_loc"],
                                             prep.page_table, PAGE, True)
    want = sgl.originals[C128_TARGET](x["seq_lens"], x["positions"], x["out_loc"],
                                      prep.page_table, PAGE, True)
    assert c128_calls == [1]
    assert_compressed_result(out, want, x["seq_lens"])


def test_without_sglang_runtime_context_no_reader_is_configured(meta, monkeypatch):
    monkeypatch.delitem(sys.modules, standins.RUNTIME_CONTEXT_MOD)
    assert hooks.unbounded_reader() is None
    monkeypatch.setenv(hooks.TORCH_PAGED_LOGITS_ENV, "true")
    assert hooks.TORCH_PAGED_LOGITS_ENV in hooks.unbounded_reader()


# --- GPU: SGLang's call chain captured in a CUDA graph, replayed with new lengths ---------------

@pytest.mark.gpu
def test_gpu_hooks_inside_sglang_style_cuda_graph(meta, monkeypatch):
    sgl, page_mod, c128_mod = meta
    capacity, pages = 1 << 20, (1 << 20) // PAGE
    for op in (hooks.PAGE_TABLE, hooks.COMPRESSED):
        monkeypatch.setitem(hooks.TABLES, op, {(9, 0): {"graph": {pages: ((1, 10_000),)},
                                                        "eager": {pages: ((1, 10_000),)}}})
    sgl.install()
    calls = counted(monkeypatch, "build_page_table_positions")

    def lens(live):
        return make_batch(8, [min(live + 997 * i, capacity) for i in range(32)], capacity,
                          device="cuda", rows_per_request=4, seed=7)

    x = lens(4096)
    seq_lens, positions = x["seq_lens"].clone(), x["positions"].clone()

    def step():  # what make_core_attn_metadata does on CUDA inputs
        prep = page_mod.BuildPageTablePositions.execute(
            req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
            seq_lens_casual=seq_lens, max_seq_len=capacity, page_size=PAGE, swa_window=128)
        return prep, c128_mod.init_compression_metadata(prep.seq_lens_casual, positions,
                                                        x["out_loc"], prep.page_table, PAGE,
                                                        True)

    step()  # SGLang's warm-up before capture: compiles ours eagerly
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prep, compressed = step()
    assert len(calls) == 2, "ours ran in the warm-up and in the capture"
    for live in (100, 70_000, capacity - 5):
        new = lens(live)
        seq_lens.copy_(new["seq_lens"])
        positions.copy_(new["positions"])
        graph.replay()
        expected = sgl.originals[PAGE_TARGET](
            req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
            seq_lens_casual=seq_lens, max_seq_len=capacity, page_size=PAGE, swa_window=128)
        written = written_mask(tuple(prep.page_table.shape),
                               page_table_extent(seq_lens, pages, PAGE))
        assert torch.equal(prep.page_table[written], expected.page_table[written]), live
        want = sgl.originals[C128_TARGET](seq_lens, positions, x["out_loc"],
                                          expected.page_table, PAGE, True)
        written = written_mask(tuple(compressed[8].shape),
                               c128_index_extent(seq_lens, compressed[8].shape[1]))
        assert all(torch.equal(a, b) for a, b in zip(compressed[:8], want[:8])), live
        assert torch.equal(compressed[8][written], want[8][written]), live


def test_prefill_graphs_build_their_metadata_outside_the_capture():
    """The tables' graph entries assume every metadata build inside a capture is a target-verify
    or draft-decode one. SGLang's prefill CUDA graphs, whose sparse-prefill readers the
    unwritten-tail argument does not cover, build theirs before capturing (and refresh it before
    replaying), so those builds are eager calls, where the tables keep SGLang's builders."""
    runner = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
    capture = function_node(runner, "capture_one_shape", "PrefillCudaGraphRunner")
    forward = next(n for n in ast.walk(capture)
                   if isinstance(n, ast.FunctionDef) and n.name == "run_once")

    def calls(node, attr):
        return [n.lineno for n in ast.walk(node) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == attr]

    (build,) = calls(capture, "_init_forward_metadata_for_capture")
    (record,) = calls(capture, "capture_one")
    assert build < record and not calls(forward, "_init_forward_metadata_for_capture")
    assert not calls(forward, "init_forward_metadata_for_breakable_cuda_graph_capture")
    replay = function_node(runner, "_prepare_forward_metadata_for_replay",
                           "PrefillCudaGraphRunner")
    assert calls(replay, "prepare_forward_metadata_for_breakable_cuda_graph_replay")


# --- the page count, and the served model ------------------------------------------------------

def test_hooked_page_table_at_unaligned_max_seq_len_has_sglang_shape(meta, monkeypatch):
    """max_seq_len 100 tokens short of a page boundary: SGLang's table has cdiv columns (the
    partial page included, keyed as PAGES), and so has the hook's, with SGLang's values where
    rows reach into that page."""
    sgl, page_mod, _ = meta
    fill_tables(monkeypatch)
    sgl.install()
    calls = counted(monkeypatch, "build_page_table_positions")
    context = CONTEXT - 100
    x = make_batch(3, [1, 257, context - 1, context], context, seed=3)
    expected = page_original(sgl, x, context)
    assert expected.page_table.shape[1] == PAGES
    actual = page_call(page_mod, x, context)
    assert calls == [1]
    assert_page_result(actual, expected, x["seq_lens"], page_mod)
    assert int(page_table_extent(x["seq_lens"], PAGES, PAGE).max()) == PAGES


@pytest.mark.parametrize("model_type", ["deepseek_v41", "glm5_next", None])
def test_other_models_keep_sglang_metadata_builders(meta, monkeypatch, serves, model_type):
    """DSV4.1 runs the same backend, with page-table readers (expand_index_page_table,
    DeepSelect's topk_page_transform, the candidate table's paged logits metadata) that read
    columns past the live pages: every metadata hook keeps SGLang's."""
    sgl, page_mod, c128_mod = meta
    fill_tables(monkeypatch)
    serves(model_type)
    sgl.install()
    page_calls = counted(monkeypatch, "build_page_table_positions")
    c128_calls = counted(monkeypatch, "init_compressed_attn_metadata")
    x = batch()
    prep = page_call(page_mod, x)
    assert torch.equal(prep.page_table, page_original(sgl, x).page_table)  # every column
    out = c128_mod.init_compression_metadata(x["seq_lens"], x["positions"], x["out_loc"],
                                             prep.page_table, PAGE, True)
    want = sgl.originals[C128_TARGET](x["seq_lens"], x["positions"], x["out_loc"],
                                      prep.page_table, PAGE, True)
    assert all(torch.equal(a, b) for a, b in zip(out, want))  # every element, SGLang's
    assert page_calls == [] and c128_calls == []
