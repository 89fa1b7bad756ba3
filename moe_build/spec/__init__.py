"""The layer spec: what one MoE layer computes, and where a spec comes from (checkpoint, preset, flags)."""
from .layer import (ActScale, Activation, DType, MoESpec, OutputDType, Quant, Routing, RoutingMethod, SharedExperts,
                    validate)

__all__ = ["ActScale", "Activation", "DType", "MoESpec", "OutputDType", "Quant", "Routing", "RoutingMethod", "SharedExperts",
           "validate"]
