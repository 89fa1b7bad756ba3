"""FP8 (e4m3) experts in the OOTB graph: ONNX QuantizeLinear / DequantizeLinear around each expert GEMM.

The numbers are moe_build/weights/fp8.py's; this module only writes them as ops that both ONNX's own
evaluator (and onnxruntime) and TensorRT-RTX 1.7 take (what was tried and refused: docs/tensorrt_rtx.md,
"FP8 Q/DQ in the OOTB graph"):
- weights stay FP8 initializers, stored [E, in, out] (one [in, out] initializer per expert for
  per_expert_gather, so no FP8 tensor is ever gathered: TensorRT takes FP8 only from Q, constants,
  concatenations and shuffles), each read through one DequantizeLinear with its fp32 scale: per axis 0 for
  tensor scales (one per expert), blocked with block_size = in for channel scales (one per output column),
  and blocked 128 along the input axis for block128 scales, each 128 x 128 block's scale repeated over its
  128 output columns (opset 21's `block_size` takes one blocked axis, a DeepSeek block has two);
- static activation scales: QuantizeLinear / DequantizeLinear with the stored fp32 scalar;
- dynamic activation scales: s = max(ReduceMax(|x|), 1e-12) / 448 per row (or per 128-column group, padded
  with zeros), then Div by s -> Q/DQ with scale 1 -> Mul by s. The same numbers as a Q/DQ with scale s,
  written this way because TensorRT-RTX refuses a QuantizeLinear whose scale is computed in the graph (its
  ONNX parser asserts on the scale's dynamic shape) and a Cast to FLOAT8E4M3FN (an FP8 tensor must come
  from a quantize layer).
Every Q rounds x / s (an fp32 division) to nearest even and saturates to +-448 (ONNX's default
`saturate=1`). The expert GEMMs and the activation between them run in fp32, the dequantized type:
the scales stay exact fp32, as the contract has them.

The torch side: two custom ops (`fp8_qdq`, `fp8_dequantize`) carry these semantics through torch.export
(eager kernels compute exactly what the ONNX ops do), and `TRANSLATIONS` turns each into its ONNX nodes.
"""
from __future__ import annotations

import torch
from onnx import TensorProto
from onnxscript import opset21 as op
from torch import nn

from ..weights import MoEWeights
from ..weights.fp8 import AMAX_FLOOR, FP8_DTYPE, FP8_GROUP, FP8_MAX, ScaleGranularity, activation_group

FP8_ONNX_OPSET = 21  # QuantizeLinear's output_dtype and DequantizeLinear's block_size


@torch.library.custom_op("moe_build::fp8_qdq", mutates_args=())
def fp8_qdq(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 x through FP8 with one fp32 scale and back: fp8_e4m3(x / scale) (RNE, saturated) * scale."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(torch.float32) * scale


@fp8_qdq.register_fake
def _fp8_qdq_fake(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("moe_build::fp8_dequantize", mutates_args=())
def fp8_dequantize(w: torch.Tensor, scale: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """float(w) * scale in fp32, the scale laid out as DequantizeLinear reads it: a scalar, one per index of
    `axis` (block_size 0, 1-D scale), or one per `block_size` indices of `axis` (the last block may be short)."""
    if block_size:
        s = scale.repeat_interleave(block_size, dim=axis).narrow(axis, 0, w.shape[axis])
    elif scale.dim():
        s = scale.reshape([-1 if d == axis else 1 for d in range(w.dim())])
    else:
        s = scale
    return w.to(torch.float32) * s


@fp8_dequantize.register_fake
def _fp8_dequantize_fake(w: torch.Tensor, scale: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    return torch.empty(w.shape, dtype=torch.float32, device=w.device)


def _qdq_onnx(x, scale):  # type: ignore[no-untyped-def] - onnxscript values
    q = op.QuantizeLinear(x, scale, output_dtype=TensorProto.FLOAT8E4M3FN)
    return op.DequantizeLinear(q, scale)


def _dequantize_onnx(w, scale, axis: int, block_size: int):  # type: ignore[no-untyped-def]
    if block_size:
        return op.DequantizeLinear(w, scale, axis=axis, block_size=block_size)
    return op.DequantizeLinear(w, scale, axis=axis)


# torch.onnx.export's custom_translation_table for graphs with FP8 experts.
TRANSLATIONS = {torch.ops.moe_build.fp8_qdq.default: _qdq_onnx,
                torch.ops.moe_build.fp8_dequantize.default: _dequantize_onnx}


def dequantize_layout(scale: torch.Tensor, granularity: ScaleGranularity, inputs: int, outputs: int,
                      stacked: bool) -> tuple[torch.Tensor, int, int]:
    """(scale, axis, block_size) of the DequantizeLinear that gives float(w) * scale for an FP8 weight stored
    [E, in, out] with its stacked scale (`stacked`), or [in, out] with one expert's scale: the forms of the
    module docstring. `inputs` / `outputs` are the weight's in / out features."""
    if granularity is ScaleGranularity.TENSOR:
        return scale, 0, 0                                          # [E] per expert, or one expert's scalar
    if granularity is ScaleGranularity.CHANNEL:
        return (scale.unsqueeze(1), 1, inputs) if stacked else (scale, 1, 0)  # [E, 1, out] one block, or [out]
    per_column = scale.transpose(-1, -2).repeat_interleave(FP8_GROUP, dim=-1)[..., :outputs]
    return per_column.contiguous(), 1 if stacked else 0, FP8_GROUP  # [(E,) ceil(in / 128), out]


def _dynamic_scale(x: torch.Tensor) -> torch.Tensor:
    """Per row of the last dim: max(amax(|x|), 1e-12) / 448 in fp32 (fp8.row_scales)."""
    return x.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR) / FP8_MAX


class Fp8Experts(nn.Module):
    """The FP8 experts' W1 / W2 (FP8 buffers and fp32 scales, as DequantizeLinear reads them) and the
    quantization of their two GEMM inputs; MoELayerModule asks it for weights and quantized inputs."""

    def __init__(self, weights: MoEWeights, per_expert: bool):
        super().__init__()
        f = weights.fp8
        if f is None:
            raise ValueError("Fp8Experts needs FP8 expert weights")
        self.granularity, self.per_expert = f.granularity, per_expert
        self.group = activation_group(f.granularity)
        self.axes: dict[str, tuple[int, int]] = {}
        for name, w, scale in (("w1", weights.w1, f.w1_scale), ("w2", weights.w2, f.w2_scale)):
            self._store(name, w.transpose(1, 2).contiguous(), scale.to(torch.float32))
        for name in ("a1_scale", "a2_scale"):
            static = getattr(f, name)
            self.register_buffer(name, None if static is None else static.to(torch.float32).reshape(()))
        # The dynamic form's Q/DQ scale (x arrives divided by its own scale).
        self.register_buffer("unit_scale", torch.ones((), dtype=torch.float32))

    def _store(self, name: str, w: torch.Tensor, scale: torch.Tensor) -> None:
        """`name` [E, in, out] FP8 as one buffer, or one per expert when the graph computes per expert."""
        inputs, outputs = w.shape[1], w.shape[2]
        if not self.per_expert:
            s, axis, block = dequantize_layout(scale, self.granularity, inputs, outputs, stacked=True)
            self.register_buffer(name, w)
            self.register_buffer(f"{name}_scale", s)
            self.axes[name] = (axis, block)
            return
        for e in range(w.shape[0]):
            s, axis, block = dequantize_layout(scale[e], self.granularity, inputs, outputs, stacked=False)
            self.register_buffer(f"{name}_{e}", w[e].clone())
            self.register_buffer(f"{name}_scale_{e}", s)
            self.axes[name] = (axis, block)

    def weight(self, name: str, expert: int | None = None) -> torch.Tensor:
        """W1 or W2 dequantized in fp32: [E, in, out] (expert None), or [in, out] of one expert."""
        axis, block = self.axes[name]
        suffix = "" if expert is None else f"_{expert}"
        return fp8_dequantize(getattr(self, name + suffix), getattr(self, f"{name}_scale{suffix}"), axis, block)

    def quantize_input(self, x: torch.Tensor, gemm: int) -> torch.Tensor:
        """GEMM `gemm`'s (1 or 2) input rows as that GEMM sees them: x in fp32 through FP8 and back with the
        static scale, or with dynamic scales per row (tensor, channel weights) or per 128-column group."""
        x = x.to(torch.float32)
        static = self.a1_scale if gemm == 1 else self.a2_scale
        if static is not None:
            return fp8_qdq(x, static)
        if self.group is None:
            s = _dynamic_scale(x)
            return fp8_qdq(x / s, self.unit_scale) * s
        columns = x.shape[-1]
        pad = -columns % self.group
        groups = nn.functional.pad(x, (0, pad)) if pad else x
        groups = groups.unflatten(-1, (-1, self.group))
        s = _dynamic_scale(groups)
        return (fp8_qdq(groups / s, self.unit_scale) * s).flatten(-2)[..., :columns]
