"""What the kernel-by-kernel probes share (bench/layer_steps_probe.py, bench/ep_steps_probe.py): a captured CUDA
graph replayed back to back under torch.profiler, its kernels' device time per replay by name, beside the replays'
own time from CUDA events (the gap between the two is launch latency and idle time between kernels)."""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from typing import Callable

import torch


def kernel_times(graph: torch.cuda.CUDAGraph, replays: int, name_of: Callable[[str], str]) -> dict:
    """`graph` (warmed up) replayed `replays` times under the profiler: {"replay_us": its time per replay,
    "kernels": {name_of(kernel name): {"calls", "us"} per replay}}."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = per[name_of(e.name)]
            k[0] += 1
            k[1] += e.device_time_total
    return {"replay_us": 1e3 * start.elapsed_time(end) / replays,
            "kernels": {n: {"calls": c / replays, "us": t / replays} for n, (c, t) in per.items()}}


def print_kernel_times(label: str, r: dict) -> None:
    """One kernel_times result: the replay and the kernels' total, then each kernel, slowest first."""
    total = sum(k["us"] for k in r["kernels"].values())
    print(f"{label}: replay {r['replay_us']:.1f} us, kernels {total:.1f} us", flush=True)
    for n, k in sorted(r["kernels"].items(), key=lambda x: -x[1]["us"]):
        print(f"    {k['us']:8.1f} us  x{k['calls']:.0f}  {n}", flush=True)


def kernel_timeline(graph: torch.cuda.CUDAGraph, replays: int, name_of: Callable[[str], str]) -> list[dict]:
    """`graph` (warmed up) replayed `replays` times under the profiler: its kernels in start order, each as
    {"name", "start_us" (from the first kernel's start), "us"}. Under programmatic dependent launch a kernel starts
    before its predecessor ends, so starts and ends, not durations, say what waited on what."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start if events else 0
    return [{"name": name_of(e.name), "start_us": e.time_range.start - t0,
             "us": e.time_range.end - e.time_range.start} for e in events]


def write_results(results: list, default_name: str) -> None:
    """A probe's results as JSON: to the path given as its first argument, else default_name in $OUT (or here)."""
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "."), default_name)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
