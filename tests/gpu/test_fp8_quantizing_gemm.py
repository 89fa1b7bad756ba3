"""The FP8 GEMM2 that quantizes its own input (mb_grouped_gemm_fp8_quantizing_finalize, the plan's
fc2_input_quant=gemm2) against an fp64 reference, and against the unfused pair it replaces.

Fresh random 16-bit rows per case (each row at its own magnitude, one row all zeros: the amax floor), e4m3 weights
and per-column scales as test_fp8_gemm.case makes them, routed as test_fp8_gemm's finalize cases (empty, heavy and
remote experts; rows past off[E] poisoned with NaN, which no CTA may read). The reference quantizes the rows with
moe_build/weights/fp8.py's quantize_rows (the rule the kernels implement; rowwise weight scales: a static scale or
per row; block-128 weight scales: per 128-column group, the last one partial where k is not a multiple of 128), then
takes test_fp8_gemm's fp64 finalize reference and bound of that quantized GEMM: the kernel must have quantized every
row exactly as the rule does, or an element's error reaches the order of one e4m3 step (2^-4 relative) and the
bound, 2^-8 of the magnitudes plus the decode kernel's accumulation term, fails. With top_k <= 2 the finalize's
atomic adds commute, so the output must also equal, bit for bit, mb_quantize_fp8 followed by
mb_grouped_gemm_fp8_finalize with the same tactic.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.kernels import Fp8Accumulation, Fp8Scaling, KernelError  # noqa: E402
from moe_build.kernels.abi import DType  # noqa: E402
from moe_build.kernels.library import call  # noqa: E402
from moe_build.kernels.ops.gemm import tactic_struct  # noqa: E402
from moe_build.planner.rules import FP8_QUANTIZING_MAX_K  # noqa: E402
from moe_build.weights.fp8 import quantize_rows  # noqa: E402
from finalize_routing import LOCAL, routed  # noqa: E402
from test_fp8_gemm import accumulation_term, case, finalize_reference, need  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

# (top_k, tokens): 1 to 8 rows in a chunk, a heavy expert of many chunks, empty and remote experts
ROUTES = [(8, 1), (8, 3), (2, 40), (1, 300), (8, 40)]
# n, k: k on and off multiples of 128, one that reloads rows past the first pass's registers (8 rows of 2880), and
# the largest k the kernel takes
SHAPES = [(256, 512), (272, 400), (2048, 768), (512, 2880), (256, FP8_QUANTIZING_MAX_K)]


def rows16(rows: int, used: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[rows, k] values of dtype, row r at magnitude 2^(r % 9 - 4), row 1 all zeros; rows past `used` NaN."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * torch.exp2((torch.arange(rows) % 9 - 4).float())[:, None]
    if rows > 1:
        x[1] = 0.0
    x[used:] = float("nan")
    return x.to(dtype).cuda()


def run_and_check(tokens: int, top_k: int, n: int, k: int, k_split: int, static: bool, dtype: torch.dtype,
                  with_bias: bool, seed: int, scaling: Fp8Scaling = Fp8Scaling.ROWWISE, form: str = "") -> None:
    need((8, 9))
    ptu, counts = routed(tokens, top_k, seed)
    _, _, b, sb, off = case(counts, n, k, scaling, seed, pad_rows=tokens * top_k - sum(counts))
    group = 128 if scaling is Fp8Scaling.BLOCK128 else None
    used, rows = int(off[-1]), tokens * top_k
    a16 = rows16(rows, used, k, dtype, seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    weights = torch.rand(rows, generator=gen).cuda()
    bias = (torch.randn(LOCAL, n, generator=gen) * 0.1).to(dtype).cuda() if with_bias else None
    static_scale = torch.tensor([0.9 / 448], device="cuda") if static else None
    launch = "after_trigger" if torch.cuda.get_device_capability() >= (9, 0) else "plain"
    tactic = f"decode:{form}ksplit{k_split}:{launch}:plain"
    out = torch.zeros(tokens, n, dtype=dtype, device="cuda")
    K.grouped_gemm_fp8_quantizing_finalize(a16, static_scale, b, sb, off, ptu, weights, tokens, top_k, bias=bias,
                                           out=out, scaling=scaling, tactic=tactic)
    torch.cuda.synchronize()
    q, s = quantize_rows(a16[:used].cpu(), None if static_scale is None else static_scale.cpu(), group)
    pad = rows - used  # the reference's rows past the experts: zeros, never read
    q = torch.cat([q, torch.zeros(pad, k, dtype=q.dtype)]).cuda()
    s = torch.cat([s, torch.zeros(pad, s.shape[1])])
    s = (s if group else s[:, 0]).cuda()
    ref, m1, m2, untouched = finalize_reference(q, s, b, sb, off, ptu, weights, bias, scaling, tokens, top_k)
    got = out.double().cpu()
    assert not got.isnan().any(), "a row past the experts was read"
    assert (got[untouched] == 0).all(), "a token without local rows was written"
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # the atomics' rounding, per add
    bound = 2.0 ** -8 * m1 + top_k * u * m1 + accumulation_term(tactic, k, Fp8Accumulation.PROMOTED) * m2 + 1e-30
    worst = ((got - ref).abs() / bound).max().item()
    assert worst <= 1.0, (f"error {worst:.2f}x the bound ({tactic}, {scaling.name}, n={n}, k={k}, top_k={top_k}, "
                          f"static={static})")
    if top_k <= 2:
        qk, sk = K.quantize_fp8(a16, static_scale, group)
        pair = torch.zeros_like(out)
        K.grouped_gemm_fp8_finalize(qk, sk, b, sb, off, ptu, weights, tokens, top_k, scaling,
                                    out_dtype=dtype, bias=bias, out=pair, tactic=tactic)
        assert torch.equal(out, pair), "not the bytes of the quantize step and the FP8 finalize GEMM"


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("top_k,tokens", ROUTES)
@pytest.mark.parametrize("static", [False, True], ids=["per_row", "static"])
def test_quantizing_finalize(n, k, k_split, top_k, tokens, static):
    run_and_check(tokens, top_k, n, k, k_split, static, torch.bfloat16, False, seed=n + k + 7 * top_k + tokens)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("top_k,tokens", ROUTES)
@pytest.mark.parametrize("form", ["", "twocta_"], ids=["one_cta", "twocta"])
def test_quantizing_finalize_block128(n, k, k_split, top_k, tokens, form):
    """Block-128 weight scales: the rows quantized per 128-column group (both decode forms)."""
    run_and_check(tokens, top_k, n, k, k_split, False, torch.bfloat16, False, seed=3 * n + k + top_k + tokens,
                  scaling=Fp8Scaling.BLOCK128, form=form)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("scaling", [Fp8Scaling.ROWWISE, Fp8Scaling.BLOCK128], ids=["rowwise", "block128"])
def test_quantizing_finalize_dtype_and_bias(dtype, with_bias, scaling):
    run_and_check(40, 2, 272, 400, 2, False, dtype, with_bias, seed=11, scaling=scaling)


def test_quantizing_finalize_block128_refuses_a_static_scale():
    """Block-128 rows take their groups' own scales: a static one is refused by the wrapper and by the C ABI."""
    need((8, 9))
    ptu, counts = routed(4, 2, 0)
    _, _, b, sb, off = case(counts, 256, 512, Fp8Scaling.BLOCK128, 0, pad_rows=8 - sum(counts))
    a16 = torch.zeros(8, 512, dtype=torch.bfloat16, device="cuda")
    static = torch.tensor([0.01], device="cuda")
    out = torch.zeros(4, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="static_scale"):
        K.grouped_gemm_fp8_quantizing_finalize(a16, static, b, sb, off, ptu, torch.ones(8, device="cuda"), 4, 2,
                                               scaling=Fp8Scaling.BLOCK128, tactic="decode:ksplit1:plain:plain")
    with pytest.raises(KernelError, match="static one"):
        call("mb_grouped_gemm_fp8_quantizing_finalize", a16.data_ptr(), static.data_ptr(), b.data_ptr(),
             sb.data_ptr(), int(Fp8Scaling.BLOCK128), int(Fp8Accumulation.PROMOTED), None, out.data_ptr(),
             off.data_ptr(), ptu.data_ptr(), torch.ones(8, device="cuda").data_ptr(), b.shape[0], 8, 4, 2, 256, 512,
             int(DType.BF16), tactic_struct("decode:ksplit1:plain:plain"), torch.cuda.current_stream().cuda_stream)
    assert not out.any()


def test_quantizing_finalize_refusals():
    """The wgmma tactics and k past FP8_QUANTIZING_MAX_K are refused before anything runs."""
    need((8, 9))
    ptu, counts = routed(4, 2, 0)
    for k, tactic in ((512, "wgmma:pingpong64x128:plain:plain"),
                      (FP8_QUANTIZING_MAX_K + 128, "decode:ksplit1:plain:plain")):
        _, _, b, sb, off = case(counts, 256, k, Fp8Scaling.ROWWISE, 0, pad_rows=8 - sum(counts))
        a16 = torch.zeros(8, k, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(KernelError, match="quantizing"):
            K.grouped_gemm_fp8_quantizing_finalize(a16, None, b, sb, off, ptu, torch.ones(8, device="cuda"), 4, 2,
                                                   tactic=tactic)


@pytest.mark.parametrize("missing", ["permuted_to_unpermuted", "permuted_weights", "top_k"])
def test_finalize_entry_points_refuse_missing_maps(missing):
    """Both FP8 finalize entry points refuse a null token map or routing weights, or top_k 0, with the same message
    (one check for both, gemm/fp8_abi.cu's set_finalize_maps), through the C ABI itself: the wrappers would refuse
    the tensors first."""
    need((8, 9))
    ptu, counts = routed(4, 2, 0)
    a, sa, b, sb, off = case(counts, 256, 512, Fp8Scaling.ROWWISE, 0, pad_rows=8 - sum(counts))
    weights = torch.ones(8, device="cuda")
    out = torch.zeros(4, 256, dtype=torch.bfloat16, device="cuda")
    maps = 0 if missing == "permuted_to_unpermuted" else ptu.data_ptr()
    wts = 0 if missing == "permuted_weights" else weights.data_ptr()
    top_k = 0 if missing == "top_k" else 2
    tactic = tactic_struct("decode:ksplit1:plain:plain")
    stream = torch.cuda.current_stream().cuda_stream
    a16 = torch.zeros(8, 512, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(KernelError, match="missing maps"):
        call("mb_grouped_gemm_fp8_finalize", a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(),
             int(Fp8Scaling.ROWWISE), int(Fp8Accumulation.PROMOTED), None, out.data_ptr(), off.data_ptr(), maps, wts,
             b.shape[0], 8, 4, top_k, 256, 512, int(DType.BF16), tactic, None, 0, stream)
    with pytest.raises(KernelError, match="missing maps"):
        call("mb_grouped_gemm_fp8_quantizing_finalize", a16.data_ptr(), None, b.data_ptr(), sb.data_ptr(),
             int(Fp8Scaling.ROWWISE), int(Fp8Accumulation.PROMOTED), None, out.data_ptr(), off.data_ptr(), maps, wts, b.shape[0], 8, 4, top_k,
             256, 512, int(DType.BF16), tactic, stream)
    assert not out.any()  # refused before anything ran
