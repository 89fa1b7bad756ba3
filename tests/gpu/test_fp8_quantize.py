"""FP8 activation quantization kernels (issue 46): mb_quantize_fp8, mb_expand_rows_fp8,
mb_expand_rows_fp8_prequantized and mb_fc1_activation_fp8 against moe_build.weights.fp8.quantize_rows, bit
for bit: the e4m3 bytes (compared as bytes, so -0 and +0 differ) and the fp32 scales (compared as bits).

The reference is quantize_rows run by torch on the CPU copy of the same (fresh random) data. On a CUDA
tensor torch computes quantize_rows' dynamic scale `amax / 448` (a division by a Python scalar) as
`amax * (1 / 448)` (ATen's div_true_kernel_cuda multiplies by the reciprocal of a CPU scalar), which
differs from the IEEE division fp8.py's docstring specifies in about half of all scales; torch on the CPU
divides. The kernels follow the rule, so the CPU's quantize_rows is the exact reference; everything else
in it (amax, x / s by a tensor, the round-to-nearest-even cast) is the same on both devices.

Every output is poisoned first (0xFF bytes, a NaN in e4m3, which no finite input produces; NaN scales),
so an element left unwritten fails the comparison. The data: rows and columns of magnitudes spread over
e^+-6 (small elements round to e4m3 subnormals or to zero), rows of zeros (the 1e-12 amax floor), rows
below the floor, rows of huge values, and a static scale that saturates many elements at +-448.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

from moe_build import kernels as K  # noqa: E402  (after the skip: loading may build the library)
from moe_build.kernels import ops  # noqa: E402
from moe_build.weights.fp8 import quantize_rows  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16)
MODES = ("static", "row", "group128")
E4M3 = torch.float8_e4m3fn
BIG = 2 ** 20 + 37  # more rows than the capped grid (2^20 blocks) has blocks: the row loops stride
TACTICS = ("block_rows", "warp_rows", "staged_rows", "group_items")  # mb_step_tactic, as the plan spells them
STAGED_SMEM = 227 * 1024 - 128  # the staged kernel's ring on an H100 / H200: a block's shared memory less its array


def takes(tactic: str, cols: int, gated: bool = False, mode: str = "row", prequant: bool = False,
          dequantized: bool = False, expansion: bool = False) -> bool:
    """Whether the step kernel `tactic` takes a call, restated from cpp/include/moe_build_kernels.h (mb_step_tactic):
    every kernel but the block one needs whole 16-byte units (cols % 8 == 0; the tests' rows are aligned); a warp a
    row, rows of at most 4096 columns (gated: 1536 a half) and no pre-quant scale; the staged ring (the activation
    only) two rows within a block's shared memory; group items (the activation only) a static or per-group scale, no
    pre-quant scale, e4m3 bytes out. The dequantized forms with a static scale run the block (16-bit) kernel only."""
    if tactic == "block_rows":
        return True
    if cols % 8 or (dequantized and mode == "static"):
        return False
    if tactic == "warp_rows":
        return not prequant and cols <= (1536 if gated else 4096)
    if expansion:
        return False
    if tactic == "staged_rows":
        return 2 * (2 if gated else 1) * cols * 2 <= STAGED_SMEM
    return mode != "row" and not prequant and not dequantized


@pytest.fixture(scope="module", autouse=True)
def lib():
    return K.load_library()


# ---- data, reference, comparison ----------------------------------------------------------------

def fresh(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(rows, cols, device="cuda")
    x *= torch.exp(torch.randn(rows, 1, device="cuda") * 2)
    x *= torch.exp(torch.randn(1, cols, device="cuda") * 2)
    x[3::17] = 0.0                      # all-zero rows: amax floored at 1e-12
    x[5::19] *= 1e-35 if dtype == torch.bfloat16 else 1e-9  # below the floor (fp16: underflow to zeros)
    x[2::13] *= 3e4                     # huge rows
    lim = 6e4 if dtype == torch.float16 else 3e38
    return x.clamp(-lim, lim).to(dtype)


def static_scale(mode: str) -> torch.Tensor | None:
    # Not a power of two; elements beyond 448 * s = 5.5 saturate, below 2^-6 * s are e4m3 subnormals.
    return torch.tensor(0.0123, device="cuda") if mode == "static" else None


def group_of(mode: str) -> int | None:
    return 128 if mode == "group128" else None


def reference(x: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows(x) on the CPU (see the module docstring), on x's device: (q [R, C], scales as the
    kernels write them: [R] or [R, ceil(C / 128)])."""
    s_static = static_scale(mode)
    q, s = quantize_rows(x.cpu(), None if s_static is None else s_static.cpu(), group_of(mode))
    s = s.reshape(-1) if mode != "group128" else s
    return q.to(x.device), s.to(x.device)


def prequant_scale(cols: int) -> torch.Tensor:
    """An AWQ pre-quant scale [cols] as ModelOpt's W4A8_AWQ exports store them: positive, spread over [0.25, 4),
    not powers of two (so the products are rounded)."""
    return torch.exp2(torch.rand(cols, device="cuda") * 4 - 2) * 1.07


def reference_prequant(x: torch.Tensor, pre: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """reference() of x times the pre-quant scale as the fp64 reference (moe_build/reference.py) forms it: the
    exact product (a 16-bit value times an fp32 one fits fp64) converted to fp32 by quantize_rows."""
    s_static = static_scale(mode)
    prod = x.cpu().double() * pre.cpu().double()
    q, s = quantize_rows(prod, None if s_static is None else s_static.cpu(), group_of(mode))
    s = s.reshape(-1) if mode != "group128" else s
    return q.to(x.device), s.to(x.device)


def poisoned_fp8(*shape: int) -> torch.Tensor:
    return torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda").view(E4M3)


def poisoned_scales(*shape: int) -> torch.Tensor:
    return torch.full(shape, math.nan, dtype=torch.float32, device="cuda")


def scale_shape(rows: int, cols: int, mode: str) -> tuple[int, ...]:
    return (rows, -(-cols // 128)) if mode == "group128" else (rows,)


def assert_bytes_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    g = got.view(torch.uint8) if got.dtype == E4M3 else got.view(torch.int32)
    w = want.view(torch.uint8) if want.dtype == E4M3 else want.view(torch.int32)
    assert g.shape == w.shape, f"{what}: shape {list(g.shape)} != {list(w.shape)}"
    bad = (g != w).nonzero()
    if bad.numel():
        i = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} of {g.numel()} elements differ; first at {i}: "
                             f"{got[i].float().item()!r} (bits {g[i].item():#x}) != {want[i].float().item()!r} "
                             f"(bits {w[i].item():#x})")


def check_quantized(q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, mode: str, what: str,
                    prequant: torch.Tensor | None = None) -> None:
    ref_q, ref_s = reference(x, mode) if prequant is None else reference_prequant(x, prequant, mode)
    assert q.dtype == E4M3 and s.dtype == torch.float32
    assert_bytes_equal(q, ref_q, f"{what}: q")
    assert_bytes_equal(s, ref_s, f"{what}: scales")


# ---- mb_quantize_fp8 ----------------------------------------------------------------------------

# (rows, cols): a decode row; a row not a multiple of 8 or 16 columns (element loads and stores); a
# partial last group (2880 = 22.5 * 128); a multiple of 8 but not 16 (8-byte stores, a group of 8
# columns); one tile exactly (16384 = 512 threads * 4 units * 8); past one tile (the per-row scale's
# second read); tiny rows and a single column.
SHAPES = [(1, 7168), (37, 100), (257, 2880), (33, 136), (16, 16384), (5, 20000), (300, 64), (9, 1)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_quantize_fp8(rows: int, cols: int, dtype: torch.dtype, mode: str) -> None:
    x = fresh(rows, cols, dtype)
    q, s = poisoned_fp8(rows, cols), poisoned_scales(*scale_shape(rows, cols, mode))
    got_q, got_s = ops.quantize_fp8(x, static_scale(mode), group_of(mode), out=q, out_scales=s)
    torch.cuda.synchronize()
    assert got_q is q and got_s is s
    check_quantized(q, s, x, mode, f"{rows}x{cols} {dtype} {mode}")


@pytest.mark.parametrize("mode", MODES)
def test_quantize_fp8_unaligned(mode: str) -> None:
    """Rows whose pointers are not 16 (input) or 8 (output) byte aligned, with a width that would allow
    whole units: the element path."""
    rows, cols = 65, 1024
    x_buf = torch.empty(rows * cols + 1, dtype=torch.bfloat16, device="cuda")
    x = x_buf[1:].view(rows, cols)
    x.copy_(fresh(rows, cols, torch.bfloat16))
    q_buf = poisoned_fp8(rows * cols + 3)
    q = q_buf[3:].view(rows, cols)
    s = poisoned_scales(*scale_shape(rows, cols, mode))
    ops.quantize_fp8(x, static_scale(mode), group_of(mode), out=q, out_scales=s)
    torch.cuda.synchronize()
    check_quantized(q, s, x, mode, f"unaligned {mode}")
    assert (q_buf[:3].view(torch.uint8) == 0xFF).all(), "bytes before out were written"


@pytest.mark.parametrize("mode", MODES)
def test_quantize_fp8_past_grid_cap(mode: str) -> None:
    x = fresh(BIG, 8, torch.float16)
    q, s = poisoned_fp8(BIG, 8), poisoned_scales(*scale_shape(BIG, 8, mode))
    ops.quantize_fp8(x, static_scale(mode), group_of(mode), out=q, out_scales=s)
    torch.cuda.synchronize()
    check_quantized(q, s, x, mode, f"{BIG} rows {mode}")


def test_quantize_fp8_allocates_outputs() -> None:
    x = fresh(40, 300, torch.bfloat16)
    q, s = ops.quantize_fp8(x, group=128)
    torch.cuda.synchronize()
    assert q.shape == (40, 300) and s.shape == (40, 3)
    check_quantized(q, s, x, "group128", "allocated outputs")


def test_quantize_fp8_rejects_bad_arguments() -> None:
    x = fresh(4, 256, torch.bfloat16)
    with pytest.raises(K.KernelError) as err:
        ops.quantize_fp8(x.float())
    assert err.value.status is K.Status.UNSUPPORTED
    with pytest.raises(ValueError, match="group"):
        ops.quantize_fp8(x, group=64)
    with pytest.raises(ValueError, match="group"):
        ops.quantize_fp8(x, torch.tensor(1.0, device="cuda"), group=128)
    # The library's own checks, past the wrapper's.
    q, s = poisoned_fp8(4, 256), poisoned_scales(4, 2)
    call = K.load_library().mb_quantize_fp8
    stream = torch.cuda.current_stream().cuda_stream
    assert call(x.data_ptr(), int(K.DType.BF16), 4, 256, None, None, 64, q.data_ptr(), s.data_ptr(), stream) == 1
    one = torch.tensor(1.0, device="cuda")
    assert call(x.data_ptr(), int(K.DType.BF16), 4, 256, None, one.data_ptr(), 128, q.data_ptr(), s.data_ptr(),
                stream) == 1
    with pytest.raises(ValueError, match="prequant_scale"):
        ops.quantize_fp8(x, prequant_scale=torch.ones(255, device="cuda"))


# ---- mb_expand_rows_fp8 and mb_expand_rows_fp8_prequantized -----------------------------------

def random_maps(t: int, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(permuted_to_unpermuted, unpermuted_to_permuted) int64 of k distinct random experts per token,
    sorted stably by expert as the routing prologues sort them."""
    ids = torch.rand(t, e, device="cuda").argsort(dim=1)[:, :k]
    ptu = torch.sort(ids.flatten(), stable=True).indices
    utp = torch.empty_like(ptu)
    utp[ptu] = torch.arange(ptu.numel(), device="cuda")
    return ptu, utp


# (tokens, hidden, top_k): decode (K rows split among blocks), element path, a partial last group at
# prefill, a width past one tile, more than 32 copies per token, no split.
EXPAND_SHAPES = [(1, 7168, 8), (5, 100, 3), (257, 2880, 6), (3, 20000, 2), (40, 136, 40), (2048, 2048, 8)]


def check_fused_expansion(t: int, h: int, k: int, dtype: torch.dtype, mode: str, what: str,
                          tactic: str = "block_rows") -> tuple[torch.Tensor, ...]:
    """mb_expand_rows_fp8 of t fresh tokens into k random experts each, on poisoned outputs: equals quantize-then-
    permute bit for bit, the permuted weights and zero_out included. Returns (x, w, ptu, utp, ref_q, ref_s)."""
    x = fresh(t, h, dtype)
    w = torch.rand(t, k, device="cuda")
    ptu, utp = random_maps(t, max(64, k), k)
    ref_q, ref_s = reference(x, mode)
    src = ptu // k
    pin, ps, pw = poisoned_fp8(t * k, h), poisoned_scales(*scale_shape(t * k, h, mode)), poisoned_scales(t * k)
    z = poisoned_scales(t, h).to(dtype)
    ops.expand_rows_fp8(x, utp.to(torch.int32), w, static_scale(mode), group_of(mode), permuted_input=pin,
                        permuted_scales=ps, permuted_weights=pw, zero_out=z, tactic=tactic)
    torch.cuda.synchronize()
    assert_bytes_equal(pin, ref_q[src], f"{what}: q")
    assert_bytes_equal(ps, ref_s[src], f"{what}: scales")
    assert torch.equal(pw, w.flatten()[ptu]), f"{what}: permuted_weights"
    assert (z == 0).all(), f"{what}: zero_out not fully zeroed"
    return x, w, ptu, utp, ref_q, ref_s


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h,k", EXPAND_SHAPES)
@pytest.mark.parametrize("tactic", ("block_rows", "warp_rows"))
def test_expand_rows_fp8(t: int, h: int, k: int, dtype: torch.dtype, mode: str, tactic: str) -> None:
    """Each kernel that takes the call (a block a token; a warp a token on whole units of at most 4096 columns) equals
    quantize-then-permute, and the unfused pair (mb_quantize_fp8, then the prequantized expansion) writes the same
    bytes; zero_out is zeroed by both. A kernel that does not take the call is refused (UNSUPPORTED), and writes
    nothing."""
    what = f"{tactic} {t}x{h} k={k} {dtype} {mode}"
    if not takes(tactic, h, mode=mode, expansion=True):
        x, w = fresh(t, h, dtype), torch.rand(t, k, device="cuda")
        _, utp = random_maps(t, max(64, k), k)
        pin = poisoned_fp8(t * k, h)
        with pytest.raises(K.KernelError, match=f"tactic {tactic} takes") as err:
            ops.expand_rows_fp8(x, utp.to(torch.int32), w, static_scale(mode), group_of(mode), permuted_input=pin,
                                tactic=tactic)
        torch.cuda.synchronize()
        assert err.value.status is K.Status.UNSUPPORTED
        assert (pin.view(torch.uint8) == 0xFF).all(), f"{what}: a refused call wrote"
        return
    x, w, ptu, utp, ref_q, ref_s = check_fused_expansion(t, h, k, dtype, mode, what, tactic)
    src = ptu // k
    want_w = w.flatten()[ptu]
    q, s = ops.quantize_fp8(x, static_scale(mode), group_of(mode))
    pin2, ps2, pw2 = poisoned_fp8(t * k, h), poisoned_scales(*scale_shape(t * k, h, mode)), poisoned_scales(t * k)
    z2 = poisoned_scales(t, h)  # zero_out of another dtype than the layer's: only its size matters here
    ops.expand_rows_fp8_prequantized(q, s, utp.to(torch.int32), w, permuted_input=pin2, permuted_scales=ps2,
                                     permuted_weights=pw2, zero_out=z2)
    torch.cuda.synchronize()
    what = f"prequantized {t}x{h} k={k} {dtype} {mode}"
    assert_bytes_equal(pin2, ref_q[src], f"{what}: q")
    assert_bytes_equal(ps2, ref_s[src], f"{what}: scales")
    assert torch.equal(pw2, want_w), f"{what}: permuted_weights"
    assert (z2 == 0).all(), f"{what}: zero_out not fully zeroed"


# (hidden, top_k) the warp-per-token kernel takes at prefill (whole units, at most 4096 columns, no pre-quant scale): its
# four register widths (768: 3 units a lane on the 4-unit kernel, the last lanes idle; 2048: 8; 2880: 11.25 on the
# 12-unit kernel, a partial last group; 4096: 16), one copy a token, and more than 32 copies (the maps shuffled 32 at a
# time).
WARP_TOKEN_SHAPES = [(768, 8), (2048, 1), (2880, 4), (4096, 2), (256, 40)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("h,k", WARP_TOKEN_SHAPES)
def test_expand_rows_fp8_warp_tokens(h: int, k: int, dtype: torch.dtype, mode: str) -> None:
    """9000 tokens, more than the GPU holds warps at once (each warp of the warp-per-token kernel's persistent grid
    quantizes several in turn): equals quantize-then-permute bit for bit, permuted weights and zero_out included."""
    check_fused_expansion(9000, h, k, dtype, mode, f"warp tokens 9000x{h} k={k} {dtype} {mode}", "warp_rows")


@pytest.mark.parametrize("mode", ("row", "group128"))
def test_expand_rows_fp8_unaligned(mode: str) -> None:
    """Input, permuted rows and zero_out off their 16-byte alignment: the element paths of both."""
    t, h, k = 33, 512, 4
    x_buf = torch.empty(t * h + 1, dtype=torch.float16, device="cuda")
    x = x_buf[1:].view(t, h)
    x.copy_(fresh(t, h, torch.float16))
    w = torch.rand(t, k, device="cuda")
    ptu, utp = random_maps(t, 16, k)
    ref_q, ref_s = reference(x, mode)
    for prequantized in (False, True):
        pin_buf = poisoned_fp8(t * k * h + 1)
        pin = pin_buf[1:].view(t * k, h)
        ps, pw = poisoned_scales(*scale_shape(t * k, h, mode)), poisoned_scales(t * k)
        z_buf = torch.full((t * h + 1,), math.nan, dtype=torch.float16, device="cuda")
        z = z_buf[1:].view(t, h)
        if prequantized:
            q_buf = poisoned_fp8(t * h + 1)
            q = q_buf[1:].view(t, h)
            _, s = ops.quantize_fp8(x, None, group_of(mode), out=q)
            ops.expand_rows_fp8_prequantized(q, s, utp.to(torch.int32), w, pin, ps, pw, zero_out=z)
        else:
            ops.expand_rows_fp8(x, utp.to(torch.int32), w, None, group_of(mode), pin, ps, pw, zero_out=z)
        torch.cuda.synchronize()
        what = f"unaligned {mode} prequantized={prequantized}"
        assert_bytes_equal(pin, ref_q[ptu // k], f"{what}: q")
        assert_bytes_equal(ps, ref_s[ptu // k], f"{what}: scales")
        assert torch.equal(pw, w.flatten()[ptu]), f"{what}: permuted_weights"
        assert (z == 0).all() and z_buf[:1].isnan().all(), f"{what}: zero_out"


def test_expand_rows_fp8_past_grid_cap() -> None:
    t, h, k = BIG, 8, 2
    x = fresh(t, h, torch.bfloat16)
    w = torch.rand(t, k, device="cuda")
    ptu, utp = random_maps(t, 8, k)
    ref_q, ref_s = reference(x, "row")
    pin, ps, pw = poisoned_fp8(t * k, h), poisoned_scales(t * k), poisoned_scales(t * k)
    ops.expand_rows_fp8(x, utp.to(torch.int32), w, permuted_input=pin, permuted_scales=ps, permuted_weights=pw)
    torch.cuda.synchronize()
    assert_bytes_equal(pin, ref_q[ptu // k], "q")
    assert_bytes_equal(ps, ref_s[ptu // k], "scales")
    assert torch.equal(pw, w.flatten()[ptu])


def test_expand_rows_fp8_zero_out_must_not_overlap_input() -> None:
    x = fresh(8, 256, torch.bfloat16)
    utp = torch.arange(8, device="cuda", dtype=torch.int32)
    w = torch.rand(8, 1, device="cuda")
    with pytest.raises(K.KernelError, match="overlap") as err:
        ops.expand_rows_fp8(x, utp, w, zero_out=x)
    assert err.value.status is K.Status.INVALID_ARGUMENT
    # zero_out [8, 256] bf16 whose first half holds the e4m3 input.
    z = torch.empty(8, 256, dtype=torch.bfloat16, device="cuda")
    q, s = ops.quantize_fp8(x, out=z.view(-1).view(torch.uint8)[: 8 * 256].view(E4M3).view(8, 256))
    with pytest.raises(K.KernelError, match="overlap") as err:
        ops.expand_rows_fp8_prequantized(q, s, utp, w, zero_out=z)
    assert err.value.status is K.Status.INVALID_ARGUMENT


# ---- mb_fc1_activation_fp8 ------------------------------------------------------------------------

def random_offsets(e: int, filled: int) -> torch.Tensor:
    """Offsets [E+1] with `filled` rows spread unevenly (some experts empty)."""
    cuts = torch.sort(torch.randint(0, filled + 1, (e - 1,), device="cuda")).values
    zero = torch.zeros(1, dtype=torch.int64, device="cuda")
    return torch.cat([zero, cuts, zero + filled])


# (inter, bias): a partial last group at a GPT-OSS width, the element path (100 columns), the
# Qwen3-30B-A3B width, DeepSeek-V2-Lite's, a gated row of 4096 columns (three ring stages of exactly 48 KB), a
# multiple of 8 with a group of 8 columns at the end, Mixtral-8x7B's width (a gated ring that takes an SM's shared
# memory alone). The identity without a bias is the staged kernel's quantize step (its own values, packed math).
FC1_SHAPES = [(2880, True), (100, True), (768, False), (1408, True), (4096, False), (4104, False), (14336, False)]
# (inter, bias) besides: Mixtral-8x7B's and DeepSeek-V3's widths with the other bias (group items: a whole pair of
# groups a warp), a partial last group (2880), an odd group count (1408: 11 groups, the last warp's second half past
# the row), a last group of one unit (4104), and the element path (100 columns: not whole units, the block kernel).
DECODE_FC1_SHAPES = [(14336, False), (2048, True), (2880, True), (1408, False), (4104, True), (100, True)]


def check_activation_fp8(act: K.Activation, dtype: torch.dtype, mode: str, tactic: str, rows: int, inter: int,
                         with_bias: bool, experts: int = 8) -> None:
    """mb_fc1_activation_fp8 on `tactic`'s kernel, fresh rows and poisoned outputs: equals
    quantize_rows(fc1_activation(...)) bit for bit (the fused step computes the activation through the same device
    function as mb_fc1_activation and rounds it to dtype as mb_fc1_activation stores it: no tolerance); rows past
    off[E] (other nodes' experts) and their scales keep their poison; some experts are empty."""
    filled = rows - max(1, rows // 16) if rows > 1 else 1
    off = random_offsets(experts, filled)
    n1 = 2 * inter if act.is_gated else inter
    x = (torch.randn(rows, n1, device="cuda") * 3).to(dtype)
    x[4::23] *= 8.0  # larger rows (no fp16 overflow in a gated product); a static scale saturates past 5.5
    b = (torch.randn(experts, n1, device="cuda") * 0.5).to(dtype) if with_bias else None
    q, s = poisoned_fp8(rows, inter), poisoned_scales(*scale_shape(rows, inter, mode))
    ops.fc1_activation_fp8(x, off, act, b, 1.702, 7.0, static_scale(mode), group_of(mode), out=q, out_scales=s,
                           tactic=tactic)
    h = K.fc1_activation(x, off, act, b, 1.702, 7.0)
    torch.cuda.synchronize()
    what = f"{tactic} {act.name.lower()} rows={rows} inter={inter} bias={with_bias} {dtype} {mode}"
    check_quantized(q[:filled], s[:filled], h[:filled], mode, what)
    assert (q[filled:].view(torch.uint8) == 0xFF).all(), f"{what}: rows past off[E] were written"
    assert s[filled:].isnan().all(), f"{what}: scales of rows past off[E] were written"


# Each kernel with each scaling it takes (group items: a static or per-group scale).
TACTIC_MODES = [(t, m) for t in TACTICS for m in MODES if t != "group_items" or m != "row"]


@pytest.mark.parametrize("tactic,mode", TACTIC_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(K.Activation), ids=lambda a: a.name.lower())
def test_fc1_activation_fp8(act: K.Activation, dtype: torch.dtype, tactic: str, mode: str) -> None:
    """Each kernel on every width of FC1_SHAPES and DECODE_FC1_SHAPES it takes, with and without bias, at decode row
    counts (1 to 131: fewer than the GPU has SMs) and at 600 rows, every activation (the identity without a bias is
    the quantize step's call)."""
    shapes = dict.fromkeys(FC1_SHAPES + DECODE_FC1_SHAPES)
    for rows in (1, 2, 16, 131, 600):
        for inter, with_bias in shapes:
            if takes(tactic, inter, act.is_gated, mode):
                check_activation_fp8(act, dtype, mode, tactic, rows, inter, with_bias)


def check_swiglu_fp8(x: torch.Tensor, off: torch.Tensor, b: torch.Tensor | None, mode: str, filled: int,
                     what: str, tactic: str = "block_rows") -> None:
    """mb_fc1_activation_fp8 (SwiGLU) on `tactic`'s kernel, poisoned outputs, equals quantize_rows of
    mb_fc1_activation's rows, and rows past off[E] (`filled`) keep their poison."""
    rows, inter = x.shape[0], x.shape[1] // 2
    q, s = poisoned_fp8(rows, inter), poisoned_scales(*scale_shape(rows, inter, mode))
    ops.fc1_activation_fp8(x, off, K.Activation.SWIGLU, b, static_scale=static_scale(mode), group=group_of(mode),
                           out=q, out_scales=s, tactic=tactic)
    h = K.fc1_activation(x, off, K.Activation.SWIGLU, b)
    torch.cuda.synchronize()
    check_quantized(q[:filled], s[:filled], h[:filled], mode, what)
    assert (q[filled:].view(torch.uint8) == 0xFF).all() and s[filled:].isnan().all()


@pytest.mark.parametrize("mode", MODES)
def test_fc1_activation_fp8_wide_rows(mode: str) -> None:
    """inter 20000 (past one tile: the per-row scale reads the rest of the row twice) on the block kernel, at decode
    row counts (8 rows, one expert's worth and an empty expert), with an unaligned input (the element path) too."""
    e, rows, filled, inter = 3, 8, 6, 20000
    off = torch.tensor([0, 4, 4, filled], dtype=torch.int64, device="cuda")
    for offset in (0, 1):
        buf = torch.empty(rows * 2 * inter + offset, dtype=torch.bfloat16, device="cuda")
        x = buf[offset:].view(rows, 2 * inter)
        x.copy_(torch.randn(rows, 2 * inter, device="cuda") * 3)
        b = (torch.randn(e, 2 * inter, device="cuda") * 0.5).to(torch.bfloat16)
        check_swiglu_fp8(x, off, b, mode, filled, f"inter {inter} offset {offset} {mode}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("inter,tactic", [(14336, "staged_rows"), (30000, "block_rows")])
def test_fc1_activation_fp8_staged_ring(inter: int, tactic: str, mode: str) -> None:
    """Many more rows than blocks at Mixtral-8x7B's width (the staged kernel's ring of three rows in shared memory,
    past the default 48 KB, each block taking several rows in turn), and a width whose two rows do not fit a block's
    shared memory (30000: the block-per-row kernel, the staged one refused), with rows past off[E] and empty experts."""
    e, rows = 8, 700
    filled = rows - 11
    off = random_offsets(e, filled)
    x = (torch.randn(rows, 2 * inter, device="cuda") * 3).to(torch.bfloat16)
    b = (torch.randn(e, 2 * inter, device="cuda") * 0.5).to(torch.bfloat16)
    check_swiglu_fp8(x, off, b, mode, filled, f"inter {inter} {mode}", tactic)
    if tactic == "block_rows":
        with pytest.raises(K.KernelError, match="tactic staged_rows takes") as err:
            ops.fc1_activation_fp8(x, off, K.Activation.SWIGLU, b, static_scale=static_scale(mode),
                                   group=group_of(mode), tactic="staged_rows")
        assert err.value.status is K.Status.UNSUPPORTED


@pytest.mark.parametrize("tactic,mode", [(t, m) for t, m in TACTIC_MODES if t in ("warp_rows", "group_items")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(K.Activation), ids=lambda a: a.name.lower())
def test_fc1_activation_fp8_many_rows(act: K.Activation, dtype: torch.dtype, tactic: str, mode: str) -> None:
    """20000 rows, more than the GPU holds warps at once, so each warp of the warp-per-row and group-item kernels'
    persistent grids takes several rows (items) in turn: at the warp kernel's five register widths (768: 3 units a lane
    on the 4-unit kernel, 1408: 5.5 on the 6-unit one, 2048: 8, 2880: 11.25 on the 12-unit one, 4096: 16; gated rows
    up to the 6-unit one), with and without bias."""
    for inter, with_bias in [(768, False), (1408, True), (2048, False), (2880, True), (4096, False), (2880, False)]:
        if takes(tactic, inter, act.is_gated, mode):
            check_activation_fp8(act, dtype, mode, tactic, 20000, inter, with_bias, experts=32)


@pytest.mark.parametrize("mode", MODES)
def test_fc1_activation_fp8_refuses_a_kernel_that_does_not_take_the_call(mode: str) -> None:
    """A step tactic whose kernel cannot take the call is refused (UNSUPPORTED, naming what it takes), never replaced
    by another kernel, and writes nothing: the warp kernel on gated rows past 1536 columns a half, every kernel but
    the block one on rows that are not whole units, group items with per-row scales or a pre-quant scale; a value
    that is no tactic is refused by the wrapper."""
    e, rows, filled = 4, 64, 60
    off = random_offsets(e, filled)
    cases = [("warp_rows", 2048, K.Activation.SWIGLU, None), ("warp_rows", 100, K.Activation.RELU, None),
             ("staged_rows", 100, K.Activation.SWIGLU, None), ("group_items", 100, K.Activation.SILU, None),
             ("group_items", 2048, K.Activation.SWIGLU, prequant_scale(2048))]
    if mode == "row":
        cases.append(("group_items", 2048, K.Activation.SWIGLU, None))
    for tactic, inter, act, pre in cases:
        n1 = 2 * inter if act.is_gated else inter
        x = torch.randn(rows, n1, device="cuda").to(torch.bfloat16)
        q, s = poisoned_fp8(rows, inter), poisoned_scales(*scale_shape(rows, inter, mode))
        with pytest.raises(K.KernelError, match=f"tactic {tactic} takes") as err:
            ops.fc1_activation_fp8(x, off, act, static_scale=static_scale(mode), group=group_of(mode), out=q,
                                   out_scales=s, prequant_scale=pre, tactic=tactic)
        torch.cuda.synchronize()
        assert err.value.status is K.Status.UNSUPPORTED, f"{tactic} inter={inter}"
        assert (q.view(torch.uint8) == 0xFF).all() and s.isnan().all(), f"{tactic} inter={inter}: a refused call wrote"
    with pytest.raises(ValueError, match="tactic: 'fastest' is not one of block_rows, warp_rows, staged_rows"):
        ops.fc1_activation_fp8(x, off, act, static_scale=static_scale(mode), group=group_of(mode), tactic="fastest")


def test_fc1_activation_fp8_past_grid_cap() -> None:
    rows, inter, filled = BIG, 8, BIG - 7
    off = random_offsets(4, filled)
    x = torch.randn(rows, 2 * inter, device="cuda").to(torch.bfloat16)
    check_swiglu_fp8(x, off, None, "row", filled, "past the grid cap")


# ---- the AWQ pre-quant scale (W4AFP8): in the quantization, the expansion and the activation -------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", [(300, 2048), (7, 100), (33, 20000), (5, 136)])
def test_quantize_fp8_prequant(rows: int, cols: int, dtype: torch.dtype, mode: str) -> None:
    """x times the pre-quant scale, then quantized: bit for bit the fp64 reference's exact product converted to
    fp32 and quantized (one fp32 multiply on the GPU rounds that same exact product once); the element path
    (100 columns), a width past one tile, whole units."""
    x, pre = fresh(rows, cols, dtype), prequant_scale(cols)
    q, s = poisoned_fp8(rows, cols), poisoned_scales(*scale_shape(rows, cols, mode))
    ops.quantize_fp8(x, static_scale(mode), group_of(mode), out=q, out_scales=s, prequant_scale=pre)
    torch.cuda.synchronize()
    check_quantized(q, s, x, mode, f"prequant {rows}x{cols} {dtype} {mode}", prequant=pre)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h,k", EXPAND_SHAPES)
def test_expand_rows_fp8_prequant_equals_plain_expansion_then_quantize(t: int, h: int, k: int, dtype: torch.dtype,
                                                                       mode: str) -> None:
    """expand_rows=prequant_fused (the scale in the expansion) writes what the reference quantizes, and the same
    bytes and scales as its plain alternative: mb_expand_rows into 16-bit rows, then mb_quantize_fp8 with the scale
    on the expanded rows (the runner's expand_rows:16bit + fc1_prequant:fp8)."""
    x, pre = fresh(t, h, dtype), prequant_scale(h)
    w = torch.rand(t, k, device="cuda")
    ptu, utp = random_maps(t, max(64, k), k)
    ref_q, ref_s = reference_prequant(x, pre, mode)
    src = ptu // k
    pin, ps, pw = poisoned_fp8(t * k, h), poisoned_scales(*scale_shape(t * k, h, mode)), poisoned_scales(t * k)
    ops.expand_rows_fp8(x, utp.to(torch.int32), w, static_scale(mode), group_of(mode), permuted_input=pin,
                        permuted_scales=ps, permuted_weights=pw, prequant_scale=pre)
    expanded, _ = K.expand_rows(x, utp.to(torch.int32), w)
    q, s = poisoned_fp8(t * k, h), poisoned_scales(*scale_shape(t * k, h, mode))
    ops.quantize_fp8(expanded, static_scale(mode), group_of(mode), out=q, out_scales=s, prequant_scale=pre)
    torch.cuda.synchronize()
    what = f"{t}x{h} k={k} {dtype} {mode}"
    assert_bytes_equal(pin, ref_q[src], f"fused {what}: q")
    assert_bytes_equal(ps, ref_s[src], f"fused {what}: scales")
    assert torch.equal(pw, w.flatten()[ptu]), f"fused {what}: permuted_weights"
    assert_bytes_equal(q, pin, f"plain then quantize {what}: q")
    assert_bytes_equal(s, ps, f"plain then quantize {what}: scales")


@pytest.mark.parametrize("tactic", ("block_rows", "staged_rows"))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(K.Activation), ids=lambda a: a.name.lower())
def test_fc1_activation_fp8_prequant(act: K.Activation, dtype: torch.dtype, mode: str, tactic: str) -> None:
    """fc2_prequant=fused (the FC2 pre-quant scale in the activation) on each kernel that takes a pre-quant scale
    equals its separate alternative bit for bit: mb_fc1_activation, then mb_quantize_fp8 with the scale (the runner's
    fc1_activation + fc2_prequant:fp8), and both equal the reference's quantization of (activation rounded to dtype)
    x scale."""
    e, rows = 16, 600
    filled = rows - 37
    for inter, with_bias in FC1_SHAPES:
        if not takes(tactic, inter, act.is_gated, mode, prequant=True):
            continue
        off = random_offsets(e, filled)
        n1 = 2 * inter if act.is_gated else inter
        x = (torch.randn(rows, n1, device="cuda") * 3).to(dtype)
        b = (torch.randn(e, n1, device="cuda") * 0.5).to(dtype) if with_bias else None
        pre = prequant_scale(inter)
        q, s = poisoned_fp8(rows, inter), poisoned_scales(*scale_shape(rows, inter, mode))
        ops.fc1_activation_fp8(x, off, act, b, 1.702, 7.0, static_scale(mode), group_of(mode), out=q, out_scales=s,
                               prequant_scale=pre, tactic=tactic)
        h = K.fc1_activation(x, off, act, b, 1.702, 7.0)
        q2, s2 = ops.quantize_fp8(h[:filled], static_scale(mode), group_of(mode), prequant_scale=pre)
        torch.cuda.synchronize()
        what = f"prequant {tactic} {act.name.lower()} inter={inter} bias={with_bias} {dtype} {mode}"
        check_quantized(q[:filled], s[:filled], h[:filled], mode, what, prequant=pre)
        assert_bytes_equal(q2, q[:filled], f"{what}: separate q")
        assert_bytes_equal(s2, s[:filled], f"{what}: separate scales")
        assert (q[filled:].view(torch.uint8) == 0xFF).all(), f"{what}: rows past off[E] were written"


# ---- the dequantized forms: W4AFP8's rows for W4A16's GEMMs -----------------------------------------------

# The dequantized forms' scales: one static scale (ModelOpt's W4A8_AWQ), or each row's own (compressed-tensors' W4AFP8).
DEQUANTIZED_MODES = ["static", "row"]


def dequantized(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What mb_expand_rows_fp8_dequantized / mb_fc1_activation_fp8_dequantized store for e4m3 rows q by their scales
    s ([R], the static scale repeated or each row's): q * s in one fp32 multiply, rounded to nearest even in dtype."""
    return (q.float() * s.float()[:, None]).to(dtype)


def assert_16bit_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit for bit (a NaN poison left unwritten, or -0 against +0, differs)."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {list(got.shape)}"
    bad = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
    if bad.numel():
        i = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} of {got.numel()} elements differ; first at {i}: "
                             f"{got[i].item()!r} != {want[i].item()!r}")


# The dequantized forms' kernels with each scale: a static scale runs the 16-bit step's kernel (block_rows) only.
DEQUANTIZED_TACTIC_MODES = [("block_rows", "static"), ("block_rows", "row"), ("warp_rows", "row"),
                            ("staged_rows", "row")]


# (tokens, hidden, top_k, pre-quant scale, tactic, mode) of the dequantized expansion: every kernel on every shape it
# takes, and 9000 tokens of 2048 columns, more than the GPU holds warps (the warp kernel's warps take several tokens).
DEQUANTIZED_EXPANSIONS = [(t, h, k, pre, tactic, mode) for t, h, k in EXPAND_SHAPES + [(9000, 2048, 2)]
                          for pre in (False, True) for tactic, mode in DEQUANTIZED_TACTIC_MODES
                          if takes(tactic, h, mode=mode, prequant=pre, dequantized=True, expansion=True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h,k,pre,tactic,mode", DEQUANTIZED_EXPANSIONS)
def test_expand_rows_fp8_dequantized(t: int, h: int, k: int, pre: bool, tactic: str, mode: str,
                                     dtype: torch.dtype) -> None:
    """The reference's e4m3 rows (quantize_rows by the static scale or each row's dynamic one, of the rows times the
    pre-quant scale where given), permuted, each value times its scale rounded to dtype: on poisoned outputs, bit for
    bit, the permuted weights and zero_out with them, on each kernel that takes the call (the block-per-token kernel:
    rows past its first tile read twice for a row scale; the warp-per-token one with per-row scales and no pre-quant
    scale)."""
    x, p = fresh(t, h, dtype), prequant_scale(h) if pre else None
    w = torch.rand(t, k, device="cuda")
    ptu, utp = random_maps(t, max(64, k), k)
    ref_q, ref_s = reference(x, mode) if p is None else reference_prequant(x, p, mode)
    pin = torch.full((t * k, h), math.nan, dtype=dtype, device="cuda")
    pw, z = poisoned_scales(t * k), poisoned_scales(t, h).to(dtype)
    ops.expand_rows_fp8_dequantized(x, utp.to(torch.int32), w, static_scale(mode), permuted_input=pin,
                                    permuted_weights=pw, zero_out=z, prequant_scale=p, tactic=tactic)
    torch.cuda.synchronize()
    what = f"{tactic} {t}x{h} k={k} {dtype} prequant={pre} {mode}"
    assert_16bit_equal(pin, dequantized(ref_q[ptu // k], ref_s[ptu // k], dtype), what)
    assert torch.equal(pw, w.flatten()[ptu]), f"{what}: permuted_weights"
    assert (z == 0).all(), f"{what}: zero_out not fully zeroed"


@pytest.mark.parametrize("tactic,mode", DEQUANTIZED_TACTIC_MODES)
@pytest.mark.parametrize("pre", [False, True], ids=["no_prequant", "prequant"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", list(K.Activation), ids=lambda a: a.name.lower())
def test_fc1_activation_fp8_dequantized(act: K.Activation, dtype: torch.dtype, pre: bool, tactic: str,
                                        mode: str) -> None:
    """The reference's quantization (the static scale or each row's) of mb_fc1_activation's rows (times the pre-quant
    scale where given), each value times its scale rounded to dtype, bit for bit, on each kernel that takes the call;
    rows past off[E] keep their poison. With the identity and no bias this is the runner's separate step on 16-bit
    rows. 600 rows, 2 and 45 (decode calls), and 20000 on the warp kernel (more rows than the GPU holds warps)."""
    e = 16
    shapes = [(600, inter, with_bias) for inter, with_bias in FC1_SHAPES]
    shapes += [(rows, inter, with_bias) for rows in (2, 45) for inter, with_bias in DECODE_FC1_SHAPES]
    if tactic == "warp_rows":
        shapes += [(20000, 768, True), (20000, 1408, False)]
    for rows, inter, with_bias in shapes:
        if not takes(tactic, inter, act.is_gated, mode, prequant=pre, dequantized=True):
            continue
        filled = rows - 37 if rows > 37 else rows - 1
        off = random_offsets(e, filled)
        n1 = 2 * inter if act.is_gated else inter
        x = (torch.randn(rows, n1, device="cuda") * 3).to(dtype)
        x[4::23] *= 8.0
        x[6::29] *= 1e-3
        b = (torch.randn(e, n1, device="cuda") * 0.5).to(dtype) if with_bias else None
        p = prequant_scale(inter) if pre else None
        out = torch.full((rows, inter), math.nan, dtype=dtype, device="cuda")
        ops.fc1_activation_fp8_dequantized(x, off, act, static_scale(mode), b, 1.702, 7.0, out=out, prequant_scale=p,
                                           tactic=tactic)
        h = K.fc1_activation(x, off, act, b, 1.702, 7.0)
        torch.cuda.synchronize()
        ref_q, ref_s = reference(h[:filled], mode) if p is None else reference_prequant(h[:filled], p, mode)
        what = f"{tactic} {act.name.lower()} rows={rows} inter={inter} bias={with_bias} {dtype} prequant={pre} {mode}"
        assert_16bit_equal(out[:filled], dequantized(ref_q, ref_s, dtype), what)
        assert out[filled:].isnan().all(), f"{what}: rows past off[E] were written"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_dequantized_identity_in_place(dtype: torch.dtype) -> None:
    """The runner's separate FC2 step (fc2_prequant:fp8_dequantized) quantizes the activated rows in place: each row
    read whole before it is written, with the static scale or the row's own, on each kernel that takes a pre-quant
    scale (600 rows of 768 and 14336 columns, 20000 of 768)."""
    e = 16
    for tactic, mode in DEQUANTIZED_TACTIC_MODES:
        for rows, inter in ((600, 768), (600, 14336), (20000, 768)):
            if not takes(tactic, inter, mode=mode, prequant=True, dequantized=True):
                continue
            filled = rows - 37
            off = random_offsets(e, filled)
            x = (torch.randn(rows, inter, device="cuda") * 3).to(dtype)
            p = prequant_scale(inter)
            ref_q, ref_s = reference_prequant(x[:filled], p, mode)
            want = torch.cat([dequantized(ref_q, ref_s, dtype), x[filled:]])
            ops.fc1_activation_fp8_dequantized(x, off, K.Activation.IDENTITY, static_scale(mode), out=x,
                                               prequant_scale=p, tactic=tactic)
            torch.cuda.synchronize()
            assert_16bit_equal(x, want, f"in place {tactic} rows={rows} inter={inter} {dtype} {mode}")


def test_dequantized_forms_refuse_what_they_do_not_take() -> None:
    """The dequantized forms' refusals (UNSUPPORTED, nothing written): with a static scale every kernel but the 16-bit
    step's (block_rows); group items at all (they store e4m3 bytes); the warp kernels with a pre-quant scale."""
    t, h, k, rows = 16, 2048, 2, 64
    x, w = fresh(t, h, torch.bfloat16), torch.rand(t, k, device="cuda")
    _, utp = random_maps(t, 64, k)
    off = random_offsets(4, rows - 4)
    a = (torch.randn(rows, 2 * h, device="cuda") * 3).to(torch.bfloat16)
    expansions = [("warp_rows", "static", None), ("warp_rows", "row", prequant_scale(h))]
    activations = [(t_, "static", None) for t_ in ("warp_rows", "staged_rows", "group_items")]
    activations += [("group_items", "row", None), ("warp_rows", "row", prequant_scale(h))]
    for tactic, mode, pre in expansions:
        pin = torch.full((t * k, h), math.nan, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(K.KernelError, match="tactic") as err:
            ops.expand_rows_fp8_dequantized(x, utp.to(torch.int32), w, static_scale(mode), permuted_input=pin,
                                            prequant_scale=pre, tactic=tactic)
        torch.cuda.synchronize()
        assert err.value.status is K.Status.UNSUPPORTED and pin.isnan().all(), f"expansion {tactic} {mode}"
    for tactic, mode, pre in activations:
        out = torch.full((rows, h), math.nan, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(K.KernelError, match="tactic") as err:
            ops.fc1_activation_fp8_dequantized(a, off, K.Activation.SWIGLU, static_scale(mode), out=out,
                                               prequant_scale=pre, tactic=tactic)
        torch.cuda.synchronize()
        assert err.value.status is K.Status.UNSUPPORTED and out.isnan().all(), f"activation {tactic} {mode}"
