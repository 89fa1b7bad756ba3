"""The FP8 grouped GEMM (mb_grouped_gemm_fp8, and mb_grouped_gemm_fp8_finalize below) against an fp64 reference,
every kernel and tile as a tactic.

Fresh random e4m3 operands and positive fp32 scales for every case; the reference dequantizes them exactly
(every e4m3 value times an fp32 scale is exact in fp64) and multiplies in fp64, per 128-k block for the
block-scaled mode exactly as the header defines it. Outputs are poisoned with NaN first: every row of an
expert is checked written and rows past the last expert's untouched. Uneven and empty expert segments,
n and k on and off multiples of 128 (and multiples of 128 but not of 256: odd counts of 128-column tiles
and k blocks).

Error bound, per output element: |C - ref| <= 2^-8 |ref| + c S, S = sum_k |a_k b_k| (scaled). The first
term is the bf16 / fp16 rounding of the output (2^-9, doubled for the scale products' fp32 rounding); the
second the accumulation: c = 2^-12 for the decode kernel (mma.sync sums in fp32), c = 2^-10 for the wgmma
kernel, whose FP8 tensor-core sums keep about 14 bits inside each 128-k block before they are added into
fp32 registers (CUTLASS's promotion interval; DeepSeek-V3's report measured the same limit). Measured on
an H200 over this file's cases: decode within 2^-12 S, wgmma up to 2^-11.5 S. With fast accumulation
(rowwise scales) the tensor cores carry the sum over the whole k: each of the k / 32 wgmma k-steps adds into
an accumulator no larger than S with about 14 bits, so c = max(2^-10, (k / 32) 2^-13).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling  # noqa: E402
from moe_build.kernels.ops import fp8_scale_shapes  # noqa: E402
from moe_build.planner.tactics import GemmCall, RowCount, choose_tactic  # noqa: E402
from moe_build.runner.runner import device_target  # noqa: E402
from finalize_routing import LOCAL, routed  # noqa: E402

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


def accumulation_term(tactic: str, k: int, accumulation: Fp8Accumulation) -> float:
    """c of the bound above: the decode kernel's, the wgmma kernel's promoted or fast accumulation's."""
    if tactic.startswith("decode"):
        return 2.0 ** -12
    return max(2.0 ** -10, k / 32 * 2.0 ** -13) if accumulation is Fp8Accumulation.FAST else 2.0 ** -10


def run_and_check(counts, n, k, scaling, tactic, out_dtype=torch.bfloat16, with_bias=False, seed=0,
                  accumulation=Fp8Accumulation.PROMOTED):
    a, sa, b, sb, off = case(counts, n, k, scaling, seed)
    bias = (torch.randn(len(counts), n, generator=torch.Generator().manual_seed(seed + 1)) * 0.1).to(
        out_dtype).cuda() if with_bias else None
    c = torch.full((a.shape[0], n), float("nan"), dtype=out_dtype, device="cuda")
    K.grouped_gemm_fp8(a, sa, b, sb, off, scaling, out_dtype=out_dtype, bias=bias, c=c, accumulation=accumulation,
                       tactic=tactic)
    torch.cuda.synchronize()
    ref, mag = reference(a, sa, b, sb, off, scaling, bias)
    used = int(off[-1])
    got = c.double().cpu()
    assert not got[:used].isnan().any(), "an expert row was not written"
    assert got[used:].isnan().all(), "a row past the last expert was written"
    err = (got[:used] - ref[:used]).abs()
    c = accumulation_term(tactic, k, accumulation)
    bound = 2.0 ** -8 * ref[:used].abs() + c * mag[:used] + 1e-30
    worst = (err / bound).max().item() if used else 0.0
    assert worst <= 1.0, f"error {worst:.2f}x the bound ({tactic}, {scaling.name}, {accumulation.name}, n={n}, k={k})"


SHAPES = [(256, 512), (272, 400), (768, 2048), (2048, 768), (384, 640)]
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


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("counts", ["uneven", "wide"])
def test_decode_twocta(n, k, k_split, counts):
    """The block-128 decode kernel held to two CTAs an SM (tile twocta, its spills included); rowwise refuses it."""
    need((8, 9))
    launch = "after_trigger" if capability() >= (9, 0) else "plain"
    tactic = f"decode:twocta_ksplit{k_split}:{launch}:plain"
    run_and_check(COUNTS[counts], n, k, Fp8Scaling.BLOCK128, tactic, seed=2 * n + k + k_split)
    with pytest.raises(K.KernelError, match="twocta"):
        run_and_check(COUNTS[counts], n, k, Fp8Scaling.ROWWISE, tactic, seed=1)


WGMMA_TILES = {Fp8Scaling.ROWWISE: ["coop128x128", "coop128x256", "pingpong64x128", "pingpong64x128c2", "coop128x128c2",
                                    "coop128x192", "coop128x192c2", "pingpong128x128", "pingpong128x128c2"],
               Fp8Scaling.BLOCK128: ["coop128x128", "pingpong64x128", "pingpong64x128c2", "coop128x128c2"]}
# Tiles with no registers for promoted accumulators (a warpgroup's 128 x 128 fp32 tile): fast accumulation only.
FAST_ONLY_TILES = ["pingpong128x128", "pingpong128x128c2"]


def refused_promoted(tile: str, accumulation: Fp8Accumulation, run) -> bool:
    """Whether `tile` takes fast accumulation only and `accumulation` is promoted; if so, checks that `run()` is
    refused with UNSUPPORTED (before anything is launched)."""
    if tile not in FAST_ONLY_TILES or accumulation is not Fp8Accumulation.PROMOTED:
        return False
    with pytest.raises(K.KernelError) as info:
        run()
    assert info.value.status == K.Status.UNSUPPORTED, tile
    return True
# The tiles that read fewer L2 bytes per FLOP: 2x1 clusters multicasting the weight tile, and 128 x 192.
WIDE_TILES = ["coop128x128c2", "coop128x192", "coop128x192c2", "pingpong64x128c2"]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.ROWWISE])
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
    check = lambda: run_and_check(COUNTS[counts], n, k, scaling, tactic, seed=n * 3 + k)  # noqa: E731
    if not refused_promoted(tile, Fp8Accumulation.PROMOTED, check):
        check()


@pytest.mark.parametrize("n,k", SHAPES + [(512, 4096)])
@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.ROWWISE])
@pytest.mark.parametrize("counts", ["uneven", "wide"])
def test_wgmma_fast_accumulation(n, k, tile, counts):
    """Every rowwise tile with fast accumulation (the plan's fp8_accumulation=fast), k up to 4096."""
    need((9, 0), exact=True)
    run_and_check(COUNTS[counts], n, k, Fp8Scaling.ROWWISE, f"wgmma:{tile}:plain:plain", seed=n * 5 + k,
                  accumulation=Fp8Accumulation.FAST)


@pytest.mark.parametrize("k", [128, 256, 384, 4224, 4160])
@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.BLOCK128])
def test_wgmma_block128_k_tiles(k, tile):
    """The blockwise mainloop weighs each 128-k tile's sums by that tile's scales: 1, 2 and 3 k tiles (a pipeline's
    first, second and steady iterations), 33 (odd, long) and 33 with the last partial; each tile's scales are
    independent draws over 0.001-0.021 (`case`), so a sum weighed by its neighbour's scales fails the bound."""
    need((9, 0), exact=True)
    run_and_check(COUNTS["wide"], 384, k, Fp8Scaling.BLOCK128, f"wgmma:{tile}:plain:plain", seed=k + len(tile))


@pytest.mark.parametrize("kernel", ["decode", "wgmma"])
def test_fast_accumulation_needs_rowwise_scales(kernel):
    """Block-128 scales weigh each 128-k block's sum as it is promoted: fast accumulation is refused with them, by
    either kernel (the plan never asks for it)."""
    need((9, 0), exact=True)
    a, sa, b, sb, off = case([4, 4], 256, 256, Fp8Scaling.BLOCK128, 0)
    tactic = "decode:ksplit1:plain:plain" if kernel == "decode" else "wgmma:coop128x128:plain:plain"
    with pytest.raises(K.KernelError) as info:
        K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.BLOCK128, accumulation=Fp8Accumulation.FAST, tactic=tactic)
    assert info.value.status == K.Status.UNSUPPORTED


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
    device = device_target(torch.device("cuda"), 1)
    call = GemmCall(sm=90, entry="sm90", epilogue="store", n=n, k=k, experts=experts, top_k=top_k, itemsize=1,
                    weights_blocked=False, sm_count=device.sm_count, l2_bytes=device.l2_bytes,
                    memory_bytes_per_s=device.memory_bytes_per_s,
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


# ---- GEMM2 with the finalize epilogue (mb_grouped_gemm_fp8_finalize) --------------------------------------
#
# Routing (tests/gpu/finalize_routing.py): tokens pick top_k distinct experts among LOCAL experts (two of them never
# picked: empty segments; one picked about 20 times as often as the others: its segment runs to hundreds of rows)
# and REMOTE ones (another rank's: their permuted rows are sorted after the local experts', past off[E], and must
# reach no output). The expected output is computed here in fp64 from `reference` above: each permuted row's scaled
# product (+ bias) times its routing weight, added into its token's row. Outputs are pre-zeroed (the kernel
# adds into them); a token whose experts are all remote must stay exactly zero, and a pre-filled output
# must come back as that fill plus the same sum (the kernel adds, it does not store).
#
# Error bound, per output element, with M1 = sum_j |w_j ref_j| and M2 = sum_j |w_j| S_j over the token's
# local rows j: |out - ref| <= (2^-8 + top_k u) M1 + c M2. The first term is the store bound above on each
# weighted row (its bf16 / fp16 rounding before the atomic add, and the scale products' fp32 rounding); the
# second is the atomics: each of the top_k adds rounds the running sum (at most M1, plus |fill| where the output
# was pre-filled) to the output dtype, in whichever order the rows arrive, u being its unit roundoff (bf16 2^-8,
# fp16 2^-11); c is the accumulation term of the store bound (2^-12 decode, 2^-10 wgmma).



def finalize_case(tokens: int, top_k: int, n: int, k: int, scaling: Fp8Scaling, seed: int, with_bias: bool,
                  out_dtype=torch.bfloat16):
    ptu, counts = routed(tokens, top_k, seed)
    a, sa, b, sb, off = case(counts, n, k, scaling, seed, pad_rows=tokens * top_k - sum(counts))
    gen = torch.Generator().manual_seed(seed + 2)
    weights = torch.rand(tokens * top_k, generator=gen).cuda()
    bias = (torch.randn(LOCAL, n, generator=gen) * 0.1).to(out_dtype).cuda() if with_bias else None
    return a, sa, b, sb, off, ptu, weights, bias


def finalize_reference(a, sa, b, sb, off, ptu, weights, bias, scaling, tokens: int, top_k: int):
    """(out, M1, M2, tokens with no local row) in fp64: see the bound above."""
    rows, mag = reference(a, sa, b, sb, off, scaling, bias)
    used = int(off[-1])
    token = (ptu.cpu().long() // top_k)[:used]
    w = weights.cpu().double()[:used, None]
    n = b.shape[1]
    out, m1, m2 = (torch.zeros(tokens, n, dtype=torch.float64).index_add_(0, token, x)
                   for x in (w * rows[:used], w.abs() * rows[:used].abs(), w.abs() * mag[:used]))
    untouched = torch.ones(tokens, dtype=torch.bool)
    untouched[token] = False
    return out, m1, m2, untouched


def run_finalize_and_check(tokens: int, top_k: int, n: int, k: int, scaling: Fp8Scaling, tactic: str,
                           with_bias: bool = False, out_dtype=torch.bfloat16, seed: int = 0, prefill: bool = False,
                           accumulation: Fp8Accumulation = Fp8Accumulation.PROMOTED):
    a, sa, b, sb, off, ptu, weights, bias = finalize_case(tokens, top_k, n, k, scaling, seed, with_bias, out_dtype)
    fill = (torch.randn(tokens, n, generator=torch.Generator().manual_seed(seed + 3)).to(out_dtype).cuda()
            if prefill else torch.zeros(tokens, n, dtype=out_dtype, device="cuda"))
    out = fill.clone()
    K.grouped_gemm_fp8_finalize(a, sa, b, sb, off, ptu, weights, tokens, top_k, scaling, out_dtype=out_dtype,
                                bias=bias, out=out, accumulation=accumulation, tactic=tactic)
    torch.cuda.synchronize()
    ref, m1, m2, untouched = finalize_reference(a, sa, b, sb, off, ptu, weights, bias, scaling, tokens, top_k)
    got = out.double().cpu() - fill.double().cpu()  # exact: the fill is added to, then taken off in fp64
    assert torch.equal(out.cpu()[untouched], fill.cpu()[untouched]), "a token without local rows was written"
    c = accumulation_term(tactic, k, accumulation)
    u = 2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -11  # the atomics' rounding, per add
    bound = 2.0 ** -8 * m1 + top_k * u * (m1 + fill.double().cpu().abs()) + c * m2 + 1e-30
    worst = ((got - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound ({tactic}, {scaling.name}, n={n}, k={k}, top_k={top_k})"


# (top_k, tokens): rows per local expert from 0 (the empty ones, and most at 3 tokens) to hundreds (the heavy
# one at 300 tokens: more than two 128-row tiles)
FINALIZE_ROUTES = [(1, 300), (2, 300), (3, 40), (8, 3), (8, 40)]
FINALIZE_SHAPES = [(256, 512), (272, 400), (2048, 768), (384, 640)]  # n, k on and off multiples of 128 (and 256)
WGMMA_CASES = [(s, t) for s in SCALINGS for t in WGMMA_TILES[s]]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("n,k", FINALIZE_SHAPES)
@pytest.mark.parametrize("k_split", [1, 4])
@pytest.mark.parametrize("top_k,tokens", FINALIZE_ROUTES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_finalize_decode(scaling, n, k, k_split, top_k, tokens, with_bias):
    need((8, 9))
    launch = "after_trigger" if capability() >= (9, 0) else "plain"
    run_finalize_and_check(tokens, top_k, n, k, scaling, f"decode:ksplit{k_split}:{launch}:plain", with_bias,
                           seed=n + k + top_k * 7 + tokens)


@pytest.mark.parametrize("scaling,tile", WGMMA_CASES, ids=[f"{s.name.lower()}-{t}" for s, t in WGMMA_CASES])
@pytest.mark.parametrize("n,k", FINALIZE_SHAPES)
@pytest.mark.parametrize("top_k,tokens", FINALIZE_ROUTES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_finalize_wgmma(scaling, tile, n, k, top_k, tokens, with_bias):
    need((9, 0), exact=True)
    check = lambda: run_finalize_and_check(tokens, top_k, n, k, scaling, f"wgmma:{tile}:plain:plain",  # noqa: E731
                                           with_bias, seed=n * 3 + k + top_k * 7 + tokens)
    if not refused_promoted(tile, Fp8Accumulation.PROMOTED, check):
        check()


@pytest.mark.parametrize("tile", WGMMA_TILES[Fp8Scaling.ROWWISE])
@pytest.mark.parametrize("n,k", FINALIZE_SHAPES)
@pytest.mark.parametrize("top_k,tokens", FINALIZE_ROUTES)
def test_finalize_wgmma_fast_accumulation(tile, n, k, top_k, tokens):
    need((9, 0), exact=True)
    run_finalize_and_check(tokens, top_k, n, k, Fp8Scaling.ROWWISE, f"wgmma:{tile}:after_trigger:evict_last", True,
                           seed=n * 5 + k + top_k * 7 + tokens, accumulation=Fp8Accumulation.FAST)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("tactic", ["decode:ksplit2:after_trigger:plain", "wgmma:coop128x128:after_trigger:evict_last",
                                    "wgmma:pingpong64x128:after_trigger:evict_last"])
def test_finalize_dtype_trigger_evict_last_and_prefill(scaling, out_dtype, tactic):
    """The runner's launches (after a trigger, evict_last atomics) in both output dtypes, into a pre-filled out."""
    need((9, 0), exact=True)
    run_finalize_and_check(40, 2, 256, 384, scaling, tactic, with_bias=True, out_dtype=out_dtype, seed=11,
                           prefill=True)


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.name.lower())
@pytest.mark.parametrize("tokens", [1, 16, 31, 32, 512, 1025])
def test_finalize_planner_tactic(scaling, tokens):
    """The tactic the planner picks for a Qwen3-shaped GEMM2 with the finalize epilogue (n 2048, k 768) at each
    token count, routed over LOCAL experts (rows per expert from tokens * top_k / 12)."""
    need((9, 0), exact=True)
    top_k, n, k = 8, 2048, 768
    device = device_target(torch.device("cuda"), 1)
    call = GemmCall(sm=90, entry="sm90", epilogue="finalize", n=n, k=k, experts=LOCAL, top_k=top_k, itemsize=1,
                    weights_blocked=False, sm_count=device.sm_count, l2_bytes=device.l2_bytes,
                    memory_bytes_per_s=device.memory_bytes_per_s,
                    fp8="rowwise" if scaling is Fp8Scaling.ROWWISE else "block128")
    tactic = choose_tactic(call, RowCount(tokens, top_k, LOCAL))
    run_finalize_and_check(tokens, top_k, n, k, scaling, tactic.name, seed=tokens)


WIDE_CASES = [(s, t) for s in SCALINGS for t in WIDE_TILES if t in WGMMA_TILES[s]]
# Rows per expert against 128-row tiles: 3, 2, 5 and 1 row tiles (odd counts: a split unit per column pair in
# 2x1 clusters), none a multiple of 128 but the last, two experts empty.
WIDE_COUNTS = [300, 0, 129, 513, 1, 0, 128]


@pytest.mark.parametrize("scaling,tile", WIDE_CASES, ids=[f"{s.name.lower()}-{t}" for s, t in WIDE_CASES])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("epilogue", ["store", "finalize"])
@pytest.mark.parametrize("n,k", [(384, 640), (640, 384)])
def test_wide_tiles_dtypes_and_epilogues(scaling, tile, out_dtype, epilogue, n, k):
    """The 2x1-cluster and 128x192 tiles in both output dtypes and both epilogues, launched as the runner
    launches them (after a trigger; finalize under evict_last into a pre-filled output), with a bias, on n and k
    that are multiples of 128 but not of 256 (3 or 5 column tiles of 128, 2 or 4 of 192: a cluster's split unit
    with one empty tile) and experts with odd row-tile counts and none."""
    need((9, 0), exact=True)
    seed = n + k + WIDE_TILES.index(tile) * 5 + (out_dtype == torch.float16)
    if epilogue == "store":
        run_and_check(WIDE_COUNTS, n, k, scaling, f"wgmma:{tile}:after_trigger:plain", out_dtype=out_dtype,
                      with_bias=True, seed=seed)
    else:
        run_finalize_and_check(300, 2, n, k, scaling, f"wgmma:{tile}:after_trigger:evict_last", with_bias=True,
                               out_dtype=out_dtype, seed=seed, prefill=True)


def test_finalize_refusals():
    need((9, 0), exact=True)
    a, sa, b, sb, off, ptu, weights, _ = finalize_case(8, 2, 256, 256, Fp8Scaling.ROWWISE, 0, False)
    args = (a, sa, b, sb, off, ptu, weights, 8, 2, Fp8Scaling.ROWWISE)
    for tactic, status in [("wgmma:pingpong64x128:placed:plain", K.Status.INVALID_ARGUMENT),
                           ("decode:ksplit1:plain:evict_last", K.Status.INVALID_ARGUMENT),
                           ("mma:64x128:plain:plain", K.Status.UNSUPPORTED)]:
        with pytest.raises(K.KernelError) as info:
            K.grouped_gemm_fp8_finalize(*args, tactic=tactic)
        assert info.value.status == status, tactic
    a, sa, b, sb, off, ptu, weights, _ = finalize_case(8, 2, 256, 256, Fp8Scaling.BLOCK128, 0, False)
    for tile in ("coop128x256", "coop128x192", "coop128x192c2"):  # rowwise only
        with pytest.raises(K.KernelError) as info:
            K.grouped_gemm_fp8_finalize(a, sa, b, sb, off, ptu, weights, 8, 2, Fp8Scaling.BLOCK128,
                                        tactic=f"wgmma:{tile}:plain:plain")
        assert info.value.status == K.Status.UNSUPPORTED, tile
    # evict_last is the finalize epilogue's: the plain store refuses it
    a, sa, b, sb, off = case([4, 4], 256, 256, Fp8Scaling.ROWWISE, 0)
    with pytest.raises(K.KernelError) as info:
        K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.ROWWISE, tactic="wgmma:coop128x128:plain:evict_last")
    assert info.value.status == K.Status.INVALID_ARGUMENT
