"""Every gate of the fusion matrix as one small named rule.

Each rule reads the spec/target (and the token count where the seed's condition does) and
returns a `Gate`. The comment above each rule quotes the condition it implements; the gate's
`source` is the seed's `file:line` reference (or `moe-build` for rules of our own).
"""
from __future__ import annotations

import math
from typing import Sequence

from ..spec import ActScale, Activation, DType, MoESpec, OutputDType, Quant
from ..target import Flavour, Target
from ..weights.blocks import blocks_fit
from ..weights.halves import halves_fit
from .gates import (BUILDER_PY, ENV_UTILS_CPP, RTX_FACTS, GEMM_DISPATCH_H, MOE_KERNELS_CU, MOE_KERNELS_H,
                    MOE_PLUGIN_CPP, MOE_PY, OURS, PLUGIN_PY, Gate)
from .tactics import GemmTactic, RowCount
from .tactics.dense import FINALIZE_DECODE_MAX_AVG_ROWS
from .tactics.fp8 import FP8_BLOCK_DECODE_ROWS
from .tactics.woq import ROW_SCALE_DIGITS_MAX_COLS, WOQ_DECODE_MAX_AVG_ROWS, on_mixed_input_tile

FUSED_PROLOGUE_MAX_TOKENS = 256
FUSED_PROLOGUE_TOPK = (1, 2, 4, 6, 8)
FUSED_PROLOGUE_MAX_EXPERT_LOG = 9
FUSED_PROLOGUE_BLOCK_THREADS = 256
TMA_WS_SMS = "sm == 90 or 100 <= sm < 120 or sm in (120, 121)"
OOTB_DENSE_MAX_EXPERTS_PER_TOPK = 4


def _src(path: str, *lines: int) -> str:
    return ", ".join(f"{path}:{n}" for n in lines)


# ---- path: plugin vs OOTB ---------------------------------------------------------------------

# use_ootb_moe = (build_config.plugin_config.moe_plugin is None); "disable" maps to None
def moe_plugin_enabled(t: Target) -> Gate:
    return Gate("moe_plugin", t.moe_plugin.value, "moe_plugin != disable", t.moe_plugin.value != "disable",
                f"{_src(BUILDER_PY, 788)}, {_src(PLUGIN_PY, 184, 323)}")


# TensorRT-RTX has no add_plugin_v3: plugin layers need full TensorRT
def flavour_supports_plugins(t: Target) -> Gate:
    return Gate("flavour_plugin_layers", t.flavour.value, "flavour == tensorrt (TensorRT-RTX has no plugin layers)",
                t.flavour.supports_plugins, RTX_FACTS)


# MoeOOTB does not support weight-only quant
def ootb_not_weight_only(s: MoESpec) -> Gate:
    return Gate("ootb_weight_only_quant", s.quant.value, "quant not in (w8a16, w4a16_awq, wfp4a16)",
                not s.quant.is_weight_only, _src(MOE_PY, 1229))


# MoeOOTB does not support SM >= 100 (TensorRT-LLM's layers; TensorRT-RTX builds our ONNX graph for SM 120/121)
def ootb_sm_below_100(t: Target) -> Gate:
    rtx = t.flavour is Flavour.TENSORRT_RTX
    return Gate("ootb_sm", t.sm, "sm < 100 or flavour == tensorrt-rtx", t.sm < 100 or rtx,
                f"{_src(MOE_PY, 1234)}, {RTX_FACTS}")


# our OOTB graph implements unquantized and FP8 (fp8, fp8_block) layers (other quantized OOTB graphs are not built yet)
def ootb_quant_implemented(s: MoESpec) -> Gate:
    return Gate("ootb_quant_implemented", s.quant.value, "quant in (none, fp8, fp8_block)",
                s.quant in (Quant.NONE, Quant.FP8, Quant.FP8_BLOCK), OURS)


# FP8 requires SM >= 89
def ootb_fp8_sm(s: MoESpec, t: Target) -> Gate:
    uses = s.quant in (Quant.FP8, Quant.FP8_BLOCK)
    return Gate("ootb_fp8_sm", f"quant={s.quant.value} sm={t.sm}", "not fp8 or sm >= 89", (not uses) or t.sm >= 89,
                f"{_src(MOE_PLUGIN_CPP, 260)}, {RTX_FACTS}")


# our OOTB graph has no LoRA branch
def ootb_no_lora(s: MoESpec) -> Gate:
    return Gate("ootb_lora", s.lora, "not lora", not s.lora, OURS)


# TensorRT-RTX ComputeCapability offers SM75, SM80, SM86, SM89, SM120, SM121 only (of which moe-build targets
# all but SM75)
def flavour_targets_sm(t: Target) -> Gate:
    from ..target import RTX_TARGET_SMS
    if t.flavour.value == "tensorrt-rtx":
        return Gate("flavour_sm", t.sm, f"sm in {RTX_TARGET_SMS}", t.sm in RTX_TARGET_SMS, RTX_FACTS)
    return Gate("flavour_sm", t.sm, "any supported sm (full TensorRT)", True, RTX_FACTS)


# moe-build's kernel library holds sm_80 code, which every SM 8.x runs, and sm_90a code (moe_build/kernels/build.py)
def plugin_kernels_for_sm(t: Target) -> Gate:
    return Gate("plugin_kernels_sm", t.sm, "80 <= sm < 100 (sm_80 and sm_90a code)",
                80 <= t.sm < 100, "moe_build/kernels/build.py")


# ---- plugin dtype / architecture constraints --------------------------------------------------

def _plugin_input_kind(s: MoESpec) -> str:
    if s.quant.has_fp4_activations:
        return "fp4"
    if s.quant in (Quant.FP8, Quant.FP8_BLOCK) or (s.quant is Quant.W4AFP8 and s.fp8_input):
        return "fp8"
    return s.dtype.value


# output_type != input_type only allowed when the input is FP8/FP4
def plugin_output_dtype_matches(s: MoESpec) -> Gate:
    kind = _plugin_input_kind(s)
    ok = kind in ("fp8", "fp4") or s.out_dtype.value == kind
    return Gate("plugin_output_dtype", f"in={kind} out={s.out_dtype.value}",
                "output dtype == input dtype unless input is fp8/fp4", ok, _src(MOE_PLUGIN_CPP, 258))


# FP8 requires SM >= 89
def plugin_fp8_sm(s: MoESpec, t: Target) -> Gate:
    uses = s.quant.has_fp8_activations or s.quant is Quant.FP8_BLOCK
    return Gate("plugin_fp8_sm", f"quant={s.quant.value} sm={t.sm}", "not fp8 or sm >= 89",
                (not uses) or t.sm >= 89, _src(MOE_PLUGIN_CPP, 260))


# FP4 requires SM >= 100
def plugin_fp4_sm(s: MoESpec, t: Target) -> Gate:
    uses = s.quant.has_fp4_activations
    return Gate("plugin_fp4_sm", f"quant={s.quant.value} sm={t.sm}", "not fp4 or sm >= 100",
                (not uses) or t.sm >= 100, _src(MOE_PLUGIN_CPP, 262))


# switch_output_type throws for output_type == kFP8 / kFP4 (no FP8 reduction)
def plugin_output_not_fp8_fp4(s: MoESpec) -> Gate:
    return Gate("plugin_output_fp8_fp4", s.out_dtype.value, "output dtype not in (fp8, fp4)",
                s.out_dtype not in (OutputDType.FP8, OutputDType.FP4), _src(MOE_PLUGIN_CPP, 227, 230))


# ---- 3.1 routing prologue ---------------------------------------------------------------------

def fused_prologue_smem_bytes(tokens: int, top_k: int, local_experts: int) -> int:
    """Shared memory the gate charges a single-block map builder: (key, value) pairs twice (a radix
    sort's ping-pong) for every expanded row, plus the per-expert histogram/offsets. An upper bound
    for our counting sort (cpp/src/stages/routing_prologue_fused.cu: 32 KB static at any size it accepts)."""
    return 2 * tokens * top_k * 8 + (local_experts + 1) * 4


# runner tries the fused prologue only when !use_wfp4a16
def prologue_not_wfp4a16(s: MoESpec) -> Gate:
    return Gate("prologue_not_wfp4a16", s.quant.value, "quant != wfp4a16", s.quant is not Quant.WFP4A16,
                _src(MOE_KERNELS_CU, 3785))


# fusedBuildExpertMapsSortFirstToken returns false unless num_tokens <= 256
def prologue_tokens(tokens: int) -> Gate:
    return Gate("prologue_tokens", tokens, f"num_tokens <= {FUSED_PROLOGUE_MAX_TOKENS}",
                tokens <= FUSED_PROLOGUE_MAX_TOKENS, _src(MOE_KERNELS_CU, 477), token_dependent=True)


# experts_per_token in {1, 2, 4, 6, 8}
def prologue_topk(s: MoESpec) -> Gate:
    return Gate("prologue_top_k", s.top_k, f"top_k in {FUSED_PROLOGUE_TOPK}", s.top_k in FUSED_PROLOGUE_TOPK,
                _src(MOE_KERNELS_CU, 510, 539))


# expert_log = floor(log2(num_experts_per_node + 1)) + 1 <= 9
def prologue_expert_log(s: MoESpec) -> Gate:
    expert_log = math.floor(math.log2(s.local_experts + 1)) + 1
    return Gate("prologue_expert_log", expert_log, "floor(log2(experts_per_node + 1)) + 1 <= 9",
                expert_log <= FUSED_PROLOGUE_MAX_EXPERT_LOG, _src(MOE_KERNELS_CU, 555, 568))


# single-block requirement: blocks == 1
def prologue_single_block(tokens: int) -> Gate:
    blocks = -(-tokens // FUSED_PROLOGUE_BLOCK_THREADS)
    return Gate("prologue_blocks", blocks, f"ceil(num_tokens / {FUSED_PROLOGUE_BLOCK_THREADS}) == 1",
                blocks == 1, _src(MOE_KERNELS_CU, 432), token_dependent=True)


# dynamic shared memory must be below the device limit
def prologue_smem(s: MoESpec, t: Target, tokens: int) -> Gate:
    need = fused_prologue_smem_bytes(tokens, s.top_k, s.local_experts)
    return Gate("prologue_smem", need, f"smem bytes < {t.max_smem_per_block} (sm{t.sm} per-block limit)",
                need < t.max_smem_per_block, _src(MOE_KERNELS_CU, 453, 454), token_dependent=True)


# The routing inside the prologue's first launch, one block (moe-build's): one launch and one wait on the chain fewer.
# Measured in the fused prologue (H200, six layers, docs/performance.md "The routing inside the fused prologue"): up
# to 1.4 us a layer less at 1 token and 1.9 at 2-4 (FP8 DeepSeek-V3 0.1-0.7 behind at 4), level at 5-16 and slower
# from 32 (one block routes what the routing kernel's grid spreads), so up to 4 tokens; the three-step prologue's
# first launch routes in the same block form (cpp/src/stages/routing_prologue_three_step.cu, whose one block counts
# up to 1024 rows: 4 tokens of spec.layer.MAX_SIZES' largest top-k, 64, are 256).
ROUTING_IN_PROLOGUE_MAX_TOKENS = 4


# num_tokens <= ROUTING_IN_PROLOGUE_MAX_TOKENS: one block routes every token
def routing_in_prologue_tokens(tokens: int) -> Gate:
    return Gate("routing_in_prologue_tokens", tokens, f"num_tokens <= {ROUTING_IN_PROLOGUE_MAX_TOKENS}",
                tokens <= ROUTING_IN_PROLOGUE_MAX_TOKENS, f"{OURS} (cost rule, measured)", token_dependent=True)


# ep_size == 1: an expert-parallel layer routes where its tokens live and its dispatch lays the rows out
def routing_local(s: MoESpec) -> Gate:
    return Gate("routing_local", s.ep_size, "ep_size == 1", s.ep_size == 1, f"{OURS} (runner/expert_parallel.py)")


# ---- 3.2 expand rows --------------------------------------------------------------------------

# prequant_scales passed to expandInput only when (use_w4afp8 && !use_fp8_input)
def expand_w4afp8_without_fp8_input(s: MoESpec) -> Gate:
    return Gate("expand_w4afp8_not_fp8_input", f"quant={s.quant.value} fp8_input={s.fp8_input}",
                "quant == w4afp8 and not fp8_input", s.quant is Quant.W4AFP8 and not s.fp8_input,
                _src(MOE_KERNELS_CU, 3828))


# PRE_QUANT_AWQ is mutually exclusive with block scaling (static_assert)
def expand_prequant_not_block_scaled(s: MoESpec) -> Gate:
    return Gate("expand_prequant_not_block_scaled", s.quant.value, "quant not block-scaled",
                not s.quant.is_block_scaled, _src(MOE_KERNELS_CU, 1391))


# quant == w4a16_awq with its pre-quant scales stored: the 16-bit expansion multiplies the rows it copies by the FC1
# scale, one fp32 product rounded once as the separate step rounds it (ours; the seed fuses it for W4AFP8 only)
def expand_awq_scale_16bit(s: MoESpec) -> Gate:
    return Gate("expand_awq_scale_16bit", f"quant={s.quant.value} prequant_scales={s.quant_prequant_scales}",
                "quant == w4a16_awq and its pre-quant scales stored", s.quant is Quant.W4A16_AWQ
                and s.quant_prequant_scales, f"{OURS} (cpp/src/stages/expand_rows.cu)")


# use_per_expert_act_scale is enabled only for NVFP4 x NVFP4
def expand_per_expert_act_scale(s: MoESpec) -> Gate:
    return Gate("expand_per_expert_act_scale", s.quant.value, "quant == nvfp4 (per-expert act scale applies)",
                s.quant is Quant.NVFP4, _src(MOE_KERNELS_CU, 3820, 3826))


# ---- GEMM kernel family (TMA warp-specialized vs Ampere) ---------------------------------------

# supportsTmaWarpSpecialized(sm): sm == 90, 100 <= sm < 120, sm == 120 || 121
def tma_ws_sm(t: Target) -> Gate:
    ok = t.sm == 90 or 100 <= t.sm < 120 or t.sm in (120, 121)
    return Gate("tma_ws_sm", t.sm, TMA_WS_SMS, ok, _src(GEMM_DISPATCH_H, 635))


# ... and isValid*Specialisation: our TMA WS grouped GEMM is built for 16-bit (and narrower) types
def tma_ws_specialisation(s: MoESpec) -> Gate:
    return Gate("tma_ws_specialisation", s.dtype.value, "dtype != fp32", s.dtype is not DType.FP32,
                _src(GEMM_DISPATCH_H, 635))


# ---- 3.3 FC1 activation -----------------------------------------------------------------------

# non-gated activations run in moeGemmBiasAct's epilogue (non-gated branch)
def fc1_non_gated(s: MoESpec) -> Gate:
    return Gate("fc1_non_gated", s.activation.value, "activation not gated", not s.activation.is_gated,
                _src(MOE_KERNELS_CU, 3186, 3208) + ", " + _src(GEMM_DISPATCH_H, 965))


# TMA WS dispatch throws "Unimplemented fusion" for ACTIVATION / GATED_ACTIVATION
def fc1_not_tma_ws(gemm_kernel: str) -> Gate:
    return Gate("fc1_not_tma_ws", gemm_kernel, "gemm kernel is not TMA warp-specialized",
                gemm_kernel != "tma_warp_specialized",
                _src(GEMM_DISPATCH_H, 774, 665) + ", " + _src(MOE_KERNELS_CU, 3101, 3152))


# isFusedGatedActivation: activation in {Swiglu, Geglu}
def fused_gated_activation_kind(s: MoESpec) -> Gate:
    return Gate("fused_gated_activation", s.activation.value, "activation in (swiglu, geglu)",
                s.activation in (Activation.SWIGLU, Activation.GEGLU), _src(GEMM_DISPATCH_H, 656))


# T == WeightType (activation dtype equals weight dtype: no weight quantization)
def fused_gated_same_types(s: MoESpec) -> Gate:
    return Gate("fused_gated_t_eq_weight", s.quant.value, "activation dtype == weight dtype (quant == none)",
                s.quant is Quant.NONE, _src(GEMM_DISPATCH_H, 656))


# T != float
def fused_gated_not_fp32(s: MoESpec) -> Gate:
    return Gate("fused_gated_not_fp32", s.dtype.value, "dtype != fp32", s.dtype is not DType.FP32,
                _src(GEMM_DISPATCH_H, 656))


# !use_fp8
def fused_gated_not_fp8(s: MoESpec) -> Gate:
    uses = s.quant in (Quant.FP8, Quant.FP8_BLOCK, Quant.W4AFP8)
    return Gate("fused_gated_not_fp8", s.quant.value, "not fp8", not uses, _src(GEMM_DISPATCH_H, 656))


# SM >= 80
def fused_gated_sm(t: Target) -> Gate:
    return Gate("fused_gated_sm", t.sm, "sm >= 80", t.sm >= 80, _src(GEMM_DISPATCH_H, 656))


# gemm_k % 64 == 0 && gemm_n % 64 == 0 (K = hidden, N = intermediate)
def fused_gated_alignment(s: MoESpec) -> Gate:
    k, n = s.hidden_size, s.intermediate_size
    return Gate("fused_gated_k_n_mod_64", f"k={k} n={n}", "gemm_k % 64 == 0 and gemm_n % 64 == 0",
                k % 64 == 0 and n % 64 == 0, _src(GEMM_DISPATCH_H, 656))


# fused kernel: A/B both 2-byte, epilogue Silu or FtGelu
def fused_gated_two_byte(s: MoESpec) -> Gate:
    ok = s.dtype.itemsize == 2 and s.quant is Quant.NONE
    return Gate("fused_gated_two_byte", f"{s.dtype.value}/{s.quant.value}", "A and B are 2-byte types",
                ok, _src(GEMM_DISPATCH_H, 202))


# ---- moe-build's own FC1 fusion on SM90: the gated activation in the TMA WS GEMM1's epilogue ------
# TensorRT-LLM's TMA WS GEMM has none (fc1_not_tma_ws above). Ours reads W1 with its gate and up rows
# interleaved in blocks of 8, so each wgmma thread holds both halves of the features it writes.

# gemm kernel is TMA warp-specialized (the epilogue belongs to that GEMM)
def gated_epilogue_tma_ws(gemm_kernel: str) -> Gate:
    return Gate("gated_epilogue_tma_ws", gemm_kernel, "gemm kernel is TMA warp-specialized",
                gemm_kernel == "tma_warp_specialized", OURS)


# sm == 90: the gated wgmma epilogue is compiled for sm_90a only
def gated_epilogue_sm(t: Target) -> Gate:
    return Gate("gated_epilogue_sm", t.sm, "sm == 90", t.sm == 90, OURS)


# a GEMM1 kernel with the epilogue exists: fp16/bf16 layers, unquantized or FP8 (the 16-bit and the FP8 wgmma GEMMs
# have it, and the FP8 decode kernel with block-128 scales too, below), or int4 / int8 weight-only with 16-bit
# activations (the mixed-input wgmma kernel, below), MXFP4 with bf16 ones (the same kernel on its e5m2 form), and
# W4AFP8 with a static GEMM2 input scale (the same kernel storing each value as its e4m3 quantization dequantized, as
# W4AFP8's activation step does: a per-row scale needs the whole row's amax, which no tile holds): dtype in (fp16,
# bf16), quant in (none, fp8, fp8_block, w4a16_awq, w8a16), or quant == wfp4a16 and dtype == bf16, or quant == w4afp8
# and act_scale == static. FP8: GEMM1 writes act(gate,
# up) at half width, which GEMM2 or a quantize kernel reads, instead of GEMM1's whole 16-bit output read by the
# activation kernel (docs/performance.md, "The gated epilogue on the FP8 GEMM1"). W4AFP8, H200, two rounds, graph
# replay, against the activation kernel: 0.1-3.4% less a layer at 256-4096 tokens on Qwen3-30B-A3B, DeepSeek-V2-Lite and
# GPT-OSS-20B, Mixtral-8x7B level (4096 tokens 0.2-0.8% slower, 1024 0.6-1.0% faster; docs/performance.md, "W4AFP8's
# activation and GEMM2 quantization in the mixed-input GEMM1's epilogue")
GATED_EPILOGUE_QUANTS = (Quant.NONE, Quant.FP8, Quant.FP8_BLOCK, Quant.W4A16_AWQ, Quant.W8A16)


def gated_epilogue_gemm(s: MoESpec) -> Gate:
    static_w4afp8 = s.quant is Quant.W4AFP8 and s.act_scale is ActScale.STATIC
    bf16_mxfp4 = s.quant is Quant.WFP4A16 and s.dtype.value == "bf16"
    ok = s.dtype.itemsize == 2 and (s.quant in GATED_EPILOGUE_QUANTS or static_w4afp8 or bf16_mxfp4)
    return Gate("gated_epilogue_gemm", f"{s.dtype.value}/{s.quant.value} act_scale={s.act_scale.value}",
                "dtype in (fp16, bf16), quant in (none, fp8, fp8_block, w4a16_awq, w8a16) or (quant == wfp4a16 and "
                "dtype == bf16) or (quant == w4afp8 and act_scale == static)", ok, OURS)


# ... weight-only (and W4AFP8, on W4A16's GEMMs): on the mixed-input wgmma kernel only (gemm/woq_sm90_gated.cu), so
# in the bands where GEMM1's tactic is one of its tiles; the decode, mma and digits kernels store GEMM1 whole, and the
# activation kernel reads it in W1's interleaved order: quant not in (w4a16_awq, w8a16, w4afp8, wfp4a16) or GEMM1's
# tactic at these rows in WOQ_WGMMA_TILES
GATED_EPILOGUE_MIXED_INPUT_QUANTS = (Quant.W4A16_AWQ, Quant.W8A16, Quant.W4AFP8, Quant.WFP4A16)


def gated_epilogue_woq_mixed(s: MoESpec, rows: RowCount, gemm1_tactic: GemmTactic) -> Gate:
    woq = s.quant in GATED_EPILOGUE_MIXED_INPUT_QUANTS
    mixed = on_mixed_input_tile(gemm1_tactic)
    return Gate("gated_epilogue_woq_mixed_input", f"quant={s.quant.value} rows={rows.rows} gemm1={gemm1_tactic.name}",
                "quant not in (w4a16_awq, w8a16, w4afp8, wfp4a16) or GEMM1's tactic is a mixed-input wgmma tile "
                "(woq128x*)",
                not woq or mixed, OURS, token_dependent=True)


# ... with block-128 scales on the decode kernel, which reads W1 stacked (gate row f, up row I + f, each with its own
# 128-row scale block; W1 interleaved by 8 would split the blocks), where it pays: it makes that GEMM1 5-10% slower
# than its plain store (H200 timelines, 1-4 tokens: GPT-OSS-20B 31.2 against 28.3 us at 1 token, Mixtral-8x7B 166.1
# against 159.8 at 4, DeepSeek-V3 130.8 against 127.3 at 2) and saves the activation kernel and its wait, 3-5 us, only
# where GEMM2 then quantizes its own input. So: GEMM1 rows < FP8_BLOCK_DECODE_ROWS (its decode band), intermediate_size
# <= FP8_QUANTIZING_MAX_K (after the epilogue a quantize step costs what the activation kernel does: Mixtral-8x7B up to
# 10 us slower at 1-16 tokens) and GEMM1's touched weights min(experts, rows) x 2I x H <=
# FP8_BLOCK_GATED_MAX_GEMM1_BYTES. Layers, H200, graph replay, four
# rounds at 1-3 tokens, us, gated / activation kernel: Qwen3-30B-A3B (25 MB a token) 1 token 27.6-29.0 / 30.3-31.7, 2
# tokens 42.3-46.6 / 44.9-48.4, 3 tokens level; DeepSeek-V2-Lite (35 MB) 30.8-32.3 / 32.2-33.6, 2 tokens 51.5-52.6 /
# 52.7-53.6; GPT-OSS-20B (66 MB) 54.4-59.5 / 57.0-63.6, 2 tokens level; DeepSeek-V3 (235 MB) level at 1, 2-6 us slower
# at 2 and 3 (docs/performance.md, "The block-128 gated epilogue at decode sizes")
FP8_BLOCK_GATED_MAX_GEMM1_BYTES = 80 << 20


def gated_epilogue_block_decode(s: MoESpec, rows: RowCount) -> Gate:
    block = s.quant is Quant.FP8_BLOCK
    per_expert = 2 * s.intermediate_size * s.hidden_size  # e4m3 bytes of one expert's W1
    most = FP8_BLOCK_GATED_MAX_GEMM1_BYTES // per_expert  # touched experts within the bound
    held = not block or (rows.rows_below(FP8_BLOCK_DECODE_ROWS) and s.intermediate_size <= FP8_QUANTIZING_MAX_K
                         and (s.local_experts <= most or rows.rows_below(most + 1)))
    touched = min(s.local_experts, rows.rows)
    return Gate("gated_epilogue_block128_decode",
                f"quant={s.quant.value} rows={rows.rows} I={s.intermediate_size} gemm1_bytes={touched * per_expert}",
                f"quant != fp8_block or (rows < {FP8_BLOCK_DECODE_ROWS}, I <= {FP8_QUANTIZING_MAX_K} and "
                f"min(experts, rows) x 2I x H <= {FP8_BLOCK_GATED_MAX_GEMM1_BYTES >> 20} MiB)", held, OURS,
                token_dependent=True)


# The wgmma tiles the block-128 gated GEMM1 runs on in the plan (gated_epilogue_block_wgmma)
GATED_HALVES_TILES = ("pingpong64x128", "pingpong64x128c2")


# ... and on the wgmma kernel's pingpong 64x128 tiles (cpp/src/gemm/fp8_sm90_gated_block.cu): W1 still stacked, read
# by gate/up halves (moe_build/weights/halves.py: each 128-row weight tile 64 gate rows and their 64 up rows, each half
# inside one 128-row scale block where intermediate_size % 64 == 0), its scales by 8 rows. Layers on an H100, graph
# replay, us, gated / activation kernel forced (docs/performance.md, "The block-128 gated GEMM1 on the wgmma tiles"):
# at 256 tokens (pingpong 64x128) Qwen3-30B-A3B 237.4 / 243.6, DeepSeek-V2-Lite 223.1 / 226.8, GPT-OSS-20B 310.7 /
# 323.3; at 4096 (coop 128x128) Qwen3-30B-A3B 579.5 / 571.9, DeepSeek-V2-Lite 690.8 / 669.6, Mixtral-8x7B 3900.0 /
# 3613.1: where the tile's 128 rows make GEMM1 compute-bound, each k block's promotion reading and applying a scale
# per 8 columns likely costs more than the activation kernel's round trip (not profiled).
# quant != fp8_block or (GEMM1's tactic is a pingpong 64x128 wgmma tile and intermediate_size % 64 == 0)
def gated_epilogue_block_wgmma(s: MoESpec, gemm1_tactic: GemmTactic) -> Gate:
    block = s.quant is Quant.FP8_BLOCK
    pingpong = gemm1_tactic.kernel == "wgmma" and gemm1_tactic.tile in GATED_HALVES_TILES
    held = not block or (pingpong and halves_fit(s.intermediate_size))
    return Gate("gated_epilogue_block128_wgmma",
                f"quant={s.quant.value} gemm1={gemm1_tactic.name} I={s.intermediate_size}",
                "quant != fp8_block or (GEMM1's tactic is a pingpong 64x128 wgmma tile and intermediate_size % 64 "
                "== 0)", held, OURS, token_dependent=True)


# intermediate_size % 8 == 0: W1 interleaves gate and up rows in blocks of 8 features
def gated_epilogue_inter_mod_8(s: MoESpec) -> Gate:
    return Gate("gated_epilogue_inter_mod_8", s.intermediate_size, "intermediate_size % 8 == 0",
                s.intermediate_size % 8 == 0, OURS)


# ---- 3.4 FC2 pre-quant scale ------------------------------------------------------------------

# use_awq = fc1.act_scales && fc2.act_scales && !use_wfp4a16
def fc2_use_awq(s: MoESpec) -> Gate:
    ok = s.quant.has_act_prequant_scales and s.quant_prequant_scales and s.quant is not Quant.WFP4A16
    return Gate("use_awq", f"{s.quant.value} prequant_scales={s.quant_prequant_scales}",
                "act pre-quant scales present (a w4a16_awq / w4afp8 checkpoint that stores them) and not wfp4a16",
                ok, _src(MOE_KERNELS_H, 810))


# fuse_fc2_prequant_scale = use_awq && is_gated_activation
def fc2_gated(s: MoESpec) -> Gate:
    return Gate("fc2_prequant_gated", s.activation.value, "activation is gated", s.activation.is_gated,
                _src(MOE_KERNELS_CU, 3865, 3874, 1969, 2028))


# ---- 3.5 finalize fusion ----------------------------------------------------------------------

# supportsTmaWarpSpecialized() (the GEMM2 kernel must be TMA WS)
def finalize_tma_ws(gemm_kernel: str) -> Gate:
    return Gate("finalize_tma_ws", gemm_kernel, "gemm kernel is TMA warp-specialized",
                gemm_kernel == "tma_warp_specialized", _src(GEMM_DISPATCH_H, 635))


# mayHaveFinalizeFused(): SM >= 90 && !use_wfp4a16
def finalize_sm_not_wfp4a16(s: MoESpec, t: Target) -> Gate:
    return Gate("finalize_sm90_not_wfp4a16", f"sm={t.sm} quant={s.quant.value}", "sm >= 90 and quant != wfp4a16",
                t.sm >= 90 and s.quant is not Quant.WFP4A16, _src(MOE_KERNELS_H, 827, 614))


# use_fused_finalize_: experts_per_token < 3 || !mUseDeterministicKernels
def finalize_topk_or_nondeterministic(s: MoESpec, t: Target) -> Gate:
    return Gate("finalize_topk_deterministic", f"top_k={s.top_k} deterministic={t.deterministic}",
                "top_k < 3 or not deterministic", s.top_k < 3 or not t.deterministic, _src(MOE_PLUGIN_CPP, 338))


# !TRTLLM_MOE_DISABLE_FINALIZE_FUSION (also MOE_BUILD_DISABLE_FINALIZE_FUSION)
def finalize_env(t: Target) -> Gate:
    return Gate("finalize_env", t.finalize_fusion_disabled_by_env,
                "MOE_BUILD_/TRTLLM_MOE_DISABLE_FINALIZE_FUSION unset", not t.finalize_fusion_disabled_by_env,
                f"{_src(MOE_PLUGIN_CPP, 338)}, {_src(ENV_UTILS_CPP, 422)}")


# !hasLora()
def finalize_no_lora(s: MoESpec) -> Gate:
    return Gate("finalize_no_lora", s.lora, "not lora", not s.lora, _src(MOE_PLUGIN_CPP, 338))


# the experts' rank does the finalize only in the contiguous format (or on one GPU); the permuted formats
# return every (token, k) row and the tokens' ranks weight and sum them: ep_format not permuted / batched
def finalize_where_experts_run(ep_format: str) -> Gate:
    return Gate("finalize_where_experts_run", f"ep_format={ep_format}", "ep_format not in (permuted, batched)",
                ep_format not in ("permuted", "batched"), OURS)


# runtime must select a GEMM2 tactic with epilogue_fusion_type == FINALIZE (ours: bf16/fp16, unquantized or
# fp8 / fp8_block: mb_grouped_gemm_sm90_finalize and mb_grouped_gemm_fp8_finalize; w8a16, w4a16_awq and w4afp8 on
# the weight-only decode kernel, mb_grouped_gemm_woq_finalize, and the mixed-input wgmma kernel,
# mb_grouped_gemm_woq_sm90_finalize)
FINALIZE_WOQ_QUANTS = (Quant.W8A16, Quant.W4A16_AWQ, Quant.W4AFP8)
FINALIZE_TACTIC_QUANTS = (Quant.NONE, Quant.FP8, Quant.FP8_BLOCK, *FINALIZE_WOQ_QUANTS)


def finalize_tactic_available(s: MoESpec) -> Gate:
    ok = s.dtype in (DType.BF16, DType.FP16) and s.quant in FINALIZE_TACTIC_QUANTS
    return Gate("finalize_tactic", f"{s.dtype.value}/{s.quant.value}",
                "a FINALIZE-epilogue GEMM2 tactic exists (bf16/fp16; quant none, fp8, fp8_block, or on the decode "
                "and mixed-input kernels w8a16, w4a16_awq, w4afp8)", ok, _src(MOE_KERNELS_CU, 4058, 4061, 4067))


# tactic selection (the FINALIZE GEMM2 tactic must be the one chosen at run time), measured on the H200 for bf16 layers:
# from intermediate size 2048 the fused epilogue is ahead or within 1.5 us at every count. Below it, fused where GEMM2
# runs the wgmma kernel (past 4 rows per expert, tactics.dense.FINALIZE_DECODE_MAX_AVG_ROWS; there it wins by 4-10 us,
# DeepSeek-V2-Lite, Qwen3-30B-A3B and GPT-OSS-20B at 128-384 tokens, 5-29 us at 1024-4096), and on the smallest calls
# (tokens * top_k <= 32), where the separate kernel's launch costs more than the epilogue's atomics (token sweep: Qwen3
# 1 / 2 tokens 32.3 / 52.4 us vs 34.4 / 54.8, DeepSeek 1 token 39.2 vs 41.1; 3-4 tokens 2% ahead); separate between,
# where it was 0.5-1% ahead (docs/experiments.md, "Rules and their evidence").
# The weight-only GEMM2s have the FINALIZE epilogue on their decode kernel, fused within its band
# (tactics.woq.WOQ_DECODE_MAX_AVG_ROWS) where the 16-bit rule's first two clauses hold, and on the mixed-input wgmma
# kernel (gemm/woq_sm90_finalize.cu), fused where GEMM2's plain-store tactic is one of its tiles (woq128x*) up to
# WOQ_FINALIZE_MIXED_MAX_AVG_ROWS average rows per expert (as measured on the 32- and 64-row tiles). H200, graph
# replay, fused against forced separate (docs/performance.md, "The finalize in the mixed-input GEMM2's epilogue"):
# at 16-32 rows 0-4% less a layer (256 tokens: Qwen3-30B-A3B 1.033-1.042x, DeepSeek-V2-Lite 0.997-1.013x,
# GPT-OSS-20B 1.002-1.015x); from 64 rows level to 7% slower (Mixtral-8x7B 0.996-1.016x at 64-1024 rows,
# Qwen3-30B-A3B 0.926-0.950x at 256): the mixed-input kernel is cooperative, so its epilogue's shuffles and atomics
# run with no mainloop beside them, where the separate finalize streams the rows at the read rate.
WOQ_FINALIZE_MIXED_MAX_AVG_ROWS = 48
# FP8 layers fuse at every count: where the 16-bit rule leaves the finalize separate (below intermediate 2048, 33
# rows to 4 per expert: the FP8 decode kernel's band) fused was 0.5-3.9 us faster at 7 of the 8 points it moves and
# 0.2 us slower at one (H200, moe-build bench --quant fp8,fp8_block --tokens 4,16,32,64 --variants
# ours,ours:finalize=fused, Qwen3-30B-A3B and DeepSeek-V2-Lite: fp8 Qwen3 16 tokens 122.4 vs 124.7 us, block-128
# 32 tokens 147.9 vs 151.4; DeepSeek-V2-Lite fp8 at 32 tokens 156.2 vs 156.0), and with this rule the forced separate
# variant was slower at both points it moves in the next run (16 tokens: Qwen3 122.1 vs 121.2, DeepSeek-V2-Lite 138.2
# vs 132.9): both orders agree, where a first try (2026-11-28) had the forced variant ahead either way
# (docs/experiments.md, "FP8 finalize fused at every count"; docs/performance.md, "The gated epilogue on the FP8
# GEMM1"). Fused had won 4-9% wherever the 16-bit rule chose it (at 1, 16 and 4096 tokens).
FINALIZE_FUSED_MIN_INTER = 2048
FINALIZE_FUSED_MAX_ROWS = 32
FINALIZE_ALWAYS_FUSED_QUANTS = (Quant.FP8, Quant.FP8_BLOCK)


def finalize_fused(s: MoESpec, rows: RowCount, gemm2_tactic: GemmTactic | None = None) -> bool:
    """Whether the FINALIZE tactic is the one selected at `rows` (the rules above); for a weight-only layer,
    `gemm2_tactic` is GEMM2's plain-store tactic at `rows` (None: not on the mixed-input kernel)."""
    if s.quant in FINALIZE_ALWAYS_FUSED_QUANTS:
        return True
    if s.quant in FINALIZE_WOQ_QUANTS:
        return (rows.avg_at_most(WOQ_DECODE_MAX_AVG_ROWS) and (
            s.intermediate_size >= FINALIZE_FUSED_MIN_INTER or rows.rows_below(FINALIZE_FUSED_MAX_ROWS + 1))
        ) or (rows.avg_at_most(WOQ_FINALIZE_MIXED_MAX_AVG_ROWS) and on_mixed_input_tile(gemm2_tactic))
    return (s.intermediate_size >= FINALIZE_FUSED_MIN_INTER or rows.rows_below(FINALIZE_FUSED_MAX_ROWS + 1)
            or not rows.avg_at_most(FINALIZE_DECODE_MAX_AVG_ROWS))


def finalize_fused_at(s: MoESpec, tokens: int, gemm2_tactic: GemmTactic | None = None) -> bool:
    """`finalize_fused` at `tokens` tokens (its bands: tactics.token_bands)."""
    return finalize_fused(s, RowCount(tokens, s.top_k, s.local_experts), gemm2_tactic)


def finalize_tactic_rows(s: MoESpec, tokens: int, gemm2_tactic: GemmTactic | None = None) -> Gate:
    small = f"intermediate_size >= {FINALIZE_FUSED_MIN_INTER} or tokens * top_k <= {FINALIZE_FUSED_MAX_ROWS}"
    woq = s.quant in FINALIZE_WOQ_QUANTS
    condition = ("quant in (fp8, fp8_block): every count" if s.quant in FINALIZE_ALWAYS_FUSED_QUANTS else
                 f"tokens * top_k <= {WOQ_DECODE_MAX_AVG_ROWS} * experts_per_node (the decode kernel) and ({small}), "
                 f"or tokens * top_k <= {WOQ_FINALIZE_MIXED_MAX_AVG_ROWS} * experts_per_node and GEMM2's plain-store "
                 "tactic is a mixed-input wgmma tile (woq128x*)" if woq else
                 f"{small} or tokens * top_k > {FINALIZE_DECODE_MAX_AVG_ROWS} * experts_per_node")
    gemm2 = f" gemm2={gemm2_tactic.name if gemm2_tactic is not None else 'none'}" if woq else ""
    return Gate("finalize_tactic_rows",
                f"intermediate_size={s.intermediate_size} top_k={s.top_k} experts_per_node={s.local_experts} "
                f"tokens={tokens}{gemm2}", condition,
                finalize_fused_at(s, tokens, gemm2_tactic),
                f"{_src(MOE_KERNELS_CU, 4058)} (tactic choice; {OURS}, measured)", token_dependent=True)


# ---- weight layouts (moe-build's own) ---------------------------------------------------------

# W1 / b1 gate/up-interleaved in blocks of 8 features exactly when GEMM1 runs the gated epilogue at some token count
# (a weight layout serves every count: a weight-only layer's activation kernel reads the interleaved order in the
# other bands), but with block-128 scales (its decode kernel reads W1 stacked, gated_epilogue_block_decode above):
# fc1_activation == gated_epilogue in some band and quant != fp8_block
def w1_interleaved(s: MoESpec, fc1_activation: Sequence[str]) -> Gate:
    return Gate("w1_gated_epilogue", f"{'/'.join(fc1_activation)} quant={s.quant.value}",
                "fc1_activation == gated_epilogue (in some band) and quant != fp8_block",
                "gated_epilogue" in fc1_activation and s.quant is not Quant.FP8_BLOCK, OURS)


# 64 x 64 weight blocks are read only by the sm90 GEMMs (gemm_kernel == tma_warp_specialized)
def blocked_gemm_kernel(gemm_kernel: str) -> Gate:
    return Gate("blocked_gemm_kernel", gemm_kernel, "gemm kernel is TMA warp-specialized",
                gemm_kernel == "tma_warp_specialized", OURS)


# ... and only where hidden and intermediate sizes are multiples of 64 (whole blocks)
def blocked_sizes(s: MoESpec) -> Gate:
    return Gate("blocked_sizes", f"hidden={s.hidden_size} inter={s.intermediate_size}",
                "hidden_size % 64 == 0 and intermediate_size % 64 == 0", blocks_fit(s.hidden_size, s.intermediate_size),
                OURS)


# blocked weights pay where the largest call (the profile's max tokens) gives 128-384 average rows per
# expert: whole layers by graph replay, H200, the wgmma GEMMs gain at 128-384 rows on all four bench shapes
# (Qwen3-30B-A3B 4096 tokens, 256 rows: 599.7-600.0 vs 611.6-612.8 us; GPT-OSS-20B 128 rows 487.5-488.0 vs
# 500.0-501.0) and lose past it on the larger experts (GPT-OSS 512 rows 1300.6-1369.4 vs 1266.2-1272.8,
# Mixtral-8x7B 1024 rows 4585.8-4840.5 vs 4445.1-4494.4); the decode kernel reads them 2-4% slower, which
# a prefill-sized runner pays at its decode-sized calls (weights cannot change layout per call).
BLOCKED_MIN_AVG_ROWS = 128
BLOCKED_MAX_AVG_ROWS = 384


def blocked_rows_pay(s: MoESpec, t: Target) -> Gate:
    avg = -(-t.profile.max * s.top_k // s.local_experts)
    return Gate("blocked_rows_pay", f"max_tokens={t.profile.max} avg_rows={avg}",
                f"{BLOCKED_MIN_AVG_ROWS} <= ceil(max_tokens * top_k / experts) <= {BLOCKED_MAX_AVG_ROWS}",
                BLOCKED_MIN_AVG_ROWS <= avg <= BLOCKED_MAX_AVG_ROWS, OURS)


# quantized weights are read row-major: the FP8 and weight-only GEMMs (cpp/src/gemm/fp8_*.cu, woq_*.cu) have no
# 64 x 64 block maps
def blocked_unquantized(s: MoESpec) -> Gate:
    return Gate("blocked_unquantized", s.quant.value, "quant == none", s.quant is Quant.NONE, OURS)


# ---- int4 codes in 16-row tiles (moe-build's own) --------------------------------------------

# int4 codes can be held in 16-row tiles (MB_WOQ_INT4_TILES: a decode warp's 16 rows of a 128-k batch 1024 contiguous
# bytes), which the decode, mma and dequantize kernels read: quant in (w4a16_awq, w4afp8)
def int4_tiles_quant(s: MoESpec) -> Gate:
    return Gate("int4_tiles_quant", s.quant.value, "quant in (w4a16_awq, w4afp8)",
                s.quant in (Quant.W4A16_AWQ, Quant.W4AFP8), OURS)


# tiles pay where no GEMM band up to the profile's max tokens runs the mixed-input wgmma kernel, which reads rows
# (tiled, those bands would read a rows copy: twice the codes' memory). H100, W4A16 / W4AFP8 layers of the four bench
# shapes at 1-32 tokens, tiles against rows in one process, graph replay: 0.70-0.98x (Mixtral-8x7B at 16 tokens 301.3
# vs 346.9 us, GPT-OSS-20B 172.9 vs 247.4; docs/performance.md, "int4 codes in 16-row tiles for the decode kernels")
def int4_tiles_pay(mixed_input_from: int | None, max_tokens: int) -> Gate:
    return Gate("int4_tiles_pay", f"max_tokens={max_tokens} mixed_input_from={mixed_input_from}",
                "max_tokens < the first count a GEMM runs on the mixed-input wgmma kernel (a woq128x* tile)",
                mixed_input_from is None or max_tokens < mixed_input_from, OURS)


# ---- FP8 activation quantization (moe-build's own) -------------------------------------------

def _fp8_activations(s: MoESpec) -> bool:
    return s.quant in (Quant.FP8, Quant.FP8_BLOCK)


# GEMM1's input rows are quantized to FP8 where they are duplicated and permuted (one pass over the
# tokens) when the layer runs FP8 GEMMs: quant in (fp8, fp8_block)
def input_quant_fp8(s: MoESpec) -> Gate:
    return Gate("fp8_gemms", s.quant.value, "quant in (fp8, fp8_block)", _fp8_activations(s), OURS)


# The FP8 GEMMs' accumulation is a choice of the wgmma kernel (the decode kernel adds each mma's sums into fp32
# registers): gemm kernel is TMA warp-specialized
def fp8_wgmma_kernel(gemm_kernel: str) -> Gate:
    return Gate("fp8_wgmma_kernel", gemm_kernel, "gemm kernel is TMA warp-specialized",
                gemm_kernel == "tma_warp_specialized", OURS)


# ... which accumulates the whole k in the tensor cores (no fp32 promotion every 128 k) with rowwise scales: quant ==
# fp8 (block-128 scales weigh each 128-k block's sum as it is promoted). TensorRT-LLM's Hopper FP8 MoE GEMMs always
# do (KernelScheduleSM90 in cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_launcher.inl);
# here the layers at 4096 tokens 1.09-1.14x faster, GEMM outputs 0.17-0.33% from fp64 against 0.17% promoted
# (docs/performance.md, "FP8 fast accumulation")
def fp8_rowwise_scales(s: MoESpec) -> Gate:
    return Gate("fp8_rowwise_scales", s.quant.value, "quant == fp8", s.quant is Quant.FP8, OURS)


# GEMM2's input is quantized to FP8 inside the activation step when that step runs as its own kernel, at every count:
# fc1_activation == separate (a fused gated epilogue writes 16-bit rows). At 1 token the block-per-row activation
# kernel's quantization had lost 1-9% to the separate quantize kernel (2026-11-28; docs/performance.md, "FP8 layers");
# the warp-row kernels win there on all four bench shapes, block-128 (whose plan runs it), H200, three rounds in three
# device calls, graph replay, us, fused against separate: GPT-OSS-20B 56.4 / 55.8 / 57.5 against 57.6 / 57.4 / 59.2,
# Qwen3-30B-A3B 32.3 / 31.7 / 31.4 against 34.2 / 33.4 / 32.8, DeepSeek-V2-Lite 34.3 / 33.3 / 34.1 against 36.0 /
# 35.0 / 35.6, Mixtral-8x7B 118.9 / 120.3 against 119.5 / 121.1 (docs/performance.md, "The FC2 input quantization in
# the activation kernel at 1 token").
def fc2_quant_in_activation(fc1_activation: str) -> Gate:
    return Gate("fc1_activation_kernel", fc1_activation, "fc1_activation == separate", fc1_activation == "separate",
                OURS)


# With a static GEMM2 input scale (ModelOpt's per-tensor FP8 `input_scale`), GEMM1's gated epilogue writes GEMM2's
# FP8 input itself (fc2_input_quant=gemm1), the bytes and scales the quantize step would write: the scale is known
# before any column is written, where a dynamic one needs the whole row's amax, which no column tile holds. At every
# count: H200, layer us, graph replay, against the quantize step forced (and at decode against GEMM2 quantizing its
# input on the same GEMM2 tactic): 1 token Qwen3-30B-A3B 24.4 / 28.7 (gemm2 24.8), DeepSeek-V3 108.5 / 113.0 (gemm2
# 108.3); 16 tokens GPT-OSS-20B 199.1 / 204.2 (gemm2 202.8); 4096 tokens Mixtral-8x7B 2711.5 / 2795.6, DeepSeek-V2-Lite
# 520-562 / 546-578 in five of six rounds, 587.7 / 552.5 in the sixth; ties at Mixtral-8x7B's 256 tokens, GPT-OSS-20B
# at 4096 tokens 4% ahead in two rounds and 4% behind in a third (docs/performance.md, "GEMM1's epilogue quantizing
# GEMM2's input"); at 2-8192 tokens between, the four bench shapes, 40 counts: 1.007-1.15x faster everywhere:
# act_scale == static
def fc2_quant_static_scale(s: MoESpec) -> Gate:
    return Gate("fc2_static_scale", s.act_scale.value, "act_scale == static", s.act_scale is ActScale.STATIC, OURS)


# Else GEMM2 quantizes its input itself as it loads its rows (the quantizing decode kernel, gemm/fp8_decode.cu: per
# row, or per 128-column group with block-128 scales), with no kernel between the GEMMs, where GEMM1's gated epilogue
# wrote 16-bit rows: fc1_activation == gated_epilogue (at the call's count: block-128 layers' GEMM1 runs it in its
# decode band)
def fc2_quant_after_gated_epilogue(fc1_activation: str) -> Gate:
    return Gate("gemm1_gated_epilogue", fc1_activation, "fc1_activation == gated_epilogue",
                fc1_activation == "gated_epilogue", OURS, token_dependent=True)


# ... a chunk's 8 rows quantized into shared memory, 8 x (I rounded up to 128, + 64) bytes:
# intermediate_size <= MB_FP8_QUANTIZING_MAX_K (cpp/include/moe_build_kernels.h; past it, fewer CTAs fit an SM)
FP8_QUANTIZING_MAX_K = 8192


def fc2_quant_gemm2_k(s: MoESpec) -> Gate:
    return Gate("gemm2_quantizing_k", str(s.intermediate_size), f"intermediate_size <= {FP8_QUANTIZING_MAX_K}",
                s.intermediate_size <= FP8_QUANTIZING_MAX_K, OURS)


# ... at the token counts where GEMM2 runs the decode kernel with the finalize in its epilogue (that kernel's only
# quantizing form): gemm2_tactic kernel == decode and finalize == fused
def fc2_quant_gemm2_call(gemm2_tactic: str, finalize: str) -> Gate:
    held = gemm2_tactic.startswith("decode:") and finalize == "fused"
    return Gate("gemm2_quantizing_call", f"gemm2_tactic={gemm2_tactic} finalize={finalize}",
                "gemm2_tactic kernel == decode and finalize == fused", held, OURS, token_dependent=True)


# ... and where GEMM2's CTAs are few: each CTA quantizes its chunk's rows before its first product, a wait that the
# two resident CTAs of an SM, alike and started together, take at once; past about 4 waves those waits cost more than
# the quantize kernel (H200, layer us, quantizing / separate kernel, two rounds: Qwen3-30B-A3B 4 tokens, 512 CTAs,
# 53.0-53.1 / 54.8-56.4, 8 tokens, 1024, 81.5-82.1 / 81.4-81.7, 16 tokens, 2048, 123.0-123.6 / 120.0-120.5;
# DeepSeek-V2-Lite 16 tokens, 1024, 131.6-132.1 / 131.5-133.9, 24 tokens, 1024, 143.5-143.9 / 145.4-146.2;
# GPT-OSS-20B 4 tokens, 720, 114.9-115.4 / 116.2-116.8, 8 tokens, 1440, 146.9-147.4 / 146.6-147.6; DeepSeek-V3 1
# token, 896, 110.6-113.4 / 113.1-113.7, 4 tokens, 3584, 334.9-336.3 / 322.9-323.0; docs/performance.md, "GEMM2
# quantizing its own input"): min(experts, rows) x column blocks <= FP8_QUANTIZING_MAX_CTAS_PER_SM x SMs
FP8_QUANTIZING_MAX_CTAS_PER_SM = 8


def fc2_quant_gemm2_waves(experts: int, column_blocks: int, sm_count: int, held: bool) -> Gate:
    limit = FP8_QUANTIZING_MAX_CTAS_PER_SM * sm_count
    return Gate("gemm2_quantizing_waves", f"experts<={experts} column_blocks={column_blocks} sms={sm_count}",
                f"min(experts, rows) x column_blocks <= {FP8_QUANTIZING_MAX_CTAS_PER_SM} x sms ({limit})", held, OURS,
                token_dependent=True)


# ---- expert parallelism (moe-build's own; TensorRT-LLM's MoE ep_size / ep_rank settings) ----------

# the experts are split over ranks, each rank holding num_experts / ep_size of them: ep_size > 1
def ep_parallel(s: MoESpec) -> Gate:
    return Gate("ep_parallel", f"ep_size={s.ep_size} experts_per_rank={s.local_experts}", "ep_size > 1",
                s.ep_size > 1, OURS)


# the ranks map each other's memory over NVLink only within one NVLink domain (an HGX board's 8 GPUs):
# ep_size <= 8. Where it holds, nvlink is the choice: on 4 H200s a dispatch + combine takes 26-33 us for 1-16
# tokens per rank replayed from a CUDA graph (1.0 ms at 4096 tokens of hidden 7168, 312 GB/s) and 0.35-1.5 ms
# called eagerly at 1-4096 tokens, against nccl's 0.7-1.5 ms (eager only: its exact sizes come from the counts on
# the host), hidden 2048 and 7168 (docs/performance.md, "Expert parallelism (4 x H200, CUDA-graph replay)")
EP_NVLINK_DOMAIN = 8


def ep_one_nvlink_domain(s: MoESpec) -> Gate:
    return Gate("ep_nvlink_domain", s.ep_size, f"ep_size <= {EP_NVLINK_DOMAIN}", s.ep_size <= EP_NVLINK_DOMAIN, OURS)


# deterministic: every (token, k) expert output goes back to the token's rank, which sums them in k order as one
# GPU's separate finalize does (the contiguous format's partial sums per rank would add them in another order)
def ep_unpermute_deterministic(t: Target) -> Gate:
    return Gate("ep_unpermute_deterministic", f"deterministic={t.deterministic}", "deterministic",
                t.deterministic, OURS)


# the permuted formats add FC2's bias at the token's rank, which holds only its own experts' b2: no expert bias
def ep_unpermute_no_fc2_bias(s: MoESpec) -> Gate:
    return Gate("ep_unpermute_no_fc2_bias", f"expert_bias={s.expert_bias}", "not expert_bias", not s.expert_bias,
                OURS)


# the permuted formats' experts run the 16-bit GEMMs alone (no quantization steps between them yet): quant none
def ep_unpermute_16bit(s: MoESpec) -> Gate:
    return Gate("ep_unpermute_16bit", f"quant={s.quant.value}", "quant == none", s.quant.value == "none", OURS)


# the nccl dispatch's all-gather form (every rank's tokens to every rank and each rank's partial sums back: an
# all-gather and a reduce-scatter, nothing counted, nothing read back on the host) returns one partial row per
# token, the contiguous format's: ep_format == contiguous (the grouped formats return every (token, k) output, whose
# counts only the exchange finds)
def nccl_all_gather_contiguous(ep_format: str) -> Gate:
    return Gate("nccl_all_gather_contiguous", f"ep_format={ep_format}", "ep_format == contiguous",
                ep_format == "contiguous", OURS)


# ... and it holds every rank's tokens on every rank (and the experts' partial rows of them): its rows may not pass a
# bounded pool, tokens (all ranks') x hidden x 2 bytes <= 256 MiB; past it the two-phase exact sizes keep a rank's
# memory to the rows it needs (seed 003). Within it the form moves the worst case's bytes without the counts' host
# round trip, which cost the two-phase form 230-290 us a call at 1-1024 tokens per rank on 2 H200s against
# 56-165 us for a worst-case all_to_all_single pair (docs/performance.md, "the nccl exchanges as NCCL groups")
NCCL_ALL_GATHER_MAX_BYTES = 256 << 20


def nccl_all_gather_max_tokens(s: MoESpec) -> int:
    """The most tokens (every rank's together) the all-gather form's received rows hold within the pool."""
    return NCCL_ALL_GATHER_MAX_BYTES // (s.hidden_size * 2)


def nccl_all_gather_pool(s: MoESpec, tokens: int) -> Gate:
    t_max = nccl_all_gather_max_tokens(s)
    return Gate("nccl_all_gather_pool", f"tokens={tokens} hidden={s.hidden_size}",
                f"tokens x hidden x 2 bytes <= {NCCL_ALL_GATHER_MAX_BYTES >> 20} MiB (tokens <= {t_max})",
                tokens <= t_max, OURS, token_dependent=True)


# ---- weight-only: where the digits tile's token digits are made --------------------------------

# The decode kernel's digits tile (tactics.woq.woq_digits_rule) reads its token rows as 8-bit digits. Where a GEMM's
# tactic band is that tile, the kernel that writes the GEMM's input rows makes the digits itself (token_digits=fused:
# the expansion for GEMM1, the activation for GEMM2), so that the rows never pass through 16 bits in memory; separate: a
# digits step (mb_token_digits) after each of them reads the 16-bit rows back. H200, W4A16 layers, graph replay, two
# rounds, fused against separate, us (docs/performance.md, "The token digits made by the expansion and the
# activation"): 1 token Mixtral-8x7B 72.9-73.4 / 76.5-77.3, Qwen3-30B-A3B 23.3-23.4 / 27.5-27.6, DeepSeek-V2-Lite
# 24.8-24.9 / 28.5; 16 tokens Qwen3-30B-A3B 87.5-87.7 / 92.5-93.5, DeepSeek-V2-Lite 97.1-97.6 / 101.6-102.2; 4-16%
# less at every digits point of 1-32 tokens.
# a GEMM tactic band is decode:digits_*
def digits_tile_planned(gemms: Sequence[str]) -> Gate:
    return Gate("digits_tile", ",".join(gemms) or "none", "a GEMM tactic band is decode:digits_*", bool(gemms), OURS)


# fc2_prequant != separate: the separate FC2 pre-quant step rescales GEMM2's 16-bit input after the activation
def digits_fc2_prequant(fc2_prequant: str) -> Gate:
    return Gate("digits_fc2_prequant", fc2_prequant, "fc2_prequant != separate", fc2_prequant != "separate", OURS)


# quant != w4afp8 or act_scale == static or max(hidden, inter) <= 16384: a dynamic scale is its row's amax over every
# column, so the per-row digits kernels take a row a block, four 128-column groups a warp at most
# (cpp/src/common/row_scale_digits.cuh)
def digits_row_scale_fits(spec: MoESpec) -> Gate:
    widest = max(spec.hidden_size, spec.intermediate_size)
    held = spec.quant is not Quant.W4AFP8 or spec.act_scale is ActScale.STATIC or widest <= ROW_SCALE_DIGITS_MAX_COLS
    return Gate("digits_row_scale_fits", f"quant={spec.quant.value} act_scale={spec.act_scale.value} widest={widest}",
                f"quant != w4afp8 or act_scale == static or max(hidden, inter) <= {ROW_SCALE_DIGITS_MAX_COLS}", held,
                OURS)


# quant != w4afp8 or act_scale == static: per-row digits made where the rows are written have lost to the digits steps
# so far. A warp a 128-column group taking its whole row's amax first (its activation computed again per group): H200,
# W4AFP8 with per-row scales, graph replay, one round, fused / separate at 1 token, us
# (docs/measured/h200-2026-12-02-w4afp8-dynamic, call3): Mixtral-8x7B (112 groups a row) 139.3 / 86.4, GPT-OSS-20B
# 54.5 / 50.1, DeepSeek-V2-Lite 33.7 / 31.7, Qwen3-30B-A3B 29.5 / 29.5. The block-per-row kernels
# (row_scale_digits.cuh) run where token_digits=fused is forced; they replace the steps once timed ahead of them.
def digits_row_scale_pays(spec: MoESpec) -> Gate:
    held = spec.quant is not Quant.W4AFP8 or spec.act_scale is ActScale.STATIC
    return Gate("digits_row_scale_pays", f"quant={spec.quant.value} act_scale={spec.act_scale.value}",
                "quant != w4afp8 or act_scale == static", held, OURS)


# ---- OOTB expert compute ----------------------------------------------------------------------

# dense-masked compute wastes num_experts/top_k: gathering per expert pays once that exceeds 4x
def ootb_gather_pays(s: MoESpec) -> Gate:
    ratio = s.num_experts / s.top_k
    return Gate("ootb_gather_pays", round(ratio, 3), f"num_experts / top_k > {OOTB_DENSE_MAX_EXPERTS_PER_TOPK}",
                ratio > OOTB_DENSE_MAX_EXPERTS_PER_TOPK, OURS)


# per-expert gathering needs NonZero; TensorRT-RTX 1.7 has no runner for it (docs/tensorrt_rtx.md)
def ootb_flavour_has_nonzero(t: Target) -> Gate:
    return Gate("ootb_nonzero", t.flavour.value, "flavour == tensorrt (TensorRT-RTX has no NonZero runner)",
                t.flavour.value == "tensorrt", f"{OURS} (measured, {RTX_FACTS})")
