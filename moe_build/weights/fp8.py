"""FP8 (e4m3) expert weights and activations: the storage contract and the exact quantization rules.

Every FP8 piece of moe-build follows this one file: the checkpoint loaders produce `Fp8Scales` beside
float8_e4m3fn W1 / W2, the fp64 reference emulates activations with `quantize_rows`, the OOTB graph
writes the same math as QuantizeLinear / DequantizeLinear, and the CUDA kernels
(cpp/src/stages/quantize_fp8.cu and the FP8 GEMMs) compute bit for bit what `quantize_rows` computes.

Weights (never dequantized on load): W1 [E, N1, H] and W2 [E, H, I] in float8_e4m3fn, dequantized as
`w = float(w_fp8) * scale`, the scale broadcast per granularity:
- TENSOR:   w1_scale [E], w2_scale [E] (one per expert matrix: ModelOpt, compressed-tensors `tensor`);
- CHANNEL:  w1_scale [E, N1], w2_scale [E, H] (one per output row: compressed-tensors `channel`);
- BLOCK128: w1_scale [E, ceil(N1/128), ceil(H/128)], w2_scale [E, ceil(H/128), ceil(I/128)], one per
  128 x 128 block of [out, in] (DeepSeek-V3 and the Qwen3 -FP8 releases, `weight_scale_inv`).

Activations (GEMM1's input rows and GEMM2's input, the activated intermediate), with scale s:
`q = fp8_e4m3(x / s)` rounded to nearest even and saturated to +-448 (x / s an IEEE fp32 division of
the fp32 value of x), dequantized as `q * s`. s is
- static: a1_scale / a2_scale, one fp32 per GEMM input (per-expert calibrated scales are reduced to
  their maximum on load, because one input row feeds several experts and is quantized once);
- dynamic, FP8 weights of granularity TENSOR or CHANNEL: per row, s = max(amax(|x_row|), 1e-12) / 448 in fp32;
- dynamic, BLOCK128: per row and 128-column group, s = max(amax(|x_group|), 1e-12) / 448 in fp32.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

import torch

from .halves import HALF_FEATURES, halves_fit, scale_blocks

FP8_MAX = 448.0          # largest finite float8_e4m3fn
FP8_GROUP = 128          # block-128: weight block side and activation group width
AMAX_FLOOR = 1e-12       # dynamic scales: an all-zero row or group gets this amax, not a zero scale
FP8_DTYPE = torch.float8_e4m3fn


class ScaleGranularity(str, enum.Enum):
    TENSOR = "tensor"
    CHANNEL = "channel"
    BLOCK128 = "block128"


@dataclass
class Fp8Scales:
    """The fp32 scales of one layer's FP8 experts (shapes in the module docstring)."""

    granularity: ScaleGranularity
    w1_scale: torch.Tensor
    w2_scale: torch.Tensor
    a1_scale: torch.Tensor | None = None  # fp32 [] static GEMM1 input scale; None: dynamic
    a2_scale: torch.Tensor | None = None  # fp32 [] static GEMM2 input scale; None: dynamic

    @property
    def static(self) -> bool:
        return self.a1_scale is not None

    def to(self, device: torch.device | str | None) -> "Fp8Scales":
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=torch.float32)
        return replace(self, w1_scale=mv(self.w1_scale), w2_scale=mv(self.w2_scale), a1_scale=mv(self.a1_scale),
                       a2_scale=mv(self.a2_scale))

    def expected_shapes(self, experts: int, n1: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
        """The shape each scale must have for W1 [E, n1, hidden] and W2 [E, hidden, inter]."""
        g = self.granularity
        if g is ScaleGranularity.TENSOR:
            w1, w2 = (experts,), (experts,)
        elif g is ScaleGranularity.CHANNEL:
            w1, w2 = (experts, n1), (experts, hidden)
        else:
            w1 = (experts, blocks(n1), blocks(hidden))
            w2 = (experts, blocks(hidden), blocks(inter))
        return {"w1_scale": w1, "w2_scale": w2}


def blocks(n: int) -> int:
    """128-wide blocks (or activation groups) covering n."""
    return math.ceil(n / FP8_GROUP)


def gate_up_halves_scales(w1_scale: torch.Tensor, inter: int) -> torch.Tensor:
    """W1's block-128 scales [E, ceil(2I / 128), kb] (W1 stacked) as the wgmma GEMM1 with the gated epilogue reads
    them, [E, 2I / 8, kb] in the gate/up halves' order (moe_build.weights.halves); made once with the weights, which
    stay stacked."""
    if not halves_fit(inter):
        raise ValueError(f"intermediate_size: {inter} is not a multiple of {HALF_FEATURES} (the gate/up halves)")
    rows = blocks(2 * inter)
    if w1_scale.dim() != 3 or w1_scale.shape[1] != rows:
        raise ValueError(f"w1_scale: shape {tuple(w1_scale.shape)} is not [E, {rows}, kb] (a gated W1's block-128 "
                         f"scales, 2 x {inter} rows)")
    index = torch.tensor(scale_blocks(inter, FP8_GROUP), device=w1_scale.device)
    return w1_scale.index_select(1, index).contiguous()


def expand_weight_scale(scale: torch.Tensor, granularity: ScaleGranularity, rows: int, cols: int) -> torch.Tensor:
    """A weight scale of `granularity` broadcast to every element of its [E, rows, cols] weight (fp32)."""
    e = scale.shape[0]
    s = scale.to(torch.float32)
    if granularity is ScaleGranularity.TENSOR:
        return s.view(e, 1, 1).expand(e, rows, cols)
    if granularity is ScaleGranularity.CHANNEL:
        return s.view(e, rows, 1).expand(e, rows, cols)
    full = s.repeat_interleave(FP8_GROUP, dim=1).repeat_interleave(FP8_GROUP, dim=2)
    return full[:, :rows, :cols]


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor, granularity: ScaleGranularity,
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """float(w_fp8) * scale, exactly (in fp64 by default: every fp8 value times an fp32 scale is exact)."""
    return w.to(dtype) * expand_weight_scale(scale, granularity, w.shape[1], w.shape[2]).to(dtype)


def quantize_weight(w: torch.Tensor, granularity: ScaleGranularity) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [E, rows, cols] -> (float8_e4m3fn weight, fp32 scale of `granularity`), amax / 448
    scales: what the checkpoint producers write, used to make test weights and random FP8 layers."""
    e, rows, cols = w.shape
    x = w.to(torch.float32)
    if granularity is ScaleGranularity.TENSOR:
        scale = x.abs().amax(dim=(1, 2)).clamp_min(AMAX_FLOOR) / FP8_MAX
    elif granularity is ScaleGranularity.CHANNEL:
        scale = x.abs().amax(dim=2).clamp_min(AMAX_FLOOR) / FP8_MAX
    else:
        pr, pc = blocks(rows) * FP8_GROUP - rows, blocks(cols) * FP8_GROUP - cols
        padded = torch.nn.functional.pad(x.abs(), (0, pc, 0, pr))
        tiles = padded.view(e, blocks(rows), FP8_GROUP, blocks(cols), FP8_GROUP)
        scale = tiles.amax(dim=(2, 4)).clamp_min(AMAX_FLOOR) / FP8_MAX
    q = (x / expand_weight_scale(scale, granularity, rows, cols)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def row_scales(x: torch.Tensor, group: int | None) -> torch.Tensor:
    """Dynamic scales of rows x [R, C] in fp32: per row ([R, 1], group None) or per `group` columns
    ([R, ceil(C / group)])."""
    a = x.to(torch.float32).abs()
    if group is None:
        amax = a.amax(dim=1, keepdim=True)
    else:
        pad = (-a.shape[1]) % group
        amax = torch.nn.functional.pad(a, (0, pad)).view(a.shape[0], -1, group).amax(dim=2)
    # a tensor divisor: CUDA would turn a division by the Python scalar into a multiply by its reciprocal
    return amax.clamp_min(AMAX_FLOOR) / torch.full_like(amax, FP8_MAX)


def quantize_rows(x: torch.Tensor, static_scale: torch.Tensor | None, group: int | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations x [R, C] -> (float8_e4m3fn q [R, C], fp32 scales), the rule of the module docstring.
    static_scale: a scalar (static); None: dynamic per row (group None) or per `group` columns.
    Scales come back as [R, 1] (static: the scalar repeated) or [R, ceil(C / group)]."""
    xf = x.to(torch.float32)
    if static_scale is not None:
        s = static_scale.to(torch.float32).reshape(1, 1).expand(x.shape[0], 1)
    else:
        s = row_scales(xf, group)
    per_col = s if s.shape[1] == 1 else s.repeat_interleave(group, dim=1)[:, :x.shape[1]]
    q = (xf / per_col).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, s.contiguous()


def dequantize_rows(q: torch.Tensor, s: torch.Tensor, group: int | None,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """q * s with quantize_rows' scales of the same `group` (exact in fp64)."""
    per_col = s if group is None else s.repeat_interleave(group, dim=1)[:, :q.shape[1]]
    return q.to(dtype) * per_col.to(dtype)


def fake_quantize_rows(x: torch.Tensor, static_scale: torch.Tensor | None, group: int | None,
                       dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """x through quantize_rows and back: what a GEMM sees of its FP8 input (the reference's emulation)."""
    q, s = quantize_rows(x, static_scale, group)
    return dequantize_rows(q, s, group if static_scale is None else None, dtype)


def activation_group(granularity: ScaleGranularity) -> int | None:
    """The dynamic activation scale's column group for weights of `granularity` (None: whole row)."""
    return FP8_GROUP if granularity is ScaleGranularity.BLOCK128 else None
