"""The routing inside the fused prologue's block (the plan's routing=prologue) against the routing kernel and then
the fused map build (routing=separate), whole layers side by side: bf16, FP8 (rowwise) and W4A16 layers of the
bench shapes at 1 to 256 tokens, CUDA-graph replays in interleaved rounds with L2 flushed before each (as
moe_build.bench.timing does), each runner's output first compared with the other's (the same routing, so the
same rows: they differ only by the order of the fused finalize's atomic adds). The rule's upper end (rules.ROUTING_IN_PROLOGUE_MAX_TOKENS) is lifted to
the fused prologue's 256 here, so that the probe sees where one block routing every token stops paying.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/routing_in_prologue_probe.py [out.json (else
    $OUT/routing_in_prologue.json)]
    (ROUTING_PROBE_POINTS: quant:shape,... ; ROUTING_PROBE_TOKENS: comma-separated token counts)
"""
from __future__ import annotations

import os

import torch
from graph_kernel_times import write_results
from layer_steps_probe import bench_layer

from moe_build.bench.layer import rotating_replay
from moe_build.bench.timing import flush_l2, interleaved_median_ms
from moe_build.bench.workload import make_inputs
from moe_build.planner import rules
from moe_build.runner import MoERunner

POINTS = os.environ.get("ROUTING_PROBE_POINTS", "bf16:qwen3-30b-a3b,bf16:mixtral-8x7b,w4a16_awq:gpt-oss-20b,"
                        "w4a16_awq:deepseek-v2-lite,fp8:qwen3-30b-a3b,fp8:deepseek-v3").split(",")
TOKENS = [int(t) for t in os.environ.get("ROUTING_PROBE_TOKENS", "1,4,16,32,64,96,128,192,256").split(",")]


def main() -> None:
    rules.ROUTING_IN_PROLOGUE_MAX_TOKENS = rules.FUSED_PROLOGUE_MAX_TOKENS  # the probe sees the whole fused band
    results = []
    for seed, point in enumerate(POINTS):
        quant, name = point.split(":")
        spec, w = bench_layer(quant, name, seed)
        runners = {c: MoERunner(spec, w, max_tokens=max(TOKENS), force={"routing": c})
                   for c in ("prologue", "separate")}
        for T in TOKENS:
            sets = make_inputs(spec, T, 2, seed=T, correction_bias=w.correction_bias)
            outs = {}
            for c, r in runners.items():
                outs[c] = torch.full((T, spec.hidden_size), float("nan"), device="cuda", dtype=torch.bfloat16)
                r(sets[0].hidden, router_logits=sets[0].logits, out=outs[c])
            a, b = outs["prologue"].double(), outs["separate"].double()
            diff = float((a - b).norm() / b.norm())
            assert diff < 1e-2, f"{point} {T}: the two routings' outputs differ by {diff:.2e}"
            fns = {}
            for c, r in runners.items():
                out = torch.empty(T, spec.hidden_size, device="cuda", dtype=torch.bfloat16)
                fns[c] = rotating_replay(r, sets, out)
            steps = runners["prologue"].kernel_sequence(T, "logits")
            for rnd in range(2):
                ms = interleaved_median_ms(fns, 20, 3, before=lambda _: flush_l2(), seed=rnd + T)
                rec = {"quant": quant, "shape": name, "tokens": T, "round": rnd, "rel_diff": diff,
                       "prologue_steps": steps[:2], **{f"{c}_us": 1e3 * v for c, v in ms.items()}}
                results.append(rec)
                print(f"{quant:10s} {name:18s} {T:4d} r{rnd}: prologue {rec['prologue_us']:8.1f}  separate "
                      f"{rec['separate_us']:8.1f}  saved {rec['separate_us'] - rec['prologue_us']:5.1f} us  (outputs {diff:.1e} "
                      "apart)", flush=True)
    write_results(results, "routing_in_prologue.json")


if __name__ == "__main__":
    main()
