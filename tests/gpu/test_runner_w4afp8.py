"""The fused runner on W4AFP8 layers (int4 weights, FP8 e4m3 activations, AWQ pre-quant scales: ModelOpt's W4A8_AWQ,
and compressed-tensors' W4AFP8 without pre-quant scales) against the fp64 reference, on a GPU.

The reference (moe_build.reference) dequantizes the int4 weights exactly, multiplies each GEMM's input by its AWQ
pre-quant scale in fp64 and quantizes the product to e4m3 by moe_build/weights/fp8.py's rule (the static input
scale, else per row). GEMM1's e4m3 values are the reference's bit for bit (the runner's fp32 product of a bf16 value
and an fp32 scale is the exact product rounded once to fp32, which is what quantize_rows makes of the reference's
fp64 product; tests/gpu/test_fp8_quantize.py checks those bytes). The layer runs W4A16's GEMMs (decode, digits and
mixed-input wgmma tiles) on 16-bit rows: the expansion and the activation write each e4m3 value times its scale
rounded to bf16 / fp16 (2^-9 relative). Past that the runner rounds: each dequantized weight
to bf16 / fp16 (2^-9 relative), GEMM1's output and the activation to the 16-bit type before GEMM2's input is
quantized, so an element of GEMM2's input near an e4m3 rounding boundary can land one e4m3 step (2^-3 relative)
from the reference's, and the output is rounded once more. A torch emulation of exactly those roundings on a CPU
differed from the reference by 1.3-2.0% (relative L2 over 64 tokens' output) and at most 3.9% on one token (H
128-2048, I 192-768, top-k 1-8, static and dynamic scales, with and without AWQ scales and zero points, swiglu and
gelu), so the bounds are twice that: 4% over the output, 8% per token (an output of fewer than 16 tokens is held to
the per-token bound only: 4% bounds an average). The fusions and their unfused alternatives compute the same bytes
(the pre-quant scale applied by the same fp32 multiply before the same quantization), so their outputs must be
equal bit for bit with the deterministic finalize. Every output element must be written (outputs poisoned with NaN),
fresh random data per case, routing pinned by giving both sides the same logits.
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from runner_against_reference import (assert_graph_replay_equals_eager, device_target, errors_against_reference,
                                      torch_dtype)

from moe_build.runner import sequence as S
from moe_build.spec import ActScale, Activation, DType, MoESpec, Quant, Routing, RoutingMethod
from moe_build.weights import MoEWeights
from moe_build.weights.woq import WoqKind

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

REL_TOL, TOKEN_TOL = 0.04, 0.08
AVERAGE_MIN_TOKENS = 16
# (group size, zero points, AWQ pre-quant scales, static input scales): ModelOpt W4A8_AWQ (group 128, static), the
# same at groups 64 / 32 with zero points or per-row scales, compressed-tensors W4AFP8 (no AWQ scales, per-token FP8
# activations, with and without zero points)
MODES = [(128, False, True, True), (64, True, True, True), (32, False, True, False), (128, True, False, False),
         (64, False, False, True)]
MODE_IDS = ["g128_awq_static", "g64_zeros_awq_static", "g32_awq_dynamic", "g128_zeros_dynamic", "g64_static"]
# the pre-quant fusions (expand_rows=prequant_fused, fc2_prequant=fused) and their unfused alternatives
FORCES = [{}, {"expand_rows": "plain"}, {"fc2_prequant": "separate"},
          {"expand_rows": "plain", "fc2_prequant": "separate", "routing_prologue": "three_step"}]
FORCE_IDS = ["fused", "expand_plain", "fc2_separate", "both_unfused_three_step"]
BASE = MoESpec(256, 512, 8, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True))
# Static input scales for unit-variance tokens: GEMM1's input up to ~4.5 sigma times a pre-quant scale below 2 (AWQ
# scales here are in [0.5, 2)), the activation's up to ~3 (times one below 2), saturating above as calibrated ones do.
STATIC = {True: (6.0 / 448, 4.0 / 448), False: (4.5 / 448, 3.0 / 448)}


def need_fp8() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("W4AFP8 layers need compute capability 8.9 or later (the plan's plugin_fp8_sm gate)")


def w4afp8_case(base: MoESpec, mode: tuple, seed: int) -> tuple[MoESpec, MoEWeights]:
    """A W4AFP8 layer of `base`'s shape: random float weights quantized to int4 round-to-nearest, random AWQ
    pre-quant scales where the mode has them, the static input scales above where it has those."""
    group, zeros, awq, static = mode
    weights = MoEWeights.random(base, seed=seed).quantized_woq(WoqKind.INT4, group, asymmetric=zeros, awq=awq,
                                                               seed=seed)
    if static:
        a1, a2 = STATIC[awq]
        woq = dataclasses.replace(weights.woq, a1_scale=torch.tensor(a1), a2_scale=torch.tensor(a2))
        weights = dataclasses.replace(weights, woq=woq)
    spec = base.with_overrides(quant=Quant.W4AFP8, quant_group_size=group,
                               act_scale=ActScale.STATIC if static else ActScale.DYNAMIC, **weights.woq.storage_flags())
    return spec, weights


def check(base: MoESpec, mode: tuple, force: dict[str, str] | None = None, tokens: int = 16,
          max_tokens: int | None = None) -> None:
    need_fp8()
    seed = random.SystemRandom().randrange(1 << 30)
    spec, weights = w4afp8_case(base, mode, seed)
    e = errors_against_reference(spec, weights, seed, tokens, force, max_tokens)
    where = f"seed {seed}, steps {e.steps}"
    assert e.per_token < TOKEN_TOL, f"worst token {e.per_token:.4f} (bound {TOKEN_TOL}), {where}"
    if tokens >= AVERAGE_MIN_TOKENS:
        assert e.rel < REL_TOL, f"rel {e.rel:.4f} (bound {REL_TOL}), {where}"


def applies(mode: tuple, force: dict[str, str]) -> bool:
    """The FC2 pre-quant stage exists with AWQ scales only."""
    return mode[2] or "fc2_prequant" not in force


# and the finalize both ways (the plan fuses it into the decode GEMM2 at 1 token here, separate from 255; forced fused,
# GEMM2 stays on decode): a fused and a separate finalize round differently, so not among FORCES' bit-equal variants
FINALIZE_FORCES = [({"finalize": "separate"}, "finalize_separate"), ({"finalize": "fused"}, "finalize_fused")]
FORCED = [pytest.param(m, f, id=f"{mid}-{fid}") for m, mid in zip(MODES, MODE_IDS)
          for f, fid in [*zip(FORCES, FORCE_IDS), *FINALIZE_FORCES] if applies(m, f)]


@pytest.mark.parametrize("mode", [MODES[0], MODES[2]], ids=[MODE_IDS[0], MODE_IDS[2]])
def test_the_plan_runs_the_fused_prequant_expansion_and_its_alternative(mode: tuple) -> None:
    """What the plan says is what runs: the matrix's pre-quant expansion and FC2 fusion by default, the plain
    expansion plus a quantize step, and the activation plus one, when forced off; with static and with per-row
    scales, rows dequantized to 16 bits for W4A16's GEMMs."""
    need_fp8()
    from moe_build.runner import MoERunner
    spec, weights = w4afp8_case(BASE, mode, 0)
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=16).kernel_sequence(16)
    assert steps[3:] == ["expand_rows:fp8_dequantized+zero_output", "gemm1:woq", "fc1_activation:fp8_dequantized",
                         "gemm2:woq_finalize"]
    forced = MoERunner(spec, weights, target=device_target(), max_tokens=16,
                       force={"expand_rows": "plain", "fc2_prequant": "separate"}).kernel_sequence(16)
    assert forced[3:] == ["expand_rows:16bit+zero_output", "fc1_prequant:fp8_dequantized", "gemm1:woq",
                          "fc1_activation", "fc2_prequant:fp8_dequantized", "gemm2:woq_finalize"]


MMA_TILES = {"gemm1_tactic": "mma:128x128:plain:plain", "gemm2_tactic": "mma:128x128:plain:plain",
             "finalize": "separate"}
# the mixed-input kernel takes groups of 64 and 128 and per-row weight scales, not groups of 32
WGMMA_MODES = [m for m in MODES if m[0] != 32]
WGMMA_IDS = [i for m, i in zip(MODES, MODE_IDS) if m[0] != 32]


@pytest.mark.parametrize("mode", WGMMA_MODES, ids=WGMMA_IDS)
@pytest.mark.parametrize("tokens", [255, 600, 3000])
def test_mixed_input_kernel_past_the_decode_band(mode: tuple, tokens: int) -> None:
    """Static and per-row input scales: both GEMMs on the mixed-input wgmma kernel (GEMM2 with the finalize in its
    epilogue where the plan fuses it), on the rows the expansion and the activation write dequantized, against the
    reference; the mma tiles (on the same 16-bit rows, the finalize separate), forced, against it too."""
    need_fp8()
    from moe_build.runner import MoERunner
    spec, weights = w4afp8_case(BASE, mode, tokens)
    steps = MoERunner(spec, weights, target=device_target(), max_tokens=tokens).kernel_sequence(tokens)
    assert S.GEMM1_WOQ_WGMMA_STEPS & set(steps) and {"gemm2:woq_wgmma", "gemm2:woq_wgmma_finalize"} & set(steps), steps
    assert any(s.startswith("expand_rows:fp8_dequantized") for s in steps), steps
    check(BASE, mode, tokens=tokens)
    check(BASE, mode, MMA_TILES, tokens=tokens)


# static input scales, with and without AWQ scales and zero points: GEMM1's gated epilogue past the decode band
GATED_MODES = [m for m in WGMMA_MODES if m[3]]
GATED_IDS = [i for m, i in zip(WGMMA_MODES, WGMMA_IDS) if m[3]]


@pytest.mark.parametrize("mode", GATED_MODES, ids=GATED_IDS)
@pytest.mark.parametrize("tokens", [600, 3000])
def test_gated_epilogue_writes_gemm2_input_where_planned(mode: tuple, tokens: int) -> None:
    """Static input scales: the mixed-input GEMM1 runs the gated activation in its epilogue and stores GEMM2's input
    there as the activation step would (the FC2 pre-quant scale and the e4m3 quantization by the static scale,
    dequantized), with the FC2 scale forced out of it (the plain epilogue, then the step that scales and quantizes), and
    with the activation forced back into its own kernel (W1 then stacked); and the same runner at 16 tokens, where its
    activation step reads GEMM1's output in W1's interleaved order: each against the reference."""
    need_fp8()
    from moe_build.runner import MoERunner
    spec, weights = w4afp8_case(BASE, mode, tokens)
    runner = MoERunner(spec, weights, target=device_target(), max_tokens=tokens)
    gated = ("gemm1:woq_wgmma_gated_fc2_prequant_fp8_dequantized" if mode[2]
             else "gemm1:woq_wgmma_gated_fp8_dequantized")
    assert gated in runner.kernel_sequence(tokens), runner.kernel_sequence(tokens)
    assert runner.plan.stage("w1_order").choice == "gate_up_interleaved"
    check(BASE, mode, tokens=tokens)
    if mode[2]:
        forced = MoERunner(spec, weights, target=device_target(), max_tokens=tokens, force={"fc2_prequant": "separate"})
        assert {"gemm1:woq_wgmma_gated", "fc2_prequant:fp8_dequantized"} <= set(forced.kernel_sequence(tokens))
        check(BASE, mode, {"fc2_prequant": "separate"}, tokens=tokens)
    separate = MoERunner(spec, weights, target=device_target(), max_tokens=tokens, force={"fc1_activation": "separate"})
    assert "fc1_activation:fp8_dequantized" in separate.kernel_sequence(tokens), separate.kernel_sequence(tokens)
    check(BASE, mode, {"fc1_activation": "separate"}, tokens=tokens)
    assert "fc1_activation:fp8_dequantized" in runner.kernel_sequence(16), runner.kernel_sequence(16)
    check(BASE, mode, tokens=16, max_tokens=tokens)


@pytest.mark.parametrize("mode", GATED_MODES[:2], ids=GATED_IDS[:2])
def test_digits_tile_reads_w1_interleaved(mode: tuple) -> None:
    """A runner planned to 3000 tokens holds W1 interleaved (its gated epilogue's band), so at 1 token its digits tile
    reads token digits that the activation makes from GEMM1's output in that order: against the reference."""
    need_fp8()
    from moe_build.runner import MoERunner
    base = BASE.with_overrides(num_experts=64, top_k=6)
    spec, weights = w4afp8_case(base, mode, 1)
    runner = MoERunner(spec, weights, target=device_target(), max_tokens=3000)
    assert runner.plan.stage("w1_order").choice == "gate_up_interleaved"
    assert "gemm2:woq_digits_finalize" in runner.kernel_sequence(1) or "gemm2:woq_digits" in runner.kernel_sequence(1)
    check(base, mode, tokens=1, max_tokens=3000)


DIGITS_FORCES = [({}, "plan"), ({"token_digits": "separate"}, "digits_separate"), ({"expand_rows": "plain"},
                 "expand_plain"), ({"fc2_prequant": "separate"}, "fc2_separate"),
                 ({"token_digits": "fused"}, "digits_fused"),
                 ({"token_digits": "fused", "expand_rows": "plain"}, "digits_fused_expand_plain")]
# the digits tile takes groups of 64 and 128 and per-row weight scales; per-row input scales make their token digits by
# steps of their own (rules.digits_row_scale_pays) or, forced fused, in the rows' writers as static ones do
DIGITS_CASES = [pytest.param(m, f, id=f"{mid}-{fid}") for m, mid in zip(WGMMA_MODES, WGMMA_IDS)
                for f, fid in DIGITS_FORCES if applies(m, f)]


@pytest.mark.parametrize("mode, force", DIGITS_CASES)
@pytest.mark.parametrize("tokens", [1, 2, 16])
def test_the_digits_tile(mode: tuple, force: dict[str, str], tokens: int) -> None:
    """Small experts at decode: W4A16's digits tile on the token digits of the dequantized rows, made by the
    expansion and the activation (or by the quantize step after a plain expansion) with a static scale or, forced,
    each row's own, or by digits steps (forced, with the FC2 scale forced out of the activation, or the plan's with
    per-row scales); against the reference."""
    need_fp8()
    from moe_build.runner import MoERunner
    base = BASE.with_overrides(num_experts=64, top_k=6)
    spec, weights = w4afp8_case(base, mode, tokens)
    runner = MoERunner(spec, weights, target=device_target(), max_tokens=tokens, force=force)
    assert "gemm1:woq_digits" in runner.kernel_sequence(tokens), runner.kernel_sequence(tokens)
    check(base, mode, force, tokens=tokens)


PER_ROW_MODES = [m for m in WGMMA_MODES if not m[3]]
PER_ROW_IDS = [i for m, i in zip(WGMMA_MODES, WGMMA_IDS) if not m[3]]


@pytest.mark.parametrize("mode", PER_ROW_MODES, ids=PER_ROW_IDS)
@pytest.mark.parametrize("tokens", [1, 2, 16])
def test_per_row_token_digits_made_by_the_writers_equal_the_steps_bit_for_bit(mode: tuple, tokens: int) -> None:
    """Per-row input scales on the digits tile: the token digits made by the expansion and the activation (forced
    fused: a block per row) and by digits steps after the 16-bit rows (the plan's) feed the GEMMs the same bytes, so
    with the deterministic finalize the outputs are equal."""
    need_fp8()
    from moe_build.runner import MoERunner
    base = BASE.with_overrides(num_experts=64, top_k=6)
    spec, weights = w4afp8_case(base, mode, tokens)
    target = device_target(deterministic=True)
    hidden = torch.randn(tokens, spec.hidden_size, device="cuda").to(torch_dtype(spec))
    logits = torch.randn(tokens, spec.num_experts, device="cuda")
    runners = {f: MoERunner(spec, weights, target=target, max_tokens=tokens, force={"token_digits": f})
               for f in ("fused", "separate")}
    steps = runners["fused"].kernel_sequence(tokens)
    assert any(s.startswith("expand_rows:fp8_dequantized_digits") for s in steps) and "gemm1:woq_digits" in steps, steps
    outs = {f: r(hidden, router_logits=logits) for f, r in runners.items()}
    assert torch.equal(outs["fused"], outs["separate"]), "fused per-row token digits differ from the digits steps'"


@pytest.mark.parametrize("mode", MODES[:1] + MODES[2:4], ids=MODE_IDS[:1] + MODE_IDS[2:4])
@pytest.mark.parametrize("tokens", [1, 200, 3000])
def test_fusions_equal_their_unfused_alternatives_bit_for_bit(mode: tuple, tokens: int) -> None:
    """The fused pre-quant steps and the unfused ones feed the GEMMs the same dequantized rows: with the
    deterministic finalize the outputs are equal (every tactic alike)."""
    need_fp8()
    from moe_build.runner import MoERunner
    spec, weights = w4afp8_case(BASE, mode, tokens)
    target = device_target(deterministic=True)
    hidden = torch.randn(tokens, spec.hidden_size, device="cuda").to(torch_dtype(spec))
    logits = torch.randn(tokens, spec.num_experts, device="cuda")
    outs = [MoERunner(spec, weights, target=target, max_tokens=tokens, force=f)(hidden, router_logits=logits)
            for f in FORCES if applies(mode, f)]
    for f, out in zip([f for f in FORCES if applies(mode, f)][1:], outs[1:]):
        assert torch.equal(out, outs[0]), f"forced {f} differs from the fused plan"


@pytest.mark.parametrize("mode, force", FORCED)
@pytest.mark.parametrize("tokens", [1, 255, 256, 257])
def test_every_mode_and_fusion(mode: tuple, force: dict[str, str], tokens: int) -> None:
    check(BASE, mode, force, tokens)


@pytest.mark.parametrize("force", FORCES[:2], ids=FORCE_IDS[:2])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_many_tokens(mode: tuple, force: dict[str, str]) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=4), mode, force, tokens=8192)


@pytest.mark.parametrize("mode", [MODES[0], MODES[3]], ids=[MODE_IDS[0], MODE_IDS[3]])
@pytest.mark.parametrize("activation", list(Activation), ids=[a.value for a in Activation])
def test_all_activations(mode: tuple, activation: Activation) -> None:
    """Non-gated activations take fc2_prequant=separate (the matrix fuses the FC2 scale into gated ones only)."""
    check(BASE.with_overrides(activation=activation), mode, tokens=64)


@pytest.mark.parametrize("mode", MODES[:1] + MODES[2:4], ids=MODE_IDS[:1] + MODE_IDS[2:4])
@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 6, 8])
def test_top_k(mode: tuple, top_k: int) -> None:
    check(BASE.with_overrides(num_experts=16, top_k=top_k), mode, tokens=64)


@pytest.mark.parametrize("mode", MODES[:1] + MODES[3:4], ids=MODE_IDS[:1] + MODE_IDS[3:4])
@pytest.mark.parametrize("experts,tokens", [(8, 1), (64, 257), (128, 256), (256, 1024)])
def test_expert_counts(mode: tuple, experts: int, tokens: int) -> None:
    check(BASE.with_overrides(num_experts=experts, top_k=8), mode, tokens=tokens)


SIZES = [(128, 192), (384, 128), (640, 384), (192, 320), (2048, 768)]
# every mode at every size its group divides (a group of columns must divide both GEMMs' K, as in any checkpoint)
SIZED = [pytest.param(m, h, i, id=f"{mid}-{h}-{i}") for m, mid in zip(MODES, MODE_IDS) for h, i in SIZES
         if h % m[0] == 0 and i % m[0] == 0]


@pytest.mark.parametrize("mode, hidden, inter", SIZED)
@pytest.mark.parametrize("tokens", [3, 600])
def test_sizes_on_and_off_multiples_of_128(mode: tuple, hidden: int, inter: int, tokens: int) -> None:
    check(BASE.with_overrides(hidden_size=hidden, intermediate_size=inter), mode, tokens=tokens)


@pytest.mark.parametrize("force", FORCES[:3], ids=FORCE_IDS[:3])
@pytest.mark.parametrize("mode", MODES[:2], ids=MODE_IDS[:2])
def test_expert_bias_fp16_and_clamped_swiglu(mode: tuple, force: dict[str, str]) -> None:
    spec = BASE.with_overrides(expert_bias=True, dtype=DType.FP16, activation=Activation.SWIGLU_CLAMP)
    check(spec, mode, force, tokens=40)


def test_cuda_graph_replay_equals_eager() -> None:
    need_fp8()
    spec, weights = w4afp8_case(BASE, MODES[0], 3)
    assert_graph_replay_equals_eager(spec, weights)
