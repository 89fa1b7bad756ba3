"""The peers `moe-build bench` times our runner against, all computing the same function.

Every peer takes (hidden [T, H], router_logits fp32 [T, E]) so the router linear, identical
for all, stays out of the comparison; each does its own routing.
- naive: the per-expert Python loop of Hugging Face eager code.
- grouped_mm: sort rows by expert, torch._grouped_mm for gate/up and down, index_add.
- hf_eager: a transformers MoE block's experts module (eager implementation) built from a
  config of the same shape, fed by that block's router math.
- scaled_grouped_mm (FP8 layers): the grouped_mm pipeline on torch._scaled_grouped_mm with rowwise
  scales: tokens quantized to e4m3 per row, weights per output channel.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F

from ..reference import route
from ..spec import MoESpec, RoutingMethod
from ..weights import MoEWeights
from ..weights.fp8 import FP8_DTYPE, ScaleGranularity, dequantize_weight, quantize_rows, quantize_weight

Peer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _plain_softmax(spec: MoESpec) -> bool:
    r = spec.routing
    return r.method is RoutingMethod.SOFTMAX_TOPK and r.num_groups == 1 and r.routed_scaling_factor == 1.0


def _check_peer_spec(spec: MoESpec, any_routing: bool = False) -> None:
    """The peers implement SwiGLU without biases or shared experts; naive and hf_eager only plain softmax
    top-k (optionally renormalised), the grouped pipelines (`any_routing`) every routing method."""
    if (not (any_routing or _plain_softmax(spec)) or spec.activation.value != "swiglu" or spec.expert_bias
            or spec.shared.count):
        raise ValueError(f"this bench peer implements {'' if any_routing else 'plain softmax-top-k '}SwiGLU layers "
                         f"without biases or shared experts, not {spec.name}")


def softmax_topk(spec: MoESpec, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, spec.top_k, dim=-1)
    if spec.routing.renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids


def peer_routing(spec: MoESpec, logits: torch.Tensor, correction_bias: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 [T, K], ids int64 [T, K]): plain softmax top-k as above, every other routing
    (DeepSeek-V3's sigmoid_grouped) through the reference's routing in fp32: torch ops only, no wait on
    the host."""
    if _plain_softmax(spec):
        return softmax_topk(spec, logits)
    ids, w = route(spec, logits.float(), correction_bias)
    return w, ids


def _sorted_by_expert(spec: MoESpec, logits: torch.Tensor, correction_bias: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The grouped pipelines' routing: (token of each expert-sorted row [T*K], its routing weight [T*K],
    cumulative int32 row counts per expert [E]). The counts come from a scatter-add, not torch.bincount
    (which reads the largest id back to the host): the pipeline never waits on the GPU, as a deployed one
    would not."""
    weights, ids = peer_routing(spec, logits, correction_bias)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    ones = torch.ones_like(flat, dtype=torch.int32)
    counts = torch.zeros(spec.num_experts, dtype=torch.int32, device=flat.device).scatter_add_(0, flat, ones)
    return order // spec.top_k, weights.flatten()[order], torch.cumsum(counts, 0, dtype=torch.int32)


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
    """torch._grouped_mm wants B as [E, K, N]: transposed views of our [E, N, K] weights (no copy)."""
    _check_peer_spec(spec, any_routing=True)
    w1t, w2t = w.w1.transpose(1, 2), w.w2.transpose(1, 2)

    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        tok, row_weights, offs = _sorted_by_expert(spec, logits, w.correction_bias)
        x = hidden[tok]
        h = torch._grouped_mm(x, w1t, offs=offs)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, w2t, offs=offs)
        y = y * row_weights[:, None]
        out = torch.zeros_like(hidden)
        out.index_add_(0, tok, y.to(out.dtype))
        return out
    return run


def rowwise_fp8_weights(w: MoEWeights) -> MoEWeights:
    """FP8 weights with one fp32 scale per output channel, what the rowwise scaled_grouped_mm reads:
    channel scales as they are, tensor scales repeated per channel (the same weights), block-128 weights
    dequantized and quantized again per channel, one expert at a time (no full-size float copy)."""
    f = w.fp8
    if f is None:
        raise ValueError("rowwise_fp8_weights needs FP8 weights")
    if f.granularity is not ScaleGranularity.BLOCK128:
        return w.fp8_channel_scales()

    def requantize(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty_like(q)
        channel = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
        for e in range(q.shape[0]):
            deq = dequantize_weight(q[e:e + 1], scale[e:e + 1], f.granularity, torch.float32)
            out[e:e + 1], channel[e:e + 1] = quantize_weight(deq, ScaleGranularity.CHANNEL)
        return out, channel

    (w1, s1), (w2, s2) = requantize(w.w1, f.w1_scale), requantize(w.w2, f.w2_scale)
    return replace(w, w1=w1, w2=w2, fp8=replace(f, granularity=ScaleGranularity.CHANNEL, w1_scale=s1, w2_scale=s2))


def scaled_grouped_mm_peer(spec: MoESpec, w: MoEWeights) -> Peer:
    """The strongest stock PyTorch FP8 MoE on Hopper: tokens quantized to e4m3 per row with torch ops
    (moe_build.weights.fp8.quantize_rows, dynamic amax / 448 scales) before they are gathered (each token
    once, not top_k times), sorted by expert, torch._scaled_grouped_mm with per-row activation and
    per-output-channel weight scales (bf16 out, fp32 accumulation promoted like ours), SwiGLU in torch,
    the result quantized per row again, the second scaled grouped GEMM, weighted index_add.

    Its layout contract (torch 2.11 and later): A row-major e4m3 [rows, K], B a column-major view
    [E, K, N] (our [E, N, K] weights transposed, no copy), scale_a fp32 [rows], scale_b fp32 [E, N],
    int32 cumulative row offsets; K and N multiples of 16. `w` needs channel or tensor scales
    (rowwise_fp8_weights makes them from block-128 ones) and dynamic activation scales."""
    _check_peer_spec(spec, any_routing=True)
    f = w.fp8
    if f is None or f.granularity is ScaleGranularity.BLOCK128 or f.static:
        raise ValueError("scaled_grouped_mm takes FP8 weights with channel or tensor scales and dynamic "
                         "activation scales (rowwise_fp8_weights converts block-128 weights)")
    w = w.fp8_channel_scales()
    w1t, w2t = w.w1.transpose(1, 2), w.w2.transpose(1, 2)
    s1, s2 = w.fp8.w1_scale.contiguous(), w.fp8.w2_scale.contiguous()

    def run(hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        tok, row_weights, offs = _sorted_by_expert(spec, logits, w.correction_bias)
        q, scale = quantize_rows(hidden, None, None)
        x = q.view(torch.uint8)[tok].view(FP8_DTYPE)  # gathered as bytes: indexing needs no FP8 kernel
        h = torch._scaled_grouped_mm(x, w1t, scale.view(-1)[tok], s1, offs=offs, out_dtype=torch.bfloat16)
        gate, up = h.chunk(2, dim=-1)
        q2, scale2 = quantize_rows(F.silu(gate) * up, None, None)
        y = torch._scaled_grouped_mm(q2, w2t, scale2.view(-1), s2, offs=offs, out_dtype=torch.bfloat16)
        y = y * row_weights[:, None]
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
