"""Which parametrized cases of a test keep every pair of parameter values: the GPU suite runs these by default.

Why: the GPU tests cross every tactic with every shape, count, dtype and fusion, 8,500 cases that take longer on one
GPU than a session's device time. The kernel bugs these tests look for show at one value or where two meet (a tile at
a ragged k, a K split with a bias), so a subset holding every pair of values that occurs together in some case
(all-pairs, as combinatorial test design uses) runs every value against every other parameter's values at about a
third of the cases; what it gives up is cases where only three or more particular values meet. `pytest
--gpu-cases=all` still runs every combination, as a kernel change deserves.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import combinations

Pair = tuple[int, Hashable, int, Hashable]


def pairs_of(case: Sequence[Hashable]) -> set[Pair]:
    """Every (axis, value, other axis, its value) that `case` exercises together."""
    return {(i, case[i], j, case[j]) for i, j in combinations(range(len(case)), 2)}


def pairwise_subset(cases: Sequence[Sequence[Hashable]]) -> list[int]:
    """Indices (ascending) of cases that together hold every pair of values some case holds.

    Greedy: take the case that adds the most pairs not yet held, the earliest on ties, until none is missing. The
    answer depends only on the cases and their order, so every run and every split of the suite keeps the same
    ones. With one parameter, or two, every case is its own value or pair and all are kept.
    """
    if any(len(case) != len(cases[0]) for case in cases):
        raise ValueError("every case needs the same parameters")
    if cases and len(cases[0]) < 2:
        return list(range(len(cases)))
    held: list[set[Pair]] = [pairs_of(case) for case in cases]
    missing: set[Pair] = set().union(*held) if held else set()
    kept: list[int] = []
    while missing:
        best = max(range(len(cases)), key=lambda i: (len(held[i] & missing), -i))
        kept.append(best)
        missing -= held[best]
    return sorted(kept)
