"""Where a single-GPU layer spends its time, kernel by kernel: bf16, FP8 and weight-only layers of the bench shapes
at a few token counts, each call captured in a CUDA graph and replayed back to back under torch.profiler.
Per kernel name: calls and device time per replay, beside the replay's time from CUDA events (the gap is launch
latency and idle time between kernels). The evidence for which non-GEMM step of a layer to fuse or speed up next.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/layer_steps_probe.py [out.json]
    (LAYER_STEPS_SHAPES / LAYER_STEPS_TOKENS / LAYER_STEPS_QUANTS: comma-separated overrides; the FP8 ones as `moe-build bench --quant` names them)
"""
from __future__ import annotations

import os
import torch
from graph_kernel_times import kernel_times, print_kernel_times, write_results

from moe_build.bench.fp8_layer import MODES
from moe_build.bench.woq_layer import device_woq_weights, woq_bench_spec
from moe_build.bench.workload import bench_spec, device_fp8_weights, device_weights, fp8_bench_spec, make_inputs
from moe_build.runner import MoERunner
from moe_build.spec import MoESpec, Quant
from moe_build.weights import MoEWeights

REPLAYS = 20
SHAPES = os.environ.get("LAYER_STEPS_SHAPES", "qwen3-30b-a3b,mixtral-8x7b,deepseek-v2-lite").split(",")
TOKENS = [int(t) for t in os.environ.get("LAYER_STEPS_TOKENS", "1,256,4096").split(",")]
QUANTS = os.environ.get("LAYER_STEPS_QUANTS", "bf16,fp8,fp8_block").split(",")


def short(name: str) -> str:
    """A kernel's name cut to what tells the steps apart (CUTLASS's template names run to kilobytes)."""
    if "cutlass" in name:
        return "cutlass " + ("fp8 " if "float_e4m3" in name else "") + name[:50] + " .. " + name[-50:]
    return name.replace("(anonymous namespace)::", "").split("(")[0][:90]


def profile(runner: MoERunner, hidden: torch.Tensor, logits: torch.Tensor) -> dict:
    """One call of `runner` warmed up on a side stream (its workspace made before capture), captured in a CUDA
    graph and replayed REPLAYS times under the profiler: kernel times per replay by short() name, and the replay's
    own time from events."""
    out = torch.empty_like(hidden)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            runner(hidden, router_logits=logits, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner(hidden, router_logits=logits, out=out)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return kernel_times(graph, REPLAYS, short)

def bench_layer(quant: str, name: str, seed: int) -> tuple[MoESpec, MoEWeights]:
    """The bench layer `name` in `quant` (bf16, an FP8 mode as `moe-build bench --quant` names it, or a weight-only
    quant) with its random weights on the GPU: the layers the probes here time."""
    if quant == "bf16":
        spec = bench_spec(name)
        return spec, device_weights(spec, seed=seed)
    if quant in MODES:  # fp8, fp8_static, fp8_block
        spec = fp8_bench_spec(name, MODES[quant].quant, MODES[quant].act_scale)
        return spec, device_fp8_weights(spec, seed=seed)
    spec = woq_bench_spec(name, Quant(quant))  # a weight-only quant (w4a16_awq, w8a16, wfp4a16, w4afp8)
    return spec, device_woq_weights(spec, Quant(quant), seed=seed)


def main() -> None:
    results = []
    for name in SHAPES:
        for quant in QUANTS:
            spec, w = bench_layer(quant, name, seed=1)
            runner = MoERunner(spec, w, max_tokens=max(TOKENS))
            for T in TOKENS:
                s = make_inputs(spec, T, 1, seed=T, correction_bias=w.correction_bias)[0]
                r = profile(runner, s.hidden, s.logits)
                r.update(shape=name, quant=quant, tokens=T)
                results.append(r)
                print_kernel_times(f"{name} {quant} T={T}", r)
            del runner, w
            torch.cuda.empty_cache()
    write_results(results, "layer_steps.json")


if __name__ == "__main__":
    main()
