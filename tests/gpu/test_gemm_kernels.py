"""Grouped-GEMM entry points (cpp/src/gemm/) against an fp64 reference, each call run as an explicit tactic.

Fresh random data for every case, outputs poisoned with NaN first and checked fully written, uneven and
empty expert segments, and every kernel through the wrappers' `tactic=`: the decode kernel at each K split
and launch, every mma tile, every wgmma tile and launch (placed ones given a claim region), and the tactic
the planner picks for the call (moe_build.planner.tactics.choose_tactic); the tactics `tactic_bands` yields
over many token counts all run. Plain GEMMs claim bit-reproducible results, so the sm90 tests run every
call twice and compare bits where the kernel claims it. Tactics an entry point cannot run are refused with
MB_ERR_INVALID_ARGUMENT or MB_ERR_UNSUPPORTED and write nothing.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from moe_build import kernels as K  # noqa: E402  (after the torch skip: loading may build the library)
from moe_build.kernels import GemmKernel, GemmLaunch, GemmTacticStruct, GemmTile, OutputL2  # noqa: E402
from moe_build.planner.tactics import GemmCall, GemmTactic, RowCount, choose_tactic, tactic_bands  # noqa: E402
from moe_build.runner.runner import device_target  # noqa: E402
from moe_build.weights import block_64x64, blocks_fit, interleave_gate_up  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

_spec = importlib.util.spec_from_file_location(
    "gemm_lib", Path(__file__).resolve().parents[2] / "cpp" / "tests" / "gemm_lib.py")
gemm_lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemm_lib)

TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
INVALID, UNSUPPORTED = K.Status.INVALID_ARGUMENT, K.Status.UNSUPPORTED


@pytest.fixture(scope="module")
def gemms():
    return gemm_lib.Gemms(gemm_lib.load())


def is_sm90() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


def need_sm90() -> None:
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")


# ---- tactics ----------------------------------------------------------------------------------------

def gemm_call(entry: str, epilogue: str, n: int, k: int, experts: int, top_k: int, dtype,
              layout: str = "row_major") -> GemmCall:
    """The planner's view of one grouped GEMM on this device (n: its columns per expert, 2 * inter when
    gated)."""
    device = device_target(torch.device("cuda"), 1)
    return GemmCall(sm=device.sm, entry=entry, epilogue=epilogue, n=n, k=k, experts=experts,
                    top_k=top_k, itemsize=torch.finfo(dtype).bits // 8, weights_blocked=layout == "blocked64",
                    sm_count=device.sm_count, l2_bytes=device.l2_bytes, memory_bytes_per_s=device.memory_bytes_per_s)


def planned(entry: str, epilogue: str, n: int, k: int, experts: int, tokens: int, top_k: int, dtype,
            layout: str = "row_major") -> GemmTactic:
    """The tactic the planner picks for this call at `tokens` tokens (tokens * top_k rows, so top_k 1 with
    tokens = rows for a call given by its rows)."""
    call = gemm_call(entry, epilogue, n, k, experts, top_k, dtype, layout)
    return choose_tactic(call, RowCount(tokens, top_k, experts))


def forced(name: str, epilogue: str) -> GemmTactic:
    """KERNEL:TILE:LAUNCH as a tactic for `epilogue`: wgmma's gated and finalize epilogues write under L2
    evict_last (as the planner has them), every other output plainly."""
    kernel = name.split(":")[0]
    l2 = "evict_last" if kernel == "wgmma" and epilogue != "store" else "plain"
    return GemmTactic.parse(f"{name}:{l2}")


def tactic_for(param: str, entry: str, epilogue: str, n: int, k: int, experts: int, tokens: int, top_k: int,
               dtype, layout: str = "row_major") -> GemmTactic:
    if param == "planned":
        return planned(entry, epilogue, n, k, experts, tokens, top_k, dtype, layout)
    return forced(param, epilogue)


def placement_for(tactic: GemmTactic) -> torch.Tensor | None:
    """A fresh claim region where the tactic launches by placement (the wrappers refuse none otherwise)."""
    return K.new_gemm_placement("cuda") if tactic.launch == "placed" else None


# Every kernel: the decode kernel at each K split and both launches, the mma tiles, the wgmma tiles and
# both unplaced launches (placement: the planned tactics and test_sm90_launch_by_placement).
SM80_TACTICS = ["planned", "decode:ksplit4:plain", "decode:ksplit8:after_trigger", "mma:16x64:plain",
                "mma:64x128:plain", "mma:128x128:plain"]
SM90_TACTICS = ["planned", "decode:ksplit2:after_trigger", "decode:ksplit1:plain", "decode:ksplit8:after_trigger",
                "mma:16x64:plain", "mma:128x128:plain", "wgmma:coop128x256:plain", "wgmma:pingpong64x256:plain",
                "wgmma:pingpong64x128:after_trigger", "wgmma:pingpong64x256c2:plain",
                "wgmma:pingpong64x192c2:after_trigger"]


@pytest.fixture(params=SM80_TACTICS)
def sm80_tactic(request) -> str:
    return request.param


@pytest.fixture(params=SM90_TACTICS)
def sm90_tactic(request) -> str:
    need_sm90()
    return request.param


# ---- data and references ----------------------------------------------------------------------------

def segments(num_experts: int, rows: int, gen: torch.Generator) -> torch.Tensor:
    """Uneven segments with about a quarter of the experts empty; int64 offsets [E+1]."""
    weights = torch.rand(num_experts, generator=gen, device="cuda") ** 3
    weights[torch.rand(num_experts, generator=gen, device="cuda") < 0.25] = 0
    if weights.sum() == 0:
        weights[0] = 1
    counts = torch.zeros(num_experts, dtype=torch.int64, device="cuda")
    if rows:
        counts += torch.bincount(torch.multinomial(weights, rows, replacement=True, generator=gen),
                                 minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device="cuda")
    offsets[1:] = counts.cumsum(0)
    return offsets


def act_ref(name: str, x, up=None, alpha: float = 1.0, limit: float = 0.0):
    F = torch.nn.functional
    if name == "identity":
        return x
    if name == "relu":
        return F.relu(x)
    if name == "silu":
        return F.silu(x)
    if name == "gelu":  # the tanh form, as moe_build.reference and every kernel (cpp/src/common/act_math.cuh)
        return F.gelu(x, approximate="tanh")
    if name == "swiglu":
        return F.silu(x) * up
    if name == "geglu":
        return F.gelu(x, approximate="tanh") * up
    g = x.clamp(max=limit)
    return g * torch.sigmoid(alpha * g) * (up.clamp(-limit, limit) + 1)


def reference(a, b, bias, offsets, act: str, alpha: float = 1.0, limit: float = 0.0):
    """fp64 per-expert loop: act(A[seg] @ B[x]^T + bias[x]) (gated: from the two halves of B)."""
    off = offsets.tolist()
    gated = act in gemm_lib.GATED
    n = b.shape[1] // (2 if gated else 1)
    out = torch.empty(a.shape[0], n, dtype=torch.float64, device="cuda")
    for x in range(len(off) - 1):
        lo, hi = off[x], off[x + 1]
        if lo == hi:
            continue
        y = a[lo:hi].double() @ b[x].double().T
        if bias is not None:
            y = y + bias[x].double()
        out[lo:hi] = act_ref(act, y[:, :n], y[:, n:], alpha, limit) if gated else act_ref(act, y)
    return out


def finalize_reference(a, b, bias, offsets, u2p, w):
    """out[t] = sum_j w[t,j] * (A[u2p[t*K+j]] @ B[ids[t,j]]^T + bias[ids[t,j]]), fp64."""
    t, top_k = w.shape
    y = reference(a, b, bias, offsets, "identity")
    return (y[u2p].view(t, top_k, -1) * w.double().unsqueeze(-1)).sum(1)


def rel_err(out, ref) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(out, ref, dtype):
    assert not torch.isnan(out).any(), "output has unwritten (NaN-poisoned) or NaN elements"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"rel-norm error {err:.2e} >= {TOL[dtype]:.0e}"


def make(rows, e, n_rows_b, k, dtype, gen, with_bias, bias_cols):
    a = torch.randn(rows, k, generator=gen, device="cuda").to(dtype)
    b = (torch.randn(e, n_rows_b, k, generator=gen, device="cuda") / k ** 0.5).to(dtype)
    bias = torch.randn(e, bias_cols, generator=gen, device="cuda").to(dtype) if with_bias else None
    return a, b, bias


def gated_cases(rows, e, n, k, dtype, gen):
    """(act, A, stacked B [E, 2n, k], bias or None, alpha, limit) for each gated activation, fresh data
    each; geglu without bias, GPT-OSS's swiglu_clamp constants."""
    for i, act in enumerate(gemm_lib.GATED):
        a, b, bias = make(rows, e, 2 * n, k, dtype, gen, with_bias=i != 1, bias_cols=2 * n)
        alpha, limit = (1.702, 7.0) if act == "swiglu_clamp" else (1.0, 0.0)
        yield act, a, b, bias, alpha, limit


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


# (experts, rows, n, k): every mma tile's band of average rows per expert (<= 16, <= 64, > 64), N/K
# multiples of 64 and not (2880 = 45*64, 200, 136), single rows and 8192 rows.
# Decode shapes with long K ((8, 2, 512, 14336), (8, 5, 264, 1000): K tail, N not a multiple of
# 64) give the decode kernel's K slices room for every K split.
SHAPES = [(8, 1, 256, 128), (8, 100, 200, 136), (8, 500, 2880, 2880), (16, 8192, 512, 256),
          (128, 8192, 192, 512), (128, 3, 1536, 2048), (64, 1000, 1408, 2048), (8, 2, 512, 14336),
          (8, 5, 264, 1000)]
ACTS = ["identity", "relu", "silu", "gelu"]


# ---- sm80 entry point -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm80_bias_act(sm80_tactic, shape, dtype):
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(hash((shape, str(dtype), sm80_tactic)) % 2**31)
    offsets = segments(e, rows, gen)
    tactic = tactic_for(sm80_tactic, "sm80", "store", n, k, e, rows, 1, dtype)
    for i, act in enumerate(ACTS):
        a, b, bias = make(rows, e, n, k, dtype, gen, with_bias=i % 2 == 0, bias_cols=n)
        c = poisoned((rows, n), dtype)
        K.grouped_gemm_sm80(a, b, offsets, act, bias=bias, c=c, tactic=tactic)
        check(c, reference(a, b, bias, offsets, act), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm80_fused_gated(sm80_tactic, shape, dtype):
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(1 + hash((shape, str(dtype), sm80_tactic)) % 2**31)
    offsets = segments(e, rows, gen)
    tactic = tactic_for(sm80_tactic, "sm80", "gated", 2 * n, k, e, rows, 1, dtype)
    for act, a, b, bias, alpha, limit in gated_cases(rows, e, n, k, dtype, gen):
        c = poisoned((rows, n), dtype)
        K.grouped_gemm_sm80(a, b, offsets, act, fused_gated=True, bias=bias, swiglu_alpha=alpha, swiglu_limit=limit,
                            c=c, tactic=tactic)
        check(c, reference(a, b, bias, offsets, act, alpha, limit), dtype)


def test_sm80_rejects(gemms):
    gen = torch.Generator(device="cuda").manual_seed(7)
    offsets = segments(8, 64, gen)
    tactic = "mma:64x128:plain:plain"
    a, b, _ = make(64, 8, 100, 128, torch.bfloat16, gen, False, 0)
    c = torch.empty(64, 100, dtype=torch.bfloat16, device="cuda")
    assert gemms.sm80(a, b, None, c, offsets, 64, 100, 128, "identity", tactic=tactic) == INVALID  # N % 8 != 0
    assert gemms.lib.mb_grouped_gemm_sm80(a.data_ptr(), b.data_ptr(), None, c.data_ptr(), offsets.data_ptr(), 8,
                                          64, 96, 128, 1, 4, 0, 1.0, 0.0, K.tactic_struct(tactic), None, 0,
                                          0) == INVALID  # gated act, not fused
    af = a.float()
    assert gemms.sm80(af, b.float(), None, c.float(), offsets, 64, 96, 128, "identity",
                      tactic=tactic) == UNSUPPORTED  # fp32


# ---- sm90 entry points ------------------------------------------------------------------------------

@pytest.fixture(params=["row_major", "blocked64"])
def layout(request):
    """The weights' storage the sm90 entry points are given (mb_weight_layout)."""
    return request.param


def stored(b, layout: str):
    """B as the entry point reads it under `layout` (the reference keeps using the row-major B); sizes
    that do not tile into blocks are passed as they are, for the entry point to refuse."""
    return block_64x64(b) if layout == "blocked64" and blocks_fit(b.shape[1], b.shape[2]) else b


def layout_refusal(layout: str, tactic: GemmTactic, rows_b: int, k: int) -> tuple[K.Status, str] | None:
    """(status, message part) an sm90 entry point must answer for blocked weights it cannot take: rows or
    k not multiples of 64 (invalid), the mma tiles or the 96-row multicast slices of pingpong64x192c2
    (unsupported); None where it must run."""
    if layout != "blocked64":
        return None
    if rows_b % 64 or k % 64:
        return INVALID, "multiples of 64"
    if tactic.kernel == "mma":
        return UNSUPPORTED, "row-major weights only"
    if tactic.tile == "pingpong64x192c2":
        return UNSUPPORTED, "64-row blocks"
    return None


def refused(refusal: tuple[K.Status, str], out: torch.Tensor, run) -> None:
    """`run()` must raise KernelError with the refusal's status and message, leaving `out` unwritten."""
    with pytest.raises(K.KernelError) as err:
        run()
    assert err.value.status is refusal[0] and refusal[1] in str(err.value), str(err.value)
    torch.cuda.synchronize()
    assert torch.isnan(out).all() or not out.any(), "a refused call wrote its output"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm90_plain(sm90_tactic, layout, shape, dtype):
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(2 + hash((shape, str(dtype), sm90_tactic, layout)) % 2**31)
    offsets = segments(e, rows, gen)
    tactic = tactic_for(sm90_tactic, "sm90", "store", n, k, e, rows, 1, dtype, layout)
    refusal = layout_refusal(layout, tactic, n, k)
    for with_bias in (True, False):
        a, b, bias = make(rows, e, n, k, dtype, gen, with_bias, n)
        ref = reference(a, b, bias, offsets, "identity")
        outs = []
        for _ in range(2):
            c = poisoned((rows, n), dtype)

            def run() -> None:
                K.grouped_gemm_sm90(a, stored(b, layout), offsets, bias, c=c, weight_layout=layout, tactic=tactic)
            if refusal:
                refused(refusal, c, run)
                return
            run()
            check(c, ref, dtype)
            outs.append(c)
        assert torch.equal(outs[0], outs[1]), "plain grouped GEMM must be bit-reproducible"


@pytest.mark.parametrize("shape", [(8, 2, 512, 14336), (128, 3, 1536, 2048)])
def test_sm90_decode_without_workspace(gemms, shape):
    """A decode call needs no workspace: given none it runs (the decode kernel the planner picks here)."""
    need_sm90()
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(5 + hash(shape) % 2**31)
    offsets = segments(e, rows, gen)
    a, b, bias = make(rows, e, n, k, torch.bfloat16, gen, True, n)
    c = poisoned((rows, n), torch.bfloat16)
    tactic = planned("sm90", "store", n, k, e, rows, 1, torch.bfloat16)
    assert tactic.kernel == "decode", tactic.name
    st = gemms.lib.mb_grouped_gemm_sm90(a.data_ptr(), b.data_ptr(), bias.data_ptr(), c.data_ptr(),
                                        offsets.data_ptr(), e, rows, n, k, gemm_lib.MB_BF16,
                                        gemm_lib.LAYOUTS["row_major"], K.tactic_struct(tactic), None, 0,
                                        torch.cuda.current_stream().cuda_stream)
    assert st == 0, gemms.error()
    check(c, reference(a, b, bias, offsets, "identity"), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm90_gated(sm90_tactic, layout, shape, dtype):
    """GEMM1 with the gated activation in its epilogue, on every kernel and tile: W1 is handed over
    gate/up-interleaved (then blocked, under blocked64), the reference multiplies the stacked W1
    (n = the intermediate size here)."""
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(4 + hash((shape, str(dtype), sm90_tactic, layout)) % 2**31)
    offsets = segments(e, rows, gen)
    tactic = tactic_for(sm90_tactic, "sm90", "gated", 2 * n, k, e, rows, 1, dtype, layout)
    refusal = layout_refusal(layout, tactic, 2 * n, k)
    placement = placement_for(tactic)
    for act, a, b, bias, alpha, limit in gated_cases(rows, e, n, k, dtype, gen):
        ref = reference(a, b, bias, offsets, act, alpha, limit)
        b_il = interleave_gate_up(b)
        bias_il = None if bias is None else interleave_gate_up(bias)
        outs = []
        for _ in range(2):
            c = poisoned((rows, n), dtype)

            def run() -> None:
                K.grouped_gemm_sm90_gated(a, stored(b_il, layout), offsets, act, bias_il, alpha, limit, c=c,
                                          weight_layout=layout, placement=placement, tactic=tactic)
            if refusal:
                refused(refusal, c, run)
                return
            run()
            check(c, ref, dtype)
            outs.append(c)
        assert torch.equal(outs[0], outs[1]), "the gated GEMM (no atomics) must be bit-reproducible"


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("shape", [(16, 1000, 200, 136), (64, 4000, 1408, 2048), (8, 700, 2880, 512)])
def test_sm90_reads_past_segments_never_reach_outputs(sm90_tactic, layout, shape, gated):
    """The wgmma kernel's TMA tiles run past an expert's rows into the next expert's (and past off[E] up
    to max_rows), and past its N columns into the next expert's weights. Poisoned with NaN there (rows
    after off[E], the weights of experts with no rows), none of it may reach an output: the kept rows
    match the fp64 reference and the rows past off[E] are left unwritten."""
    e, used, n, k = shape
    extra = 77  # rows of A (and C) past off[E], up to max_rows
    gen = torch.Generator(device="cuda").manual_seed(6 + hash((shape, gated, sm90_tactic, layout)) % 2**31)
    counts = segments(e, used, gen).diff()
    counts[0] += counts[1]  # expert 1 gets no rows, so expert 0's last column tile reads its NaN weights
    counts[1] = 0
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    empty = (counts == 0).nonzero().flatten()
    act = "swiglu" if gated else "identity"
    rows_b = 2 * n if gated else n
    tactic = tactic_for(sm90_tactic, "sm90", "gated" if gated else "store", rows_b, k, e, used + extra, 1,
                        torch.bfloat16, layout)
    a, b, bias = make(used + extra, e, rows_b, k, torch.bfloat16, gen, True, rows_b)
    ref = reference(a[:used], b, bias, offsets, act)
    a[used:] = float("nan")
    b[empty] = float("nan")
    c = poisoned((used + extra, n), torch.bfloat16)

    def run() -> None:
        if gated:
            K.grouped_gemm_sm90_gated(a, stored(interleave_gate_up(b), layout), offsets, act, interleave_gate_up(bias),
                                      c=c, weight_layout=layout, placement=placement_for(tactic), tactic=tactic)
        else:
            K.grouped_gemm_sm90(a, stored(b, layout), offsets, bias, c=c, weight_layout=layout, tactic=tactic)
    refusal = layout_refusal(layout, tactic, rows_b, k)
    if refusal:
        refused(refusal, c, run)
        return
    run()
    check(c[:used], ref, torch.bfloat16)
    assert torch.isnan(c[used:]).all(), "rows past off[E] were written"


def test_sm90_gated_rejects():
    need_sm90()
    gen = torch.Generator(device="cuda").manual_seed(13)
    offsets = segments(8, 64, gen)
    tactic = "wgmma:pingpong64x128:plain:evict_last"
    a, b, _ = make(64, 8, 2 * 100, 128, torch.bfloat16, gen, False, 0)
    c = poisoned((64, 100), torch.bfloat16)
    refused((INVALID, "multiple of 8"), c,  # inter % 8 != 0
            lambda: K.grouped_gemm_sm90_gated(a, b, offsets, "swiglu", c=c, tactic=tactic))
    a, b, _ = make(64, 8, 2 * 96, 128, torch.bfloat16, gen, False, 0)
    c = poisoned((64, 96), torch.bfloat16)
    refused((INVALID, "swiglu"), c,  # not a gated activation
            lambda: K.grouped_gemm_sm90_gated(a, b, offsets, "silu", c=c, tactic=tactic))


@pytest.mark.parametrize("gated", [False, True])
def test_sm90_wgmma_rejects_a_misaligned_output(gated):
    """The wgmma epilogues store 16-byte vectors: an output 2 bytes off alignment is refused with an
    error, never written."""
    need_sm90()
    gen = torch.Generator(device="cuda").manual_seed(14)
    rows, e, n, k = 256, 8, 128, 128
    offsets = segments(e, rows, gen)
    a, b, _ = make(rows, e, 2 * n if gated else n, k, torch.bfloat16, gen, False, 0)
    flat = poisoned((rows * n + 1,), torch.bfloat16)
    c = flat[1:].view(rows, n)
    with pytest.raises(K.KernelError, match="16-byte aligned") as err:
        if gated:
            K.grouped_gemm_sm90_gated(a, b, offsets, "swiglu", c=c, tactic="wgmma:pingpong64x128:plain:evict_last")
        else:
            K.grouped_gemm_sm90(a, b, offsets, c=c, tactic="wgmma:pingpong64x128:plain:plain")
    assert err.value.status is INVALID
    torch.cuda.synchronize()
    assert torch.isnan(flat).all()


# (tokens, experts, top_k, n, k)
FINALIZE = [(1, 8, 2, 4096, 512), (16, 128, 8, 2048, 768), (300, 64, 6, 2048, 1408), (2048, 8, 2, 512, 1024),
            (1024, 32, 4, 2880, 2880), (700, 16, 1, 200, 136), (1, 8, 2, 1024, 14336), (3, 64, 6, 2048, 1408)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", FINALIZE)
def test_sm90_finalize(sm90_tactic, layout, case, dtype):
    t, e, top_k, n, k = case
    gen = torch.Generator(device="cuda").manual_seed(3 + hash((case, str(dtype), sm90_tactic, layout)) % 2**31)
    tactic = tactic_for(sm90_tactic, "sm90", "finalize", n, k, e, t, top_k, dtype, layout)
    refusal = layout_refusal(layout, tactic, n, k)
    placement = placement_for(tactic)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows = t * top_k
    a, b, bias = make(rows, e, n, k, dtype, gen, with_bias=t % 2 == 0, bias_cols=n)
    w = torch.rand(t, top_k, generator=gen, device="cuda")
    pw = w.flatten()[p2u.long()].contiguous()
    ref = finalize_reference(a, b, bias, offsets, u2p, w)
    outs = []
    for _ in range(2):
        out = torch.zeros(t, n, dtype=dtype, device="cuda")

        def run() -> None:
            K.grouped_gemm_sm90_finalize(a, stored(b, layout), offsets, p2u, pw, t, top_k, bias, out=out,
                                         weight_layout=layout, placement=placement, tactic=tactic)
        if refusal:
            refused(refusal, out, run)
            return
        run()
        check(out, ref, dtype)
        outs.append(out)
    if top_k <= 2:
        assert torch.equal(outs[0], outs[1]), "finalize with top_k <= 2 must be bit-reproducible"


def test_sm90_rejects(gemms):
    gen = torch.Generator(device="cuda").manual_seed(11)
    offsets = segments(8, 64, gen)
    tactic = "wgmma:pingpong64x128:plain:plain"
    a, b, _ = make(64, 8, 96, 128, torch.bfloat16, gen, False, 0)
    c = torch.empty(64, 96, dtype=torch.bfloat16, device="cuda")
    if not is_sm90():
        for t in (tactic, "decode:ksplit2:after_trigger:plain", "mma:16x64:plain:plain"):
            assert gemms.sm90(a, b, None, c, offsets, 64, 96, 128, tactic=t) == UNSUPPORTED
            assert "compute capability 9.0" in gemms.error()
        return
    a124, b124, _ = make(64, 8, 96, 124, torch.bfloat16, gen, False, 0)
    with pytest.raises(K.KernelError, match="multiples of 8") as err:  # K % 8 != 0
        K.grouped_gemm_sm90(a124, b124, offsets, c=c, tactic=tactic)
    assert err.value.status is INVALID
    ws = gemms.workspace_sm90(8, 64, 96, 128)
    assert gemms.lib.mb_grouped_gemm_sm90(a.data_ptr(), b.data_ptr(), None, c.data_ptr(), offsets.data_ptr(), 8, 64,
                                          96, 128, gemm_lib.MB_BF16, 7, K.tactic_struct(tactic), ws.data_ptr(),
                                          ws.numel(), torch.cuda.current_stream().cuda_stream) == INVALID
    assert "weight_layout 7" in gemms.error()
    with pytest.raises(K.KernelError) as err:
        K.grouped_gemm_sm90(a.float(), b.float(), offsets, c=c.float(), tactic=tactic)
    assert err.value.status is UNSUPPORTED


# ---- tactics the library refuses --------------------------------------------------------------------

def raw(kernel=GemmKernel.MMA, tile=GemmTile.MMA_64x128, k_split=0, launch=GemmLaunch.PLAIN,
        output_l2=OutputL2.PLAIN) -> GemmTacticStruct:
    """An mb_gemm_tactic with any field values, also ones outside their enums."""
    return GemmTacticStruct(int(kernel), int(tile), k_split, int(launch), int(output_l2))


# Tactics no entry point can run: enum values outside their enums, a tile of another kernel, a K split
# the kernel does not have, a launch or L2 policy the kernel does not have. (INVALID on every entry.)
MALFORMED = {
    "kernel 3": raw(kernel=3),
    "kernel -1": raw(kernel=-1),
    "tile 9": raw(tile=9),
    "launch 3": raw(launch=3),
    "output_l2 2": raw(output_l2=2),
    "mma, tile none": raw(tile=GemmTile.NONE),
    "mma, a wgmma tile": raw(tile=GemmTile.PINGPONG_64x128),
    "decode, an mma tile": raw(GemmKernel.DECODE, GemmTile.MMA_16x64, 2),
    "wgmma, an mma tile": raw(GemmKernel.WGMMA, GemmTile.MMA_128x128),
    "decode, k_split 3": raw(GemmKernel.DECODE, GemmTile.NONE, 3),
    "decode, k_split 0": raw(GemmKernel.DECODE, GemmTile.NONE, 0),
    "decode, k_split 16": raw(GemmKernel.DECODE, GemmTile.NONE, 16),
    "mma, k_split 2": raw(k_split=2),
    "wgmma, k_split 1": raw(GemmKernel.WGMMA, GemmTile.PINGPONG_64x128, 1),
    "mma after a trigger": raw(launch=GemmLaunch.AFTER_TRIGGER),
    "mma placed": raw(launch=GemmLaunch.PLACED),
    "decode placed": raw(GemmKernel.DECODE, GemmTile.NONE, 2, GemmLaunch.PLACED),
    "mma evict_last": raw(output_l2=OutputL2.EVICT_LAST),
    "decode evict_last": raw(GemmKernel.DECODE, GemmTile.NONE, 2, output_l2=OutputL2.EVICT_LAST),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_sm80_refuses_malformed_tactics(gemms, name):
    gen = torch.Generator(device="cuda").manual_seed(21)
    offsets = segments(8, 64, gen)
    a, b, _ = make(64, 8, 128, 128, torch.bfloat16, gen, False, 0)
    c = poisoned((64, 128), torch.bfloat16)
    assert gemms.sm80(a, b, None, c, offsets, 64, 128, 128, "identity", tactic=MALFORMED[name]) == INVALID, name
    assert "grouped gemm sm80" in gemms.error() and "\n" not in gemms.error()
    torch.cuda.synchronize()
    assert torch.isnan(c).all(), "a refused call wrote its output"


def test_sm80_refuses_wgmma():
    """The wgmma kernel is the sm90 entry points' only: a valid wgmma tactic is unsupported here."""
    gen = torch.Generator(device="cuda").manual_seed(22)
    offsets = segments(8, 64, gen)
    a, b, _ = make(64, 8, 128, 128, torch.bfloat16, gen, False, 0)
    c = poisoned((64, 128), torch.bfloat16)
    for tile in ("pingpong64x128", "coop128x256"):
        refused((UNSUPPORTED, "sm90 entry points only"), c,
                lambda: K.grouped_gemm_sm80(a, b, offsets, c=c, tactic=f"wgmma:{tile}:plain:plain"))


@pytest.mark.parametrize("epilogue", ["store", "gated", "finalize"])
@pytest.mark.parametrize("name", list(MALFORMED))
def test_sm90_refuses_malformed_tactics(gemms, epilogue, name):
    need_sm90()
    t, e, top_k, inter, h = 64, 8, 2, 128, 256
    gen = torch.Generator(device="cuda").manual_seed(23)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows = t * top_k
    a, b, _ = make(rows, e, 2 * inter, h, torch.bfloat16, gen, False, 0)
    pw = torch.rand(rows, generator=gen, device="cuda")
    placement = torch.zeros(gemms.placement_ints(), dtype=torch.int32, device="cuda")
    tactic = MALFORMED[name]
    if epilogue == "store":
        out = poisoned((rows, 2 * inter), torch.bfloat16)
        st = gemms.sm90(a, b, None, out, offsets, rows, 2 * inter, h, tactic=tactic)
    elif epilogue == "gated":
        out = poisoned((rows, inter), torch.bfloat16)
        st = gemms.sm90_gated(a, b, None, out, offsets, rows, inter, h, "swiglu", placement=placement, tactic=tactic)
    else:
        out = poisoned((t, 2 * inter), torch.bfloat16)
        st = gemms.sm90_finalize(a, b, None, out, offsets, p2u, pw, rows, t, top_k, 2 * inter, h,
                                 placement=placement, tactic=tactic)
    assert st == INVALID, (name, gemms.error())
    assert "grouped gemm sm90" in gemms.error() and "\n" not in gemms.error()
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call wrote its output"


def test_sm90_refuses_what_the_epilogue_or_layout_cannot_take():
    """Well-formed tactics an sm90 entry point cannot run: a placed launch without a gated or finalize
    epilogue, on a tile other than the one-CTA pingpong 64x256 / 64x128, or without a placement region;
    evict_last outputs on the plain store (INVALID); the mma tiles and pingpong64x192c2 on blocked
    weights (UNSUPPORTED)."""
    need_sm90()
    t, e, top_k, inter, h = 256, 8, 2, 128, 256
    gen = torch.Generator(device="cuda").manual_seed(24)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows = t * top_k
    x, w1, _ = make(rows, e, 2 * inter, h, torch.bfloat16, gen, False, 0)
    a2, w2, _ = make(rows, e, h, inter, torch.bfloat16, gen, False, 0)
    pw = torch.rand(rows, generator=gen, device="cuda")
    region = K.new_gemm_placement("cuda")

    def plain(tactic: str, layout: str = "row_major"):
        c = poisoned((rows, h), torch.bfloat16)
        return c, lambda: K.grouped_gemm_sm90(a2, stored(w2, layout), offsets, c=c, weight_layout=layout,
                                              tactic=tactic)

    def gated(tactic: str, placement=region, layout: str = "row_major"):
        c = poisoned((rows, inter), torch.bfloat16)
        return c, lambda: K.grouped_gemm_sm90_gated(x, stored(w1, layout), offsets, "swiglu", c=c,
                                                    weight_layout=layout, placement=placement, tactic=tactic)

    def fin(tactic: str, placement=region, layout: str = "row_major"):
        out = torch.zeros(t, h, dtype=torch.bfloat16, device="cuda")
        return out, lambda: K.grouped_gemm_sm90_finalize(a2, stored(w2, layout), offsets, p2u, pw, t, top_k,
                                                         out=out, weight_layout=layout, placement=placement,
                                                         tactic=tactic)

    cases = [
        ((INVALID, "placed launch needs"), plain("wgmma:pingpong64x128:placed:plain")),
        ((INVALID, "placed launch needs"), gated("wgmma:coop128x256:placed:evict_last")),
        ((INVALID, "placed launch needs"), gated("wgmma:pingpong64x256c2:placed:evict_last")),
        ((INVALID, "placed launch needs"), fin("wgmma:pingpong64x192c2:placed:evict_last")),
        ((INVALID, "placed launch needs"), fin("decode:ksplit2:placed:plain")),
        ((INVALID, "placement is NULL"), gated("wgmma:pingpong64x256:placed:evict_last", placement=None)),
        ((INVALID, "placement is NULL"), fin("wgmma:pingpong64x128:placed:evict_last", placement=None)),
        ((INVALID, "evict_last"), plain("wgmma:pingpong64x256:plain:evict_last")),
        ((INVALID, "evict_last"), fin("decode:ksplit2:after_trigger:evict_last")),
        ((INVALID, "evict_last"), gated("mma:64x128:plain:evict_last")),
        ((INVALID, "launches plainly"), gated("mma:64x128:after_trigger:plain")),
        ((UNSUPPORTED, "row-major weights only"), plain("mma:64x128:plain:plain", "blocked64")),
        ((UNSUPPORTED, "row-major weights only"), gated("mma:16x64:plain:plain", layout="blocked64")),
        ((UNSUPPORTED, "64-row blocks"), plain("wgmma:pingpong64x192c2:plain:plain", "blocked64")),
        ((UNSUPPORTED, "64-row blocks"), fin("wgmma:pingpong64x192c2:plain:evict_last", layout="blocked64")),
    ]
    for refusal, (out, run) in cases:
        refused(refusal, out, run)


# ---- the planner's tactics over token counts --------------------------------------------------------

# (experts, top_k, inter, hidden): small layers whose bands up to MAX_TOKENS cross the decode kernel's K
# splits, the narrow and wide wgmma tiles, the finalize GEMM's early launch and the launches by placement
# (sm90), and every mma tile (sm80).
BAND_LAYERS = [(16, 4, 256, 512), (64, 8, 128, 256)]
MAX_TOKENS = 2048


def band_token_counts(bands) -> list[int]:
    """First and last token count of every band starting at or below MAX_TOKENS (the last band capped)."""
    counts = set()
    for first, last, _ in bands:
        if first > MAX_TOKENS:
            break
        counts.update({first, min(last if last is not None else MAX_TOKENS, MAX_TOKENS)})
    return sorted(counts)


@pytest.mark.parametrize("entry", ["sm80", "sm90"])
@pytest.mark.parametrize("layer", BAND_LAYERS)
def test_planned_tactic_bands_run(entry, layer):
    """Every tactic tactic_bands gives GEMM1 (gated) and GEMM2 (finalize on sm90, the store on sm80) of a
    layer, at each band's first and last token count up to MAX_TOKENS, runs and matches the fp64 reference
    (GEMM1 by its rows, GEMM2 by the summed token rows)."""
    if entry == "sm90":
        need_sm90()
    e, top_k, inter, h = layer
    dtype = torch.bfloat16
    gemm1 = gemm_call(entry, "gated", 2 * inter, h, e, top_k, dtype)
    gemm2 = gemm_call(entry, "finalize" if entry == "sm90" else "store", h, inter, e, top_k, dtype)
    seen: set[str] = set()
    gen = torch.Generator(device="cuda").manual_seed(31 + hash((entry, layer)) % 2**31)
    for gemm in (gemm1, gemm2):
        bands = tactic_bands(gemm)
        for tokens in band_token_counts(bands):
            tactic = choose_tactic(gemm, RowCount(tokens, top_k, e))
            assert any(first <= tokens <= (last or tokens) and t == tactic for first, last, t in bands)
            seen.add(tactic.name)
            ids, offsets, p2u, u2p = gemm_lib.route(tokens, e, top_k, gen)
            rows = tokens * top_k
            if gemm is gemm1:
                a, b, _ = make(rows, e, 2 * inter, h, dtype, gen, False, 0)
                ref = reference(a, b, None, offsets, "swiglu")
                c = poisoned((rows, inter), dtype)
                if entry == "sm90":
                    K.grouped_gemm_sm90_gated(a, interleave_gate_up(b), offsets, "swiglu", c=c,
                                              placement=placement_for(tactic), tactic=tactic)
                else:
                    K.grouped_gemm_sm80(a, b, offsets, "swiglu", fused_gated=True, c=c, tactic=tactic)
                check(c, ref, dtype)
            elif entry == "sm90":
                a, b, _ = make(rows, e, h, inter, dtype, gen, False, 0)
                w = torch.rand(tokens, top_k, generator=gen, device="cuda")
                pw = w.flatten()[p2u.long()].contiguous()
                out = torch.zeros(tokens, h, dtype=dtype, device="cuda")
                K.grouped_gemm_sm90_finalize(a, b, offsets, p2u, pw, tokens, top_k, out=out,
                                             placement=placement_for(tactic), tactic=tactic)
                check(out, finalize_reference(a, b, None, offsets, u2p, w), dtype)
            else:
                a, b, bias = make(rows, e, h, inter, dtype, gen, True, h)
                c = poisoned((rows, h), dtype)
                K.grouped_gemm_sm80(a, b, offsets, bias=bias, c=c, tactic=tactic)
                check(c, reference(a, b, bias, offsets, "identity"), dtype)
    kernels = {name.split(":")[0] for name in seen}
    assert kernels == ({"decode", "wgmma"} if entry == "sm90" else {"decode", "mma"}), seen
    if entry == "sm90":
        assert any(":placed:" in name for name in seen) and any(":after_trigger:" in name for name in seen), seen


# ---- launches and L2 policy -------------------------------------------------------------------------

# (tokens, experts, top_k, inter, hidden), all with >= 32 rows per expert: few tiles (most CTAs have
# none and exit at once, so a later CTA of the same launch may land on their SM), about a wave, and many
# waves.
PLACEMENT = [(160, 8, 2, 256, 256), (500, 16, 4, 512, 512), (4096, 128, 8, 768, 2048)]


@pytest.mark.parametrize("tile", ["pingpong64x256", "pingpong64x128"])
@pytest.mark.parametrize("case", PLACEMENT)
def test_sm90_launch_by_placement(gemms, case, tile):
    """Placed tactics (gated GEMM1 and finalize GEMM2 launched after a trigger, CTAs started by placement):
    GEMM1 bit-identical to its plain launch and GEMM2 against the fp64 reference, in launches back to back
    and in CUDA-graph replays (where a kernel's %gridid repeats), each leaving its region's claims zeroed
    for the next."""
    need_sm90()
    t, e, top_k, inter, h = case
    gen = torch.Generator(device="cuda").manual_seed(17 + hash((case, tile)) % 2**31)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows, dtype = t * top_k, torch.bfloat16
    x, w1, _ = make(rows, e, 2 * inter, h, dtype, gen, False, 0)
    a2, w2, _ = make(rows, e, h, inter, dtype, gen, False, 0)
    w1_il = interleave_gate_up(w1)
    w = torch.rand(t, top_k, generator=gen, device="cuda")
    pw = w.flatten()[p2u.long()].contiguous()
    ref = finalize_reference(a2, w2, None, offsets, u2p, w)
    regions = [K.new_gemm_placement("cuda") for _ in range(2)]

    def layer(c, out, placed: bool) -> None:
        out.zero_()
        tactic = f"wgmma:{tile}:{'placed' if placed else 'plain'}:evict_last"
        K.grouped_gemm_sm90_gated(x, w1_il, offsets, "swiglu", c=c, placement=regions[0] if placed else None,
                                  tactic=tactic)
        K.grouped_gemm_sm90_finalize(a2, w2, offsets, p2u, pw, t, top_k, out=out,
                                     placement=regions[1] if placed else None, tactic=tactic)

    plain_c = poisoned((rows, inter), dtype)
    layer(plain_c, torch.empty(t, h, dtype=dtype, device="cuda"), placed=False)
    outs = [(poisoned((rows, inter), dtype), poisoned((t, h), dtype)) for _ in range(3)]
    for c, out in outs:
        layer(c, out, placed=True)
    assert gemms.lib.mb_grouped_gemm_sm90_placement_recorded() == 1, "the first placed call records the placement"
    graph = torch.cuda.CUDAGraph()
    g_c, g_out = poisoned((rows, inter), dtype), poisoned((t, h), dtype)
    with torch.cuda.graph(graph):
        layer(g_c, g_out, placed=True)
    for _ in range(3):
        g_c.fill_(float("nan"))
        graph.replay()
        outs.append((g_c.clone(), g_out.clone()))
    torch.cuda.synchronize()
    for c, out in outs:
        assert torch.equal(c, plain_c), "GEMM1 launched by placement differs from its plain launch"
        check(out, ref, dtype)
    for r in regions:  # slot flags and arrival count: the first half and one ints (then the CTAs' mailboxes)
        assert not r[: r.numel() // 2 + 1].any(), "a launch by placement left its claim slots or count non-zero"


# Rows per expert around whole 64-row tiles: 1, 7, 16, 17 and 63 rows past one, two or four whole tiles,
# under one tile, exactly whole tiles, and empty.
TAIL_COUNTS = [65, 71, 80, 81, 127, 135, 272, 63, 0, 17, 64, 144, 1]


def row_errors(out, ref) -> torch.Tensor:
    return (out.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)


@pytest.mark.parametrize("gated", [True, False])
def test_sm90_rows_past_whole_tiles(gated):
    """Every row right, each expert's last partly filled tile included, in the gated GEMM1 and the finalize
    GEMM2 on the pingpong 64x256 tile, row by row against the fp64 reference (so that a wrong last row
    cannot hide in a whole-output norm)."""
    need_sm90()
    tactic = "wgmma:pingpong64x256:plain:evict_last"
    dtype = torch.bfloat16
    seed = torch.randint(0, 2**31, (1,)).item()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    counts = torch.tensor(TAIL_COUNTS, dtype=torch.int64, device="cuda")
    e, rows = counts.numel(), int(counts.sum())
    offsets = torch.zeros(e + 1, dtype=torch.int64, device="cuda")
    offsets[1:] = counts.cumsum(0)
    if gated:
        n, k = 768, 512
        a, b, bias = make(rows, e, 2 * n, k, dtype, gen, with_bias=True, bias_cols=2 * n)
        ref = reference(a, b, bias, offsets, "swiglu")
        c = poisoned((rows, n), dtype)
        K.grouped_gemm_sm90_gated(a, interleave_gate_up(b), offsets, "swiglu", interleave_gate_up(bias), c=c,
                                  tactic=tactic)
        assert not torch.isnan(c).any(), "unwritten (NaN-poisoned) rows"
        err = row_errors(c, ref)
    else:
        n, k = 512, 768
        a, b, bias = make(rows, e, n, k, dtype, gen, with_bias=True, bias_cols=n)
        p2u = torch.randperm(rows, generator=gen, device="cuda").to(torch.int32)  # top-1: row p -> token p2u[p]
        pw = torch.rand(rows, generator=gen, device="cuda")
        y = reference(a, b, bias, offsets, "identity") * pw.double().unsqueeze(1)
        ref = torch.empty_like(y)
        ref[p2u.long()] = y
        out = torch.zeros(rows, n, dtype=dtype, device="cuda")
        K.grouped_gemm_sm90_finalize(a, b, offsets, p2u, pw, rows, 1, bias, out=out, tactic=tactic)
        err = row_errors(out, ref)
    worst = int(err.argmax())
    assert err.max() < TOL[dtype], f"row {worst} rel error {float(err.max()):.2e} (seed {seed}, offsets {offsets.tolist()})"


def test_sm90_output_l2_policy():
    """The epilogues' L2 evict_last policy and plain stores write the same values: the gated GEMM1
    bit-identical both ways, the finalize GEMM2 against the fp64 reference both ways."""
    need_sm90()
    t, e, top_k, inter, h = 1024, 32, 4, 256, 512
    gen = torch.Generator(device="cuda").manual_seed(31)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows, dtype = t * top_k, torch.bfloat16
    x, w1, _ = make(rows, e, 2 * inter, h, dtype, gen, False, 0)
    a2, w2, _ = make(rows, e, h, inter, dtype, gen, False, 0)
    w = torch.rand(t, top_k, generator=gen, device="cuda")
    pw = w.flatten()[p2u.long()].contiguous()
    ref = finalize_reference(a2, w2, None, offsets, u2p, w)
    gated = {}
    for policy in ("evict_last", "plain"):
        tactic = f"wgmma:pingpong64x256:plain:{policy}"
        c = poisoned((rows, inter), dtype)
        K.grouped_gemm_sm90_gated(x, interleave_gate_up(w1), offsets, "swiglu", c=c, tactic=tactic)
        out = torch.zeros(t, h, dtype=dtype, device="cuda")
        K.grouped_gemm_sm90_finalize(a2, w2, offsets, p2u, pw, t, top_k, out=out, tactic=tactic)
        torch.cuda.synchronize()
        assert not torch.isnan(c).any(), "unwritten (NaN-poisoned) rows"
        check(out, ref, dtype)
        gated[policy] = c
    assert torch.equal(gated["evict_last"], gated["plain"]), "the L2 policy changed the gated GEMM1's values"
