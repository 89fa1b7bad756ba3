"""The weight-only GEMM on wgmma (mb_grouped_gemm_woq_sm90, CUTLASS's mixed-input mainloop) against an fp64 reference,
on a compute capability 9.0 GPU.

Operands as tests/gpu/test_woq_gemm.py makes them (fresh random packed weights in woq.py's canonical form, the
reference dequantizing them exactly in fp64), the scales handed over as the runner hands them (woq.wgmma_scales; MXFP4
as its e5m2 form, woq.mxfp4_as_e5m2, whose q * s is each stored weight exactly, so its bound is int8's);
outputs poisoned with NaN: every row of an expert written, rows past the last expert left alone. Uneven and empty
expert segments up to 959 rows (several 64- to 320-row token tiles, partial last ones), 1 to 40 experts.

Error bound, per output element: |C - ref| <= 2^-7 (|ref| + S) + 2^-8 M, S = sum_k |a_k w_k| and, for int4,
M = sum_k |a_k| (|u_k - 8| + |8 - z_k|) s_k. The kernel computes an int4 weight as round(round((u - 8) * s') + zs')
with s' = s rounded to the activation type and zs' = (8 - z) * s' rounded too (woq.wgmma_scales), int8 as
round(q * s'). With the type's unit roundoff r (bf16 2^-8, fp16 2^-11): s' is a relative error r of the whole
weight (r S over the sum), the product and the zero term leave at most r |u - 8| s and r |8 - z| s (r M), the
weight's own rounding r |w| (r S), and the output's one rounding r |ref|; fp32 sums. That is r (|ref| + 2 S + M),
under the bound for bf16 with the |ref| term doubled, and fp16 held to the same bound. (Were the codes read as u,
the product and zero term would be u s and z s, up to 15 s each: M is the measure of that choice.)
"""
from __future__ import annotations

import random
from typing import Callable

import pytest

torch = pytest.importorskip("torch")
from test_woq_gemm import case  # noqa: E402

from moe_build import kernels as K  # noqa: E402
from moe_build.weights.woq import (E5M2_GROUP, INT4_ZERO, WoqKind, mxfp4_as_e5m2, unpack_nibbles,  # noqa: E402
                                   wgmma_scales)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a compute capability 9.0 GPU (scripts/device_run.sh runs these on one)")]

TILES = ("woq128x16", "woq128x32", "woq128x64", "woq128x128", "woq128x160", "woq128x192", "woq128x224", "woq128x256",
         "woq128x320c2")


def term_magnitude(dev: dict, counts: list[int], rows: int, group: int) -> torch.Tensor:
    """M = |a| @ ((|u - 8| + |8 - z|) s)^T per expert's rows (int4), fp64 [rows, n]."""
    a, b, s = dev["a"].double().cpu(), dev["b"].cpu(), dev["scales"].double().cpu()
    z = dev["zeros"].double().cpu() if dev["zeros"] is not None else torch.full_like(s, INT4_ZERO)
    out = torch.zeros(rows, b.shape[1], dtype=torch.float64)
    lo = 0
    for x, c in enumerate(counts):
        if c:
            u = unpack_nibbles(b[x]).double()
            cols = u.shape[1] // s.shape[2]
            t = ((u - INT4_ZERO).abs() + (INT4_ZERO - z[x].repeat_interleave(cols, 1)).abs()) * \
                s[x].repeat_interleave(cols, 1)
            out[lo:lo + c] = a[lo:lo + c].abs() @ t.t()
        lo += c
    return out


def operands(kind: WoqKind, b: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group: int,
             dtype: torch.dtype) -> tuple[torch.Tensor, str, torch.Tensor, torch.Tensor | None, int]:
    """Stored weights as the runner hands them to the wgmma kernel: (B, its kind there, scales, zero terms, group);
    MXFP4 as its e5m2 form under one bf16 scale per 64 k."""
    if kind is WoqKind.MXFP4:
        q, s = mxfp4_as_e5m2(b, scales)
        return q, "e5m2", s, None, E5M2_GROUP
    s, zs = wgmma_scales(kind, scales, zeros, dtype)
    return b, kind.value, s, zs, group


def refused_odd_weight_tiles(tile: str, n: int, call: Callable[[], object], untouched: Callable[[], bool],
                              where: str) -> bool:
    """The 320-row tile's 2x1 clusters take the 128-row weight tiles in pairs: where n has an odd count of them, `call`
    (an entry point on `tile`) must be refused in one line and leave its output as it was (`untouched()`). Whether n
    was such a case (its caller has nothing more to check)."""
    if tile != "woq128x320c2" or -(-n // 128) % 2 == 0:
        return False
    with pytest.raises(K.KernelError, match="even count of 128-row weight tiles"):
        call()
    torch.cuda.synchronize()
    assert untouched(), f"a refused call wrote its output {where}"
    return True


def run(kind: WoqKind, counts: list[int], n: int, k: int, group: int, zeros: bool, tile: str,
        dtype: torch.dtype = torch.bfloat16, e8m0: tuple[int, int] = (120, 130)) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    dev, ref, mag, used = case(kind, counts, n, k, group, zeros, False, dtype, seed, e8m0=e8m0)
    b, kernel_kind, s, zs, kernel_group = operands(kind, dev["b"], dev["scales"], dev["zeros"], group, dtype)
    c = torch.full((ref.shape[0], n), float("nan"), dtype=dtype, device="cuda")

    def gemm() -> object:
        return K.grouped_gemm_woq_sm90(dev["a"], b, kernel_kind, s, zs, dev["off"], kernel_group, c=c,
                                       tactic=f"wgmma:{tile}:plain:plain")
    if refused_odd_weight_tiles(tile, n, gemm, lambda: bool(torch.isnan(c).all()), f"(n {n})"):
        return
    gemm()
    torch.cuda.synchronize()
    got = c.double().cpu()
    where = f"(seed {seed}, {kind.value}, counts {counts}, n {n}, k {k}, group {group}, zeros {zeros}, {tile}, {dtype})"
    assert torch.isfinite(got[:used]).all(), f"unwritten rows {where}"
    assert torch.isnan(got[used:]).all(), f"rows past the last expert written {where}"
    terms = term_magnitude(dev, counts, ref.shape[0], group) if kind is WoqKind.INT4 else torch.zeros_like(ref)
    bound = 2.0 ** -7 * (ref[:used].abs() + mag[:used]) + 2.0 ** -8 * terms[:used]
    excess = (got[:used] - ref[:used]).abs() - bound
    assert float(excess.max()) <= 0, f"error over the bound by {float(excess.max()):.3g} {where}"


COUNTS = [[1], [3, 0, 5, 70], [9, 0, 130, 1, 700, 64], [0, 0, 256], [40] * 40, [320, 321, 0, 640, 959]]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("counts", COUNTS, ids=["1", "3-0-5-70", "9-0-130-1-700-64", "0-0-256", "40x40",
                                                "320-321-0-640-959"])
@pytest.mark.parametrize("group, zeros", [(64, True), (128, True), (128, False), (0, False), (0, True)])
def test_int4_against_fp64(tile: str, counts: list[int], group: int, zeros: bool) -> None:
    run(WoqKind.INT4, counts, 256, 512, group, zeros, tile)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("group", [0, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_against_fp64(tile: str, group: int, dtype: torch.dtype) -> None:
    run(WoqKind.INT8, [3, 0, 130, 70], 384, 768, group, False, tile, dtype)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("group", [0, 64])
def test_int8_n_off_128(tile: str, group: int) -> None:
    """n not a multiple of 128 (GPT-OSS-20B's GEMM2, 2880 = 22.5 weight tiles): the last tile's rows past n read zeros
    and are not stored."""
    run(WoqKind.INT8, [3, 0, 130, 70], 2880, 2880, group, False, tile)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("counts", COUNTS, ids=["1", "3-0-5-70", "9-0-130-1-700-64", "0-0-256", "40x40",
                                                "320-321-0-640-959"])
def test_mxfp4_as_e5m2_against_fp64(tile: str, counts: list[int]) -> None:
    """MXFP4 (GPT-OSS's experts) through its e5m2 form, exponents 2^-7 .. 2^2 as case() draws them."""
    run(WoqKind.MXFP4, counts, 256, 512, 32, False, tile)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("n, k, e8m0", [(2880, 2880, (100, 128)), (5760, 2880, (8, 36)), (136, 576, (200, 228))])
def test_mxfp4_as_e5m2_shapes_and_exponent_spans(tile: str, n: int, k: int, e8m0: tuple[int, int]) -> None:
    """GPT-OSS-20B's shapes (n off 128, k 45 groups of 64), n off 16, and a 64 k's two exponents up to 27 apart near
    the bottom and the top of e8m0's range (weights from 2^-120, bf16's normal numbers, to 6 * 2^100)."""
    run(WoqKind.MXFP4, [17, 0, 200, 5], n, k, 32, False, tile, e8m0=e8m0)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("n, k", [(2048, 768), (768, 2048), (128, 2880), (2880, 2880), (136, 512)])
def test_int4_shapes_and_fp16(tile: str, n: int, k: int) -> None:
    run(WoqKind.INT4, [17, 0, 200, 5], n, k, 128 if k % 128 == 0 else 64, True, tile, torch.float16)


def test_refusals() -> None:
    """What the kernel cannot take is refused in one line, nothing launched: MXFP4, group 32, n off 8."""
    dev, _, _, _ = case(WoqKind.INT4, [4], 256, 512, 32, True, False, torch.bfloat16, 1)
    s, zs = wgmma_scales(WoqKind.INT4, dev["scales"], dev["zeros"], torch.bfloat16)
    with pytest.raises(K.KernelError, match="group 32"):
        K.grouped_gemm_woq_sm90(dev["a"], dev["b"], "int4", s, zs, dev["off"], 32, tactic="wgmma:woq128x64:plain:plain")
    odd, _, _, _ = case(WoqKind.INT4, [4], 148, 512, 128, True, False, torch.bfloat16, 2)
    s, zs = wgmma_scales(WoqKind.INT4, odd["scales"], odd["zeros"], torch.bfloat16)
    with pytest.raises(K.KernelError, match="multiple of 8"):
        K.grouped_gemm_woq_sm90(odd["a"], odd["b"], "int4", s, zs, odd["off"], 128,
                                tactic="wgmma:woq128x64:plain:plain")
    dev, _, _, _ = case(WoqKind.INT4, [4], 144, 512, 128, True, False, torch.bfloat16, 2)
    s, zs = wgmma_scales(WoqKind.INT4, dev["scales"], dev["zeros"], torch.bfloat16)
    with pytest.raises(ValueError, match="mxfp4"):
        K.grouped_gemm_woq_sm90(dev["a"], dev["b"], "mxfp4", s, zs, dev["off"], 32, tactic="wgmma:woq128x64:plain:plain")
    # the other entry points refuse the mixed-input tiles, and this one the other GEMMs' tactics
    a, off = dev["a"], dev["off"]
    dense = torch.zeros(1, 144, 512, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(K.KernelError, match="weight-only GEMM's"):
        K.grouped_gemm_sm90(a, dense, off, tactic="wgmma:woq128x64:plain:plain")
    with pytest.raises(K.KernelError, match="no kernel for tactic"):
        K.grouped_gemm_woq(a, dev["b"], "int4", dev["scales"], off, 128, zeros=dev["zeros"],
                           tactic="wgmma:woq128x128:plain:plain")
    dev, _, _, _ = case(WoqKind.INT4, [4], 256, 512, 128, True, False, torch.bfloat16, 3)
    s, zs = wgmma_scales(WoqKind.INT4, dev["scales"], dev["zeros"], torch.bfloat16)
    with pytest.raises(K.KernelError, match="no kernel for tactic"):
        K.grouped_gemm_woq_sm90(dev["a"], dev["b"], "int4", s, zs, dev["off"], 128,
                                tactic="wgmma:coop128x256:plain:plain")
