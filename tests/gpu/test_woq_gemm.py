"""The weight-only grouped GEMM (mb_grouped_gemm_woq) against an fp64 reference: both kernels (decode with every K
split, mma with both tiles), every kind and group; GEMM2's finalize epilogue on the decode kernels
(mb_grouped_gemm_woq_finalize, its own bound below).

Fresh random packed weights in moe_build/weights/woq.py's canonical forms for every case; the reference
dequantizes them with woq.py's exact rule (`dequantize_matrix`, fp64) and multiplies in fp64. The kernels read int4
codes in rows and in 16-row tiles (`int4_form`; woq.int4_tiles moves the same bytes, tests/test_woq_tiles.py checks
where each lands against the header's statement). Outputs are
poisoned with NaN first: every row of an expert must be written and rows past the last expert left alone.
Uneven and empty expert segments: up to 40 rows for the decode kernel (several 8-row chunks), up to 700 for the
mma kernel (several 64- and 128-row tiles, a partial last one, and 40 experts), n and k on and off multiples of 128.

Error bound, per output element: |C - ref| <= 2^-8 (|ref| + S), S = sum_k |a_k w_k|. The kernel rounds each
dequantized weight to the activation type (2^-9 relative for bf16, 2^-12 for fp16) and sums in fp32; the
output is rounded once more (2^-9 |ref|). Both terms doubled for slack; fp16 is held to the same bound. (Both
kernels' int4 weights may land one unit in the last place from the fp32 product's rounding: inside the slack.)
The decode kernel's int4 codes path (group 128, 64 or per row) rounds no weight: the mma takes the exact integers u - z,
sums their products with the activations in fp32, and each sum is scaled once after (one more fp32 rounding), far
inside the same bound.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.planner.tactics import GemmCall  # noqa: E402
from moe_build.planner.tactics.woq import STAGED_CLUSTER_PARTS, woq_digits_rows, woq_staged_rows  # noqa: E402
from moe_build.target import DEFAULT_GPU  # noqa: E402
from moe_build.weights.woq import WoqKind, dequantize_matrix, int4_tiles, mxfp4_quarters  # noqa: E402
from finalize_routing import REMOTE, routed  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]


def case(kind: WoqKind, counts: list[int], n: int, k: int, group: int, zeros: bool, bias: bool,
         dtype: torch.dtype, seed: int, pad_rows: int = 5, e8m0: tuple[int, int] = (120, 130), a_scale: float = 1.0):
    """Operands for experts with `counts` rows each (plus `pad_rows` rows past the last expert) and the fp64
    reference output of every expert's rows; MXFP4 scale exponents drawn from [e8m0[0], e8m0[1]), activations
    standard normal times `a_scale`."""
    g = torch.Generator().manual_seed(seed)
    e, rows = len(counts), sum(counts) + pad_rows
    a = (torch.randn(rows, k, generator=g) * a_scale).to(dtype)
    if kind is WoqKind.INT8:
        b = torch.randint(-128, 128, (e, n, k), generator=g, dtype=torch.int8)
    else:
        b = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
    groups = k // 32 if kind is WoqKind.MXFP4 else (1 if group == 0 else k // group)
    if kind is WoqKind.MXFP4:
        scales = torch.randint(*e8m0, (e, n, groups), generator=g, dtype=torch.uint8)  # default 2^-7 .. 2^2
    else:
        scales = torch.rand(e, n, groups, generator=g) * 0.02 + 1e-3
    z = torch.randint(0, 16, (e, n, groups), generator=g, dtype=torch.uint8) if zeros else None
    bias_t = torch.randn(e, n, generator=g).to(dtype) if bias else None
    off = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0)
    ref = torch.zeros(rows, n, dtype=torch.float64)
    mag = torch.zeros(rows, n, dtype=torch.float64)
    for x in range(e):
        lo, hi = int(off[x]), int(off[x + 1])
        if lo == hi:
            continue
        w = dequantize_matrix(kind, b[x], scales[x], None if z is None else z[x])  # [n, k] fp64, exact
        ax = a[lo:hi].double()
        ref[lo:hi] = ax @ w.t() + (0 if bias_t is None else bias_t[x].double())
        mag[lo:hi] = ax.abs() @ w.abs().t()
    dev = {"a": a.cuda(), "b": b.cuda(),
           "scales": scales.cuda(), "zeros": None if z is None else z.cuda(),
           "bias": None if bias_t is None else bias_t.cuda(), "off": off.cuda()}
    return dev, ref, mag, int(off[-1])


def a_operand(dev: dict, tactic: str, group: int, kind: WoqKind = WoqKind.INT4) -> torch.Tensor:
    """case()'s A as `tactic` takes it: the token digits of its rows for the digits tile (K.token_digits, laid out
    for the weights' group: 32 or 64, or 128's order for the rest of int4; group 32's for int8), else A."""
    order = 32 if kind is WoqKind.INT8 else group if group in (32, 64) else 128
    return K.token_digits(dev["a"], group=order) if ":digits_" in tactic else dev["a"]


INT4_FORMS = ["rows", "tiles"]


def b_operand(dev: dict, tactic: str, kind: WoqKind, int4_form: str = "rows"
              ) -> tuple[torch.Tensor, str, torch.Tensor]:
    """case()'s weights as `tactic` takes them (B, kind, scales): MXFP4 in its quarters order for the digits tile
    (woq.mxfp4_quarters; the reference dequantizes the stored form), int4 in 16-row tiles for int4_form "tiles"
    (woq.int4_tiles), else as stored."""
    if kind is WoqKind.MXFP4 and ":digits_" in tactic:
        codes, exponents = mxfp4_quarters(dev["b"], dev["scales"])
        return codes, "mxfp4_quarters", exponents
    if kind is WoqKind.INT4 and int4_form == "tiles":
        return int4_tiles(dev["b"]), "int4_tiles", dev["scales"]
    return dev["b"], kind.value, dev["scales"]


def gemm(dev: dict, kind: WoqKind, group: int, rows: int, n: int, dtype: torch.dtype, tactic: str,
         int4_form: str = "rows") -> torch.Tensor:
    """The kernel's output for case()'s device operands, into a NaN-poisoned C, as fp64 on the CPU."""
    c = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
    b, b_kind, scales = b_operand(dev, tactic, kind, int4_form)
    K.grouped_gemm_woq(a_operand(dev, tactic, group, kind), b, b_kind, scales, dev["off"], group,
                       zeros=dev["zeros"], bias=dev["bias"], c=c, tactic=tactic, out_dtype=dtype)
    torch.cuda.synchronize()
    return c.double().cpu()


def run(kind: WoqKind, counts: list[int], n: int, k: int, group: int, zeros: bool = False, bias: bool = False,
        dtype: torch.dtype = torch.bfloat16, tactic: str = "decode:ksplit1:plain:plain",
        e8m0: tuple[int, int] = (120, 130), a_scale: float = 1.0, int4_form: str = "rows") -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    dev, ref, mag, used = case(kind, counts, n, k, group, zeros, bias, dtype, seed, e8m0=e8m0, a_scale=a_scale)
    got = gemm(dev, kind, group, ref.shape[0], n, dtype, tactic, int4_form)
    where = f"(seed {seed}, {kind.value} {int4_form}, counts {counts}, n {n}, k {k}, group {group}, {tactic})"
    assert torch.isfinite(got[:used]).all(), f"unwritten rows {where}"
    assert torch.isnan(got[used:]).all(), f"rows past the last expert written {where}"
    excess = (got[:used] - ref[:used]).abs() - 2.0 ** -8 * (ref[:used].abs() + mag[:used])
    assert float(excess.max()) <= 0, f"error over the bound by {float(excess.max()):.3g} {where}"


COUNTS = [[1], [3, 0, 5, 8], [9, 0, 16, 1, 40, 2], [0, 0, 7]]


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("counts", COUNTS, ids=["1", "3-0-5-8", "9-0-16-1-40-2", "0-0-7"])
@pytest.mark.parametrize("group, zeros", [(32, False), (64, True), (128, True), (0, False)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_against_fp64(k_split: int, counts: list[int], group: int, zeros: bool, int4_form: str) -> None:
    run(WoqKind.INT4, counts, 256, 512, group, zeros=zeros, tactic=f"decode:ksplit{k_split}:plain:plain",
        int4_form=int4_form)


@pytest.mark.parametrize("k_split", [1, 2, 8])
@pytest.mark.parametrize("group", [0, 128])
def test_int8_against_fp64(k_split: int, group: int) -> None:
    run(WoqKind.INT8, [3, 0, 12, 8], 144, 384, group, tactic=f"decode:ksplit{k_split}:plain:plain")


@pytest.mark.parametrize("k_split", [1, 4])
@pytest.mark.parametrize("n, k", [(128, 2880), (2880, 128), (144, 352)])
def test_mxfp4_against_fp64(k_split: int, n: int, k: int) -> None:
    run(WoqKind.MXFP4, [2, 9, 0, 4], n, k, 32, tactic=f"decode:ksplit{k_split}:plain:plain")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("launch", ["plain", "after_trigger"])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_bias_dtype_launch_and_sizes_off_128(dtype: torch.dtype, launch: str, int4_form: str) -> None:
    run(WoqKind.INT4, [5, 8, 1], 208, 352, 32, zeros=True, bias=True, dtype=dtype,
        tactic=f"decode:ksplit2:{launch}:plain", int4_form=int4_form)


@pytest.mark.parametrize("form", ["staged_", "stagedc4_", ""], ids=["staged", "stagedc4", "ring"])
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group, zeros", [(128, True), (128, False), (0, True), (0, False)])
@pytest.mark.parametrize("n, k", [(208, 384), (144, 2944)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_codes_kernel_against_fp64(form: str, k_split: int, dtype: torch.dtype, group: int, zeros: bool, n: int,
                                        k: int, int4_form: str) -> None:
    """The decode kernel's int4 codes path (group 128 or per row, k % 128 == 0: the mma on the exact u - z, the scales
    after it, unpredicated loads), on the staged kernel (token rows in shared memory; stagedc4: K split over a cluster
    of four CTAs, whose last ranks hold no batch at k 384) and the ring kernel (token rows in registers): n off 128 (a CTA's last
    row blocks moved back inside n), k of 3 batches (K splits of 4 and 8 leave warps without a batch) and of 23
    (big batches that end past a slice, computed on zero tokens), several 8-row chunks, empty experts, bias,
    launched after a trigger, with and without zero points."""
    run(WoqKind.INT4, [9, 0, 16, 1, 40, 2], n, k, group, zeros=zeros, bias=True, dtype=dtype,
        tactic=f"decode:{form}ksplit{k_split}:after_trigger:plain", int4_form=int4_form)


@pytest.mark.parametrize("k_split", [1, 2, 8])
@pytest.mark.parametrize("group, zeros", [(128, True), (0, False)])
@pytest.mark.parametrize("k, form", [(48 * 128, "staged_"), (97 * 128, ""), (97 * 128, "stagedc4_"),
                                     (112 * 128, "stagedc4_")], ids=["staged", "ring", "stagedc4", "stagedc4-mixtral"])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_codes_kernel_large_k(k_split: int, group: int, zeros: bool, k: int, form: str,
                                   int4_form: str) -> None:
    """The int4 codes forms with 8-row chunks: the staged kernel where the chunk's token rows fit its shared memory
    (k 6144: 97-100 KB, past the 48 KB a launch gets unasked), the ring kernel where they do not (k 12416: 195-212
    KB), and there the staged kernel in clusters of four CTAs along K, each holding a quarter of the rows (k 12416,
    and Mixtral-8x7B's GEMM2 k 14336)."""
    run(WoqKind.INT4, [9, 0, 16, 1, 40, 2], 144, k, group, zeros=zeros, bias=True,
        tactic=f"decode:{form}ksplit{k_split}:after_trigger:plain", int4_form=int4_form)


@pytest.mark.parametrize("form", ["staged_", "stagedc4_"], ids=["staged", "stagedc4"])
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("zeros", [True, False])
@pytest.mark.parametrize("n, k", [(208, 320), (144, 2880), (128, 384)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_group64_staged_kernel_against_fp64(form: str, k_split: int, dtype: torch.dtype, zeros: bool, n: int,
                                                 k: int, int4_form: str) -> None:
    """The staged kernel's group-64 form (each half of a 128-k batch its own scale and zero, a lane's k placed so that
    each step stays in one half): k of whole batches (384) and with a half batch at the end (320, GPT-OSS-20B's
    2880), where the missing half reads the first half's bytes and zero tokens (the weights here end at the last
    expert's last row, so a read past it would leave the tensor); K splits of 4 and 8 leave warps without a batch at k 320 and 384."""
    run(WoqKind.INT4, [9, 0, 16, 1, 40, 2], n, k, 64, zeros=zeros, bias=True, dtype=dtype,
        tactic=f"decode:{form}ksplit{k_split}:after_trigger:plain", int4_form=int4_form)


# form: (the planner's count of the rows a chunk may have, the refusal of a group-32 layer, a k where 8 rows do not fit)
TILE_FITS = {"staged": (woq_staged_rows, "one scale per row or per 128 k", 97 * 128),
             "stagedc4": (lambda call, k_split: woq_staged_rows(call, k_split, STAGED_CLUSTER_PARTS),
                          "one scale per row or per 128 k", 388 * 128),
             "digits": (woq_digits_rows, "group 0 or 128", 97 * 128)}


@pytest.mark.parametrize("form", list(TILE_FITS))
@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
def test_decode_tile_takes_the_rows_the_planner_counts(form: str, k_split: int) -> None:
    """The staged and digits tactics run exactly where tactics.woq.woq_staged_rows / woq_digits_rows say a chunk's token
    rows (or their digits) fit (rows = min(8, the rows of A)), and are refused, with the shared memory they would need,
    one row past that; each is refused for a form it does not take (group 32), and the digits tile for 16-bit rows."""
    fits, group_refusal, k = TILE_FITS[form]
    most = fits(GemmCall(sm=90, entry="sm90", epilogue="store", n=144, k=k, experts=3, top_k=1, itemsize=2,
                         weights_blocked=False, sm_count=132, l2_bytes=50 << 20,
                         memory_bytes_per_s=DEFAULT_GPU[90].memory_bytes_per_s, woq="int4", woq_group=128), k_split)
    assert 1 <= most < 8
    tactic = f"decode:{form}_ksplit{k_split}:plain:plain"
    dev, ref, mag, _ = case(WoqKind.INT4, [most, 0, 0], 144, k, 128, True, False, torch.bfloat16, 3, pad_rows=0)
    got = gemm(dev, WoqKind.INT4, 128, most, 144, torch.bfloat16, tactic)
    assert float(((got - ref).abs() - 2.0 ** -8 * (ref.abs() + mag)).max()) <= 0
    dev, _, _, _ = case(WoqKind.INT4, [most + 1, 0, 0], 144, k, 128, True, False, torch.bfloat16, 4, pad_rows=0)
    with pytest.raises(K.KernelError, match="bytes of shared memory, over its"):
        gemm(dev, WoqKind.INT4, 128, most + 1, 144, torch.bfloat16, tactic)
    dev, _, _, _ = case(WoqKind.INT4, [2, 0, 0], 144, 512, 32, True, False, torch.bfloat16, 5, pad_rows=0)
    with pytest.raises(K.KernelError, match=group_refusal):
        gemm(dev, WoqKind.INT4, 32, 2, 144, torch.bfloat16, tactic)
    if form == "digits":
        c = torch.empty(2, 144, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(K.KernelError, match="token digits .* go with the decode kernel's digits tile"):
            K.grouped_gemm_woq(dev["a"], dev["b"], "int4", dev["scales"], dev["off"], 32, zeros=dev["zeros"], c=c,
                               tactic=tactic)


@pytest.mark.parametrize("form", ["staged", "stagedc4", "digits"])
def test_weight_only_tiles_are_the_weight_only_gemms(form: str) -> None:
    """The 16-bit GEMMs refuse the staged and digits decode tiles (gemm/tactic.cuh check_tactic) rather than run
    another kernel."""
    a = torch.randn(4, 256, device="cuda").to(torch.bfloat16)
    w = torch.randn(2, 128, 256, device="cuda").to(torch.bfloat16)
    off = torch.tensor([0, 2, 4], dtype=torch.int64, device="cuda")
    with pytest.raises(K.KernelError, match=f"{form} decode kernel is the weight-only GEMM's"):
        K.grouped_gemm_sm90(a, w, off, tactic=f"decode:{form}_ksplit2:plain:plain")


# ---- the digits tile: token rows as 8-bit digits (mb_token_digits) on the int8 mma -------------------------------
# Its only rounding beyond the fp32 sums: values more than 2^10 below their 128-k group's largest lose bits below
# 2^-18 of it (common/token_digits.cuh), far inside the bound above.

@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group, zeros", [(128, True), (128, False), (0, True), (0, False)])
@pytest.mark.parametrize("counts", [[9, 0, 16, 1, 40, 2], [1, 0, 2], [3, 4, 0], [5, 6, 7, 8]],
                         ids=["chunks-of-8", "rows-2", "rows-4", "rows-6-8"])
@pytest.mark.parametrize("n, k", [(208, 384), (144, 2944)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_digits_kernel_against_fp64(k_split: int, dtype: torch.dtype, group: int, zeros: bool,
                                         counts: list[int], n: int, k: int, int4_form: str) -> None:
    """The digits tile at every mma count a step takes (chunks of at most 2, 4, 6 and 8 rows: one to four mmas), n off
    128, k of 3 groups (K splits of 4 and 8 leave warps without a group) and of 23 (big batches past a slice; in 2 K
    slices, 12 and 11 groups, the one-mma body waits once per 4: gemm/woq_decode_digits.cu digits_groups_per_wait),
    empty experts, bias, with and without zero points, per-row and group-128 scales."""
    run(WoqKind.INT4, counts, n, k, group, zeros=zeros, bias=True, dtype=dtype,
        tactic=f"decode:digits_ksplit{k_split}:after_trigger:plain", int4_form=int4_form)


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("zeros", [True, False])
@pytest.mark.parametrize("counts", [[9, 0, 16, 1, 40, 2], [1, 0, 2], [3, 4, 0], [5, 6, 7, 8]],
                         ids=["chunks-of-8", "rows-2", "rows-4", "rows-6-8"])
@pytest.mark.parametrize("n, k", [(144, 2880), (208, 320), (144, 2944)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_digits_kernel_group_64_against_fp64(k_split: int, dtype: torch.dtype, zeros: bool, counts: list[int],
                                                  n: int, k: int, int4_form: str) -> None:
    """The digits tile on weights with one scale per 64 k, each half of a 128-k group with its own scale and zero:
    GPT-OSS-20B's k 2880 (22 groups and a half at the end), 2.5 groups (K splits of 4 and 8 leave warps without a
    group, and the half group is a slice's only one at a split of 2 or more), 23 whole groups."""
    run(WoqKind.INT4, counts, n, k, 64, zeros=zeros, bias=True, dtype=dtype,
        tactic=f"decode:digits_ksplit{k_split}:after_trigger:plain", int4_form=int4_form)


# 128 experts, 9 rows (one expert of 2, seven of 1), with case()'s 5 rows past them 14: 7 * 14 <= 128.
SPARSE_COUNTS = [2] + [0] * 15 + ([1] + [0] * 15) * 7


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("counts", [[9, 0, 16, 1, 40, 2], [1, 0, 2], [3, 4, 0], [5, 6, 7, 8], SPARSE_COUNTS],
                         ids=["chunks-of-8", "rows-2", "rows-4", "rows-6-8", "sparse"])
@pytest.mark.parametrize("n, k", [(144, 2880), (2880, 320), (144, 2944), (208, 64)])
def test_mxfp4_digits_kernel_against_fp64(k_split: int, dtype: torch.dtype, counts: list[int], n: int, k: int) -> None:
    """The digits tile on MXFP4 (e2m1 codes, one e8m0 scale per 32 k, every code including -0), the token digits in
    the quarters order: GPT-OSS-20B's k 2880 (22 groups and a half, which the form pads to a whole one), GEMM2-like n
    2880 over 2.5 groups (K splits of 4 and 8 leave warps without a group; the padded group a slice's only one), 23
    whole groups, a lone half group; at every mma count a step takes, with bias; and a sparse call (A's 14 rows at
    most a seventh of the 128 experts), whose one-mma chunks wait on 3 groups where the others' wait on 4
    (mxfp4_groups_per_wait, cpp/src/gemm/woq_decode_digits.cu)."""
    run(WoqKind.MXFP4, counts, n, k, 32, bias=True, dtype=dtype,
        tactic=f"decode:digits_ksplit{k_split}:after_trigger:plain")


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("counts", [[9, 0, 16, 1, 40, 2], [1, 0, 2], [3, 4, 0], [5, 6, 7, 8]],
                         ids=["chunks-of-8", "rows-2", "rows-4", "rows-6-8"])
@pytest.mark.parametrize("group, n, k", [(0, 208, 384), (0, 144, 2944), (0, 144, 2880), (128, 208, 384),
                                         (128, 144, 2944)])
def test_int8_digits_kernel_against_fp64(k_split: int, dtype: torch.dtype, counts: list[int], group: int, n: int,
                                         k: int) -> None:
    """The digits tile on int8 weights as stored, against digits in group 32's order: per-row and group-128 scales, k
    of 3 and 23 groups and GPT-OSS-20B's 2880 (22 and a half, per row), at every mma count a step takes, with bias."""
    run(WoqKind.INT8, counts, n, k, group, bias=True, dtype=dtype,
        tactic=f"decode:digits_ksplit{k_split}:after_trigger:plain")


@pytest.mark.parametrize("k_split", [1, 4])
@pytest.mark.parametrize("e8m0, a_scale", [((0, 4), 2.0 ** 24), ((64, 192), 1.0), ((120, 136), 2.0 ** -20)],
                         ids=["e0-3", "e64-191", "e120-135-small-rows"])
def test_mxfp4_digits_kernel_exponents(k_split: int, e8m0: tuple[int, int], a_scale: float) -> None:
    """The digits tile's scales 2^(e - 127) from the bits (e 0: the subnormal 2^-127) at both ends of e8m0's range,
    the activations scaled so that the outputs stay normal in bf16; and tiny rows (digit factors near 2^-40)."""
    run(WoqKind.MXFP4, [3, 9, 1], 144, 2880, 32, dtype=torch.bfloat16, e8m0=e8m0, a_scale=a_scale,
        tactic=f"decode:digits_ksplit{k_split}:after_trigger:plain")


@pytest.mark.parametrize("tokens, top_k, k_split", [(40, 4, 1), (40, 4, 8), (1, 1, 2), (3, 2, 1), (200, 8, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_digits_finalize_against_fp64(tokens: int, top_k: int, k_split: int, dtype: torch.dtype,
                                      int4_form: str) -> None:
    """GEMM2's finalize epilogue on the digits tile (group 128 with zeros, per row without, group 64 with zeros,
    MXFP4 at k 2880 and int8 per row at k 2880), with bias."""
    finalize_run(WoqKind.INT4, 128, True, 208, 1024, tokens, top_k, k_split, bias=True, dtype=dtype, form="digits_",
                 int4_form=int4_form)
    finalize_run(WoqKind.INT4, 0, False, 208, 384, tokens, top_k, k_split, dtype=dtype, form="digits_",
                 int4_form=int4_form)
    finalize_run(WoqKind.INT4, 64, True, 144, 2880, tokens, top_k, k_split, bias=True, dtype=dtype, form="digits_",
                 int4_form=int4_form)
    finalize_run(WoqKind.MXFP4, 32, False, 144, 2880, tokens, top_k, k_split, bias=True, dtype=dtype, form="digits_")
    finalize_run(WoqKind.INT8, 0, False, 144, 2880, tokens, top_k, k_split, bias=True, dtype=dtype, form="digits_")


# Many rows per expert for the mma tiles: empty, single-row, 64-row tiles on and off their edges, several tiles;
# and 40 experts (the expert lookup scans 32 at a time).
MMA_COUNTS = {"many": [0, 1, 63, 64, 65, 200, 700], "40-experts": [(37 * i) % 71 for i in range(40)]}
MMA_TILES = ["64x128", "128x128"]


@pytest.mark.parametrize("tile", MMA_TILES)
@pytest.mark.parametrize("group, zeros, n, k", [(32, False, 2880, 352), (64, True, 208, 2880), (128, True, 208, 384),
                                                (0, False, 208, 352), (0, True, 144, 2880)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_mma_against_fp64(tile: str, group: int, zeros: bool, n: int, k: int, int4_form: str) -> None:
    run(WoqKind.INT4, MMA_COUNTS["many"], n, k, group, zeros=zeros, tactic=f"mma:{tile}:plain:plain",
        int4_form=int4_form)


@pytest.mark.parametrize("tile", MMA_TILES)
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_int4_mma_many_experts(tile: str, int4_form: str) -> None:
    run(WoqKind.INT4, MMA_COUNTS["40-experts"], 208, 352, 32, zeros=True, tactic=f"mma:{tile}:plain:plain",
        int4_form=int4_form)


@pytest.mark.parametrize("tile", MMA_TILES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group, n, k", [(0, 208, 2880), (128, 2880, 384)])
def test_int8_mma_against_fp64(tile: str, dtype: torch.dtype, group: int, n: int, k: int) -> None:
    run(WoqKind.INT8, MMA_COUNTS["many"], n, k, group, dtype=dtype, tactic=f"mma:{tile}:plain:plain")


# e8m0 120..129: scales up to 2^2, some above 2^1 (the kernel's fp32 path for those stages); 100..128: all at most
# 2^1 (its 16-bit path throughout).
@pytest.mark.parametrize("tile", MMA_TILES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("e8m0", [(120, 130), (100, 129)], ids=["e120-129", "e100-128"])
@pytest.mark.parametrize("n, k", [(2880, 352), (208, 2880)])
def test_mxfp4_mma_against_fp64(tile: str, dtype: torch.dtype, e8m0: tuple[int, int], n: int, k: int) -> None:
    run(WoqKind.MXFP4, MMA_COUNTS["many"], n, k, 32, dtype=dtype, tactic=f"mma:{tile}:plain:plain", e8m0=e8m0)


@pytest.mark.parametrize("tile", MMA_TILES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("launch", ["plain", "after_trigger"])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_mma_bias_dtype_launch_and_sizes_off_128(tile: str, dtype: torch.dtype, launch: str, int4_form: str) -> None:
    run(WoqKind.INT4, MMA_COUNTS["many"], 208, 352, 32, zeros=True, bias=True, dtype=dtype,
        tactic=f"mma:{tile}:{launch}:plain", int4_form=int4_form)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case_args", [(WoqKind.INT4, 128, True, (120, 130)), (WoqKind.INT8, 0, False, (120, 130)),
                                       (WoqKind.MXFP4, 32, False, (120, 130)), (WoqKind.MXFP4, 32, False, (100, 129))],
                         ids=["int4", "int8", "mxfp4", "mxfp4-small-scales"])
def test_decode_and_mma_agree(dtype: torch.dtype, case_args: tuple) -> None:
    """The two kernels on the same operands: the same rows written, and values within one output rounding
    (2^-7 |C|) plus 2^-12 S (fp32 summation orders; the mma kernel's int4 weights one unit in the last place off
    the fp32 product's rounding at times)."""
    kind, group, zeros, e8m0 = case_args
    seed = random.SystemRandom().randrange(1 << 30)
    counts = [5, 0, 130, 64, 9]
    dev, ref, mag, used = case(kind, counts, 208, 2880 if group != 128 else 2944, group, zeros, True, dtype, seed,
                               e8m0=e8m0)
    rows, n = ref.shape
    decode = gemm(dev, kind, group, rows, n, dtype, "decode:ksplit2:plain:plain")
    for tile in MMA_TILES:
        got = gemm(dev, kind, group, rows, n, dtype, f"mma:{tile}:plain:plain")
        where = f"(seed {seed}, {kind.value}, {tile}, {dtype})"
        assert torch.equal(torch.isnan(got), torch.isnan(decode)), f"rows written differ {where}"
        excess = (got[:used] - decode[:used]).abs() - 2.0 ** -7 * decode[:used].abs() - 2.0 ** -12 * mag[:used]
        assert float(excess.max()) <= 0, f"decode and mma differ by {float(excess.max()):.3g} past it {where}"


def test_a_type_refusals() -> None:
    """A's type is 16-bit rows (MB_INPUT_DTYPE) or token digits (MB_INPUT_DIGITS, the digits tile's only): any other
    value, and digits with another tile, are refused by the entry point with nothing written."""
    a = torch.zeros(8, 256, dtype=torch.bfloat16, device="cuda")
    b4 = torch.zeros(2, 128, 128, dtype=torch.uint8, device="cuda")
    scales = torch.ones(2, 128, 1, device="cuda")
    off = torch.tensor([0, 4, 8], dtype=torch.int64, device="cuda")
    call = K.load_library().mb_grouped_gemm_woq
    c = torch.full((8, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    for a_type in (int(K.WoqInput.DIGITS), 2, 7):
        status = call(a.data_ptr(), a_type, b4.data_ptr(), int(K.WoqKind.INT4), scales.data_ptr(), None, 0, None,
                      c.data_ptr(), off.data_ptr(), 2, 8, 128, 256, int(K.DType.BF16),
                      K.tactic_struct("decode:ksplit1:plain:plain"), stream)
        assert status == int(K.Status.INVALID_ARGUMENT), (a_type, status)
    assert c.isnan().all()


def test_mxfp4_forms_pair_with_their_tiles() -> None:
    """MXFP4 reaches the digits tile in its quarters form only, and the quarters form no other kernel: the entry point
    refuses either pairing with nothing written (stored MXFP4 on digits, or the quarters form at a k the form would
    have padded: unsupported; quarters on 16-bit rows: an invalid argument), and the Python wrapper says which form
    to pass before calling it."""
    n, k = 128, 256
    a = torch.zeros(8, k, dtype=torch.bfloat16, device="cuda")
    digits = K.token_digits(a, group=32)
    codes = torch.zeros(2, n, k // 2, dtype=torch.uint8, device="cuda")
    exps = torch.full((2, n, k // 32), 127, dtype=torch.uint8, device="cuda")
    q_codes, q_exps = mxfp4_quarters(codes, exps)
    off = torch.tensor([0, 4, 8], dtype=torch.int64, device="cuda")
    call = K.load_library().mb_grouped_gemm_woq
    c = torch.full((8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    on_digits, on_rows = "decode:digits_ksplit1:plain:plain", "decode:ksplit1:plain:plain"
    status = call(digits.data_ptr(), int(K.WoqInput.DIGITS), codes.data_ptr(), int(K.WoqKind.MXFP4), exps.data_ptr(),
                  None, 32, None, c.data_ptr(), off.data_ptr(), 2, 8, n, k, int(K.DType.BF16),
                  K.tactic_struct(on_digits), stream)
    assert status == int(K.Status.UNSUPPORTED)
    digits_half = K.token_digits(a[:, : k - 64].contiguous(), group=32)  # k 192: a group and a half, not padded
    status = call(digits_half.data_ptr(), int(K.WoqInput.DIGITS), q_codes.data_ptr(), int(K.WoqKind.MXFP4_QUARTERS),
                  q_exps.data_ptr(), None, 32, None, c.data_ptr(), off.data_ptr(), 2, 8, n, k - 64, int(K.DType.BF16),
                  K.tactic_struct(on_digits), stream)
    assert status == int(K.Status.UNSUPPORTED)
    status = call(a.data_ptr(), int(K.WoqInput.DTYPE), q_codes.data_ptr(), int(K.WoqKind.MXFP4_QUARTERS),
                  q_exps.data_ptr(), None, 32, None, c.data_ptr(), off.data_ptr(), 2, 8, n, k, int(K.DType.BF16),
                  K.tactic_struct(on_rows), stream)
    assert status == int(K.Status.INVALID_ARGUMENT)
    torch.cuda.synchronize()
    assert c.isnan().all()
    with pytest.raises(ValueError, match="takes its quarters form"):
        K.grouped_gemm_woq(digits, codes, "mxfp4", exps, off, 32, c=c, tactic=on_digits, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="digits tile's form"):
        K.grouped_gemm_woq(a, q_codes, "mxfp4_quarters", q_exps, off, 32, c=c, tactic=on_rows)


@pytest.mark.parametrize("change, words", [
    (dict(k=320, group=128), "group"), (dict(n=120), "multiple of 16"), (dict(k=336), "multiple"),
    (dict(tactic="wgmma:coop128x128:plain:plain"), "no kernel for tactic wgmma coop128x128"),
    (dict(tactic="mma:16x64:plain:plain"), "no kernel for tactic mma 16x64"),
    (dict(tactic="decode:ksplit1:plain:evict_last"), "no kernel for tactic decode none")])
def test_refusals_name_the_problem(change: dict, words: str) -> None:
    args = dict(n=128, k=256, group=64, tactic="decode:ksplit1:plain:plain")
    args.update(change)
    n, k = args["n"], args["k"]
    a = torch.zeros(8, k, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(2, n, k // 2, dtype=torch.uint8, device="cuda")
    groups = max(1, k // args["group"]) if args["group"] else 1
    scales = torch.ones(2, n, groups, device="cuda")
    off = torch.tensor([0, 4, 8], dtype=torch.int64, device="cuda")
    with pytest.raises(K.KernelError, match=words):
        K.grouped_gemm_woq(a, b, "int4", scales, off, args["group"], tactic=args["tactic"])


# ---- GEMM2 with the finalize epilogue (mb_grouped_gemm_woq_finalize, the decode kernels) -------------------------
#
# Routing as tests/gpu/test_fp8_gemm.py's finalize cases (tests/gpu/finalize_routing.py): tokens pick top_k distinct
# experts among LOCAL experts (two never picked: empty segments; one about 20 times as often: its segment spans
# several 8-row chunks) and REMOTE ones (another rank's, sorted past off[E]: they must reach no output; with top_k <=
# REMOTE token 0 has remote experts only). The expected output, in fp64: each permuted row's reference product
# (+ bias) times its routing weight, added into its token's row of a random pre-filled output (the kernel adds; a
# token whose experts are all remote keeps its fill exactly).
#
# Error bound, per output element, over the token's local rows j with weights w_j: each weighted row is the store's
# value (its bound above: 2^-8 (|ref_j| + S_j)) times w_j, rounded to the output type before its atomic add, and each
# of the top_k adds rounds the running sum (at most M1 + |fill|, M1 = sum_j |w_j ref_j|) once: |out - ref| <=
# 2^-8 (M1 + M2) + top_k u (M1 + |fill|), M2 = sum_j |w_j| S_j, u 2^-8 (bf16) or 2^-11 (fp16).

@dataclasses.dataclass
class FinalizeCase:
    """A finalize GEMM's operands: case()'s over routed rows, the routing weights and the output's fill."""
    seed: int
    remote_only: bool  # token 0 on remote experts only: its output row must keep its fill
    ptu: torch.Tensor  # permuted_to_unpermuted, on the GPU
    counts: list[int]
    dev: dict
    ref: torch.Tensor
    mag: torch.Tensor
    used: int
    weights: torch.Tensor
    fill: torch.Tensor


def finalize_case(kind: WoqKind, n: int, k: int, group: int, zeros: bool, bias: bool, dtype: torch.dtype,
                  tokens: int, top_k: int) -> FinalizeCase:
    """Fresh operands for a finalize GEMM of `tokens` tokens routed by finalize_routing.routed."""
    seed = random.SystemRandom().randrange(1 << 30)
    remote_only = top_k <= REMOTE
    ptu, counts = routed(tokens, top_k, seed + 7, remote_first=remote_only)
    gen = torch.Generator().manual_seed(seed + 8)
    dev, ref, mag, used = case(kind, counts, n, k, group, zeros, bias, dtype, seed,
                               pad_rows=tokens * top_k - sum(counts))
    weights = torch.rand(tokens * top_k, generator=gen)
    fill = torch.randn(tokens, n, generator=gen).to(dtype)
    return FinalizeCase(seed, remote_only, ptu, counts, dev, ref, mag, used, weights, fill)


def check_finalize(c: FinalizeCase, out: torch.Tensor, row_err: torch.Tensor, top_k: int, dtype: torch.dtype,
                   where: str) -> None:
    """The bound above on `out` (the finalize added into c.fill) against the fp64 reference: row_err [used, n] is each
    permuted row's stored-value bound, so its weighted sum over a token's rows is the first term; remote-only tokens
    keep their fill exactly."""
    tokens, n = c.fill.shape
    token = (c.ptu.cpu().long() // top_k)[:c.used]
    w = c.weights.double()[:c.used, None]
    ref = c.ref[:c.used]
    want, m1, e = (torch.zeros(tokens, n, dtype=torch.float64).index_add_(0, token, x)
                   for x in (w * ref, w.abs() * ref.abs(), w.abs() * row_err))
    untouched = torch.ones(tokens, dtype=torch.bool)
    untouched[token] = False
    got = out.cpu()
    assert untouched.any() or not c.remote_only, f"token 0 has a local expert {where}"
    assert torch.equal(got[untouched], c.fill[untouched]), f"a remote-only token written {where}"
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    bound = e + top_k * u * (m1 + c.fill.double().abs()) + 1e-30
    worst = float(((got.double() - c.fill.double() - want).abs() / bound).max())
    assert worst <= 1.0, f"error {worst:.2f}x the bound {where}"


def finalize_run(kind: WoqKind, group: int, zeros: bool, n: int, k: int, tokens: int, top_k: int, k_split: int,
                 bias: bool = False, dtype: torch.dtype = torch.bfloat16, form: str = "",
                 int4_form: str = "rows") -> None:
    """`form` the decode tile's prefix in the tactic's name: "" (the token rows where they lie), "staged_", "stagedc4_"
    or "digits_"."""
    c = finalize_case(kind, n, k, group, zeros, bias, dtype, tokens, top_k)
    out = c.fill.cuda()
    tactic = f"decode:{form}ksplit{k_split}:after_trigger:plain"
    dev = c.dev
    b, b_kind, scales = b_operand(dev, tactic, kind, int4_form)
    K.grouped_gemm_woq_finalize(a_operand(dev, tactic, group, kind), b, b_kind, scales, dev["off"], group, c.ptu,
                                c.weights.cuda(), tokens, top_k, zeros=dev["zeros"], bias=dev["bias"], out=out,
                                tactic=tactic, out_dtype=dtype)
    torch.cuda.synchronize()
    where = f"(seed {c.seed}, {kind.value} {int4_form}, group {group}, n {n}, k {k}, {tactic}, {dtype})"
    check_finalize(c, out, 2.0 ** -8 * (c.ref[:c.used].abs() + c.mag[:c.used]), top_k, dtype, where)


# the int4 codes forms (the staged kernel, and the ring one: k 97 x 128, where 8 staged rows would pass the staged
# kernel's shared memory, there also in clusters of four), the generic kernel (group 32 / 64, int8), both output
# types, bias, every K split
@pytest.mark.parametrize("k_split", [1, 2, 8])
@pytest.mark.parametrize("kind, group, zeros, k, form", [
    (WoqKind.INT4, 128, True, 512, "staged_"), (WoqKind.INT4, 0, False, 384, "staged_"),
    (WoqKind.INT4, 128, True, 97 * 128, ""), (WoqKind.INT4, 64, True, 512, ""),
    (WoqKind.INT4, 32, False, 352, ""), (WoqKind.INT8, 0, False, 384, ""),
    (WoqKind.INT4, 0, True, 97 * 128, ""), (WoqKind.INT4, 128, True, 97 * 128, "stagedc4_"),
    (WoqKind.INT4, 64, True, 2880, "stagedc4_")],
    ids=["int4-g128-staged", "int4-row-staged", "int4-g128-ring", "int4-g64", "int4-g32", "int8-row",
         "int4-row-zeros-ring", "int4-g128-stagedc4", "int4-g64-stagedc4"])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_finalize_against_fp64(k_split: int, kind: WoqKind, group: int, zeros: bool, k: int, form: str,
                               int4_form: str) -> None:
    finalize_run(kind, group, zeros, 208, k, tokens=40, top_k=4, k_split=k_split, form=form, int4_form=int4_form)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens, top_k", [(1, 1), (3, 2), (200, 8)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_finalize_bias_dtype_and_counts(dtype: torch.dtype, tokens: int, top_k: int, int4_form: str) -> None:
    finalize_run(WoqKind.INT4, 128, True, 256, 1024, tokens, top_k, 2, bias=True, dtype=dtype, form="staged_",
                 int4_form=int4_form)
    finalize_run(WoqKind.INT4, 128, True, 256, 1024, tokens, top_k, 1, bias=True, dtype=dtype, form="stagedc4_",
                 int4_form=int4_form)
    finalize_run(WoqKind.INT4, 128, False, 256, 1024, tokens, top_k, 1, bias=True, dtype=dtype, int4_form=int4_form)


def test_finalize_needs_the_decode_kernel() -> None:
    dev, _, _, _ = case(WoqKind.INT4, [4, 4], 128, 256, 128, False, False, torch.bfloat16, 0, pad_rows=0)
    ptu, w = torch.arange(8, dtype=torch.int32, device="cuda"), torch.ones(8, device="cuda")
    with pytest.raises(K.KernelError, match="finalize epilogue runs on the decode kernel only"):
        K.grouped_gemm_woq_finalize(dev["a"], dev["b"], "int4", dev["scales"], dev["off"], 128, ptu, w, 4, 2,
                                    tactic="mma:64x128:plain:plain")


# ---- mb_woq_dequantize: the weights a weight-only GEMM's wgmma tactic hands the 16-bit wgmma GEMM ---------------
# Against woq.py's exact fp64 dequantization rounded once to the output type: MXFP4 weights (an e2m1 value times a
# power of two) equal it; int4 and int8 ones are computed in fp32 first, so a product that fp32 rounds may land one
# unit in the last place of the 16-bit type off the single rounding: within 1.5 units of the exact value. The output
# is poisoned first.

@pytest.mark.parametrize("kind, group, zeros", [(WoqKind.INT4, 128, True), (WoqKind.INT4, 64, False),
                                                (WoqKind.INT4, 32, True), (WoqKind.INT4, 0, False),
                                                (WoqKind.INT8, 0, False), (WoqKind.INT8, 128, False),
                                                (WoqKind.MXFP4, 32, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("e, n, k", [(3, 48, 256), (2, 200, 2880)])
@pytest.mark.parametrize("int4_form", INT4_FORMS)
def test_dequantize_against_fp64(kind: WoqKind, group: int, zeros: bool, dtype: torch.dtype, e: int, n: int,
                                 k: int, int4_form: str) -> None:
    if group and k % group:
        pytest.skip(f"group {group} does not divide k {k}")
    seed = random.SystemRandom().randrange(1 << 30)
    dev, _, _, _ = case(kind, [1] * e, n, k, group, zeros, False, dtype, seed, pad_rows=0, e8m0=(110, 140))
    out = torch.full((e, n, k), float("nan"), dtype=dtype, device="cuda")
    if kind is WoqKind.INT4 and int4_form == "tiles" and n % 16:  # 200 rows: no whole tiles, refused
        with pytest.raises(ValueError, match="int4_tiles hold 16 rows a tile; n 200"):
            K.woq_dequantize(dev["b"], "int4_tiles", dev["scales"], group, zeros=dev["zeros"], out=out)
        return
    b, b_kind, scales = b_operand(dev, "", kind, int4_form)
    K.woq_dequantize(b, b_kind, scales, group, zeros=dev["zeros"], out=out)
    torch.cuda.synchronize()
    got = out.cpu()
    assert torch.isfinite(got).all(), f"unwritten weights (seed {seed})"
    b, s, z = dev["b"].cpu(), dev["scales"].cpu(), None if dev["zeros"] is None else dev["zeros"].cpu()
    for x in range(e):
        want = dequantize_matrix(kind, b[x], s[x], None if z is None else z[x])
        one = want.to(dtype)
        if kind is WoqKind.MXFP4:
            assert torch.equal(got[x], one), f"expert {x} (seed {seed})"
            continue
        # one unit of `one`'s binade (mantissa bits 7 / 10), 1.5 of them: the half unit of the single rounding
        # plus the one unit the fp32 product may add
        p = 7 if dtype == torch.bfloat16 else 10
        ulp = torch.exp2(torch.floor(torch.log2(one.double().abs().clamp_min(2.0 ** -60))) - p)
        assert ((got[x].double() - want).abs() <= 1.5 * ulp).all(), f"expert {x}: off by more than a unit (seed {seed})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequantize_mxfp4_every_exponent(dtype: torch.dtype) -> None:
    """Every e8m0 exponent but the NaN code (2^-127 to 2^127): the kernel's weights equal the exact ones rounded once
    to the output type, those past its range as infinities and those below it as zeros."""
    seed = random.SystemRandom().randrange(1 << 30)
    dev, _, _, _ = case(WoqKind.MXFP4, [1, 1], 64, 1024, 32, False, False, dtype, seed, pad_rows=0, e8m0=(0, 255))
    out = torch.full((2, 64, 1024), float("nan"), dtype=dtype, device="cuda")
    K.woq_dequantize(dev["b"], "mxfp4", dev["scales"], 32, out=out)
    torch.cuda.synchronize()
    got, b, s = out.cpu(), dev["b"].cpu(), dev["scales"].cpu()
    assert set(s.unique().tolist()) >= {0, 254}, f"the draw missed an end exponent (seed {seed})"
    assert not torch.isnan(got).any(), f"unwritten weights (seed {seed})"
    for x in range(2):
        assert torch.equal(got[x], dequantize_matrix(WoqKind.MXFP4, b[x], s[x], None).to(dtype)), \
            f"expert {x} (seed {seed})"
