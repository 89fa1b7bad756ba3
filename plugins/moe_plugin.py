"""`MoEPlugin`: the plugin path's fused MoE layer as a TensorRT IPluginV3.

The module has two halves so each can be checked where it can run:

- a TensorRT-free core (input layout, field encoding and validation, shape/format rules,
  workspace size, `run_enqueue`) that only needs PyTorch. The GPU test calls `run_enqueue`
  directly, because the GPU machine has no TensorRT of any kind;
- thin adapters (`plugin_classes(trt)`) that subclass the IPluginV3 interfaces of whichever
  TensorRT-family module they are given (full `tensorrt`, or `tensorrt_rtx_bindings`, which has
  the interfaces but no `add_plugin_v3`), and translate TensorRT's descriptors to the core.

Fields: `spec` and `plan` (UTF-8 JSON of `MoESpec.to_dict()` / `Plan.to_dict()`), and `ep_size` / `ep_rank`
(UTF-8 JSON integers, TensorRT-LLM's MoE plugin's names for expert parallelism; ep_rank null for a whole
layer): they repeat the spec's so that a tool reading an engine's plugin fields sees the rank without parsing
the spec, and are refused where they disagree with it. Everything else (input order, shapes, dtypes, the FP8
scales' granularity) is derived from the spec, so nothing serialized can disagree with them; the plan is
checked against the spec and against the planner when the fields are decoded, and a plugin is never built
from fields that fail those checks. A plan whose `dispatch` is not `none` (expert parallelism) is serialized
and read back, but no runner is made from it: a rank's experts run only through
moe_build.runner.expert_parallel.ExpertParallelMoE, which needs a process group.

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
  2 w1              [E, N1, H/2]  uint8 (two 4-bit codes a byte: int4 or MXFP4), or [E, N1, H] int8 (w8a16)
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
    shared_gate     [1, H]        spec dtype      if spec.shared.sigmoid_gate
Output 0: [T, H] in the spec's output dtype. All tensors linear (row-major, contiguous).
"""
from __future__ import annotations

import functools
import json
from collections import OrderedDict
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any, Mapping, Sequence

import torch

from moe_build.errors import MoeBuildError
from moe_build.jsonfile import parse_json_object
from moe_build.planner import PLAN_SCHEMA_VERSION, Plan, make_plan
from moe_build.runner import sequence
from moe_build.spec import ActScale, DType, MoESpec, OutputDType, Quant
from moe_build.target import Target
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import FP8_DTYPE, Fp8Scales, ScaleGranularity, blocks
from moe_build.weights.woq import MXFP4_GROUP, QUANT_KIND, WoqKind, WoqWeights

PLUGIN_NAME = "MoEPlugin"
PLUGIN_NAMESPACE = "moe_build"
PLUGIN_VERSION = "1"
FIELD_SPEC = "spec"
FIELD_PLAN = "plan"
FIELD_EP_SIZE = "ep_size"
FIELD_EP_RANK = "ep_rank"
FIELD_NAMES = (FIELD_SPEC, FIELD_PLAN, FIELD_EP_SIZE, FIELD_EP_RANK)

TORCH_DTYPE = {DType.FP32: torch.float32, DType.FP16: torch.float16, DType.BF16: torch.bfloat16}
TORCH_OUT_DTYPE = {OutputDType.FP32: torch.float32, OutputDType.FP16: torch.float16,
                   OutputDType.BF16: torch.bfloat16}
# TensorRT DataType member names of the dtypes the plugin moves (same in both flavours).
TRT_DTYPE_NAME = {torch.float32: "FLOAT", torch.float16: "HALF", torch.bfloat16: "BF16", FP8_DTYPE: "FP8",
                  torch.int8: "INT8"}
# Quant modes whose weights and scales the plugin's inputs carry.
PLUGIN_QUANTS = (Quant.NONE, Quant.FP8, Quant.FP8_BLOCK, Quant.W8A16, Quant.W4A16_AWQ, Quant.WFP4A16, Quant.W4AFP8)
FP8_SLOT_PREFIX = "fp8."  # scale slots are named as MoEWeights.named() names the Fp8Scales tensors
WOQ_SLOT_PREFIX = "woq."  # and the weight-only scales, zero points and pre-quant scales (WoqWeights' fields)
# Same-size integer stand-ins: the CUDA array interface has no bf16 or e4m3 typestr, so raw device memory
# is wrapped as integers of the element size and reinterpreted with `Tensor.view(dtype)`.
_RAW_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4"}


# ---- input layout and field encoding (pure) ------------------------------------------------

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


def forced_choices(plan: Plan) -> dict[str, str]:
    """The stages the user pinned when the plan was made: re-planning with these reproduces the plan."""
    return {s.stage: s.choice for s in plan.stages if s.forced}


def _canonical_json(data: Mapping[str, Any]) -> bytes:
    """Deterministic JSON, so equal spec/plans serialize to identical bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode_fields(spec: MoESpec, plan: Plan) -> dict[str, bytes]:
    """Field name -> bytes for `spec` and `plan`, after checking they describe one plugin layer."""
    check_spec_and_plan(spec, plan)
    return {FIELD_SPEC: _canonical_json(spec.to_dict()), FIELD_PLAN: _canonical_json(plan.to_dict()),
            FIELD_EP_SIZE: json.dumps(spec.ep_size).encode(), FIELD_EP_RANK: json.dumps(spec.ep_rank).encode()}


def _field_error(name: str, problem: str) -> MoeBuildError:
    return MoeBuildError(f"{PLUGIN_NAME} field {name!r}", problem)


def decode_fields(fields: Mapping[str, bytes]) -> tuple[MoESpec, Plan]:
    """Parse and check the serialized fields; any problem is a one-line `MoeBuildError`."""
    unknown = sorted(set(fields) - set(FIELD_NAMES))
    if unknown:
        raise MoeBuildError(f"{PLUGIN_NAME} fields", f"unknown field(s) {unknown}", FIELD_NAMES)
    parsed: dict[str, dict[str, Any]] = {}
    for name in (FIELD_SPEC, FIELD_PLAN):  # the ep fields are read against the spec (_check_ep_fields)
        if name not in fields:
            raise _field_error(name, "missing")
        parsed[name] = parse_json_object(bytes(fields[name]), f"{PLUGIN_NAME} field {name!r}", "the field")
    try:
        spec = MoESpec.from_dict(parsed[FIELD_SPEC])
    except MoeBuildError as exc:
        raise _field_error(FIELD_SPEC, f"describes no valid layer ({exc})") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise _field_error(FIELD_SPEC, f"is not a moe-build spec ({type(exc).__name__}: {exc})") from None
    try:
        plan = Plan.from_dict(parsed[FIELD_PLAN])
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise _field_error(FIELD_PLAN, f"is not a moe-build plan ({type(exc).__name__}: {exc})") from None
    check_spec_and_plan(spec, plan)
    _check_ep_fields(spec, fields)
    return spec, plan


def _check_ep_fields(spec: MoESpec, fields: Mapping[str, bytes]) -> None:
    """`ep_size` / `ep_rank` as JSON integers (ep_rank null: the whole layer), equal to the spec's."""
    for name, want in ((FIELD_EP_SIZE, spec.ep_size), (FIELD_EP_RANK, spec.ep_rank)):
        if name not in fields:
            raise _field_error(name, "missing")
        try:
            got = json.loads(bytes(fields[name]).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise _field_error(name, "is not a JSON integer") from None
        if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
            raise _field_error(name, f"is {got!r}, not an integer")
        if got != want:
            raise _field_error(name, f"is {got!r} but the 'spec' field says {name}={want!r}")


def check_spec_and_plan(spec: MoESpec, plan: Plan) -> None:
    """Refuse a spec/plan pair the plugin cannot run as given.

    The plan must be a plugin-path plan for exactly this spec, and it must be what the planner
    decides for (spec, plan's target, plan's tokens, plan's forced stages): that catches a
    hand-edited plan and a plan made by a different moe-build, whose choices the runner of this
    one would not reproduce.
    """
    if plan.schema != PLAN_SCHEMA_VERSION:
        raise _field_error(FIELD_PLAN, f"has schema {plan.schema!r}; this moe-build reads {PLAN_SCHEMA_VERSION!r}")
    if plan.path != "plugin":
        raise _field_error(FIELD_PLAN, f"is a {plan.path!r}-path plan; the MoE plugin runs plugin-path plans only")
    if json.loads(_canonical_json(plan.spec)) != json.loads(_canonical_json(spec.to_dict())):
        raise _field_error(FIELD_PLAN, "was made for a different spec than the 'spec' field")
    if spec.quant not in PLUGIN_QUANTS:
        raise MoeBuildError("quant", f"the MoE plugin's inputs carry no {spec.quant.value} weights or scales",
                            [q.value for q in PLUGIN_QUANTS])
    if spec.lora:
        raise MoeBuildError("lora", "the MoE plugin has no LoRA inputs", "false")
    if spec.fp8_input:
        raise MoeBuildError("fp8_input", "the MoE plugin's hidden input is in the spec's 16-bit dtype", "false")
    if spec.dtype is DType.FP32:
        raise MoeBuildError("dtype", "the MoE plugin's grouped GEMMs are fp16/bf16 only (fp32 is not implemented)",
                            ("fp16", "bf16"))
    output_dtype(spec)
    try:
        target = Target.from_dict(plan.target)
    except (TypeError, ValueError, KeyError, MoeBuildError) as exc:
        raise _field_error(FIELD_PLAN, f"has an invalid target ({type(exc).__name__}: {exc})") from None
    try:
        replanned = make_plan(spec, target, plan.tokens, forced_choices(plan))
    except MoeBuildError as exc:
        raise _field_error(FIELD_PLAN, f"cannot be reproduced by the planner ({exc})") from None
    if json.loads(_canonical_json(replanned.to_dict())) != json.loads(_canonical_json(plan.to_dict())):
        differ = [s.stage for s, r in zip(plan.stages, replanned.stages) if s.to_dict() != r.to_dict()]
        raise _field_error(FIELD_PLAN, "differs from what the planner decides for its spec/target/tokens "
                           f"(stages {differ or 'path gates'}): tampered or made by another moe-build; rebuild")


# ---- build-side rules (pure) ---------------------------------------------------------------

def output_dims(input_dims: Sequence[Sequence[Any]]) -> list[Any]:
    """Output 0's dims from the inputs' dims: the hidden input's rows and columns.

    Works on any dim representation (ints, or TensorRT's IDimensionExpr), so the same rule
    serves get_output_shapes (symbolic) and run_enqueue (concrete).
    """
    if not input_dims:
        raise MoeBuildError(PLUGIN_NAME, "has no inputs; the first must be hidden states [T, H]")
    hidden = list(input_dims[0])
    if len(hidden) != 2:
        raise MoeBuildError(PLUGIN_NAME, f"hidden states must be 2-D [T, H], got rank {len(hidden)}")
    return [hidden[0], hidden[1]]


def check_input_dims(spec: MoESpec, dims: Sequence[Sequence[int]]) -> None:
    """Refuse inputs whose count or static dims do not fit `spec` (-1 marks a dynamic dim).

    The token dimension must be the same (or dynamic) in hidden and router_logits.
    """
    slots = input_slots(spec)
    if len(dims) != len(slots):
        raise MoeBuildError(PLUGIN_NAME, f"got {len(dims)} inputs, the spec needs {len(slots)}",
                            [s.name for s in slots])
    for slot, got in zip(slots, dims):
        got = tuple(int(d) for d in got)
        fits = len(got) == len(slot.shape) and all(
            g == -1 or w is None or g == w for g, w in zip(got, slot.shape))
        if not fits:
            want = tuple("T" if w is None else w for w in slot.shape)
            raise MoeBuildError(f"{PLUGIN_NAME} input {slot.name!r}", f"dims {got} do not fit the spec",
                                f"shape {want}")
    rows_hidden, rows_logits = int(dims[0][0]), int(dims[1][0])
    if -1 not in (rows_hidden, rows_logits) and rows_hidden != rows_logits:
        raise MoeBuildError(f"{PLUGIN_NAME} input 'router_logits'",
                            f"has {rows_logits} rows, hidden has {rows_hidden}", "the same token count")


def supports_io(spec: MoESpec, pos: int, dtype: torch.dtype | None, linear: bool, num_inputs: int) -> bool:
    """Whether tensor `pos` (inputs, then the output) may have `dtype` in `linear` format.

    Only the linear format and the exact dtypes of `input_slots`/`output_dtype` are accepted.
    `dtype` is None for a TensorRT type with no torch equivalent (always refused).
    """
    slots = input_slots(spec)
    if num_inputs != len(slots) or not linear or dtype is None or not 0 <= pos <= num_inputs:
        return False
    if pos == num_inputs:
        return dtype == output_dtype(spec)
    return dtype in slots[pos].dtypes


def workspace_size(spec: MoESpec, plan: Plan, max_tokens: int) -> int:
    """Bytes of TensorRT workspace for calls of up to `max_tokens` tokens: the runner's own sizing.

    The runner owns its buffer layout (and the kernel library's scratch queries), so the plugin
    asks it rather than repeating the arithmetic.
    """
    from moe_build.runner import workspace_bytes
    return int(workspace_bytes(spec, plan, max_tokens))


def plan_max_tokens(plan: Plan) -> int:
    """The largest token count the plan was built for (its target's profile): the runner's capacity."""
    return Target.from_dict(plan.target).profile.max


def check_profile(plan: Plan, profile_max_tokens: int) -> None:
    """Refuse an optimization profile reaching past the plan's: the runner holds no more rows."""
    if profile_max_tokens > plan_max_tokens(plan):
        raise MoeBuildError("max_tokens", f"the network's profile allows {profile_max_tokens} tokens, the plan "
                            f"was made for at most {plan_max_tokens(plan)}", f"<= {plan_max_tokens(plan)}")


# ---- enqueue core (PyTorch only) -----------------------------------------------------------

class _DeviceBuffer:
    """A raw device allocation seen through the CUDA array interface, so torch can wrap it in place."""

    def __init__(self, pointer: int, shape: Sequence[int], itemsize: int):
        self.__cuda_array_interface__ = {"shape": tuple(int(s) for s in shape), "typestr": _RAW_TYPESTR[itemsize],
                                         "data": (int(pointer), False), "strides": None, "version": 3}


def wrap_device_pointer(pointer: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CUDA tensor over memory someone else owns (TensorRT's buffers): no copy."""
    raw = torch.as_tensor(_DeviceBuffer(pointer, shape, dtype.itemsize), device="cuda")
    return raw.view(dtype)


class RunnerCache:
    """One execution context's enqueue state: the runner, kept per set of weight addresses, and
    what enqueues at a token count and buffer addresses seen before would otherwise rebuild (the
    workspace size, tensors wrapping TensorRT's pointers, the carved workspace, the stream object).

    TensorRT keeps constant weights at fixed addresses for an execution context's life; a change
    of any address (another context, refit to new memory) builds a new runner and drops the rest.
    Everything kept wraps addresses TensorRT owns; nothing here owns device memory but the runner,
    which also holds what it derives from the weights when it is made (a weight-only layer's scales as
    the mixed-input wgmma GEMM reads them): a refit that rewrites weights in place, at the same
    addresses, is not seen.
    """

    MEMO_ENTRIES = 64  # per context: a few token counts x a few buffer sets

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._runner: Any = None
        self._memo: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    def get(self, key: tuple[Any, ...], make: Any) -> Any:
        if key != self._key:
            if self._key is not None:  # entries made for the previous runner's buffers
                self._memo.clear()
            self._runner, self._key = make(), key
        return self._runner

    def memo(self, key: tuple[Any, ...], make: Any) -> Any:
        """make()'s value for `key`, made once while among the last MEMO_ENTRIES keys used."""
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        value = self._memo[key] = make()
        if len(self._memo) > self.MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return value


def cached_workspace_size(cache: RunnerCache, spec: MoESpec, plan: Plan, tokens: int) -> int:
    """`workspace_size` at `tokens`, kept in `cache`: every enqueue asks for it (the adapter for the
    bytes it passes, `run_enqueue` for its check), and it rebuilds the runner's layout."""
    return cache.memo(("workspace_bytes", tokens), lambda: workspace_size(spec, plan, tokens))


def run_enqueue(spec: MoESpec, plan: Plan, input_pointers: Sequence[int], input_shapes: Sequence[Sequence[int]],
                input_dtypes: Sequence[torch.dtype], output_pointer: int, output_dtype_: torch.dtype,
                workspace_pointer: int, workspace_bytes: int, stream_pointer: int,
                cache: RunnerCache | None = None) -> None:
    """The body of `enqueue`, without TensorRT: run the layer on raw device buffers.

    Wraps the pointers as CUDA tensors (no copies), and runs the runner, made from the plan's
    target and forced stages, on `stream_pointer` (as a torch ExternalStream) with the
    `workspace_pointer` buffer as its workspace. Asynchronous like any enqueue: returns once the
    work is queued. `cache` keeps the runner, and the wrappers and carved workspace of addresses
    seen before, between calls (all are made afresh without it).
    """
    slots = input_slots(spec)
    check_input_dims(spec, input_shapes)
    for slot, dtype in zip(slots, input_dtypes):
        if dtype not in slot.dtypes:
            raise MoeBuildError(f"{PLUGIN_NAME} input {slot.name!r}", f"dtype {dtype} not accepted", slot.dtypes)
    if output_dtype_ != output_dtype(spec):
        raise MoeBuildError(f"{PLUGIN_NAME} output", f"dtype {output_dtype_} not produced", [output_dtype(spec)])
    tokens = int(input_shapes[0][0])
    if tokens == 0:
        return
    cache = cache or RunnerCache()
    max_tokens = cache.memo(("max_tokens",), lambda: plan_max_tokens(plan))
    if tokens > max_tokens:
        raise MoeBuildError("tokens", f"{tokens} exceeds the plan's profile max", f"1..{max_tokens}")
    need = cached_workspace_size(cache, spec, plan, tokens)
    if workspace_bytes < need:
        raise MoeBuildError(f"{PLUGIN_NAME} workspace", f"{workspace_bytes} bytes given, {need} needed for "
                            f"{tokens} tokens", f">= {need}")
    # The weights are wrapped only when a runner is made; its key is their addresses.
    key = (torch.cuda.current_device(),) + tuple(int(p) for p in input_pointers[2:])
    runner = cache.get(key, lambda: _make_runner(spec, plan, {
        slot.name: slot.as_stored(wrap_device_pointer(p, shape, dtype))
        for slot, p, shape, dtype in zip(slots[2:], input_pointers[2:], input_shapes[2:], input_dtypes[2:])}))

    def wrapped(pointer: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(int(d) for d in shape)
        return cache.memo(("tensor", int(pointer), shape, dtype), lambda: wrap_device_pointer(pointer, shape, dtype))

    hidden = wrapped(input_pointers[0], input_shapes[0], input_dtypes[0])
    logits = wrapped(input_pointers[1], input_shapes[1], input_dtypes[1])
    out = wrapped(output_pointer, output_dims(input_shapes), output_dtype_)
    workspace = cache.memo(("workspace", tokens, int(workspace_pointer), int(workspace_bytes)),
                           lambda: runner.bind_workspace(
                               wrap_device_pointer(workspace_pointer, (workspace_bytes,), torch.uint8), tokens))
    stream = cache.memo(("stream", int(stream_pointer)), lambda: torch.cuda.ExternalStream(stream_pointer))
    with torch.cuda.stream(stream):
        runner(hidden, router_logits=logits, out=out, workspace=workspace)


def check_local_dispatch(plan: Plan) -> None:
    """Refuse (one line) a runner for a plan whose experts are split over ranks: the exchange of tokens needs a
    process group, which only ExpertParallelMoE holds."""
    choice = plan.stage("dispatch").choice
    if choice != "none":
        raise MoeBuildError("dispatch", f"{choice}: the plugin runs a rank's experts only through "
                            "moe_build.runner.expert_parallel.ExpertParallelMoE, which needs a process group (per-rank "
                            "OOTB engines build with --moe-plugin disable)", "none")


def _make_runner(spec: MoESpec, plan: Plan, weights: Mapping[str, torch.Tensor]) -> Any:
    """A runner over TensorRT's weight buffers (already in the plan's layouts) that runs the plan as it is:
    `check_spec_and_plan` has shown the planner gives back this plan, so nothing is decided anew here.
    `weights` maps slot names to tensors; the `fp8.*` scales become the layer's Fp8Scales. A plan that splits the
    experts over ranks (dispatch not `none`) is refused: the plugin builds nothing distributed."""
    check_local_dispatch(plan)
    from moe_build.runner import MoERunner
    device = weights["w1"].device
    # The plugin receives router logits, so the router's own weight is never read: a zero-stride
    # placeholder of the right shape satisfies MoEWeights without a real [E, H] tensor.
    router_weight = torch.zeros((), dtype=TORCH_DTYPE[spec.dtype], device=device).expand(
        spec.num_experts, spec.hidden_size)
    tensors = {n: t for n, t in weights.items() if not n.startswith((FP8_SLOT_PREFIX, WOQ_SLOT_PREFIX))}
    granularity = scale_granularity(spec)
    fp8 = woq = None
    if granularity is not None:
        scale = {n[len(FP8_SLOT_PREFIX):]: t for n, t in weights.items() if n.startswith(FP8_SLOT_PREFIX)}
        fp8 = Fp8Scales(granularity, scale["w1_scale"], scale["w2_scale"], scale.get("a1_scale"),
                        scale.get("a2_scale"))
    if spec.quant in QUANT_KIND:
        stored = {n[len(WOQ_SLOT_PREFIX):]: t for n, t in weights.items() if n.startswith(WOQ_SLOT_PREFIX)}
        stored.update({n: stored[n].reshape(()) for n in ("a1_scale", "a2_scale") if n in stored})  # [1] -> []
        woq = WoqWeights(QUANT_KIND[spec.quant], woq_group(spec), tensors["w1"], tensors["w2"], **stored)
    return MoERunner(spec, MoEWeights(router_weight=router_weight, fp8=fp8, woq=woq, **tensors), plan=plan,
                     device=device, weights_prepared=True)


# ---- TensorRT adapters ---------------------------------------------------------------------

def torch_dtype_of(trt: ModuleType, trt_dtype: Any) -> torch.dtype | None:
    """The torch dtype of a TensorRT DataType, None for types the plugin never moves."""
    for dtype, name in TRT_DTYPE_NAME.items():
        if trt_dtype == getattr(trt.DataType, name):
            return dtype
    return None


def trt_dtype_of(trt: ModuleType, dtype: torch.dtype) -> Any:
    return getattr(trt.DataType, TRT_DTYPE_NAME[dtype])


def fields_from_collection(collection: Any) -> dict[str, bytes]:
    """Name -> raw bytes of a PluginFieldCollection (its `data` arrive as numpy arrays)."""
    return {str(f.name): bytes(memoryview(f.data).cast("B")) for f in collection}


@functools.lru_cache(maxsize=None)
def plugin_classes(trt: ModuleType) -> SimpleNamespace:
    """`MoEPlugin` and `MoEPluginCreator` subclassing `trt`'s interfaces (one pair per module)."""
    import numpy as np

    class MoEPluginImpl(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        """The TensorRT face of the MoE layer; every rule lives in the pure functions above."""

        def __init__(self, spec: MoESpec, plan: Plan):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name, self.plugin_namespace, self.plugin_version = PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.num_outputs = 1
            self.spec, self.plan = spec, plan
            # PluginField points into its array without owning it: the plugin owns the field data.
            self._field_arrays = {name: np.frombuffer(data, dtype=np.int8)
                                  for name, data in encode_fields(spec, plan).items()}
            self._cache = RunnerCache()
            self._workspace_given: int | None = None  # bytes TensorRT allocated (get_workspace_size's answer)

        # IPluginV3 / core
        def get_capability_interface(self, capability_type: Any) -> Any:
            return self

        def clone(self) -> "MoEPluginImpl":
            return MoEPluginImpl(self.spec, self.plan)

        # build
        def get_output_data_types(self, input_types: Sequence[Any]) -> list[Any]:
            return [trt_dtype_of(trt, output_dtype(self.spec))]

        def get_output_shapes(self, inputs: Sequence[Any], shape_inputs: Sequence[Any], expr_builder: Any) -> list[Any]:
            slots = input_slots(self.spec)
            ranks = [len(d) for d in inputs]
            if ranks != [len(s.shape) for s in slots]:
                raise MoeBuildError(PLUGIN_NAME, f"input ranks {ranks} do not fit the spec",
                                    [f"{s.name}:{len(s.shape)}" for s in slots])
            return [trt.DimsExprs(output_dims([[d[i] for i in range(len(d))] for d in inputs]))]

        def supports_format_combination(self, pos: int, in_out: Sequence[Any], num_inputs: int) -> bool:
            desc = in_out[pos].desc
            return supports_io(self.spec, pos, torch_dtype_of(trt, desc.type), desc.format == trt.TensorFormat.LINEAR,
                               num_inputs)

        def configure_plugin(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
            check_input_dims(self.spec, [tuple(d.desc.dims) for d in inputs])
            check_profile(self.plan, int(inputs[0].max[0]))

        def get_workspace_size(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> int:
            self._workspace_given = workspace_size(self.spec, self.plan, max(1, int(inputs[0].max[0])))
            return self._workspace_given

        def get_valid_tactics(self) -> list[int]:
            return []  # one implementation per plan: the plan, not TensorRT's timing, picks kernels

        # runtime
        def set_tactic(self, tactic: int) -> None:
            pass  # no tactics are offered (get_valid_tactics), so there is nothing to select

        def on_shape_change(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
            check_input_dims(self.spec, [tuple(d.dims) for d in inputs])

        def attach_to_context(self, resource_context: Any) -> "MoEPluginImpl":
            return self.clone()  # each execution context gets its own runner cache

        def get_fields_to_serialize(self) -> Any:
            return trt.PluginFieldCollection([trt.PluginField(name, array, trt.PluginFieldType.CHAR)
                                              for name, array in self._field_arrays.items()])

        def enqueue(self, input_desc: Sequence[Any], output_desc: Sequence[Any], inputs: Sequence[int],
                    outputs: Sequence[int], workspace: int, stream: int) -> None:
            run_enqueue(self.spec, self.plan, list(inputs), [tuple(d.dims) for d in input_desc],
                        [torch_dtype_of(trt, d.type) for d in input_desc], outputs[0],
                        torch_dtype_of(trt, output_desc[0].type), workspace,
                        self._workspace_bytes(input_desc), stream, self._cache)

        def _workspace_bytes(self, input_desc: Sequence[Any]) -> int:
            """The workspace TensorRT gave: enqueue passes no size, but TensorRT allocates what
            `get_workspace_size` asked for at the profile's max tokens; an engine built by moe-build has the
            plan's profile, so a plugin made from an engine's fields computes the same size (run_enqueue then
            checks this call's need against it)."""
            if self._workspace_given is None:
                self._workspace_given = cached_workspace_size(self._cache, self.spec, self.plan,
                                                              plan_max_tokens(self.plan))
            return self._workspace_given

    class MoEPluginCreatorImpl(trt.IPluginCreatorV3One):
        """Makes `MoEPlugin`s from their fields (at build time and when an engine is loaded)."""

        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self._empty = np.zeros(0, dtype=np.int8)  # PluginField does not own its data
            self.field_names = trt.PluginFieldCollection([
                trt.PluginField(name, self._empty, trt.PluginFieldType.CHAR) for name in FIELD_NAMES])

        def create_plugin(self, name: str, field_collection: Any, phase: Any) -> MoEPluginImpl:
            spec, plan = decode_fields(fields_from_collection(field_collection))
            return MoEPluginImpl(spec, plan)

    MoEPluginImpl.__name__ = MoEPluginImpl.__qualname__ = "MoEPlugin"
    MoEPluginCreatorImpl.__name__ = MoEPluginCreatorImpl.__qualname__ = "MoEPluginCreator"
    return SimpleNamespace(MoEPlugin=MoEPluginImpl, MoEPluginCreator=MoEPluginCreatorImpl)


@functools.lru_cache(maxsize=None)
def register_moe_plugin(trt: ModuleType) -> Any:
    """Register one `MoEPluginCreator` with `trt`'s plugin registry (idempotent) and return it.

    Engines with the plugin can then be deserialized in this process: TensorRT finds the creator
    by (name, version, namespace) and rebuilds each plugin from its serialized fields.
    """
    creator = plugin_classes(trt).MoEPluginCreator()
    registry = trt.get_plugin_registry()
    if not registry.register_creator(creator, PLUGIN_NAMESPACE):
        existing = registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
        if existing is None:
            raise MoeBuildError(PLUGIN_NAME, "the plugin registry refused the creator")
        return existing
    return creator


def add_moe_plugin(network: Any, trt: ModuleType, spec: MoESpec, plan: Plan, hidden: Any, router_logits: Any,
                   weights: MoEWeights, weights_as_constants: bool = True,
                   name: str = "moe") -> tuple[Any, list[Any]]:
    """Insert the MoE plugin layer into `network`; returns (layer, objects to keep alive until built).

    `hidden` [T, H] and `router_logits` [T, E] are network tensors. The expert weights become
    constant layers (`weights_as_constants`, baked into the engine, in `plan_weights` order) or
    network inputs named `{name}.{weight}` (supplied at run time, in that order). FP8 experts go in
    as they are stored: W1 / W2 as DataType.FP8 weights (`trt.Weights` takes the e4m3 bytes with that
    type; a constant's output type is its weights' type) and their scales as fp32, so the engine holds
    the checkpoint's numbers and nothing is dequantized. TensorRT reads constant data only when the
    engine is built, so the returned host buffers (and the Python plugin object) must outlive the build.
    """
    if not hasattr(network, "add_plugin_v3"):
        raise MoeBuildError("flavour", "plugin-path engines need full TensorRT: this network has no add_plugin_v3 "
                            "(TensorRT-RTX has no custom plugin layers); build with --moe-plugin disable", "tensorrt")
    weights.check(spec)
    given = dict(plan_weights(plan, weights).named())
    plugin = plugin_classes(trt).MoEPlugin(spec, plan)
    tensors, keep_alive = [hidden, router_logits], []
    for slot in input_slots(spec)[2:]:
        # check() has shown every shape fits the spec; reshape only gives a scalar activation scale its [1].
        stored = given[slot.name].detach().to("cpu", slot.stored or slot.dtypes[0])
        host = slot.carried(stored.reshape(slot.shape).contiguous())
        if weights_as_constants:
            keep_alive.append(host)
            w = trt.Weights(trt_dtype_of(trt, slot.dtypes[0]), host.data_ptr(), host.numel())
            layer = network.add_constant(trt.Dims(list(slot.shape)), w)
            layer.name = f"{name}.{slot.name}"
            tensors.append(layer.get_output(0))
        else:
            tensors.append(network.add_input(f"{name}.{slot.name}", trt_dtype_of(trt, slot.dtypes[0]),
                                             trt.Dims(list(slot.shape))))
    layer = network.add_plugin_v3(tensors, [], plugin)
    layer.name = name
    return layer, keep_alive + [plugin]
