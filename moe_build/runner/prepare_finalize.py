"""Prepare and finalize around the experts (seed 000's FusedMoEPrepareAndFinalize).

prepare: router GEMM and routing (top-k ids/weights).
finalize: the top-k weighting and reduction when the experts did not do it in GEMM2's
epilogue (plan finalize=separate), and the always-on shared experts. Expert-parallel
dispatch/combine belongs here too when it exists, which is why these steps are kept apart
from the permute/GEMM steps in experts.py.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from ..spec import MoESpec
from ..weights import MoEWeights
from .batch import Batch


def routing_args(spec: MoESpec, weights: MoEWeights, b: Batch) -> dict[str, Any]:
    """The layer's routing (method, scores' correction bias, groups, scaling) and b's top-k outputs, as every entry
    point that routes takes them (kernels.routing, and kernels.routing_prologue_fused_routing or
    routing_prologue_three_step_routing where the plan routes in the prologue: runner/experts.py)."""
    r = spec.routing
    return dict(method=r.method.value, renormalize=r.renormalize, correction_bias=weights.correction_bias,
                num_groups=r.num_groups, topk_groups=r.topk_groups, routed_scaling_factor=r.routed_scaling_factor,
                topk_ids=b.topk_ids, topk_weights=b.topk_weights, stream=b.stream)


class PrepareFinalize:
    """The prepare/finalize steps of one layer; holds device weights it needs, nothing per call."""

    def __init__(self, spec: MoESpec, weights: MoEWeights, kernels: ModuleType, deterministic: bool) -> None:
        self.spec = spec
        self.w = weights
        self.k = kernels
        self.deterministic = deterministic

    # ---- prepare --------------------------------------------------------------------------
    def router_gemm(self, b: Batch) -> None:
        """logits = hidden @ router_weight^T (+ bias), written into the workspace (no allocation)."""
        logits = b.v("logits")
        if self.w.router_bias is None:
            torch.mm(b.hidden, self.w.router_weight.t(), out=logits)
        else:
            torch.addmm(self.w.router_bias, b.hidden, self.w.router_weight.t(), out=logits)
        b.logits = logits

    def routing(self, b: Batch) -> None:
        self.k.routing(b.logits, self.spec.top_k, **routing_args(self.spec, self.w, b))

    # ---- finalize -------------------------------------------------------------------------
    def weight_and_reduce(self, b: Batch) -> None:
        """out[t] = sum_j w[t,j] * (gemm2_out[row(t,j)] + b2[ids[t,j]]) over this rank's experts (plan
        finalize=separate; with expert parallelism the ids of other ranks' experts are out of range)."""
        self.k.finalize(b.v("gemm2_out"), b.topk_weights, b.topk_ids, b.v("unpermuted_to_permuted"),
                        bias=self.w.b2, deterministic=self.deterministic, out=b.out, stream=b.stream,
                        num_experts=self.spec.local_experts)

    def shared_experts(self, b: Batch) -> None:
        """out += shared MLP(hidden) (* sigmoid gate), through torch matmuls and our activation kernel."""
        s = self.spec
        fc1, act, y = b.v("shared_fc1"), b.v("shared_act"), b.v("shared_out")
        offsets = b.v("shared_offsets")
        torch.mm(b.hidden, self.w.shared_w1.t(), out=fc1)
        offsets.zero_()
        offsets[1].fill_(b.tokens)  # one "expert" owning every row: [0, T)
        self.k.fc1_activation(fc1, offsets, s.activation.value, swiglu_alpha=s.swiglu_alpha,
                          swiglu_limit=s.swiglu_limit, out=act, stream=b.stream)
        torch.mm(act, self.w.shared_w2.t(), out=y)
        if s.shared.sigmoid_gate:
            gate = b.v("shared_gate")
            torch.mm(b.hidden, self.w.shared_gate.t(), out=gate)
            y.mul_(gate.sigmoid_())
        b.out.add_(y)
