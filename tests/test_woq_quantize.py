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
from moe_build.weights.woq import (E8M0_BIAS, WoqKind, WoqWeights, dequantize_matrix, digits_operand, mxfp4_as_e5m2,
                                   mxfp4_quarters, quantize_matrix, stored_form, unpack_nibbles, wgmma_operand)


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


def _int4_layer(s: torch.Tensor, z: torch.Tensor | None) -> WoqWeights:
    """A weight-only layer of 3 experts whose W1 has the scales `s` [3, 4, 5] (groups of 64 over k 320), W2 any."""
    g = torch.Generator().manual_seed(6)
    codes = lambda n, k: torch.randint(0, 256, (3, n, k // 2), generator=g, dtype=torch.uint8)
    return WoqWeights(WoqKind.INT4, 64, codes(4, 320), codes(320, 128), s, torch.ones(3, 320, 2), z,
                      None if z is None else torch.zeros(3, 320, 2, dtype=torch.uint8))


def test_wgmma_operand_scales_are_mn_major_with_the_zero_term_from_the_rounded_scale() -> None:
    """The mixed-input wgmma GEMM's scales: [E, groups, n] in the activation dtype, and int4's zero term (8 - z) * s
    from s as rounded to that dtype (an exact product in fp64 here, rounded once); 0 without zero points, none for
    int8; the weights as stored; and MXFP4 (its e5m2 form, below) refused for fp16."""
    g = torch.Generator().manual_seed(5)
    s = torch.rand(3, 4, 5, generator=g) * 0.02 + 1e-3
    z = torch.randint(0, 16, (3, 4, 5), generator=g, dtype=torch.uint8)
    for dtype in (torch.bfloat16, torch.float16):
        w = _int4_layer(s, z)
        op = wgmma_operand(w, "w1", dtype)
        assert op.kernel_kind == "int4" and op.group == 64 and op.data is w.w1
        assert op.scales.dtype == op.zeros.dtype == dtype and op.scales.shape == op.zeros.shape == (3, 5, 4)
        assert op.scales.is_contiguous() and op.zeros.is_contiguous()
        for e, n, gi in ((0, 0, 0), (2, 3, 4), (1, 2, 1)):
            assert op.scales[e, gi, n].item() == float(s[e, n, gi].to(dtype))
            exact = (8.0 - float(z[e, n, gi])) * op.scales[e, gi, n].item()  # a 4-bit integer times the rounded scale
            assert op.zeros[e, gi, n].item() == float(torch.tensor(exact, dtype=torch.float64).to(dtype))
        assert not wgmma_operand(_int4_layer(s, None), "w1", dtype).zeros.any()
        int8 = WoqWeights(WoqKind.INT8, 64, torch.zeros(3, 4, 320, dtype=torch.int8),
                          torch.zeros(3, 320, 128, dtype=torch.int8), s, torch.ones(3, 320, 2))
        op8 = wgmma_operand(int8, "w1", dtype)
        assert op8.zeros is None and op8.kernel_kind == "int8" and torch.equal(op8.scales, s.transpose(1, 2).to(dtype))
    mx = WoqWeights(WoqKind.MXFP4, 32, torch.zeros(3, 4, 32, dtype=torch.uint8), torch.zeros(3, 64, 64, dtype=torch.uint8),
                    torch.full((3, 4, 2), 120, dtype=torch.uint8), torch.full((3, 64, 4), 120, dtype=torch.uint8))
    with pytest.raises(ValueError, match="bf16"):
        wgmma_operand(mx, "w1", torch.float16)
    op = wgmma_operand(mx, "w1", torch.bfloat16)
    assert (op.kernel_kind, op.group, op.zeros, op.data.dtype, op.data.shape, op.scales.shape) == (
        "e5m2", 64, None, torch.float8_e5m2, (3, 4, 64), (3, 1, 4))


def _e5m2_case(exps: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 codes [2, n, k/2] under the e8m0 exponents `exps` [2, n, k/32], and their exact weights in fp64
    from the e2m1 table (written here, not the code under test's)."""
    e, n, blocks = exps.shape
    g = torch.Generator().manual_seed(seed)
    nib = torch.randint(0, 16, (e, n, blocks * 32), generator=g, dtype=torch.uint8)
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
    exact = e2m1[nib.long()] * torch.exp2(exps.double() - 127).repeat_interleave(32, -1)
    return nib[..., 0::2] | (nib[..., 1::2] << 4), exact


def test_mxfp4_as_e5m2_is_the_stored_weight_within_27_binades() -> None:
    """MXFP4's e5m2 form for the mixed-input kernel: q * s equals every stored weight exactly wherever a 64-k group's
    two exponents differ by at most 27 (here every span 0..27 and exponents 0..254, the bf16 overflow of 6 * 2^127
    included as the product's own), s a power of two that bf16 holds; blocks of zeros set no reference; past 27 the
    smaller block's weights are within 2^-28 of the group's largest."""
    n, blocks = 56, 8
    lo = torch.arange(n * blocks // 2).reshape(n, blocks // 2) % 228  # every base exponent 0..227
    span = torch.arange(n * blocks // 2).reshape(n, blocks // 2) % 28  # every span 0..27
    first = torch.stack((lo, lo + span), -1).reshape(n, blocks)
    exps = torch.stack((first, first.flip(-1))).to(torch.uint8)  # the larger exponent first and second
    exps[0, 0, 0], exps[0, 0, 1] = 254, 254  # the largest weights, 6 * 2^127: inf in bf16
    codes, exact = _e5m2_case(exps, 7)
    q, s = mxfp4_as_e5m2(codes, exps)
    assert q.dtype == torch.float8_e5m2 and s.dtype == torch.bfloat16 and s.shape == (2, blocks // 2, n)
    got = q.double() * s.double().transpose(1, 2).repeat_interleave(64, -1)
    assert torch.equal(got, exact)
    assert torch.equal(got.to(torch.bfloat16), exact.to(torch.bfloat16))
    log = torch.log2(s.double())
    assert torch.equal(log, log.round())  # powers of two
    # zeros in the high block: the low block sets the reference, exact across any span
    exps2 = torch.tensor([[[250, 3]]], dtype=torch.uint8).repeat(1, 4, 1)
    codes2, exact2 = _e5m2_case(exps2, 8)
    codes2[..., :16] = 0
    exact2[..., :32] = 0
    q2, s2 = mxfp4_as_e5m2(codes2, exps2)
    assert torch.equal(q2.double() * s2.double().transpose(1, 2).repeat_interleave(64, -1), exact2)
    # past 27 binades: within 2^-28 of the group's largest weight
    exps3 = torch.tensor([[[140, 100]]], dtype=torch.uint8).repeat(1, 4, 1)
    codes3, exact3 = _e5m2_case(exps3, 9)
    q3, s3 = mxfp4_as_e5m2(codes3, exps3)
    err = (q3.double() * s3.double().transpose(1, 2).repeat_interleave(64, -1) - exact3).abs()
    assert float(err.max()) <= 2.0 ** -28 * float(exact3.abs().amax())


@pytest.mark.parametrize("k", [384, 2880, 64], ids=["3-groups", "gpt-oss-half-group", "lone-half-group"])
def test_mxfp4_quarters_puts_each_code_where_the_digits_tile_reads_it(k: int) -> None:
    """The digits tile's MXFP4 order (cpp/include/moe_build_kernels.h MB_WOQ_MXFP4_QUARTERS): lane q reads step u's
    codes (k 32u + 8q + t of a 128-k group) as word u of its 16 bytes at 16q of the row's group, and step u's exponent
    as byte u of the group's 4-byte word; the rows in 16-row tiles, tile t's codes from 8 k t, group j's 1024 bytes
    from 1024 j and row r % 16's from 64 (r % 16), its exponents from k t / 2, 64 j and 4 (r % 16); a half group at
    k's end is a whole one whose second half is zero codes and exponents. Checked code by code from that reading
    (the expert's bytes flattened), against the stored nibble of the same row and k."""
    g = torch.Generator().manual_seed(k)
    e, n = 2, 48
    codes = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
    exps = torch.randint(0, 255, (e, n, k // 32), generator=g, dtype=torch.uint8)
    quarters, scales = mxfp4_quarters(codes, exps)
    groups = -(-k // 128)
    kp = 128 * groups  # the padded k
    assert quarters.shape == (e, n, 64 * groups) and quarters.dtype == torch.uint8
    assert scales.shape == (e, n, 4 * groups) and scales.dtype == torch.uint8
    stored = unpack_nibbles(codes)  # k order within each byte's pair
    flat_codes, flat_exps = quarters.reshape(e, -1), scales.reshape(e, -1)
    read = unpack_nibbles(flat_codes)
    rows = torch.arange(n)
    t, r16 = rows // 16, rows % 16
    for kk in range(kp):
        j, r = divmod(kk, 128)
        u, q, c = r // 32, (r % 32) // 8, r % 8
        byte = 8 * kp * t + 1024 * j + 64 * r16 + 16 * q + 4 * u + c // 2  # [n] positions in the expert's bytes
        exp_at = kp // 2 * t + 64 * j + 4 * r16 + u
        want_code = stored[..., kk] if kk < k else torch.zeros_like(stored[..., 0])  # past k: the padded half
        want_exp = exps[..., kk // 32] if kk < k else torch.zeros_like(exps[..., 0])
        assert torch.equal(read[:, 2 * byte + c % 2], want_code), kk
        assert torch.equal(flat_exps[:, exp_at], want_exp), kk


def test_mxfp4_quarters_refuses_rows_past_whole_tiles() -> None:
    """The form's 16-row tiles need n % 16 == 0 (the weight-only GEMMs take no other n): refused with the field."""
    with pytest.raises(ValueError, match="n 40 is not a multiple of 16"):
        mxfp4_quarters(torch.zeros(1, 40, 64, dtype=torch.uint8), torch.zeros(1, 40, 4, dtype=torch.uint8))


def test_digits_operand_copies_mxfp4_alone() -> None:
    """int4 and int8 reach the digits tile as stored (the same tensors, no copy); MXFP4 in its quarters order."""
    g = torch.Generator().manual_seed(6)
    s = torch.rand(3, 4, 5, generator=g) * 0.02 + 1e-3
    z = torch.randint(0, 16, (3, 4, 5), generator=g, dtype=torch.uint8)
    w4 = _int4_layer(s, z)
    op = digits_operand(w4, "w1")
    assert op.data is w4.w1 and op.scales is w4.w1_scale and op.zeros is w4.w1_zero
    assert (op.kernel_kind, op.group) == ("int4", 64)
    codes = torch.randint(0, 256, (3, 16, 64), generator=g, dtype=torch.uint8)
    exps = torch.randint(100, 140, (3, 16, 4), generator=g, dtype=torch.uint8)
    mx = WoqWeights(WoqKind.MXFP4, 32, codes, torch.zeros(3, 128, 64, dtype=torch.uint8), exps,
                    torch.full((3, 128, 4), 120, dtype=torch.uint8))
    op = digits_operand(mx, "w1")
    want_codes, want_exps = mxfp4_quarters(codes, exps)
    assert (op.kernel_kind, op.group, op.zeros) == ("mxfp4_quarters", 32, None)
    assert torch.equal(op.data, want_codes) and torch.equal(op.scales, want_exps)
