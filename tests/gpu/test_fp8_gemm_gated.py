"""The FP8 GEMM1 with the gated activation in its epilogue (mb_grouped_gemm_fp8_gated) against an fp64 reference,
the decode kernel and every rowwise wgmma tile, both accumulations, and with block-128 scales the decode kernel and
every blockwise wgmma tile (W1 read by gate/up halves, its scales in their order: gate_up_halves_scales).

Fresh random e4m3 operands and positive fp32 scales per case (test_fp8_gemm.case); with rowwise scales W1's gate and
up rows, their column scales and the bias interleaved in blocks of 8 (moe_build.weights.interleave_gate_up, as the
runner stores them); with block-128 scales stacked as the checkpoint stores them (gate rows, then up rows, where an
intermediate size off a multiple of 128 puts the last gate rows and the first up rows in one scale block). The
reference: test_fp8_gemm.reference's fp64 product of every interleaved column (+ bias), then, per feature
f, its gate column 16 (f // 8) + f % 8 and up column 8 further through moe_build.reference.activate's fp64
activation. Outputs poisoned with NaN: every row of an expert written, rows past the last expert untouched.

Error bound, per output element: |y - act(g, u)| <= 2^-8 |act(g, u)| + L_g e_g + L_u e_u, with e_g, e_u the
plain store's bound on the gate and up values (test_fp8_gemm: 2^-8 |v| + c S) and L the activation's slopes:
|d act / d g| <= 1.2 (|u| + 1) (silu's, gelu's and GPT-OSS's clamped sigmoid-linear unit's derivatives stay
below 1.13 in magnitude; the +1 is GPT-OSS's shifted up) and |d act / d u| <= |g| + 1. The epilogue keeps gate
and up in fp32, so this is looser than it needs to be, yet a swapped gate and up, a missing scale or a wrong
interleave put errors of the order of |act| itself on most elements.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling  # noqa: E402
from moe_build.reference import activate  # noqa: E402
from moe_build.spec import Activation, MoESpec  # noqa: E402
from moe_build.weights import interleave_gate_up  # noqa: E402
from moe_build.weights.fp8 import gate_up_halves_scales  # noqa: E402
from test_fp8_gemm import WGMMA_TILES, accumulation_term, case, need, reference, refused_promoted  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

ACTIVATIONS = ["swiglu", "geglu", "swiglu_clamp"]


def act_spec(activation: str, inter: int, k: int) -> MoESpec:
    """A spec whose activate() is `activation` (swiglu_clamp with the spec's GPT-OSS constants, alpha 1.702 and
    limit 7); only its activation is read."""
    return MoESpec(hidden_size=k, intermediate_size=inter, num_experts=2, top_k=1, activation=Activation(activation))


def run_gated_and_check(counts, inter: int, k: int, tactic: str, activation: str = "swiglu",
                        accumulation=Fp8Accumulation.PROMOTED, out_dtype=torch.bfloat16, with_bias=False, seed=0,
                        scaling: Fp8Scaling = Fp8Scaling.ROWWISE):
    a, sa, b, sb, off = case(counts, 2 * inter, k, scaling, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    bias = (torch.randn(len(counts), 2 * inter, generator=gen) * 0.1).to(out_dtype).cuda() if with_bias else None
    if scaling is Fp8Scaling.ROWWISE:  # the stacked [gate; up] weights of the checkpoint, interleaved as the runner
        b_in = interleave_gate_up(b.view(torch.uint8)).view(torch.float8_e4m3fn)  # stores them
        sb_in = interleave_gate_up(sb)
        bias_in = None if bias is None else interleave_gate_up(bias)
    else:  # block-128: stacked, as the runner keeps them (the wgmma kernel reading the scales in the halves' order)
        b_in, bias_in = b, bias
        sb_in = gate_up_halves_scales(sb, inter) if tactic.startswith("wgmma:") else sb
    spec = act_spec(activation, inter, k)
    c = torch.full((a.shape[0], inter), float("nan"), dtype=out_dtype, device="cuda")
    K.grouped_gemm_fp8_gated(a, sa, b_in, sb_in, off, scaling, activation, out_dtype=out_dtype,
                             bias=bias_in, swiglu_alpha=spec.swiglu_alpha, swiglu_limit=spec.swiglu_limit, c=c,
                             accumulation=accumulation, tactic=tactic)
    torch.cuda.synchronize()
    full, mag = reference(a, sa, b, sb, off, scaling, bias)  # stacked columns: gate [0, I), up [I, 2I)
    ref = activate(spec, full)
    used = int(off[-1])
    got = c.double().cpu()
    assert not got[:used].isnan().any(), "an expert row was not written"
    assert got[used:].isnan().all(), "a row past the last expert was written"
    cterm = accumulation_term(tactic, k, accumulation)
    g, u = full[:used, :inter], full[:used, inter:]
    e_g = 2.0 ** -8 * g.abs() + cterm * mag[:used, :inter]
    e_u = 2.0 ** -8 * u.abs() + cterm * mag[:used, inter:]
    bound = 2.0 ** -8 * ref[:used].abs() + 1.2 * (u.abs() + 1) * e_g + (g.abs() + 1) * e_u + 1e-30
    err = (got[:used] - ref[:used]).abs()
    worst = (err / bound).max().item() if used else 0.0
    assert worst <= 1.0, (f"error {worst:.2f}x the bound ({tactic}, {scaling.name}, {activation}, {accumulation.name}, "
                          f"I={inter}, k={k})")


COUNTS = {"uneven": [3, 0, 17, 1, 0, 9, 40, 2], "wide": [255, 0, 257, 130]}
SHAPES = [(128, 512), (136, 400), (384, 2048), (1024, 768), (192, 640)]  # I, k: 2I on and off multiples of 128


@pytest.mark.parametrize("inter,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2, 8])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_decode(inter, k, k_split, activation):
    need((8, 9))
    run_gated_and_check(COUNTS["uneven"], inter, k, f"decode:ksplit{k_split}:plain:plain", activation,
                        seed=inter + k + k_split)


@pytest.mark.parametrize("inter,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2, 8])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("form", ["", "twocta_"], ids=["one_cta", "twocta"])
def test_decode_block128(inter, k, k_split, activation, form):
    """Block-128 scales, W1 stacked: each lane's gate and up rows scaled by their own blocks (both decode forms)."""
    need((8, 9))
    run_gated_and_check(COUNTS["uneven"], inter, k, f"decode:{form}ksplit{k_split}:plain:plain", activation,
                        seed=3 * inter + k + k_split, scaling=Fp8Scaling.BLOCK128)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decode_block128_bias_as_the_runner_launches(out_dtype):
    """Block-128 with a bias in both output dtypes, launched after a trigger as the runner launches it."""
    need((9, 0), exact=True)
    run_gated_and_check(COUNTS["wide"], 192, 640, "decode:ksplit2:after_trigger:plain", "swiglu_clamp",
                        out_dtype=out_dtype, with_bias=True, seed=5, scaling=Fp8Scaling.BLOCK128)


@pytest.mark.parametrize("inter,k", SHAPES)
@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.ROWWISE])
@pytest.mark.parametrize("accumulation", [Fp8Accumulation.PROMOTED, Fp8Accumulation.FAST], ids=["promoted", "fast"])
@pytest.mark.parametrize("counts", list(COUNTS))
def test_wgmma(inter, k, tile, accumulation, counts):
    need((9, 0), exact=True)
    check = lambda: run_gated_and_check(COUNTS[counts], inter, k, f"wgmma:{tile}:plain:plain",  # noqa: E731
                                        accumulation=accumulation, seed=inter + k + len(tile))
    if not refused_promoted(tile, accumulation, check):
        check()


# I a multiple of 64 (the gate/up halves), on and off multiples of 128 (2I = 384: gate and up share the middle block),
# k on and off multiples of 128
HALVES_SHAPES = [(128, 512), (192, 640), (384, 2048), (1024, 768), (256, 400)]


@pytest.mark.parametrize("inter,k", HALVES_SHAPES)
@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.BLOCK128])
@pytest.mark.parametrize("counts", list(COUNTS))
def test_wgmma_block128(inter, k, tile, counts):
    """Block-128 scales on the blockwise wgmma tiles: W1 stacked, read by 64-row gate/up halves, each half scaled by
    its own 128-row block."""
    need((9, 0), exact=True)
    run_gated_and_check(COUNTS[counts], inter, k, f"wgmma:{tile}:plain:plain", seed=5 * inter + k + len(tile),
                        scaling=Fp8Scaling.BLOCK128)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("tactic", ["wgmma:pingpong64x128:plain:evict_last", "wgmma:coop128x128:plain:evict_last",
                                    "wgmma:pingpong64x128:after_trigger:evict_last"])
def test_wgmma_block128_bias_as_the_runner_launches(activation, out_dtype, tactic):
    """Block-128 on the wgmma kernel with a stacked bias (each half's own features'), every activation, both output
    dtypes, launched as the runner launches it."""
    need((9, 0), exact=True)
    run_gated_and_check(COUNTS["wide"], 192, 640, tactic, activation, out_dtype=out_dtype, with_bias=True,
                        seed=11 + len(tactic), scaling=Fp8Scaling.BLOCK128)


# Each activation with a bias in both output dtypes, launched as the runner launches them (after a trigger, the wgmma
# stores under evict_last): also test_fp8_gemm_gated_quantized's
runner_launches = pytest.mark.parametrize("activation,out_dtype,tactic", [
    (act, dtype, tactic) for act in ACTIVATIONS for dtype in (torch.bfloat16, torch.float16)
    for tactic in ("decode:ksplit2:after_trigger:plain", "wgmma:coop128x192:after_trigger:evict_last",
                   "wgmma:pingpong64x128c2:plain:evict_last", "wgmma:pingpong128x128:after_trigger:evict_last",
                   "wgmma:pingpong128x128c2:plain:evict_last")])


@runner_launches
def test_bias_dtypes_and_runner_launches(activation, out_dtype, tactic):
    """Each activation with a bias in both output dtypes, launched as the runner launches (after a trigger, the
    wgmma stores under evict_last)."""
    need((9, 0), exact=True)
    run_gated_and_check(COUNTS["wide"], 192, 640, tactic, activation, accumulation=Fp8Accumulation.FAST,
                        out_dtype=out_dtype, with_bias=True, seed=7 + len(tactic))


def test_refusals():
    need((9, 0), exact=True)
    a, sa, b, _, off = case([4, 4], 2 * 136, 256, Fp8Scaling.BLOCK128, 0)  # inter 136: no gate/up halves
    sb_halves = torch.full((2, 2 * 136 // 8, 2), 0.01, device="cuda")
    with pytest.raises(K.KernelError) as info:  # block-128 weight scales on the wgmma kernel: inter % 64 == 0
        K.grouped_gemm_fp8_gated(a, sa, b, sb_halves, off, Fp8Scaling.BLOCK128, "swiglu",
                                 tactic="wgmma:coop128x128:plain:plain")
    assert info.value.status == K.Status.INVALID_ARGUMENT and "multiple of 64" in str(info.value)
    a, sa, b, sb, off = case([4, 4], 2 * 132, 256, Fp8Scaling.ROWWISE, 0)  # inter 132: not a multiple of 8
    with pytest.raises(K.KernelError) as info:
        K.grouped_gemm_fp8_gated(a, sa, b, sb, off, Fp8Scaling.ROWWISE, "swiglu",
                                 tactic="wgmma:coop128x128:plain:plain")
    assert info.value.status == K.Status.INVALID_ARGUMENT
    a, sa, b, sb, off = case([4, 4], 256, 256, Fp8Scaling.ROWWISE, 0)
    with pytest.raises(K.KernelError) as info:  # a gated activation only
        K.grouped_gemm_fp8_gated(a, sa, b, sb, off, Fp8Scaling.ROWWISE, "silu",
                                 tactic="wgmma:coop128x128:plain:plain")
    assert info.value.status == K.Status.INVALID_ARGUMENT
