"""Plain PyTorch reference of one MoE layer, the ground truth every engine is checked against.

FP8 layers: weights dequantized exactly and activations quantized exactly as moe_build/weights/fp8.py
says, so the reference is the same quantized math in fp64. Weight-only quantized layers (moe_build/weights/woq.py):
weights dequantized exactly, GEMM1's input multiplied by the AWQ pre-quant scale and GEMM2's (the activated rows) by
its own, in the reference dtype, as TensorRT-LLM's MoE applies them; W4AFP8 then quantizes those products to FP8 by
fp8.py's rule (static input scales, else per row). It favours obviousness over speed: routing per spec.py's RoutingMethod, one dense MLP per
expert, everything in the requested dtype (fp64 on CPU by default) so its own round-off is
negligible next to any fp16/bf16 engine.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .errors import MoeBuildError
from .spec import Activation, MoESpec, Quant, RoutingMethod
from .weights import MoEWeights
from .weights.fp8 import Fp8Scales, activation_group, fake_quantize_rows
from .weights.woq import WoqWeights


def _top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` largest of each row of `x` (values, indices), larger first and the lower index first among equal
    values: the routing kernel's order (cpp/src/stages/routing.cu). torch.topk leaves the order of ties unspecified,
    and an exact tie (bf16 router logits have them often) would then pick another expert than the kernel."""
    order = torch.sort(x, dim=-1, descending=True, stable=True)
    return order.values[..., :k], order.indices[..., :k]


def _group_mask(spec: MoESpec, choice: torch.Tensor, group_score: str) -> torch.Tensor:
    """Boolean [T, E] mask of experts in each token's `topk_groups` best groups.

    A group's score is its best expert (DeepSeek-V2 group_limited_greedy) or the sum of its best
    two (DeepSeek-V3 noaux_tc).
    """
    r = spec.routing
    grouped = choice.view(choice.shape[0], r.num_groups, -1)
    if group_score == "max":
        scores = grouped.max(dim=-1).values
    else:
        scores = _top(grouped, min(2, grouped.shape[-1]))[0].sum(dim=-1)
    best = _top(scores, r.topk_groups)[1]
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, best, True)
    return keep.unsqueeze(-1).expand_as(grouped).reshape_as(choice)


def route(spec: MoESpec, logits: torch.Tensor,
          correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (expert ids int64 [T, K], weights [T, K]) in the logits' dtype."""
    r, k = spec.routing, spec.top_k
    if r.method is RoutingMethod.TOPK_SOFTMAX:
        top, ids = _top(logits, k)
        weights = top.softmax(dim=-1)
    elif r.method is RoutingMethod.SOFTMAX_TOPK:
        probs = logits.softmax(dim=-1)
        choice = probs
        if r.num_groups > 1:
            choice = probs.masked_fill(~_group_mask(spec, probs, "max"), -math.inf)
        ids = _top(choice, k)[1]
        weights = probs.gather(1, ids)
    else:
        scores = logits.sigmoid()
        # the correction bias steers which experts are chosen, never their weights
        choice = scores if correction_bias is None else scores + correction_bias.to(scores.dtype)
        if r.num_groups > 1:
            choice = choice.masked_fill(~_group_mask(spec, choice, "top2_sum"), -math.inf)
        ids = _top(choice, k)[1]
        weights = scores.gather(1, ids)
    if r.renormalize:  # a no-op for topk_softmax, whose weights already sum to one
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids.to(torch.int64), weights * r.routed_scaling_factor


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_UNGATED = {Activation.SILU: F.silu, Activation.GELU: _gelu_tanh, Activation.RELU: F.relu,
            Activation.IDENTITY: lambda x: x}


def activate(spec: MoESpec, h: torch.Tensor) -> torch.Tensor:
    """FC1 output [.., N1] -> [.., I]; gated kinds read gate rows [0, I) and up rows [I, 2I)."""
    if not spec.activation.is_gated:
        return _UNGATED[spec.activation](h)
    gate, up = h.chunk(2, dim=-1)
    if spec.activation is Activation.SWIGLU:
        return F.silu(gate) * up
    if spec.activation is Activation.GEGLU:
        return _gelu_tanh(gate) * up
    # GPT-OSS: gate clamped from above only, up on both sides, and up shifted by one
    limit = spec.swiglu_limit
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(spec.swiglu_alpha * gate) * (up + 1)


def _mlp(spec: MoESpec, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
         b1: torch.Tensor | None = None, b2: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(activate(spec, F.linear(x, w1, b1)), w2, b2)


def _woq_input(spec: MoESpec, woq: WoqWeights, t: torch.Tensor, gemm: int) -> torch.Tensor:
    """GEMM `gemm`'s (1 or 2) input of a weight-only quantized layer: times its AWQ pre-quant scale, then (W4AFP8)
    through the FP8 activation quantization."""
    pre = woq.fc1_act_scale if gemm == 1 else woq.fc2_act_scale
    if pre is not None:
        t = t * pre.to(t.device, t.dtype)
    if spec.quant is Quant.W4AFP8:
        static = woq.a1_scale if gemm == 1 else woq.a2_scale
        t = fake_quantize_rows(t, None if static is None else static.to(t.device), None, t.dtype)
    return t


def _routed(spec: MoESpec, w: MoEWeights, x: torch.Tensor, ids: torch.Tensor,
            topk_weights: torch.Tensor, fp8: Fp8Scales | None, woq: WoqWeights | None = None) -> torch.Tensor:
    """The routed experts' weighted sum; with FP8 experts each GEMM input goes through the exact FP8
    activation quantization of moe_build/weights/fp8.py (weights arrive dequantized exactly), with weight-only
    quantized ones through `_woq_input`."""
    def gemm_input(t: torch.Tensor, static: torch.Tensor | None, gemm: int = 1) -> torch.Tensor:
        if woq is not None:
            return _woq_input(spec, woq, t, gemm)
        if fp8 is None:
            return t
        return fake_quantize_rows(t, static, activation_group(fp8.granularity), t.dtype)

    out = torch.zeros_like(x)
    x_in = gemm_input(x, None if fp8 is None else fp8.a1_scale)
    for e in ids.unique().tolist():
        tokens, slot = (ids == e).nonzero(as_tuple=True)
        h = activate(spec, F.linear(x_in[tokens], w.w1[e], None if w.b1 is None else w.b1[e]))
        y = F.linear(gemm_input(h, None if fp8 is None else fp8.a2_scale, 2), w.w2[e],
                     None if w.b2 is None else w.b2[e])
        out.index_add_(0, tokens, y * topk_weights[tokens, slot, None])
    return out


def _shared(spec: MoESpec, w: MoEWeights, x: torch.Tensor) -> torch.Tensor:
    y = _mlp(spec, x, w.shared_w1, w.shared_w2)
    if spec.shared.sigmoid_gate:
        y = y * torch.sigmoid(F.linear(x, w.shared_gate))
    return y


def _check_routing_inputs(spec: MoESpec, tokens: int, logits: torch.Tensor | None,
                          ids: torch.Tensor | None, weights: torch.Tensor | None) -> None:
    if (ids is None) != (weights is None):
        raise MoeBuildError("topk_ids", "topk_ids and topk_weights must be given together", "both or neither")
    if logits is not None and tuple(logits.shape) != (tokens, spec.num_experts):
        raise MoeBuildError("router_logits", f"shape {tuple(logits.shape)}", f"shape {(tokens, spec.num_experts)}")
    for name, t in (("topk_ids", ids), ("topk_weights", weights)):
        if t is not None and tuple(t.shape) != (tokens, spec.top_k):
            raise MoeBuildError(name, f"shape {tuple(t.shape)}", f"shape {(tokens, spec.top_k)}")
    if ids is not None and (ids.min() < 0 or ids.max() >= spec.num_experts):
        raise MoeBuildError("topk_ids", "expert id out of range", f"0..{spec.num_experts - 1}")


def moe_reference(spec: MoESpec, weights: MoEWeights, hidden: torch.Tensor,
                  router_logits: torch.Tensor | None = None, topk_ids: torch.Tensor | None = None,
                  topk_weights: torch.Tensor | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The layer's output for `hidden` [T, H] or [B, S, H], in `dtype`, same shape as `hidden`.

    Routing can be pinned so an engine is compared on identical expert choices: pass
    `topk_ids`+`topk_weights` (used as given) or `router_logits` (routed here); otherwise the
    router runs on `hidden`.
    """
    if hidden.shape[-1] != spec.hidden_size or hidden.dim() not in (2, 3):
        H = spec.hidden_size
        raise MoeBuildError("hidden", f"shape {tuple(hidden.shape)}", f"[T, {H}] or [B, S, {H}]")
    weights.check(spec)
    w = weights.dequantized(dtype, "cpu")
    x = hidden.reshape(-1, spec.hidden_size).to("cpu", dtype)
    _check_routing_inputs(spec, x.shape[0], router_logits, topk_ids, topk_weights)
    if topk_ids is None:
        if router_logits is None:
            router_logits = F.linear(x, w.router_weight, w.router_bias)
        topk_ids, topk_weights = route(spec, router_logits.to("cpu", dtype), w.correction_bias)
    out = _routed(spec, w, x, topk_ids.to("cpu", torch.int64), topk_weights.to("cpu", dtype), weights.fp8,
                  weights.woq)
    if spec.shared.count:
        out = out + _shared(spec, w, x)
    return out.reshape(hidden.shape)
