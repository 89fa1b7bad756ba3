"""The MoE layer spec: one immutable description of what a layer computes.

Everything downstream (target, planner, graph, kernels, runtime) reads this type and
never the raw Hugging Face config, so a field's meaning is decided here once.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import MoeBuildError


class DType(str, enum.Enum):
    """Activation/compute dtype of the layer (the model's dtype)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.FP32 else 2


class OutputDType(str, enum.Enum):
    """Dtype of the layer's output; FP8/FP4 exist only so the planner can refuse them by rule."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"


class Activation(str, enum.Enum):
    SWIGLU = "swiglu"
    GEGLU = "geglu"
    SILU = "silu"
    GELU = "gelu"
    RELU = "relu"
    IDENTITY = "identity"
    SWIGLU_CLAMP = "swiglu_clamp"  # GPT-OSS: clamped gate/up, gate*sigmoid(alpha*gate)*(up+1)

    @property
    def is_gated(self) -> bool:
        return self in (Activation.SWIGLU, Activation.GEGLU, Activation.SWIGLU_CLAMP)


class RoutingMethod(str, enum.Enum):
    SOFTMAX_TOPK = "softmax_topk"        # softmax over all experts, then top-k (optionally renormalised)
    TOPK_SOFTMAX = "topk_softmax"        # top-k on the logits, then softmax over the k (Mixtral, GPT-OSS)
    SIGMOID_GROUPED = "sigmoid_grouped"  # DeepSeek-V3: sigmoid + correction bias, grouped top-k, scaling


class Quant(str, enum.Enum):
    NONE = "none"
    FP8 = "fp8"                # FP8 weights and activations, per-tensor scales
    FP8_BLOCK = "fp8_block"    # FP8 with 128x128 block scales (DeepSeek-V3)
    W8A16 = "w8a16"            # int8 weight-only
    W4A16_AWQ = "w4a16_awq"    # int4 weight-only, group-wise, activation pre-quant scales
    W4AFP8 = "w4afp8"          # int4 weights, FP8 activations, group-wise pre-quant scales
    NVFP4 = "nvfp4"            # FP4 weights and activations (Blackwell)
    WFP4A16 = "wfp4a16"        # MXFP4 weights, 16-bit activations (GPT-OSS)

    @property
    def is_weight_only(self) -> bool:
        """Weights quantized, activations kept in the model dtype."""
        return self in (Quant.W8A16, Quant.W4A16_AWQ, Quant.WFP4A16)

    @property
    def has_fp8_activations(self) -> bool:
        return self in (Quant.FP8, Quant.FP8_BLOCK, Quant.W4AFP8)

    @property
    def has_fp4_activations(self) -> bool:
        return self is Quant.NVFP4

    @property
    def has_act_prequant_scales(self) -> bool:
        """Group-wise schemes that carry per-channel activation pre-quant (AWQ) scales."""
        return self in (Quant.W4A16_AWQ, Quant.W4AFP8)

    @property
    def is_block_scaled(self) -> bool:
        return self in (Quant.FP8_BLOCK, Quant.NVFP4, Quant.WFP4A16)


class ActScale(str, enum.Enum):
    """How FP8 activations get their scale (moe_build/weights/fp8.py has the exact rule)."""

    STATIC = "static"    # one calibrated per-tensor scale per GEMM input, stored in the checkpoint
    DYNAMIC = "dynamic"  # amax / 448 per token row (fp8) or per 1 x 128 token group (fp8_block), at run time


@dataclass(frozen=True)
class Routing:
    """How router logits become (expert ids, weights) per token."""

    method: RoutingMethod = RoutingMethod.SOFTMAX_TOPK
    renormalize: bool = False          # divide the selected weights by their sum
    num_groups: int = 1                # grouped top-k: experts split into groups ...
    topk_groups: int = 1               # ... and only the best `topk_groups` groups are eligible
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False      # DeepSeek-V3 e_score_correction_bias (selection only)
    router_bias: bool = False          # GPT-OSS router linear has a bias


@dataclass(frozen=True)
class SharedExperts:
    """Always-on experts added to the routed output (DeepSeek, Qwen2-MoE)."""

    count: int = 0
    intermediate_size: int = 0         # total intermediate size of the shared MLP
    sigmoid_gate: bool = False         # Qwen2-MoE: output scaled by sigmoid(x @ w_gate)


# The weight-only storage flags of MoESpec and the quants whose experts can be stored so: int4 zero points,
# one int scale per output channel, AWQ pre-quant scales.
WOQ_STORAGE_QUANTS = {"quant_zero_points": (Quant.W4A16_AWQ, Quant.W4AFP8),
                      "quant_per_channel": (Quant.W8A16, Quant.W4A16_AWQ),
                      "quant_prequant_scales": (Quant.W4A16_AWQ, Quant.W4AFP8)}


@dataclass(frozen=True)
class MoESpec:
    """One MoE layer. Immutable; build variants with `dataclasses.replace` or `with_overrides`."""

    hidden_size: int
    intermediate_size: int
    num_experts: int
    top_k: int
    activation: Activation = Activation.SWIGLU
    routing: Routing = field(default_factory=Routing)
    shared: SharedExperts = field(default_factory=SharedExperts)
    expert_bias: bool = False
    dtype: DType = DType.BF16
    output_dtype: OutputDType | None = None   # None: same as dtype
    quant: Quant = Quant.NONE
    fp8_input: bool = False                   # W4AFP8 only: activations already arrive in FP8
    act_scale: ActScale = ActScale.DYNAMIC    # FP8 activations: static (calibrated) or dynamic scales
    swiglu_alpha: float = 1.702               # swiglu_clamp only
    swiglu_limit: float = 7.0                 # swiglu_clamp only
    quant_group_size: int = 128               # group-wise schemes
    # weight-only layers: how the checkpoint stores its experts (moe_build/weights/woq.py), what the MoE plugin's
    # inputs follow: int4 zero points (asymmetric), one scale per output channel (no groups), AWQ pre-quant scales
    quant_zero_points: bool = False
    quant_per_channel: bool = False
    quant_prequant_scales: bool = False
    lora: bool = False
    ep_size: int = 1                          # expert parallelism: the experts split evenly over ep_size ranks
    ep_rank: int | None = None                # the rank this spec is for; None: the whole group (all experts)
    name: str = "moe"
    family: str = "custom"

    def __post_init__(self) -> None:
        # The storage flags describe weight-only experts only: another quant (e.g. a checkpoint's overridden with
        # --quant none, its experts then dequantized) clears them.
        for name, quants in WOQ_STORAGE_QUANTS.items():
            if getattr(self, name) is True and self.quant not in quants:
                object.__setattr__(self, name, False)
        validate(self)

    # Derived facts -----------------------------------------------------------------
    @property
    def local_experts(self) -> int:
        """Experts on one rank (TensorRT-LLM's num_experts_per_node): what the per-rank kernels index."""
        return self.num_experts // self.ep_size

    @property
    def first_local_expert(self) -> int:
        """The global id of this rank's first expert (rank r holds [r * local, (r + 1) * local))."""
        return (self.ep_rank or 0) * self.local_experts

    @property
    def stored_experts(self) -> int:
        """Experts whose weights a layer of this spec holds: one rank's, or all where ep_rank is None."""
        return self.local_experts if self.ep_rank is not None else self.num_experts

    def for_rank(self, rank: int) -> "MoESpec":
        """This layer as rank `rank` of its expert-parallel group runs it."""
        return dataclasses.replace(self, ep_rank=rank)

    @property
    def out_dtype(self) -> OutputDType:
        return self.output_dtype if self.output_dtype is not None else OutputDType(self.dtype.value)

    @property
    def fc1_out_features(self) -> int:
        """GEMM1's N: gate and up stacked for gated activations."""
        return self.intermediate_size * (2 if self.activation.is_gated else 1)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MoESpec":
        data = dict(data)
        data["routing"] = Routing(**{**data.get("routing", {}),
                                     "method": RoutingMethod(data.get("routing", {}).get("method", "softmax_topk"))})
        data["shared"] = SharedExperts(**data.get("shared", {}))
        data["activation"] = Activation(data.get("activation", "swiglu"))
        data["dtype"] = DType(data.get("dtype", "bf16"))
        data["quant"] = Quant(data.get("quant", "none"))
        data["act_scale"] = ActScale(data.get("act_scale", "dynamic"))
        if data.get("output_dtype") is not None:
            data["output_dtype"] = OutputDType(data["output_dtype"])
        return cls(**data)

    def with_overrides(self, **overrides: Any) -> "MoESpec":
        """Apply CLI-style overrides (None means 'keep'); routing/shared fields may be passed flat."""
        top = {k: v for k, v in overrides.items() if v is not None}
        routing_fields = {f.name for f in dataclasses.fields(Routing)}
        shared_fields = {"shared_" + f.name: f.name for f in dataclasses.fields(SharedExperts)}
        routing = {k: top.pop(k) for k in list(top) if k in routing_fields}
        shared = {shared_fields[k]: top.pop(k) for k in list(top) if k in shared_fields}
        if routing:
            top["routing"] = dataclasses.replace(self.routing, **routing)
        if shared:
            top["shared"] = dataclasses.replace(self.shared, **shared)
        return dataclasses.replace(self, **top)


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# Upper bounds of every size, checked before anything is allocated: generous against every published MoE
# model (hidden sizes up to 16384, intermediate sizes up to 32768, 512 experts, top-16), and within what
# the kernels index (the routing kernel takes at most 1024 experts; rows and E * n within int32) and what
# a TensorRT dimension holds.
MAX_SIZES = {"hidden_size": 1 << 16, "intermediate_size": 1 << 18, "num_experts": 1024, "top_k": 64,
             "quant_group_size": 1 << 12, "num_groups": 1024, "topk_groups": 1024, "shared_count": 64,
             "shared_intermediate_size": 1 << 20, "ep_size": 1024}


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise MoeBuildError(name, f"must be a positive integer, got {value!r}", "integers >= 1")
    bound = MAX_SIZES.get(name)
    if bound is not None and value > bound:
        raise MoeBuildError(name, f"{value} is larger than moe-build builds", f"1..{bound}")


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MoeBuildError(name, f"must be a finite number, got {value!r}", "finite numbers")


def _check_woq_storage(spec: MoESpec) -> None:
    """The weight-only storage flags are booleans (MoESpec clears them for quants without such storage)."""
    for name in WOQ_STORAGE_QUANTS:
        value = getattr(spec, name)
        if not isinstance(value, bool):
            raise MoeBuildError(name, f"must be true or false, got {value!r}", "true, false")


def validate(spec: MoESpec) -> None:
    """Reject specs that describe no real layer, or one too large to build. Hardware/quant support is the
    planner's job."""
    for name in ("hidden_size", "intermediate_size", "num_experts", "top_k", "quant_group_size"):
        _positive(name, getattr(spec, name))
    if spec.top_k > spec.num_experts:
        raise MoeBuildError("top_k", f"{spec.top_k} exceeds num_experts={spec.num_experts}",
                            f"1..{spec.num_experts}")
    _positive("ep_size", spec.ep_size)
    if spec.num_experts % spec.ep_size:
        raise MoeBuildError("ep_size", f"{spec.ep_size} does not divide num_experts={spec.num_experts}",
                            "divisors of num_experts")
    if spec.ep_rank is not None and (isinstance(spec.ep_rank, bool) or not isinstance(spec.ep_rank, int)
                                     or not 0 <= spec.ep_rank < spec.ep_size):
        raise MoeBuildError("ep_rank", f"{spec.ep_rank!r} is not a rank of ep_size={spec.ep_size}",
                            f"0..{spec.ep_size - 1}")
    r = spec.routing
    _positive("num_groups", r.num_groups)
    _positive("topk_groups", r.topk_groups)
    if spec.num_experts % r.num_groups:
        raise MoeBuildError("num_groups", f"{r.num_groups} does not divide num_experts={spec.num_experts}",
                            "divisors of num_experts")
    if r.topk_groups > r.num_groups:
        raise MoeBuildError("topk_groups", f"{r.topk_groups} exceeds num_groups={r.num_groups}",
                            f"1..{r.num_groups}")
    if r.num_groups > 1 and r.topk_groups * (spec.num_experts // r.num_groups) < spec.top_k:
        raise MoeBuildError("topk_groups", "the eligible groups hold fewer experts than top_k",
                            f"topk_groups * experts_per_group >= {spec.top_k}")
    if r.correction_bias and r.method is not RoutingMethod.SIGMOID_GROUPED:
        raise MoeBuildError("correction_bias", "only applies to sigmoid_grouped routing", "sigmoid_grouped")
    _finite("routed_scaling_factor", r.routed_scaling_factor)
    if not r.routed_scaling_factor > 0:
        raise MoeBuildError("routed_scaling_factor", f"must be a positive number, got {r.routed_scaling_factor}",
                            "finite numbers > 0")
    s = spec.shared
    if not isinstance(s.count, int) or isinstance(s.count, bool) or s.count < 0:
        raise MoeBuildError("shared_count", f"must be an integer >= 0, got {s.count!r}", "integers >= 0")
    if s.count:
        _positive("shared_count", s.count)
        _positive("shared_intermediate_size", s.intermediate_size)
    if not s.count and (s.intermediate_size or s.sigmoid_gate):
        raise MoeBuildError("shared_count", "shared-expert fields set but count is 0", "count >= 1")
    if spec.act_scale is ActScale.STATIC and spec.quant is Quant.FP8_BLOCK:
        raise MoeBuildError("act_scale", "fp8_block quantizes activations per 1 x 128 group at run time", "dynamic")
    if spec.fp8_input and spec.quant is not Quant.W4AFP8:
        raise MoeBuildError("fp8_input", "only meaningful for w4afp8 quantization", "quant=w4afp8")
    _check_woq_storage(spec)
    _finite("swiglu_alpha", spec.swiglu_alpha)
    _finite("swiglu_limit", spec.swiglu_limit)
    if spec.activation is Activation.SWIGLU_CLAMP and not (spec.swiglu_limit > 0 and spec.swiglu_alpha > 0):
        raise MoeBuildError("swiglu_limit", "alpha and limit must be positive", "numbers > 0")
