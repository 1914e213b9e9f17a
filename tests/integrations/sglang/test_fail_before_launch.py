"""Every hook that launches dsv4spec's kernels refuses what its op rejects before the first
launch of the call: inside a CUDA-graph capture a kernel already recorded cannot be taken back,
so a failure after it would leave SGLang's fallback with a broken capture. For each hook: a
well-formed call launches ours (the count sees it), then a call the op rejects launches nothing of
dsv4spec's and gives SGLang's outcome, the hook still on. (The FlashMLA-fields hook and the
draft-decode metadata hook launch nothing of dsv4spec's: the first assigns what the compression
hook computed, the second only decides which of SGLang's own step builds run.)"""

import pytest
import torch

from dsv4spec.integrations.sglang import metadata as metadata_hooks

from ...kernels.attention_metadata_support import interpreter_loop_bounds
from . import standins
from .conftest import COMPRESSION_METHOD as COMPRESSION
from .conftest import EXPAND, MHC_POST, MHC_POST_PRE, MHC_PRE, PAGE_TABLE, ROLLBACK, TARGET
from .test_compression_metadata_hook import fill_table as fill_compression_table
from .test_compression_metadata_hook import make_metadata
from .test_guards import measured_table  # noqa: F401 - the fixture
from .test_hc_head import HC_EPS, NORM_EPS
from .test_hc_head import make_inputs as hc_head_inputs
from .test_metadata import CONTEXT, PAGE, fill_tables, page_original
from .test_metadata import batch as page_batch
from .test_mhc_hooks import equal, measured, outcome, run, run_original  # noqa: F401
from .test_mhc_hooks import make_inputs as mhc_inputs
from .test_rollback import W, batch, kv_pool

DEVICE = standins.DEVICE


@pytest.fixture(autouse=True)
def _loop_bounds():
    with interpreter_loop_bounds():  # the metadata kernels' loop bounds (no-op on CUDA)
        yield


def installed(sgl, target):
    return sgl.registry._hooks[target][0][1]


def assert_refused_before_launch(sgl, launches, target, valid, rejected):
    """``valid()`` launches ours; then ``rejected()`` launches nothing of ours, SGLang's runs."""
    launches.clear()
    valid()
    assert launches, "a well-formed call launches ours (the count sees it)"
    calls = getattr(sgl.originals[target], "calls", None)  # None: the caller compares results
    launches.clear()
    rejected()
    assert launches == [], f"launched {launches} before refusing the inputs"
    if calls is not None:
        assert sgl.originals[target].calls == calls + 1, "SGLang's own ran"
    assert installed(sgl, target).enabled


def test_rollback(sgl, launches):
    sgl.install()
    pool = kv_pool(sgl)
    idx, seq, acc = batch()
    assert_refused_before_launch(
        sgl, launches, ROLLBACK,
        lambda: pool.clear_unaccepted_c128_draft_states(idx, seq, acc, W),
        lambda: pool.clear_unaccepted_c128_draft_states(idx, seq, acc.to(torch.int16), W))


def test_target_hc_head(sgl, launches, measured_table):  # noqa: F811
    sgl.install()
    model = sgl.target.DeepseekV4Model(norm_eps=NORM_EPS, hc_eps=HC_EPS)
    x, fn, scale, base = hc_head_inputs(3, 40, torch.bfloat16)
    assert_refused_before_launch(sgl, launches, TARGET, lambda: model.hc_head(x, fn, scale, base),
                                 lambda: model.hc_head(x, fn, scale.reshape(()), base))


def _double_base(t):
    return {**t, "hc_base": t["hc_base"].double()}  # SGLang's path takes it, ours does not


def _strided_comb(t):
    return {**t, "comb": t["comb"].transpose(1, 2)}  # not contiguous: ours refuses it


@pytest.mark.parametrize("op, target, spoil", [
    pytest.param("mhc_pre", MHC_PRE, _double_base, id="mhc_pre"),
    pytest.param("mhc_post", MHC_POST, _strided_comb, id="mhc_post"),
    pytest.param("mhc_fused_post_pre", MHC_POST_PRE, _double_base, id="mhc_fused_post_pre"),
])
def test_mhc(sgl, launches, measured, op, target, spoil):  # noqa: F811
    sgl.install()
    t = mhc_inputs(3)
    bad = spoil(t)
    results = []
    assert_refused_before_launch(sgl, launches, target, lambda: run(sgl, op, t),
                                 lambda: results.append(outcome(run, sgl, op, bad)))
    assert equal(results[0], outcome(run_original, sgl, op, bad))


def test_page_table(sgl, monkeypatch, launches):
    fill_tables(monkeypatch)
    sgl.install()
    x = page_batch(5)
    column_major = x["req_to_token"].t().contiguous().t()  # same values, stride(1) != 1

    def call(req_to_token):
        return sgl.page_metadata.BuildPageTablePositions.triton(
            req_to_token=req_to_token, req_pool_indices_repeated=x["req_pool"],
            seq_lens_casual=x["seq_lens"], max_seq_len=CONTEXT, page_size=PAGE, swa_window=128)

    results = []
    assert_refused_before_launch(sgl, launches, PAGE_TABLE, lambda: call(x["req_to_token"]),
                                 lambda: results.append(call(column_major)))
    want = page_original(sgl, {**x, "req_to_token": column_major})
    assert torch.equal(results[0].page_table, want.page_table)


def test_verify_row_expansion(sgl, launches):
    sgl.install()  # the shipped table: ours at qo_len 4, 1-128 requests, both modes
    instance = sgl.backend.DeepseekV4AttnBackend(DEVICE)
    lengths = torch.arange(10, 26, dtype=torch.int64, device=DEVICE)
    slots = torch.arange(8, dtype=torch.int64, device=DEVICE)

    def call(seq_lens):
        return instance.expand_extend_with_same_length(bs=8, qo_len=4, seq_lens=seq_lens,
                                                       req_pool_indices=slots)

    results = []
    assert_refused_before_launch(sgl, launches, EXPAND, lambda: call(lengths[:8]),
                                 lambda: results.append(call(lengths[::2])))  # strided
    want = sgl.originals[EXPAND].__wrapped__(instance, bs=8, qo_len=4, seq_lens=lengths[::2],
                                             req_pool_indices=slots)
    assert all(torch.equal(a, b) for a, b in zip(results[0], want))


def test_compression_fields(sgl, monkeypatch, launches):
    monkeypatch.setattr(metadata_hooks, "_pending_sparse", None)
    fill_compression_table(monkeypatch)
    sgl.install()
    ours, _ = make_metadata(sgl, 3)
    bad, theirs = make_metadata(sgl, 3)
    for m in (bad, theirs):
        m.page_table = m.page_table.long()  # SGLang's kernel takes it, ours does not
    assert_refused_before_launch(sgl, launches, COMPRESSION,
                                 lambda: ours.init_compression_metadata(None, None),
                                 lambda: bad.init_compression_metadata(None, None))
    sgl.originals[COMPRESSION].__wrapped__(theirs, None, None)
    assert torch.equal(bad.c128_page_indices, theirs.c128_page_indices)
