"""The layer and the bench's matmul ceiling in two power states: burst (after an idle gap) and hot.

Why: at 4096 tokens a layer draws the H200 to its power limit, the SM clock then drops, and a
layer's time depends on how long the GPU has been busy. Ceilings measured in a short burst (as the
bench once took its floor from, at the start of its run) against variants timed hot mix the kernels'
efficiency with the power state; the bench now times its ceilings among the variants. This probe
times the layer and the matmul ceiling in both states and reads the SM clock and the energy counter
through NVML, so the two can be told apart.

burst: after `--idle` seconds idle, warm-up then timed calls (the bench's `measure_ceilings`
       method: 3 + 10 for the matmul; 5 + 20 graph replays for the layer);
hot:   after `--heat` seconds of back-to-back calls, `--hot-iters` timed calls.
Per state: median us per call and the SM clock sampled while the timed calls run; hot also gives
joules per call from NVML's board energy counter over `--energy-s` seconds of calls (the counter
moves too coarsely for the burst's few milliseconds).

Usage: python bench/power_state_probe.py [--shape qwen3-30b-a3b] [--tokens 4096] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import pynvml
import torch

from moe_build.bench.timing import CeilingCalls
from moe_build.bench.workload import bench_spec, device_weights, floor_us
from moe_build.runner import MoERunner
from moe_build.runner.graph import GraphedMoE


class Nvml:
    """SM clock and board energy of the current CUDA device."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    def clock_mhz(self) -> int:
        return pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_SM)

    def energy_mj(self) -> int:
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(self.h)

    def power_limit_w(self) -> float:
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(self.h) / 1e3


def timed(fn: Callable[[], object], warmup: int, iters: int, nvml: Nvml) -> dict[str, float]:
    """Median event time of fn over `iters` calls after `warmup`, with the SM clock sampled from
    the host while the timed calls run."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    clocks = []
    while not ends[-1].query():
        clocks.append(nvml.clock_mhz())
        time.sleep(0.002)
    torch.cuda.synchronize()
    return {"us": 1e3 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)),
            "sm_clock_mhz": statistics.mean(clocks) if clocks else float("nan")}


def heat(fn: Callable[[], object], seconds: float) -> int:
    """Back-to-back calls for `seconds`; the number of calls."""
    calls = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    return calls


def joules_per_call(fn: Callable[[], object], seconds: float, nvml: Nvml) -> float:
    torch.cuda.synchronize()
    e0 = nvml.energy_mj()
    calls = heat(fn, seconds)
    return (nvml.energy_mj() - e0) / 1e3 / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--heat", type=float, default=3.0)
    ap.add_argument("--hot-iters", type=int, default=100)
    ap.add_argument("--energy-s", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    nvml = Nvml()
    spec = bench_spec(a.shape)
    runner = MoERunner(spec, device_weights(spec, seed=0), max_tokens=a.tokens)
    layer = GraphedMoE(runner, a.tokens, routing_input="logits")
    calls = CeilingCalls()
    mm_flops = 2.0 * CeilingCalls.MATMUL_N ** 3
    fns = {"layer": layer.replay, "matmul": lambda: calls.matmul(0)}
    burst_args = {"layer": (5, 20), "matmul": (3, 10)}
    rec: dict[str, object] = {"device": torch.cuda.get_device_name(), "shape": a.shape, "tokens": a.tokens,
                              "power_limit_w": nvml.power_limit_w()}
    for state in ("burst", "hot"):
        for name, fn in fns.items():
            if state == "burst":
                time.sleep(a.idle)
                r = timed(fn, *burst_args[name], nvml)
            else:
                heat(fn, a.heat)
                r = timed(fn, 0, a.hot_iters, nvml)
                r["joules_per_call"] = joules_per_call(fn, a.energy_s, nvml)
            rec[f"{name}/{state}"] = r
    # The layer's FLOPs against each state's matmul rate (the floor is FLOP-bound at 4096 tokens of
    # the narrow shapes; floor_us also takes the bytes bound, with the copy rate left out here).
    touched = spec.num_experts
    for state in ("burst", "hot"):
        rate = mm_flops / (rec[f"matmul/{state}"]["us"] * 1e-6)
        fl = floor_us(spec, a.tokens, touched, {"bytes_per_s": float("inf"), "bf16_flops_per_s": rate})
        rec[f"floor/{state}"] = {"tflops": rate / 1e12, "flops_floor_us": fl["flops_us"], "flops": fl["flops"]}
    # Energy: the layer's joules against the matmul's joules for the same FLOPs (both hot). Where both
    # run at the power limit, time is energy over that power, so the hot time ratio tends to this one.
    mm_j_per_flop = rec["matmul/hot"]["joules_per_call"] / mm_flops
    rec["energy_ratio_hot"] = rec["layer/hot"]["joules_per_call"] / (mm_j_per_flop * rec["floor/hot"]["flops"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    print(f"{rec['device']}, power limit {rec['power_limit_w']:.0f} W; {a.shape} at {a.tokens} tokens")
    print(f"{'state':6s} {'layer us':>9s} {'clock':>6s} | {'matmul TF/s':>11s} {'clock':>6s} | "
          f"{'floor us':>8s} {'layer/floor':>11s}")
    for state in ("burst", "hot"):
        lr, mr, fl = rec[f"layer/{state}"], rec[f"matmul/{state}"], rec[f"floor/{state}"]
        print(f"{state:6s} {lr['us']:9.1f} {lr['sm_clock_mhz']:6.0f} | {fl['tflops']:11.1f} {mr['sm_clock_mhz']:6.0f} | "
              f"{fl['flops_floor_us']:8.1f} {lr['us'] / fl['flops_floor_us']:11.2f}")
    print(f"hot: layer {rec['layer/hot']['joules_per_call']:.3f} J/call, matmul "
          f"{rec['matmul/hot']['joules_per_call']:.3f} J/call; layer energy / matmul energy for the same FLOPs "
          f"{rec['energy_ratio_hot']:.2f}")


if __name__ == "__main__":
    main()
