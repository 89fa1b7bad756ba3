"""The bench's interleaved timer (moe_build.bench.interleaved_median_ms) on a real GPU.

What it must guarantee for the side-by-side ratios to mean anything: every fn runs its warm-up and
the same number of timed calls, each round calls every fn once with that round's input index (so
the rotation over input sets covers them), the order of the fns is shuffled from round to round
(repeatably), and a fn that does more GPU work measures longer. And `syncs_host`, which keeps
host-syncing peers out of the device-bound variants' rounds, tells the two kinds apart.
"""
from __future__ import annotations

import pytest
import torch

from moe_build.bench.timing import CeilingCalls, interleaved_median_ms, measure_ceilings, syncs_host

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]


@pytest.mark.parametrize("iters", [20, 7, 1])
def test_calls_indices_and_order(iters: int) -> None:
    log: list[tuple[str, int]] = []
    names = ("a", "b", "c", "d")
    fns = {name: (lambda i, name=name: log.append((name, i))) for name in names}
    out = interleaved_median_ms(fns, iters, warmup=2)
    assert set(out) == set(fns) and all(t >= 0.0 for t in out.values())
    timed = log[len(names) * 2:]  # after each fn's two warm-up calls
    rounds = [timed[r * len(names):(r + 1) * len(names)] for r in range(iters)]
    assert len(timed) == iters * len(names)
    for r, calls in enumerate(rounds):  # every fn once per round, with that round's input index
        assert sorted(calls) == [(n, r) for n in names], (r, calls)
    if iters >= 7:  # the order changes between rounds (shuffled; a fixed order is 1 in 24^6)
        assert len({tuple(n for n, _ in calls) for calls in rounds}) > 1
        assert len({calls[0][0] for calls in rounds}) > 1


def test_same_seed_same_order() -> None:
    def order(seed: int) -> list[str]:
        log: list[str] = []
        interleaved_median_ms({n: (lambda i, n=n: log.append(n)) for n in "abcde"}, 10, warmup=0, seed=seed)
        return log
    assert order(3) == order(3)
    assert order(3) != order(4)


def test_more_work_measures_longer() -> None:
    x = torch.randn(2048, 2048, device="cuda")
    one = lambda i: x @ x  # noqa: E731
    four = lambda i: [x @ x for _ in range(4)]  # noqa: E731
    out = interleaved_median_ms({"one": one, "four": four}, iters=12, warmup=2)
    assert out["four"] > 2.5 * out["one"], out


def test_before_runs_ahead_of_every_timed_call_and_is_not_timed() -> None:
    log: list[str] = []
    fns = {name: (lambda i, name=name: log.append(name)) for name in ("a", "b")}
    interleaved_median_ms(fns, iters=6, warmup=1, before=lambda name: log.append(f"before {name}"))
    timed = log[2:]  # after the two warm-up calls
    assert timed[0::2] == [f"before {name}" for name in timed[1::2]]  # one before each of the 2 x 6 timed calls
    assert sorted(timed[1::2]) == ["a"] * 6 + ["b"] * 6
    x = torch.randn(2048, 2048, device="cuda")
    heavy = lambda: [x @ x for _ in range(8)]  # noqa: E731
    out = interleaved_median_ms({"one": lambda i: x @ x, "four": lambda i: [x @ x for _ in range(4)]},
                                 iters=12, warmup=2, before=lambda name: heavy())
    assert out["four"] > 2.5 * out["one"], out  # eight untimed matmuls ahead of each call would close it


def test_no_fns() -> None:
    assert interleaved_median_ms({}, 10, 2) == {}


def test_syncs_host_tells_syncing_fns_apart() -> None:
    h, lg = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
    assert not syncs_host(lambda: h * 2 + lg.sum())
    assert syncs_host(lambda: h[(lg > 0).nonzero()[:, 0]])
    assert syncs_host(lambda: h * float(lg.max()))
    assert torch.cuda.get_sync_debug_mode() == 0  # restored


def test_ceiling_calls_do_their_work_and_give_rates() -> None:
    """The ceiling calls the bench times at every point: the copy copies every byte, the read sums
    every byte (as float32 words; fp64 reference), the matmul computes x @ y (fp64 reference on sampled
    rows, output poisoned first), and burst rates are finite and positive."""
    calls = CeilingCalls()
    calls.dst.fill_(0xAB)
    calls.copy(0)
    assert torch.equal(calls.dst, calls.src)
    calls.src.view(torch.float32).uniform_(-1, 1)
    calls.sum_out.fill_(float("nan"))
    calls.read(0)
    ref_sum = float(calls.src.view(torch.float32).double().sum())
    assert abs(float(calls.sum_out) - ref_sum) < 1e-3 * calls.src.view(torch.float32).numel() ** 0.5
    calls.z.fill_(float("nan"))
    calls.matmul(0)
    rows = torch.randint(0, CeilingCalls.MATMUL_N, (8,), device="cuda")
    ref = calls.x[rows].double() @ calls.y.double()
    assert torch.isfinite(calls.z).all()
    assert float((calls.z[rows].double() - ref).norm() / ref.norm()) < 1e-2
    rates = measure_ceilings(calls, iters=3)
    assert all(0 < v < float("inf") for v in rates.values()), rates
