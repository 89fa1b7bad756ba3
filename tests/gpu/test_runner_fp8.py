"""The fused runner on FP8 layers (quant fp8 / fp8_block) against the fp64 reference, on a real GPU.

The reference (moe_build.reference) dequantizes the stored e4m3 weights exactly and quantizes both GEMM
inputs exactly as moe_build/weights/fp8.py defines, in fp64. The runner computes the same quantized math
except that its 16-bit intermediates (GEMM1's output where the activation runs as a kernel, and the activation,
rounded to bf16 / fp16 before GEMM2's input is quantized) can move a value across an e4m3 rounding boundary: one e4m3 step (2^-3
relative) on that element. A torch emulation of exactly those roundings differs from the reference by
1.0-1.6% (relative L2 over the output) and at most 2.9% on one token (H 256-2048, I 200-768, top-k 2-8,
every scale granularity), so the bounds are twice that: 3% over the output, 6% per token (an output of
fewer than 16 tokens is held to the per-token bound only: 3% is a bound on the average; one H200 run saw a
single token at 3.2%). Below I = 200 a token's GEMM2 sums fewer terms, so the same flips weigh more: the per-token
bound grows as sqrt(200 / I) there (one H200 run saw 6.2% at H 384, I 128, 600 tokens). Every output
element must be written (outputs poisoned with NaN), fresh random data per case, routing pinned by
giving both sides the same logits.
"""
from __future__ import annotations

import random

import pytest
import torch
from runner_against_reference import assert_graph_replay_equals_eager, errors_against_reference

from moe_build.spec import ActScale, Activation, DType, MoESpec, Quant, Routing, RoutingMethod
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import ScaleGranularity

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

REL_TOL, TOKEN_TOL = 0.03, 0.06
AVERAGE_MIN_TOKENS = 16
TOKEN_TOL_MIN_INTER = 200  # the emulation's smallest I: below it the per-token bound grows as sqrt(200 / I)
# (quant, weight scales, activation scales): per-tensor static (ModelOpt), per-tensor and per-channel
# dynamic (compressed-tensors), block-128 (DeepSeek-V3)
MODES = [(Quant.FP8, ScaleGranularity.TENSOR, ActScale.STATIC), (Quant.FP8, ScaleGranularity.TENSOR, ActScale.DYNAMIC),
         (Quant.FP8, ScaleGranularity.CHANNEL, ActScale.DYNAMIC),
         (Quant.FP8_BLOCK, ScaleGranularity.BLOCK128, ActScale.DYNAMIC)]
MODE_IDS = ["tensor_static", "tensor_dynamic", "channel_dynamic", "block128"]
# the activation-quantization fusions, the finalize in GEMM2's epilogue (BASE's default plan fuses it at every
# token count: with 8 experts a call of more than 32 rows has more than 4 per expert) and their unfused
# alternatives; the fused finalize's output is zeroed by the FP8 expansion (either) or the three-step prologue;
# the rowwise GEMMs' promoted accumulation against the plan's fast one (block-128 promotes either way); and the
# activation kernel (GEMM2's input quantized in it, or after it) against the plan's gated GEMM1 epilogue (block-128:
# in GEMM1's decode band, here 1 token, and on its wgmma tiles)
QUANT_FORCES = [{}, {"fc1_input_quant": "separate"}, {"fc2_input_quant": "separate"},
                {"fc1_input_quant": "separate", "fc2_input_quant": "separate", "routing_prologue": "three_step"},
                {"finalize": "separate"},
                {"finalize": "separate", "fc1_input_quant": "separate", "routing_prologue": "three_step"},
                {"fp8_accumulation": "promoted"}, {"fc1_activation": "separate"},
                {"fc1_activation": "separate", "fc2_input_quant": "separate"}]
QUANT_FORCE_IDS = ["fused", "input_separate", "fc2_separate", "both_separate_three_step", "finalize_separate",
                   "finalize_separate_input_separate_three_step", "accumulation_promoted", "activation_kernel",
                   "activation_kernel_quantize_separate"]
BASE = MoESpec(256, 512, 8, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))
FUSED_GEMM2, SEPARATE_GEMM2 = "gemm2:fp8_finalize", "gemm2:fp8"  # runner/sequence.py's step names
QUANTIZING_GEMM2 = "gemm2:fp8_quantizing_finalize"


def need_fp8() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 kernels need compute capability 8.9 or later")


def fp8_case(base: MoESpec, mode: tuple[Quant, ScaleGranularity, ActScale], seed: int
             ) -> tuple[MoESpec, MoEWeights]:
    """An FP8 layer of `base`'s shape: random float weights quantized with amax / 448 scales; static
    activation scales chosen for unit-variance inputs (GEMM1's input up to ~4.5 sigma, the activation
    output up to ~3, saturating above, as calibrated scales do)."""
    quant, granularity, act = mode
    spec = base.with_overrides(quant=quant, act_scale=act)
    plain = MoEWeights.random(base, seed=seed)
    return spec, plain.quantized_fp8(granularity, static=act is ActScale.STATIC, a1_scale=4.5 / 448,
                                     a2_scale=3.0 / 448)


def check(base: MoESpec, mode, force: dict[str, str] | None = None, tokens: int = 16,
          max_tokens: int | None = None) -> list[str]:
    """Run one fresh case against the reference; returns the steps the runner ran."""
    need_fp8()
    seed = random.SystemRandom().randrange(1 << 30)
    spec, weights = fp8_case(base, mode, seed)
    e = errors_against_reference(spec, weights, seed, tokens, force, max_tokens)
    token_tol = TOKEN_TOL * max(1.0, TOKEN_TOL_MIN_INTER / spec.intermediate_size) ** 0.5
    assert e.rel < (REL_TOL if tokens >= AVERAGE_MIN_TOKENS else token_tol) and e.per_token < token_tol, \
        f"rel {e.rel:.4f} (bound {REL_TOL}), worst token {e.per_token:.4f} (bound {token_tol:.4f}), seed {seed}, " \
        f"steps {e.steps}"
    return e.steps


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("force", QUANT_FORCES, ids=QUANT_FORCE_IDS)
@pytest.mark.parametrize("tokens", [1, 255, 256, 257])
def test_every_mode_and_fusion(mode, force, tokens: int) -> None:
    check(BASE, mode, force, tokens)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("tokens", [1, 8, 16, 64, 600])
def test_gated_epilogue_where_planned(mode, tokens: int) -> None:
    """On sm90 rowwise layers run the activation in GEMM1's epilogue; with a static scale that epilogue writes GEMM2's
    FP8 input (every count), else GEMM2 quantizes its input itself where it runs the decode kernel (1 and 8 tokens: 1
    row per expert, tactics.fp8.FP8_FINALIZE_DECODE_MAX_AVG_ROWS) and the quantize kernel runs before the wgmma tiles
    (16: 2 rows, 64 and 600); block-128 ones in GEMM1's decode band (1 to 16 tokens: 2 to 32 rows) with GEMM2
    quantizing its input, on GEMM1's pingpong 64x128 tile (64 tokens: 8 rows) on the gate/up halves with the quantize
    kernel after it, and not on its coop 128x128 tile (600: 75 rows), where the activation kernel runs."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 gated epilogue is planned for the sm90 GEMMs")
    steps = check(BASE.with_overrides(num_experts=16), mode, tokens=tokens, max_tokens=600)
    block = mode[0] is Quant.FP8_BLOCK
    in_gemm1 = mode[2] is ActScale.STATIC
    gated = not in_gemm1 and (tokens < 600 or not block)
    gemm2_decode = tokens <= 16 if block else tokens * BASE.top_k <= 16
    in_gemm2 = gated and gemm2_decode
    assert ("gemm1:fp8_gated_quantized" in steps) == in_gemm1, steps
    assert ("gemm1:fp8_gated" in steps) == gated and (QUANTIZING_GEMM2 in steps) == in_gemm2, steps
    assert ("fc2_input_quant:separate" in steps) == (gated and not in_gemm2), steps
    assert ("fc1_activation:fp8" in steps) == (not in_gemm1 and not gated), steps


@pytest.mark.parametrize("mode", MODES[:3], ids=MODE_IDS[:3])
@pytest.mark.parametrize("k_split", [1, 8])
@pytest.mark.parametrize("tokens,inter", [(1, 512), (64, 512), (255, 400), (64, 2880)])
def test_gemm2_quantizing_its_input(mode, k_split: int, tokens: int, inter: int) -> None:
    """fc2_input_quant=gemm2 forced with a decode GEMM2 at every count, rowwise modes: chunks of 1 to 8 rows (64
    tokens top-2 over 16 experts: 8 a chunk), intermediate sizes on and off multiples of 128, and 2880 (GPT-OSS-20B's,
    whose 8-row chunks read rows past the first pass's registers again)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 gated epilogue, whose rows GEMM2 quantizes, is planned for the sm90 GEMMs")
    force = {"fc2_input_quant": "gemm2", "gemm2_tactic": f"decode:ksplit{k_split}:after_trigger:plain"}
    steps = check(BASE.with_overrides(num_experts=16, intermediate_size=inter), mode, force, tokens)
    assert steps[-2:] == ["gemm1:fp8_gated", QUANTIZING_GEMM2], steps


@pytest.mark.parametrize("tokens", [1, 3, 31])
@pytest.mark.parametrize("inter", [512, 400, 2880])
def test_block128_gated_gemm1_and_quantizing_gemm2(tokens: int, inter: int) -> None:
    """Block-128 layers in GEMM1's decode band as planned (up to 62 rows over 16 experts: chunks of 1 to 8 rows):
    GEMM1's gated epilogue on W1 stacked, then GEMM2 quantizing its input per 128-column group, intermediate sizes on
    and off multiples of 128 (2880: GPT-OSS-20B's, whose gate and up rows share a scale block)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP8 gated epilogue is planned for the sm90 GEMMs")
    steps = check(BASE.with_overrides(num_experts=16, intermediate_size=inter), MODES[3], tokens=tokens)
    assert steps[-2:] == ["gemm1:fp8_gated", QUANTIZING_GEMM2], steps


@pytest.mark.parametrize("tokens", [9, 31])
def test_block128_decode_at_two_ctas_an_sm(tokens: int) -> None:
    """Block-128 layers whose decode launches have more CTAs than SMs run the decode kernel held to two CTAs an SM
    (tactics.fp8.fp8_block_decode_tile_rule; 64 experts of I 1024: GEMM1's 16 column blocks a touched expert, 18 and 62
    touched experts: 288 and 992 CTAs)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the twocta decode tile is planned for the sm90 GEMMs")
    from moe_build.planner import make_plan
    from moe_build.target import Flavour, Target
    base = BASE.with_overrides(num_experts=64, intermediate_size=1024)
    plan = make_plan(base.with_overrides(quant=Quant.FP8_BLOCK), Target(sm=90, flavour=Flavour.TENSORRT), tokens)
    assert plan.choices(tokens)["gemm1_tactic"].startswith("decode:twocta_"), plan.choices(tokens)
    check(base, MODES[3], tokens=tokens)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("finalize", ["fused", "separate"])
@pytest.mark.parametrize("tokens", [1, 64, 600])
def test_finalize_fused_and_forced_separate(mode, finalize: str, tokens: int) -> None:
    """The same layer with the finalize in GEMM2's epilogue (the sm90 default here) and forced separate (what
    the bench's forced-off column runs); the fused one needs the wgmma kernel's device (sm90: the finalize
    gates' TMA warp-specialized GEMM), the separate one runs on any FP8 device. The same bounds hold for both:
    the epilogue's atomics add at most top_k bf16 roundings (2^-9 relative each) per element over the separate
    kernel's single rounding of its fp32 sum."""
    if finalize == "fused" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the fused FP8 finalize is planned for the sm90 GEMMs")
    steps = check(BASE.with_overrides(num_experts=16, expert_bias=True), mode, {"finalize": finalize}, tokens)
    assert (bool({FUSED_GEMM2, QUANTIZING_GEMM2} & set(steps)) if finalize == "fused" else SEPARATE_GEMM2 in steps), \
        steps


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_finalize_fused_at_every_count_in_one_runner(mode) -> None:
    """64 experts, top-2, intermediate 512: the plan fuses the finalize at every count (rules.
    FINALIZE_ALWAYS_FUSED_QUANTS; a 16-bit layer of this shape is separate at 17-128 tokens), on the decode kernel
    and the wgmma tiles; one runner made for 600 tokens."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the fused FP8 finalize is planned for the sm90 GEMMs")
    base = BASE.with_overrides(num_experts=64)
    for tokens in (16, 64, 600):
        assert {FUSED_GEMM2, QUANTIZING_GEMM2} & set(check(base, mode, tokens=tokens, max_tokens=600)), tokens


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_many_tokens(mode) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=4), mode, tokens=8192)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("activation", list(Activation), ids=[a.value for a in Activation])
def test_all_activations(mode, activation: Activation) -> None:
    check(BASE.with_overrides(activation=activation), mode, tokens=64)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 6, 8])
def test_top_k(mode, top_k: int) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=top_k), mode, tokens=64)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("experts,tokens", [(8, 1), (64, 257), (128, 256), (256, 1024)])
def test_expert_counts(mode, experts: int, tokens: int) -> None:
    check(BASE.with_overrides(num_experts=experts, top_k=8), mode, tokens=tokens)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("hidden,inter", [(128, 192), (208, 336), (384, 128), (2048, 768)])
@pytest.mark.parametrize("tokens", [3, 600])
def test_sizes_on_and_off_multiples_of_128(mode, hidden: int, inter: int, tokens: int) -> None:
    check(BASE.with_overrides(hidden_size=hidden, intermediate_size=inter), mode, tokens=tokens)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("routing", [
    Routing(RoutingMethod.TOPK_SOFTMAX),
    Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=4, topk_groups=2, routed_scaling_factor=2.5,
            correction_bias=True)], ids=["topk_softmax", "sigmoid_grouped"])
def test_routing_methods(mode, routing: Routing) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=4, routing=routing), mode, tokens=100)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_expert_bias_fp16_and_clamped_swiglu(mode) -> None:
    spec = BASE.with_overrides(expert_bias=True, dtype=DType.FP16, activation=Activation.SWIGLU_CLAMP)
    check(spec, mode, tokens=40)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_cuda_graph_replay_equals_eager(mode) -> None:
    need_fp8()
    spec, weights = fp8_case(BASE, mode, 3)
    assert_graph_replay_equals_eager(spec, weights)
