"""The weight-only GEMM1 on wgmma with the gated activation in its epilogue (mb_grouped_gemm_woq_sm90_gated) against
an fp64 reference, on a compute capability 9.0 GPU.

Operands as tests/gpu/test_woq_gemm.case makes them (fresh random packed weights, the reference dequantizing them
exactly in fp64) for W1 stacked [gate; up] as a checkpoint stores it; the kernel gets W1, its scales, zero points and
bias interleaved in blocks of 8 (moe_build.weights.interleave_gate_up, as the runner stores them), the reference the
stacked product through moe_build.reference.activate's fp64 activation, times the FC2 pre-quant scale where given.
Outputs poisoned with NaN: every row of an expert written, rows past the last expert untouched.

Error bound, per output element: |y - p act(g, u)| <= p (2^-7 |act| + 1.2 (|u| + 1) e_g + (|g| + 1) e_u), with p
the pre-quant scale (1 without), e_g and e_u the plain store's bound on the gate and up values
(tests/gpu/test_woq_wgmma.py: 2^-7 (|v| + S) + 2^-8 M) and the activation's slopes as
tests/gpu/test_fp8_gemm_gated.py states them. The epilogue keeps gate and up in fp32, so the bound is loose, yet a
swapped gate and up, a wrong interleave, a missing scale or bias put errors of the order of |act| itself on most
elements.
"""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
from test_woq_gemm import case  # noqa: E402
from test_woq_wgmma import TILES, operands, refused_odd_weight_tiles, term_magnitude  # noqa: E402

from moe_build import kernels as K  # noqa: E402
from moe_build.reference import activate  # noqa: E402
from moe_build.spec import Activation, MoESpec  # noqa: E402
from moe_build.weights import interleave_gate_up  # noqa: E402
from moe_build.weights.woq import WoqKind, wgmma_scales  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a compute capability 9.0 GPU (scripts/device_run.sh runs these on one)")]


def run(kind: WoqKind, counts: list[int], inter: int, k: int, group: int, zeros: bool, tile: str,
        activation: str = "swiglu", bias: bool = False, prequant: bool = False,
        dtype: torch.dtype = torch.bfloat16) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    n = 2 * inter
    dev, full, mag, used = case(kind, counts, n, k, group, zeros, bias, dtype, seed)
    inter_zeros = None if dev["zeros"] is None else interleave_gate_up(dev["zeros"])
    b, kernel_kind, s, zs, kernel_group = operands(kind, interleave_gate_up(dev["b"]), interleave_gate_up(dev["scales"]),
                                                   inter_zeros, group, dtype)
    b1 = None if dev["bias"] is None else interleave_gate_up(dev["bias"])
    spec = MoESpec(hidden_size=k, intermediate_size=inter, num_experts=len(counts), top_k=1,
                   activation=Activation(activation))
    pre = torch.rand(inter, device="cuda") * 2 + 0.25 if prequant else None
    out = torch.full((full.shape[0], inter), float("nan"), dtype=dtype, device="cuda")
    args = (dev["a"], b, kernel_kind, s, zs, dev["off"], kernel_group, activation)
    kw = dict(bias=b1, prequant_scale=pre, swiglu_alpha=spec.swiglu_alpha, swiglu_limit=spec.swiglu_limit, out=out,
              tactic=f"wgmma:{tile}:plain:plain")
    where = (f"(seed {seed}, {kind.value}, counts {counts}, I {inter}, k {k}, group {group}, zeros {zeros}, {tile}, "
             f"{activation}, bias {bias}, prequant {prequant}, {dtype})")
    if refused_odd_weight_tiles(tile, n, lambda: K.grouped_gemm_woq_sm90_gated(*args, **kw),
                                lambda: bool(torch.isnan(out).all()), where):
        return
    K.grouped_gemm_woq_sm90_gated(*args, **kw)
    torch.cuda.synchronize()
    got = out.double().cpu()
    assert torch.isfinite(got[:used]).all(), f"unwritten rows {where}"
    assert torch.isnan(got[used:]).all(), f"rows past the last expert written {where}"
    terms = term_magnitude(dev, counts, full.shape[0], group) if kind is WoqKind.INT4 else torch.zeros_like(full)
    err_v = (2.0 ** -7 * (full.abs() + mag) + 2.0 ** -8 * terms)[:used]
    g, u = full[:used, :inter], full[:used, inter:]
    e_g, e_u = err_v[:, :inter], err_v[:, inter:]
    act = activate(spec, full[:used])
    p = torch.ones(inter, dtype=torch.float64) if pre is None else pre.double().cpu()
    ref = act * p
    bound = p * (2.0 ** -7 * act.abs() + 1.2 * (u.abs() + 1) * e_g + (g.abs() + 1) * e_u) + 1e-30
    worst = float(((got[:used] - ref).abs() / bound).max()) if used else 0.0
    assert worst <= 1.0, f"error {worst:.2f}x the bound {where}"


COUNTS = [[1], [3, 0, 5, 70], [9, 0, 130, 1, 700, 64], [40] * 40, [320, 321, 0, 640, 959]]
COUNT_IDS = ["1", "3-0-5-70", "9-0-130-1-700-64", "40x40", "320-321-0-640-959"]


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("counts", COUNTS, ids=COUNT_IDS)
@pytest.mark.parametrize("group, zeros", [(64, True), (128, False), (0, True)])
def test_int4_against_fp64(tile: str, counts: list[int], group: int, zeros: bool) -> None:
    run(WoqKind.INT4, counts, 128, 512, group, zeros, tile)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("activation", ["swiglu", "geglu", "swiglu_clamp"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_int8_activations_bias_and_prequant(tile: str, activation: str, dtype: torch.dtype) -> None:
    run(WoqKind.INT8, [3, 0, 130, 70], 384, 768, 128, False, tile, activation, bias=True, prequant=True, dtype=dtype)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("counts", COUNTS, ids=COUNT_IDS)
@pytest.mark.parametrize("activation", ["swiglu", "swiglu_clamp"])
def test_mxfp4_as_e5m2_against_fp64(tile: str, counts: list[int], activation: str) -> None:
    """MXFP4 W1 through its e5m2 form (tests/gpu/test_woq_wgmma.py's operands), GPT-OSS's clamped SwiGLU and bias."""
    run(WoqKind.MXFP4, counts, 128, 512, 32, False, tile, activation, bias=True, prequant=activation == "swiglu")


@pytest.mark.parametrize("tile", TILES)
def test_mxfp4_as_e5m2_gpt_oss_shape(tile: str) -> None:
    """GPT-OSS-20B's W1 (I 1440, k 2880: 45 groups of 64) through its e5m2 form."""
    run(WoqKind.MXFP4, [17, 0, 200, 5], 1440, 2880, 32, False, tile, "swiglu_clamp", bias=True)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("inter, k", [(1440, 2880), (136, 512), (768, 2048), (1408, 2048)])
@pytest.mark.parametrize("prequant", [False, True])
def test_int4_shapes_off_tile_multiples(tile: str, inter: int, k: int, prequant: bool) -> None:
    """2I off a multiple of 128 (GPT-OSS's 2880, 272): the last weight tile's rows past 2I read zeros and store
    nothing; AWQ's FC2 pre-quant scale in the same epilogue."""
    run(WoqKind.INT4, [17, 0, 200, 5], inter, k, 64 if k % 128 else 128, True, tile, "swiglu", bias=True,
        prequant=prequant, dtype=torch.float16 if inter == 136 else torch.bfloat16)


def test_refusals() -> None:
    """A plain activation, 2I off a multiple of 16, MXFP4 and a pre-quant scale of the wrong size are refused in one
    line, nothing launched."""
    dev, _, _, _ = case(WoqKind.INT4, [4], 256, 512, 128, True, False, torch.bfloat16, 1)
    s, zs = wgmma_scales(WoqKind.INT4, dev["scales"], dev["zeros"], torch.bfloat16)
    t = "wgmma:woq128x64:plain:plain"
    with pytest.raises(ValueError, match="gated activation"):
        K.grouped_gemm_woq_sm90_gated(dev["a"], dev["b"], "int4", s, zs, dev["off"], 128, "gelu", tactic=t)
    with pytest.raises(ValueError, match="mxfp4"):
        K.grouped_gemm_woq_sm90_gated(dev["a"], dev["b"], "mxfp4", s, zs, dev["off"], 128, "swiglu", tactic=t)
    with pytest.raises(ValueError, match="prequant"):
        K.grouped_gemm_woq_sm90_gated(dev["a"], dev["b"], "int4", s, zs, dev["off"], 128, "swiglu",
                                      prequant_scale=torch.ones(100, device="cuda"), tactic=t)
    odd, _, _, _ = case(WoqKind.INT4, [4], 264, 512, 128, True, False, torch.bfloat16, 2)
    s, zs = wgmma_scales(WoqKind.INT4, odd["scales"], odd["zeros"], torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 16"):
        K.grouped_gemm_woq_sm90_gated(odd["a"], odd["b"], "int4", s, zs, odd["off"], 128, "swiglu", tactic=t)


def interleaved_activation_case() -> tuple[torch.Tensor, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GEMM1 outputs [300, 2 x 1408] over 8 experts holding the first 280 rows (random cuts), a bias, a pre-quant scale,
    and the outputs' columns in W1's interleaved order: (offsets, filled rows, x, bias, scale, x interleaved)."""
    e, rows, filled, inter = 8, 300, 280, 1408
    cuts = torch.sort(torch.randint(0, filled + 1, (e - 1,))).values
    off = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([filled])]).cuda()
    x = (torch.randn(rows, 2 * inter, device="cuda") * 3).to(torch.bfloat16)
    b = (torch.randn(e, 2 * inter, device="cuda") * 0.5).to(torch.bfloat16)
    s = torch.rand(inter, device="cuda") + 0.5
    return off, filled, x, b, s, interleave_gate_up(x.t().unsqueeze(0))[0].t().contiguous()


@pytest.mark.parametrize("digits", [False, True], ids=["rows", "digits"])
@pytest.mark.parametrize("act", [a for a in K.Activation if a.is_gated], ids=lambda a: a.name.lower())
def test_activation_reads_gate_up_interleaved(act: K.Activation, digits: bool) -> None:
    """fc1_activation / fc1_activation_digits told gate_up_interleaved give, on GEMM1's output and bias in the
    interleaved order, the bytes they give on the same values stacked (which tests/gpu/test_stage_kernels.py and
    test_token_digits.py check against fp64)."""
    off, filled, x, b, s, x_in = interleaved_activation_case()
    fn = K.fc1_activation_digits if digits else K.fc1_activation
    stacked = fn(x, off, act, b, 1.702, 7.0, s)
    inter_out = fn(x_in, off, act, interleave_gate_up(b), 1.702, 7.0, s, gate_up_interleaved=True)
    torch.cuda.synchronize()
    assert torch.equal(stacked[:filled], inter_out[:filled]), "the interleaved read differs from the stacked one"
    with pytest.raises(ValueError, match="gate_up_interleaved"):
        fn(x[:, :x.shape[1] - 8].contiguous(), off, act, gate_up_interleaved=True)


@pytest.mark.parametrize("tile", ["woq128x64", "woq128x128", "woq128x256", "woq128x320c2"])
@pytest.mark.parametrize("activation, bias, prequant, dtype",
                         [("swiglu", False, True, torch.bfloat16), ("swiglu", True, False, torch.bfloat16),
                          ("geglu", True, True, torch.float16), ("swiglu_clamp", False, False, torch.bfloat16)],
                         ids=["swiglu-prequant", "swiglu-bias", "geglu-bias-prequant-fp16", "clamp"])
def test_fp8_dequantized_against_the_activation_step_and_fp64(tile: str, activation: str, bias: bool, prequant: bool,
                                                              dtype: torch.dtype) -> None:
    """W4AFP8 (fp8_scale, a static GEMM2 input scale): each stored value is the plain gated epilogue's act (rounded
    to out's type) times the pre-quant scale, quantized to e4m3 and dequantized, exactly what
    fc1_activation_fp8_dequantized's identity writes from that output (tests/gpu/test_fp8_quantize.py checks those
    bytes against fp64): equal bit for bit, rows past the last expert untouched. And against fp64: within the plain
    epilogue's bound E (above) plus one e4m3 rounding of the value, 2^-4 (|p act| + E) + 2^-10 s (e4m3's subnormal
    half-step times the scale s), plus the 16-bit rounding of the dequantized value (bf16's unit roundoff 2^-8 of at
    most (1 + 2^-4) (|p act| + E) + 2^-10 s): in all, E + (2^-4 + 2^-7) (|p act| + E) + 2^-9 s; no value saturates (s
    puts the largest at about 300 of e4m3's 448)."""
    seed = random.SystemRandom().randrange(1 << 30)
    counts, inter, k, group = [3, 0, 130, 70, 257], 384, 768, 128
    n = 2 * inter
    dev, full, mag, used = case(WoqKind.INT4, counts, n, k, group, True, bias, dtype, seed)
    s, zs = wgmma_scales(WoqKind.INT4, interleave_gate_up(dev["scales"]), interleave_gate_up(dev["zeros"]), dtype)
    b1 = None if dev["bias"] is None else interleave_gate_up(dev["bias"])
    spec = MoESpec(hidden_size=k, intermediate_size=inter, num_experts=len(counts), top_k=1,
                   activation=Activation(activation))
    pre = torch.rand(inter, device="cuda") * 2 + 0.25 if prequant else None
    p = torch.ones(inter, dtype=torch.float64) if pre is None else pre.double().cpu()
    act = activate(spec, full[:used])
    fp8_scale = torch.tensor([float((act * p).abs().max()) / 300.0], dtype=torch.float32, device="cuda")
    args = (dev["a"], interleave_gate_up(dev["b"]), "int4", s, zs, dev["off"], group, activation)
    kw = dict(bias=b1, swiglu_alpha=spec.swiglu_alpha, swiglu_limit=spec.swiglu_limit,
              tactic=f"wgmma:{tile}:plain:plain")
    rows = full.shape[0]
    out = torch.full((rows, inter), float("nan"), dtype=dtype, device="cuda")
    K.grouped_gemm_woq_sm90_gated(*args, **kw, prequant_scale=pre, out=out, fp8_scale=fp8_scale)
    plain = K.grouped_gemm_woq_sm90_gated(*args, **kw)
    stepped = torch.full((rows, inter), float("nan"), dtype=dtype, device="cuda")
    K.fc1_activation_fp8_dequantized(plain, dev["off"], "identity", fp8_scale, out=stepped, prequant_scale=pre)
    unquantized = K.grouped_gemm_woq_sm90_gated(*args, **kw, prequant_scale=pre)
    torch.cuda.synchronize()
    where = f"(seed {seed}, {tile}, {activation}, bias {bias}, prequant {prequant}, {dtype})"
    assert torch.isnan(out[used:]).all(), f"rows past the last expert written {where}"
    assert torch.equal(out[:used], stepped[:used]), f"differs from the activation step's quantization {where}"
    assert (out[:used] != unquantized[:used]).float().mean() > 0.5, f"most values not quantized {where}"
    got = out[:used].double().cpu()
    terms = term_magnitude(dev, counts, rows, group)
    err_v = (2.0 ** -7 * (full.abs() + mag) + 2.0 ** -8 * terms)[:used]
    g, u = full[:used, :inter], full[:used, inter:]
    e = p * (2.0 ** -7 * act.abs() + 1.2 * (u.abs() + 1) * err_v[:, :inter] + (g.abs() + 1) * err_v[:, inter:])
    ref = act * p
    bound = e + (2.0 ** -4 + 2.0 ** -7) * (ref.abs() + e) + 2.0 ** -9 * float(fp8_scale) + 1e-30
    worst = float(((got - ref).abs() / bound).max())
    assert worst <= 1.0, f"error {worst:.2f}x the bound {where}"


def test_fp8_scale_refusals() -> None:
    """fp8_scale takes int4 weights (W4AFP8's) and a one-element fp32 device tensor."""
    dev, _, _, _ = case(WoqKind.INT8, [4], 256, 512, 128, False, False, torch.bfloat16, 3)
    s, zs = wgmma_scales(WoqKind.INT8, dev["scales"], None, torch.bfloat16)
    t = "wgmma:woq128x64:plain:plain"
    one = torch.ones(1, device="cuda")
    with pytest.raises(K.KernelError, match="int4"):
        K.grouped_gemm_woq_sm90_gated(dev["a"], dev["b"], "int8", s, zs, dev["off"], 128, "swiglu", tactic=t,
                                      fp8_scale=one)
    with pytest.raises(ValueError):
        K.grouped_gemm_woq_sm90_gated(dev["a"], dev["b"], "int8", s, zs, dev["off"], 128, "swiglu", tactic=t,
                                      fp8_scale=torch.ones(2, device="cuda"))


@pytest.mark.parametrize("act", [a for a in K.Activation if a.is_gated], ids=lambda a: a.name.lower())
def test_fp8_dequantized_activation_reads_gate_up_interleaved(act: K.Activation) -> None:
    """fc1_activation_fp8_dequantized (W4AFP8's activation step with a static scale) told gate_up_interleaved gives, on
    GEMM1's output and bias in the interleaved order, the values it gives on the same values stacked (which
    tests/gpu/test_fp8_quantize.py checks against fp64); per-row scales refuse the interleaved order."""
    off, filled, x, b, s, x_in = interleaved_activation_case()
    q = torch.tensor([0.05], device="cuda")
    stacked = K.fc1_activation_fp8_dequantized(x, off, act, q, b, 1.702, 7.0, prequant_scale=s)
    inter_out = K.fc1_activation_fp8_dequantized(x_in, off, act, q, interleave_gate_up(b), 1.702, 7.0,
                                                 prequant_scale=s, gate_up_interleaved=True)
    torch.cuda.synchronize()
    assert torch.equal(stacked[:filled], inter_out[:filled]), "the interleaved read differs from the stacked one"
    with pytest.raises(ValueError, match="gate_up_interleaved"):
        K.fc1_activation_fp8_dequantized(x_in, off, act, None, gate_up_interleaved=True)
