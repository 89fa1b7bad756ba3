"""woq.quantize_matrix (random weight-only layers for tests and benchmarks): its output is the canonical form that
woq.dequantize_matrix reads, and each dequantized weight is within half a quantization step of the float weight
(int4 with zero points: one step, the zero point itself being rounded), the step computed here from the stored
scale, independently of the quantizer's arithmetic. And woq.stored_form, that canonical form in words for a spec
(what engine manifests record), against the words written here for each quant."""
from __future__ import annotations

import pytest
import torch

from moe_build.errors import MoeBuildError
from moe_build.spec import MoESpec, Quant
from moe_build.weights.woq import (E8M0_BIAS, WoqKind, dequantize_matrix, quantize_matrix, stored_form,
                                   unpack_nibbles, wgmma_scales)


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


# ---- the stored form an engine's manifest records (woq.stored_form) -----------------------------------------

@pytest.mark.parametrize("quant, flags, want", [
    (Quant.W4A16_AWQ, {"quant_group_size": 64, "quant_zero_points": True, "quant_prequant_scales": True},
     {"kind": "int4", "scales": "fp32 [E, out, in/64]", "zero_points": "uint8 [E, out, in/64] in 0..15",
      "prequant_scales": "fp32 [hidden], [intermediate]", "granularity": "group64"}),
    (Quant.W4A16_AWQ, {"quant_group_size": 128},
     {"kind": "int4", "scales": "fp32 [E, out, in/128]", "zero_points": None, "prequant_scales": None,
      "granularity": "group128"}),
    (Quant.W8A16, {"quant_per_channel": True},
     {"kind": "int8", "scales": "fp32 [E, out, 1]", "zero_points": None, "prequant_scales": None,
      "granularity": "channel"}),
    (Quant.WFP4A16, {},
     {"kind": "mxfp4", "scales": "uint8 e8m0 exponents [E, out, in/32]", "zero_points": None,
      "prequant_scales": None, "granularity": "group32"}),
    (Quant.W4AFP8, {"quant_group_size": 128, "quant_prequant_scales": True},
     {"kind": "int4", "scales": "fp32 [E, out, in/128]", "zero_points": None,
      "prequant_scales": "fp32 [hidden], [intermediate]", "granularity": "group128"}),
])
def test_stored_form_says_what_the_readers_store(quant: Quant, flags: dict, want: dict) -> None:
    got = stored_form(MoESpec(256, 128, 4, 2, quant=quant, **flags))
    assert {k: v for k, v in got.items() if k != "weights"} == want
    packed = "uint8 [E, out, in/2], two codes a byte, the low nibble the even column"
    if quant is Quant.W8A16:
        assert got["weights"] == "int8 [E, out, in]"
    else:  # symmetric int4 says its implied zero point; asymmetric int4 and MXFP4 do not have one to say
        implied = quant in (Quant.W4A16_AWQ, Quant.W4AFP8) and not flags.get("quant_zero_points")
        assert got["weights"] == packed + (", zero point 8" if implied else "")


def test_stored_form_of_a_layer_not_weight_only_is_refused() -> None:
    with pytest.raises(MoeBuildError, match="quant"):
        stored_form(MoESpec(256, 128, 4, 2, quant=Quant.FP8))


def test_wgmma_scales_are_mn_major_with_the_zero_term_from_the_rounded_scale() -> None:
    """The mixed-input wgmma GEMM's scales: [E, groups, n] in the activation dtype, and int4's zero term (8 - z) * s
    from s as rounded to that dtype (an exact product in fp64 here, rounded once); 0 without zero points, none for
    int8, and MXFP4 refused (it has no such kernel)."""
    g = torch.Generator().manual_seed(5)
    s = torch.rand(3, 5, 4, generator=g) * 0.02 + 1e-3
    z = torch.randint(0, 16, (3, 5, 4), generator=g, dtype=torch.uint8)
    for dtype in (torch.bfloat16, torch.float16):
        scales, zeros = wgmma_scales(WoqKind.INT4, s, z, dtype)
        assert scales.dtype == zeros.dtype == dtype and scales.shape == zeros.shape == (3, 4, 5)
        assert scales.is_contiguous() and zeros.is_contiguous()
        for e, n, gi in ((0, 0, 0), (2, 4, 3), (1, 2, 1)):
            assert scales[e, gi, n].item() == float(s[e, n, gi].to(dtype))
            exact = (8.0 - float(z[e, n, gi])) * scales[e, gi, n].item()  # a 4-bit integer times the rounded scale
            assert zeros[e, gi, n].item() == float(torch.tensor(exact, dtype=torch.float64).to(dtype))
        _, symmetric = wgmma_scales(WoqKind.INT4, s, None, dtype)
        assert not symmetric.any()
        int8_scales, none = wgmma_scales(WoqKind.INT8, s, None, dtype)
        assert none is None and torch.equal(int8_scales, s.transpose(1, 2).to(dtype))
    with pytest.raises(ValueError, match="mxfp4"):
        wgmma_scales(WoqKind.MXFP4, s, None, torch.bfloat16)
