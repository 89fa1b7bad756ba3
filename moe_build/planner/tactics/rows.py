"""A GEMM call's token rows at one token count, and the bands of token counts over which a rule's answer holds.

The rules read the average rows per expert, ceil(tokens * top_k / experts), through `RowCount`, which records every
threshold they compare it with; `token_bands` walks the token counts from 1 threshold to the next, so each rule's
answers become bands, which the plan records and the runner looks up per call.
"""
from __future__ import annotations

from typing import Callable, TypeVar


class RowCount:
    """A GEMM call's rows at one token count (tokens * top_k, and their average per expert), recording
    every threshold a rule compares them with: `next_change` is then the smallest larger token count at
    which any answer the rules gave here can change, so the rules' result is constant up to it."""

    def __init__(self, tokens: int, top_k: int, experts: int) -> None:
        self.tokens, self.top_k, self.experts = tokens, top_k, experts
        self.rows = tokens * top_k
        self.avg = -(-self.rows // experts)
        self.next_change: int | None = None

    def _flips_at(self, tokens: int) -> None:
        if tokens > self.tokens and (self.next_change is None or tokens < self.next_change):
            self.next_change = tokens

    def avg_at_most(self, rows: int) -> bool:
        """ceil(tokens * top_k / experts) <= rows, which holds up to tokens = floor(rows * experts / top_k)."""
        self._flips_at(rows * self.experts // self.top_k + 1)
        return self.avg <= rows

    def rows_below(self, rows: int) -> bool:
        """tokens * top_k < rows, which holds below tokens = ceil(rows / top_k)."""
        self._flips_at(-(-rows // self.top_k))
        return self.rows < rows

    def tokens_at_most(self, tokens: int) -> bool:
        """tokens <= `tokens` (e.g. within a band of another stage), which holds up to it."""
        self._flips_at(tokens + 1)
        return self.tokens <= tokens


X = TypeVar("X")


def token_bands(top_k: int, experts: int, rule: Callable[[RowCount], X]) -> list[tuple[int, int | None, X]]:
    """(first token count, last or None, answer) bands of `rule` covering every token count from 1, adjacent
    bands of one answer merged: each band ends where a threshold the rule compared could flip."""
    bands: list[tuple[int, int | None, X]] = []
    tokens: int | None = 1
    while tokens is not None:
        rows = RowCount(tokens, top_k, experts)
        answer = rule(rows)
        last = None if rows.next_change is None else rows.next_change - 1
        if bands and bands[-1][2] == answer:
            bands[-1] = (bands[-1][0], last, answer)
        else:
            bands.append((tokens, last, answer))
        tokens = rows.next_change
    return bands
