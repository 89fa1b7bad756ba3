"""The peers `moe-build bench` times our runner against, all computing the same function.

Every peer takes (hidden [T, H], router_logits fp32 [T, E]) so the router linear, identical
for all, stays out of the comparison; each does its own softmax/top-k routing.
- naive: the per-expert Python loop of Hugging Face eager code.
- grouped_mm: sort rows by expert, torch._grouped_mm for gate/up and down, index_add.
- hf_eager: a transformers MoE block's experts module (eager implementation) built from a
  config of the same shape, fed by that block's router math.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..spec import MoESpec, RoutingMethod
from ..weights import MoEWeights

Peer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check_peer_spec(spec: MoESpec) -> None:
    """The peers implement softmax top-k (optionally renormalised) SwiGLU without biases or shared experts."""
    if (spec.routing.method is not RoutingMethod.SOFTMAX_TOPK or spec.routing.num_groups != 1
            or spec.activation.value != "swiglu" or spec.expert_bias or spec.shared.count
            or spec.routing.routed_scaling_factor != 1.0):
        raise ValueError(f"bench peers implement plain softmax-top-k SwiGLU layers, not {spec.name}")


def softmax_topk(spec: MoESpec, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, spec.top_k, dim=-1)
    if spec.routing.renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids


def naive_peer(spec: MoESpec, w: MoEWeights) -> Peer:
    _check_peer_spec(spec)

    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(spec, logits)
        out = torch.zeros_like(hidden)
        mask = F.one_hot(ids, spec.num_experts).permute(2, 1, 0)   # [E, K, T]
        for e in (mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist():
            slot, tok = torch.where(mask[e])
            gate, up = F.linear(hidden[tok], w.w1[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, w.w2[e]) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out
    return run


def grouped_mm_peer(spec: MoESpec, w: MoEWeights) -> Peer:
    """torch._grouped_mm wants B as [E, K, N]: transposed views of our [E, N, K] weights (no copy).
    The expert counts come from a scatter-add, not torch.bincount (which reads the largest id back to
    the host): the pipeline never waits on the GPU, as a deployed one would not."""
    _check_peer_spec(spec)
    w1t, w2t = w.w1.transpose(1, 2), w.w2.transpose(1, 2)
    E, K = spec.num_experts, spec.top_k

    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(spec, logits)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        tok = order // K
        ones = torch.ones_like(flat, dtype=torch.int32)
        counts = torch.zeros(E, dtype=torch.int32, device=flat.device).scatter_add_(0, flat, ones)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        x = hidden[tok]
        h = torch._grouped_mm(x, w1t, offs=offs)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, w2t, offs=offs)
        y = y * weights.flatten()[order, None]
        out = torch.zeros_like(hidden)
        out.index_add_(0, tok, y.to(out.dtype))
        return out
    return run


def hf_eager_peer(spec: MoESpec, w: MoEWeights, family: str) -> tuple[Peer, str]:
    """transformers' eager experts module for `family` (mixtral, else qwen3_moe) sharing our weight tensors.

    Built on the meta device so no second copy of the weights is ever allocated.
    """
    _check_peer_spec(spec)
    if family == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
        cfg = MixtralConfig(hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                            num_local_experts=spec.num_experts, num_experts_per_tok=spec.top_k,
                            experts_implementation="eager")
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
        cfg = Qwen3MoeConfig(hidden_size=spec.hidden_size, moe_intermediate_size=spec.intermediate_size,
                             num_experts=spec.num_experts, num_experts_per_tok=spec.top_k,
                             norm_topk_prob=spec.routing.renormalize, experts_implementation="eager")
    cfg._experts_implementation = "eager"
    with torch.device("meta"):
        block = Block(cfg)
    experts = block.experts
    experts.gate_up_proj = torch.nn.Parameter(w.w1, requires_grad=False)
    experts.down_proj = torch.nn.Parameter(w.w2, requires_grad=False)

    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(spec, logits)   # the block's router math, minus its linear
        return experts(hidden, ids, weights.to(hidden.dtype))
    return run, Block.__name__
