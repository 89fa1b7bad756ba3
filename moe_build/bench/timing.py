"""How moe-build times GPU work: medians of CUDA-event timings, interleaved rounds, and the two ceilings.

Public so that every benchmark and probe times the same way (`moe-build bench`, the token sweep, and
scripts that compare two forms of one stage). Why each rule:
- medians of per-call CUDA events after warm-up, so module loads and allocator growth stay out;
- fns compared with each other are timed in rounds, one call each per round, in an order shuffled anew
  each round: under its power limit the GPU runs faster for a while after any idle gap, so a fixed
  order flatters whichever fn follows a gap (identical Mixtral plans spread by 14% in fixed blocks);
- fns that wait on the GPU from the host (`syncs_host`) are timed in a group of their own: their idle
  gaps speed up whatever runs next;
- a layer's graph replays each start with L2 emptied by a read (`flush_l2`, outside the events; eager calls
  keep the GPU's own order, where the flush would give the host a head start), and each point shuffles with a
  seed of its own: otherwise a replay that follows another variant's call on the same weights finds some of
  them in L2, and with one fixed seed the same variants follow each other at every point (two runners of one
  plan, W4AFP8 at 1 token, spread by 3-6% that way, always the same one ahead);
- the ceilings (a device copy, a large read-only reduction and a bf16 matmul; for FP8 layers also an
  e4m3 matmul) are timed among the fns they are compared with, so both run in the same power state (at
  4096 tokens a layer holds the GPU at its power limit and the SM clock drops); a read alone runs faster
  than a copy on HBM, so the byte floor uses the higher of the two.
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


_FLUSH_FLOATS = 64 << 20  # 256 MB: five times an H100/H200's 50 MB L2
_flush_buffer: torch.Tensor | None = None


def flush_l2() -> None:
    """Empty L2 of what the previous call left there, by reading 256 MB (a sum: a written flush would leave L2 full
    of dirty lines, whose write-back the timed call would then pay)."""
    global _flush_buffer
    if _flush_buffer is None or _flush_buffer.device != torch.device("cuda", torch.cuda.current_device()):
        _flush_buffer = torch.ones(_FLUSH_FLOATS, dtype=torch.float32, device="cuda")
    _flush_buffer.sum()


def interleaved_median_ms(fns: Mapping[Any, Callable[[int], object]], iters: int, warmup: int,
                          before: Callable[[Any], object] | None = None, seed: int = 0) -> dict[Any, float]:
    """Median CUDA-event time of each fn(r) over `iters` rounds r; every round calls each fn once, in an
    order shuffled anew each round from a fixed seed (a run is repeatable). `before(name)` (e.g. an L2 flush)
    is enqueued ahead of every timed call of fn `name`, outside its events."""
    names = list(fns)
    for name in names:
        for i in range(warmup):
            fns[name](i)
    order = random.Random(seed)
    marks: dict[Any, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {name: [] for name in names}
    for r in range(iters):
        for name in order.sample(names, len(names)):
            if before is not None:
                before(name)
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
    1 GiB, an 8192^3 bf16 matmul, and with `fp8` an 8192^3 e4m3 matmul (into preallocated outputs, so
    no call allocates).

    The FP8 matmul is torch._scaled_mm with tensor-wise fp32 scales and fp32 accumulation promoted as
    our FP8 GEMMs promote it (use_fast_accum=False): the tensor-core rate at the accuracy the FP8 layer
    keeps, which is what an FP8 layer's FLOPs can at best run at."""

    COPY_BYTES = 1 << 30
    MATMUL_N = 8192

    def __init__(self, fp8: bool = False) -> None:
        self.fp8 = fp8
        self.src = torch.empty(self.COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
        self.dst = torch.empty_like(self.src)
        self.sum_out = torch.empty((), dtype=torch.float32, device="cuda")
        m = self.MATMUL_N
        self.x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        self.z = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
        if fp8:
            self.x8 = self.x.to(torch.float8_e4m3fn)
            self.y8 = self.y.to(torch.float8_e4m3fn).t()  # column-major: _scaled_mm's second operand
            self.unit_scale = torch.ones((), device="cuda", dtype=torch.float32)

    def copy(self, i: int) -> object:
        return self.dst.copy_(self.src)

    def read(self, i: int) -> object:
        return torch.sum(self.src.view(torch.float32), dim=0, out=self.sum_out)

    def matmul(self, i: int) -> object:
        return torch.matmul(self.x, self.y, out=self.z)

    def fp8_matmul(self, i: int) -> object:
        return torch._scaled_mm(self.x8, self.y8, self.unit_scale, self.unit_scale, out_dtype=torch.bfloat16,
                                use_fast_accum=False, out=self.z)

    def timers(self) -> dict[tuple[str, str], Callable[[int], object]]:
        """Each ceiling call under its timer key, to time among a point's variants (FP8 only with `fp8`)."""
        names = [*CEILING_TIMERS, FP8_CEILING] if self.fp8 else list(CEILING_TIMERS)
        return {TIMER_KEYS[name]: getattr(self, name) for name in names}

    @classmethod
    def rates(cls, copy_ms: float, read_ms: float, matmul_ms: float,
              fp8_matmul_ms: float | None = None) -> dict[str, float]:
        """Ceilings from the calls' times: copy bytes read + written per second, read-only bytes per
        second, matmul FLOP/s, the byte rate the floor uses (the higher of copy and read), and with an
        FP8 matmul time its FLOP/s ("fp8_flops_per_s")."""
        copy = 2 * cls.COPY_BYTES / (copy_ms * 1e-3)
        read = cls.COPY_BYTES / (read_ms * 1e-3)
        flops = 2 * cls.MATMUL_N ** 3
        rates = {"copy_bytes_per_s": copy, "read_bytes_per_s": read, "bytes_per_s": max(copy, read),
                 "bf16_flops_per_s": flops / (matmul_ms * 1e-3)}
        if fp8_matmul_ms is not None:
            rates["fp8_flops_per_s"] = flops / (fp8_matmul_ms * 1e-3)
        return rates


# Each ceiling call (a CeilingCalls method) and its timer key among a point's variants; the FP8 matmul
# is timed in FP8 runs only.
CEILING_TIMERS = {"copy": ("ceiling", "copy_us"), "read": ("ceiling", "read_us"), "matmul": ("ceiling", "matmul_us")}
FP8_CEILING = "fp8_matmul"
TIMER_KEYS = {**CEILING_TIMERS, FP8_CEILING: ("ceiling", "fp8_matmul_us")}


def ceiling_rates(medians_ms: Mapping[Any, float], fp8: bool = False) -> dict[str, float] | None:
    """The ceilings from the ceiling calls' medians among a point's timers, None if any is missing (the
    FP8 matmul's counts only with `fp8`)."""
    names = [*CEILING_TIMERS, FP8_CEILING] if fp8 else list(CEILING_TIMERS)
    if not all(TIMER_KEYS[name] in medians_ms for name in names):
        return None
    return CeilingCalls.rates(*(medians_ms[TIMER_KEYS[name]] for name in names))


def ceilings_text(ceilings: Mapping[str, float]) -> str:
    """The burst ceilings as the bench logs them (the e4m3 matmul rate where it was timed)."""
    text = (f"burst ceilings: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"read {ceilings['read_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"bf16 matmul {ceilings['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s")
    fp8 = ceilings.get("fp8_flops_per_s")
    return text + (f", e4m3 matmul {fp8 / 1e12:.0f} TFLOP/s" if fp8 else "")


def measure_ceilings(calls: CeilingCalls, iters: int = 10) -> dict[str, float]:
    """The ceilings in a burst, here and now (3 warm-up calls, then `iters` timed ones)."""
    return calls.rates(median_ms(calls.copy, iters, 3), median_ms(calls.read, iters, 3),
                       median_ms(calls.matmul, iters, 3),
                       median_ms(calls.fp8_matmul, iters, 3) if calls.fp8 else None)
