"""woq.quantize_matrix (random weight-only layers for tests and benchmarks): its output is the canonical form that
woq.dequantize_matrix reads, and each dequantized weight is within half a quantization step of the float weight
(int4 with zero points: one step, the zero point itself being rounded), the step computed here from the stored
scale, independently of the quantizer's arithmetic."""
from __future__ import annotations

import pytest
import torch

from moe_build.weights.woq import E8M0_BIAS, WoqKind, dequantize_matrix, quantize_matrix, unpack_nibbles


@pytest.mark.parametrize("kind, group, asymmetric", [(WoqKind.INT4, 128, False), (WoqKind.INT4, 32, True),
                                                     (WoqKind.INT4, None, False), (WoqKind.INT8, None, False),
                                                     (WoqKind.INT8, 64, False), (WoqKind.MXFP4, 32, False)])
def test_quantized_weights_dequantize_to_within_a_step(kind: WoqKind, group: int | None, asymmetric: bool) -> None:
    w = torch.randn(3, 48, 256, generator=torch.Generator().manual_seed(5)) * 0.05
    q, scale, zero = quantize_matrix(kind, w, group, asymmetric)
    size = 32 if kind is WoqKind.MXFP4 else (group or 256)
    assert scale.shape == (3, 48, 256 // size) and (zero is not None) == asymmetric
    assert q.dtype == (torch.int8 if kind is WoqKind.INT8 else torch.uint8)
    assert q.shape[-1] == (256 if kind is WoqKind.INT8 else 128)
    for e in range(3):
        d = dequantize_matrix(kind, q[e], scale[e], None if zero is None else zero[e])
        if kind is WoqKind.MXFP4:
            step = torch.exp2(scale[e].double() - E8M0_BIAS).repeat_interleave(size, -1)  # e2m1's widest gap: 2
        else:
            step = scale[e].double().repeat_interleave(size, -1) * (2 if asymmetric else 1) / 2
        assert ((d - w[e].double()).abs() <= step * (1 + 1e-6)).all()
    if kind is WoqKind.INT4 and not asymmetric:
        assert int(unpack_nibbles(q).min()) >= 0 and int(unpack_nibbles(q).max()) <= 15
