"""The FP8 grouped GEMM (mb_grouped_gemm_fp8) against an fp64 reference, every kernel and tile as a tactic.

Fresh random e4m3 operands and positive fp32 scales for every case; the reference dequantizes them exactly
(every e4m3 value times an fp32 scale is exact in fp64) and multiplies in fp64, per 128-k block for the
block-scaled mode exactly as the header defines it. Outputs are poisoned with NaN first: every row of an
expert is checked written and rows past the last expert's untouched. Uneven and empty expert segments,
n and k on and off multiples of 128.

Error bound, per output element: |C - ref| <= 2^-8 |ref| + c S, S = sum_k |a_k b_k| (scaled). The first
term is the bf16 / fp16 rounding of the output (2^-9, doubled for the scale products' fp32 rounding); the
second the accumulation: c = 2^-12 for the decode kernel (mma.sync sums in fp32), c = 2^-10 for the wgmma
kernel, whose FP8 tensor-core sums keep about 14 bits inside each 128-k block before they are added into
fp32 registers (CUTLASS's promotion interval; DeepSeek-V3's report measured the same limit). Measured on
an H200 over this file's cases: decode within 2^-12 S, wgmma up to 2^-11.5 S.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.kernels.abi import Fp8Scaling  # noqa: E402
from moe_build.kernels.ops import fp8_scale_shapes  # noqa: E402
from moe_build.planner.tactics import GemmCall, RowCount, choose_tactic  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

FP8 = torch.float8_e4m3fn


def capability() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def need(cc: tuple[int, int], exact: bool = False) -> None:
    have = capability()
    if (have != cc) if exact else (have < cc):
        pytest.skip(f"needs compute capability {'' if exact else '>= '}{cc[0]}.{cc[1]}, this device has "
                    f"{have[0]}.{have[1]}")


def random_fp8(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """e4m3 values spread over the format's range (some exact zeros and subnormals included)."""
    x = torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-6, 7, shape, generator=gen).float())
    return x.clamp(-448, 448).to(FP8).cuda()


def case(counts: list[int], n: int, k: int, scaling: Fp8Scaling, seed: int, pad_rows: int = 5):
    """A, B, scales and offsets for experts with `counts` rows each (plus `pad_rows` rows past the last
    expert, which the GEMM must not write)."""
    gen = torch.Generator().manual_seed(seed)
    e, rows = len(counts), sum(counts) + pad_rows
    a = random_fp8(rows, k, gen=gen)
    b = random_fp8(e, n, k, gen=gen)
    sa_shape, sb_shape = fp8_scale_shapes(scaling, rows, e, n, k)
    sa = (torch.rand(sa_shape, generator=gen) * 0.02 + 1e-3).cuda()
    sb = (torch.rand(sb_shape, generator=gen) * 0.02 + 1e-3).cuda()
    off = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0).cuda()
    return a, sa, b, sb, off


def reference(a, sa, b, sb, off, scaling: Fp8Scaling, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, S) in fp64 over the experts' rows: C the scaled products summed as the header defines, S the
    sum of their absolute values (the accumulation bound's scale)."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    sa64, sb64 = sa.double().cpu(), sb.double().cpu()
    k = a.shape[1]
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    mag = torch.zeros_like(out)
    offs = off.cpu().tolist()
    for x in range(b.shape[0]):
        lo, hi = offs[x], offs[x + 1]
        if lo == hi:
            continue
        if scaling is Fp8Scaling.ROWWISE:
            aa = a64[lo:hi] * sa64[lo:hi, None]
            bb = b64[x] * sb64[x][:, None]
        else:
            cols = torch.arange(k) // 128
            aa = a64[lo:hi] * sa64[lo:hi][:, cols]
            bb = b64[x] * sb64[x].repeat_interleave(128, dim=0)[: b.shape[1]][:, cols]
        out[lo:hi] = aa @ bb.T
        mag[lo:hi] = aa.abs() @ bb.abs().T
        if bias is not None:
            out[lo:hi] += bias[x].double().cpu()
    return out, mag


def run_and_check(counts, n, k, scaling, tactic, out_dtype=torch.bfloat16, with_bias=False, seed=0):
    a, sa, b, sb, off = case(counts, n, k, scaling, seed)
    bias = (torch.randn(len(counts), n, generator=torch.Generator().manual_seed(seed + 1)) * 0.1).to(
        out_dtype).cuda() if with_bias else None
    c = torch.full((a.shape[0], n), float("nan"), dtype=out_dtype, device="cuda")
    K.grouped_gemm_fp8(a, sa, b, sb, off, scaling, out_dtype=out_dtype, bias=bias, c=c, tactic=tactic)
    torch.cuda.synchronize()
    ref, mag = reference(a, sa, b, sb, off, scaling, bias)
    used = int(off[-1])
    got = c.double().cpu()
    assert not got[:used].isnan().any(), "an expert row was not written"
    assert got[used:].isnan().all(), "a row past the last expert was written"
    err = (got[:used] - ref[:used]).abs()
    c = 2.0 ** -12 if tactic.startswith("decode") else 2.0 ** -10
    bound = 2.0 ** -8 * ref[:used].abs() + c * mag[:used] + 1e-30
    worst = (err / bound).max().item() if used else 0.0
    assert worst <= 1.0, f"error {worst:.2f}x the bound ({tactic}, {scaling.name}, n={n}, k={k})"


SHAPES = [(256, 512), (272, 400), (768, 2048), (2048, 768)]
COUNTS = {"uneven": [3, 0, 17, 1, 0, 9, 40, 2], "one": [1], "wide": [255, 0, 257, 130]}
SCALINGS = [Fp8Scaling.ROWWISE, Fp8Scaling.BLOCK128]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("counts", ["uneven", "one"])
def test_decode(scaling, n, k, k_split, counts):
    need((8, 9))
    launch = "after_trigger" if capability() >= (9, 0) else "plain"
    run_and_check(COUNTS[counts], n, k, scaling, f"decode:ksplit{k_split}:{launch}:plain", seed=n + k + k_split)


WGMMA_TILES = {Fp8Scaling.ROWWISE: ["coop128x128", "coop128x256", "pingpong64x128"],
               Fp8Scaling.BLOCK128: ["coop128x128", "pingpong64x128"]}


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("tile", ["coop128x128", "coop128x256", "pingpong64x128"])
@pytest.mark.parametrize("counts", ["uneven", "wide"])
def test_wgmma(scaling, n, k, tile, counts):
    need((9, 0), exact=True)
    tactic = f"wgmma:{tile}:plain:plain"
    if tile not in WGMMA_TILES[scaling]:
        a, sa, b, sb, off = case(COUNTS[counts], n, k, scaling, 0)
        with pytest.raises(K.KernelError) as info:
            K.grouped_gemm_fp8(a, sa, b, sb, off, scaling, tactic=tactic)
        assert info.value.status == K.Status.UNSUPPORTED
        return
    run_and_check(COUNTS[counts], n, k, scaling, tactic, seed=n * 3 + k)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kernel", ["decode", "wgmma"])
def test_bias_dtype_and_trigger(scaling, out_dtype, kernel):
    need((9, 0), exact=kernel == "wgmma")
    tactic = "decode:ksplit2:after_trigger:plain" if kernel == "decode" else "wgmma:coop128x128:after_trigger:plain"
    run_and_check(COUNTS["uneven"], 256, 384, scaling, tactic, out_dtype=out_dtype, with_bias=True, seed=7)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("tokens", [1, 16, 255, 256, 257, 8192])
def test_planner_tactic(scaling, tokens):
    """The tactic the planner picks for a Qwen3-shaped GEMM1 (128 experts, top-8) at each token count."""
    need((9, 0), exact=True)
    experts, top_k, n, k = 128, 8, 1536, 2048
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    call = GemmCall(sm=90, entry="sm90", epilogue="store", n=n, k=k, experts=experts, top_k=top_k, itemsize=1,
                    weights_blocked=False, sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                    fp8="rowwise" if scaling is Fp8Scaling.ROWWISE else "block128")
    tactic = choose_tactic(call, RowCount(tokens, top_k, experts))
    ids = torch.randint(0, experts, (tokens * top_k,), generator=torch.Generator().manual_seed(tokens))
    counts = torch.bincount(ids, minlength=experts).tolist()
    run_and_check(counts, n, k, scaling, tactic.name, seed=tokens)


def test_refusals():
    need((9, 0), exact=True)
    a, sa, b, sb, off = case([4, 4], 256, 256, Fp8Scaling.ROWWISE, 0)
    with pytest.raises(K.KernelError) as info:
        K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.ROWWISE, tactic="mma:64x128:plain:plain")
    assert info.value.status == K.Status.UNSUPPORTED
    with pytest.raises(K.KernelError) as info:
        K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.ROWWISE, tactic="wgmma:coop128x256:placed:plain")
    assert info.value.status == K.Status.INVALID_ARGUMENT
