"""The live-length-bounded metadata kernels against SGLang 0.5.23's own (its files, by path).

Every output is compared bit for bit with SGLang's over the region each row writes (which covers
every position a consumer reads), and memory past it must still hold the poison it was allocated
with. On CPU both sides run in Triton's interpreter; the ``gpu`` tests repeat the comparison at a
1M-token capacity and inside a CUDA graph replayed with new lengths.
"""

from types import SimpleNamespace

import pytest
import torch

from dsv4spec.kernels.attention_metadata import (
    C128_BLOCK,
    EXPAND_BLOCK,
    PAGE_TABLE_SLACK,
    compressed_attn_metadata_triton,
    expand_same_length_triton,
    page_table_positions_triton,
)
from dsv4spec.ops.attention_metadata import c128_index_extent, page_table_extent

from .attention_metadata_support import (
    POISON,
    interpreter_loop_bounds,
    make_batch,
    poisoned_empty,
    sglang_builders,
    written_mask,
)

SWA_WINDOW = 128
PAGES = 160  # table width in pages: wide enough that short rows leave most of it unwritten


@pytest.fixture(scope="module")
def sglang():
    return sglang_builders()


@pytest.fixture(autouse=True)
def _loop_bounds():
    with interpreter_loop_bounds():
        yield


def lengths(page_size: int, context: int) -> list[int]:
    """Empty, one token, around the SWA window / C4 / C128 / page boundaries, mid, near and at
    capacity."""
    return sorted({0, 1, 3, 4, 5, 127, 128, 129, page_size - 1, page_size, page_size + 1,
                   16 * page_size + 1, 50 * page_size, context - page_size - 1, context - 1,
                   context})


def verify_rows(base: list[int], drafts: int, context: int) -> list[int]:
    """Causal lengths of target-verify rows: ``L + 1 .. L + drafts`` per request."""
    return [min(length + k, context) for length in base for k in range(1, drafts + 1)]


def sglang_page_table(mod, x, context, page_size):
    return mod.build_page_table_positions_triton(
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], max_seq_len=context, page_size=page_size,
        swa_window=SWA_WINDOW)


def assert_table(ours: torch.Tensor, theirs: torch.Tensor, extent: torch.Tensor) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    written = written_mask(tuple(ours.shape), extent)
    assert torch.equal(ours[written], theirs[written]), "differs from SGLang's where written"
    assert bool((ours[~written] == POISON).all()), "wrote past the extent"


@pytest.mark.parametrize("page_size", [128, 256, 512])
@pytest.mark.parametrize("drafts", [1, 4])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_page_table_equals_sglang_where_written_and_nothing_else(sglang, page_size, drafts,
                                                                 index_dtype):
    context = PAGES * page_size
    base = lengths(page_size, context)[:: 2 if drafts > 1 else 1]
    seq_lens = verify_rows(base, drafts, context) if drafts > 1 else base
    x = make_batch(3, seq_lens, context, index_dtype=index_dtype, rows_per_request=drafts,
                   seed=page_size + drafts)
    theirs = sglang_page_table(sglang[0], x, context, page_size)
    with poisoned_empty():
        ours = page_table_positions_triton(x["req_to_token"], x["req_pool"], x["seq_lens"],
                                           PAGES, page_size, SWA_WINDOW)
    for a, b in zip(ours[:2], (theirs.seq_lens_casual, theirs.positions_casual)):
        assert torch.equal(a, b)
    assert torch.equal(ours[3], theirs.swa_topk_lengths)
    extent = page_table_extent(x["seq_lens"], PAGES, page_size)
    assert_table(ours[2], theirs.page_table, extent)
    assert int(extent.min()) <= PAGE_TABLE_SLACK + 1 < PAGES  # short rows leave a tail


def test_page_table_partial_last_page_and_strided_rows(sglang):
    # max_seq_len not a multiple of the page size, and a req_to_token view with padded rows.
    page_size, context = 256, 40 * 256 + 100
    x = make_batch(2, [1, 5000, context], context + 28, seed=3)
    x["req_to_token"] = x["req_to_token"][:, :context]
    num_pages = -(-context // page_size)
    theirs = sglang_page_table(sglang[0], x, context, page_size)
    with poisoned_empty():
        ours = page_table_positions_triton(x["req_to_token"], x["req_pool"], x["seq_lens"],
                                           num_pages, page_size, SWA_WINDOW)
    assert_table(ours[2], theirs.page_table, page_table_extent(x["seq_lens"], num_pages,
                                                               page_size))


@pytest.mark.parametrize("page_size", [128, 256, 512])
@pytest.mark.parametrize("write_rows", ["all", "fewer"])
def test_compressed_metadata_equals_sglang_where_written(sglang, page_size, write_rows):
    context = PAGES * page_size
    x = make_batch(4, verify_rows(lengths(page_size, context), 2, context), context,
                   rows_per_request=2, seed=page_size)
    table = sglang_page_table(sglang[0], x, context, page_size).page_table
    out_loc = x["out_loc"] if write_rows == "all" else x["out_loc"][:-3]  # CP padding rows
    theirs = sglang[1]._init_compressed_attn_metadata_triton(
        x["seq_lens"], x["positions"], out_loc, table, page_size, True)
    with poisoned_empty():
        ours = compressed_attn_metadata_triton(x["seq_lens"], x["positions"], out_loc, table,
                                               page_size, True)
    for i in range(8):
        assert ours[i].dtype == theirs[i].dtype and torch.equal(ours[i], theirs[i]), i
    width = ours[8].shape[1]
    extent = c128_index_extent(x["seq_lens"], width)
    assert_table(ours[8], theirs[8], extent)
    assert int(extent.min()) == C128_BLOCK * 2 <= width


def test_compressed_metadata_without_page_indices(sglang):
    x = make_batch(2, [0, 4, 128, 131, 1000], 2048, seed=5)
    theirs = sglang[1]._init_compressed_attn_metadata_triton(
        x["seq_lens"], x["positions"], x["out_loc"], None, 0, False)
    ours = compressed_attn_metadata_triton(x["seq_lens"], x["positions"], x["out_loc"], None, 0,
                                           False)
    assert ours[8] is None and theirs[8] is None
    assert all(torch.equal(a, b) for a, b in zip(ours[:8], theirs[:8]))


def test_sglang_consumer_reads_nothing_past_our_page_table_extent(sglang):
    """SGLang's own C128 builder (the page table's first consumer) fed our table, its tail
    poisoned, gives exactly what it gives on SGLang's full table."""
    page_size = 256
    context = PAGES * page_size
    x = make_batch(3, lengths(page_size, context), context, seed=11)
    theirs = sglang_page_table(sglang[0], x, context, page_size)
    with poisoned_empty():
        ours = page_table_positions_triton(x["req_to_token"], x["req_pool"], x["seq_lens"],
                                           PAGES, page_size, SWA_WINDOW)
    args = (x["seq_lens"], x["positions"], x["out_loc"])
    on_ours = sglang[1]._init_compressed_attn_metadata_triton(*args, ours[2], page_size, True)
    on_theirs = sglang[1]._init_compressed_attn_metadata_triton(*args, theirs.page_table,
                                                                page_size, True)
    assert all(torch.equal(a, b) for a, b in zip(on_ours, on_theirs))


def test_extents_cover_what_consumers_read():
    """Page table: the live pages plus a paged-logits split's rounding (DeepGEMM reads block
    tables in splits of 4 blocks of 64 compressed tokens); C128 indices: FlashMLA's blocks of 64
    up to max(seq_len // 128, 1)."""
    for page_size in (128, 256, 512):
        seq_lens = torch.arange(0, 70 * page_size, 7, dtype=torch.int32)
        live = -(-seq_lens.long() // page_size)
        pages = page_table_extent(seq_lens, 1 << 20, page_size)
        assert bool((pages >= live + 3).all())
        reach = -(-(seq_lens.long() // 128).clamp(min=1) // 64) * 64
        assert bool((c128_index_extent(seq_lens, 1 << 20) >= reach).all())
        capped = page_table_extent(seq_lens, 20, page_size)
        assert int(capped.max()) == 20


def test_no_rows_launch_nothing():
    x = make_batch(1, [], 1024)
    out = page_table_positions_triton(x["req_to_token"], x["req_pool"], x["seq_lens"], 4, 256,
                                      SWA_WINDOW)
    assert [tuple(t.shape) for t in out] == [(0,), (0,), (0, 4), (0,)]
    table = torch.empty((0, 4), dtype=torch.int32)
    out = compressed_attn_metadata_triton(x["seq_lens"], x["positions"], x["out_loc"], table,
                                          256, True)
    assert tuple(out[8].shape) == (0, 8) and all(t.numel() == 0 for t in out)


# --- the verify row expansion against SGLang's own method ---------------------------------------

@pytest.fixture(scope="module")
def sglang_expand():
    from dsv4spec.bench.metadata import load_sglang_expand

    sglang_builders()  # skips without SGLang's source
    method = load_sglang_expand()

    def expand(seq_lens, req_pool, bs, qo_len):
        backend = SimpleNamespace(cuda_int32_kwargs={"device": seq_lens.device,
                                                     "dtype": torch.int32})
        return method(backend, bs=bs, qo_len=qo_len, seq_lens=seq_lens,
                      req_pool_indices=req_pool)

    return expand


def expand_inputs(bs, length_dtype, slot_dtype, device="cpu", seed=0, spare=3):
    """Lengths from 1 to 1M (and int32's edge for int32), slots with ``spare`` poisoned extras
    past ``bs`` (SGLang's gather reads only the first ``bs``)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 1 << 20, (bs,), generator=g)
    if bs:
        lengths[0] = 1
    if bs > 1:
        lengths[-1] = 2**31 - 1 if length_dtype == torch.int32 else 2**40
    slots = torch.randint(0, 1 << 20, (bs + spare,), generator=g)
    slots[bs:] = POISON
    return lengths.to(length_dtype).to(device), slots.to(slot_dtype).to(device)


@pytest.mark.parametrize("length_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_expansion_equals_sglang_bit_for_bit(sglang_expand, length_dtype, slot_dtype):
    # Batch sizes around the one-program block (EXPAND_BLOCK rows) at every draft width.
    for qo_len in (1, 2, 4, 7):
        for bs in (0, 1, 3, EXPAND_BLOCK // qo_len, EXPAND_BLOCK // qo_len + 1, 130):
            lengths, slots = expand_inputs(bs, length_dtype, slot_dtype, seed=bs + qo_len)
            before = (lengths.clone(), slots.clone())
            theirs = sglang_expand(lengths, slots[:bs], bs, qo_len)
            with poisoned_empty():
                shifted, casual, repeated = expand_same_length_triton(lengths, slots, bs,
                                                                       qo_len, 0, False)
            assert shifted is None
            for ours, want in zip((casual, repeated), theirs):
                assert ours.dtype == want.dtype and ours.shape == want.shape, (bs, qo_len)
                assert torch.equal(ours, want), (bs, qo_len)
            assert not (repeated == POISON).any(), "a slot past bs was read"
            assert torch.equal(lengths, before[0]) and torch.equal(slots, before[1])


def test_expansion_with_the_shift_equals_the_verify_prologue(sglang_expand):
    """``seq_lens + W`` then SGLang's method, as make_forward_metadata_from_raw_verify runs it."""
    for bs, qo_len in ((1, 4), (5, 4), (70, 4), (9, 3)):
        lengths, slots = expand_inputs(bs, torch.int64, torch.int64, seed=bs)
        lengths = lengths.clamp(max=2**30)
        with poisoned_empty():
            shifted, casual, repeated = expand_same_length_triton(lengths, slots, bs, qo_len,
                                                                  qo_len, True)
        want = lengths + qo_len
        assert shifted.dtype == want.dtype and torch.equal(shifted, want)
        theirs = sglang_expand(want, slots[:bs], bs, qo_len)
        assert torch.equal(casual, theirs[0]) and torch.equal(repeated, theirs[1])


# --- GPU: 1M-token capacity, and inside a CUDA graph replayed with new lengths -----------------

CAPACITY = 1 << 20


def gpu_batch(bs: int, drafts: int, live: int, seed: int = 0) -> dict:
    base = [live + 997 * i for i in range(bs)]
    return make_batch(bs, verify_rows(base, drafts, CAPACITY), CAPACITY, device="cuda",
                      seed=seed, rows_per_request=drafts)


@pytest.mark.gpu
@pytest.mark.parametrize("bs,live", [(1, 4096), (8, 65536), (32, 4096), (3, CAPACITY - 10)])
def test_gpu_equals_sglang_at_1m_capacity(sglang, bs, live):
    x = gpu_batch(bs, 4, live, seed=bs)
    theirs = sglang_page_table(sglang[0], x, CAPACITY, 256)
    with poisoned_empty():
        ours = page_table_positions_triton(x["req_to_token"], x["req_pool"], x["seq_lens"],
                                           CAPACITY // 256, 256, SWA_WINDOW)
        compressed = compressed_attn_metadata_triton(x["seq_lens"], x["positions"], x["out_loc"],
                                                     ours[2], 256, True)
    assert_table(ours[2], theirs.page_table, page_table_extent(x["seq_lens"], 4096, 256))
    expected = sglang[1]._init_compressed_attn_metadata_triton(
        x["seq_lens"], x["positions"], x["out_loc"], theirs.page_table, 256, True)
    assert all(torch.equal(a, b) for a, b in zip(compressed[:8], expected[:8]))
    assert_table(compressed[8], expected[8], c128_index_extent(x["seq_lens"], 8192))


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_new_lengths(sglang):
    x = gpu_batch(8, 4, 4096, seed=1)
    seq_lens, positions = x["seq_lens"].clone(), x["positions"].clone()

    def build():
        prep = page_table_positions_triton(x["req_to_token"], x["req_pool"], seq_lens,
                                           CAPACITY // 256, 256, SWA_WINDOW)
        return prep, compressed_attn_metadata_triton(prep[0], positions, x["out_loc"], prep[2],
                                                     256, True)

    build()  # compiled eagerly, as SGLang's warm-up runs before its capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prep, compressed = build()
    for live in (100, 70_000, 4096, CAPACITY - 8):
        new = gpu_batch(8, 4, live, seed=1)
        seq_lens.copy_(new["seq_lens"])
        positions.copy_(new["positions"])
        graph.replay()
        theirs = sglang_page_table(sglang[0], {**x, "seq_lens": seq_lens}, CAPACITY, 256)
        expected = sglang[1]._init_compressed_attn_metadata_triton(
            seq_lens, positions, x["out_loc"], theirs.page_table, 256, True)
        written = written_mask(tuple(prep[2].shape), page_table_extent(seq_lens, 4096, 256))
        assert torch.equal(prep[2][written], theirs.page_table[written]), live
        assert all(torch.equal(a, b) for a, b in zip(compressed[:8], expected[:8])), live
        written = written_mask(tuple(compressed[8].shape), c128_index_extent(seq_lens, 8192))
        assert torch.equal(compressed[8][written], expected[8][written]), live


@pytest.mark.gpu
def test_gpu_expansion_in_a_cuda_graph_replayed_with_new_lengths(sglang_expand):
    bs, qo_len = 16, 4
    lengths, slots = expand_inputs(bs, torch.int64, torch.int64, device="cuda", seed=3)
    live_lengths, live_slots = lengths.clone(), slots.clone()
    expand_same_length_triton(live_lengths, live_slots, bs, qo_len, qo_len, True)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        shifted, casual, repeated = expand_same_length_triton(live_lengths, live_slots, bs,
                                                              qo_len, qo_len, True)
    for seed in range(4):
        new_lengths, new_slots = expand_inputs(bs, torch.int64, torch.int64, device="cuda",
                                               seed=seed + 10)
        live_lengths.copy_(new_lengths.clamp(max=2**30))
        live_slots.copy_(new_slots)
        graph.replay()
        theirs = sglang_expand(live_lengths + qo_len, live_slots[:bs], bs, qo_len)
        assert torch.equal(shifted, live_lengths + qo_len), seed
        assert torch.equal(casual, theirs[0]) and torch.equal(repeated, theirs[1]), seed
