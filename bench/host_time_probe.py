"""Host time of eager runner calls at 1 token (Qwen3-30B-A3B, bf16 and W4A16 AWQ), and where it goes: 400 calls
timed on the host without a synchronization (launches are asynchronous, so this is the host's cost a call), then
400 more under cProfile (top 28 by own time). Evidence for docs/performance.md, "Host time per call".

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/host_time_probe.py
"""
import cProfile
import io
import pstats
import time

import torch

from moe_build.bench.woq_layer import device_woq_weights, woq_bench_spec
from moe_build.bench.workload import bench_spec, device_weights, make_inputs
from moe_build.runner import MoERunner
from moe_build.spec import Quant

NAME, CALLS = "qwen3-30b-a3b", 400
for label in ("bf16", "w4a16_awq"):
    if label == "bf16":
        spec = bench_spec(NAME)
        w = device_weights(spec, 0)
    else:
        spec = woq_bench_spec(NAME, Quant.W4A16_AWQ)
        w = device_woq_weights(spec, Quant.W4A16_AWQ, 0)
    runner = MoERunner(spec, w, max_tokens=16)
    inp = make_inputs(spec, 1, 1, seed=1)[0]
    out = torch.empty(16, spec.hidden_size, device="cuda", dtype=torch.bfloat16)
    for _ in range(50):
        runner(inp.hidden, router_logits=inp.logits, out=out[:1])
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(CALLS):
        runner(inp.hidden, router_logits=inp.logits, out=out[:1])
    host_us = (time.perf_counter() - t) / CALLS * 1e6
    torch.cuda.synchronize()
    print(f"{label}: host {host_us:.1f} us per eager call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        runner(inp.hidden, router_logits=inp.logits, out=out[:1])
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(28)
    print(text.getvalue())
