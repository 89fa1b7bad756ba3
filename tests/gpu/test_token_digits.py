"""mb_token_digits (stages/token_digits.cu) against its definition, and the digits made where the rows are written
(mb_expand_rows_digits, mb_fc1_activation_digits) against the two steps they replace; decoded here from the layout
(cpp/src/common/token_digits.cuh): per row and 128-k group, three digit planes at 96 s + 32 d + 8 q (+ position p,
holding k = 32q + 8s + (0, 2, 4, 6, 1, 3, 5, 7)[p]; for weights in groups of 64, step s = 2h + t holding k = 64h +
16q + 8t + ...; for MXFP4's groups of 32, k = 32s + 8q + p), the int32 sum of 4096 d0 + 64 d1 + d2 at byte 384, the fp32 factor F at 388, the int32 sum over k
0..63 at 392, zeros to 400. A row with k % 128 == 64 (groups 64 and 32) ends with a half group whose k 64..127 are zero.

Checked on fresh random rows (magnitudes spread over 2^-30 .. 2^12 in bf16 and over fp16's range, exact zeros, one
all-zero group): every value with no bits below F is carried exactly, x = F (4096 d0 + 64 d1 + d2) (every bf16 value
within 2^10 of its group's largest, every fp16 one within 2^7); the rest within F / 2; digits in range (|d0| <= 64, |d1|, |d2| <= 32); F a power of two with the group's largest / F in
[2^17, 2^18); the sum is the digits' sum; a group with an inf or NaN has a NaN factor. Output poisoned first.
"""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

PERM = (0, 2, 4, 6, 1, 3, 5, 7)


def k_at(s: int, q: int, p: int, group: int) -> int:
    """The k of position p of lane q's 8 bytes at step s: k 32q + 8s + PERM[p]; group 64 (halves) 64h + 16q + 8t +
    PERM[p] at step s = 2h + t; group 32 (quarters, MXFP4) 32s + 8q + p."""
    if group == 32:
        return 32 * s + 8 * q + p
    return (64 * (s // 2) + 16 * q + 8 * (s % 2) if group == 64 else 32 * q + 8 * s) + PERM[p]


def decode(rec: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Records uint8 [R, G, 400] laid out for weight `group` -> (digits int64 [R, G, 3, 128] in k order, sums int64
    [R, G], factors fp64); the first-half sums checked against the digits here (groups with a finite factor: an inf
    or NaN leaves the digits undefined)."""
    r, g, _ = rec.shape
    planes = rec[..., :384].reshape(r, g, 4, 3, 4, 8).to(torch.int8).long()  # s, d, q, p
    digits = torch.empty(r, g, 3, 128, dtype=torch.int64)
    for s in range(4):
        for q in range(4):
            for p in range(8):
                digits[:, :, :, k_at(s, q, p, group)] = planes[:, :, s, :, q, p]
    tail = rec[..., 384:400].contiguous()
    sums = tail[..., :4].contiguous().view(torch.int32)[..., 0].long()
    factors = tail[..., 4:8].contiguous().view(torch.float32)[..., 0].double()
    half_sums = tail[..., 8:12].contiguous().view(torch.int32)[..., 0].long()
    d = 4096 * digits[:, :, 0] + 64 * digits[:, :, 1] + digits[:, :, 2]
    finite = torch.isfinite(factors)
    assert torch.equal(half_sums[finite], d[..., :64].sum(-1)[finite]), "the first half's sum (bytes 392..395)"
    assert torch.all(tail[..., 12:] == 0), "bytes 396..399 must be zero"
    return digits, sums, factors


def padded(x: torch.Tensor) -> torch.Tensor:
    """Rows [R, k] as fp64 [R, ceil(k / 128), 128], a half group's missing k zero."""
    n, k = x.shape
    width = -(-k // 128)
    out = torch.zeros(n, width * 128, dtype=torch.float64)
    out[:, :k] = x.double().cpu()
    return out.view(n, width, 128)


def rows(n: int, k: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    lo, hi = (-30, 12) if dtype == torch.bfloat16 else (-14, 12)
    x = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(lo, hi, (n, k), generator=g).float())
    x[:, 3::29] = 0.0
    x[0, :128] = 0.0  # a whole group of zeros
    return x.to(dtype)


# (rows, k, weight group): one group, Qwen3-30B-A3B's hidden, three groups; in groups of 64 Qwen3's hidden,
# GPT-OSS-20B's 2880 (22 groups and a half), a lone half group; the same three in MXFP4's groups of 32
CARRY_SHAPES = [(1, 128, 128), (7, 2048, 0), (300, 384, 128), (7, 2048, 64), (5, 2880, 64), (3, 64, 64),
                (7, 2048, 32), (5, 2880, 32), (3, 64, 32)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, k, group", CARRY_SHAPES)
def test_digits_carry_the_rows(dtype: torch.dtype, n: int, k: int, group: int) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    x = rows(n, k, dtype, g)
    width = -(-k // 128)
    out = torch.full((n, width, 400), 0xA5, dtype=torch.uint8, device="cuda")
    K.token_digits(x.cuda(), out=out, group=group)
    torch.cuda.synchronize()
    digits, sums, factors = decode(out.cpu(), group)
    where = f"(seed {seed}, {dtype}, {n} x {k}, group {group})"
    assert int(digits[:, :, 0].abs().max()) <= 64 and int(digits[:, :, 1:].abs().max()) <= 32, f"digit range {where}"
    d = 4096 * digits[:, :, 0] + 64 * digits[:, :, 1] + digits[:, :, 2]  # [R, G, 128]
    assert torch.equal(sums, d.sum(-1)), f"group sums {where}"
    assert torch.all(d.reshape(n, -1)[:, k:] == 0), f"a half group's missing k not zero {where}"
    xv = padded(x)
    top = xv.abs().amax(-1)
    nz = top > 0
    ratio = top[nz] / factors[nz]
    assert torch.all((ratio >= 2 ** 17) & (ratio < 2 ** 18)), f"factor against the group's largest {where}"
    assert torch.all(torch.log2(factors).frac() == 0), f"factor not a power of two {where}"
    assert torch.all(d[~nz] == 0), f"a zero group's digits {where}"
    carried = factors[..., None] * d
    near = xv.abs() * 2 ** (10 if dtype == torch.bfloat16 else 7) >= top[..., None]
    assert torch.equal(carried[near], xv[near]), f"a value near its group's largest not exact {where}"
    assert torch.all((carried - xv).abs() <= factors[..., None] / 2), f"a small value off by more than F / 2 {where}"


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_group_has_a_nan_factor(bad: float) -> None:
    x = torch.randn(2, 512).to(torch.bfloat16)
    x[1, 300] = bad
    digits, sums, factors = decode(K.token_digits(x.cuda()).cpu())
    assert torch.isnan(factors[1, 2]) and torch.isfinite(factors[1, [0, 1, 3]]).all() and torch.isfinite(factors[0]).all()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        K.token_digits(torch.zeros(2, 192, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="multiple of 64"):
        K.token_digits(torch.zeros(2, 160, dtype=torch.bfloat16, device="cuda"), group=64)
    with pytest.raises(ValueError, match="multiple of 64"):
        K.token_digits(torch.zeros(2, 160, dtype=torch.bfloat16, device="cuda"), group=32)
    with pytest.raises(ValueError, match="group: 48 is not 0, 32, 64 or 128"):
        K.token_digits(torch.zeros(2, 256, dtype=torch.bfloat16, device="cuda"), group=48)
    with pytest.raises(K.KernelError, match="fp16\\(1\\), bf16\\(2\\)"):
        K.token_digits(torch.zeros(2, 256, dtype=torch.float32, device="cuda"))


# ---- the digits made where the rows are written (token_digits=fused) -----------------------------------------------
# mb_expand_rows_digits and mb_fc1_activation_digits write the bytes of the 16-bit step (mb_expand_rows /
# mb_fc1_activation) followed by mb_token_digits, bit for bit (no tolerance): the rows are rounded to dtype as those
# steps store them before their digits are made. mb_token_digits itself is checked against its definition above; the
# fused digits are decoded here as well, against an fp64 reference of the 16-bit step rounded to dtype.

def check_decoded(rec: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, group: int, what: str) -> None:
    """Records [R, G, 400] for weight `group` against ref [R, k] (fp64 of dtype values): the values near their
    group's largest exact, the rest within half the factor."""
    digits, sums, factors = decode(rec.cpu(), group)
    xv = padded(ref)
    d = 4096 * digits[:, :, 0] + 64 * digits[:, :, 1] + digits[:, :, 2]
    assert torch.all(d.reshape(ref.shape[0], -1)[:, ref.shape[1]:] == 0), f"{what}: a half group's missing k not zero"
    top = xv.abs().amax(-1)
    carried = factors[..., None] * d
    near = xv.abs() * 2 ** (10 if dtype == torch.bfloat16 else 7) >= top[..., None]
    assert torch.equal(carried[near], xv[near]), f"{what}: a value near its group's largest not exact"
    assert torch.all((carried - xv).abs() <= factors[..., None] / 2), f"{what}: a small value off by more than F / 2"


# (tokens, hidden, top_k, weight group): one token of one group, Qwen3-30B-A3B's top-8 at 2048, a prefill-sized call
# at 384 columns (three groups), Mixtral-8x7B's 4096 at top-2, DeepSeek-V2-Lite's top-6; GPT-OSS-20B's 2880 at top-4
# in groups of 64 (a half group at the end) and of 32 (MXFP4's), a lone half group; DeepSeek-V3's 7168 and the per-row
# digits kernels' widest row, 16384 (two and four groups a warp)
EXPAND_SHAPES = [(1, 128, 1, 128), (3, 2048, 8, 128), (300, 384, 6, 0), (5, 4096, 2, 128), (16, 2048, 6, 128),
                 (7, 2880, 4, 64), (2, 64, 3, 64), (7, 2880, 4, 32), (3, 7168, 8, 128), (2, 16384, 2, 64)]


@pytest.mark.parametrize("zero", [False, True], ids=["plain", "zero_out"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "prequant"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("t, h, k, group", EXPAND_SHAPES)
def test_expand_rows_digits_equal_the_two_steps(t: int, h: int, k: int, group: int, dtype: torch.dtype,
                                                scaled: bool, zero: bool) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    x = rows(t, h, dtype, g).cuda()
    utp = torch.randperm(t * k, generator=g).to(torch.int32).cuda()
    w = torch.rand(t, k, generator=g).cuda()
    s = (torch.rand(h, generator=g) + 0.25).cuda() if scaled else None  # no fp16 overflow at 2^12
    digits = torch.full((t * k, -(-h // 128), 400), 0xA5, dtype=torch.uint8, device="cuda")
    pw = torch.full((t * k,), float("nan"), device="cuda")
    z = torch.randn(t, h, device="cuda").to(dtype) if zero else None
    K.expand_rows_digits(x, utp, w, s, permuted_digits=digits, permuted_weights=pw, zero_out=z, group=group)
    pin, pw_ref = K.expand_rows(x, utp, w, s)
    ref = K.token_digits(pin, group=group)
    torch.cuda.synchronize()
    what = f"seed {seed}, {t} x {h} top-{k} group {group} {dtype} scaled={scaled}"
    assert torch.equal(digits, ref), f"{what}: digits differ from expand_rows then token_digits"
    assert torch.equal(pw, pw_ref), f"{what}: permuted weights"
    if z is not None:
        assert (z == 0).all(), f"{what}: zero_out not zeroed"
    rounded = (x.double() * (s.double() if s is not None else 1.0)).to(dtype).double()  # fp64 product, rounded once
    check_decoded(digits, rounded[utp.argsort().long() // k], dtype, group, what)


# (inter, bias, weight group): Qwen3-30B-A3B's width, DeepSeek-V2-Lite's (11 groups), one group, Mixtral-8x7B's;
# GPT-OSS-20B's 2880 in groups of 64 (a half group at the end) and of 32, Qwen3-30B-A3B's in groups of 64, a lone
# half group
ACT_SHAPES = [(768, False, 128), (1408, True, 0), (128, True, 128), (14336, False, 128), (2880, True, 64),
              (768, False, 64), (64, True, 64), (2880, True, 32)]


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "prequant"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", list(K.Activation), ids=lambda a: a.name.lower())
def test_fc1_activation_digits_equal_the_two_steps(act: K.Activation, dtype: torch.dtype, scaled: bool) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    torch.manual_seed(seed)
    e, n = 8, 45
    filled = n - 7  # rows past off[E] (other nodes' experts) must stay untouched
    alpha, limit = 1.702, 7.0
    for inter, with_bias, group in ACT_SHAPES:
        cuts = torch.sort(torch.randint(0, filled + 1, (e - 1,))).values
        off = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([filled])]).cuda()
        n1 = 2 * inter if act.is_gated else inter
        x = (torch.randn(n, n1, device="cuda") * 3).to(dtype)
        b = (torch.randn(e, n1, device="cuda") * 0.5).to(dtype) if with_bias else None
        s = (torch.rand(inter, device="cuda") * 4 + 0.25) if scaled else None
        out = torch.full((n, -(-inter // 128), 400), 0xA5, dtype=torch.uint8, device="cuda")
        K.fc1_activation_digits(x, off, act, b, alpha, limit, s, out=out, group=group)
        h = K.fc1_activation(x, off, act, b, alpha, limit, s)
        ref = K.token_digits(h[:filled], group=group)
        torch.cuda.synchronize()
        what = f"seed {seed}, {act.name.lower()} inter={inter} bias={with_bias} group {group} {dtype} scaled={scaled}"
        assert torch.equal(out[:filled], ref), f"{what}: digits differ from fc1_activation then token_digits"
        assert (out[filled:] == 0xA5).all(), f"{what}: rows past off[E] were written"
        check_decoded(out[:filled], h[:filled].double(), dtype, group, what)


def test_fused_digits_bad_arguments_are_refused() -> None:
    x = torch.zeros(2, 192, dtype=torch.bfloat16, device="cuda")
    utp = torch.arange(2, dtype=torch.int32, device="cuda")
    w = torch.ones(2, 1, device="cuda")
    with pytest.raises(ValueError, match="multiple of 128"):
        K.expand_rows_digits(x, utp, w)
    with pytest.raises(K.KernelError, match="fp16\\(1\\), bf16\\(2\\)"):
        K.expand_rows_digits(torch.zeros(2, 256, device="cuda"), utp, w)
    off = torch.tensor([0, 2], dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="multiple of 128"):
        K.fc1_activation_digits(torch.zeros(2, 2 * 192, dtype=torch.bfloat16, device="cuda"), off, K.Activation.SWIGLU)


# W4AFP8 with a static input scale or each row's own (per_row: a block per row, common/row_scale_digits.cuh): the digits
# of the rows mb_expand_rows_fp8_dequantized / mb_fc1_activation_fp8_dequantized write with that scale
# (tests/gpu/test_fp8_quantize.py checks those rows against the reference's quantization), bit for bit. The static
# scale saturates the larger elements at +-448 * s.
FP8_STATIC = 0.0123
FP8_SCALINGS = ["static", "per_row"]


def fp8_scaling(scaling: str) -> tuple[torch.Tensor | None, dict[str, object]]:
    """(the two-step reference's static scale, the digits writer's FP8 arguments) for `scaling`."""
    if scaling == "static":
        q = torch.tensor(FP8_STATIC, device="cuda")
        return q, {"fp8_static_scale": q}
    return None, {"fp8_row_scale": True}


@pytest.mark.parametrize("scaling", FP8_SCALINGS)
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "prequant"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("t, h, k, group", EXPAND_SHAPES)
def test_expand_rows_digits_of_fp8_dequantized_rows(t: int, h: int, k: int, group: int, dtype: torch.dtype,
                                                    scaled: bool, scaling: str) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    x = rows(t, h, dtype, g).cuda()
    utp = torch.randperm(t * k, generator=g).to(torch.int32).cuda()
    w = torch.rand(t, k, generator=g).cuda()
    s = (torch.rand(h, generator=g) + 0.25).cuda() if scaled else None
    q, fp8 = fp8_scaling(scaling)
    digits = torch.full((t * k, -(-h // 128), 400), 0xA5, dtype=torch.uint8, device="cuda")
    pw = torch.full((t * k,), float("nan"), device="cuda")
    z = torch.randn(t, h, device="cuda").to(dtype)
    K.expand_rows_digits(x, utp, w, s, permuted_digits=digits, permuted_weights=pw, zero_out=z, group=group, **fp8)
    pin, pw_ref = K.expand_rows_fp8_dequantized(x, utp, w, q, prequant_scale=s)
    ref = K.token_digits(pin, group=group)
    torch.cuda.synchronize()
    what = f"seed {seed}, {t} x {h} top-{k} group {group} {dtype} scaled={scaled} {scaling}"
    assert torch.equal(digits, ref), f"{what}: digits differ from expand_rows_fp8_dequantized then token_digits"
    assert torch.equal(pw, pw_ref), f"{what}: permuted weights"
    assert (z == 0).all(), f"{what}: zero_out not zeroed"


@pytest.mark.parametrize("scaling", FP8_SCALINGS)
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "prequant"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", [K.Activation.SWIGLU, K.Activation.GELU, K.Activation.IDENTITY],
                         ids=lambda a: a.name.lower())
def test_fc1_activation_digits_of_fp8_dequantized_rows(act: K.Activation, dtype: torch.dtype, scaled: bool,
                                                       scaling: str) -> None:
    """With the identity and no bias: the quantize step's digits after a plain expansion (expand_rows=plain)."""
    seed = random.SystemRandom().randrange(1 << 30)
    torch.manual_seed(seed)
    e, n = 8, 45
    filled = n - 7
    q, fp8 = fp8_scaling(scaling)
    for inter, with_bias, group in ACT_SHAPES:
        cuts = torch.sort(torch.randint(0, filled + 1, (e - 1,))).values
        off = torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([filled])]).cuda()
        n1 = 2 * inter if act.is_gated else inter
        x = (torch.randn(n, n1, device="cuda") * 3).to(dtype)
        b = (torch.randn(e, n1, device="cuda") * 0.5).to(dtype) if with_bias and act != K.Activation.IDENTITY else None
        s = (torch.rand(inter, device="cuda") * 4 + 0.25) if scaled else None
        out = torch.full((n, -(-inter // 128), 400), 0xA5, dtype=torch.uint8, device="cuda")
        K.fc1_activation_digits(x, off, act, b, 1.702, 7.0, s, out=out, group=group, **fp8)
        h = K.fc1_activation_fp8_dequantized(x, off, act, q, b, 1.702, 7.0, prequant_scale=s)
        ref = K.token_digits(h[:filled], group=group)
        torch.cuda.synchronize()
        what = (f"seed {seed}, {act.name.lower()} inter={inter} bias={b is not None} group {group} {dtype} {scaled} "
                f"{scaling}")
        assert torch.equal(out[:filled], ref), f"{what}: digits differ from the dequantized rows' digits"
        assert (out[filled:] == 0xA5).all(), f"{what}: rows past off[E] were written"


def test_row_scale_digits_refusals() -> None:
    """Per-row scales take no static scale beside them, and rows of at most 16384 columns (a block of 32 warps)."""
    x = torch.zeros(1, 16384 + 128, dtype=torch.bfloat16, device="cuda")
    utp = torch.zeros(1, dtype=torch.int32, device="cuda")
    w = torch.ones(1, 1, device="cuda")
    q = torch.tensor(FP8_STATIC, device="cuda")
    with pytest.raises(ValueError, match=r"^fp8_row_scale: takes no fp8_static_scale"):
        K.expand_rows_digits(x[:, :256], utp, w, fp8_static_scale=q, fp8_row_scale=True)
    with pytest.raises(ValueError, match=r"^fp8_row_scale: input: hidden must be at most 16384, got 16512"):
        K.expand_rows_digits(x, utp, w, fp8_row_scale=True)
    off = torch.tensor([0, 1], dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match=r"^fp8_row_scale: input: the activation's width must be at most 16384"):
        K.fc1_activation_digits(x, off, K.Activation.GELU, fp8_row_scale=True)
