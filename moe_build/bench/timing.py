"""How moe-build times GPU work: medians of CUDA-event timings, interleaved rounds, and the two ceilings.

Public so that every benchmark and probe times the same way (`moe-build bench`, the token sweep, and
scripts that compare two forms of one stage). Why each rule:
- medians of per-call CUDA events after warm-up, so module loads and allocator growth stay out;
- fns compared with each other are timed in rounds, one call each per round, in an order shuffled anew
  each round: under its power limit the GPU runs faster for a while after any idle gap, so a fixed
  order flatters whichever fn follows a gap (identical Mixtral plans spread by 14% in fixed blocks);
- fns that wait on the GPU from the host (`syncs_host`) are timed in a group of their own: their idle
  gaps speed up whatever runs next;
- the ceilings (a device copy, a large read-only reduction and a bf16 matmul) are timed among the fns
  they are compared with, so both run in the same power state (at 4096 tokens a layer holds the GPU at
  its power limit and the SM clock drops); a read alone runs faster than a copy on HBM, so the byte
  floor uses the higher of the two.
"""
from __future__ import annotations

import random
import statistics
import warnings
from typing import Any, Callable, Mapping

import torch


def median_ms(fn: Callable[[int], object], iters: int, warmup: int) -> float:
    """Median CUDA-event time of fn(i) over `iters` calls after `warmup` calls (i rotates the inputs)."""
    for i in range(warmup):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def interleaved_median_ms(fns: Mapping[Any, Callable[[int], object]], iters: int, warmup: int,
                          before: Callable[[], object] | None = None, seed: int = 0) -> dict[Any, float]:
    """Median CUDA-event time of each fn(r) over `iters` rounds r; every round calls each fn once, in an
    order shuffled anew each round from a fixed seed (a run is repeatable). `before` (e.g. an L2 flush)
    is enqueued ahead of every timed call, outside its events."""
    names = list(fns)
    for name in names:
        for i in range(warmup):
            fns[name](i)
    order = random.Random(seed)
    marks: dict[Any, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {name: [] for name in names}
    for r in range(iters):
        for name in order.sample(names, len(names)):
            if before is not None:
                before()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name](r)
            end.record()
            marks[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in marks[name]) for name in names}


def _sync_debug_mode(mode: str) -> None:
    with warnings.catch_warnings():  # torch warns that the mode is a prototype on every switch
        warnings.filterwarnings("ignore", message="Synchronization debug mode")
        torch.cuda.set_sync_debug_mode(mode)


def syncs_host(call: Callable[[], object]) -> bool:
    """Whether `call()` waits on the GPU from the host (nonzero, .tolist(), bincount's size)."""
    torch.cuda.synchronize()
    _sync_debug_mode("error")
    try:
        call()
        return False
    except RuntimeError as e:
        if "synchronizing" not in str(e):
            raise
        return True
    finally:
        _sync_debug_mode("default")
        torch.cuda.synchronize()


class CeilingCalls:
    """The ceiling measurements as calls to time: a 1 GiB device copy, a read-only sum of the same
    1 GiB, and an 8192^3 bf16 matmul (into preallocated outputs, so no call allocates)."""

    COPY_BYTES = 1 << 30
    MATMUL_N = 8192

    def __init__(self) -> None:
        self.src = torch.empty(self.COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
        self.dst = torch.empty_like(self.src)
        self.sum_out = torch.empty((), dtype=torch.float32, device="cuda")
        m = self.MATMUL_N
        self.x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.z = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)

    def copy(self, i: int) -> object:
        return self.dst.copy_(self.src)

    def read(self, i: int) -> object:
        return torch.sum(self.src.view(torch.float32), dim=0, out=self.sum_out)

    def matmul(self, i: int) -> object:
        return torch.matmul(self.x, self.y, out=self.z)

    @classmethod
    def rates(cls, copy_ms: float, read_ms: float, matmul_ms: float) -> dict[str, float]:
        """Ceilings from the calls' times: copy bytes read + written per second, read-only bytes per
        second, matmul FLOP/s, and the byte rate the floor uses (the higher of copy and read)."""
        copy = 2 * cls.COPY_BYTES / (copy_ms * 1e-3)
        read = cls.COPY_BYTES / (read_ms * 1e-3)
        return {"copy_bytes_per_s": copy, "read_bytes_per_s": read, "bytes_per_s": max(copy, read),
                "bf16_flops_per_s": 2 * cls.MATMUL_N ** 3 / (matmul_ms * 1e-3)}


# Each ceiling call (a CeilingCalls method) and its timer key among a point's variants.
CEILING_TIMERS = {"copy": ("ceiling", "copy_us"), "read": ("ceiling", "read_us"), "matmul": ("ceiling", "matmul_us")}


def ceiling_rates(medians_ms: Mapping[Any, float]) -> dict[str, float] | None:
    """The ceilings from the ceiling calls' medians among a point's timers, None if any is missing."""
    keys = [CEILING_TIMERS[c] for c in ("copy", "read", "matmul")]
    if not all(k in medians_ms for k in keys):
        return None
    return CeilingCalls.rates(*(medians_ms[k] for k in keys))


def measure_ceilings(calls: CeilingCalls, iters: int = 10) -> dict[str, float]:
    """The ceilings in a burst, here and now (3 warm-up calls, then `iters` timed ones)."""
    return calls.rates(median_ms(calls.copy, iters, 3), median_ms(calls.read, iters, 3),
                       median_ms(calls.matmul, iters, 3))
