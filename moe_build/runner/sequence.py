"""Plan -> the ordered steps one runner call launches, and the GEMM tactics they run with.

Why a separate pure function: the runner dispatches on exactly this list, so what a plan means in
kernels is decided (and tested, on a CPU) in one place, and the runner itself never chooses a fusion.
Token-dependent choices (routing prologue, finalize, the GEMM tactics) are read per call from the plan's
bands (`Plan.choices(tokens)`), never from the token count the plan was made at.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..errors import MoeBuildError
from ..planner import Plan
from ..planner.tactics.tactic import WOQ_WGMMA_TILES
from ..spec import Quant

if TYPE_CHECKING:
    from ..weights import MoEWeights

RoutingInput = Literal["hidden", "logits", "topk"]

# Step names: the planner's stage and choice (the kernel library's entry points carry the same names).
ROUTER_GEMM = "router_gemm"            # torch matmul: hidden @ router_weight^T (+ bias)
ROUTING = "routing"                    # mb_routing: logits -> topk ids/weights
PROLOGUE_FUSED = "routing_prologue:fused"            # mb_routing_prologue_fused
# mb_routing_prologue_fused_routing (the plan's routing=prologue): the routing step inside the fused prologue's launch
PROLOGUE_FUSED_ROUTING = "routing_prologue:fused+routing"
PROLOGUE_THREE_STEP = "routing_prologue:three_step"  # mb_routing_prologue_three_step
# the three-step prologue that also zeroes the output the fused finalize accumulates into (its zero_out):
# extra blocks beside its latency-bound scan, instead of more writes in the bandwidth-bound expansion.
PROLOGUE_THREE_STEP_ZERO_OUTPUT = "routing_prologue:three_step+zero_output"
# mb_routing_prologue_three_step_routing (the plan's routing=prologue): the routing inside the three-step prologue's
# first launch, without and with the zeroing
PROLOGUE_THREE_STEP_ROUTING = "routing_prologue:three_step+routing"
PROLOGUE_THREE_STEP_ROUTING_ZERO_OUTPUT = "routing_prologue:three_step+routing+zero_output"
THREE_STEP_PROLOGUES = frozenset({PROLOGUE_THREE_STEP, PROLOGUE_THREE_STEP_ZERO_OUTPUT, PROLOGUE_THREE_STEP_ROUTING,
                                  PROLOGUE_THREE_STEP_ROUTING_ZERO_OUTPUT})  # need its workspace
EXPAND_ROWS = "expand_rows"            # mb_expand_rows
# the expansion that also zeroes the output the fused finalize accumulates into (its zero_out): the same
# expansion, with the zeroing folded in instead of a launch of its own.
EXPAND_ROWS_ZERO_OUTPUT = "expand_rows+zero_output"
GEMM1_SM90 = "gemm1:sm90"              # sm90 grouped GEMM, plain store
GEMM1_SM90_GATED = "gemm1:sm90_gated"  # sm90 grouped GEMM, gated activation in its epilogue (interleaved W1)
GEMM1_SM80 = "gemm1:sm80"              # sm80 grouped GEMM, plain store
GEMM1_SM80_ACT = "gemm1:sm80_act"      # sm80 grouped GEMM, non-gated activation in the epilogue
GEMM1_SM80_FUSED_GATED = "gemm1:sm80_fused_gated"  # sm80 fused gated-activation GEMM
FC1_ACTIVATION = "fc1_activation"      # mb_fc1_activation (the separate FC1 activation)
GEMM2_SM90_FINALIZE = "gemm2:sm90_finalize"  # GEMM2 with unpermute/weighting/reduction in its epilogue
GEMM2_SM90 = "gemm2:sm90"
GEMM2_SM80 = "gemm2:sm80"
FINALIZE = "finalize"                  # mb_finalize (the separate top-k weighting and reduction)
# FP8 layers (quant fp8 / fp8_block): e4m3 GEMMs, their inputs quantized where the plan says
EXPAND_ROWS_FP8 = "expand_rows:fp8"    # mb_expand_rows_fp8: GEMM1's input quantized as it is expanded
QUANTIZE_INPUT = "fc1_input_quant:separate"  # mb_quantize_fp8 on the tokens, then ...
EXPAND_ROWS_FP8_PREQUANTIZED = "expand_rows:fp8_prequantized"  # ... mb_expand_rows_fp8_prequantized
# the two FP8 expansions that also zero the output GEMM2_FP8_FINALIZE accumulates into (their zero_out)
EXPAND_ROWS_FP8_ZERO_OUTPUT = "expand_rows:fp8+zero_output"
EXPAND_ROWS_FP8_PREQUANTIZED_ZERO_OUTPUT = "expand_rows:fp8_prequantized+zero_output"
GEMM1_FP8 = "gemm1:fp8"                # mb_grouped_gemm_fp8
GEMM1_FP8_GATED = "gemm1:fp8_gated"    # mb_grouped_gemm_fp8_gated: the gated activation in GEMM1's epilogue
# mb_grouped_gemm_fp8_gated with a static scale (fc2_input_quant=gemm1): its epilogue writes GEMM2's FP8 input
GEMM1_FP8_GATED_QUANTIZED = "gemm1:fp8_gated_quantized"
FC1_ACTIVATION_FP8 = "fc1_activation:fp8"  # mb_fc1_activation_fp8: GEMM2's input quantized in the activation
# GEMM2's FP8 input from the 16-bit activation (its kernel's or GEMM1's gated epilogue's): the same bytes as
# mb_quantize_fp8, written by mb_fc1_activation_fp8 with the identity activation
QUANTIZE_FC2_INPUT = "fc2_input_quant:separate"
GEMM2_FP8 = "gemm2:fp8"                # mb_grouped_gemm_fp8
GEMM2_FP8_FINALIZE = "gemm2:fp8_finalize"  # mb_grouped_gemm_fp8_finalize: the finalize in GEMM2's epilogue
# mb_grouped_gemm_fp8_quantizing_finalize (fc2_input_quant=gemm2): that GEMM2 quantizing the 16-bit rows GEMM1's
# gated epilogue wrote as it loads them, no quantize step between the GEMMs
GEMM2_FP8_QUANTIZING_FINALIZE = "gemm2:fp8_quantizing_finalize"
# Weight-only layers (quant w8a16 / w4a16_awq / wfp4a16): 16-bit activations, GEMMs that dequantize their weights
# the tokens' rows times the AWQ FC1 pre-quant scale into prequant_input (expand_rows=plain), before the expansion
# copies them top_k times: the same products as on the expanded rows, in 1 / top_k of the bytes
FC1_PREQUANT = "fc1_prequant:separate"
EXPAND_ROWS_PREQUANT_INPUT = "expand_rows:prequant_input"  # mb_expand_rows from prequant_input instead of hidden
EXPAND_ROWS_PREQUANT_INPUT_ZERO_OUTPUT = "expand_rows:prequant_input+zero_output"
# expand_rows=prequant_fused on 16-bit rows: mb_expand_rows times the AWQ FC1 pre-quant scale, no separate step
EXPAND_ROWS_PREQUANT = "expand_rows:prequant"
EXPAND_ROWS_PREQUANT_ZERO_OUTPUT = "expand_rows:prequant+zero_output"
GEMM1_WOQ = "gemm1:woq"                # mb_grouped_gemm_woq
# mb_fc1_activation with the AWQ FC2 pre-quant scale applied to its output (fc2_prequant=fused)
FC1_ACTIVATION_PREQUANT = "fc1_activation:fc2_prequant"
FC2_PREQUANT = "fc2_prequant:separate"  # GEMM2's input rows times the AWQ FC2 pre-quant scale
GEMM2_WOQ = "gemm2:woq"                # mb_grouped_gemm_woq
GEMM2_WOQ_FINALIZE = "gemm2:woq_finalize"  # mb_grouped_gemm_woq_finalize: the finalize in the decode kernel's epilogue
# a weight-only GEMM whose tactic is a wgmma tile: its experts' weights dequantized into the workspace
# (mb_woq_dequantize), then the 16-bit wgmma GEMM on them (mb_grouped_gemm_sm90, row-major weights)
GEMM1_WOQ_DENSE = "gemm1:woq_dense"
GEMM2_WOQ_DENSE = "gemm2:woq_dense"
GEMM1_WOQ_WGMMA = "gemm1:woq_wgmma"    # mb_grouped_gemm_woq_sm90 (the mixed-input kernel)
# mb_grouped_gemm_woq_sm90_gated: the mixed-input GEMM1 with the gated activation in its epilogue (fc1_activation=
# gated_epilogue, W1 interleaved), with the AWQ FC2 pre-quant scale applied there too (fc2_prequant=fused) or not
GEMM1_WOQ_WGMMA_GATED = "gemm1:woq_wgmma_gated"
GEMM1_WOQ_WGMMA_GATED_PREQUANT = "gemm1:woq_wgmma_gated_fc2_prequant"
# ... W4AFP8 (static input scales): the same epilogue storing GEMM2's input as fc1_activation:fp8_dequantized does
# (the activation, times the AWQ FC2 pre-quant scale where fused, quantized to e4m3 by the static scale, dequantized)
GEMM1_WOQ_WGMMA_GATED_FP8_DEQUANTIZED = "gemm1:woq_wgmma_gated_fp8_dequantized"
GEMM1_WOQ_WGMMA_GATED_PREQUANT_FP8_DEQUANTIZED = "gemm1:woq_wgmma_gated_fc2_prequant_fp8_dequantized"
GEMM1_WOQ_WGMMA_STEPS = frozenset({GEMM1_WOQ_WGMMA, GEMM1_WOQ_WGMMA_GATED, GEMM1_WOQ_WGMMA_GATED_PREQUANT,
                                   GEMM1_WOQ_WGMMA_GATED_FP8_DEQUANTIZED,
                                   GEMM1_WOQ_WGMMA_GATED_PREQUANT_FP8_DEQUANTIZED})
GEMM2_WOQ_WGMMA = "gemm2:woq_wgmma"
# mb_grouped_gemm_woq_sm90_finalize: the mixed-input GEMM2 with the finalize in its epilogue (finalize=fused past the
# decode kernel's band, rules.finalize_fused)
GEMM2_WOQ_WGMMA_FINALIZE = "gemm2:woq_wgmma_finalize"
GEMM2_WOQ_WGMMA_STEPS = frozenset({GEMM2_WOQ_WGMMA, GEMM2_WOQ_WGMMA_FINALIZE})
# a weight-only GEMM whose tactic is the decode kernel's digits tile: mb_grouped_gemm_woq (or its finalize form) on
# its input rows' 8-bit digits in the workspace, which the kernel writing the rows made (token_digits=fused: the
# expansion's and activation's digits forms below) or a digits step after it (separate: mb_token_digits)
GEMM1_WOQ_DIGITS = "gemm1:woq_digits"
GEMM2_WOQ_DIGITS = "gemm2:woq_digits"
GEMM2_WOQ_DIGITS_FINALIZE = "gemm2:woq_digits_finalize"
GEMM2_WOQ_DIGITS_STEPS = frozenset({GEMM2_WOQ_DIGITS, GEMM2_WOQ_DIGITS_FINALIZE})
WOQ_DIGITS_STEPS = frozenset({GEMM1_WOQ_DIGITS}) | GEMM2_WOQ_DIGITS_STEPS  # need token_digits
TOKEN_DIGITS_GEMM1 = "token_digits:gemm1"  # mb_token_digits on the expanded rows (token_digits=separate)
TOKEN_DIGITS_GEMM2 = "token_digits:gemm2"  # mb_token_digits on GEMM2's 16-bit input rows (token_digits=separate)
# token_digits=fused: mb_expand_rows_digits in place of each 16-bit expansion, mb_fc1_activation_digits in place of
# the activation (with GEMM2's AWQ pre-quant scale where fc2_prequant=fused)
EXPAND_ROWS_DIGITS = "expand_rows:digits"
EXPAND_ROWS_DIGITS_ZERO_OUTPUT = "expand_rows:digits+zero_output"
EXPAND_ROWS_PREQUANT_DIGITS = "expand_rows:prequant_digits"
EXPAND_ROWS_PREQUANT_DIGITS_ZERO_OUTPUT = "expand_rows:prequant_digits+zero_output"
EXPAND_ROWS_PREQUANT_INPUT_DIGITS = "expand_rows:prequant_input_digits"
EXPAND_ROWS_PREQUANT_INPUT_DIGITS_ZERO_OUTPUT = "expand_rows:prequant_input_digits+zero_output"
FC1_ACTIVATION_DIGITS = "fc1_activation:digits"
FC1_ACTIVATION_PREQUANT_DIGITS = "fc1_activation:fc2_prequant_digits"
EXPAND_ROWS_16BIT = "expand_rows:16bit"  # mb_expand_rows into a 16-bit buffer (W4AFP8's expand_rows=plain), then ...
EXPAND_ROWS_16BIT_ZERO_OUTPUT = "expand_rows:16bit+zero_output"  # ... also zeroing the output GEMM2's finalize adds into
# W4AFP8 layers (int4 weights, FP8 activations by a static scale or each row's dynamic one, AWQ pre-quant scales where
# stored) run the weight-only steps (16-bit rows, W4A16's GEMMs) on their FP8-quantized rows dequantized to 16 bits,
# which these write where W4A16's expansion and activation write theirs:
# mb_expand_rows_fp8_dequantized (expand_rows=prequant_fused), or a 16-bit expansion then the quantization
# (mb_fc1_activation_fp8_dequantized's identity, plain); mb_fc1_activation_fp8_dequantized (fc2_prequant fused or
# none), or the activation then the quantization in place (separate); their digits forms where the GEMM after them
# reads token digits (token_digits=fused: mb_expand_rows_digits / mb_fc1_activation_digits with the static scale or
# each row's own)
EXPAND_ROWS_FP8_DEQUANTIZED = "expand_rows:fp8_dequantized"
EXPAND_ROWS_FP8_DEQUANTIZED_ZERO_OUTPUT = "expand_rows:fp8_dequantized+zero_output"
EXPAND_ROWS_FP8_DEQUANTIZED_DIGITS = "expand_rows:fp8_dequantized_digits"
EXPAND_ROWS_FP8_DEQUANTIZED_DIGITS_ZERO_OUTPUT = "expand_rows:fp8_dequantized_digits+zero_output"
FC1_PREQUANT_FP8_DEQUANTIZED = "fc1_prequant:fp8_dequantized"
FC1_PREQUANT_FP8_DEQUANTIZED_DIGITS = "fc1_prequant:fp8_dequantized_digits"
FC1_ACTIVATION_FP8_DEQUANTIZED = "fc1_activation:fp8_dequantized"
FC1_ACTIVATION_FP8_DEQUANTIZED_DIGITS = "fc1_activation:fp8_dequantized_digits"
FC2_PREQUANT_FP8_DEQUANTIZED = "fc2_prequant:fp8_dequantized"
SHARED_EXPERTS = "shared_experts"      # torch matmuls + mb_fc1_activation, added to the output
# the steps that run torch operators (not only our entry points): runner.programs runs them on every call
TORCH_STEPS = frozenset({ROUTER_GEMM, SHARED_EXPERTS})

_GEMM1 = {
    ("tma_warp_specialized", "separate"): [GEMM1_SM90, FC1_ACTIVATION],
    ("tma_warp_specialized", "gated_epilogue"): [GEMM1_SM90_GATED],
    ("ampere", "separate"): [GEMM1_SM80, FC1_ACTIVATION],
    ("ampere", "epilogue"): [GEMM1_SM80_ACT],
    ("ampere", "fused_gated"): [GEMM1_SM80_FUSED_GATED],
}
_GEMM2 = {
    ("tma_warp_specialized", "fused"): [GEMM2_SM90_FINALIZE],
    ("tma_warp_specialized", "separate"): [GEMM2_SM90, FINALIZE],
    ("ampere", "separate"): [GEMM2_SM80, FINALIZE],
}


def w1_interleaved(plan: Plan) -> bool:
    """Whether the plan's W1 / b1 come gate/up-interleaved (its w1_order stage)."""
    return plan.stage("w1_order").choice == "gate_up_interleaved"


def weights_blocked(plan: Plan) -> bool:
    """Whether the plan's W1 / W2 are stored in 64 x 64 blocks (its weight_layout stage)."""
    return plan.stage("weight_layout").choice == "blocked64"


def weights_int4_tiled(plan: Plan) -> bool:
    """Whether the plan's weight-only W1 / W2 hold their int4 codes in 16-row tiles (its weight_layout stage)."""
    return plan.stage("weight_layout").choice == "int4_tiles"


def fp8_accumulation(plan: Plan) -> str:
    """How the plan's FP8 GEMMs accumulate (its fp8_accumulation stage: "fast", "promoted", or "none")."""
    return plan.stage("fp8_accumulation").choice


RUNNABLE_QUANT = ("none", "fp8", "fp8_block", "w8a16", "w4a16_awq", "wfp4a16", "w4afp8")


def is_fp8(plan: Plan) -> bool:
    """Whether the plan runs FP8 GEMMs (its activation-quantization stages say where their inputs are made)."""
    return plan.stage("fc1_input_quant").choice != "none"


def is_weight_only(plan: Plan) -> bool:
    """Whether the plan runs the weight-only GEMMs (16-bit activations, quantized weights)."""
    return Quant(plan.spec.get("quant", "none")).is_weight_only


def is_w4afp8(plan: Plan) -> bool:
    """Whether the plan's layer is W4AFP8 (int4 weights, FP8 activations): its expansion and activation write the
    FP8-quantized rows dequantized to 16 bits (or their token digits), which the weight-only (W4A16) GEMMs, their
    decode, digits and mixed-input wgmma tiles, read."""
    return Quant(plan.spec.get("quant", "none")) is Quant.W4AFP8


def check_runnable(plan: Plan) -> None:
    """Refuse plans this runner has no kernels for, naming the stage (one-line MoeBuildError)."""
    if plan.path != "plugin":
        raise MoeBuildError("path", f"the fused runner executes plugin-path plans, this plan is {plan.path!r}",
                            "plugin (moe_plugin=auto with full TensorRT)")
    kernels = plan.path_gate("plugin_kernels_sm")  # the planner's rule (planner/rules.py, plugin_kernels_for_sm)
    if not kernels.held:
        raise MoeBuildError("sm", f"moe-build's CUDA kernels are built for SM 8.x and 9.0; sm{kernels.value} has none "
                            "yet", "SM 80, 86, 89 or 90; for SM 120 / 121 an OOTB engine, --flavour tensorrt-rtx")
    spec = plan.spec
    if spec.get("quant", "none") not in RUNNABLE_QUANT:
        raise MoeBuildError("quant", f"the runner has no {spec['quant']} kernels yet", RUNNABLE_QUANT)
    if spec.get("dtype") == "fp32":
        raise MoeBuildError("dtype", "the runner's grouped GEMMs are fp16/bf16 only (fp32 is not implemented)",
                            ("fp16", "bf16"))
    if spec.get("lora"):
        raise MoeBuildError("lora", "the runner has no LoRA branch", "false")
    if spec.get("ep_size", 1) > 1 and spec.get("ep_rank") is None:
        raise MoeBuildError("ep_rank", f"an expert-parallel layer runs one rank per process; this plan is for the "
                            f"whole group of {spec['ep_size']}", f"a rank's plan (spec.for_rank(r), r in "
                            f"0..{spec['ep_size'] - 1})")
    if spec.get("fp8_input"):
        raise MoeBuildError("fp8_input", "the runner's W4AFP8 layers take 16-bit hidden states and quantize them "
                            "(with the AWQ pre-quant scale) themselves; FP8 hidden states have no kernels", "false")
    c = plan.choices()
    if is_fp8(plan) and c["fc1_activation"] not in ("separate", "gated_epilogue"):
        raise MoeBuildError("fc1_activation", "the FP8 GEMM1 stores plainly or runs the gated epilogue",
                            ("separate", "gated_epilogue"))
    if (is_w4afp8(plan) and c["fc1_activation"] != "separate"
            and (c["fc1_activation"] != "gated_epilogue" or spec.get("act_scale") != "static")):
        raise MoeBuildError("fc1_activation", "W4AFP8's GEMM1s store plainly, or run the mixed-input kernel's gated "
                            "epilogue with a static GEMM2 input scale (a per-row one needs the whole row's amax)",
                            ("separate", "gated_epilogue with act_scale static"))
    if is_weight_only(plan) and c["fc1_activation"] not in ("separate", "gated_epilogue"):
        raise MoeBuildError("fc1_activation", "the weight-only GEMM1s store plainly or run the mixed-input kernel's "
                            "gated epilogue", ("separate", "gated_epilogue"))
    if c["expand_rows"] != "plain" and not (is_w4afp8(plan) or is_weight_only(plan)):
        raise MoeBuildError("expand_rows", "the AWQ pre-quant scale in the expansion belongs to W4AFP8 and W4A16 AWQ",
                            "plain")
    if c["fc2_prequant"] != "none" and not (is_weight_only(plan) or is_w4afp8(plan)):
        raise MoeBuildError("fc2_prequant", "pre-quant scales need quantized kernels", "none")
    if (c["gemm_kernel"], c["fc1_activation"]) not in _GEMM1:
        raise MoeBuildError("fc1_activation", f"no kernel for {c['fc1_activation']} on {c['gemm_kernel']}",
                            sorted({f"{g}/{a}" for g, a in _GEMM1}))
    if (c["gemm_kernel"], c["finalize"]) not in _GEMM2:
        raise MoeBuildError("finalize", f"no kernel for finalize={c['finalize']} on {c['gemm_kernel']}",
                            sorted({f"{g}/{f}" for g, f in _GEMM2}))


def expert_parallel(plan: Plan) -> bool:
    """Whether the plan's tokens travel to other ranks' experts (its dispatch stage)."""
    return plan.stage("dispatch").choice != "none"


def kernel_sequence(plan: Plan, tokens: int, routing_input: RoutingInput = "hidden") -> list[str]:
    """The steps one call of `tokens` tokens runs, in launch order.

    `routing_input` says what the caller supplied: hidden states only (the router GEMM runs),
    router logits (routing runs), or precomputed top-k ids/weights (both are skipped). An expert-parallel
    plan's runner computes this rank's experts over the rows dispatched to it, which arrive routed
    ("topk"); the routing and the shared experts run where the tokens live (runner/expert_parallel.py).
    """
    check_runnable(plan)
    if routing_input not in ("hidden", "logits", "topk"):
        raise MoeBuildError("routing_input", f"unknown value {routing_input!r}", ("hidden", "logits", "topk"))
    if expert_parallel(plan) and routing_input != "topk":
        raise MoeBuildError("routing_input", "an expert-parallel rank's experts take dispatched rows, already "
                            "routed", ("topk",))
    c = plan.choices(tokens)
    if routing_input == "topk":  # no routing to run, in its own kernel or in the prologue
        c["routing"] = "separate"
    steps: list[str] = []
    if routing_input == "hidden":
        steps.append(ROUTER_GEMM)
    if routing_input in ("hidden", "logits") and c["routing"] != "prologue":
        steps.append(ROUTING)
    if is_fp8(plan):
        return steps + _fp8_steps(plan, c)
    if is_weight_only(plan) or is_w4afp8(plan):
        return steps + _weight_only_steps(plan, c)
    gemm2 = _GEMM2[(c["gemm_kernel"], c["finalize"])]
    prologue, zero = _prologue(c)
    steps += [*prologue, EXPAND_ROWS_ZERO_OUTPUT if zero else EXPAND_ROWS]
    steps += _GEMM1[(c["gemm_kernel"], c["fc1_activation"])]
    steps += gemm2
    return steps + _shared_experts(plan)


def _prologue(c: dict[str, str]) -> tuple[list[str], bool]:
    """The routing prologue's step (the fused one routing first where the call's routing is in it) and whether the
    expansion after it zeroes the output: a fused finalize adds into `out`, which the three-step prologue (extra
    blocks beside its scan) or else the expansion zeroes beforehand."""
    fused = c["finalize"] == "fused"
    routes = c["routing"] == "prologue"
    if c["routing_prologue"] == "fused":
        return [PROLOGUE_FUSED_ROUTING if routes else PROLOGUE_FUSED], fused
    if routes:
        return [PROLOGUE_THREE_STEP_ROUTING_ZERO_OUTPUT if fused else PROLOGUE_THREE_STEP_ROUTING], False
    return [PROLOGUE_THREE_STEP_ZERO_OUTPUT if fused else PROLOGUE_THREE_STEP], False


def grouped_sequence(plan: Plan, tokens: int) -> list[str]:
    """The steps of a rank's experts over rows that arrive grouped by expert (the plan's ep_format permuted or
    batched: dispatch_with_permute laid them out and gave the expert offsets): GEMM1 (+ its activation) and
    GEMM2 storing every row's expert output, at the tactics of `tokens`; no prologue, no expansion and no
    finalize (the tokens' ranks weight and sum the rows)."""
    check_runnable(plan)
    fmt = plan.stage("ep_format").choice
    if fmt not in ("permuted", "batched"):
        raise MoeBuildError("ep_format", f"the plan's experts take {fmt} rows, not rows grouped by expert",
                            ("permuted", "batched"))
    c = plan.choices(tokens)
    gemm2 = GEMM2_SM90 if c["gemm_kernel"] == "tma_warp_specialized" else GEMM2_SM80
    return _GEMM1[(c["gemm_kernel"], c["fc1_activation"])] + [gemm2]


def _shared_experts(plan: Plan) -> list[str]:
    """The shared experts, where the tokens are: here, unless the experts' rows were dispatched from elsewhere."""
    return [SHARED_EXPERTS] if plan.spec.get("shared", {}).get("count", 0) and not expert_parallel(plan) else []


def _fp8_steps(plan: Plan, c: dict[str, str]) -> list[str]:
    """An FP8 layer's steps after routing: maps, GEMM1's FP8 input (quantized in the expansion or before it),
    GEMM1 with the gated activation in its epilogue (fc1_activation=gated_epilogue) or GEMM1 and the activation
    kernel, GEMM2's FP8 input (quantized in that kernel or epilogue, or after the activation, or by GEMM2 itself),
    then GEMM2
    with the finalize in its epilogue (into the output the three-step prologue or else the expansion zeroes, as for
    16-bit layers) or GEMM2 and the separate finalize."""
    fused = c["finalize"] == "fused"
    steps, zero = _prologue(c)
    if c["fc1_input_quant"] == "expand_rows":
        steps.append(EXPAND_ROWS_FP8_ZERO_OUTPUT if zero else EXPAND_ROWS_FP8)
    else:
        steps += [QUANTIZE_INPUT, EXPAND_ROWS_FP8_PREQUANTIZED_ZERO_OUTPUT if zero else EXPAND_ROWS_FP8_PREQUANTIZED]
    if c["fc2_input_quant"] == "gemm2":
        if c["fc1_activation"] != "gated_epilogue" or not fused:
            raise MoeBuildError("fc2_input_quant", "GEMM2 quantizes the rows of GEMM1's gated epilogue, with the "
                                "finalize in its epilogue", "separate (or fc1_activation=gated_epilogue and "
                                "finalize=fused)")
        steps += [GEMM1_FP8_GATED, GEMM2_FP8_QUANTIZING_FINALIZE]
        return steps + _shared_experts(plan)
    if c["fc2_input_quant"] == "gemm1":
        if c["fc1_activation"] != "gated_epilogue":
            raise MoeBuildError("fc2_input_quant", "GEMM1's gated epilogue quantizes GEMM2's input",
                                "separate (or fc1_activation=gated_epilogue)")
        steps.append(GEMM1_FP8_GATED_QUANTIZED)
    elif c["fc1_activation"] == "gated_epilogue":
        steps += [GEMM1_FP8_GATED, QUANTIZE_FC2_INPUT]
    elif c["fc2_input_quant"] == "fc1_activation":
        steps += [GEMM1_FP8, FC1_ACTIVATION_FP8]
    else:
        steps += [GEMM1_FP8, FC1_ACTIVATION, QUANTIZE_FC2_INPUT]
    steps += [GEMM2_FP8_FINALIZE] if fused else [GEMM2_FP8, FINALIZE]
    return steps + _shared_experts(plan)


def _weight_only_steps(plan: Plan, c: dict[str, str]) -> list[str]:
    """A weight-only layer's steps after routing: maps, the expansion (where the layer has AWQ scales, of the
    tokens' rows times GEMM1's AWQ pre-quant scale: in the expansion itself where expand_rows=prequant_fused, else
    a scale step on the tokens' rows before it), GEMM1, the activation with GEMM2's AWQ pre-quant scale in it or
    after it, GEMM2 with the finalize in its epilogue (the decode kernel's, into the output the prologue or the
    expansion zeroes) or GEMM2 and the finalize; each GEMM as its tactic says (_woq_gemm_step). A GEMM on the digits
    tile reads token digits, which the expansion or the activation before it writes in place of its 16-bit rows
    (token_digits=fused) or a digits step after it makes from them (separate). W4AFP8: the
    same steps on its FP8-quantized rows dequantized to 16 bits (_fp8_dequantized_gemm1_input / _gemm2_input)."""
    steps, zero = _prologue(c)
    digits1, digits2 = _on_digits(c["gemm1_tactic"]), _on_digits(c["gemm2_tactic"])
    fused = c["token_digits"] == "fused"
    fp8 = is_w4afp8(plan)
    if fp8:
        steps += _fp8_dequantized_gemm1_input(c, zero, fused and digits1)
    else:
        if c["expand_rows"] == "prequant_fused":
            expand = EXPAND_ROWS_PREQUANT_ZERO_OUTPUT if zero else EXPAND_ROWS_PREQUANT
        elif c["fc2_prequant"] != "none":  # the plan's use_awq gate: the layer carries both AWQ scales
            steps.append(FC1_PREQUANT)
            expand = EXPAND_ROWS_PREQUANT_INPUT_ZERO_OUTPUT if zero else EXPAND_ROWS_PREQUANT_INPUT
        else:
            expand = EXPAND_ROWS_ZERO_OUTPUT if zero else EXPAND_ROWS
        steps.append(_DIGITS_EXPANSION[expand] if fused and digits1 else expand)
    if digits1 and not fused:
        steps.append(TOKEN_DIGITS_GEMM1)
    gemm1 = _woq_gemm_step(c["gemm1_tactic"], GEMM1_WOQ, GEMM1_WOQ_WGMMA, GEMM1_WOQ_DENSE, GEMM1_WOQ_DIGITS)
    if c["fc1_activation"] == "gated_epilogue":  # the mixed-input GEMM1's band (rules.gated_epilogue_woq_mixed)
        if gemm1 != GEMM1_WOQ_WGMMA:
            raise MoeBuildError("gemm1_tactic", f"the weight-only gated epilogue is the mixed-input kernel's, not "
                                f"{c['gemm1_tactic']}'s", "a woq128x* wgmma tile (or fc1_activation=separate)")
        steps += _woq_gated_gemm1_steps(c, fp8)
        steps += [TOKEN_DIGITS_GEMM2] if digits2 else []
        return steps + _woq_gemm2_steps(c, digits2) + _shared_experts(plan)
    steps.append(gemm1)
    in_activation = fused and digits2  # the plan's digits_fc2_prequant gate: fc2_prequant is not separate
    if fp8:
        steps += _fp8_dequantized_gemm2_input(c, in_activation)
    else:
        steps += {"fused": [FC1_ACTIVATION_PREQUANT_DIGITS if in_activation else FC1_ACTIVATION_PREQUANT],
                  "separate": [FC1_ACTIVATION, FC2_PREQUANT],
                  "none": [FC1_ACTIVATION_DIGITS if in_activation else FC1_ACTIVATION]}[c["fc2_prequant"]]
    if digits2 and not fused:
        steps.append(TOKEN_DIGITS_GEMM2)
    return steps + _woq_gemm2_steps(c, digits2) + _shared_experts(plan)


def _woq_gated_gemm1_steps(c: dict[str, str], fp8: bool) -> list[str]:
    """The mixed-input GEMM1 with the gated epilogue, the AWQ FC2 pre-quant scale in it (fc2_prequant=fused) or a scale
    step after it (separate); W4AFP8 (fp8: static input scales, rules.gated_epilogue_gemm) storing GEMM2's input as its
    activation step would (the e4m3 quantization dequantized), or, with the scale step forced out, the plain epilogue
    and the step that scales and quantizes after it."""
    fused = c["fc2_prequant"] == "fused"
    if fp8 and c["fc2_prequant"] == "separate":
        return [GEMM1_WOQ_WGMMA_GATED, FC2_PREQUANT_FP8_DEQUANTIZED]
    if fp8:
        return [GEMM1_WOQ_WGMMA_GATED_PREQUANT_FP8_DEQUANTIZED if fused else GEMM1_WOQ_WGMMA_GATED_FP8_DEQUANTIZED]
    return [GEMM1_WOQ_WGMMA_GATED_PREQUANT if fused else GEMM1_WOQ_WGMMA_GATED] + (
        [FC2_PREQUANT] if c["fc2_prequant"] == "separate" else [])


def _woq_gemm2_steps(c: dict[str, str], digits: bool) -> list[str]:
    """A weight-only layer's GEMM2 with the finalize in its epilogue (the decode kernel's, on token digits where
    `digits`, or the mixed-input wgmma kernel's where its tactic is a woq tile), or GEMM2 as its tactic says and the
    finalize."""
    if c["finalize"] == "fused":
        step = _woq_gemm_step(c["gemm2_tactic"], GEMM2_WOQ_FINALIZE, GEMM2_WOQ_WGMMA_FINALIZE, GEMM2_WOQ_DENSE,
                              GEMM2_WOQ_DIGITS_FINALIZE)
        if step == GEMM2_WOQ_DENSE:
            raise MoeBuildError("gemm2_tactic", f"the weight-only finalize epilogue is the decode and mixed-input "
                                f"kernels', not {c['gemm2_tactic']}'s", "a decode or woq128x* wgmma tactic (or "
                                "finalize=separate)")
        return [step]
    return [_woq_gemm_step(c["gemm2_tactic"], GEMM2_WOQ, GEMM2_WOQ_WGMMA, GEMM2_WOQ_DENSE, GEMM2_WOQ_DIGITS), FINALIZE]


# each 16-bit expansion's digits form (token_digits=fused, GEMM1 on the digits tile)
_DIGITS_EXPANSION = {
    EXPAND_ROWS: EXPAND_ROWS_DIGITS, EXPAND_ROWS_ZERO_OUTPUT: EXPAND_ROWS_DIGITS_ZERO_OUTPUT,
    EXPAND_ROWS_PREQUANT: EXPAND_ROWS_PREQUANT_DIGITS,
    EXPAND_ROWS_PREQUANT_ZERO_OUTPUT: EXPAND_ROWS_PREQUANT_DIGITS_ZERO_OUTPUT,
    EXPAND_ROWS_PREQUANT_INPUT: EXPAND_ROWS_PREQUANT_INPUT_DIGITS,
    EXPAND_ROWS_PREQUANT_INPUT_ZERO_OUTPUT: EXPAND_ROWS_PREQUANT_INPUT_DIGITS_ZERO_OUTPUT,
}


def _on_digits(tactic: str) -> bool:
    """Whether a GEMM's tactic (its name, tactics.GemmTactic.name) is the decode kernel's digits tile (its input rows
    as token digits)."""
    return tactic.startswith("decode:digits_")


def _woq_gemm_step(tactic: str, stored: str, mixed: str, dense: str, digits: str) -> str:
    """A weight-only GEMM's step by its tactic (planner/tactics/woq.py): the decode or mma kernel on the weights as
    stored (the decode kernel's digits tile on the rows' token digits), the mixed-input wgmma kernel (a woq tile), or
    the 16-bit wgmma GEMM on the weights dequantized (another wgmma tile)."""
    if _on_digits(tactic):
        return digits
    if not tactic.startswith("wgmma:"):
        return stored
    return mixed if tactic.split(":")[1] in WOQ_WGMMA_TILES else dense


def _fp8_dequantized_gemm1_input(c: dict[str, str], zero: bool, digits: bool) -> list[str]:
    """W4AFP8's GEMM1 input rows in 16 bits or as token digits (digits: token_digits=fused on the
    digits tile): the expansion quantizing as it copies (expand_rows=prequant_fused), or the plain 16-bit expansion
    and the quantization after it."""
    if c["expand_rows"] == "prequant_fused":
        return [{(False, False): EXPAND_ROWS_FP8_DEQUANTIZED, (False, True): EXPAND_ROWS_FP8_DEQUANTIZED_ZERO_OUTPUT,
                 (True, False): EXPAND_ROWS_FP8_DEQUANTIZED_DIGITS,
                 (True, True): EXPAND_ROWS_FP8_DEQUANTIZED_DIGITS_ZERO_OUTPUT}[(digits, zero)]]
    return [EXPAND_ROWS_16BIT_ZERO_OUTPUT if zero else EXPAND_ROWS_16BIT,
            FC1_PREQUANT_FP8_DEQUANTIZED_DIGITS if digits else FC1_PREQUANT_FP8_DEQUANTIZED]


def _fp8_dequantized_gemm2_input(c: dict[str, str], digits: bool) -> list[str]:
    """W4AFP8's GEMM2 input rows (digits: as token digits, token_digits=fused on the digits tile): the
    activation quantizing as it writes (fc2_prequant fused, or none where the layer has no AWQ scales), or the
    activation and the quantization after it (separate, forced: the plan's digits_fc2_prequant gate then has digits
    steps make the token digits)."""
    if c["fc2_prequant"] == "separate":
        return [FC1_ACTIVATION, FC2_PREQUANT_FP8_DEQUANTIZED]
    return [FC1_ACTIVATION_FP8_DEQUANTIZED_DIGITS if digits else FC1_ACTIVATION_FP8_DEQUANTIZED]


def steps_up_to(plan: Plan, max_tokens: int) -> set[str]:
    """Every step some call of 1..max_tokens tokens may run (what the workspace must cover): the steps at
    the first token count of every band of the token-dependent stages that starts within the range."""
    counts = {max_tokens, *plan.band_edges(max_tokens, starts_only=True)}
    routing_input: RoutingInput = "topk" if expert_parallel(plan) else "hidden"
    return set().union(*(kernel_sequence(plan, t, routing_input) for t in counts))


def plan_weights(plan: Plan, weights: MoEWeights) -> MoEWeights:
    """The canonical `weights` in the order `plan` runs them: W1 / b1 in its w1_order (gate/up-interleaved for
    the sm90 gated epilogue), then W1 / W2 in its weight_layout (64 x 64 blocks, int4 codes in 16-row tiles, or
    row-major). `weights` itself where the plan keeps both as they are."""
    if weights.fp8 is not None:
        weights = weights.fp8_channel_scales()  # the FP8 GEMM's rowwise mode reads one scale per column
    if w1_interleaved(plan):
        weights = weights.gate_up_interleaved()  # W1's column scales too, once per column
    if weights_int4_tiled(plan):
        return weights.int4_tiled()
    return weights.blocked_64x64() if weights_blocked(plan) else weights
