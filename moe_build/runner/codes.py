"""Spec enums -> the integer codes of cpp/include/moe_build_kernels.h (one table each, kept in sync)."""
from __future__ import annotations

from ..spec import Activation, RoutingMethod

ROUTING_CODES = {RoutingMethod.SOFTMAX_TOPK: 0, RoutingMethod.TOPK_SOFTMAX: 1, RoutingMethod.SIGMOID_GROUPED: 2}
ACTIVATION_CODES = {Activation.IDENTITY: 0, Activation.RELU: 1, Activation.SILU: 2, Activation.GELU: 3,
                    Activation.SWIGLU: 4, Activation.GEGLU: 5, Activation.SWIGLU_CLAMP: 6}


def routing_code(method: RoutingMethod) -> int:
    return ROUTING_CODES[method]


def activation_code(activation: Activation) -> int:
    return ACTIVATION_CODES[activation]
