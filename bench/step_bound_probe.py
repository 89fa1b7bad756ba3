"""What a layer step costs where it sits: an FP8 layer's CUDA-graph replay with one step of its plan skipped (its
launch replaced by nothing, so later steps read stale buffers: the output is not checked), beside the plan as it is,
interleaved rounds with L2 flushed before each replay (moe_build.bench.timing). The bound a fusion of that step can
reach: GEMM2's quantize step (fc2_input_quant:separate) was worth 3-10 us at 1-256 tokens, which led to GEMM2
quantizing its own input (docs/performance.md, "GEMM2 quantizing its own input").

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/step_bound_probe.py [out.json (else
    $OUT/step_bound.json)]
    (STEP_BOUND_SHAPES / STEP_BOUND_TOKENS: comma-separated overrides; STEP_BOUND_STEP: the step to skip,
    runner/sequence.py's name; STEP_BOUND_QUANT: fp8 (default), another FP8 mode or a weight-only quant, as
    `moe-build bench --quant` names it)

Skipping `routing` leaves the maps to read the top-k ids and weights in the skipped runner's workspaces, which are
filled (after capture) with the first input set's routing: the GEMMs then see a real routing's rows.
"""
from __future__ import annotations

import os

import torch
from graph_kernel_times import write_results
from layer_steps_probe import bench_layer

from moe_build.bench.layer import rotating_replay
from moe_build.bench.timing import flush_l2, interleaved_median_ms
from moe_build.bench.workload import make_inputs, peer_routing
from moe_build.runner import MoERunner
from moe_build.runner import sequence as S

SHAPES = os.environ.get("STEP_BOUND_SHAPES", "qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-20b,deepseek-v3").split(",")
TOKENS = [int(t) for t in os.environ.get("STEP_BOUND_TOKENS", "1,16,256").split(",")]
STEP = os.environ.get("STEP_BOUND_STEP", S.QUANTIZE_FC2_INPUT)
QUANT = os.environ.get("STEP_BOUND_QUANT", "fp8")
FORCE = {"fc2_input_quant": "separate"} if STEP == S.QUANTIZE_FC2_INPUT else None  # the step in every plan


def replays(runner: MoERunner, spec, tokens: int, sets) -> object:
    """The bench's rotating replay of `runner` (one capture per input set), after a warm-up call on each set."""
    out = torch.empty(tokens, spec.hidden_size, device="cuda", dtype=torch.bfloat16)
    for s in sets:
        runner(s.hidden, router_logits=s.logits, out=out)
    return rotating_replay(runner, sets, out)


def main() -> None:
    results = []
    for seed, name in enumerate(SHAPES):
        spec, w = bench_layer(QUANT, name, seed)
        runners = {k: MoERunner(spec, w, max_tokens=max(TOKENS), force=FORCE) for k in ("plan", "skipped")}
        runners["skipped"]._steps[STEP] = lambda b: None
        for T in TOKENS:
            sets = make_inputs(spec, T, 2, seed=T, correction_bias=w.correction_bias)
            fns = {k: replays(r, spec, T, sets) for k, r in runners.items()}
            if STEP == S.ROUTING:
                weights, ids = peer_routing(spec, sets[0].logits, w.correction_bias)
                for ws in runners["skipped"]._workspaces.values():
                    views = ws.views(T)
                    views["topk_ids"].copy_(ids.to(torch.int32))
                    views["topk_weights"].copy_(weights.float())
            ran = STEP in runners["plan"].kernel_sequence(T, "logits")
            for rnd in range(2):
                ms = interleaved_median_ms(fns, 15, 3, before=lambda _: flush_l2(), seed=rnd + T)
                rec = {"shape": name, "tokens": T, "round": rnd, "quant": QUANT, "step": STEP, "step_in_plan": ran,
                       **{f"{k}_us": 1e3 * v for k, v in ms.items()}}
                results.append(rec)
                print(f"{name:18s} {T:5d} round {rnd}: plan {rec['plan_us']:8.1f}  skipped {rec['skipped_us']:8.1f}  "
                      f"step {rec['plan_us'] - rec['skipped_us']:6.1f} us{'' if ran else '  (not in the plan)'}",
                      flush=True)
    write_results(results, "step_bound.json")


if __name__ == "__main__":
    main()
