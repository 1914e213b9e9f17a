"""The e2e benchmark's forced acceptance: drafts from the reference, mismatches on schedule."""

from dsv4spec.bench.e2e import SCHEDULE, W, forced_drafts
from dsv4spec.engine import Request


def test_forced_drafts_follow_the_reference_with_scheduled_mismatches():
    ref = list(range(100, 140))
    r = Request([1, 2, 3], 50)
    override = forced_drafts({id(r): ref}, vocab_size=1000)
    r.output = ref[:5]
    for k in SCHEDULE:
        drafts = override(r)
        expect = ref[5:5 + W - 1]
        assert len(drafts) == W - 1
        for i, (d, e) in enumerate(zip(drafts, expect)):
            assert (d != e) == (i == k), (k, drafts, expect)
    # past the reference's end: padded, never an index error
    r.output = ref[:39]
    assert len(override(r)) == W - 1
