"""The bench's interleaved timer (moe_build.bench._interleaved_median_ms) on a real GPU.

What it must guarantee for the side-by-side ratios to mean anything: every fn runs its warm-up and
the same number of timed calls, each timed call gets its own input index (so the rotation over
input sets covers them), the order of the fns changes from round to round, and a fn that does
more GPU work measures longer.
"""
from __future__ import annotations

import pytest
import torch

from moe_build.bench import _interleaved_median_ms

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("iters,rounds", [(20, 4), (7, 3), (1, 1)])
def test_calls_indices_and_order(iters: int, rounds: int) -> None:
    log: list[tuple[str, int]] = []
    fns = {name: (lambda i, name=name: log.append((name, i))) for name in ("a", "b", "c")}
    out = _interleaved_median_ms(fns, iters, warmup=2, rounds=rounds)
    assert set(out) == set(fns) and all(t >= 0.0 for t in out.values())
    per_round = -(-iters // rounds)
    timed = log[3 * 2:]  # after each fn's two warm-up calls
    for name in fns:
        idx = [i for n, i in timed if n == name]
        assert idx == list(range(rounds * per_round)), name
    # each round starts with a different fn (rotation), as far as there are rounds
    firsts = [timed[r * 3 * per_round][0] for r in range(rounds)]
    assert firsts == ["a", "b", "c", "a"][:rounds]


def test_more_work_measures_longer() -> None:
    x = torch.randn(2048, 2048, device="cuda")
    one = lambda i: x @ x  # noqa: E731
    four = lambda i: [x @ x for _ in range(4)]  # noqa: E731
    out = _interleaved_median_ms({"one": one, "four": four}, iters=12, warmup=2)
    assert out["four"] > 2.5 * out["one"], out


def test_before_runs_ahead_of_every_timed_call_and_is_not_timed() -> None:
    log: list[str] = []
    fns = {name: (lambda i, name=name: log.append(name)) for name in ("a", "b")}
    _interleaved_median_ms(fns, iters=6, warmup=1, rounds=2, before=lambda: log.append("before"))
    timed = log[2:]  # after the two warm-up calls
    assert timed[0::2] == ["before"] * 12  # one before each of the 2 x 6 timed calls
    assert sorted(timed[1::2]) == ["a"] * 6 + ["b"] * 6
    x = torch.randn(2048, 2048, device="cuda")
    heavy = lambda: [x @ x for _ in range(8)]  # noqa: E731
    out = _interleaved_median_ms({"one": lambda i: x @ x, "four": lambda i: [x @ x for _ in range(4)]},
                                 iters=12, warmup=2, before=heavy)
    assert out["four"] > 2.5 * out["one"], out  # eight untimed matmuls ahead of each call would close it


def test_no_fns() -> None:
    assert _interleaved_median_ms({}, 10, 2) == {}
