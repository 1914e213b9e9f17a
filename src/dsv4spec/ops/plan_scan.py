"""Where an op's launch plan changes along the token count, found by running its planner at every
count: the planner switches that the measured-faster tables' ranges stop at
(:mod:`dsv4spec.integrations.plans`), and the first count whose plan differs between two GPUs
(two SM counts).

A plan here is a pair ``(tiling, grid)``: the tiling is the discrete choices (kernel, blocks,
warps, stages, launch flags), the grid the split count the planners size from T and the GPU's SM
count at every count. A *switch* is a count whose tiling differs from the count below's; the grid
follows T by one formula between switches, so it is not one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Plan = Callable[[int], tuple[Any, Any]]


GRID_FIELDS = ("chunks_per_split", "num_splits")


def tiling_and_grid(config: tuple) -> tuple[tuple, tuple]:
    """A planner's config (a NamedTuple) as ``(tiling, grid)``: the grid its ``GRID_FIELDS``."""
    fields = config._fields
    return (tuple(v for f, v in zip(fields, config) if f not in GRID_FIELDS),
            tuple(getattr(config, f) for f in GRID_FIELDS))


def check_count(name: str, value: Any) -> int:
    """``value`` as a count >= 1, else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def tiling_switches(plan: Plan, max_tokens: int) -> tuple[int, ...]:
    """The counts T, ``2 <= T <= max_tokens``, at which ``plan(T)``'s tiling differs from
    ``plan(T - 1)``'s."""
    check_count("max_tokens", max_tokens)
    switches, previous = [], plan(1)[0]
    for T in range(2, max_tokens + 1):
        tiling = plan(T)[0]
        if tiling != previous:
            switches.append(T)
        previous = tiling
    return tuple(switches)


def first_difference(plan: Plan, other: Plan, max_tokens: int) -> int | None:
    """The smallest count up to ``max_tokens`` at which ``plan`` and ``other`` give another plan,
    tiling or grid (other launches); None where they agree throughout."""
    check_count("max_tokens", max_tokens)
    return next((T for T in range(1, max_tokens + 1) if plan(T) != other(T)), None)
