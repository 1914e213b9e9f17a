"""The hooks on SGLang's ``DSV4AttnMetadata.init_compression_metadata`` and
``init_flashmla_related`` through SGLang's own hook registry, on a stand-in object carrying
SGLang's own two methods (their source, executed by path) over SGLang's ``metadata_kernel.py``:
the empty shipped table keeps SGLang's; a filled table gives SGLang's fields (one launch); every
uncovered call, a fault, or a capture's first sight runs SGLang's."""

import logging

import pytest
import torch

from dsv4spec.bench.metadata import COMPRESSION_FIELDS
from dsv4spec.integrations.sglang import metadata as hooks
from dsv4spec.ops.attention_metadata import c128_index_extent

from ...kernels.attention_metadata_support import (
    assert_compression_fields_equal,
    interpreter_loop_bounds,
    make_batch,
    written_mask,
)
from . import standins
from .conftest import COMPRESSION_METHOD, FLASHMLA_METHOD

PAGE, PAGES = 256, 160
CONTEXT = PAGE * PAGES
LENGTHS = [0, 1, 4, 127, 128, 129, 256, 257, 8191, 8192, 8193, CONTEXT - 1, CONTEXT]
LOGGER = "dsv4spec.integrations.sglang"


@pytest.fixture
def meta(sgl, monkeypatch):
    monkeypatch.setattr(hooks, "_pending_sparse", None)
    with interpreter_loop_bounds():
        yield sgl


def fill_table(monkeypatch, rows=(1, 10_000), eager=True):
    spans = {PAGES: (rows,)}
    monkeypatch.setitem(hooks.TABLES, hooks.COMPRESSION,
                        {(9, 0): {"graph": spans, "eager": spans if eager else {}}})


def make_metadata(sgl, seed=0, present=(0, 4, 128), **overrides):
    x = make_batch(3, LENGTHS, CONTEXT, seed=seed, device=standins.DEVICE)
    prep = sgl.page_metadata.build_page_table_positions_triton(
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], max_seq_len=CONTEXT, page_size=PAGE, swa_window=128)
    swa = torch.randint(-1, 1 << 20, (len(LENGTHS), 128), dtype=torch.int32,
                        generator=torch.Generator().manual_seed(seed)).to(standins.DEVICE)
    fields = dict(page_size=PAGE, page_table=prep.page_table, raw_out_loc=x["out_loc"],
                  seq_lens_casual=prep.seq_lens_casual, positions_casual=prep.positions_casual,
                  swa_page_indices=swa, index_topk=512, present_ratios=present)
    fields.update(overrides)
    cls = sgl.backend.DSV4AttnMetadata
    return cls(**fields), cls(**fields)


def run_both(sgl, ours, theirs, **kwargs):
    """SGLang's call sequence (make_core_attn_metadata: one, then the other) on ``ours`` through
    the hooked class, and SGLang's own methods on ``theirs``."""
    ours.init_compression_metadata(None, None)
    ours.init_flashmla_related(is_prefill=kwargs.get("is_prefill", False))
    sgl.originals[COMPRESSION_METHOD](theirs, None, None)
    sgl.originals[FLASHMLA_METHOD](theirs, is_prefill=kwargs.get("is_prefill", False))


def assert_same_fields(ours, theirs):
    assert_compression_fields_equal(ours, theirs, ours.seq_lens_casual)
    for name in ("c0_flashmla_metadata", "c4_flashmla_metadata", "c128_flashmla_metadata"):
        assert (getattr(ours, name) is None) == (getattr(theirs, name) is None), name


def counted_op(monkeypatch):
    calls = []
    original = hooks.build_compression_metadata

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(hooks, "build_compression_metadata", wrapper)
    return calls


def test_hooks_install_on_the_class(meta):
    installed = meta.install()
    assert COMPRESSION_METHOD in installed and FLASHMLA_METHOD in installed
    cls = meta.backend.DSV4AttnMetadata
    assert cls.init_compression_metadata.__wrapped__ is meta.originals[COMPRESSION_METHOD]


def test_shipped_table_follows_the_h200_results():
    """benchmarks/results/tune/NVIDIA_H200.md: in a graph ours won at every width measured, 64 to
    8,192 pages, and every row count, 1 to 2,048; eager stays SGLang's (prefill and extend builds
    are eager)."""
    for width in (64, 100, 4096, 8192):
        for rows in (1, 4, 128, 512, 2048):
            assert hooks.prefers_dsv4spec(hooks.COMPRESSION, rows, width, True, (9, 0)), rows
            assert not hooks.prefers_dsv4spec(hooks.COMPRESSION, rows, width, False, (9, 0))
    for rows, width in ((0, 4096), (2049, 4096), (4, 63), (4, 8193)):
        assert not hooks.prefers_dsv4spec(hooks.COMPRESSION, rows, width, True, (9, 0))
    for architecture in ((8, 0), (10, 0), None):
        assert not hooks.prefers_dsv4spec(hooks.COMPRESSION, 4, 4096, True, architecture)


def test_empty_table_keeps_sglang(meta, monkeypatch):
    monkeypatch.setitem(hooks.TABLES, hooks.COMPRESSION, {})
    meta.install()
    calls = counted_op(monkeypatch)
    ours, theirs = make_metadata(meta, 1)
    run_both(meta, ours, theirs)
    assert calls == []
    assert_same_fields(ours, theirs)
    for name in COMPRESSION_FIELDS:  # SGLang's own: every element equal
        assert torch.equal(getattr(ours, name), getattr(theirs, name))


@pytest.mark.parametrize("present", [(0, 4, 128), (0, 4), (0, 128)])
def test_filled_table_gives_sglang_fields_in_one_launch(meta, monkeypatch, present):
    fill_table(monkeypatch)
    meta.install()
    calls = counted_op(monkeypatch)
    ours, theirs = make_metadata(meta, 2, present)
    inputs = {k: getattr(ours, k).clone() for k in ("seq_lens_casual", "page_table",
                                                    "raw_out_loc", "swa_page_indices")}
    sglang_calls = meta.originals[COMPRESSION_METHOD].calls
    run_both(meta, ours, theirs)
    assert calls == [1]
    assert meta.originals[COMPRESSION_METHOD].calls == sglang_calls + 1  # theirs only
    assert_same_fields(ours, theirs)
    assert all(torch.equal(getattr(ours, k), v) for k, v in inputs.items()
               if k != "swa_page_indices")  # reassigned to the padded copy, as SGLang does
    assert hooks._pending_sparse is None


@pytest.mark.parametrize("change", [
    {"low_ratios": (1, 2)}, {"request_window_layout": object()},
    {"present_ratios": (0, 1, 2, 4, 128)}, {"present_ratios": (0,)}, {"index_topk": 256},
])
def test_uncovered_metadata_runs_sglang(meta, monkeypatch, change):
    fill_table(monkeypatch)
    meta.install()
    calls = counted_op(monkeypatch)
    ours, _ = make_metadata(meta, 3, **{k: v for k, v in change.items()
                                        if k in ("present_ratios", "index_topk")})
    for k, v in change.items():
        setattr(ours, k, v)
    assert not hooks._attn_metadata_covered(ours, None, None)
    assert calls == []


def test_context_parallel_and_low_ratio_buffers_run_sglang(meta, monkeypatch):
    fill_table(monkeypatch)
    meta.install()
    calls = counted_op(monkeypatch)
    ours, theirs = make_metadata(meta, 4)
    rows = ours.seq_lens_casual.shape[0]
    ours.init_compression_metadata(rows, None)
    meta.originals[COMPRESSION_METHOD].__wrapped__(theirs, rows, None)
    assert calls == []
    assert torch.equal(ours.c128_page_indices, theirs.c128_page_indices)


def test_prefill_flashmla_runs_sglang_with_the_same_values(meta, monkeypatch):
    fill_table(monkeypatch)
    meta.install()
    ours, theirs = make_metadata(meta, 5)
    run_both(meta, ours, theirs, is_prefill=True)
    assert_same_fields(ours, theirs)
    assert ours.c4_sparse_raw_indices is not None  # SGLang's own prefill branch ran


def test_a_modified_clamp_is_not_reused(meta, monkeypatch):
    fill_table(monkeypatch)
    meta.install()
    ours, theirs = make_metadata(meta, 6)
    ours.init_compression_metadata(None, None)
    ours.c4_topk_lengths_clamp1.add_(1)  # in place: the precomputed clamp is stale
    ours.init_flashmla_related()
    assert torch.equal(ours.c4_sparse_topk_lengths,
                       ours.c4_topk_lengths_clamp1.clamp(max=512))


def test_a_failing_fast_path_falls_back_once(meta, monkeypatch, caplog):
    fill_table(monkeypatch)
    meta.install()
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("injected fault")

    monkeypatch.setattr(hooks, "build_compression_metadata", broken)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for seed in (7, 8):
            ours, theirs = make_metadata(meta, seed)
            run_both(meta, ours, theirs)
            for name in COMPRESSION_FIELDS:
                assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert calls == [1]
    assert len([r for r in caplog.records if "injected fault" in r.getMessage()]) == 1
    assert meta.registry._hooks[COMPRESSION_METHOD][0][1].enabled is False


def test_first_sight_inside_a_capture_runs_sglang(meta, monkeypatch):
    fill_table(monkeypatch, eager=False)
    meta.install()
    calls = counted_op(monkeypatch)
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    ours, theirs = make_metadata(meta, 9)
    run_both(meta, ours, theirs)
    assert calls == []
    for name in COMPRESSION_FIELDS:
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    monkeypatch.setattr(hooks, "_capturing", lambda index: False)
    ours, _ = make_metadata(meta, 9)
    ours.init_compression_metadata(None, None)  # eager: launched once to compile, dropped
    assert calls == [1]
    monkeypatch.setattr(hooks, "_capturing", lambda index: True)
    ours, theirs = make_metadata(meta, 10)
    run_both(meta, ours, theirs)
    assert calls == [1, 1]
    assert_same_fields(ours, theirs)


@pytest.mark.gpu
def test_gpu_hooks_in_a_cuda_graph_replayed_with_new_lengths(meta, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fill_table(monkeypatch, eager=False)
    meta.install()
    ours, _ = make_metadata(meta, 11)
    ours.__dict__.update({k: v.cuda() for k, v in vars(ours).items()
                          if isinstance(v, torch.Tensor)})
    ours.init_compression_metadata(None, None)  # eager: compiles ours
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ours.init_compression_metadata(None, None)
        ours.init_flashmla_related()
    for seed in (12, 13):
        new, theirs = make_metadata(meta, seed)
        for t in (new, theirs):
            t.__dict__.update({k: v.cuda() for k, v in vars(t).items()
                               if isinstance(v, torch.Tensor)})
        ours_inputs = ("seq_lens_casual", "page_table", "raw_out_loc")
        for k in ours_inputs:
            getattr(ours, k).copy_(getattr(new, k))
        graph.replay()
        meta.originals[COMPRESSION_METHOD].__wrapped__(theirs, None, None)
        meta.originals[FLASHMLA_METHOD].__wrapped__(theirs)
        torch.cuda.synchronize()
        for name in COMPRESSION_FIELDS:
            if name == "swa_page_indices":
                continue  # captured from the first object's SWA table
            a, b = getattr(ours, name), getattr(theirs, name)
            written = (written_mask(tuple(a.shape), c128_index_extent(
                theirs.seq_lens_casual, a.shape[1])) if name == "c128_page_indices"
                else torch.ones_like(a, dtype=torch.bool))
            assert torch.equal(a[written], b[written]), name
