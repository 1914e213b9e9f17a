"""build_compression_metadata: the torch reference equals SGLang's two DSV4AttnMetadata methods
at every position, the Triton path equals the reference over its written extent, and bad inputs
raise naming the argument before anything is allocated or launched."""

import pytest
import torch

from dsv4spec.bench.metadata import COMPRESSION_FIELDS, load_sglang_attn_metadata
from dsv4spec.kernels import attention_metadata as kernels
from dsv4spec.ops.attention_metadata import (
    build_compression_metadata,
    build_compression_metadata_reference,
    build_page_table_positions_reference,
    c128_index_extent,
)

from ..kernels.attention_metadata_support import (
    interpreter_loop_bounds,
    make_batch,
    sglang_builders,
    written_mask,
)

PAGE, CONTEXT = 256, 64 * 256
LENGTHS = [0, 1, 4, 128, 255, 256, 257, 4097, 8192, 8193, CONTEXT - 1, CONTEXT]


@pytest.fixture(autouse=True)
def _loop_bounds():
    with interpreter_loop_bounds():
        yield


def _inputs(seed=0):
    x = make_batch(3, LENGTHS, CONTEXT, seed=seed)
    table = build_page_table_positions_reference(
        x["req_to_token"], x["req_pool"], x["seq_lens"], max_seq_len=CONTEXT, page_size=PAGE,
        swa_window=128).page_table
    swa = torch.randint(-1, 1 << 20, (len(LENGTHS), 128), dtype=torch.int32,
                        generator=torch.Generator().manual_seed(seed))
    return {"seq_lens": x["seq_lens"], "raw_out_loc": x["out_loc"], "page_table": table,
            "swa_page_indices": swa, "page_size": PAGE, "index_topk": 512}


def test_reference_equals_sglang_everywhere_and_triton_equals_reference():
    _, c128 = sglang_builders()
    cls = load_sglang_attn_metadata(c128)
    kw = _inputs(1)
    meta = cls(page_size=PAGE, page_table=kw["page_table"], raw_out_loc=kw["raw_out_loc"],
               seq_lens_casual=kw["seq_lens"], positions_casual=kw["seq_lens"] - 1,
               swa_page_indices=kw["swa_page_indices"], index_topk=512,
               present_ratios=(0, 4, 128))
    meta.init_compression_metadata()
    meta.init_flashmla_related()
    ref = build_compression_metadata_reference(**kw)
    ours = build_compression_metadata(**kw)
    for name in COMPRESSION_FIELDS:
        theirs, r, o = getattr(meta, name), getattr(ref, name), getattr(ours, name)
        assert (r.dtype, r.shape, r.stride()) == (theirs.dtype, theirs.shape, theirs.stride())
        assert torch.equal(r, theirs), name
        if name == "c128_page_indices":
            written = written_mask(tuple(o.shape), c128_index_extent(kw["seq_lens"], o.shape[1]))
            assert torch.equal(o[written], r[written])
        else:
            assert torch.equal(o, r), name


def test_fewer_write_rows_mask_the_cache_locations():
    kw = _inputs(2)
    kw["raw_out_loc"] = kw["raw_out_loc"][:-3]
    ours = build_compression_metadata(**kw)
    ref = build_compression_metadata_reference(**kw)
    assert ours.c4_out_loc.shape == (len(LENGTHS) - 3,)
    assert torch.equal(ours.c4_out_loc, ref.c4_out_loc)
    assert torch.equal(ours.c128_out_loc, ref.c128_out_loc)


@pytest.fixture
def no_launch(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("launched after a bad input")

    monkeypatch.setattr(kernels, "_compression_metadata_fused_kernel", forbidden)
    monkeypatch.setattr(kernels, "compression_metadata_fused_triton", forbidden)


@pytest.mark.parametrize("change,error,name", [
    ({"seq_lens": [1, 2]}, TypeError, "seq_lens"),
    ({"seq_lens": torch.zeros(len(LENGTHS), dtype=torch.float32)}, TypeError, "seq_lens"),
    ({"raw_out_loc": torch.zeros(len(LENGTHS) + 1, dtype=torch.int64)}, ValueError,
     "raw_out_loc"),
    ({"page_table": torch.zeros(len(LENGTHS), 64, dtype=torch.int64)}, TypeError, "page_table"),
    ({"page_table": torch.zeros(64, len(LENGTHS), dtype=torch.int32).t()}, ValueError,
     "page_table"),
    ({"page_table": torch.zeros(2, 64, dtype=torch.int32)}, ValueError, "page_table"),
    ({"swa_page_indices": torch.zeros(len(LENGTHS), 128, dtype=torch.int64)}, TypeError,
     "swa_page_indices"),
    ({"swa_page_indices": torch.zeros(128, len(LENGTHS), dtype=torch.int32).t()}, ValueError,
     "swa_page_indices"),
    ({"swa_page_indices": torch.zeros(3, 128, dtype=torch.int32)}, ValueError,
     "swa_page_indices"),
    ({"page_size": 192}, ValueError, "page_size"),
    ({"page_size": 256.0}, TypeError, "page_size"),
    ({"index_topk": 0}, ValueError, "index_topk"),
    ({"index_topk": True}, TypeError, "index_topk"),
    ({"has_c4": 1}, TypeError, "has_c4"),
    ({"has_c128": None}, TypeError, "has_c128"),
])
def test_rejects_bad_inputs_before_any_launch(no_launch, change, error, name):
    kw = {**_inputs(), **change}
    with pytest.raises(error, match=name):
        build_compression_metadata(**kw)
    with pytest.raises(error, match=name):
        build_compression_metadata_reference(**kw)


def test_bad_impl_is_named():
    with pytest.raises(ValueError, match="impl"):
        build_compression_metadata(**_inputs(), impl="cuda")
