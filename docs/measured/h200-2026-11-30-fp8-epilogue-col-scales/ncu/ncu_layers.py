"""Qwen3-30B-A3B's FP8 and bf16 layers at 4096 tokens, three eager calls each (ncu profiles the third call's GEMMs)."""
import torch
from moe_build.bench.workload import bench_spec, device_fp8_weights, device_weights, fp8_bench_spec, make_inputs
from moe_build.runner import MoERunner
from moe_build.spec import Quant

for quant in ("fp8", "bf16"):
    spec = bench_spec("qwen3-30b-a3b") if quant == "bf16" else fp8_bench_spec("qwen3-30b-a3b", Quant.FP8)
    w = device_weights(spec, seed=1) if quant == "bf16" else device_fp8_weights(spec, seed=1)
    runner = MoERunner(spec, w, max_tokens=4096)
    s = make_inputs(spec, 4096, 1, seed=7, correction_bias=w.correction_bias)[0]
    for _ in range(3):
        runner(s.hidden, router_logits=s.logits)
    torch.cuda.synchronize()
    print(quant, "plan:", {k: v for k, v in runner.plan_at(4096).items()} if hasattr(runner, "plan_at") else "")
    del runner, w
    torch.cuda.empty_cache()
