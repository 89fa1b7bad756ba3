"""Host time of eager runner calls at 1 token (Qwen3-30B-A3B and Mixtral-8x7B; bf16, W4A16 AWQ and FP8), beside
what a call costs end to end. Per layer: the host time of 400 eager calls without a synchronization (launches are
asynchronous, so this is the host's cost a call); the wall time of 400 eager calls ended by one synchronization
(what a decode loop without CUDA graphs sees: the larger of host and GPU time); the wall time of 400 replays of
the same call captured in a CUDA graph; with `--launches`, the host time of each recorded launch of the call,
called 300 times alone (the runner's program for the call: runner/programs.py); with `--profile`, the top 20
functions by own time under cProfile. Evidence for docs/performance.md, "Host time per call"; JSON lines.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/host_time_probe.py [--launches] [--profile]
"""
import cProfile
import io
import json
import pstats
import sys
import time

import torch

from moe_build.bench.woq_layer import device_woq_weights, woq_bench_spec
from moe_build.bench.workload import bench_spec, device_fp8_weights, device_weights, fp8_bench_spec, make_inputs
from moe_build.runner import MoERunner
from moe_build.spec import Quant

CALLS = 400


def layer(name: str, label: str) -> tuple:
    if label == "bf16":
        spec = bench_spec(name)
        return spec, device_weights(spec, 0)
    if label == "fp8":
        spec = fp8_bench_spec(name, Quant.FP8)
        return spec, device_fp8_weights(spec, 0)
    spec = woq_bench_spec(name, Quant.W4A16_AWQ)
    return spec, device_woq_weights(spec, Quant.W4A16_AWQ, 0)


def per_call_us(fn, sync: bool) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(CALLS):
        fn()
    if sync:
        torch.cuda.synchronize()
    us = (time.perf_counter() - t) / CALLS * 1e6
    torch.cuda.synchronize()
    return us


def probe(name: str, label: str) -> None:
    spec, w = layer(name, label)
    runner = MoERunner(spec, w, max_tokens=16)
    inp = make_inputs(spec, 1, 1, seed=1)[0]
    out = torch.empty(1, spec.hidden_size, device="cuda", dtype=inp.hidden.dtype)

    def eager() -> None:
        runner(inp.hidden, router_logits=inp.logits, out=out)
    for _ in range(50):
        eager()
    graphed = runner.capture_graph(1, "logits")
    graphed.hidden.copy_(inp.hidden)
    graphed.router_logits.copy_(inp.logits)
    for _ in range(50):
        graphed.replay()
    host = per_call_us(eager, sync=False)
    wall = per_call_us(eager, sync=True)
    graph = per_call_us(graphed.replay, sync=True)
    print(json.dumps({"layer": name, "quant": label, "steps": len(runner.kernel_sequence(1, "logits")),
                      "host_us": round(host, 1), "eager_wall_us": round(wall, 1), "graph_wall_us": round(graph, 1)}),
          flush=True)
    if "--launches" in sys.argv:
        program = next(iter(runner._programs._programs.values()))
        for launch in (x for item in program if not isinstance(item, str) for x in item):
            us = per_call_us(lambda: launch.function(*launch.args), sync=False)
            print(json.dumps({"layer": name, "quant": label, "launch": launch.name, "host_us": round(us, 2)}))
    if "--profile" in sys.argv:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(CALLS):
            eager()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(20)
        print(text.getvalue(), flush=True)


for name in ("qwen3-30b-a3b", "mixtral-8x7b"):
    for label in ("bf16", "w4a16_awq", "fp8"):
        probe(name, label)
        torch.cuda.empty_cache()
