"""Named MoE layer presets: the MoE layer of well-known models, plus `tiny` for fast builds.

The model presets copy the published config.json of each model (the same values
`spec_from_hf_config` derives), so a layer can be built without downloading the checkpoint.
"""
from __future__ import annotations

from ..errors import MoeBuildError
from .layer import Activation, DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts

_TOPK_SOFTMAX = Routing(RoutingMethod.TOPK_SOFTMAX)

PRESETS: dict[str, MoESpec] = {
    # Embedded default: small enough to build a TensorRT engine in well under a second.
    "tiny": MoESpec(64, 128, 8, 2, routing=_TOPK_SOFTMAX, dtype=DType.FP16, name="tiny", family="custom"),
    "mixtral-8x7b": MoESpec(4096, 14336, 8, 2, routing=_TOPK_SOFTMAX, name="mixtral-8x7b", family="mixtral"),
    "qwen3-30b-a3b": MoESpec(2048, 768, 128, 8, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
                             name="qwen3-30b-a3b", family="qwen3_moe"),
    "deepseek-v2-lite": MoESpec(2048, 1408, 64, 6, routing=Routing(RoutingMethod.SOFTMAX_TOPK),
                                shared=SharedExperts(count=2, intermediate_size=2 * 1408),
                                name="deepseek-v2-lite", family="deepseek_v2"),
    "deepseek-v3": MoESpec(7168, 2048, 256, 8,
                           routing=Routing(RoutingMethod.SIGMOID_GROUPED, renormalize=True, num_groups=8,
                                           topk_groups=4, routed_scaling_factor=2.5, correction_bias=True),
                           shared=SharedExperts(count=1, intermediate_size=2048), quant=Quant.FP8_BLOCK,
                           name="deepseek-v3", family="deepseek_v3"),
    "gpt-oss-20b": MoESpec(2880, 2880, 32, 4, activation=Activation.SWIGLU_CLAMP, expert_bias=True,
                           routing=Routing(RoutingMethod.TOPK_SOFTMAX, router_bias=True),
                           swiglu_alpha=1.702, swiglu_limit=7.0, name="gpt-oss-20b", family="gpt_oss"),
    "olmoe-1b-7b": MoESpec(2048, 1024, 64, 8, routing=Routing(RoutingMethod.SOFTMAX_TOPK),
                           name="olmoe-1b-7b", family="olmoe"),
    "qwen2-moe-a2.7b": MoESpec(2048, 1408, 60, 4, routing=Routing(RoutingMethod.SOFTMAX_TOPK),
                               shared=SharedExperts(count=1, intermediate_size=5632, sigmoid_gate=True),
                               name="qwen2-moe-a2.7b", family="qwen2_moe"),
}


def get_preset(name: str) -> MoESpec:
    """The preset called `name`; an unknown name is a user error listing the known ones."""
    if name not in PRESETS:
        raise MoeBuildError("preset", f"unknown preset {name!r}", sorted(PRESETS))
    return PRESETS[name]
