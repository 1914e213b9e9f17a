"""Compression math (docs/design.md) against the formulas written as explicit float64 loops."""

import math

import pytest
import torch

from dsv4spec.model.compressor import compress_rows, overlapped_blocks, pool


def entry_float64(kv_rows, score_rows):
    """K[c] = sum_p exp(z_p[c]) kv_p[c] / sum_p exp(z_p[c]), channel by channel."""
    n, D = kv_rows.shape
    out = torch.empty(D, dtype=torch.float64)
    for c in range(D):
        z = [float(score_rows[p, c]) for p in range(n)]
        top = max(z)
        w = [math.exp(v - top) if v != float("-inf") else 0.0 for v in z]
        out[c] = sum(wi * float(kv_rows[p, c]) for p, wi in enumerate(w)) / sum(w)
    return out


def test_non_overlapping_entries():
    ratio, D, nb = 16, 5, 3
    kv = torch.randn(nb * ratio, D, dtype=torch.float64)
    score = torch.randn(nb * ratio, D, dtype=torch.float64) * 3
    entries = compress_rows(kv, score, ratio)
    for j in range(nb):
        block = slice(j * ratio, (j + 1) * ratio)
        torch.testing.assert_close(entries[j], entry_float64(kv[block], score[block]))


def test_overlapping_entries_pool_previous_first_halves_and_own_second_halves():
    ratio, D, nb = 4, 3, 4
    kv = torch.randn(nb * ratio, 2 * D, dtype=torch.float64)
    score = torch.randn(nb * ratio, 2 * D, dtype=torch.float64)
    entries = compress_rows(kv, score, ratio)
    for j in range(nb):
        own = slice(j * ratio, (j + 1) * ratio)
        rows_kv, rows_score = [kv[own, D:]], [score[own, D:]]
        if j > 0:
            prev = slice((j - 1) * ratio, j * ratio)
            rows_kv.insert(0, kv[prev, :D])
            rows_score.insert(0, score[prev, :D])
        expected = entry_float64(torch.cat(rows_kv), torch.cat(rows_score))
        torch.testing.assert_close(entries[j], expected)


def test_neutral_rows_contribute_nothing():
    D = 4
    kv, score = torch.randn(6, D, dtype=torch.float64), torch.randn(6, D, dtype=torch.float64)
    neutral_kv, neutral_score = torch.zeros(3, D, dtype=torch.float64), torch.full(
        (3, D), float("-inf"), dtype=torch.float64)
    torch.testing.assert_close(pool(torch.cat((kv, neutral_kv)), torch.cat((score, neutral_score))),
                               pool(kv, score))


def test_overlapped_blocks_layout():
    kv = torch.arange(8 * 4, dtype=torch.float64).view(8, 4)  # 2 blocks of 4 rows, D = 2
    sets_kv, sets_score = overlapped_blocks(kv, kv.clone())
    assert sets_kv.shape == (2, 8, 2)
    assert torch.all(sets_kv[0, :4] == 0) and torch.all(sets_score[0, :4] == float("-inf"))
    torch.testing.assert_close(sets_kv[1, :4], kv[:4, :2])
    torch.testing.assert_close(sets_kv[1, 4:], kv[4:, 2:])


def test_partial_blocks_are_refused():
    with pytest.raises(ValueError, match="whole blocks"):
        compress_rows(torch.zeros(5, 2), torch.zeros(5, 2), 4)
