"""``usage.int_in`` bounds are inclusive at both ends: the bound itself is accepted (the help text
says ``[low, high]``), the next integer outside it is not, and so through the ``generate``
command's ``--num-draft-tokens``."""

import argparse

import pytest

from dsv4spec.engine.generate import MAX_NUM_DRAFT_TOKENS
from dsv4spec.engine.run import add_arguments
from dsv4spec.usage import int_in


@pytest.mark.parametrize("low, high", [(2, 8), (1, 4096), (0, 0)])
def test_both_bounds_are_accepted(low, high):
    parse = int_in(low, high)
    assert parse(str(low)) == low
    assert parse(str(high)) == high


@pytest.mark.parametrize("low, high", [(2, 8), (1, 4096)])
def test_one_past_either_bound_is_rejected(low, high):
    parse = int_in(low, high)
    for value in (low - 1, high + 1):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"\[{low}, {high}\]"):
            parse(str(value))


def test_no_upper_bound_accepts_large_values():
    assert int_in(1)("1") == 1 and int_in(1)(str(1 << 40)) == 1 << 40
    with pytest.raises(argparse.ArgumentTypeError):
        int_in(1)("0")


def _parser():
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser


def test_num_draft_tokens_accepts_its_bounds():
    parser = _parser()
    for value in (2, MAX_NUM_DRAFT_TOKENS):
        args = parser.parse_args(["--prompt", "hi", "--num-draft-tokens", str(value)])
        assert args.num_draft_tokens == value


def test_num_draft_tokens_rejects_past_its_bounds():
    parser = _parser()
    for value in (1, MAX_NUM_DRAFT_TOKENS + 1):
        with pytest.raises(argparse.ArgumentError, match="num-draft-tokens"):
            parser.parse_args(["--prompt", "hi", "--num-draft-tokens", str(value)])
