"""What the fused runner decides without a GPU: plan -> kernel sequence, workspace sizing, refusals."""
from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from types import SimpleNamespace

import pytest
import torch

from moe_build import kernels
from moe_build.errors import MoeBuildError, UnsupportedCombination
from moe_build.planner import Plan, make_plan
from moe_build.runner import MoERunner, Workspace, kernel_sequence, layout_bytes, steps_up_to, workspace_layout
from moe_build.runner.runner import device_target, serving_target
from moe_build.runner import sequence as S
from moe_build.runner.sequence import w1_interleaved, weights_blocked
from moe_build.spec import ActScale, Activation, DType, MoESpec, Quant, SharedExperts
from moe_build.target import FINALIZE_FUSION_ENV, Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights, block_64x64, interleave_gate_up
from moe_build.weights.fp8 import ScaleGranularity
from moe_build.weights.woq import WoqKind, dequantize_matrix

H100 = Target(sm=90, flavour=Flavour.TENSORRT)
A100 = Target(sm=80, flavour=Flavour.TENSORRT)
SWIGLU = MoESpec(256, 512, 8, 2)


SWIGLU_64E = MoESpec(256, 512, 64, 2)  # finalize below intermediate size 2048: separate at 17..128 tokens


def test_default_hopper_plan_runs_tma_gemms_gated_epilogue_and_fused_finalize() -> None:
    plan = make_plan(SWIGLU_64E, H100, tokens=4096)
    assert kernel_sequence(plan, 1024) == [
        "router_gemm", "routing", "routing_prologue:three_step+zero_output", "expand_rows", "gemm1:sm90_gated",
        "gemm2:sm90_finalize"]  # 1024 tokens * top-2 over 64 experts: past 4 rows per expert, the FINALIZE tactic
    # the fused prologue (up to 256 tokens) leaves zeroing `out` for the fused finalize to the expansion
    assert kernel_sequence(plan, 129)[2:4] == ["routing_prologue:fused", "expand_rows+zero_output"]
    assert kernel_sequence(plan, 64) == [
        "router_gemm", "routing", "routing_prologue:fused", "expand_rows", "gemm1:sm90_gated", "gemm2:sm90", "finalize"]
    # up to 4 tokens the fused prologue's block routes too (the plan's routing=prologue): no routing launch
    assert kernel_sequence(plan, 4)[:3] == ["router_gemm", "routing_prologue:fused+routing", "expand_rows+zero_output"]
    assert kernel_sequence(plan, 5)[:3] == ["router_gemm", "routing", "routing_prologue:fused"]
    assert kernel_sequence(plan, 16)[-1] == "gemm2:sm90_finalize"  # 32 rows: the smallest calls fuse it again
    separate = make_plan(SWIGLU_64E, H100, tokens=16, force={"fc1_activation": "separate"})
    assert kernel_sequence(separate, 16, "topk")[2:4] == ["gemm1:sm90", "fc1_activation"]


def test_interleave_gate_up_puts_each_features_gate_and_up_eight_rows_apart() -> None:
    e, inter, h = 2, 24, 3
    w1 = torch.arange(e * 2 * inter * h, dtype=torch.float32).reshape(e, 2 * inter, h)
    got = interleave_gate_up(w1)
    for j in range(2 * inter):
        block, r = divmod(j, 16)
        src = 8 * block + r if r < 8 else inter + 8 * block + r - 8
        assert torch.equal(got[:, j], w1[:, src]), j
    assert torch.equal(interleave_gate_up(w1[..., 0]), got[..., 0])  # b1 [E, 2I] the same way
    with pytest.raises(ValueError, match="multiple of 16"):
        interleave_gate_up(torch.zeros(1, 20, 4))


@pytest.mark.parametrize("kind, group, zeros", [(WoqKind.INT4, 64, True), (WoqKind.INT8, None, False)])
def test_weight_only_w1_interleaves_with_its_scales_and_zero_points(kind: WoqKind, group: int | None,
                                                                    zeros: bool) -> None:
    """gate_up_interleaved on a weight-only layer moves W1's codes, scales, zero points and b1 together: the
    interleaved tensors dequantize (woq.dequantize_matrix, fp64) to the interleave of the stacked W1; W2 and the AWQ
    scales stay."""
    spec = dataclasses.replace(SWIGLU, expert_bias=True)
    w = MoEWeights.random(spec, seed=5).quantized_woq(kind, group, asymmetric=zeros, awq=True, seed=5)
    got = w.gate_up_interleaved()
    q, p = w.woq, got.woq
    assert got.w1 is p.w1 and p.w2 is q.w2 and p.fc2_act_scale is q.fc2_act_scale
    assert torch.equal(got.b1, interleave_gate_up(w.b1))
    for x in range(spec.num_experts):
        stacked = dequantize_matrix(kind, q.w1[x], q.w1_scale[x], None if q.w1_zero is None else q.w1_zero[x])
        inter = dequantize_matrix(kind, p.w1[x], p.w1_scale[x], None if p.w1_zero is None else p.w1_zero[x])
        assert torch.equal(inter, interleave_gate_up(stacked.unsqueeze(0))[0]), x


def test_block_64x64_stores_each_64_by_64_block_contiguously() -> None:
    """Element (r, c) of the stacked [E * n, k] rows lands at ((r // 64) * (k // 64) + c // 64) * 4096 +
    (r % 64) * 64 + c % 64 (the address MB_WEIGHTS_BLOCKED64 documents), experts included; the shape stays."""
    e, n, k = 2, 128, 192
    w = torch.arange(e * n * k, dtype=torch.float64).reshape(e, n, k)
    got = block_64x64(w)
    assert got.shape == w.shape and got.is_contiguous()
    flat, rows = got.flatten(), w.reshape(e * n, k)
    for r in (0, 1, 63, 64, 127, 128, 200, 255):
        for c in (0, 5, 63, 64, 130, 191):
            assert flat[((r // 64) * (k // 64) + c // 64) * 4096 + (r % 64) * 64 + c % 64] == rows[r, c], (r, c)
    assert torch.equal(torch.sort(flat).values, torch.sort(w.flatten()).values)  # a permutation
    with pytest.raises(ValueError, match="multiples of 64"):
        block_64x64(torch.zeros(1, 96, 128))


def _serving(max_tokens: int, base: Target = H100) -> Target:
    return serving_target(base, max_tokens)


def test_the_runners_device_target_honours_the_finalize_fusion_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner (and the sweep) plans for `resolve_target`'s full-TensorRT target of the device's SM, with the
    device's multiprocessors and L2 and the serving profile: MOE_BUILD_/TRTLLM_MOE_DISABLE_FINALIZE_FUSION
    then turns the fused finalize off in its plans as in an engine's. A given base is only re-profiled."""
    from moe_build.bench.sweep import device_sweep_target
    props = SimpleNamespace(major=9, minor=0, multi_processor_count=114, L2_cache_size=48 << 20,
                            memory_clock_rate=3_201_000, memory_bus_width=6144)  # an H200's HBM3e: 3201 MHz x 6144 bits
    asked: list[object] = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: asked.append(device) or props)
    for name in FINALIZE_FUSION_ENV:
        monkeypatch.delenv(name, raising=False)
    cuda0 = torch.device("cuda", 0)
    plain = device_target(cuda0, 4096)
    assert not plain.finalize_fusion_disabled_by_env and asked == [cuda0]
    assert (plain.sm, plain.flavour, plain.sm_count, plain.l2_bytes, plain.sm_source) == (
        90, Flavour.TENSORRT, 114, 48 << 20, "detected")
    assert 4.8e12 < plain.memory_bytes_per_s < 5.0e12  # two transfers a clock: 4.92 TB/s (its data sheet: 4.8)
    assert plain.profile == TokenProfile(1, 16, 4096) and device_target(cuda0, 8).profile == TokenProfile(1, 8, 8)
    assert make_plan(SWIGLU_64E, plain, tokens=16).choices(16)["finalize"] == "fused"
    for name in FINALIZE_FUSION_ENV:
        monkeypatch.setenv(name, "1")
        target = device_target(cuda0, 4096)
        assert target.finalize_fusion_disabled_by_env
        assert target == dataclasses.replace(plain, finalize_fusion_disabled_by_env=True)
        assert device_sweep_target(4096) == target
        assert make_plan(SWIGLU_64E, target, tokens=16).choices(16)["finalize"] == "separate"
        monkeypatch.delenv(name)
    # a torch that does not report the memory clock: the SM's default part's rate (an H100 SXM's 3.35 TB/s)
    props = SimpleNamespace(major=9, minor=0, multi_processor_count=132, L2_cache_size=50 << 20)
    assert device_target(cuda0, 16).memory_bytes_per_s == Target(sm=90, flavour=Flavour.TENSORRT).memory_bytes_per_s
    assert 3.3e12 < device_target(cuda0, 16).memory_bytes_per_s < 3.4e12
    asked.clear()
    assert device_target(cuda0, 8, H100) == serving_target(H100, 8) and not asked


def test_blocked_weights_follow_the_sm90_gemms_sizes_and_the_largest_call() -> None:
    """The weight_layout stage puts W1 / W2 in 64 x 64 blocks exactly where the plan's GEMMs are the sm90
    ones, the hidden and intermediate sizes are multiples of 64 and the profile's max tokens give 128 to
    384 rows per expert (a prefill-sized engine or runner); MoEWeights.blocked_64x64 blocks those two only."""
    # SWIGLU: tokens * top-2 / 8 experts = tokens / 4 rows per expert
    def blocked(spec: MoESpec = SWIGLU, target: Target = _serving(1024), **force: str) -> bool:
        return weights_blocked(make_plan(spec, target, tokens=16, force=force))
    assert blocked()
    assert blocked(fc1_activation="separate")
    assert not blocked(gemm_kernel="ampere")
    assert not blocked(target=_serving(1024, A100))
    assert not blocked(dataclasses.replace(SWIGLU, intermediate_size=96))
    assert not blocked(dataclasses.replace(SWIGLU, hidden_size=200))
    # 128 to 384 rows per expert: 512 to 1536 tokens; a decode-sized or larger profile stays row-major
    assert [blocked(target=_serving(t)) for t in (16, 508, 512, 1536, 1537)] == [False, False, True, True, False]
    weights = MoEWeights.random(dataclasses.replace(SWIGLU, expert_bias=True), seed=1)
    blocked_w = weights.blocked_64x64()
    assert torch.equal(blocked_w.w1, block_64x64(weights.w1)) and torch.equal(blocked_w.w2, block_64x64(weights.w2))
    assert blocked_w.b1 is weights.b1 and blocked_w.router_weight is weights.router_weight


def test_weight_layout_can_be_forced_where_the_gemms_read_it() -> None:
    """--force weight_layout=row_major holds anywhere; blocked64 wherever the sm90 GEMMs and 64-multiple
    sizes allow, whatever the rows, and is refused elsewhere naming the failing gate."""
    for max_tokens in (16, 1024):
        target = _serving(max_tokens)
        assert weights_blocked(make_plan(SWIGLU, target, 16, force={"weight_layout": "blocked64"}))
        assert not weights_blocked(make_plan(SWIGLU, target, 16, force={"weight_layout": "row_major"}))
    for spec, target, gate in ((SWIGLU, _serving(1024, A100), "blocked_gemm_kernel"),
                               (dataclasses.replace(SWIGLU, intermediate_size=96), _serving(1024), "blocked_sizes")):
        assert not weights_blocked(make_plan(spec, target, 16, force={"weight_layout": "row_major"}))
        with pytest.raises(UnsupportedCombination) as info:
            make_plan(spec, target, 16, force={"weight_layout": "blocked64"})
        assert info.value.rule == gate
    with pytest.raises(MoeBuildError, match="weight_layout.*blocked64"):
        make_plan(SWIGLU, H100, 16, force={"weight_layout": "blocked"})


def test_w1_order_follows_the_gated_epilogue() -> None:
    assert w1_interleaved(make_plan(SWIGLU, H100, 16))  # sm90: gated activation in GEMM1's epilogue
    assert not w1_interleaved(make_plan(SWIGLU, H100, 16, force={"fc1_activation": "separate"}))
    assert not w1_interleaved(make_plan(SWIGLU, A100, 16))  # the SM80 fused gated kernel reads [gate; up]
    with pytest.raises(MoeBuildError, match="w1_order"):
        make_plan(SWIGLU, H100, 16, force={"w1_order": "stacked"})


def test_routing_prologue_is_resolved_per_call_not_at_plan_tokens() -> None:
    plan = make_plan(SWIGLU, H100, tokens=4096)
    assert plan.stage("routing_prologue").choice == "three_step"
    assert "routing_prologue:fused" in kernel_sequence(plan, 256)
    assert "routing_prologue:three_step+zero_output" in kernel_sequence(plan, 257)
    small = make_plan(SWIGLU, H100, tokens=1)
    assert "routing_prologue:three_step+zero_output" in kernel_sequence(small, 8192)


def test_top_k_outside_fused_prologue_set_always_three_step() -> None:
    """Up to 4 tokens the three-step prologue's first launch routes (no routing step of its own), past them not."""
    plan = make_plan(dataclasses.replace(SWIGLU, top_k=3), H100, tokens=16)
    assert kernel_sequence(plan, 1)[:2] == ["router_gemm", "routing_prologue:three_step+routing+zero_output"]
    assert kernel_sequence(plan, 1, "logits")[0] == "routing_prologue:three_step+routing+zero_output"
    for tokens in (16, 300):
        steps = kernel_sequence(plan, tokens)
        assert steps[1] == "routing" and steps[2].startswith("routing_prologue:three_step")
        assert "+routing" not in steps[2]


def test_routing_inputs_skip_router_gemm_and_routing() -> None:
    plan = make_plan(SWIGLU, H100, tokens=16)
    assert kernel_sequence(plan, 16, "logits")[:2] == ["routing", "routing_prologue:fused"]
    assert kernel_sequence(plan, 1, "logits")[0] == "routing_prologue:fused+routing"
    assert kernel_sequence(plan, 16, "topk")[0] == "routing_prologue:fused"  # no routing, in the prologue or not
    with pytest.raises(MoeBuildError, match="routing_input"):
        kernel_sequence(plan, 16, "probs")  # type: ignore[arg-type]


def test_ampere_kernel_fuses_gated_activation_and_finalizes_separately() -> None:
    plan = make_plan(SWIGLU, A100, tokens=16)
    assert kernel_sequence(plan, 16, "topk") == [
        "routing_prologue:fused", "expand_rows", "gemm1:sm80_fused_gated", "gemm2:sm80", "finalize"]
    forced = make_plan(SWIGLU, H100, tokens=16, force={"gemm_kernel": "ampere"})
    assert "gemm1:sm80_fused_gated" in kernel_sequence(forced, 16)


def test_forced_fallbacks_change_exactly_their_step() -> None:
    sep = kernel_sequence(make_plan(SWIGLU, A100, tokens=16, force={"fc1_activation": "separate"}), 16, "topk")
    assert sep == ["routing_prologue:fused", "expand_rows", "gemm1:sm80", "fc1_activation", "gemm2:sm80", "finalize"]
    fin = kernel_sequence(make_plan(SWIGLU, H100, tokens=16, force={"finalize": "separate"}), 16, "topk")
    # Only the fused finalize accumulates into `out`, so only it has the expansion (or the three-step
    # map build) zero it.
    assert fin[-2:] == ["gemm2:sm90", "finalize"] and "expand_rows" in fin and "expand_rows+zero_output" not in fin
    fin_three = kernel_sequence(make_plan(SWIGLU, H100, tokens=4096, force={"finalize": "separate"}), 4096, "topk")
    assert fin_three[:2] == ["routing_prologue:three_step", "expand_rows"]
    three = kernel_sequence(make_plan(SWIGLU_64E, H100, tokens=16, force={"routing_prologue": "three_step"}), 64)
    assert three[1:4] == ["routing", "routing_prologue:three_step", "expand_rows"]  # 64 tokens: separate finalize
    # (no zeroing); the routing runs in the fused prologue only


def test_non_gated_activation_uses_the_ampere_epilogue() -> None:
    spec = dataclasses.replace(SWIGLU, activation=Activation.RELU)
    assert "gemm1:sm80_act" in kernel_sequence(make_plan(spec, A100, tokens=16), 16)
    assert kernel_sequence(make_plan(spec, H100, tokens=16), 16, "topk")[2:4] == ["gemm1:sm90", "fc1_activation"]


def test_unaligned_sizes_lose_fused_gated_but_still_run() -> None:
    spec = MoESpec(200, 300, 8, 2)
    assert "gemm1:sm80" in kernel_sequence(make_plan(spec, A100, tokens=16), 16)


def test_shared_experts_are_added_last() -> None:
    spec = dataclasses.replace(SWIGLU, shared=SharedExperts(count=1, intermediate_size=128))
    assert kernel_sequence(make_plan(spec, H100, tokens=16), 16)[-1] == "shared_experts"


def test_forcing_a_fusion_whose_gate_fails_is_refused_by_the_planner() -> None:
    with pytest.raises(UnsupportedCombination):
        make_plan(SWIGLU, H100, tokens=4096, force={"routing_prologue": "fused"})
    with pytest.raises(UnsupportedCombination):
        make_plan(SWIGLU, A100, tokens=16, force={"finalize": "fused"})


def test_plans_without_runner_kernels_are_refused() -> None:
    rtx = Target(sm=89, flavour=Flavour.TENSORRT_RTX)
    with pytest.raises(MoeBuildError, match="plugin-path"):
        kernel_sequence(make_plan(SWIGLU, rtx, tokens=16), 16)
    spec = dataclasses.replace(SWIGLU, quant=Quant.NVFP4)  # no NVFP4 kernels, and none for an SM past 9.0
    for sm, layer in ((100, spec), (100, SWIGLU), (120, SWIGLU)):
        with pytest.raises(MoeBuildError, match=rf"^sm: moe-build's CUDA kernels are built for SM 8.x and 9.0; "
                                                rf"sm{sm} has none yet"):
            kernel_sequence(make_plan(layer, Target(sm=sm, flavour=Flavour.TENSORRT), tokens=16), 16)
    nvfp4_plan = make_plan(spec, Target(sm=100, flavour=Flavour.TENSORRT), tokens=16)
    made = nvfp4_plan.to_dict()  # its target and the path gate that reads it, as if planned for an H100
    gates = [{**g, "value": 90, "held": True} if g["name"] == "plugin_kernels_sm" else g for g in made["path_gates"]]
    nvfp4_on_h100 = Plan.from_dict({**made, "target": {**nvfp4_plan.target, "sm": 90}, "path_gates": gates})
    with pytest.raises(MoeBuildError, match="^quant: the runner has no nvfp4 kernels"):  # a plan made elsewhere
        kernel_sequence(nvfp4_on_h100, 16)
    fp8_hidden = dataclasses.replace(SWIGLU, quant=Quant.W4AFP8, fp8_input=True)  # the gate's other side
    plan = make_plan(fp8_hidden, H100, tokens=16)
    assert plan.stage("expand_rows").choice == "plain"
    with pytest.raises(MoeBuildError, match=r"^fp8_input: .*FP8 hidden states have no kernels \(allowed: false\)$"):
        kernel_sequence(plan, 16)


# W4AFP8: the pre-quant fusions writing the FP8 quantizations dequantized to 16 bits, W4A16's GEMMs
W4AFP8_DEQUANTIZED_STEPS = {
    ("prequant_fused", "fused"): ["expand_rows:fp8_dequantized", "gemm1:woq", "fc1_activation:fp8_dequantized"],
    ("plain", "fused"): ["expand_rows:16bit", "fc1_prequant:fp8_dequantized", "gemm1:woq",
                         "fc1_activation:fp8_dequantized"],
    ("prequant_fused", "separate"): ["expand_rows:fp8_dequantized", "gemm1:woq", "fc1_activation",
                                     "fc2_prequant:fp8_dequantized"],
    ("plain", "separate"): ["expand_rows:16bit", "fc1_prequant:fp8_dequantized", "gemm1:woq", "fc1_activation",
                            "fc2_prequant:fp8_dequantized"],
}


# ... and with a static input scale, past the decode band, GEMM1's gated epilogue on the mixed-input tiles: the FC2
# pre-quant scale and the quantization in it, or (fc2_prequant=separate) the plain epilogue and the step after it
W4AFP8_GATED_STEPS = {"fused": ["gemm1:woq_wgmma_gated_fc2_prequant_fp8_dequantized"],
                      "separate": ["gemm1:woq_wgmma_gated", "fc2_prequant:fp8_dequantized"]}


@pytest.mark.parametrize("act_scale", [ActScale.STATIC, ActScale.DYNAMIC])
@pytest.mark.parametrize("expand, fc2", list(W4AFP8_DEQUANTIZED_STEPS))
def test_w4afp8_runs_the_weight_only_steps_on_dequantized_rows(expand: str, fc2: str, act_scale: ActScale) -> None:
    """W4AFP8 (ModelOpt's W4A8_AWQ with static input scales, compressed-tensors' W4AFP8 with each row's dynamic one):
    by default the matrix fuses the FC1 pre-quant scale into the expansion (gates expand_w4afp8_not_fp8_input,
    expand_prequant_not_block_scaled) and the FC2 one into the gated activation (use_awq, gated); the expansion and
    the activation (or, forced off, the quantize steps after the plain ones) write the FP8 quantizations dequantized
    to 16 bits into W4A16's buffers, and the GEMMs are W4A16's with its tactics: decode, then the mixed-input wgmma
    tiles. No e4m3 buffers."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.W4AFP8, act_scale=act_scale, quant_prequant_scales=True)
    force = {k: v for k, v in (("expand_rows", expand), ("fc2_prequant", fc2)) if v not in ("prequant_fused", "fused")}
    plan = make_plan(spec, H100, tokens=16, force={**force, "finalize": "separate"})
    assert (plan.stage("expand_rows").choice, plan.stage("fc2_prequant").choice) == (expand, fc2)
    if not force:
        assert {g.name for g in plan.stage("expand_rows").gates if g.held} >= {
            "expand_w4afp8_not_fp8_input", "expand_prequant_not_block_scaled"}
        scale = "its static scale" if act_scale is ActScale.STATIC else "each row's dynamic scale"
        assert f"quantized to FP8 ({scale}) where expand_rows says" in plan.stage("fc1_input_quant").summary
    steps = kernel_sequence(plan, 16)
    assert steps[2:] == ["routing_prologue:fused", *W4AFP8_DEQUANTIZED_STEPS[expand, fc2], "gemm2:woq", "finalize"]
    wide = [x.replace("gemm1:woq", "gemm1:woq_wgmma") for x in W4AFP8_DEQUANTIZED_STEPS[expand, fc2]]
    if act_scale is ActScale.STATIC:  # the mixed-input GEMM1's gated epilogue writes GEMM2's dequantized input
        wide = wide[:wide.index("gemm1:woq_wgmma")] + W4AFP8_GATED_STEPS[fc2]
    assert kernel_sequence(plan, 4096)[2:] == ["routing_prologue:three_step", *wide, "gemm2:woq_wgmma", "finalize"]
    assert plan.choices(4096)["fc1_activation"] == ("gated_epilogue" if act_scale is ActScale.STATIC else "separate")
    assert plan.stage("w1_order").choice == ("gate_up_interleaved" if act_scale is ActScale.STATIC else "stacked")
    for tokens in (16, 4096):
        assert plan.choices(tokens)["gemm1_tactic"].split(":")[0] == ("decode" if tokens == 16 else "wgmma")
    layout = workspace_layout(spec, steps_up_to(plan, 4096), 4096)
    assert layout["permuted_input"].dtype == layout["fc1_act"].dtype == torch.bfloat16
    assert not {"permuted_input_scales", "fc2_input", "fc2_input_scales"} & set(layout)
    assert ("expanded_input" in layout) == (expand == "plain")


def test_w4afp8_makes_token_digits_where_it_quantizes() -> None:
    """On the digits tile (small experts at decode) the kernel that writes a GEMM's quantized rows writes their token
    digits instead (token_digits=fused): the expansion and the activation (at 1 token too), or, the expansion forced
    plain, the quantize step after it; forced separate, digits steps read the dequantized rows back. The fused
    finalize in the digits GEMM2, into the output the expansion zeroes. With per-row scales digits steps make them
    (gate digits_row_scale_pays); forced fused, the same kernels as with a static scale (a block per row), up to
    rows of 16384 columns (gate digits_row_scale_fits), past which forcing them is refused."""
    spec = dataclasses.replace(SWIGLU_64E, quant=Quant.W4AFP8, act_scale=ActScale.STATIC, quant_prequant_scales=True)
    plan = make_plan(spec, H100, tokens=16)
    assert plan.choices(16)["token_digits"] == "fused"
    assert kernel_sequence(plan, 16, "topk") == [
        "routing_prologue:fused", "expand_rows:fp8_dequantized_digits+zero_output", "gemm1:woq_digits",
        "fc1_activation:fp8_dequantized_digits", "gemm2:woq_digits_finalize"]
    assert kernel_sequence(plan, 1, "topk")[3:] == ["fc1_activation:fp8_dequantized_digits",
                                                    "gemm2:woq_digits_finalize"]
    separate = make_plan(spec, H100, tokens=16, force={"token_digits": "separate"})
    assert kernel_sequence(separate, 16, "topk") == [
        "routing_prologue:fused", "expand_rows:fp8_dequantized+zero_output", "token_digits:gemm1", "gemm1:woq_digits",
        "fc1_activation:fp8_dequantized", "token_digits:gemm2", "gemm2:woq_digits_finalize"]
    plain = make_plan(spec, H100, tokens=16, force={"expand_rows": "plain"})
    assert kernel_sequence(plain, 17, "topk")[1:3] == ["expand_rows:16bit", "fc1_prequant:fp8_dequantized_digits"]
    layout = workspace_layout(spec, steps_up_to(plan, 16), 16)
    assert "token_digits" in layout and layout["permuted_input"].dtype == torch.bfloat16
    dynamic = dataclasses.replace(spec, act_scale=ActScale.DYNAMIC)
    per_row = make_plan(dynamic, H100, tokens=16)
    assert per_row.choices(16)["token_digits"] == "separate"
    gates = {g.name: (g.value, g.held) for g in per_row.stage("token_digits").gates}
    assert gates["digits_row_scale_pays"] == ("quant=w4afp8 act_scale=dynamic", False)
    assert gates["digits_row_scale_fits"] == ("quant=w4afp8 act_scale=dynamic widest=512", True)
    assert kernel_sequence(per_row, 16, "topk") == kernel_sequence(separate, 16, "topk")
    assert kernel_sequence(per_row, 1, "topk")[3:] == ["gemm1:woq_digits", "fc1_activation:fp8_dequantized",
                                                       "token_digits:gemm2", "gemm2:woq_digits_finalize"]
    fused = make_plan(dynamic, H100, tokens=16, force={"token_digits": "fused"})
    for tokens in (1, 16):
        assert kernel_sequence(fused, tokens, "topk") == kernel_sequence(plan, tokens, "topk")
    wide = dataclasses.replace(dynamic, intermediate_size=16384 + 128)
    gate = next(g for g in make_plan(wide, H100, tokens=16).stage("token_digits").gates
                if g.name == "digits_row_scale_fits")
    assert (gate.value, gate.held) == ("quant=w4afp8 act_scale=dynamic widest=16512", False)
    with pytest.raises(MoeBuildError, match=r"^digits_row_scale_fits: cannot force token_digits=fused: .*'quant != "
                                            r"w4afp8 or act_scale == static or max\(hidden, inter\) <= 16384'"):
        make_plan(wide, H100, tokens=16, force={"token_digits": "fused"})


@pytest.mark.parametrize("act_scale", [ActScale.STATIC, ActScale.DYNAMIC])
def test_w4afp8_fc2_prequant_is_fused_at_every_count(act_scale: ActScale) -> None:
    """W4AFP8's FC2 pre-quant fusion (the scale and the FP8 quantization in the activation kernel, which writes the
    dequantized rows or their token digits) at every count, as W4A16 AWQ's, with either scale; forced separate, at
    every count too."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.W4AFP8, act_scale=act_scale, quant_prequant_scales=True)
    for tokens in (1, 16):
        d = make_plan(spec, H100, tokens=tokens).stage("fc2_prequant")
        assert d.choice == "fused" and [b.to_list() for b in d.bands] == [[1, None, "fused"]]
        assert {g.name for g in d.gates} == {"use_awq", "fc2_prequant_gated"}
    plan = make_plan(spec, H100, tokens=16)
    act = "fc1_activation:fp8_dequantized" + ("_digits" if act_scale is ActScale.STATIC else "")
    assert act in kernel_sequence(plan, 1, "topk") and "fc2_prequant:fp8_dequantized" not in kernel_sequence(plan, 1)
    forced = make_plan(spec, H100, tokens=16, force={"fc2_prequant": "separate"}).stage("fc2_prequant")
    assert forced.forced and forced.choice_for(1) == forced.choice_for(4096) == "separate"


def test_w4afp8_without_awq_scales_quantizes_in_the_activation() -> None:
    """A W4AFP8 checkpoint without pre-quant scales (compressed-tensors, per-token FP8): the expansion still
    quantizes (there is no scale to fuse, the gate holds), the activation writes GEMM2's quantized input, both
    dequantized to 16 bits for W4A16's GEMMs."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.W4AFP8)
    plan = make_plan(spec, H100, tokens=16, force={"finalize": "separate"})
    assert plan.stage("fc2_prequant").choice == "none"
    assert kernel_sequence(plan, 16, "topk")[1:] == ["expand_rows:fp8_dequantized", "gemm1:woq",
                                                     "fc1_activation:fp8_dequantized", "gemm2:woq", "finalize"]


@pytest.mark.parametrize("quant, fc2", [(Quant.W4A16_AWQ, "fused"), (Quant.W8A16, "none"), (Quant.WFP4A16, "none")])
def test_weight_only_plans_run_the_woq_gemms_and_the_awq_steps_the_plan_names(quant: Quant, fc2: str) -> None:
    """GEMM1 / GEMM2 on the weight-only kernel with plain stores, the separate activation and finalize (forced
    separate here: the fused finalize has a test of its own; WFP4A16's matrix never fuses it); AWQ layers scale
    GEMM1's rows in the 16-bit expansion (expand_rows=prequant_fused, moe-build's gate expand_awq_scale_16bit) or,
    forced plain, the tokens' rows into prequant_input, which the expansion then copies; GEMM2's input in the
    activation (fc2_prequant=fused) or after it (separate); the others have no pre-quant step and no prequant_input
    buffer. At 17 tokens (4.25 rows per expert: past every digits band, MXFP4's 4 on 8 experts included)."""
    spec = dataclasses.replace(SWIGLU, quant=quant, quant_prequant_scales=quant is Quant.W4A16_AWQ)
    plan = make_plan(spec, H100, tokens=16, force={"finalize": "separate"})
    assert plan.stage("fc2_prequant").choice == fc2
    assert plan.stage("expand_rows").choice == ("prequant_fused" if fc2 != "none" else "plain")
    steps = kernel_sequence(plan, 17, "logits")
    expand = ["expand_rows:prequant"] if fc2 != "none" else ["expand_rows"]
    act = ["fc1_activation:fc2_prequant"] if fc2 == "fused" else ["fc1_activation"]
    assert steps[2:] == [*expand, "gemm1:woq", *act, "gemm2:woq", "finalize"]
    if fc2 == "fused":
        separate = make_plan(spec, H100, tokens=16, force={"fc2_prequant": "separate", "finalize": "separate"})
        assert kernel_sequence(separate, 16)[-4:] == ["fc1_activation", "fc2_prequant:separate", "gemm2:woq",
                                                      "finalize"]
    layout = workspace_layout(spec, steps_up_to(plan, 16), 16)
    assert {"fc1_out", "fc1_act", "gemm2_out"} <= set(layout) and "gemm_workspace" not in layout
    assert "prequant_input" not in layout
    if fc2 != "none":  # the expansion forced plain: the scaled tokens, one row a token (the expansion copies them)
        plain = make_plan(spec, H100, tokens=16, force={"finalize": "separate", "expand_rows": "plain"})
        assert kernel_sequence(plain, 16, "logits")[2:4] == ["fc1_prequant:separate", "expand_rows:prequant_input"]
        layout = workspace_layout(spec, steps_up_to(plain, 16), 16)
        assert (layout["prequant_input"].shape, layout["prequant_input"].rows_per_token) == ((16, spec.hidden_size), 1)
    assert plan.stage("weight_layout").choice == "row_major"  # the weight-only GEMMs read row-major data


@pytest.mark.parametrize("quant", [Quant.W4A16_AWQ, Quant.W8A16, Quant.W4AFP8])
def test_weight_only_plans_fuse_the_finalize_into_the_decode_gemm2(quant: Quant) -> None:
    """The weight-only finalize epilogue is the decode kernel's (mb_grouped_gemm_woq_finalize) and the mixed-input
    wgmma kernel's (mb_grouped_gemm_woq_sm90_finalize): fused within the decode band (8 average rows per expert, int8's
    5) where
    the 16-bit rule's small-call or wide-expert clause holds, and where GEMM2 runs the mixed-input kernel up to 48
    rows per expert, into the output the expansion (or the three-step prologue) zeroes; separate between (and on int4's
    staged decode tile, to 12 rows) and past 48 rows. WFP4A16 never (the seed's !use_wfp4a16). Forced fused, GEMM2
    keeps the decode kernel where the mixed-input one does not run; an mma GEMM2 tactic with it is refused."""
    spec = dataclasses.replace(SWIGLU_64E, quant=quant, quant_prequant_scales=quant is not Quant.W8A16,
                               act_scale=ActScale.STATIC if quant is Quant.W4AFP8 else ActScale.DYNAMIC)
    plan = make_plan(spec, H100, tokens=16)
    # 64 experts, top-2: tokens * 2 <= 32 up to 16 tokens; int8's decode band to 160 tokens (5 rows per expert), int4's
    # staged tile to 384 (12 rows), the mixed-input kernel past it, its finalize to 1536 (48 rows)
    last_decode = 160 if quant is Quant.W8A16 else 384
    assert [b.to_list() for b in plan.stage("finalize").bands] == [[1, 16, "fused"], [17, last_decode, "separate"],
                                                                   [last_decode + 1, 1536, "fused"],
                                                                   [1537, None, "separate"]]
    assert plan.choices(last_decode)["gemm2_tactic"].startswith("decode:")
    assert plan.choices(last_decode + 1)["gemm2_tactic"].startswith("wgmma:woq128x")
    assert kernel_sequence(plan, last_decode + 1)[-1] == "gemm2:woq_wgmma_finalize"
    # the int4 and int8 GEMM2s take the digits tile at these 1-2 rows per expert (tactics.woq.woq_digits_rule)
    gemm2 = "gemm2:woq_digits"
    # (and their GEMM1 too: the expansion writes the token digits, token_digits=fused)
    expand = {Quant.W4AFP8: ["expand_rows:fp8_dequantized_digits"],
              Quant.W4A16_AWQ: ["expand_rows:prequant_digits"]}.get(quant, ["expand_rows:digits"])
    fused, separate = kernel_sequence(plan, 16, "topk"), kernel_sequence(plan, 17, "topk")
    n = 2 + len(expand)
    assert fused[:n - 1] == ["routing_prologue:fused", *expand[:-1], f"{expand[-1]}+zero_output"]
    assert fused[-1] == f"{gemm2}_finalize"
    assert separate[:n - 1] == ["routing_prologue:fused", *expand] and separate[-2:] == [gemm2, "finalize"]
    assert plan.choices(16)["gemm2_tactic"].startswith("decode:")
    if quant is Quant.W4AFP8:  # the plain 16-bit expansion, zeroing the output, has its rows in the workspace
        plain = make_plan(spec, H100, tokens=16, force={"expand_rows": "plain"})
        assert kernel_sequence(plain, 16, "topk")[1] == "expand_rows:16bit+zero_output"
        assert "expanded_input" in workspace_layout(spec, steps_up_to(plain, 16), 16)
    wide = make_plan(dataclasses.replace(spec, intermediate_size=2048), H100, tokens=16)  # fused to 8 rows/expert
    assert [b.to_list() for b in wide.stage("finalize").bands] == (
        [[1, 1536, "fused"], [1537, None, "separate"]] if quant is Quant.W8A16 else
        [[1, 256, "fused"], [257, 384, "separate"], [385, 1536, "fused"], [1537, None, "separate"]])
    forced = make_plan(spec, H100, tokens=4096, force={"finalize": "fused"})
    assert forced.choices(100)["gemm2_tactic"].startswith("decode:")  # in the plan's separate band
    assert forced.choices(4096)["gemm2_tactic"].startswith("wgmma:woq128x")
    assert kernel_sequence(forced, 4096)[2] == "routing_prologue:three_step+zero_output"
    assert kernel_sequence(forced, 4096)[-1] == "gemm2:woq_wgmma_finalize"  # 128 rows per expert
    assert kernel_sequence(forced, 100)[-1] == f"{gemm2.replace('_digits', '')}_finalize"
    with pytest.raises(MoeBuildError, match="finalize epilogue runs on the decode kernel and the mixed-input"):
        make_plan(spec, H100, tokens=16, force={"finalize": "fused", "gemm2_tactic": "mma:64x128:plain:plain"})
    in_groups_of_32 = make_plan(dataclasses.replace(spec, quant_group_size=32), H100, tokens=4096,
                                force={"finalize": "fused"})
    assert in_groups_of_32.choices(4096)["gemm2_tactic"].startswith("decode:")  # no mixed-input kernel for them
    if quant is Quant.W4A16_AWQ:
        mxfp4 = make_plan(dataclasses.replace(spec, quant=Quant.WFP4A16, quant_prequant_scales=False), H100, 16)
        assert mxfp4.stage("finalize").choice == "separate"
        assert "finalize_sm90_not_wfp4a16" in {g.name for g in mxfp4.stage("finalize").gates if not g.held}


# The FP8 layers' activation as a kernel of its own (the block-128 default; rowwise layers run it in GEMM1's
# epilogue on sm90 unless forced so: test_fp8_rowwise_plans_run_the_gated_gemm1)
ACT_KERNEL = {"fc1_activation": "separate"}


@pytest.mark.parametrize("quant", [Quant.FP8, Quant.FP8_BLOCK])
def test_fp8_plans_run_fp8_steps_where_the_plan_quantizes(quant: Quant) -> None:
    """GEMM1's FP8 input in the expansion or by a quantize step before it, GEMM2's in the activation or
    after it, as the plan's fc1_input_quant / fc2_input_quant say (finalize forced separate here: the
    fused finalize has a test of its own)."""
    spec = dataclasses.replace(SWIGLU, quant=quant)
    fused = kernel_sequence(make_plan(spec, H100, tokens=16, force={**ACT_KERNEL, "finalize": "separate"}), 16, "topk")
    assert fused == ["routing_prologue:fused", "expand_rows:fp8", "gemm1:fp8", "fc1_activation:fp8", "gemm2:fp8",
                         "finalize"]
    separate = make_plan(spec, H100, tokens=16, force={**ACT_KERNEL, "fc1_input_quant": "separate",
                                                       "fc2_input_quant": "separate", "finalize": "separate"})
    assert kernel_sequence(separate, 16, "topk") == [
        "routing_prologue:fused", "fc1_input_quant:separate", "expand_rows:fp8_prequantized", "gemm1:fp8",
        "fc1_activation", "fc2_input_quant:separate", "gemm2:fp8", "finalize"]
    layout = workspace_layout(spec, steps_up_to(separate, 16), 16)
    assert layout["permuted_input"].dtype == torch.float8_e4m3fn and layout["fc2_input"].dtype == torch.float8_e4m3fn
    kb = -(-SWIGLU.hidden_size // 128)
    assert layout["input_scales"].shape == ((16, kb) if quant is Quant.FP8_BLOCK else (16,))
    assert "fc1_act" in layout  # the separate quantize step reads the 16-bit activation
    fused_everywhere = make_plan(spec, H100, tokens=16, force={**ACT_KERNEL, "fc2_input_quant": "fc1_activation"})
    assert "fc1_act" not in workspace_layout(spec, steps_up_to(fused_everywhere, 16), 16)
    # the default plan quantizes GEMM2's input in the activation at every count (rules.fc2_quant_in_activation), so
    # its workspace has no 16-bit activation rows
    default = make_plan(spec, H100, tokens=16, force={**ACT_KERNEL, "finalize": "separate"})
    for tokens in (1, 2, 16):
        assert kernel_sequence(default, tokens)[-3:] == ["fc1_activation:fp8", "gemm2:fp8", "finalize"], tokens
    assert "fc1_act" not in workspace_layout(spec, steps_up_to(default, 16), 16)
    with pytest.raises(MoeBuildError, match="fc1_input_quant"):
        make_plan(SWIGLU, H100, tokens=16, force={"fc1_input_quant": "separate"})


@pytest.mark.parametrize("quant", [Quant.FP8, Quant.FP8_BLOCK])
def test_fp8_plans_fuse_the_finalize_into_gemm2_where_the_plan_says(quant: Quant) -> None:
    """finalize=fused: GEMM2 on the FP8 finalize entry point, into the output the three-step prologue zeroes, or
    else the FP8 expansion (either of the two); finalize=separate: GEMM2's plain store, then the finalize kernel,
    nothing zeroed. Fused at every count (rules.FINALIZE_ALWAYS_FUSED_QUANTS; a 16-bit SWIGLU_64E layer is separate
    at 17..128 tokens)."""
    spec = dataclasses.replace(SWIGLU, quant=quant)
    tail = ["gemm1:fp8", "fc1_activation:fp8", "gemm2:fp8_finalize"]
    plan = make_plan(spec, H100, tokens=16, force=ACT_KERNEL)
    assert plan.stage("finalize").choice == "fused"
    assert kernel_sequence(plan, 16, "topk") == ["routing_prologue:fused", "expand_rows:fp8+zero_output", *tail]
    assert "gemm2_out" not in workspace_layout(spec, steps_up_to(plan, 16), 16)
    prequantized = make_plan(spec, H100, tokens=16, force={**ACT_KERNEL, "fc1_input_quant": "separate"})
    assert kernel_sequence(prequantized, 16, "topk") == [
        "routing_prologue:fused", "fc1_input_quant:separate", "expand_rows:fp8_prequantized+zero_output", *tail]
    three_step = make_plan(spec, H100, tokens=16, force={**ACT_KERNEL, "routing_prologue": "three_step"})
    assert kernel_sequence(three_step, 16)[2:] == ["routing_prologue:three_step+zero_output", "expand_rows:fp8",
                                                   *tail]
    separate = make_plan(spec, H100, tokens=16,
                         force={**ACT_KERNEL, "finalize": "separate", "routing_prologue": "three_step"})
    assert kernel_sequence(separate, 16)[2:] == ["routing_prologue:three_step", "expand_rows:fp8", "gemm1:fp8",
                                                 "fc1_activation:fp8", "gemm2:fp8", "finalize"]
    spec64 = dataclasses.replace(SWIGLU_64E, quant=quant)
    everywhere = make_plan(spec64, H100, tokens=16, force=ACT_KERNEL)
    assert [kernel_sequence(everywhere, t)[-1] for t in (16, 17, 128, 129)] == ["gemm2:fp8_finalize"] * 4
    assert [kernel_sequence(make_plan(SWIGLU_64E, H100, tokens=16), t)[-1] for t in (16, 17)] == [
        "gemm2:sm90_finalize", "finalize"]
    assert "gemm2_out" not in workspace_layout(spec64, steps_up_to(everywhere, 4096), 4096)


def test_fp8_rowwise_plans_run_the_gated_gemm1() -> None:
    """A rowwise FP8 layer on sm90: GEMM1 with the gated epilogue writes the 16-bit activation (W1 interleaved), the
    quantize step makes GEMM2's FP8 input from it at every count where the finalize is separate (GEMM2 quantizes it
    itself only into the fused finalize); no fc1_out in the workspace, fc1_act kept."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.FP8)
    plan = make_plan(spec, H100, tokens=16, force={"finalize": "separate"})
    assert w1_interleaved(plan)
    for tokens in (1, 2, 16):
        assert kernel_sequence(plan, tokens, "topk") == ["routing_prologue:fused", "expand_rows:fp8", "gemm1:fp8_gated",
                                                     "fc2_input_quant:separate", "gemm2:fp8", "finalize"], tokens
    layout = workspace_layout(spec, steps_up_to(plan, 16), 16)
    assert "fc1_out" not in layout and layout["fc1_act"].dtype == torch.bfloat16
    assert layout["fc2_input"].dtype == torch.float8_e4m3fn


def test_fp8_rowwise_plans_quantize_in_gemm2_where_it_runs_the_decode_kernel() -> None:
    """fc2_input_quant=gemm2 (the default where GEMM2 runs the decode kernel with the finalize fused): GEMM1's gated
    epilogue then GEMM2's quantizing entry point, no quantize step between them; where GEMM2 runs the wgmma tiles the
    quantize step and the plain FP8 finalize GEMM2; one runner runs both, so fc1_act and fc2_input both stay. A plan
    saying gemm2 with a separate finalize (data from elsewhere) is refused with the stage named."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.FP8)
    plan = make_plan(spec, H100, tokens=16)
    quantizing = ["gemm1:fp8_gated", "gemm2:fp8_quantizing_finalize"]
    separate = ["gemm1:fp8_gated", "fc2_input_quant:separate", "gemm2:fp8_finalize"]
    for tokens in (1, 16, 4096):
        here = plan.choices(tokens)["fc2_input_quant"]
        assert here == ("gemm2" if plan.choices(tokens)["gemm2_tactic"].startswith("decode:") else "separate")
        assert kernel_sequence(plan, tokens)[-len(quantizing if here == "gemm2" else separate):] == (
            quantizing if here == "gemm2" else separate), tokens
    assert {plan.choices(t)["fc2_input_quant"] for t in (1, 4096)} == {"gemm2", "separate"}
    layout = workspace_layout(spec, steps_up_to(plan, 4096), 4096)
    assert layout["fc1_act"].dtype == torch.bfloat16 and layout["fc2_input"].dtype == torch.float8_e4m3fn
    stages = [dataclasses.replace(d, choice="gemm2", bands=()) if d.stage == "fc2_input_quant" else
              dataclasses.replace(d, choice="separate", bands=()) if d.stage == "finalize" else d
              for d in make_plan(spec, H100, tokens=1).stages]
    with pytest.raises(MoeBuildError, match="fc2_input_quant"):
        kernel_sequence(dataclasses.replace(plan, stages=tuple(stages)), 1)


def test_fp8_static_scale_plans_quantize_in_gemm1s_epilogue() -> None:
    """fc2_input_quant=gemm1 (a static GEMM2 input scale after GEMM1's gated epilogue): GEMM1's quantizing entry
    point writes GEMM2's FP8 input at every count, no quantize step, no quantizing GEMM2 and no 16-bit fc1_act in the
    workspace; forced separate, the gated epilogue and the quantize step as before."""
    from moe_build.spec import ActScale
    spec = dataclasses.replace(SWIGLU, quant=Quant.FP8, act_scale=ActScale.STATIC)
    plan = make_plan(spec, H100, tokens=16)
    for tokens in (1, 16, 4096):
        assert plan.choices(tokens)["fc2_input_quant"] == "gemm1", tokens
        assert kernel_sequence(plan, tokens)[-2:] == ["gemm1:fp8_gated_quantized", "gemm2:fp8_finalize"], tokens
    layout = workspace_layout(spec, steps_up_to(plan, 4096), 4096)
    assert "fc1_act" not in layout and layout["fc2_input"].dtype == torch.float8_e4m3fn
    assert layout["fc2_input_scales"].shape == (4096 * spec.top_k,)
    forced = make_plan(spec, H100, tokens=4096, force={"fc2_input_quant": "separate"})
    assert kernel_sequence(forced, 4096)[-3:] == ["gemm1:fp8_gated", "fc2_input_quant:separate", "gemm2:fp8_finalize"]


def test_workspace_sizing_math() -> None:
    spec = MoESpec(256, 512, 8, 2, dtype=DType.BF16)
    # forced separate activation: fc1_out, its input, is in the layout; forced fused finalize: no gemm2_out
    plan = make_plan(spec, H100, tokens=4, force={"fc1_activation": "separate", "finalize": "fused"})
    layout = workspace_layout(spec, steps_up_to(plan, 4), 100, gemm_workspace_bytes=1000,
                              three_step_workspace_bytes=0)
    M, K, E, H, I = 100, 2, 8, 256, 512
    R = M * K
    expected = {
        "logits": M * E * 2, "topk_ids": M * K * 4, "topk_weights": M * K * 4,
        "permuted_to_unpermuted": R * 4, "unpermuted_to_permuted": R * 4, "expert_offsets": (E + 1) * 8,
        "permuted_input": R * H * 2, "permuted_weights": R * 4, "fc1_out": R * 2 * I * 2, "fc1_act": R * I * 2,
        "gemm_workspace": 1000,
    }
    assert {n: b.nbytes for n, b in layout.items()} == expected
    assert layout_bytes(layout) == sum(-(-n // 256) * 256 for n in expected.values())  # 256-byte aligned starts


def test_workspace_covers_three_step_and_separate_finalize_when_reachable() -> None:
    spec = MoESpec(256, 512, 8, 2)
    plan = make_plan(spec, H100, tokens=1000, force={"finalize": "separate"})
    layout = workspace_layout(spec, steps_up_to(plan, 1000), 1000, three_step_workspace_bytes=4096)
    assert layout["prologue_workspace"].nbytes == 4096
    assert layout["gemm2_out"].shape == (2000, 256) and layout["gemm2_out"].rows_per_token == 2
    small = workspace_layout(spec, steps_up_to(make_plan(spec, H100, tokens=4, force={"finalize": "fused"}), 4), 4,
                             three_step_workspace_bytes=4096)
    assert "prologue_workspace" not in small and "gemm2_out" not in small


def test_workspace_carves_aligned_views_from_one_flat_buffer() -> None:
    spec = MoESpec(200, 328, 8, 3, dtype=DType.FP16)
    layout = workspace_layout(spec, steps_up_to(make_plan(spec, H100, tokens=37), 37), 37,
                              three_step_workspace_bytes=100)
    ws = Workspace(layout, "cpu")
    assert ws.flat.numel() == layout_bytes(layout)
    for name, b in layout.items():
        t = ws.buffers[name]
        assert t.shape == b.shape and t.dtype == b.dtype and (t.data_ptr() - ws.flat.data_ptr()) % 256 == 0
    assert ws.view("permuted_input", 5).shape == (15, 200) and ws.view("expert_offsets", 5).shape == (9,)
    with pytest.raises(ValueError, match="workspace"):
        Workspace(layout, flat=torch.empty(layout_bytes(layout) - 1, dtype=torch.uint8))


def test_workspace_views_are_made_once_per_token_count() -> None:
    spec = MoESpec(200, 328, 8, 3, dtype=DType.FP16)
    ws = Workspace(workspace_layout(spec, steps_up_to(make_plan(spec, H100, tokens=37), 37), 37), "cpu")
    v5 = ws.views(5)
    assert ws.views(5) is v5 and ws.views(6) is not v5
    assert set(v5) == set(ws.buffers)
    for name, t in v5.items():
        single = ws.view(name, 5)
        assert t.shape == single.shape and t.data_ptr() == single.data_ptr(), name
    gone = weakref.ref(ws)
    gc.disable()
    try:
        del ws, v5
        assert gone() is None  # freed by reference counting: its cache holds no cycle through it
    finally:
        gc.enable()


def test_trusted_tensors_skips_the_wrapper_checks_in_its_block_and_thread_only() -> None:
    cpu = torch.zeros(3)
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        kernels.ops.args._check(cpu, "x")
    seen_in_thread: list[str] = []

    def other_thread() -> None:
        try:
            kernels.ops.args._check(cpu, "y")
        except ValueError as e:
            seen_in_thread.append(str(e))

    with kernels.trusted_tensors():
        kernels.ops.args._check(cpu, "x")
        with kernels.trusted_tensors():
            kernels.ops.args._check(cpu, "x")
        kernels.ops.args._check(cpu, "x")  # the inner block's exit keeps the outer one trusted
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen_in_thread == ["y: must be a CUDA tensor, got device cpu"]
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        kernels.ops.args._check(cpu, "x")


def test_a_given_workspace_skips_the_size_query() -> None:
    asked: list[int] = []

    def size() -> int:
        asked.append(1)
        return 64

    given = torch.empty(128, dtype=torch.uint8)
    with kernels.trusted_tensors():  # a CPU tensor stands in for the device buffer
        assert kernels.ops.args._workspace(given, size, given.device) == (given.data_ptr(), 128)
    assert asked == []
    ptr, nbytes = kernels.ops.args._workspace(None, lambda: 0, torch.device("cpu"))
    assert (ptr, nbytes) == (None, 0)


def test_runner_refuses_to_run_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    spec = MoESpec(64, 128, 4, 2)
    with pytest.raises(MoeBuildError, match="CUDA"):
        MoERunner(spec, MoEWeights.random(spec), max_tokens=8)
    with pytest.raises(MoeBuildError, match="device"):
        MoERunner(spec, MoEWeights.random(spec), max_tokens=8, device="cpu")


def test_fp32_plans_are_refused_by_the_runner():
    from moe_build.runner import check_runnable
    spec = MoESpec(256, 128, 8, 2, dtype=DType.FP32)
    target = Target(sm=90, flavour=Flavour.TENSORRT)
    with pytest.raises(MoeBuildError) as info:
        check_runnable(make_plan(spec, target, 4))
    assert info.value.field == "dtype"
    check_runnable(make_plan(dataclasses.replace(spec, dtype=DType.BF16), target, 4))


def test_finalize_choice_follows_the_token_count():
    # 16 experts, top-4: the FINALIZE tactic up to 32 rows (8 tokens) and past 4 rows per expert (from 17 tokens)
    spec = MoESpec(256, 128, 16, 4, dtype=DType.BF16)
    plan = make_plan(spec, Target(sm=90, flavour=Flavour.TENSORRT), 1)
    fused = ["gemm2:sm90_finalize" in kernel_sequence(plan, t, "logits") for t in (8, 9, 16, 17)]
    assert fused == [True, False, False, True]
    assert {"gemm2:sm90_finalize", "finalize"} <= steps_up_to(plan, 4096)
    assert "finalize" not in steps_up_to(plan, 8)  # the workspace covers only the steps its counts reach


# ---- expert parallelism: a rank's experts run on dispatched rows, the rest where the tokens live -----------

def test_expert_parallel_rank_runs_its_experts_on_routed_rows_without_shared_experts() -> None:
    spec = MoESpec(256, 256, 16, 2, shared=SharedExperts(1, 128), ep_size=4)
    whole = make_plan(spec, H100, 8)
    with pytest.raises(MoeBuildError, match="one rank per process") as info:
        kernel_sequence(whole, 8, "topk")
    assert info.value.field == "ep_rank"
    rank = make_plan(spec.for_rank(1), H100, 8)
    steps = kernel_sequence(rank, 8, "topk")
    assert "shared_experts" not in steps and "router_gemm" not in steps and "routing" not in steps
    assert steps[-1] in ("gemm2:sm90_finalize", "finalize")
    with pytest.raises(MoeBuildError) as info:
        kernel_sequence(rank, 8, "hidden")
    assert info.value.field == "routing_input"
    single = make_plan(dataclasses.replace(spec, ep_size=1), H100, 8)
    assert kernel_sequence(single, 8)[-1] == "shared_experts"
    # the rank's buffers index its 4 experts; the router's logits (where the tokens live) all 16
    layout = workspace_layout(spec.for_rank(1), {"router_gemm", "routing"}, 8)
    assert layout["expert_offsets"].shape == (5,) and layout["logits"].shape == (8, 16)


def test_weights_for_rank_hold_its_experts_and_the_whole_router() -> None:
    spec = MoESpec(64, 32, 8, 2, expert_bias=True, shared=SharedExperts(1, 32), ep_size=4)
    w = MoEWeights.random(spec, seed=3)
    r2 = w.for_rank(spec, 2)
    assert torch.equal(r2.w1, w.w1[4:6]) and torch.equal(r2.w2, w.w2[4:6])
    assert torch.equal(r2.b1, w.b1[4:6]) and torch.equal(r2.b2, w.b2[4:6])
    assert r2.router_weight is w.router_weight and r2.shared_w1 is w.shared_w1
    r2.check(spec.for_rank(2))
    with pytest.raises(MoeBuildError) as info:
        r2.check(spec)  # the whole group's spec wants every expert
    assert info.value.field == "w1"
    fp8 = MoEWeights.random(dataclasses.replace(spec, expert_bias=False), seed=4).quantized_fp8(
        ScaleGranularity.CHANNEL)
    f2 = fp8.for_rank(spec, 3)
    assert torch.equal(f2.fp8.w1_scale, fp8.fp8.w1_scale[6:8]) and f2.w1.shape[0] == 2


def test_each_stream_gets_its_own_gemm_placement_regions() -> None:
    """A placed GEMM's claim region serves one call at a time, and calls on two streams may run at once (each has
    its own workspace): so each (stream, GEMM) gets its own region, made once and kept."""
    from moe_build.runner.batch import Batch
    from moe_build.runner.experts import FusedExperts
    made: list[torch.Tensor] = []
    fake = SimpleNamespace(new_gemm_placement=lambda dev: made.append(torch.zeros(4, dtype=torch.int32)) or made[-1],
                           WeightLayout=kernels.WeightLayout, Fp8Scaling=kernels.Fp8Scaling)
    experts = FusedExperts(SWIGLU, MoEWeights.random(SWIGLU, seed=0), fake, weights_blocked=False,  # type: ignore[arg-type]
                           fp8_accumulation="none")

    def batch(stream: int) -> Batch:
        return Batch(1, torch.zeros(1, 256), torch.zeros(1, 256), {}, stream, None, None)
    first = {g: experts.placement(batch(7), g) for g in ("gemm1", "gemm2")}
    assert first["gemm1"] is not first["gemm2"]
    assert experts.placement(batch(7), "gemm1") is first["gemm1"]  # kept: each call leaves it as the next needs it
    other = experts.placement(batch(9), "gemm1")
    assert other is not first["gemm1"] and len(made) == 3


@pytest.mark.parametrize("quant", [Quant.W4A16_AWQ, Quant.W8A16, Quant.WFP4A16])
def test_weight_only_plans_take_the_mixed_input_gemm_past_decode(quant: Quant) -> None:
    """On sm90, int4 / int8 weights (groups of 128 here) run the decode kernel to 8 rows per expert (int4 on the
    staged tile to 12) and the mixed-input wgmma GEMM past it, GEMM1 with the gated activation in its epilogue (steps
    gemm1:woq_wgmma_gated / gemm2:woq_wgmma_finalize, no fc1_activation step between them and the finalize in GEMM2's
    epilogue to 48 rows an expert); bf16 MXFP4 (its e5m2 form on that kernel) the decode kernel to 7 rows, then the
    same GEMM1 and GEMM2 with the finalize separate (the seed's rule for wfp4a16); fp16 MXFP4, which that kernel does
    not take, the decode kernel to 12 rows, the mma tiles, then from 160 rows its weights dequantized for the 16-bit
    wgmma GEMM."""
    spec = dataclasses.replace(SWIGLU, quant=quant)  # 8 experts, top-2: rows per expert = ceil(tokens / 4)
    plan = make_plan(spec, dataclasses.replace(H100, profile=TokenProfile(1, 16, 1024)), tokens=16)
    gemms = {t: [s for s in kernel_sequence(plan, t) if s.startswith("gemm")] for t in (28, 29, 32, 33, 48, 49, 636, 637)}
    if quant is Quant.WFP4A16:
        assert spec.dtype is DType.BF16
        assert gemms == {t: ["gemm1:woq", "gemm2:woq"] if t <= 28 else ["gemm1:woq_wgmma_gated", "gemm2:woq_wgmma"]
                         for t in (28, 29, 32, 33, 48, 49, 636, 637)}
        fp16 = make_plan(dataclasses.replace(spec, dtype=DType.FP16),
                         dataclasses.replace(H100, profile=TokenProfile(1, 16, 1024)), tokens=16)
        assert {t: [s for s in kernel_sequence(fp16, t) if s.startswith("gemm")] for t in (49, 636, 637)} == {
            **{t: ["gemm1:woq", "gemm2:woq"] for t in (49, 636)}, 637: ["gemm1:woq_dense", "gemm2:woq_dense"]}
    else:
        last_decode = 48 if quant is Quant.W4A16_AWQ else 20  # the staged int4 tile's band: 12 rows; int8's 5
        # GEMM2 with the finalize in its epilogue to 48 rows an expert (192 tokens), beside it past them
        assert gemms == {t: ["gemm1:woq", "gemm2:woq"] if t <= last_decode
                         else ["gemm1:woq_wgmma_gated", "gemm2:woq_wgmma_finalize"] if t <= 192
                         else ["gemm1:woq_wgmma_gated", "gemm2:woq_wgmma"] for t in (28, 29, 32, 33, 48, 49, 636, 637)}
        assert "finalize" not in kernel_sequence(plan, last_decode + 1)
        assert "fc1_activation" not in kernel_sequence(plan, last_decode + 1)
        assert "fc1_activation" in kernel_sequence(plan, last_decode)
        assert plan.stage("gemm1_tactic").choice_for(last_decode + 1) == "wgmma:woq128x32:plain:plain"
        assert plan.stage("gemm1_tactic").choice_for(1024) == "wgmma:woq128x320c2:plain:plain"  # 256 rows an expert
        # 512 +- 19.6 rows an expert: two 320-row tiles hold them, where 256-row ones take 2.5 on average
        assert plan.stage("gemm1_tactic").choice_for(2048) == "wgmma:woq128x320c2:plain:plain"


@pytest.mark.parametrize("finalize", ["fused", "separate"])
@pytest.mark.parametrize("fc2_prequant", ["fused", "none"])
@pytest.mark.parametrize("expand_rows", ["prequant_fused", "plain"])
def test_digits_tactics_read_token_digits(finalize: str, fc2_prequant: str, expand_rows: str) -> None:
    """A weight-only GEMM whose tactic is the decode kernel's digits tile reads its input rows as token digits, which
    the kernel writing the rows makes (token_digits=fused, the plan's default: the expansion's and the activation's
    digits forms) or a digits step after it (separate); the workspace holds one GEMM's token digits at a time: tokens
    * top_k rows of ceil(max(hidden, inter) / 128) groups of 400 bytes."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.W4A16_AWQ, quant_prequant_scales=fc2_prequant == "fused")
    force = {"gemm1_tactic": "decode:digits_ksplit1:after_trigger:plain",
             "gemm2_tactic": "decode:digits_ksplit2:after_trigger:plain", "finalize": finalize}
    if expand_rows == "plain":
        force["expand_rows"] = "plain"
    target = dataclasses.replace(H100, profile=TokenProfile(1, 16, 16))
    plan = make_plan(spec, target, tokens=16, force=force)
    d = plan.stage("token_digits")
    assert (d.choice, d.fallback) == ("fused", "separate")
    assert {g.name: (g.value, g.held) for g in d.gates} == {
        "digits_tile": ("gemm1,gemm2", True), "digits_fc2_prequant": (fc2_prequant, True),
        "digits_row_scale_fits": ("quant=w4a16_awq act_scale=dynamic widest=512", True),
        "digits_row_scale_pays": ("quant=w4a16_awq act_scale=dynamic", True)}
    gemm2 = "gemm2:woq_digits_finalize" if finalize == "fused" else "gemm2:woq_digits"
    zero = "+zero_output" if finalize == "fused" else ""
    expand = {("prequant_fused", "fused"): "expand_rows:prequant_digits", ("plain", "fused"): "expand_rows:prequant_input_digits",
              ("prequant_fused", "none"): "expand_rows:digits", ("plain", "none"): "expand_rows:digits"}[
                  (expand_rows, fc2_prequant)]
    act = "fc1_activation:fc2_prequant_digits" if fc2_prequant == "fused" else "fc1_activation:digits"
    steps = kernel_sequence(plan, 16, "topk")
    start = steps.index("routing_prologue:fused") + 1
    end = steps.index(gemm2) + 1
    prequant = ["fc1_prequant:separate"] if (expand_rows, fc2_prequant) == ("plain", "fused") else []
    assert steps[start:end] == [*prequant, expand + zero, "gemm1:woq_digits", act, gemm2]
    separate = make_plan(spec, target, tokens=16, force={**force, "token_digits": "separate"})
    steps = kernel_sequence(separate, 16, "topk")
    plain_expand = expand.replace("_digits", "").replace(":digits", "")
    plain_act = "fc1_activation:fc2_prequant" if fc2_prequant == "fused" else "fc1_activation"
    assert steps[start:steps.index(gemm2) + 1] == [*prequant, plain_expand + zero, "token_digits:gemm1",
                                                   "gemm1:woq_digits", plain_act, "token_digits:gemm2", gemm2]
    for p in (plan, separate):
        layout = workspace_layout(spec, steps_up_to(p, 16), 16)
        assert layout["token_digits"].shape == (32, 4 * 400) and layout["token_digits"].dtype == torch.uint8
        assert "fc1_out" in layout
    w8 = dataclasses.replace(spec, quant=Quant.W8A16, quant_group_size=32)  # int8 in groups of 32: no digits tile,
    w8_plan = make_plan(w8, target, tokens=16)                               # no digits in the workspace
    assert w8_plan.stage("token_digits").choice == "none"
    assert "token_digits" not in workspace_layout(w8, steps_up_to(w8_plan, 16), 16)
    w8_row = dataclasses.replace(spec, quant=Quant.W8A16, quant_per_channel=True)  # per row: the tile, as int4's
    assert make_plan(w8_row, target, tokens=16).stage("token_digits").choice == "fused"


def test_token_digits_stage_refusals() -> None:
    """token_digits=fused needs a GEMM on the digits tile and GEMM2's input made by the activation: with the FC2
    pre-quant scale as a step of its own (fc2_prequant=separate) the plan makes the digits separately, and forcing
    fused is refused naming the gate; a layer without the tile cannot be forced to either form, nor one with it to
    none."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.W4A16_AWQ, quant_prequant_scales=True)
    target = dataclasses.replace(H100, profile=TokenProfile(1, 16, 16))
    digits = {"gemm1_tactic": "decode:digits_ksplit1:after_trigger:plain",
              "gemm2_tactic": "decode:digits_ksplit2:after_trigger:plain"}
    plan = make_plan(spec, target, tokens=16, force={**digits, "fc2_prequant": "separate"})
    assert plan.stage("token_digits").choice == "separate"
    steps = kernel_sequence(plan, 16)
    assert steps[steps.index("gemm1:woq_digits") + 1:] == ["fc1_activation", "fc2_prequant:separate",
                                                           "token_digits:gemm2", "gemm2:woq_digits_finalize"]
    with pytest.raises(UnsupportedCombination, match="digits_fc2_prequant=separate fails 'fc2_prequant != separate'"):
        make_plan(spec, target, tokens=16, force={**digits, "fc2_prequant": "separate", "token_digits": "fused"})
    with pytest.raises(MoeBuildError, match="token_digits=none"):
        make_plan(spec, target, tokens=16, force={**digits, "token_digits": "none"})
    w8 = dataclasses.replace(spec, quant=Quant.W8A16, quant_prequant_scales=False, quant_group_size=32)
    for choice in ("fused", "separate"):
        with pytest.raises(UnsupportedCombination, match="digits_tile=none"):
            make_plan(w8, target, tokens=16, force={"token_digits": choice})


def test_awq_gated_band_applies_the_fc2_prequant_scale_in_gemm1s_epilogue() -> None:
    """W4A16 with AWQ pre-quant scales past decode: GEMM1's gated epilogue multiplies by FC2's scale
    (gemm1:woq_wgmma_gated_fc2_prequant, no activation step); forced separate, a scale step follows the plain gated
    epilogue; below the band the activation kernel does it as before."""
    spec = dataclasses.replace(SWIGLU, quant=Quant.W4A16_AWQ, quant_prequant_scales=True)
    target = dataclasses.replace(H100, profile=TokenProfile(1, 16, 1024))
    plan = make_plan(spec, target, tokens=16)
    assert kernel_sequence(plan, 1024)[-3:] == ["gemm1:woq_wgmma_gated_fc2_prequant", "gemm2:woq_wgmma", "finalize"]
    assert "fc1_activation:fc2_prequant_digits" in kernel_sequence(plan, 1)  # the digits tile at 1 token
    forced = make_plan(spec, target, tokens=16, force={"fc2_prequant": "separate"})
    assert kernel_sequence(forced, 1024)[-4:] == ["gemm1:woq_wgmma_gated", "fc2_prequant:separate", "gemm2:woq_wgmma",
                                                  "finalize"]


# The runner's steps that run an FP8 row kernel, and the step tactic stage each passes it (runner/experts.py).
STEP_TACTIC_OF = {S.EXPAND_ROWS_FP8: "expand_rows_tactic", S.EXPAND_ROWS_FP8_ZERO_OUTPUT: "expand_rows_tactic",
                  S.EXPAND_ROWS_FP8_DEQUANTIZED: "expand_rows_tactic",
                  S.EXPAND_ROWS_FP8_DEQUANTIZED_ZERO_OUTPUT: "expand_rows_tactic",
                  S.FC1_PREQUANT_FP8_DEQUANTIZED: "fc1_input_quant_tactic",
                  S.FC1_ACTIVATION_FP8: "fc1_activation_tactic", S.FC1_ACTIVATION_FP8_DEQUANTIZED: "fc1_activation_tactic",
                  S.QUANTIZE_FC2_INPUT: "fc2_input_quant_tactic", S.FC2_PREQUANT_FP8_DEQUANTIZED: "fc2_input_quant_tactic"}


@pytest.mark.parametrize("quant,act_scale,force", [
    (Quant.FP8, ActScale.DYNAMIC, {}), (Quant.FP8, ActScale.STATIC, {}), (Quant.FP8_BLOCK, ActScale.DYNAMIC, {}),
    (Quant.FP8, ActScale.DYNAMIC, {"fc1_activation": "separate", "fc2_input_quant": "separate"}),
    (Quant.FP8_BLOCK, ActScale.DYNAMIC, {"fc1_input_quant": "separate"}),
    (Quant.W4AFP8, ActScale.DYNAMIC, {}), (Quant.W4AFP8, ActScale.STATIC, {}),
    (Quant.W4AFP8, ActScale.DYNAMIC, {"expand_rows": "plain", "fc2_prequant": "separate"}),
    (Quant.W4AFP8, ActScale.STATIC, {"token_digits": "separate"})])
def test_every_fp8_row_step_the_runner_runs_has_the_plans_tactic(quant: Quant, act_scale: ActScale,
                                                                 force: dict) -> None:
    """At every token count a step runs, the plan names its kernel (runner/experts.py passes
    Batch.step_tactics[stage]); the runner's steps and the plan's step stages agree."""
    spec = dataclasses.replace(MoESpec(2048, 768, 128, 8), quant=quant, act_scale=act_scale,
                               quant_prequant_scales=quant is Quant.W4AFP8)
    plan = make_plan(spec, H100, 1, force)
    seen = set()
    for tokens in (1, 2, 3, 4, 5, 16, 17, 64, 65, 96, 256, 527, 528, 640, 641, 2048, 4096):
        choices = plan.choices(tokens)
        for step in kernel_sequence(plan, tokens):
            if step in STEP_TACTIC_OF:
                assert choices[STEP_TACTIC_OF[step]] != "none", (step, tokens)
                seen.add(step)
    assert seen, "no FP8 row step ran"
