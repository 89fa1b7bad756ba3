"""FP8 expert weights read as their producers store them, and kept in FP8 (moe_build/weights/fp8.py's contract).

Each weight matrix [out, in] is stored as F8_E4M3 beside a scale it is multiplied by, w = float(w_fp8) * scale:
- DeepSeek-V3 and the Qwen3 -FP8 releases (quant_method "fp8", weight_block_size [128, 128]):
  `<m>.weight_scale_inv` fp32 [ceil(out/128), ceil(in/128)], one per 128 x 128 block ("inv" because it is the
  reciprocal of the quantization scale, so it multiplies); stored as UE8M0 (F8_E8M0) powers of two too;
- NVIDIA ModelOpt FP8: `<m>.weight_scale` fp32 [] with a calibrated `<m>.input_scale` fp32 [];
  FP8_PER_CHANNEL_PER_TOKEN: `<m>.weight_scale` [out] and no input scale;
- compressed-tensors float-quantized: `<m>.weight_scale` [1] (tensor), [out, 1] (channel) or
  [ceil(out/128), ceil(in/128)] (block), in fp32 or the model dtype, and `<m>.input_scale` [1] when static;
- AutoFP8 and transformers' per-tensor FP8 (quant_method "fp8" without blocks): a scalar `weight_scale` or
  `weight_scale_inv`, with `input_scale` or `activation_scale` when static;
- transformers 5.x's FP8 experts as held in memory (a state_dict saved as it is): stacked `experts.gate_up_proj`
  [E, 2I, H] and `experts.down_proj` [E, H, I] with `<name>_scale_inv` [E, ...] beside them.
Per-tensor and per-channel scales are told apart by their shapes; block scales are expected where the spec's
quant (from the config) is fp8_block.

W1 stacks each expert's gate and up rows. Block scales stack with them only where I is a multiple of 128 (else a
128 x 128 block of W1 would hold rows of two stored blocks under two scales, which is refused); per-tensor gate
and up scales that differ become per-channel W1 scales, each row carrying its own matrix's scale, which is the
same product exactly. Calibrated input scales (static) are reduced over the experts to their maximum, a1 over the
gate and up inputs and a2 over the down inputs, because one input row feeds several experts and is quantized once.
Every tensor is read through the checkpoint's `get`, so the layer's digest covers the FP8 weights and scales as
stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ..errors import MoeBuildError
from ..spec import ActScale, MoESpec, Quant
from .dtypes import TORCH_DTYPE
from .fp8 import FP8_GROUP, Fp8Scales, ScaleGranularity, blocks, dequantize_weight

class _Checkpoint(Protocol):
    """What these readers take from the checkpoint reader (moe_build/weights/checkpoint.py's): named tensors'
    presence, stored shape and dtype, and checked reads."""

    def has(self, name: str) -> bool: ...
    def shape(self, name: str) -> tuple[int, ...] | None: ...
    def dtype(self, name: str) -> str | None: ...
    def get(self, name: str, shape: tuple[int, ...], dtypes: tuple[str, ...] = ...) -> torch.Tensor: ...

WEIGHT_DTYPES = ("F8_E4M3",)
SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0")  # safetensors names; each converts to fp32 exactly
_T, _C, _B = ScaleGranularity.TENSOR, ScaleGranularity.CHANNEL, ScaleGranularity.BLOCK128


def is_fp8(spec: MoESpec) -> bool:
    return spec.quant in (Quant.FP8, Quant.FP8_BLOCK)


@dataclass(frozen=True)
class Part:
    """Stored rows of W1 or W2 for every expert: one stacked tensor of `shape` (E, rows, cols), or one matrix of
    `shape` (rows, cols) per expert, named in expert order."""

    names: tuple[str, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Read:
    """FP8 weights as read, [E, rows, cols] (or one [rows, cols]), with their fp32 scale shaped [E] (tensor),
    [E, rows] (channel) or [E, ceil(rows/128), ceil(cols/128)] (block), and calibrated input scales [E] or None."""

    weight: torch.Tensor
    scale: torch.Tensor
    granularity: ScaleGranularity
    input_scale: torch.Tensor | None

    def row_scales(self) -> torch.Tensor:
        """The scale of every output row: a per-tensor scale repeated, which multiplies each element alike."""
        if self.granularity is _T:
            return self.scale.unsqueeze(-1).expand(*self.scale.shape, self.weight.shape[-2]).contiguous()
        return self.scale


def _companions(name: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """(weight-scale names, input-scale names) beside weight `name`, in the spellings producers use: `m.weight`
    has `m.weight_scale_inv` or `m.weight_scale` and `m.input_scale` or `m.activation_scale`; a stacked
    `experts.gate_up_proj` has `experts.gate_up_proj_scale_inv` and `experts.gate_up_proj_activation_scale`."""
    if name.endswith(".weight"):
        base = name.removesuffix(".weight")
        return (f"{base}.weight_scale_inv", f"{base}.weight_scale"), (f"{base}.input_scale", f"{base}.activation_scale")
    return (f"{name}_scale_inv", f"{name}_scale"), (f"{name}_activation_scale", f"{name}_input_scale")


def _scale_shapes(lead: tuple[int, ...], rows: int, cols: int, block: bool) -> dict[tuple[int, ...], ScaleGranularity]:
    """Every stored shape a weight scale of a (*lead, rows, cols) weight may have, and what each means."""
    if block:
        return {(*lead, blocks(rows), blocks(cols)): _B}
    return {lead: _T, (*lead, 1): _T, (*lead, 1, 1): _T, (*lead, rows): _C, (*lead, rows, 1): _C}


def _scale(ck: _Checkpoint, weight: str, lead: tuple[int, ...], rows: int, cols: int,
           block: bool) -> tuple[torch.Tensor, ScaleGranularity]:
    """The weight scale beside `weight`, header checked first, as fp32 shaped as `_Read` holds it."""
    names = _companions(weight)[0]
    name = next((n for n in names if ck.has(n)), None)
    if name is None:
        raise MoeBuildError(names[0], f"missing (and so is {names[1]}): FP8 weight {weight} has no scale",
                            "a scale beside every FP8 weight")
    options = _scale_shapes(lead, rows, cols, block)
    got = ck.shape(name)
    if got is not None and got not in options:
        kind = "128 x 128 block" if block else "per-tensor or per-channel"
        raise MoeBuildError(name, f"shape {got} does not fit {kind} scales of its weight {(*lead, rows, cols)}",
                            " or ".join(f"shape {s}" for s in options))
    shape = got if got is not None else next(iter(options))
    granularity = options[shape]
    scale = ck.get(name, shape, SCALE_DTYPES).to(torch.float32)
    if not bool(torch.isfinite(scale).all()):
        raise MoeBuildError(name, "holds a scale that is not a finite number", "finite scales")
    tail = {_T: (), _C: (rows,), _B: (blocks(rows), blocks(cols))}[granularity]
    return scale.reshape((*lead, *tail)), granularity


def _input_scale(ck: _Checkpoint, weight: str, lead: tuple[int, ...]) -> torch.Tensor:
    """The calibrated input scale beside `weight` (static activations), fp32 shaped `lead`."""
    names = _companions(weight)[1]
    name = next((n for n in names if ck.has(n)), None)
    if name is None:
        raise MoeBuildError(names[0], f"missing (and so is {names[1]}): the quantization config says static "
                            f"activation scales, and FP8 weight {weight} has none", "a calibrated input scale "
                            "beside every FP8 expert weight")
    shapes = (lead, (*lead, 1))
    got = ck.shape(name)
    scale = ck.get(name, got if got in shapes else shapes[0], SCALE_DTYPES).to(torch.float32).reshape(lead)
    if not bool((torch.isfinite(scale) & (scale > 0)).all()):
        raise MoeBuildError(name, "a calibrated input scale must be a finite number > 0", "positive scales")
    return scale


def _read(ck: _Checkpoint, name: str, shape: tuple[int, ...], block: bool, static: bool) -> _Read:
    """One stored FP8 weight (a matrix or a stack of them) with its scales."""
    *lead, rows, cols = shape
    weight = ck.get(name, shape, WEIGHT_DTYPES)
    scale, granularity = _scale(ck, name, tuple(lead), rows, cols, block)
    inputs = _input_scale(ck, name, tuple(lead)) if static else None
    return _Read(weight, scale, granularity, inputs)


def _stack(reads: list[_Read]) -> _Read:
    """Per-expert reads as one [E, ...] read; per-tensor and per-channel scales mixed become per-channel."""
    kinds = {r.granularity for r in reads}
    granularity = kinds.pop() if len(kinds) == 1 else _C
    scale = torch.stack([r.scale if r.granularity is granularity else r.row_scales() for r in reads])
    inputs = None if reads[0].input_scale is None else torch.stack([r.input_scale for r in reads])
    return _Read(torch.stack([r.weight for r in reads]), scale, granularity, inputs)


def _read_part(ck: _Checkpoint, part: Part, block: bool, static: bool) -> _Read:
    if len(part.shape) == 3:
        return _read(ck, part.names[0], part.shape, block, static)
    return _stack([_read(ck, name, part.shape, block, static) for name in part.names])


def _check_block_rows(w1_parts: Sequence[Part]) -> None:
    """Refuse, before any read, W1 parts whose 128 x 128 blocks would not tile W1: every part but the last must
    end on a block boundary."""
    for part in w1_parts[:-1]:
        rows = part.shape[-2]
        if rows % FP8_GROUP:
            raise MoeBuildError(_companions(part.names[0])[0][0], f"{rows} rows per expert, not a multiple of 128: "
                                "stacked into W1, the next matrix's rows would share 128 x 128 blocks with these "
                                "under other scales", "intermediate sizes that are multiples of 128")


def fp8_experts(ck: _Checkpoint, w1_parts: Sequence[Part], w2: Part,
                spec: MoESpec) -> tuple[torch.Tensor, torch.Tensor, Fp8Scales]:
    """W1 [E, N1, H] (`w1_parts` stacked along the rows: gate then up, or one gate_up) and W2 [E, H, I] in
    float8_e4m3fn with their scales, as MoEWeights holds FP8 experts (module docstring)."""
    block, static = spec.quant is Quant.FP8_BLOCK, spec.act_scale is ActScale.STATIC
    if block:
        _check_block_rows(w1_parts)
    parts = [_read_part(ck, p, block, static) for p in w1_parts]
    down = _read_part(ck, w2, block, static)
    w1 = torch.cat([p.weight for p in parts], dim=1)
    if block:
        granularity, s1, s2 = _B, torch.cat([p.scale for p in parts], dim=1), down.scale
    elif all(r.granularity is _T for r in (*parts, down)) and all(torch.equal(p.scale, parts[0].scale) for p in parts):
        granularity, s1, s2 = _T, parts[0].scale, down.scale
    else:
        granularity, s1, s2 = _C, torch.cat([p.row_scales() for p in parts], dim=1), down.row_scales()
    a1 = torch.stack([p.input_scale.max() for p in parts]).max() if static else None
    a2 = down.input_scale.max() if static else None
    return w1, down.weight, Fp8Scales(granularity, s1.contiguous(), s2.contiguous(), a1, a2)


def dense_weight(ck: _Checkpoint, name: str, shape: tuple[int, int], spec: MoESpec) -> torch.Tensor:
    """A weight of a dense MLP beside the experts (shared experts). Stored in FP8 it is dequantized to the model
    dtype, because the shared experts run as a dense MLP in the model dtype outside the expert kernels: the
    product w_fp8 * scale is exact in fp64 and rounded once to the model dtype. Their calibrated input scales are
    not read, since that MLP's inputs are not quantized."""
    if not is_fp8(spec) or ck.dtype(name) not in WEIGHT_DTYPES:
        return ck.get(name, shape)
    read = _read(ck, name, shape, spec.quant is Quant.FP8_BLOCK, static=False)
    exact = dequantize_weight(read.weight[None], read.scale[None], read.granularity)
    return exact[0].to(TORCH_DTYPE[spec.dtype])
