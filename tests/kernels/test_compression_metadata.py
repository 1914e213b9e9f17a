"""The fused compression metadata (one launch for SGLang 0.5.23's
``DSV4AttnMetadata.init_compression_metadata`` + ``init_flashmla_related``) against SGLang's own
two methods (their source, executed by path on a stand-in object, over SGLang's own
``metadata_kernel.py`` in Triton's interpreter on the CPU).

Every field the methods assign is compared bit for bit (dtype, shape, strides, values); the C128
page indices over each row's extent (which covers every position a consumer reads), past which
the allocation's poison must remain; every other output is written in full.
"""

import pytest
import torch

from dsv4spec.bench.metadata import load_sglang_attn_metadata
from dsv4spec.kernels.attention_metadata import (
    INDEX_ALIGN,
    aligned_width,
    compression_metadata_fused_triton,
)
from dsv4spec.ops.attention_metadata import CompressionMetadata, c128_index_extent

from .attention_metadata_support import (
    POISON,
    assert_compression_fields_equal,
    interpreter_loop_bounds,
    make_batch,
    poisoned_empty,
    sglang_builders,
)

SWA_WINDOW = 128
PAGES = 160  # 40K tokens at 256 per page: short rows leave most of the C128 row unwritten


@pytest.fixture(scope="module")
def sglang():
    page, c128 = sglang_builders()
    return page, c128, load_sglang_attn_metadata(c128)


@pytest.fixture(autouse=True)
def _loop_bounds():
    with interpreter_loop_bounds():
        yield


def lengths(page_size: int, context: int) -> list[int]:
    """Empty, one token, around the C4 / C128 / page / FlashMLA-block boundaries, near and at
    capacity."""
    return sorted({0, 1, 3, 4, 5, 127, 128, 129, 255, 256, 257, page_size - 1, page_size,
                   page_size + 1, 64 * 128 - 1, 64 * 128, 64 * 128 + 1, context - page_size - 1,
                   context - 1, context})


def inputs(sglang, page_size: int, seq_lens: list[int], context: int, *, drafts: int = 1,
           swa_width: int = SWA_WINDOW, seed: int = 0, pages: int = PAGES) -> dict:
    x = make_batch(3, seq_lens, context, rows_per_request=drafts, seed=seed)
    prep = sglang[0].build_page_table_positions_triton(
        req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
        seq_lens_casual=x["seq_lens"], max_seq_len=pages * page_size, page_size=page_size,
        swa_window=SWA_WINDOW)
    g = torch.Generator().manual_seed(seed + 1)
    swa = torch.randint(-1, 1 << 20, (len(seq_lens), swa_width), generator=g,
                        dtype=torch.int32)
    return {"seq_lens": prep.seq_lens_casual, "positions": prep.positions_casual,
            "out_loc": x["out_loc"], "page_table": prep.page_table, "swa": swa}


def sglang_fields(sglang, x: dict, page_size: int, present, index_topk: int):
    """What SGLang's two methods assign, on a fresh stand-in object."""
    meta = sglang[2](page_size=page_size, page_table=x["page_table"], raw_out_loc=x["out_loc"],
                     seq_lens_casual=x["seq_lens"], positions_casual=x["positions"],
                     swa_page_indices=x["swa"], index_topk=index_topk, present_ratios=present)
    meta.init_compression_metadata()
    meta.init_flashmla_related()
    return meta


def assert_equal_to_sglang(ours: CompressionMetadata, theirs, seq_lens: torch.Tensor) -> None:
    written = assert_compression_fields_equal(ours, theirs, seq_lens)
    if written is not None:
        assert bool((ours.c128_page_indices[~written] == POISON).all()), "wrote past the extent"


def fused(x: dict, page_size: int, index_topk: int, has_c4=True, has_c128=True):
    with poisoned_empty():
        return CompressionMetadata(*compression_metadata_fused_triton(
            x["seq_lens"], x["out_loc"], x["page_table"], x["swa"], page_size, index_topk,
            has_c4, has_c128))


@pytest.mark.parametrize("page_size", [128, 256, 512])
@pytest.mark.parametrize("drafts", [1, 4])
def test_equals_sglang_methods(sglang, page_size, drafts):
    context = PAGES * page_size
    base = lengths(page_size, context)
    seq_lens = ([min(n + k, context) for n in base[::3] for k in range(1, drafts + 1)]
                if drafts > 1 else base)
    x = inputs(sglang, page_size, seq_lens, context, drafts=drafts, seed=page_size + drafts)
    before = {k: v.clone() for k, v in x.items()}
    ours = fused(x, page_size, 512)
    assert all(torch.equal(x[k], before[k]) for k in x), "inputs changed"
    assert_equal_to_sglang(ours, sglang_fields(sglang, x, page_size, (0, 4, 128), 512),
                           x["seq_lens"])
    extent = c128_index_extent(x["seq_lens"], ours.c128_page_indices.shape[1])
    assert int(extent.min()) < ours.c128_page_indices.shape[1]  # a tail is left unwritten


def test_unaligned_widths_get_sglang_padding(sglang):
    """128-token pages over 37 pages: a C128 table 37 wide, padded to 64 by SGLang (the pad
    columns inside the extent are -1); an SWA table 100 wide padded to 128; top-k 1024."""
    page_size, pages = 128, 37
    context = page_size * pages
    x = inputs(sglang, page_size, [0, 1, 128, 129, 2000, context - 1, context], context,
               swa_width=100, seed=7, pages=pages)
    ours = fused(x, page_size, 1024)
    theirs = sglang_fields(sglang, x, page_size, (0, 4, 128), 1024)
    assert_equal_to_sglang(ours, theirs, x["seq_lens"])
    assert ours.c128_page_indices.shape[1] == INDEX_ALIGN and ours.swa_page_indices.shape[1] == 128
    assert bool((ours.c128_page_indices[:, pages:] == -1).all())  # extent 128 covers the pad


@pytest.mark.parametrize("present", [(0, 4), (0, 128), (4, 128)])
def test_one_ratio_only(sglang, present):
    page_size = 256
    context = PAGES * page_size
    x = inputs(sglang, page_size, lengths(page_size, context), context, seed=len(present))
    ours = fused(x, page_size, 512, has_c4=4 in present, has_c128=128 in present)
    assert_equal_to_sglang(ours, sglang_fields(sglang, x, page_size, present, 512),
                           x["seq_lens"])


def test_row_strided_swa_and_int64_lengths(sglang):
    page_size = 256
    context = PAGES * page_size
    x = inputs(sglang, page_size, [5, 300, 9000], context, swa_width=192, seed=3)
    theirs = sglang_fields(sglang, {**x, "swa": x["swa"][:, :SWA_WINDOW]}, page_size,
                           (0, 4, 128), 512)
    x = {**x, "swa": x["swa"][:, :SWA_WINDOW], "seq_lens": x["seq_lens"].long()}
    assert_equal_to_sglang(fused(x, page_size, 512), theirs, x["seq_lens"])


def test_no_rows_launch_nothing():
    empty = torch.empty(0, dtype=torch.int32)
    out = compression_metadata_fused_triton(
        empty, empty.long(), torch.empty((0, 8), dtype=torch.int32),
        torch.empty((0, SWA_WINDOW), dtype=torch.int32), 256, 512, True, True)
    assert all(t.numel() == 0 for t in out)
    assert tuple(out[7].shape) == (0, aligned_width(16)) and tuple(out[4].shape) == (0, 512)
