"""The FP8 GEMM1 whose gated epilogue writes GEMM2's FP8 input by a static scale (grouped_gemm_fp8_gated_quantized,
the plan's fc2_input_quant=gemm1): the decode kernel and every rowwise wgmma tile.

Two checks per case, on fresh random operands (test_fp8_gemm_gated's cases) and outputs poisoned (e4m3 bytes 0x7f,
NaN; scales NaN):
- the bytes and row scales are exactly what the quantize step writes from the 16-bit rows the same GEMM writes
  without the quantization (quantize_fp8 of grouped_gemm_fp8_gated's output, the path it replaces; both kernels are
  each checked against fp64 in their own tests), rows past the last expert untouched;
- against fp64: q * s against the reference activation clamped to the e4m3 range of s (the scale is chosen so that
  some values saturate, as calibrated scales do), within the gated GEMM's bound (test_fp8_gemm_gated) plus e4m3's
  rounding: half an ulp of its 3-bit mantissa, 2^-4 |x|, or of its smallest subnormal step, 2^-10 s.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling  # noqa: E402
from moe_build.reference import activate  # noqa: E402
from moe_build.weights import interleave_gate_up  # noqa: E402
from test_fp8_gemm import WGMMA_TILES, accumulation_term, case, need, reference, refused_promoted  # noqa: E402
from test_fp8_gemm_gated import ACTIVATIONS, COUNTS, act_spec, runner_launches  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

E4M3_MAX = 448.0
NAN_BYTE = 0x7F  # e4m3 NaN


def run_and_check(counts, inter: int, k: int, tactic: str, activation: str = "swiglu",
                  accumulation=Fp8Accumulation.PROMOTED, out_dtype=torch.bfloat16, with_bias=False, seed=0):
    a, sa, b, sb, off = case(counts, 2 * inter, k, Fp8Scaling.ROWWISE, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    bias = (torch.randn(len(counts), 2 * inter, generator=gen) * 0.1).to(out_dtype).cuda() if with_bias else None
    b_il = interleave_gate_up(b.view(torch.uint8)).view(torch.float8_e4m3fn)
    sb_il, bias_il = interleave_gate_up(sb), None if bias is None else interleave_gate_up(bias)
    spec = act_spec(activation, inter, k)
    full, mag = reference(a, sa, b, sb, off, Fp8Scaling.ROWWISE, bias)
    ref = activate(spec, full)
    used = int(off[-1])
    # a scale under which the largest 5% of |act| saturate
    s = max(ref[:used].abs().flatten().quantile(0.95).item(), 1e-3) / E4M3_MAX if used else 1.0
    scale = torch.tensor([s], dtype=torch.float32, device="cuda")
    common = dict(bias=bias_il, swiglu_alpha=spec.swiglu_alpha, swiglu_limit=spec.swiglu_limit,
                  accumulation=accumulation, tactic=tactic)
    q = torch.full((a.shape[0], inter), NAN_BYTE, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    qs = torch.full((a.shape[0],), float("nan"), dtype=torch.float32, device="cuda")
    K.grouped_gemm_fp8_gated_quantized(a, sa, b_il, sb_il, off, activation, scale, out_dtype=out_dtype, out=q,
                                       out_scales=qs, **common)
    c = K.grouped_gemm_fp8_gated(a, sa, b_il, sb_il, off, Fp8Scaling.ROWWISE, activation, out_dtype=out_dtype,
                                 **common)
    torch.cuda.synchronize()
    got = q.view(torch.uint8).cpu()
    assert (got[used:] == NAN_BYTE).all() and qs[used:].isnan().all(), "a row past the last expert was written"
    if not used:
        return
    want_q, want_s = K.quantize_fp8(c[:used], static_scale=scale)
    want_q = want_q.view(torch.uint8).cpu()
    assert torch.equal(got[:used], want_q), \
        f"bytes differ from the quantize step's at {(got[:used] != want_q).sum().item()} elements ({tactic}, " \
        f"{activation})"
    assert torch.equal(qs[:used].cpu(), want_s.cpu()), "row scales"
    # against fp64
    deq = q[:used].float().double().cpu() * s
    clamped = ref[:used].clamp(-E4M3_MAX * s, E4M3_MAX * s)
    cterm = accumulation_term(tactic, k, accumulation)
    g, u = full[:used, :inter], full[:used, inter:]
    e_g = 2.0 ** -8 * g.abs() + cterm * mag[:used, :inter]
    e_u = 2.0 ** -8 * u.abs() + cterm * mag[:used, inter:]
    gated = 2.0 ** -8 * ref[:used].abs() + 1.2 * (u.abs() + 1) * e_g + (g.abs() + 1) * e_u
    bound = (1 + 2.0 ** -4) * gated + 2.0 ** -4 * clamped.abs() + 2.0 ** -10 * s + 1e-30
    worst = ((deq - clamped).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound ({tactic}, {activation}, I={inter}, k={k})"
    assert (deq.abs() == E4M3_MAX * s).any(), "no value saturated: the scale tests less than it should"


SHAPES = [(128, 512), (136, 400), (1024, 768), (192, 640)]  # I, k: 2I on and off multiples of 128


@pytest.mark.parametrize("inter,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_decode(inter, k, k_split, activation):
    need((8, 9))
    run_and_check(COUNTS["uneven"], inter, k, f"decode:ksplit{k_split}:plain:plain", activation,
                  seed=inter + k + k_split)


@pytest.mark.parametrize("inter,k", SHAPES)
@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.ROWWISE])
@pytest.mark.parametrize("accumulation", [Fp8Accumulation.PROMOTED, Fp8Accumulation.FAST], ids=["promoted", "fast"])
def test_wgmma(inter, k, tile, accumulation):
    need((9, 0), exact=True)
    check = lambda: run_and_check(COUNTS["wide"], inter, k, f"wgmma:{tile}:plain:plain",  # noqa: E731
                                  accumulation=accumulation, seed=inter + k + len(tile))
    if not refused_promoted(tile, accumulation, check):
        check()


@runner_launches
def test_bias_dtypes_and_runner_launches(activation, out_dtype, tactic):
    """Each activation with a bias in both output dtypes, launched as the runner launches (after a trigger, the
    wgmma stores under evict_last)."""
    need((9, 0), exact=True)
    run_and_check(COUNTS["uneven"], 192, 640, tactic, activation, accumulation=Fp8Accumulation.FAST,
                  out_dtype=out_dtype, with_bias=True, seed=11 + len(tactic))


def test_no_rows():
    """No expert row: nothing written (the runner's empty micro-batch)."""
    need((9, 0), exact=True)
    run_and_check([0, 0, 0], 128, 256, "wgmma:coop128x128:plain:plain")
    run_and_check([0, 0, 0], 128, 256, "decode:ksplit1:plain:plain")


def test_needs_its_static_scale():
    a = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="static_scale"):
        K.grouped_gemm_fp8_gated_quantized(a, a, a, a, a, "swiglu", None, tactic="decode:ksplit1:plain:plain")
