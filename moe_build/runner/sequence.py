"""Plan -> the ordered list of steps one runner call launches.

Why a separate pure function: the runner dispatches on exactly this list, so what a plan
means in kernels is decided (and tested, on a CPU) in one place, and the runner itself never
chooses a fusion. Token-dependent choices (routing prologue, finalize) are resolved per call with
`Plan.choices(tokens)` (each stage's `choice_for`), never from the token count the plan was made at.
"""
from __future__ import annotations

from typing import Literal

from ..errors import MoeBuildError
from ..planner import Plan
from ..weights import blocks_fit

RoutingInput = Literal["hidden", "logits", "topk"]

# Step names. "gemm1:*" / "gemm2:*" name which grouped GEMM entry point (and mode) runs.
ROUTER_GEMM = "router_gemm"            # torch matmul: hidden @ router_weight^T (+ bias)
ROUTING = "routing"                    # mb_routing: logits -> topk ids/weights
PROLOGUE_FUSED = "prologue:fused"      # mb_build_maps_fused
PROLOGUE_THREE_STEP = "prologue:three_step"  # mb_build_maps_three_step
# mb_build_maps_three_step that also zeroes the output the fused finalize accumulates into (its zero_out):
# extra blocks beside its latency-bound scan, instead of more writes in the bandwidth-bound expansion.
PROLOGUE_THREE_STEP_ZERO_OUTPUT = "prologue:three_step+zero_output"
THREE_STEP_PROLOGUES = frozenset({PROLOGUE_THREE_STEP, PROLOGUE_THREE_STEP_ZERO_OUTPUT})  # need its workspace
EXPAND_ROWS = "expand_rows"            # mb_expand_rows
# mb_expand_rows that also zeroes the output the fused finalize accumulates into (its zero_out):
# the same expansion, with the zeroing memset folded in instead of a launch of its own.
EXPAND_ROWS_ZERO_OUTPUT = "expand_rows+zero_output"
GEMM1_SM90 = "gemm1:sm90"              # TMA WS grouped GEMM, identity epilogue
GEMM1_SM90_GATED = "gemm1:sm90_gated"  # TMA WS grouped GEMM, gated activation in its epilogue (interleaved W1)
GEMM1_SM80 = "gemm1:sm80"              # Ampere grouped GEMM, identity epilogue
GEMM1_SM80_ACT = "gemm1:sm80_act"      # Ampere grouped GEMM, non-gated activation in the epilogue
GEMM1_SM80_FUSED_GATED = "gemm1:sm80_fused_gated"  # Ampere fused gated-activation GEMM
ACTIVATION = "activation"              # mb_activation (separate FC1 activation)
GEMM2_SM90_FINALIZE = "gemm2:sm90_finalize"  # GEMM2 with unpermute/weighting/reduction in its epilogue
GEMM2_SM90 = "gemm2:sm90"
GEMM2_SM80 = "gemm2:sm80"
FINALIZE = "finalize"                  # mb_finalize (separate top-k weighting and reduction)
SHARED_EXPERTS = "shared_experts"      # torch matmuls + mb_activation, added to the output

_GEMM1 = {
    ("tma_warp_specialized", "separate"): [GEMM1_SM90, ACTIVATION],
    ("tma_warp_specialized", "gated_epilogue"): [GEMM1_SM90_GATED],
    ("ampere", "separate"): [GEMM1_SM80, ACTIVATION],
    ("ampere", "epilogue"): [GEMM1_SM80_ACT],
    ("ampere", "fused_gated"): [GEMM1_SM80_FUSED_GATED],
}
_GEMM2 = {
    ("tma_warp_specialized", "fused"): [GEMM2_SM90_FINALIZE],
    ("tma_warp_specialized", "separate"): [GEMM2_SM90, FINALIZE],
    ("ampere", "separate"): [GEMM2_SM80, FINALIZE],
}


def reads_interleaved_w1(plan: Plan) -> bool:
    """Whether the plan's GEMM1 step is the sm90 gated epilogue, which reads W1 / b1 in
    `weights.interleave_gate_up`'s order: the runner converts to it once, plugin engines hold it."""
    if plan.path != "plugin":
        return False
    c = plan.choices()
    return GEMM1_SM90_GATED in _GEMM1.get((c["gemm_kernel"], c["fc1_activation"]), ())


# Weights go to 64 x 64 blocks when the plan's (largest) token count gives BLOCKED_MIN_AVG_ROWS to
# BLOCKED_MAX_AVG_ROWS average rows per expert: a runner sized for prefill. Blocked against row-major
# weights, whole layers by graph replay (bench/blocked_weights_probe.py and its scratch predecessor, H200,
# 2026-11-22; README, "Weights in 64 x 64 blocks"): the wgmma GEMMs gain at 16-384 rows on all four bench
# shapes (Qwen3-30B-A3B 4096 tokens, 256 rows: 599.7-600.0 vs 611.6-612.8 us; DeepSeek-V2-Lite 384 rows
# 710.8-715.4 vs 722.3-724.9; GPT-OSS-20B 128 rows 487.5-488.0 vs 500.0-501.0; Mixtral-8x7B 256 rows
# 1195.6-1203.6 vs 1233.6-1238.1), and lose past it on the larger experts (GPT-OSS 512 rows 1300.6-1369.4
# vs 1266.2-1272.8, DeepSeek 768 rows 1318.2-1332.2 vs 1307.4-1311.3, Mixtral 1024 rows 4585.8-4840.5 vs
# 4445.1-4494.4), though not on Qwen3 (512 rows 1057.7-1060.4 vs 1069.5-1072.2); why was not found. The
# decode kernel (<= 8 rows per expert) reads blocked weights 2-4% slower (1 and 16 tokens: Mixtral
# 182.9-183.3 vs 177.8-178.1 and 678.9-680.5 vs 666.1-666.7 us, Qwen3 33.2-33.6 vs 32.7-32.8 and
# 200.8-201.4 vs 196.9-197.3), so runners sized for smaller calls keep row-major weights, and a
# prefill-sized runner pays that at its decode-sized calls.
BLOCKED_MIN_AVG_ROWS = 128
BLOCKED_MAX_AVG_ROWS = 384


def can_read_blocked_weights(plan: Plan) -> bool:
    """Whether the plan's GEMMs are the sm90 ones and W1 / W2 tile into 64 x 64 blocks (hidden and
    intermediate sizes multiples of 64): the only GEMMs, and the only sizes, that read that layout."""
    if plan.path != "plugin" or plan.choices()["gemm_kernel"] != "tma_warp_specialized":
        return False
    return blocks_fit(plan.spec["hidden_size"], plan.spec["intermediate_size"])


def reads_blocked_weights(plan: Plan, max_tokens: int | None = None) -> bool:
    """Whether the GEMMs can read blocked weights (can_read_blocked_weights) and the runner's largest call
    (`max_tokens`, default the plan's token count, which is the runner's max_tokens) gives
    BLOCKED_MIN_AVG_ROWS to BLOCKED_MAX_AVG_ROWS rows per expert: those GEMMs then read both in
    `weights.block_64x64`'s layout (the runner converts once, plugin engines hold it)."""
    if not can_read_blocked_weights(plan):
        return False
    spec = plan.spec
    tokens = plan.tokens if max_tokens is None else max_tokens
    avg_rows = -(-tokens * spec["top_k"] // spec["num_experts"])
    return BLOCKED_MIN_AVG_ROWS <= avg_rows <= BLOCKED_MAX_AVG_ROWS


WEIGHT_LAYOUTS = ("auto", "row_major", "blocked64")


def chooses_blocked_weights(plan: Plan, weight_layout: str) -> bool:
    """The runner's W1 / W2 layout: by the rule (reads_blocked_weights) for "auto", else as asked, so that
    the layouts can be compared on one plan (bench/blocked_weights_probe.py). "blocked64" where the GEMMs
    cannot read it is refused, naming the field."""
    if weight_layout not in WEIGHT_LAYOUTS:
        raise MoeBuildError("weight_layout", f"unknown weight layout {weight_layout!r}", WEIGHT_LAYOUTS)
    if weight_layout == "auto":
        return reads_blocked_weights(plan)
    if weight_layout == "blocked64" and not can_read_blocked_weights(plan):
        raise MoeBuildError("weight_layout", "blocked64 needs the sm90 GEMMs (gemm_kernel=tma_warp_specialized) "
                            "and hidden and intermediate sizes that are multiples of 64", ("auto", "row_major"))
    return weight_layout == "blocked64"


def check_runnable(plan: Plan) -> None:
    """Refuse plans this runner has no kernels for, naming the stage (one-line MoeBuildError)."""
    if plan.path != "plugin":
        raise MoeBuildError("path", f"the fused runner executes plugin-path plans, this plan is {plan.path!r}",
                            "plugin (moe_plugin=auto with full TensorRT)")
    spec = plan.spec
    if spec.get("quant", "none") != "none":
        raise MoeBuildError("quant", f"the runner has no quantized kernels yet ({spec['quant']})", "none")
    if spec.get("dtype") == "fp32":
        raise MoeBuildError("dtype", "the runner's grouped GEMMs are fp16/bf16 only (fp32 is not implemented)",
                            ("fp16", "bf16"))
    if spec.get("lora"):
        raise MoeBuildError("lora", "the runner has no LoRA branch", "false")
    if spec.get("experts_per_node") not in (None, spec.get("num_experts")):
        raise MoeBuildError("experts_per_node", "expert-parallel dispatch/combine is not implemented yet",
                            "all experts on one node")
    c = plan.choices()
    if c["expand_rows"] != "plain" or c["fc2_prequant"] != "none":
        raise MoeBuildError("expand_rows/fc2_prequant", "pre-quant scales need quantized kernels",
                            "expand_rows=plain, fc2_prequant=none")
    if (c["gemm_kernel"], c["fc1_activation"]) not in _GEMM1:
        raise MoeBuildError("fc1_activation", f"no kernel for {c['fc1_activation']} on {c['gemm_kernel']}",
                            sorted({f"{g}/{a}" for g, a in _GEMM1}))
    if (c["gemm_kernel"], c["finalize"]) not in _GEMM2:
        raise MoeBuildError("finalize", f"no kernel for finalize={c['finalize']} on {c['gemm_kernel']}",
                            sorted({f"{g}/{f}" for g, f in _GEMM2}))


def kernel_sequence(plan: Plan, tokens: int, routing_input: RoutingInput = "hidden") -> list[str]:
    """The steps one call of `tokens` tokens runs, in launch order.

    `routing_input` says what the caller supplied: hidden states only (the router GEMM runs),
    router logits (routing runs), or precomputed top-k ids/weights (both are skipped).
    """
    check_runnable(plan)
    if routing_input not in ("hidden", "logits", "topk"):
        raise MoeBuildError("routing_input", f"unknown value {routing_input!r}", ("hidden", "logits", "topk"))
    c = plan.choices(tokens)
    steps: list[str] = []
    if routing_input == "hidden":
        steps.append(ROUTER_GEMM)
    if routing_input in ("hidden", "logits"):
        steps.append(ROUTING)
    gemm2 = _GEMM2[(c["gemm_kernel"], c["finalize"])]
    # GEMM2's finalize epilogue adds into `out`, which the three-step map build or else the expansion
    # zeroes beforehand.
    zero = GEMM2_SM90_FINALIZE in gemm2
    if c["routing_prologue"] == "fused":
        steps += [PROLOGUE_FUSED, EXPAND_ROWS_ZERO_OUTPUT if zero else EXPAND_ROWS]
    else:
        steps += [PROLOGUE_THREE_STEP_ZERO_OUTPUT if zero else PROLOGUE_THREE_STEP, EXPAND_ROWS]
    steps += _GEMM1[(c["gemm_kernel"], c["fc1_activation"])]
    steps += gemm2
    if plan.spec.get("shared", {}).get("count", 0):
        steps.append(SHARED_EXPERTS)
    return steps


def steps_up_to(plan: Plan, max_tokens: int) -> set[str]:
    """Every step some call of 1..max_tokens tokens may run (what the workspace must cover).

    Only the routing prologue and finalize depend on tokens, and their fused ranges always start
    at 1, so the two ends of the range cover every choice.
    """
    return set(kernel_sequence(plan, 1)) | set(kernel_sequence(plan, max_tokens))
