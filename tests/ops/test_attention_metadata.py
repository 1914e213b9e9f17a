"""The metadata ops: the torch references equal SGLang's builders at every position, the Triton
path equals them over its written extent, and bad inputs raise a clear error naming the
argument before anything is allocated or launched."""

import pytest
import torch

from dsv4spec.kernels import attention_metadata as kernels
from dsv4spec.ops.attention_metadata import (
    build_page_table_positions,
    build_page_table_positions_reference,
    c128_index_extent,
    expand_same_length,
    expand_same_length_reference,
    init_compressed_attn_metadata,
    init_compressed_attn_metadata_reference,
    page_table_extent,
)

from ..kernels.attention_metadata_support import (
    interpreter_loop_bounds,
    make_batch,
    sglang_builders,
    written_mask,
)

PAGE, CONTEXT = 256, 64 * 256
KW = {"max_seq_len": CONTEXT, "page_size": PAGE, "swa_window": 128}
LENGTHS = [0, 1, 128, 255, 256, 257, 4097, CONTEXT - 1, CONTEXT]


@pytest.fixture(autouse=True)
def _loop_bounds():
    with interpreter_loop_bounds():
        yield


@pytest.fixture(scope="module")
def sglang():
    return sglang_builders()


def test_references_equal_sglang_everywhere(sglang):
    x = make_batch(3, LENGTHS, CONTEXT, seed=2)
    theirs = sglang[0].build_page_table_positions_triton(
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], **KW)
    ref = build_page_table_positions_reference(x["req_to_token"], x["req_pool"], x["seq_lens"],
                                               **KW)
    for name in ("seq_lens_casual", "positions_casual", "page_table", "swa_topk_lengths"):
        assert torch.equal(getattr(ref, name), getattr(theirs, name)), name
    for out_loc in (x["out_loc"], x["out_loc"][:5]):
        expected = sglang[1]._init_compressed_attn_metadata_triton(
            x["seq_lens"], x["positions"], out_loc, ref.page_table, PAGE, True)
        got = init_compressed_attn_metadata_reference(x["seq_lens"], x["positions"], out_loc,
                                                      ref.page_table, PAGE, True)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_triton_equals_reference_where_written_and_torch_impl_is_the_reference():
    x = make_batch(2, LENGTHS, CONTEXT, seed=4)
    args = (x["req_to_token"], x["req_pool"], x["seq_lens"])
    ours = build_page_table_positions(*args, **KW)
    ref = build_page_table_positions(*args, **KW, impl="torch")
    written = written_mask(tuple(ours.page_table.shape),
                           page_table_extent(x["seq_lens"], CONTEXT // PAGE, PAGE))
    assert torch.equal(ours.page_table[written], ref.page_table[written])
    c_args = (x["seq_lens"], x["positions"], x["out_loc"], ref.page_table, PAGE, True)
    ours_c = init_compressed_attn_metadata(*c_args)
    ref_c = init_compressed_attn_metadata(*c_args, impl="torch")
    assert all(torch.equal(a, b) for a, b in zip(ours_c[:8], ref_c[:8]))
    written = written_mask(tuple(ours_c.c128_page_indices.shape),
                           c128_index_extent(x["seq_lens"], ours_c.c128_page_indices.shape[1]))
    assert torch.equal(ours_c.c128_page_indices[written], ref_c.c128_page_indices[written])


@pytest.mark.parametrize("max_seq_len", [
    pytest.param(CONTEXT - 100, id="100 short of a page boundary"),
    pytest.param(PAGE + 1, id="one token into the second page"),
])
def test_page_count_rounds_up_when_max_seq_len_is_not_page_aligned(sglang, max_seq_len):
    """The last, partial page is a column of the table: its shape is SGLang's,
    ``cdiv(max_seq_len, page_size)`` columns, and rows reaching into that page read it."""
    lengths = [1, PAGE, PAGE + 1, max_seq_len - 1, max_seq_len]
    x = make_batch(2, lengths, max_seq_len, seed=5)
    kw = {**KW, "max_seq_len": max_seq_len}
    theirs = sglang[0].build_page_table_positions_triton(
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], **kw)
    pages = -(-max_seq_len // PAGE)
    assert theirs.page_table.shape == (len(lengths), pages)
    args = (x["req_to_token"], x["req_pool"], x["seq_lens"])
    ref = build_page_table_positions_reference(*args, **kw)
    assert torch.equal(ref.page_table, theirs.page_table)
    ours = build_page_table_positions(*args, **kw)
    assert ours.page_table.shape == theirs.page_table.shape
    extent = page_table_extent(x["seq_lens"], pages, PAGE)
    assert int(extent.max()) == pages  # the partial page is written where a row reaches it
    written = written_mask(tuple(ours.page_table.shape), extent)
    assert torch.equal(ours.page_table[written], theirs.page_table[written])


@pytest.fixture
def no_launch(monkeypatch):
    """Fails the test if anything is allocated through the launchers or launched."""
    def forbidden(*args, **kwargs):
        raise AssertionError("launched after a bad input")

    monkeypatch.setattr(kernels, "_page_table_positions_live_kernel", forbidden)
    monkeypatch.setattr(kernels, "_compressed_attn_metadata_live_kernel", forbidden)
    monkeypatch.setattr(kernels, "_expand_same_length_kernel", forbidden)


def _page_inputs():
    x = make_batch(2, [5, 300], 1024)
    return {"req_to_token": x["req_to_token"], "req_pool_indices": x["req_pool"],
            "seq_lens": x["seq_lens"], "max_seq_len": 1024, "page_size": 256, "swa_window": 128}


@pytest.mark.parametrize("change,error,name", [
    ({"seq_lens": [5, 300]}, TypeError, "seq_lens_casual"),
    ({"seq_lens": torch.tensor([5.0, 3.0])}, TypeError, "seq_lens_casual"),
    ({"req_pool_indices": torch.tensor([0], dtype=torch.int64)}, ValueError,
     "req_pool_indices_repeated"),
    ({"req_to_token": torch.zeros(4, dtype=torch.int32)}, ValueError, "req_to_token"),
    ({"req_to_token": torch.zeros(1024, 2, dtype=torch.int32).t()}, ValueError, "req_to_token"),
    ({"max_seq_len": 2048}, ValueError, "max_seq_len"),
    ({"max_seq_len": 0}, ValueError, "max_seq_len"),
    ({"page_size": 0}, ValueError, "page_size"),
    ({"page_size": 256.0}, TypeError, "page_size"),
    ({"swa_window": True}, TypeError, "swa_window"),
])
def test_page_table_rejects_bad_inputs_before_any_launch(no_launch, change, error, name):
    kwargs = {**_page_inputs(), **change}
    args = [kwargs.pop(k) for k in ("req_to_token", "req_pool_indices", "seq_lens")]
    with pytest.raises(error, match=name):
        build_page_table_positions(*args, **kwargs)
    with pytest.raises(error, match=name):
        build_page_table_positions_reference(*args, **kwargs)


def _compressed_inputs():
    x = make_batch(2, [5, 300, 700], 1024)
    table = torch.zeros(3, 4, dtype=torch.int32)
    return {"seq_lens": x["seq_lens"], "positions": x["positions"], "raw_out_loc": x["out_loc"],
            "page_table": table, "page_size": 256, "compute_page_indices": True}


@pytest.mark.parametrize("change,error,name", [
    ({"positions": torch.zeros(2, dtype=torch.int32)}, ValueError, "positions"),
    ({"raw_out_loc": torch.zeros(4, dtype=torch.int64)}, ValueError, "raw_out_loc"),
    ({"raw_out_loc": torch.zeros(3, dtype=torch.float32)}, TypeError, "raw_out_loc"),
    ({"page_table": None}, ValueError, "page_table"),
    ({"page_table": torch.zeros(3, 4, dtype=torch.int64)}, TypeError, "page_table"),
    ({"page_table": torch.zeros(4, 3, dtype=torch.int32).t()}, ValueError, "page_table"),
    ({"page_table": torch.zeros(2, 4, dtype=torch.int32)}, ValueError, "page_table"),
    ({"page_size": 192}, ValueError, "page_size"),
    ({"page_size": 64}, ValueError, "page_size"),
    ({"compute_page_indices": 1}, TypeError, "compute_page_indices"),
])
def test_compressed_rejects_bad_inputs_before_any_launch(no_launch, change, error, name):
    kwargs = {**_compressed_inputs(), **change}
    with pytest.raises(error, match=name):
        init_compressed_attn_metadata(**kwargs)
    with pytest.raises(error, match=name):
        init_compressed_attn_metadata_reference(**kwargs)


def test_bad_impl_is_named():
    with pytest.raises(ValueError, match="impl"):
        build_page_table_positions(*list(_page_inputs().values())[:3], max_seq_len=1024,
                                   page_size=256, swa_window=128, impl="cuda")
    with pytest.raises(ValueError, match="impl"):
        init_compressed_attn_metadata(**_compressed_inputs(), impl="eager")


def test_without_page_indices_no_page_table_is_needed():
    kwargs = {**_compressed_inputs(), "page_table": None, "page_size": 0,
              "compute_page_indices": False}
    ours = init_compressed_attn_metadata(**kwargs)
    ref = init_compressed_attn_metadata_reference(**kwargs)
    assert ours.c128_page_indices is None and ref.c128_page_indices is None
    assert all(torch.equal(a, b) for a, b in zip(ours[:8], ref[:8]))


# --- the verify row expansion ------------------------------------------------------------------

def test_expansion_reference_equals_sglang_and_triton_equals_reference():
    from types import SimpleNamespace

    from dsv4spec.bench.metadata import load_sglang_expand

    sglang_builders()  # skips without SGLang's source
    method = load_sglang_expand()
    backend = SimpleNamespace(cuda_int32_kwargs={"device": "cpu", "dtype": torch.int32})
    for dtype in (torch.int32, torch.int64):
        for bs, qo_len, shift in ((0, 4, 4), (1, 1, 0), (6, 4, 4), (3, 5, 0)):
            lengths = torch.arange(7, 7 + bs, dtype=dtype) * 1000
            slots = torch.arange(100, 100 + bs + 2, dtype=torch.int64).flip(0)
            theirs = method(backend, bs=bs, qo_len=qo_len, seq_lens=lengths + shift,
                            req_pool_indices=slots[:bs])
            ref = expand_same_length_reference(lengths, slots, bs=bs, qo_len=qo_len, shift=shift)
            ours = expand_same_length(lengths, slots, bs=bs, qo_len=qo_len, shift=shift,
                                      return_shifted=True)
            for got in (ref, ours, expand_same_length(lengths, slots, bs=bs, qo_len=qo_len,
                                                      shift=shift, impl="torch")):
                assert all(a.dtype == b.dtype and torch.equal(a, b)
                           for a, b in zip(got[1:], theirs)), (dtype, bs, qo_len)
            assert torch.equal(ours.seq_lens, lengths + shift)
            assert (ref.seq_lens is None) == (shift == 0)
    assert expand_same_length(lengths, slots, bs=3, qo_len=5).seq_lens is None


def _expand_inputs():
    return {"seq_lens": torch.tensor([5, 300], dtype=torch.int32),
            "req_pool_indices": torch.tensor([1, 0], dtype=torch.int64), "bs": 2, "qo_len": 4}


@pytest.mark.parametrize("change,error,name", [
    ({"seq_lens": [5, 300]}, TypeError, "seq_lens"),
    ({"seq_lens": torch.tensor([5, 300], dtype=torch.int16)}, TypeError, "seq_lens"),
    ({"seq_lens": torch.tensor([5, 0, 300, 0])[::2]}, ValueError, "seq_lens"),
    ({"seq_lens": torch.tensor([5, 300, 2])}, ValueError, "seq_lens"),
    ({"req_pool_indices": torch.tensor([1])}, ValueError, "req_pool_indices"),
    ({"req_pool_indices": torch.tensor([1.0, 0.0])}, TypeError, "req_pool_indices"),
    ({"bs": 2.0}, TypeError, "bs"),
    ({"qo_len": 0}, ValueError, "qo_len"),
    ({"qo_len": True}, TypeError, "qo_len"),
    ({"shift": -1}, ValueError, "shift"),
])
def test_expansion_rejects_bad_inputs_before_any_launch(no_launch, change, error, name):
    kwargs = {**_expand_inputs(), **change}
    args = [kwargs.pop(k) for k in ("seq_lens", "req_pool_indices")]
    with pytest.raises(error, match=name):
        expand_same_length(*args, **kwargs)
    with pytest.raises(error, match=name):
        expand_same_length_reference(*args, **kwargs)
