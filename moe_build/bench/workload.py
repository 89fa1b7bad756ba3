"""What the benchmarks time: the bench shapes, their weights and inputs, the fp64 check, and the floor.

floor = max(bytes of the touched experts' weights + activations in and out / byte ceiling,
            FLOPs / bf16 matmul ceiling), touched experts counted from the actual routing, ceilings
from `timing.CeilingCalls` (the byte ceiling is the higher of the copy and read-only rates).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..reference import moe_reference
from ..spec import MoESpec, Routing, RoutingMethod
from ..weights import MoEWeights
from .peers import softmax_topk

# name -> (H, I, E, top_k, transformers family for the hf_eager peer)
SHAPES: dict[str, tuple[int, int, int, int, str]] = {
    "mixtral-8x7b": (4096, 14336, 8, 2, "mixtral"),
    "qwen3-30b-a3b": (2048, 768, 128, 8, "qwen3_moe"),
    "deepseek-v2-lite": (2048, 1408, 64, 6, "qwen3_moe"),
    "gpt-oss-20b": (2880, 2880, 32, 4, "qwen3_moe"),
}
TOKENS = (1, 16, 256, 4096)
REL_ERR_LIMIT = 1e-2
CHECK_ROWS = 64

Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bench_spec(name: str) -> MoESpec:
    """The bench layer `name`: bf16 SwiGLU, softmax top-k routing with renormalised weights."""
    H, I, E, K, family = SHAPES[name]
    return MoESpec(H, I, E, K, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True), name=name,
                   family=family)


def device_weights(spec: MoESpec, seed: int) -> MoEWeights:
    """Random fan-in-scaled bf16 weights generated on the GPU (CPU generation of Mixtral takes too long)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I, N1 = spec.num_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features

    def rnd(*shape: int, fan_in: int) -> torch.Tensor:
        t = torch.empty(*shape, device="cuda", dtype=torch.bfloat16)
        for i in range(shape[0]):  # per expert: keeps the fp32 temporary small
            t[i] = torch.randn(*shape[1:], device="cuda", generator=g) / math.sqrt(fan_in)
        return t

    return MoEWeights(router_weight=rnd(E, H, fan_in=H), w1=rnd(E, N1, H, fan_in=H), w2=rnd(E, H, I, fan_in=I))


@dataclass
class InputSet:
    hidden: torch.Tensor    # [T, H] bf16
    logits: torch.Tensor    # [T, E] fp32
    touched: int            # distinct experts this set routes to


def make_inputs(spec: MoESpec, tokens: int, count: int, seed: int) -> list[InputSet]:
    """`count` fresh input sets of `tokens` tokens (rotated among by the timers: no warm-cache flattery)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(count):
        h = torch.randn(tokens, spec.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
        lg = torch.randn(tokens, spec.num_experts, device="cuda", generator=g)
        _, ids = softmax_topk(spec, lg)
        sets.append(InputSet(h, lg, int(ids.unique().numel())))
    return sets


def reference_rows(spec: MoESpec, w64: MoEWeights, inp: InputSet) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 reference on sampled rows (first, last, random): tokens are independent, so rows suffice."""
    T = inp.hidden.shape[0]
    g = torch.Generator().manual_seed(T)
    rows = torch.unique(torch.cat([torch.tensor([0, T - 1]), torch.randint(0, T, (CHECK_ROWS,), generator=g)]))
    rows = rows.to("cuda")
    return rows, moe_reference(spec, w64, inp.hidden[rows], router_logits=inp.logits[rows])


def rel_err(out: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> float:
    """rel-norm error of `out` on the sampled rows; inf if any element is not finite (unwritten poison)."""
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        return math.inf
    got = out[rows].double().cpu()
    return float((got - ref).norm() / ref.norm())


def floor_us(spec: MoESpec, tokens: int, touched_experts: float, ceilings: dict[str, float]) -> dict[str, float]:
    """The lower bound from the ceilings (weights of touched experts + activations in/out)."""
    H, I, N1, K = spec.hidden_size, spec.intermediate_size, spec.fc1_out_features, spec.top_k
    item = spec.dtype.itemsize
    nbytes = touched_experts * (N1 * H + H * I) * item + 2 * tokens * H * item
    flops = 2.0 * tokens * K * (N1 * H + H * I)
    t_bytes = nbytes / ceilings["bytes_per_s"] * 1e6
    t_flops = flops / ceilings["bf16_flops_per_s"] * 1e6
    return {"floor_us": max(t_bytes, t_flops), "bytes": nbytes, "flops": flops, "bytes_us": t_bytes,
            "flops_us": t_flops, "bound": "bytes" if t_bytes >= t_flops else "flops"}
