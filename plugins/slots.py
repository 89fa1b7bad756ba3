"""The MoE plugin's inputs and output: which tensors, in which order, shapes and dtypes, all derived from the spec.


Inputs, in this order (optional ones present exactly when the spec uses them; T is dynamic; E is the experts
the layer holds, spec.stored_experts: one rank's under expert parallelism, the router's logits and correction
bias still covering all num_experts):
  0 hidden          [T, H]        spec dtype
  1 router_logits   [T, E]        fp32 or spec dtype
  2 w1              [E, N1, H]    spec dtype, FP8 (e4m3) for quant fp8 / fp8_block (N1 = 2*I for gated
                                  activations: gate rows, then up rows; in the plan's w1_order and
                                  weight_layout: see plan_weights)
  3 w2              [E, H, I]     spec dtype, FP8 for quant fp8 / fp8_block (in the plan's weight_layout)
    fp8.w1_scale    fp32          if quant fp8: [E, N1] (channel); fp8_block: [E, ceil(N1/128), ceil(H/128)]
    fp8.w2_scale    fp32          if quant fp8: [E, H] (channel);  fp8_block: [E, ceil(H/128), ceil(I/128)]
    fp8.a1_scale    [1] fp32      if quant fp8 with act_scale static (GEMM1's input scale)
    fp8.a2_scale    [1] fp32      if quant fp8 with act_scale static (GEMM2's input scale)
  weight-only layers (w4a16_awq, w8a16, wfp4a16, and w4afp8's int4 weights; moe_build/weights/woq.py's storage)
  instead of 2 and 3:
  2 w1              [E, N1, H/2]  uint8 (two 4-bit codes a byte: int4 or MXFP4; int4 in 16-row tiles where the
                                  plan's weight_layout is int4_tiles), or [E, N1, H] int8 (w8a16)
  3 w2              [E, H, I/2]   uint8, or [E, H, I] int8
    woq.w1_scale    [E, N1, G1]   fp32 (MXFP4: uint8 e8m0), G1 = H / group (1 where spec.quant_per_channel)
    woq.w2_scale    [E, H, G2]    likewise, G2 = I / group
    woq.w1_zero     [E, N1, G1]   uint8      if spec.quant_zero_points (int4 zero points)
    woq.w2_zero     [E, H, G2]    uint8      if spec.quant_zero_points
    woq.fc1_act_scale [H]         fp32       if spec.quant_prequant_scales (AWQ pre-quant scales)
    woq.fc2_act_scale [I]         fp32       if spec.quant_prequant_scales
    woq.a1_scale    [1] fp32      if quant w4afp8 with act_scale static (GEMM1's FP8 input scale)
    woq.a2_scale    [1] fp32      if quant w4afp8 with act_scale static (GEMM2's FP8 input scale)
  (every uint8 input crosses TensorRT as INT8, the same bytes, and the plugin reads it back as uint8: a constant
  layer refuses UINT8 weights, "invalid weights type of UInt8" from TensorRT-RTX 1.7's network API, and TensorRT
  gives UINT8 no role but network I/O; tests/test_engine_build.py builds such layers through that API)
    b1              [E, N1]       spec dtype      if spec.expert_bias (in w1's order)
    b2              [E, H]        spec dtype      if spec.expert_bias
    correction_bias [E]           fp32            if spec.routing.correction_bias
    shared_w1       [N1s, H]      spec dtype      if spec.shared.count
    shared_w2       [H, Is]       spec dtype      if spec.shared.count
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from moe_build.errors import MoeBuildError
from moe_build.planner import Plan
from moe_build.runner import sequence
from moe_build.spec import ActScale, MoESpec, Quant
from moe_build.weights import MoEWeights
from moe_build.weights.dtypes import TORCH_DTYPE, TORCH_OUT_DTYPE
from moe_build.weights.fp8 import FP8_DTYPE, ScaleGranularity, blocks
from moe_build.weights.woq import MXFP4_GROUP, QUANT_KIND, WoqKind

# Quant modes whose weights and scales the plugin's inputs carry.
PLUGIN_QUANTS = (Quant.NONE, Quant.FP8, Quant.FP8_BLOCK, Quant.W8A16, Quant.W4A16_AWQ, Quant.WFP4A16, Quant.W4AFP8)
FP8_SLOT_PREFIX = "fp8."  # scale slots are named as MoEWeights.named() names the Fp8Scales tensors
WOQ_SLOT_PREFIX = "woq."  # and the weight-only scales, zero points and pre-quant scales (WoqWeights' fields)


@dataclass(frozen=True)
class InputSlot:
    """One plugin input: its name (for weights and scales, as `MoEWeights.named()` names the tensor), shape
    and accepted dtypes.

    `shape` uses None for the token dimension; `dtypes[0]` is the dtype `add_moe_plugin` feeds. `stored`: the
    dtype moe-build keeps these bytes in, where TensorRT carries them as another type of the same size (uint8
    as INT8), else None.
    """

    name: str
    shape: tuple[int | None, ...]
    dtypes: tuple[torch.dtype, ...]
    stored: torch.dtype | None = None

    def carried(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (in the stored dtype) as TensorRT carries it: the same bytes, no conversion."""
        return t if self.stored is None else t.view(self.dtypes[0])

    def as_stored(self, t: torch.Tensor) -> torch.Tensor:
        """TensorRT's buffer `t` read back in the stored dtype: the same bytes."""
        return t if self.stored is None else t.view(self.stored)


def scale_granularity(spec: MoESpec) -> ScaleGranularity | None:
    """The granularity of the weight scales among the plugin's inputs (None: unquantized).

    Implied by the quant mode, so no field can disagree with it: `plan_weights` turns per-tensor
    scales into per-channel ones (what the FP8 GEMM's rowwise mode reads), so fp8 layers always carry
    CHANNEL scales, and fp8_block layers BLOCK128 scales (MoEWeights.check allows no other).
    """
    if spec.quant is Quant.FP8:
        return ScaleGranularity.CHANNEL
    if spec.quant is Quant.FP8_BLOCK:
        return ScaleGranularity.BLOCK128
    return None


@functools.lru_cache(maxsize=64)
def input_slots(spec: MoESpec) -> tuple[InputSlot, ...]:
    """The plugin's inputs for `spec`, in order (see the module docstring)."""
    model = TORCH_DTYPE[spec.dtype]
    E, H, I, n1 = spec.stored_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features
    logits = (torch.float32,) if model == torch.float32 else (torch.float32, model)
    granularity = scale_granularity(spec)
    kind = QUANT_KIND.get(spec.quant)
    slots = [InputSlot("hidden", (None, H), (model,)), InputSlot("router_logits", (None, spec.num_experts), logits)]
    if kind is not None:
        slots += _woq_slots(spec, kind)
    else:
        expert = model if granularity is None else FP8_DTYPE
        slots += [InputSlot("w1", (E, n1, H), (expert,)), InputSlot("w2", (E, H, I), (expert,))]
    if granularity is not None:
        slots += _scale_slots(spec, granularity)
    if spec.expert_bias:
        slots += [InputSlot("b1", (E, n1), (model,)), InputSlot("b2", (E, H), (model,))]
    if spec.routing.correction_bias:  # selection-only bias: MoEWeights keeps it in fp32
        slots.append(InputSlot("correction_bias", (spec.num_experts,), (torch.float32,)))
    if spec.shared.count:
        si = spec.shared.intermediate_size
        slots += [InputSlot("shared_w1", (si * (2 if spec.activation.is_gated else 1), H), (model,)),
                  InputSlot("shared_w2", (H, si), (model,))]
        if spec.shared.sigmoid_gate:
            slots.append(InputSlot("shared_gate", (1, H), (model,)))
    return tuple(slots)


def _scale_slots(spec: MoESpec, granularity: ScaleGranularity) -> list[InputSlot]:
    """The fp32 scale inputs of an FP8 layer in the shapes the runner reads after `plan_weights`; the static
    activation scales (fp32 scalars in Fp8Scales) as one-element tensors, since TensorRT inputs have a shape."""
    E, H, I, n1 = spec.stored_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features
    if granularity is ScaleGranularity.BLOCK128:
        w1, w2 = (E, blocks(n1), blocks(H)), (E, blocks(H), blocks(I))
    else:
        w1, w2 = (E, n1), (E, H)
    names = ["w1_scale", "w2_scale"] + (["a1_scale", "a2_scale"] if spec.act_scale is ActScale.STATIC else [])
    shapes = [w1, w2, (1,), (1,)]
    return [InputSlot(FP8_SLOT_PREFIX + n, shape, (torch.float32,)) for n, shape in zip(names, shapes)]


def woq_group(spec: MoESpec) -> int | None:
    """Input columns per weight scale of a weight-only layer (None: one per output channel), from its spec."""
    if spec.quant is Quant.WFP4A16:
        return MXFP4_GROUP
    return None if spec.quant_per_channel else spec.quant_group_size


def _woq_slots(spec: MoESpec, kind: WoqKind) -> list[InputSlot]:
    """A weight-only layer's expert inputs as woq.py stores them: W1 / W2 packed (two 4-bit codes a byte) or int8,
    their scales (fp32, or e8m0 bytes for MXFP4), int4 zero points where the spec has them, the AWQ pre-quant
    scales where it has those, and W4AFP8's static FP8 input scales where its activations have them."""
    E, H, I, n1 = spec.stored_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features
    data = torch.int8 if kind is WoqKind.INT8 else torch.uint8
    per_byte = 1 if kind is WoqKind.INT8 else 2
    group = woq_group(spec)

    def groups(cols: int) -> int:
        return 1 if group is None else cols // group

    def slot(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> InputSlot:
        if dtype is torch.uint8:  # as INT8 through TensorRT (the module docstring)
            return InputSlot(name, shape, (torch.int8,), stored=torch.uint8)
        return InputSlot(name, shape, (dtype,))
    scale = torch.uint8 if kind is WoqKind.MXFP4 else torch.float32
    slots = [slot("w1", (E, n1, H // per_byte), data), slot("w2", (E, H, I // per_byte), data),
             slot(WOQ_SLOT_PREFIX + "w1_scale", (E, n1, groups(H)), scale),
             slot(WOQ_SLOT_PREFIX + "w2_scale", (E, H, groups(I)), scale)]
    if spec.quant_zero_points:
        slots += [slot(WOQ_SLOT_PREFIX + "w1_zero", (E, n1, groups(H)), torch.uint8),
                  slot(WOQ_SLOT_PREFIX + "w2_zero", (E, H, groups(I)), torch.uint8)]
    if spec.quant_prequant_scales:
        slots += [InputSlot(WOQ_SLOT_PREFIX + "fc1_act_scale", (H,), (torch.float32,)),
                  InputSlot(WOQ_SLOT_PREFIX + "fc2_act_scale", (I,), (torch.float32,))]
    if spec.quant is Quant.W4AFP8 and spec.act_scale is ActScale.STATIC:  # fp32 scalars in WoqWeights
        slots += [InputSlot(WOQ_SLOT_PREFIX + n, (1,), (torch.float32,)) for n in ("a1_scale", "a2_scale")]
    return slots


def output_dtype(spec: MoESpec) -> torch.dtype:
    """Dtype of the plugin's output; FP8/FP4 outputs are refused (the planner refuses them too)."""
    if spec.out_dtype not in TORCH_OUT_DTYPE:
        raise MoeBuildError("output_dtype", f"the MoE plugin does not produce {spec.out_dtype.value}",
                            [d.value for d in TORCH_OUT_DTYPE])
    return TORCH_OUT_DTYPE[spec.out_dtype]


def plan_weights(plan: Plan, weights: MoEWeights) -> MoEWeights:
    """The canonical `weights` in the order the plugin's inputs take for `plan` (`sequence.plan_weights`: W1 / b1
    in its w1_order, then W1 / W2 in its weight_layout), so the engine holds one W1 and one W2 and the runner
    copies neither."""
    return sequence.plan_weights(plan, weights)
