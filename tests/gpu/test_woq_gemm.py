"""The weight-only grouped GEMM (mb_grouped_gemm_woq) against an fp64 reference, every kind, group and K split.

Fresh random packed weights in moe_build/weights/woq.py's canonical forms for every case; the reference
dequantizes them with woq.py's exact rule (`dequantize_matrix`, fp64) and multiplies in fp64. Outputs are
poisoned with NaN first: every row of an expert must be written and rows past the last expert left alone.
Uneven and empty expert segments (up to 40 rows: several 8-row chunks), n and k on and off multiples of 128.

Error bound, per output element: |C - ref| <= 2^-8 (|ref| + S), S = sum_k |a_k w_k|. The kernel rounds each
dequantized weight to the activation type (2^-9 relative for bf16, 2^-12 for fp16) and sums in fp32; the
output is rounded once more (2^-9 |ref|). Both terms doubled for slack; fp16 is held to the same bound.
"""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.weights.woq import WoqKind, dequantize_matrix  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]


def case(kind: WoqKind, counts: list[int], n: int, k: int, group: int, zeros: bool, bias: bool,
         dtype: torch.dtype, seed: int, pad_rows: int = 5):
    """Operands for experts with `counts` rows each (plus `pad_rows` rows past the last expert) and the fp64
    reference output of every expert's rows."""
    g = torch.Generator().manual_seed(seed)
    e, rows = len(counts), sum(counts) + pad_rows
    a = torch.randn(rows, k, generator=g).to(dtype)
    if kind is WoqKind.INT8:
        b = torch.randint(-128, 128, (e, n, k), generator=g, dtype=torch.int8)
    else:
        b = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
    groups = k // 32 if kind is WoqKind.MXFP4 else (1 if group == 0 else k // group)
    if kind is WoqKind.MXFP4:
        scales = torch.randint(120, 130, (e, n, groups), generator=g, dtype=torch.uint8)  # 2^-7 .. 2^2
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
    dev = {"a": a.cuda(), "b": b.cuda(), "scales": scales.cuda(), "zeros": None if z is None else z.cuda(),
           "bias": None if bias_t is None else bias_t.cuda(), "off": off.cuda()}
    return dev, ref, mag, int(off[-1])


def run(kind: WoqKind, counts: list[int], n: int, k: int, group: int, zeros: bool = False, bias: bool = False,
        dtype: torch.dtype = torch.bfloat16, tactic: str = "decode:ksplit1:plain:plain") -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    dev, ref, mag, used = case(kind, counts, n, k, group, zeros, bias, dtype, seed)
    c = torch.full((ref.shape[0], n), float("nan"), dtype=dtype, device="cuda")
    K.grouped_gemm_woq(dev["a"], dev["b"], kind.value, dev["scales"], dev["off"], group, zeros=dev["zeros"],
                       bias=dev["bias"], c=c, tactic=tactic)
    torch.cuda.synchronize()
    got = c.double().cpu()
    where = f"(seed {seed}, {kind.value}, counts {counts}, n {n}, k {k}, group {group}, {tactic})"
    assert torch.isfinite(got[:used]).all(), f"unwritten rows {where}"
    assert torch.isnan(got[used:]).all(), f"rows past the last expert written {where}"
    excess = (got[:used] - ref[:used]).abs() - 2.0 ** -8 * (ref[:used].abs() + mag[:used])
    assert float(excess.max()) <= 0, f"error over the bound by {float(excess.max()):.3g} {where}"


COUNTS = [[1], [3, 0, 5, 8], [9, 0, 16, 1, 40, 2], [0, 0, 7]]


@pytest.mark.parametrize("k_split", [1, 2, 4, 8])
@pytest.mark.parametrize("counts", COUNTS, ids=["1", "3-0-5-8", "9-0-16-1-40-2", "0-0-7"])
@pytest.mark.parametrize("group, zeros", [(32, False), (64, True), (128, True), (0, False)])
def test_int4_against_fp64(k_split: int, counts: list[int], group: int, zeros: bool) -> None:
    run(WoqKind.INT4, counts, 256, 512, group, zeros=zeros, tactic=f"decode:ksplit{k_split}:plain:plain")


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
def test_bias_dtype_launch_and_sizes_off_128(dtype: torch.dtype, launch: str) -> None:
    run(WoqKind.INT4, [5, 8, 1], 208, 352, 32, zeros=True, bias=True, dtype=dtype,
        tactic=f"decode:ksplit2:{launch}:plain")


@pytest.mark.parametrize("change, words", [
    (dict(k=320, group=128), "group"), (dict(n=120), "multiple of 16"), (dict(k=336), "multiple"),
    (dict(tactic="mma:128x128:plain:plain"), "decode kernel")])
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
