"""MoEPlugin's enqueue on a GPU, against the fp64 reference (FP8 layers: against MoERunner, bit for bit).

The GPU machine has no TensorRT at all, so this calls `run_enqueue`, the TensorRT-free core
that `MoEPlugin.enqueue` forwards to (the forwarding itself is checked on a CPU in
tests/test_plugin.py::test_enqueue_adapter_translates_descriptors). Everything TensorRT would
hand over is real here: raw device pointers (torch tensors' data_ptr), a workspace buffer of the
size the plugin asks for, and a non-default CUDA stream given as a raw handle.
"""
from __future__ import annotations

import random

import pytest
import torch

from moe_build.errors import MoeBuildError
from moe_build.planner import Plan, make_plan
from moe_build.reference import moe_reference
from moe_build.spec import ActScale, Activation, DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights
from moe_build.weights.dtypes import TORCH_DTYPE
from moe_build.weights.fp8 import ScaleGranularity
from moe_build.weights.woq import WoqKind
from moe_build.plugins.build_rules import workspace_size
from moe_build.plugins.enqueue import RunnerCache, run_enqueue
from moe_build.plugins.slots import input_slots, output_dtype, plan_weights

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (scripts/device_run.sh runs these on one)", allow_module_level=True)

PROFILE = TokenProfile(min=1, opt=16, max=512)
SPECS = {
    "bf16_swiglu": MoESpec(hidden_size=256, intermediate_size=128, num_experts=8, top_k=2, dtype=DType.BF16,
                           routing=Routing(method=RoutingMethod.TOPK_SOFTMAX)),
    "fp16_full": MoESpec(hidden_size=256, intermediate_size=128, num_experts=16, top_k=4, dtype=DType.FP16,
                         expert_bias=True,
                         routing=Routing(method=RoutingMethod.SIGMOID_GROUPED, num_groups=4, topk_groups=2,
                                         correction_bias=True, renormalize=True, routed_scaling_factor=2.5),
                         shared=SharedExperts(count=1, intermediate_size=192, sigmoid_gate=True)),
    "fp16_relu": MoESpec(hidden_size=128, intermediate_size=64, num_experts=4, top_k=1, dtype=DType.FP16,
                         activation=Activation.RELU),
}
# Relative Frobenius error allowed against fp64 (inputs are exact in the model dtype; the rest is
# the kernels' own rounding of intermediates).
TOLERANCE = {DType.BF16: 2e-2, DType.FP16: 4e-3, DType.FP32: 1e-4}


def device_sm() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def make_case(name: str, force: dict[str, str], tokens: int, logits_dtype: torch.dtype = torch.float32):
    spec = SPECS[name]
    plan = make_plan(spec, Target(sm=device_sm(), flavour=Flavour.TENSORRT, profile=PROFILE), tokens=16, force=force)
    model = TORCH_DTYPE[spec.dtype]
    weights = MoEWeights.random(spec, seed=tokens).to("cuda", model)
    g = torch.Generator().manual_seed(1000 + tokens)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", model)
    logits = torch.randn(tokens, spec.num_experts, generator=g).to("cuda", logits_dtype)
    return spec, plan, weights, hidden, logits


def enqueue(spec, plan, weights, hidden, logits, workspace_tokens=None, cache=None, given=None) -> torch.Tensor:
    """Call the enqueue core as TensorRT would: pointers, descriptors' shapes/dtypes, workspace, stream.
    `given`: the weight inputs as the engine holds them (default: plan_weights of `weights`, which
    interleaves W1 for the gated epilogue)."""
    given = given or plan_weights(plan, weights)
    inputs = [hidden, logits] + slot_tensors(spec, given)
    out = torch.full_like(hidden, float("nan"), dtype=output_dtype(spec))  # poisoned
    ws_bytes = workspace_size(spec, plan, workspace_tokens or hidden.shape[0])
    workspace = torch.full((max(ws_bytes, 1),), 0xFF, dtype=torch.uint8, device="cuda")  # poisoned too
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    run_enqueue(spec, plan, [t.data_ptr() for t in inputs], [tuple(t.shape) for t in inputs],
                   [t.dtype for t in inputs], out.data_ptr(), out.dtype, workspace.data_ptr(), ws_bytes,
                   stream.cuda_stream, cache)
    stream.synchronize()
    return out


def slot_tensors(spec, given: MoEWeights) -> list[torch.Tensor]:
    """The weight inputs in slot order, as TensorRT holds them (a scalar activation scale as its [1] view, uint8
    bytes as INT8)."""
    named = dict(given.named())
    return [s.carried(named[s.name].reshape(s.shape)) for s in input_slots(spec)[2:]]


def check(spec, weights, hidden, logits, out) -> None:
    ref = moe_reference(spec, weights, hidden.cpu(), router_logits=logits.cpu(), dtype=torch.float64)
    got = out.cpu().double()
    assert torch.isfinite(got).all(), "the plugin left poisoned (NaN) output rows"
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[spec.dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("tokens", [1, 37, 300])  # 300 > 256: the three-step prologue runs
@pytest.mark.parametrize("name, force", [
    ("bf16_swiglu", {}),
    ("bf16_swiglu", {"gemm_kernel": "ampere"}),
    ("bf16_swiglu", {"finalize": "separate"}),
    ("bf16_swiglu", {"fc1_activation": "separate"}),  # on sm90: stacked W1 and the separate activation
    ("fp16_full", {}),
    ("fp16_relu", {}),
    ("fp16_relu", {"gemm_kernel": "ampere"}),  # relu in the Ampere GEMM1 epilogue
])
def test_enqueue_matches_reference(name, force, tokens):
    spec, plan, weights, hidden, logits = make_case(name, force, tokens)
    check(spec, weights, hidden, logits, enqueue(spec, plan, weights, hidden, logits))


def test_router_logits_in_the_model_dtype():
    spec, plan, weights, hidden, logits = make_case("fp16_full", {}, 24, logits_dtype=torch.float16)
    check(spec, weights, hidden, logits, enqueue(spec, plan, weights, hidden, logits))


def test_runner_is_reused_across_calls_with_the_profile_workspace():
    """One plugin instance, several token counts, TensorRT's single max-sized workspace."""
    cache = RunnerCache()
    spec, plan, weights, _, _ = make_case("bf16_swiglu", {}, 1)
    given = plan_weights(plan, weights)  # one set of engine buffers, as TensorRT keeps them
    runners = set()
    for tokens in (5, 300, 2):
        g = torch.Generator().manual_seed(tokens)
        hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch.bfloat16)
        logits = torch.randn(tokens, spec.num_experts, generator=g).to("cuda")
        out = enqueue(spec, plan, weights, hidden, logits, workspace_tokens=PROFILE.max, cache=cache, given=given)
        check(spec, weights, hidden, logits, out)
        runners.add(id(cache._runner))
    assert len(runners) == 1


def test_repeated_enqueues_on_the_same_buffers_see_new_inputs():
    """TensorRT's steady state: every call hands over the same addresses with new contents, so
    the cached wrappers and carved workspace are reused (no wrapper is made after the first call)."""
    cache = RunnerCache()
    spec, plan, weights, hidden, logits = make_case("bf16_swiglu", {}, 37)
    inputs = [hidden, logits] + slot_tensors(spec, plan_weights(plan, weights))
    out = torch.empty_like(hidden)
    ws_bytes = workspace_size(spec, plan, PROFILE.max)
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    made = []
    for call in range(3):
        g = torch.Generator().manual_seed(call)
        hidden.copy_(torch.randn(hidden.shape, generator=g))
        logits.copy_(torch.randn(logits.shape, generator=g))
        out.fill_(float("nan"))
        workspace.fill_(0xFF)
        torch.cuda.synchronize()
        run_enqueue(spec, plan, [t.data_ptr() for t in inputs], [tuple(t.shape) for t in inputs],
                       [t.dtype for t in inputs], out.data_ptr(), out.dtype, workspace.data_ptr(), ws_bytes,
                       stream.cuda_stream, cache)
        stream.synchronize()
        check(spec, weights, hidden, logits, out)
        made.append(len(cache._memo))
    assert made[0] == made[1] == made[2]


def test_too_small_workspace_is_refused():
    spec, plan, weights, hidden, logits = make_case("bf16_swiglu", {}, 64)
    need = workspace_size(spec, plan, 64)
    inputs = [hidden, logits] + slot_tensors(spec, weights)
    out = torch.empty_like(hidden)
    with pytest.raises(MoeBuildError, match="workspace"):
        run_enqueue(spec, plan, [t.data_ptr() for t in inputs], [tuple(t.shape) for t in inputs],
                       [t.dtype for t in inputs], out.data_ptr(), out.dtype, 0, need - 1,
                       torch.cuda.current_stream().cuda_stream)


# ---- FP8 layers: the plugin's FP8 weight and scale inputs run exactly what MoERunner runs ------------------

FP8_MODES = {  # mode -> (quant, act_scale, the checkpoint's weight-scale granularity)
    "tensor_static": (Quant.FP8, ActScale.STATIC, ScaleGranularity.TENSOR),
    "tensor_dynamic": (Quant.FP8, ActScale.DYNAMIC, ScaleGranularity.TENSOR),
    "channel": (Quant.FP8, ActScale.DYNAMIC, ScaleGranularity.CHANNEL),
    "block128": (Quant.FP8_BLOCK, ActScale.DYNAMIC, ScaleGranularity.BLOCK128),
}
FP8_SPECS = {
    "plain": MoESpec(hidden_size=256, intermediate_size=512, num_experts=8, top_k=2, dtype=DType.BF16,
                     routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True)),
    # every optional input beside the scales, sizes off multiples of 128 (partial scale blocks)
    "full": MoESpec(hidden_size=208, intermediate_size=336, num_experts=16, top_k=4, dtype=DType.FP16,
                    expert_bias=True,
                    routing=Routing(method=RoutingMethod.SIGMOID_GROUPED, num_groups=4, topk_groups=2,
                                    correction_bias=True, renormalize=True, routed_scaling_factor=2.5),
                    shared=SharedExperts(count=1, intermediate_size=192, sigmoid_gate=True)),
}


def assert_enqueue_equals_runner(spec, plan, weights, tokens: int, seed: int) -> None:
    """run_enqueue over the engine's buffers (plan_weights' order, scales and the rest as plugin inputs) writes
    exactly the output of MoERunner given the canonical weights and the same plan, every element (both outputs
    NaN-poisoned, the plugin's workspace poisoned too), on fresh inputs drawn from `seed`."""
    from moe_build.runner import MoERunner
    model = TORCH_DTYPE[spec.dtype]
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", model)
    logits = torch.randn(tokens, spec.num_experts, generator=g).to("cuda")
    got = enqueue(spec, plan, weights, hidden, logits)
    runner = MoERunner(spec, weights, plan=plan, device="cuda")
    want = torch.full_like(hidden, float("nan"))
    runner(hidden, router_logits=logits, out=want)
    torch.cuda.synchronize()
    assert not want.isnan().any() and not got.isnan().any(), f"an output element was not written (seed {seed})"
    differ = (got != want).sum().item()
    assert differ == 0, f"{differ} of {got.numel()} elements differ from MoERunner's (seed {seed}, steps " \
                        f"{runner.kernel_sequence(tokens, 'logits')})"


def check_fp8_against_runner(name: str, mode: str, force: dict[str, str], tokens: int) -> None:
    """Fresh random FP8 weights and inputs: run_enqueue over the engine's buffers (plan_weights' order, the
    scales as plugin inputs) must write exactly the output of MoERunner given the canonical weights and the
    same plan, every element (both outputs NaN-poisoned, the plugin's workspace poisoned too)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 kernels need compute capability 8.9 or later")
    quant, act_scale, granularity = FP8_MODES[mode]
    spec = FP8_SPECS[name].with_overrides(quant=quant, act_scale=act_scale)
    seed = random.SystemRandom().randrange(1 << 30)
    model = TORCH_DTYPE[spec.dtype]
    weights = MoEWeights.random(spec, seed=seed).quantized_fp8(
        granularity, static=act_scale is ActScale.STATIC, a1_scale=4.5 / 448, a2_scale=3.0 / 448).to("cuda", model)
    plan = make_plan(spec, Target(sm=device_sm(), flavour=Flavour.TENSORRT, profile=PROFILE), tokens=16, force=force)
    assert_enqueue_equals_runner(spec, plan, weights, tokens, seed)


@pytest.mark.parametrize("tokens", [1, 37, 300])  # 300 > 256: the three-step prologue runs
@pytest.mark.parametrize("force", [{}, {"fc1_input_quant": "separate", "fc2_input_quant": "separate"}],
                         ids=["fused_quant", "separate_quant"])
@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_enqueue_equals_the_runner(mode, force, tokens):
    check_fp8_against_runner("plain", mode, force, tokens)


@pytest.mark.parametrize("mode", FP8_MODES)
def test_fp8_enqueue_with_every_optional_input(mode):
    # finalize separate: with top_k 4 the fused finalize's atomic adds land in any order, so two runs differ in the
    # last bit (with top_k 2, above, two adds into zero commute and the fused finalize is compared exactly)
    check_fp8_against_runner("full", mode, {"finalize": "separate"}, 37)


# ---- weight-only layers: the plugin's stored-weight inputs run exactly what MoERunner runs -------------------

WOQ_MODES = {  # mode -> (quant, stored kind, group (None: per channel), zero points, AWQ pre-quant scales)
    "awq_g64_zeros": (Quant.W4A16_AWQ, WoqKind.INT4, 64, True, True),
    "int4_g128": (Quant.W4A16_AWQ, WoqKind.INT4, 128, False, False),
    "int8_channel": (Quant.W8A16, WoqKind.INT8, None, False, False),
    "mxfp4": (Quant.WFP4A16, WoqKind.MXFP4, 32, False, False),
}


def check_woq_against_runner(name: str, mode: str, tokens: int, profile: TokenProfile = PROFILE) -> Plan:
    """Fresh random weight-only experts and inputs: run_enqueue over the engine's buffers (the stored W1 / W2 and
    their scales, zero points and pre-quant scales as plugin inputs) must write exactly MoERunner's output."""
    quant, kind, group, zeros, awq = WOQ_MODES[mode]
    base = FP8_SPECS[name]
    seed = random.SystemRandom().randrange(1 << 30)
    model = TORCH_DTYPE[base.dtype]
    weights = MoEWeights.random(base, seed=seed).quantized_woq(kind, group, asymmetric=zeros, awq=awq,
                                                               seed=seed).to("cuda", model)
    spec = base.with_overrides(quant=quant, quant_group_size=group or 128, **weights.woq.storage_flags())
    plan = make_plan(spec, Target(sm=device_sm(), flavour=Flavour.TENSORRT, profile=profile), tokens=16)
    assert_enqueue_equals_runner(spec, plan, weights, tokens, seed)
    return plan


@pytest.mark.parametrize("tokens", [1, 300])
@pytest.mark.parametrize("mode", WOQ_MODES)
def test_woq_enqueue_equals_the_runner(mode, tokens):
    check_woq_against_runner("plain", mode, tokens)


@pytest.mark.parametrize("tokens", [1, 16])
@pytest.mark.parametrize("mode", ["awq_g64_zeros", "int4_g128"])
def test_woq_enqueue_with_int4_tiles(mode, tokens):
    """A decode-sized profile (16 tokens): the plan holds int4 codes in 16-row tiles (weight_layout=int4_tiles), the
    engine's W1 / W2 inputs in that form, which the plugin's runner reads as such."""
    plan = check_woq_against_runner("plain", mode, tokens, TokenProfile(min=1, opt=16, max=16))
    assert plan.stage("weight_layout").choice == "int4_tiles"
