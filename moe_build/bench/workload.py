"""What the benchmarks time: the bench shapes, their weights and inputs, the fp64 check, and the floor.

floor = max(bytes of the touched experts' weights (FP8 ones with their fp32 scales) + activations in and
out / byte ceiling, FLOPs / matmul ceiling of the layer's GEMM input type), touched experts counted from
the actual routing, ceilings from `timing.CeilingCalls` (the byte ceiling is the higher of the copy and
read-only rates).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..reference import moe_reference, route
from ..spec import ActScale, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from ..spec.presets import PRESETS
from ..weights import MoEWeights
from ..weights.dtypes import TORCH_DTYPE
from ..weights.fp8 import FP8_DTYPE, Fp8Scales, ScaleGranularity, blocks, quantize_weight
from .peers import peer_routing

# name -> (H, I, E, top_k, transformers family for the hf_eager peer)
SHAPES: dict[str, tuple[int, int, int, int, str]] = {
    "mixtral-8x7b": (4096, 14336, 8, 2, "mixtral"),
    "qwen3-30b-a3b": (2048, 768, 128, 8, "qwen3_moe"),
    "deepseek-v2-lite": (2048, 1408, 64, 6, "qwen3_moe"),
    "gpt-oss-20b": (2880, 2880, 32, 4, "qwen3_moe"),
}
# The FP8 bench adds DeepSeek-V3's routed experts (its preset's sigmoid_grouped routing; like every bench
# shape, without the shared expert): the FP8-native layer of the issue.
FP8_ONLY_SHAPES = ("deepseek-v3",)
FP8_SHAPES = (*SHAPES, *FP8_ONLY_SHAPES)
TOKENS = (1, 16, 256, 4096)
REL_ERR_LIMIT = 1e-2
# Weight-only layers against their reference: one more rounding on each weight and each pre-quant product
# (tests/gpu/test_runner_woq.py bounds it at 2e-2).
WOQ_REL_ERR_LIMIT = 2e-2
# FP8 layers against the FP8 reference: their 16-bit intermediates can move a value across an e4m3
# rounding step (tests/gpu/test_runner_fp8.py measures 1.0-1.6% and bounds it at 3%).
FP8_REL_ERR_LIMIT = 0.03
# W4AFP8 layers (int4 weights, FP8 activations): both roundings, the FP8 steps dominating (tests/gpu/
# test_runner_w4afp8.py: a CPU emulation measures 1.3-2.0% and the test bounds it at 4%).
W4AFP8_REL_ERR_LIMIT = 0.04
CHECK_ROWS = 64
# The FP8 bench's fp64 references read only the experts their rows route to, dequantized on the CPU:
# rows are kept while those experts hold at most REF_WEIGHT_ELEMENTS weight elements (DeepSeek-V3's 256
# experts would take 90 GB in fp64 and minutes per point), dequantized at most REF_CHUNK_ELEMENTS at a time.
REF_WEIGHT_ELEMENTS = 1 << 30
REF_CHUNK_ELEMENTS = 1 << 28
# Weight scales of the FP8 bench's layers: fp8 per output channel (what the rowwise FP8 GEMMs read,
# ours and torch's), fp8_block per 128 x 128 block (DeepSeek-V3); activations dynamic in both.
FP8_GRANULARITY = {Quant.FP8: ScaleGranularity.CHANNEL, Quant.FP8_BLOCK: ScaleGranularity.BLOCK128}

Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bench_spec(name: str) -> MoESpec:
    """The bench layer `name`: bf16 SwiGLU, softmax top-k routing with renormalised weights (DeepSeek-V3:
    its preset's routing, no shared expert, unquantized like the others; fp8_bench_spec quantizes)."""
    if name in FP8_ONLY_SHAPES:
        return replace(PRESETS[name], shared=SharedExperts(), quant=Quant.NONE, act_scale=ActScale.DYNAMIC)
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


def fp8_bench_spec(name: str, quant: Quant, act_scale: ActScale = ActScale.DYNAMIC) -> MoESpec:
    """The bench layer `name` with FP8 experts (`quant` fp8 or fp8_block) and dynamic or (fp8) static activation
    scales."""
    return bench_spec(name).with_overrides(quant=quant, act_scale=act_scale)


# Static FP8 input scales (ModelOpt's calibrated input_scale) for the bench's unit-variance tokens and fan-in-scaled
# weights: GEMM1's input up to ~4.5 sigma, the activation's output up to ~3, saturating above, as calibrated scales do
# (tests/gpu/test_runner_fp8.py's)
FP8_STATIC_INPUT_SCALES = (4.5 / 448, 3.0 / 448)


def device_fp8_weights(spec: MoESpec, seed: int) -> MoEWeights:
    """Random fan-in-scaled weights quantized to FP8 as FP8_GRANULARITY says for `spec.quant`, generated and
    quantized one expert at a time on the GPU (DeepSeek-V3's float weights alone would take 45 GB in
    fp32), with a router and (DeepSeek-V3) a correction bias in the model dtype / fp32, and
    FP8_STATIC_INPUT_SCALES where the spec's activation scales are static."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    E, H, I, N1 = spec.num_experts, spec.hidden_size, spec.intermediate_size, spec.fc1_out_features
    granularity = FP8_GRANULARITY[spec.quant]

    def fp8(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.empty(E, rows, cols, device="cuda", dtype=FP8_DTYPE)
        scales = []
        for e in range(E):
            w = torch.randn(1, rows, cols, device="cuda", generator=g) / math.sqrt(cols)
            q[e:e + 1], scale = quantize_weight(w, granularity)
            scales.append(scale)
        return q, torch.cat(scales)

    (w1, s1), (w2, s2) = fp8(N1, H), fp8(H, I)
    router = (torch.randn(E, H, device="cuda", generator=g) / math.sqrt(H)).to(torch.bfloat16)
    bias = 0.1 * torch.randn(E, device="cuda", generator=g) if spec.routing.correction_bias else None
    static = [torch.tensor(a, dtype=torch.float32, device="cuda") for a in FP8_STATIC_INPUT_SCALES] \
        if spec.act_scale is ActScale.STATIC else [None, None]
    return MoEWeights(router_weight=router, w1=w1, w2=w2, correction_bias=bias,
                      fp8=Fp8Scales(granularity, s1, s2, *static))


@dataclass
class InputSet:
    hidden: torch.Tensor    # [T, H] bf16
    logits: torch.Tensor    # [T, E] fp32
    touched: int            # distinct experts this set routes to


def make_inputs(spec: MoESpec, tokens: int, count: int, seed: int,
                correction_bias: torch.Tensor | None = None) -> list[InputSet]:
    """`count` fresh input sets of `tokens` tokens (rotated among by the timers: no warm-cache flattery)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(count):
        h = torch.randn(tokens, spec.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
        lg = torch.randn(tokens, spec.num_experts, device="cuda", generator=g)
        _, ids = peer_routing(spec, lg, correction_bias)
        sets.append(InputSet(h, lg, int(ids.unique().numel())))
    return sets


def reference_rows(spec: MoESpec, w64: MoEWeights, inp: InputSet) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 reference on sampled rows (first, last, random): tokens are independent, so rows suffice."""
    T = inp.hidden.shape[0]
    g = torch.Generator().manual_seed(T)
    rows = torch.unique(torch.cat([torch.tensor([0, T - 1]), torch.randint(0, T, (CHECK_ROWS,), generator=g)]))
    rows = rows.to("cuda")
    return rows, moe_reference(spec, w64, inp.hidden[rows], router_logits=inp.logits[rows])


def expert_elements(spec: MoESpec) -> int:
    """Weight elements of one expert (W1 and W2)."""
    return spec.fc1_out_features * spec.hidden_size + spec.hidden_size * spec.intermediate_size


def check_rows(spec: MoESpec, inp: InputSet, correction_bias: torch.Tensor | None,
               budget: int = REF_WEIGHT_ELEMENTS) -> torch.Tensor:
    """The FP8 bench's sampled rows: first, last, then random ones (reference_rows' candidates), each kept
    while the experts the kept rows route to (fp64 routing, the reference's) hold at most `budget` weight
    elements; the first row always. Sorted, on the inputs' device."""
    T = inp.hidden.shape[0]
    g = torch.Generator().manual_seed(T)
    candidates = dict.fromkeys([0, T - 1, *torch.randint(0, T, (CHECK_ROWS,), generator=g).tolist()])
    rows = torch.tensor(list(candidates))
    ids, _ = route(spec, inp.logits[rows.to(inp.logits.device)].double().cpu(),
                   None if correction_bias is None else correction_bias.double().cpu())
    kept, experts = [], set()
    for row, row_ids in zip(rows.tolist(), ids.tolist()):
        grown = experts | set(row_ids)
        if kept and len(grown) * expert_elements(spec) > budget:
            continue
        kept.append(row)
        experts = grown
    return torch.tensor(sorted(kept), device=inp.hidden.device)


def _take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t[index] along dim 0, copied to the CPU (FP8 gathered as bytes: indexing needs no FP8 kernel)."""
    if t.dtype == FP8_DTYPE:
        return t.view(torch.uint8)[index.to(t.device)].cpu().view(FP8_DTYPE)
    return t[index.to(t.device)].cpu()


def reference_by_experts(spec: MoESpec, w: MoEWeights, inp: InputSet, rows: torch.Tensor,
                         chunk: int = REF_CHUNK_ELEMENTS) -> torch.Tensor:
    """moe_reference (fp64) of `rows` of `inp` for weights `w` on the GPU (FP8 or 16-bit), copying to the
    CPU only the experts those rows route to, a chunk of experts (<= `chunk` weight elements, at least
    top_k experts) at a time. Quantized experts under a 16-bit `spec` are dequantized a chunk at a time, as
    `MoEWeights.dequantized` rounds them (once, to the spec's dtype): the bf16 layer's reference then needs no
    16-bit copy of every expert beside the benched runners (DeepSeek-V3's is 22 GB). Why it is exact: each
    row's output is the sum of its experts' weighted outputs, and FP8 activations are quantized per row (per
    token and per (token, expert)); so each chunk runs moe_reference on the rows that route into it, their
    slots outside it pointed at one of its experts with weight 0, and the chunks' outputs add up."""
    x = inp.hidden[rows].cpu()
    ids, weights = route(spec, inp.logits[rows].double().cpu(),
                         None if w.correction_bias is None else w.correction_bias.double().cpu())
    used = ids.unique()
    K = spec.top_k
    step = max(K, chunk // expert_elements(spec))
    chunks = list(used.split(step))
    if len(chunks) > 1 and len(chunks[-1]) < K:  # every chunk's layer needs top_k experts
        chunks[-2:] = [torch.cat(chunks[-2:])]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for experts in chunks:
        local = torch.full((spec.num_experts,), -1, dtype=torch.int64)
        local[experts] = torch.arange(len(experts))
        slot = local[ids]
        inside = (slot >= 0).any(dim=1).nonzero().flatten()
        slot = slot[inside]
        sub_ids = torch.where(slot >= 0, slot, slot.max(dim=1, keepdim=True).values)
        sub_weights = torch.where(slot >= 0, weights[inside], 0.0)
        f = w.fp8
        woq = None if w.woq is None else w.woq.experts_slice(experts.to(w.w1.device)).map(torch.Tensor.cpu)
        w1, w2 = (_take(w.w1, experts), _take(w.w2, experts)) if woq is None else (woq.w1, woq.w2)
        sub_w = MoEWeights(router_weight=_take(w.router_weight, experts), w1=w1, w2=w2, woq=woq,
                           fp8=None if f is None else Fp8Scales(f.granularity, _take(f.w1_scale, experts),
                                                                _take(f.w2_scale, experts),
                                                                None if f.a1_scale is None else f.a1_scale.cpu(),
                                                                None if f.a2_scale is None else f.a2_scale.cpu()))
        if spec.quant is Quant.NONE and (sub_w.fp8 is not None or sub_w.woq is not None):
            sub_w = sub_w.dequantized(TORCH_DTYPE[spec.dtype])
        sub_spec = replace(spec, num_experts=len(experts), routing=Routing(), name=f"{spec.name}[chunk]")
        out[inside] += moe_reference(sub_spec, sub_w, x[inside], topk_ids=sub_ids, topk_weights=sub_weights)
    return out


def rel_err(out: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> float:
    """rel-norm error of `out` on the sampled rows; inf if any element is not finite (unwritten poison)."""
    torch.cuda.synchronize()
    if not torch.isfinite(out).all():
        return math.inf
    got = out[rows].double().cpu()
    return float((got - ref).norm() / ref.norm())


def layer_expert_bytes(spec: MoESpec) -> int:
    """Bytes a GEMM pass reads of one expert: W1 and W2 in the weight dtype, and for FP8 layers the fp32
    scales the FP8 GEMMs read with them (per output channel for fp8, whose tensor scales the runner
    repeats per channel; per 128 x 128 block for fp8_block)."""
    H, I, N1 = spec.hidden_size, spec.intermediate_size, spec.fc1_out_features
    if spec.quant is Quant.FP8:
        return N1 * H + H * I + 4 * (N1 + H)
    if spec.quant is Quant.FP8_BLOCK:
        return N1 * H + H * I + 4 * (blocks(N1) * blocks(H) + blocks(H) * blocks(I))
    return (N1 * H + H * I) * spec.dtype.itemsize


def floor_us(spec: MoESpec, tokens: int, touched_experts: float, ceilings: dict[str, float],
             expert_bytes: int | None = None) -> dict[str, float]:
    """The lower bound from the ceilings, in one place for every bench: the bytes the layer cannot avoid
    moving (the touched experts' weights, layer_expert_bytes, + activations in and out) over the byte ceiling,
    and its FLOPs over the matmul ceiling of its GEMMs' input type (the e4m3 rate, `fp8_flops_per_s`, for
    FP8 layers; bf16 otherwise), whichever takes longer. `expert_bytes` replaces layer_expert_bytes where the
    caller knows the stored bytes better (weight-only layers: their data, scales and zero points). Why: no kernel moves bytes faster than the
    measured byte ceiling nor multiplies faster than the measured matmul, so the layer can beat neither."""
    H, I, N1, K = spec.hidden_size, spec.intermediate_size, spec.fc1_out_features, spec.top_k
    item = spec.dtype.itemsize
    stored = expert_bytes if expert_bytes is not None else layer_expert_bytes(spec)
    nbytes = touched_experts * stored + 2 * tokens * H * item
    flops = 2.0 * tokens * K * (N1 * H + H * I)
    fp8 = spec.quant in (Quant.FP8, Quant.FP8_BLOCK)
    t_bytes = nbytes / ceilings["bytes_per_s"] * 1e6
    t_flops = flops / ceilings["fp8_flops_per_s" if fp8 else "bf16_flops_per_s"] * 1e6
    return {"floor_us": max(t_bytes, t_flops), "bytes": nbytes, "flops": flops, "bytes_us": t_bytes,
            "flops_us": t_flops, "bound": "bytes" if t_bytes >= t_flops else "flops"}
