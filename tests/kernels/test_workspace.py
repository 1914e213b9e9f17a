import torch

from dsv4spec.kernels.workspace import WorkspaceCache


def test_reuses_per_shape_and_caps_bytes_least_recently_used_first():
    like = torch.empty(1)
    cache = WorkspaceCache(max_bytes=3 * 400)
    a = cache.get(like, (100,), -1)
    assert a.dtype == torch.float32 and a.shape == (100,)
    assert cache.get(like, (100,), -1) is a
    b = cache.get(like, (10, 10), -1)
    c = cache.get(like, (4, 25), -1)
    assert cache.nbytes == 1200 and len(cache) == 3
    cache.get(like, (100,), -1)  # a is now the most recently used
    d = cache.get(like, (2, 50), -1)  # over the cap: b, the least recently used, goes
    assert cache.nbytes == 1200 and len(cache) == 3
    assert cache.get(like, (100,), -1) is a and cache.get(like, (2, 50), -1) is d
    assert cache.get(like, (4, 25), -1) is c
    assert cache.get(like, (10, 10), -1) is not b


def test_buffer_larger_than_the_cap_is_not_kept():
    cache = WorkspaceCache(max_bytes=100)
    big = cache.get(torch.empty(1), (26,), -1)
    assert big.numel() == 26 and len(cache) == 0 and cache.nbytes == 0
    assert cache.get(torch.empty(1), (26,), -1) is not big
