"""GPU: the bounded metadata builders with every unwritten tail poisoned, captured and replayed
as SGLang's target-verify and draft-decode graphs build them, beside SGLang's own builders, and
the readers of the DSV4 SM90 path run over both.

Inside each capture every int32/int64 ``torch.empty`` is followed by a recorded fill with
:data:`POISON`, so at every replay each element the hooked builders leave unwritten holds it.
The readers:

- SGLang's own C128 page-index builder (``metadata_kernel.py``'s Triton kernel, the page table's
  reader (1) in :mod:`dsv4spec.ops.attention_metadata`) over the hooked page table: every output
  equals SGLang's over SGLang's table, so no poisoned column reaches a value;
- the read sets the argument derives for the kernels that do not run here (DeepGEMM's
  ``fp8_paged_mqa_logits`` and the top-k transforms: page-table columns below
  ``cdiv(seq_len // 4, 64)``; the TileLang indexer: the same; FlashMLA's sparse decode: C128
  entries below ``round_up(max(seq_len // 128, 1), 64)``, plus its one-block prefetch), gathered
  from the hooked tensors: no poison, SGLang's values.

Run under ``compute-sanitizer --tool memcheck`` (from the repository root, SGLang's source
found as for the other plugin tests)::

    compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -m gpu -q \
        -p no:cacheprovider tests/integrations/sglang/test_poisoned_tails_gpu.py

it checks that the hooked builders and SGLang's reader access no memory outside their tensors.
The shipped tables decide (the measured shape: 1M tokens in 256-token pages).
"""

import contextlib

import pytest
import torch

from dsv4spec.bench.metadata import COMPRESSION_FIELDS
from dsv4spec.integrations.sglang import metadata as hooks
from dsv4spec.ops.attention_metadata import c128_index_extent, page_table_extent

from ...kernels.attention_metadata_support import POISON, make_batch, poisoned_empty, written_mask
from .conftest import COMPRESSED as C128_TARGET
from .conftest import COMPRESSION_METHOD, FLASHMLA_METHOD
from .conftest import PAGE_TABLE as PAGE_TARGET

pytestmark = pytest.mark.gpu

PAGE, CAPACITY = 256, 1 << 20  # the shipped tables' key: 4,096 pages
PAGES = CAPACITY // PAGE
NUM_DRAFT_TOKENS = 4
# FlashMLA's sparse decode loads extra indices in blocks of 64 and prefetches one block ahead;
# DeepGEMM's paged MQA logits read one block-table column per 64 C4 entries (BLOCK_KV on SM90).
# Written out here, not taken from the kernels' extents, so that a short extent fails.
FLASHMLA_BLOCK, INDEXER_BLOCK_KV = 64, 64
# (name, requests, query rows per request): target verify (one row per draft token) and one
# draft-decode step (one row per request, top-k 1)
BUILDS = [pytest.param("verify", 8, NUM_DRAFT_TOKENS, id="target verify"),
          pytest.param("decode", 16, 1, id="draft decode")]
# live lengths across replays: a short context, page and C128-block boundaries, near capacity
LIVE = [(100, 1), (70_000, 997), (CAPACITY - 300, 7)]


@pytest.fixture
def gpu_sgl(sgl, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(hooks, "_pending_sparse", None)
    return sgl


def lengths(rows, live, step):
    return [min(live + step * i, CAPACITY) for i in range(rows)]


def counted(monkeypatch, name):
    calls = []
    original = getattr(hooks, name)
    monkeypatch.setattr(hooks, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@contextlib.contextmanager
def capture(graph):
    with poisoned_empty(), torch.cuda.graph(graph):
        yield


def assert_reads_sglang_values(name, ours, theirs, read):
    """Over the ``read`` mask: no poison and SGLang's values."""
    assert not bool((ours[read] == POISON).any()), f"{name}: a reader's element is unwritten"
    assert torch.equal(ours[read], theirs[read]), name


def page_table_read_set(seq_lens, shape):
    """Columns the C4 indexer, the top-k transforms and the TileLang indexer read (the argument
    in dsv4spec.ops.attention_metadata): below cdiv(seq_len // 4, 64)."""
    reach = -(-(seq_lens.long().clamp(min=0) // 4) // INDEXER_BLOCK_KV)
    return written_mask(shape, reach)


def c128_read_set(seq_lens, shape):
    """FlashMLA's sparse decode over the C128 indices: blocks of 64 below
    round_up(max(seq_len // 128, 1), 64), and one block of prefetch after them."""
    extra = (seq_lens.long() // 128).clamp(min=1)
    reach = -(-extra // FLASHMLA_BLOCK) * FLASHMLA_BLOCK + FLASHMLA_BLOCK
    return written_mask(shape, reach.clamp(max=shape[1]))


@pytest.mark.parametrize("build, requests, rows_per_request", BUILDS)
def test_gpu_poisoned_tails_page_table_and_c128_builders(gpu_sgl, monkeypatch, build, requests,
                                                          rows_per_request):
    sgl = gpu_sgl
    sgl.install()
    page_mod, c128_mod = sgl.page_metadata, sgl.c128_metadata
    page_calls = counted(monkeypatch, "build_page_table_positions")
    c128_calls = counted(monkeypatch, "init_compressed_attn_metadata")
    rows = requests * rows_per_request
    x = make_batch(requests, lengths(rows, 4096, 997), CAPACITY, device="cuda",
                   rows_per_request=rows_per_request, seed=7)
    seq_lens, positions = x["seq_lens"].clone(), x["positions"].clone()

    def step():  # make_core_attn_metadata on CUDA inputs
        prep = page_mod.BuildPageTablePositions.execute(
            req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
            seq_lens_casual=seq_lens, max_seq_len=CAPACITY, page_size=PAGE, swa_window=128)
        return prep, c128_mod.init_compression_metadata(
            prep.seq_lens_casual, positions, x["out_loc"], prep.page_table, PAGE, True)

    step()  # SGLang's eager warm-up: SGLang's builders, ours launched once to compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        prep, compressed = step()
    assert len(page_calls) == 2 and len(c128_calls) == 2, "ours in the warm-up and the capture"
    for live, spread in LIVE:
        new = make_batch(requests, lengths(rows, live, spread), CAPACITY, device="cuda",
                         rows_per_request=rows_per_request, seed=7)
        seq_lens.copy_(new["seq_lens"])
        positions.copy_(new["positions"])
        graph.replay()
        theirs = sgl.originals[PAGE_TARGET](
            req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
            seq_lens_casual=seq_lens, max_seq_len=CAPACITY, page_size=PAGE, swa_window=128)
        want = sgl.originals[C128_TARGET](seq_lens, positions, x["out_loc"],
                                          theirs.page_table, PAGE, True)
        # SGLang's C128 builder reading the hooked (poisoned) page table gives its own values
        read_by_sglang = sgl.originals[C128_TARGET](seq_lens, positions, x["out_loc"],
                                                    prep.page_table, PAGE, True)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(read_by_sglang, want)), (build, live)
        table = prep.page_table
        assert bool((table == POISON).any()) or live > CAPACITY - 1024, "tails are poisoned"
        assert_reads_sglang_values("page table, written extent", table, theirs.page_table,
                                   written_mask(tuple(table.shape),
                                                page_table_extent(seq_lens, PAGES, PAGE)))
        assert_reads_sglang_values("page table, indexer and top-k", table, theirs.page_table,
                                   page_table_read_set(seq_lens, tuple(table.shape)))
        assert all(torch.equal(a, b) for a, b in zip(compressed[:8], want[:8])), (build, live)
        indices = compressed[8]
        assert_reads_sglang_values("C128 indices, written extent", indices, want[8],
                                   written_mask(tuple(indices.shape),
                                                c128_index_extent(seq_lens, indices.shape[1])))
        assert_reads_sglang_values("C128 indices, FlashMLA", indices, want[8],
                                   c128_read_set(seq_lens, tuple(indices.shape)))
    assert all(sgl.registry._hooks[t][0][1].enabled for t in (PAGE_TARGET, C128_TARGET))


@pytest.mark.parametrize("build, requests, rows_per_request", BUILDS)
def test_gpu_poisoned_tails_compression_fields_in_one_launch(gpu_sgl, monkeypatch, build,
                                                              requests, rows_per_request):
    """DSV4AttnMetadata.init_compression_metadata + init_flashmla_related hooked (one launch of
    build_compression_metadata), captured with poisoned allocations, against SGLang's two
    methods: every field SGLang assigns, the C128 indices over FlashMLA's read set."""
    sgl = gpu_sgl
    sgl.install()
    calls = counted(monkeypatch, "build_compression_metadata")
    rows = requests * rows_per_request
    cls = sgl.backend.DSV4AttnMetadata

    def metadata(live, spread, seed):
        x = make_batch(requests, lengths(rows, live, spread), CAPACITY, device="cuda",
                       rows_per_request=rows_per_request, seed=seed)
        prep = sgl.originals[PAGE_TARGET](
            req_to_token=x["req_to_token"], req_pool_indices_repeated=x["req_pool"],
            seq_lens_casual=x["seq_lens"], max_seq_len=CAPACITY, page_size=PAGE,
            swa_window=128)
        swa = torch.randint(-1, 1 << 20, (rows, 128), dtype=torch.int32, device="cuda")
        fields = dict(page_size=PAGE, page_table=prep.page_table, raw_out_loc=x["out_loc"],
                      seq_lens_casual=prep.seq_lens_casual,
                      positions_casual=prep.positions_casual, swa_page_indices=swa,
                      index_topk=512, present_ratios=(0, 4, 128))
        return cls(**fields)

    ours = metadata(4096, 997, 11)
    ours.init_compression_metadata(None, None)  # eager: SGLang's, ours compiled
    ours.init_flashmla_related()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        ours.init_compression_metadata(None, None)
        ours.init_flashmla_related()
    assert len(calls) == 2, "ours in the warm-up and the capture"
    for live, spread in LIVE:
        theirs = metadata(live, spread, 11)
        for k in ("seq_lens_casual", "page_table", "raw_out_loc"):  # the graph's inputs
            getattr(ours, k).copy_(getattr(theirs, k))
        graph.replay()
        sgl.originals[COMPRESSION_METHOD].__wrapped__(theirs, None, None)
        sgl.originals[FLASHMLA_METHOD].__wrapped__(theirs)
        torch.cuda.synchronize()
        for name in COMPRESSION_FIELDS:
            if name in ("c128_page_indices", "swa_page_indices"):
                continue  # the first over FlashMLA's read set below; the second captured from
                # the first object's SWA table, not an input copied here
            a, b = getattr(ours, name), getattr(theirs, name)
            assert a.shape == b.shape and torch.equal(a, b), (build, live, name)
        indices = ours.c128_page_indices
        assert indices.shape == theirs.c128_page_indices.shape
        assert_reads_sglang_values("C128 indices, FlashMLA", indices, theirs.c128_page_indices,
                                   c128_read_set(theirs.seq_lens_casual, tuple(indices.shape)))
