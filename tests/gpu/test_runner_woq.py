"""The fused runner on weight-only layers (quant w4a16_awq / w8a16 / wfp4a16) against the fp64 reference, on a GPU.

The reference (moe_build.reference) dequantizes the stored int4 / int8 / MXFP4 weights exactly (woq.py's rule) and
applies the AWQ pre-quant scales in fp64. The runner computes the same math with 16-bit roundings: each dequantized
weight rounded once to the activation type (2^-9 relative in bf16), the pre-quant products, GEMM1's output and the
activation rounded to bf16 before GEMM2, fp32 sums. These are the bf16 runner's roundings plus one on the weights
and one on each scaled input, so the bound is the bf16 runner's (tests/gpu/test_runner.py: 1e-2 relative L2 over
the output) doubled: 2e-2, and 4e-2 on any one token. (The mixed-input wgmma kernel rounds an int4 weight's two
parts, (u - 8) s and (8 - z) s, before their sum: parts no larger than the weight's own; tests/gpu/test_woq_wgmma.py.) Every output element must be written (outputs poisoned with
NaN), fresh random data per case, routing pinned by giving both sides the same logits.
"""
from __future__ import annotations

import random

import pytest
import torch
from runner_against_reference import assert_graph_replay_equals_eager, device_target, errors_against_reference

from moe_build.planner import make_plan
from moe_build.spec import Activation, DType, MoESpec, Quant, Routing, RoutingMethod
from moe_build.weights import MoEWeights
from moe_build.weights.woq import WoqKind

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

REL_TOL, TOKEN_TOL = 2e-2, 4e-2
# (quant, stored kind, group size, zero points, AWQ pre-quant scales)
MODES = [(Quant.W4A16_AWQ, WoqKind.INT4, 128, True, True), (Quant.W4A16_AWQ, WoqKind.INT4, 64, False, True),
         (Quant.W4A16_AWQ, WoqKind.INT4, 32, True, False), (Quant.W8A16, WoqKind.INT8, None, False, False),
         (Quant.W8A16, WoqKind.INT8, 128, False, False), (Quant.WFP4A16, WoqKind.MXFP4, 32, False, False)]
MODE_IDS = ["int4_g128_zeros_awq", "int4_g64_awq", "int4_g32_zeros", "int8_channel", "int8_g128", "mxfp4"]
# the AWQ pre-quant fusions (FC1's scale in the expansion, FC2's in the activation) and their unfused alternatives, the
# prologue's two forms, and the finalize both ways (the plan fuses it into the decode GEMM2 at 1 token here and into
# the mixed-input GEMM2 where that kernel takes the weights, int4 in groups of 64 or 128 or per row and int8, to 48
# rows an expert, 192 tokens; separate from 255; forced fused, GEMM2 stays on decode where the mixed-input kernel does
# not run)
FORCES = [{}, {"fc2_prequant": "separate"}, {"expand_rows": "plain"}, {"routing_prologue": "three_step"},
          {"finalize": "separate"}, {"finalize": "fused"}]
FORCE_IDS = ["default", "fc2_prequant_separate", "expand_plain", "three_step", "finalize_separate", "finalize_fused"]
BASE = MoESpec(256, 512, 8, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))


def woq_case(base: MoESpec, mode: tuple, seed: int) -> tuple[MoESpec, MoEWeights]:
    """A weight-only layer of `base`'s shape: random float weights quantized round-to-nearest (woq.quantize_matrix)."""
    quant, kind, group, zeros, awq = mode
    weights = MoEWeights.random(base, seed=seed).quantized_woq(kind, group, asymmetric=zeros, awq=awq, seed=seed)
    return base.with_overrides(quant=quant, quant_group_size=group or 128, **weights.woq.storage_flags()), weights


def check(base: MoESpec, mode: tuple, force: dict[str, str] | None = None, tokens: int = 16,
          max_tokens: int | None = None) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    spec, weights = woq_case(base, mode, seed)
    e = errors_against_reference(spec, weights, seed, tokens, force, max_tokens)
    assert e.rel < REL_TOL and e.per_token < TOKEN_TOL, \
        f"rel {e.rel:.4f} (bound {REL_TOL}), worst token {e.per_token:.4f} (bound {TOKEN_TOL}), seed {seed}, " \
        f"steps {e.steps}"


def test_awq_plan_runs_both_prequant_fusions() -> None:
    """What the plan says is what runs: the matrix's FC2 pre-quant fusion for AWQ with a gated activation, GEMM1's
    scale in the 16-bit expansion (moe-build's expand_awq_scale_16bit), and the unfused alternatives when forced
    (GEMM1's scale on the tokens' rows before the expansion copies them)."""
    from moe_build.runner import MoERunner
    spec, weights = woq_case(BASE, MODES[0], 0)
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=16).kernel_sequence(16)
    # 32 rows: fused finalize, the expansion zeroes the output
    assert steps[2:4] == ["routing_prologue:fused", "expand_rows:prequant+zero_output"]
    assert "fc1_activation:fc2_prequant" in steps and "fc2_prequant:separate" not in steps
    forced = MoERunner(spec, weights, target=device_target(), max_tokens=16,
                       force={"fc2_prequant": "separate", "expand_rows": "plain"})
    assert forced.kernel_sequence(16)[-3:] == ["fc1_activation", "fc2_prequant:separate", "gemm2:woq_finalize"]
    assert forced.kernel_sequence(16)[2:5] == ["routing_prologue:fused", "fc1_prequant:separate",
                                               "expand_rows:prequant_input+zero_output"]


# every mode with every force its plan can take (the pre-quant fusions exist with AWQ scales only)
FORCED = [pytest.param(m, f, id=f"{mid}-{fid}") for m, mid in zip(MODES, MODE_IDS) for f, fid in zip(FORCES, FORCE_IDS)
          if m[4] or not {"fc2_prequant", "expand_rows"} & set(f)]


@pytest.mark.parametrize("mode, force", FORCED)
@pytest.mark.parametrize("tokens", [1, 255, 256, 257])
def test_every_mode_and_fusion(mode: tuple, force: dict[str, str], tokens: int) -> None:
    check(BASE, mode, force, tokens)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_many_tokens(mode: tuple) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=4), mode, tokens=8192)


@pytest.mark.parametrize("mode", MODES[:2] + MODES[3:5], ids=MODE_IDS[:2] + MODE_IDS[3:5])
def test_the_320_row_tile_band(mode: tuple) -> None:
    """At 275 rows an expert (1100 tokens x top-2 over 8 experts, +- 14.4) one 320-row tile holds an expert where
    256-row ones take 1.9, so the plan runs both mixed-input GEMMs on woq128x320c2, 2x1 clusters of 320 token rows;
    the layer there against fp64 as everywhere."""
    from moe_build.runner import MoERunner
    spec, weights = woq_case(BASE, mode, 0)
    plan = MoERunner(spec, weights, target=device_target(), max_tokens=1100).plan
    assert [plan.stage(g).choice_for(1100) for g in ("gemm1_tactic", "gemm2_tactic")] == \
        ["wgmma:woq128x320c2:plain:plain"] * 2
    check(BASE, mode, tokens=1100)


@pytest.mark.parametrize("mode", MODES[:1] + MODES[3:], ids=MODE_IDS[:1] + MODE_IDS[3:])
@pytest.mark.parametrize("activation", list(Activation), ids=[a.value for a in Activation])
def test_all_activations(mode: tuple, activation: Activation) -> None:
    check(BASE.with_overrides(activation=activation), mode, tokens=64)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 6, 8])
def test_top_k(mode: tuple, top_k: int) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=top_k), mode, tokens=64)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("experts,tokens", [(8, 1), (64, 257), (128, 256), (256, 1024)])
def test_expert_counts(mode: tuple, experts: int, tokens: int) -> None:
    check(BASE.with_overrides(num_experts=experts, top_k=8), mode, tokens=tokens)


SIZES = [(128, 192), (384, 128), (640, 384), (192, 320), (2048, 768)]
# every mode at every size its group divides (a group of columns must divide both GEMMs' K, as in any checkpoint)
SIZED = [pytest.param(m, h, i, id=f"{mid}-{h}-{i}") for m, mid in zip(MODES, MODE_IDS) for h, i in SIZES
         if not m[2] or (h % m[2] == 0 and i % m[2] == 0)]


@pytest.mark.parametrize("mode, hidden, inter", SIZED)
@pytest.mark.parametrize("tokens", [3, 600])
def test_sizes_on_and_off_multiples_of_128(mode: tuple, hidden: int, inter: int, tokens: int) -> None:
    check(BASE.with_overrides(hidden_size=hidden, intermediate_size=inter), mode, tokens=tokens)


@pytest.mark.parametrize("mode", MODES[:1] + MODES[5:], ids=MODE_IDS[:1] + MODE_IDS[5:])
def test_expert_bias_fp16_and_clamped_swiglu(mode: tuple) -> None:
    spec = BASE.with_overrides(expert_bias=True, dtype=DType.FP16, activation=Activation.SWIGLU_CLAMP)
    check(spec, mode, tokens=40)


@pytest.mark.parametrize("mode", MODES[:1], ids=MODE_IDS[:1])
def test_cuda_graph_replay_equals_eager(mode: tuple) -> None:
    spec, weights = woq_case(BASE, mode, 3)
    assert_graph_replay_equals_eager(spec, weights)


DIGITS = {"gemm1_tactic": "decode:digits_ksplit1:after_trigger:plain",
          "gemm2_tactic": "decode:digits_ksplit2:after_trigger:plain"}


# GPT-OSS-20B's shape in small: hidden and intermediate sizes off 128 (2.5 and 1.5 groups of 128), clamped SwiGLU
# with biases, groups of 64
HALF_GROUPS = MoESpec(320, 192, 8, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
                      activation=Activation.SWIGLU_CLAMP, expert_bias=True)


@pytest.mark.parametrize("base, mode", [(BASE, MODES[0]), (BASE, (Quant.W4A16_AWQ, WoqKind.INT4, None, False, False)),
                                        (BASE, MODES[1]), (HALF_GROUPS, (Quant.W4A16_AWQ, WoqKind.INT4, 64, True, False))],
                         ids=["int4_g128_zeros_awq", "int4_channel", "int4_g64_awq", "int4_g64_half_groups"])
@pytest.mark.parametrize("finalize", ["fused", "separate"])
@pytest.mark.parametrize("token_digits", ["fused", "separate"])
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_digits_tile(base: MoESpec, mode: tuple, finalize: str, token_digits: str, tokens: int) -> None:
    """Both GEMMs on the decode kernel's digits tile, their token digits made by the expansion and the activation
    (token_digits=fused) or by a step of their own after them (separate), GEMM2 with the finalize in its epilogue or
    beside it; weights per row, in groups of 128 or of 64 (rows ending in a half group)."""
    from moe_build.runner import MoERunner
    spec, weights = woq_case(base, mode, 0)
    force = {**DIGITS, "finalize": finalize, "token_digits": token_digits}
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=16, force=force).kernel_sequence(tokens)
    assert "gemm1:woq_digits" in steps
    assert ("gemm2:woq_digits_finalize" if finalize == "fused" else "gemm2:woq_digits") in steps
    assert ("token_digits:gemm1" in steps) == ("token_digits:gemm2" in steps) == (token_digits == "separate")
    check(base, mode, force, tokens)


@pytest.mark.parametrize("base", [BASE, HALF_GROUPS], ids=["mxfp4", "mxfp4_half_groups"])
@pytest.mark.parametrize("token_digits", ["fused", "separate"])
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_mxfp4_digits_tile(base: MoESpec, token_digits: str, tokens: int) -> None:
    """WFP4A16 (GPT-OSS's MXFP4) with both GEMMs on the digits tile, its token digits in the quarters order (one step
    a scale group) made either way; the finalize beside GEMM2, as the matrix has it for WFP4A16."""
    from moe_build.runner import MoERunner
    mode = MODES[MODE_IDS.index("mxfp4")]
    spec, weights = woq_case(base, mode, 0)
    force = {**DIGITS, "token_digits": token_digits}
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=16, force=force).kernel_sequence(tokens)
    assert "gemm1:woq_digits" in steps and "gemm2:woq_digits" in steps
    assert ("token_digits:gemm1" in steps) == ("token_digits:gemm2" in steps) == (token_digits == "separate")
    check(base, mode, force, tokens)


@pytest.mark.parametrize("mode", [MODES[0], MODES[1], MODES[3], MODES[4]],
                         ids=[MODE_IDS[0], MODE_IDS[1], MODE_IDS[3], MODE_IDS[4]])
@pytest.mark.parametrize("fc1_activation", ["gated_epilogue", "separate"])
@pytest.mark.parametrize("tokens", [255, 1100])
def test_gated_epilogue_band(mode: tuple, fc1_activation: str, tokens: int) -> None:
    """int4 / int8 past decode: GEMM1 on the mixed-input wgmma kernel with the gated activation (and AWQ's FC2
    pre-quant scale) in its epilogue over W1 interleaved, or, forced separate, the plain store of W1 interleaved read
    back by the activation kernel in that order; the layer against fp64 either way. (The default plan has the gated
    epilogue there; forcing it is refused, the decode band having none.)"""
    from moe_build.runner import MoERunner
    spec, weights = woq_case(BASE, mode, 0)
    force = {} if fc1_activation == "gated_epilogue" else {"fc1_activation": fc1_activation}
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=tokens, force=force).kernel_sequence(tokens)
    gated = "gemm1:woq_wgmma_gated" + ("_fc2_prequant" if mode[4] else "")
    assert (gated in steps) == (fc1_activation == "gated_epilogue"), steps
    assert ("gemm1:woq_wgmma" in steps) == (fc1_activation == "separate"), steps
    check(BASE, mode, force, tokens)


@pytest.mark.parametrize("mode", [MODES[0], MODES[1], MODES[3], MODES[4]],
                         ids=[MODE_IDS[0], MODE_IDS[1], MODE_IDS[3], MODE_IDS[4]])
@pytest.mark.parametrize("finalize", ["fused", "separate"])
@pytest.mark.parametrize("tokens", [150, 1100])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_finalize_in_the_mixed_input_gemm2(mode: tuple, finalize: str, tokens: int, bias: bool) -> None:
    """int4 / int8 past decode: GEMM2 on the mixed-input wgmma kernel with the unpermute, top-k weighting (+b2) and
    reduction in its epilogue, or its plain store and the finalize kernel, each forced; the layer against fp64 either
    way, at 37.5 and 275 rows an expert (woq128x64 and the 2x1-cluster woq128x320c2). The plan fuses it at the first
    (to 48 rows) and not at the second."""
    from moe_build.runner import MoERunner
    base = BASE.with_overrides(expert_bias=bias)
    spec, weights = woq_case(base, mode, 0)
    force = {"finalize": finalize}
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=tokens, force=force).kernel_sequence(tokens)
    assert ("gemm2:woq_wgmma_finalize" in steps) == (finalize == "fused"), steps
    assert ("gemm2:woq_wgmma" in steps and "finalize" in steps) == (finalize == "separate"), steps
    plan = MoERunner(spec, weights, target=device_target(), max_tokens=tokens).plan
    assert plan.stage("finalize").choice_for(tokens) == ("fused" if tokens == 150 else "separate")
    check(base, mode, force, tokens)


# A long GEMM2 k (intermediate size 8192: a chunk's 8 token rows, 128 KB, do not fit one CTA's 104 KB): the plan runs
# GEMM2 on the staged kernel in clusters of four CTAs along K (tactic stagedc4) from 4 tokens (8 rows; 6 fit one CTA)
# to 32, int4 per 128 k or per row, the finalize fused into it or separate.
LONG_K = MoESpec(256, 8192, 8, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))


@pytest.mark.parametrize("mode", [MODES[0], (Quant.W4A16_AWQ, WoqKind.INT4, None, True, False)],
                         ids=["int4_g128_zeros_awq", "int4_channel_zeros"])
@pytest.mark.parametrize("finalize", ["fused", "separate"])
@pytest.mark.parametrize("tokens", [4, 16, 32])
def test_long_k_gemm2_on_the_staged_kernel_in_clusters(mode: tuple, finalize: str, tokens: int) -> None:
    spec, _ = woq_case(LONG_K, mode, 0)
    plan_tactic = make_plan(spec, device_target(), tokens).choices(tokens)["gemm2_tactic"]
    assert plan_tactic == "decode:stagedc4_ksplit1:after_trigger:plain", plan_tactic
    check(LONG_K, mode, {"finalize": finalize}, tokens=tokens)


@pytest.mark.parametrize("mode", MODES[:3], ids=MODE_IDS[:3])
@pytest.mark.parametrize("layout, max_tokens, tokens", [
    ("plan", 16, 1), ("plan", 16, 16), ("int4_tiles", 1024, 3), ("int4_tiles", 1024, 600), ("row_major", 16, 16)],
    ids=["plan-1", "plan-16", "tiles-forced-3", "tiles-forced-600", "rows-forced-16"])
def test_int4_weight_layouts(mode: tuple, layout: str, max_tokens: int, tokens: int) -> None:
    """int4 codes in 16-row tiles (weight_layout=int4_tiles): the plan's where no count up to max_tokens runs the
    mixed-input wgmma kernel (16 tokens here: decode GEMMs on the tiles), forced past it (600 tokens: the wgmma GEMMs
    read a rows copy made from the tiles; 3: the decode ones the tiles), and rows forced where the plan tiles."""
    from moe_build.runner import MoERunner
    spec, weights = woq_case(BASE, mode, 7)
    force = {} if layout == "plan" else {"weight_layout": layout}
    runner = MoERunner(spec, weights, target=device_target(), max_tokens=max_tokens, force=force)
    assert runner.plan.stage("weight_layout").choice == ("int4_tiles" if layout == "plan" else layout)
    assert runner.weights.woq.int4_tiles == (layout != "row_major")
    check(BASE, mode, force, tokens, max_tokens)
