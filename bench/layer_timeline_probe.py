"""When each kernel of a single-GPU FP8 or weight-only layer starts and ends within a CUDA-graph replay, at decode token
counts: the evidence that the FP8 expansion ended 3.5-5.1 us after the map build at 1-16 tokens, its token rows queued
behind the decode GEMM1's early weight loads (docs/performance.md, "The FP8 expansion reads its token rows before
its wait"). Replays back to back (no L2 flush), the last of them printed: start and end of each kernel from the
replay's first start, in us.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/layer_timeline_probe.py [out.json]
    (LAYER_TIMELINE_POINTS: shape:tokens,... overrides the points; LAYER_TIMELINE_QUANT: fp8 (default), fp8_block or
    a weight-only mode of the bench (moe_build/bench/woq_layer.py QUANTS: w4a16_awq, w8a16, w4afp8, w4afp8_dynamic,
    wfp4a16: its layers and weights);
    LAYER_TIMELINE_FORCE: stage=choice,... pinned in the plan, e.g. fc1_activation=separate)
"""
from __future__ import annotations

import os

import torch
from graph_kernel_times import kernel_timeline, write_results
from layer_steps_probe import short

from moe_build.bench.woq_layer import QUANTS, device_woq_weights, woq_bench_spec
from moe_build.bench.workload import device_fp8_weights, fp8_bench_spec, make_inputs
from moe_build.runner import MoERunner
from moe_build.spec import Quant

REPLAYS = 4
QUANT = os.environ.get("LAYER_TIMELINE_QUANT", "fp8")
FORCE = dict(item.split("=", 1) for item in os.environ.get("LAYER_TIMELINE_FORCE", "").split(",") if item)
POINTS = [(p.split(":")[0], int(p.split(":")[1])) for p in os.environ.get(
    "LAYER_TIMELINE_POINTS", "gpt-oss-20b:1,gpt-oss-20b:16,qwen3-30b-a3b:16,deepseek-v2-lite:256,deepseek-v3:1").split(",")]


def main() -> None:
    results = []
    for name, tokens in POINTS:
        if QUANT in (Quant.FP8.value, Quant.FP8_BLOCK.value):
            spec = fp8_bench_spec(name, Quant(QUANT))
            w = device_fp8_weights(spec, seed=1)
        else:
            quant, act_scale = QUANTS[QUANT]
            spec = woq_bench_spec(name, quant, act_scale)
            w = device_woq_weights(spec, quant, seed=1)
        runner = MoERunner(spec, w, max_tokens=tokens, force=FORCE)
        s = make_inputs(spec, tokens, 1, seed=tokens, correction_bias=w.correction_bias)[0]
        graphed = runner.capture_graph(tokens, "logits")
        graphed.hidden.copy_(s.hidden)
        graphed.router_logits.copy_(s.logits)
        for _ in range(3):
            graphed.replay()
        torch.cuda.synchronize()
        events = kernel_timeline(graphed.graph, REPLAYS, short)
        per_replay = len(events) // REPLAYS
        last = events[-per_replay:]
        t0 = last[0]["start_us"]
        print(f"{name} {QUANT} {FORCE or ''} T={tokens}: {per_replay} kernels a replay; start / end (us) of the last replay", flush=True)
        for e in last:
            print(f"    {e['start_us'] - t0:7.1f} {e['start_us'] - t0 + e['us']:7.1f}  {e['name']}", flush=True)
        results.append({"shape": name, "quant": QUANT, "force": FORCE, "tokens": tokens, "events": events})
        del runner, w, graphed
        torch.cuda.empty_cache()
    write_results(results, "layer_timeline.json")


if __name__ == "__main__":
    main()
