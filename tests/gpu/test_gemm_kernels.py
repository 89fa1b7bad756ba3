"""Grouped-GEMM entry points (cpp/src/gemm_sm80.cu, gemm_sm90.cu) against an fp64 reference.

Fresh random data for every case, outputs poisoned with NaN first and checked fully written,
uneven and empty expert segments, every path (the decode kernel, mma.sync and CUTLASS wgmma, forced
through MB_SM90_GEMM_PATH / MB_SM80_GEMM_PATH, every wgmma tile through MB_SM90_WGMMA_TILE, the decode kernel's K-slice counts
through MB_DECODE_KSPLIT) and the automatic choice. Plain GEMMs claim bit-reproducible results, so
the sm90 tests run every call twice and compare bits where the path claims it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from moe_build.weights import block_64x64, blocks_fit, interleave_gate_up  # noqa: E402  (after the torch skip)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

_spec = importlib.util.spec_from_file_location(
    "gemm_lib", Path(__file__).resolve().parents[2] / "cpp" / "tests" / "gemm_lib.py")
gemm_lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemm_lib)

TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}


@pytest.fixture(scope="module")
def gemms():
    return gemm_lib.Gemms(gemm_lib.load())


def is_sm90() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


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
    if name == "gelu":  # the tanh form, as moe_build.reference and every kernel (cpp/src/act_math.cuh)
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


# (experts, rows, n, k): every tile size (avg rows/expert <= 16, <= 64, > 64), N/K multiples of
# 64 and not (2880 = 45*64, 200, 136), single rows and 8192 rows.
# Decode shapes with long K ((8, 2, 512, 14336), (8, 5, 264, 1000): K tail, N not a multiple of
# 64) give the decode kernel's K slices room for every forced slice count.
SHAPES = [(8, 1, 256, 128), (8, 100, 200, 136), (8, 500, 2880, 2880), (16, 8192, 512, 256),
          (128, 8192, 192, 512), (128, 3, 1536, 2048), (64, 1000, 1408, 2048), (8, 2, 512, 14336),
          (8, 5, 264, 1000)]
ACTS = ["identity", "relu", "silu", "gelu"]


@pytest.fixture(params=["auto", "decode", "mma"])
def sm80_path(request, monkeypatch):
    """Forces the sm80 entry point's path (decode kernel or mma.sync tiles) through MB_SM80_GEMM_PATH."""
    monkeypatch.delenv("MB_SM80_GEMM_PATH", raising=False)
    if request.param != "auto":
        monkeypatch.setenv("MB_SM80_GEMM_PATH", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm80_bias_act(gemms, sm80_path, shape, dtype):
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(hash((shape, str(dtype), sm80_path)) % 2**31)
    offsets = segments(e, rows, gen)
    for i, act in enumerate(ACTS):
        a, b, bias = make(rows, e, n, k, dtype, gen, with_bias=i % 2 == 0, bias_cols=n)
        c = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
        assert gemms.sm80(a, b, bias, c, offsets, rows, n, k, act) == 0, gemms.error()
        check(c, reference(a, b, bias, offsets, act), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm80_fused_gated(gemms, sm80_path, shape, dtype):
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(1 + hash((shape, str(dtype), sm80_path)) % 2**31)
    offsets = segments(e, rows, gen)
    for act, a, b, bias, alpha, limit in gated_cases(rows, e, n, k, dtype, gen):
        c = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
        assert gemms.sm80(a, b, bias, c, offsets, rows, n, k, act, alpha, limit) == 0, gemms.error()
        check(c, reference(a, b, bias, offsets, act, alpha, limit), dtype)


def test_sm80_rejects(gemms):
    gen = torch.Generator(device="cuda").manual_seed(7)
    offsets = segments(8, 64, gen)
    a, b, _ = make(64, 8, 100, 128, torch.bfloat16, gen, False, 0)
    c = torch.empty(64, 100, dtype=torch.bfloat16, device="cuda")
    assert gemms.sm80(a, b, None, c, offsets, 64, 100, 128, "identity") == 1  # N % 8 != 0
    assert gemms.lib.mb_grouped_gemm_sm80(a.data_ptr(), b.data_ptr(), None, c.data_ptr(), offsets.data_ptr(), 8,
                                          64, 96, 128, 1, 4, 0, 1.0, 0.0, None, 0, 0) == 1  # gated act, not fused
    af = a.float()
    assert gemms.sm80(af, b.float(), None, c.float(), offsets, 64, 96, 128, "identity") == 2  # fp32


@pytest.fixture(params=["auto", "decode", "decode:ksplit=1", "decode:ksplit=8", "mma", "wgmma:coop128x256",
                        "wgmma:pingpong64x256", "wgmma:pingpong64x128", "wgmma:pingpong64x256c2",
                        "wgmma:pingpong64x192c2"])
def sm90_path(request, monkeypatch):
    """Forces the sm90 entry points' path (and wgmma tile or decode K-slice count) through their
    environment knobs."""
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    for key in ("MB_SM90_GEMM_PATH", "MB_SM90_WGMMA_TILE", "MB_DECODE_KSPLIT"):
        monkeypatch.delenv(key, raising=False)
    if request.param != "auto":
        path, _, tile = request.param.partition(":")
        monkeypatch.setenv("MB_SM90_GEMM_PATH", path)
        if tile.startswith("ksplit="):
            monkeypatch.setenv("MB_DECODE_KSPLIT", tile[len("ksplit="):])
        elif tile:
            monkeypatch.setenv("MB_SM90_WGMMA_TILE", tile)
    return request.param


@pytest.fixture(params=["row_major", "blocked64"])
def layout(request):
    """The weights' storage the sm90 entry points are given (mb_weight_layout)."""
    return request.param


def stored(b, layout: str):
    """B as the entry point reads it under `layout` (the reference keeps using the row-major B); sizes
    that do not tile into blocks are passed as they are, for the entry point to refuse."""
    return block_64x64(b) if layout == "blocked64" and blocks_fit(b.shape[1], b.shape[2]) else b


def layout_refusal(layout: str, sm90_path: str, rows_b: int, k: int) -> tuple[int, str] | None:
    """(status, message part) an sm90 entry point must answer for blocked weights it cannot take:
    rows or k not multiples of 64 (invalid), the mma.sync path or the 96-row multicast slices of
    pingpong64x192c2 (unsupported); None where it must run."""
    if layout != "blocked64":
        return None
    if rows_b % 64 or k % 64:
        return 1, "multiples of 64"
    if sm90_path == "mma":
        return 2, "row-major weights only"
    if sm90_path == "wgmma:pingpong64x192c2":
        return 2, "64-row blocks"
    return None


def assert_refused(status: int, refusal: tuple[int, str], gemms, out) -> None:
    assert status == refusal[0] and refusal[1] in gemms.error(), (status, gemms.error())
    assert torch.isnan(out).all() or not out.any(), "a refused call wrote its output"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm90_plain(gemms, sm90_path, layout, shape, dtype):
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(2 + hash((shape, str(dtype), sm90_path, layout)) % 2**31)
    offsets = segments(e, rows, gen)
    refusal = layout_refusal(layout, sm90_path, n, k)
    for with_bias in (True, False):
        a, b, bias = make(rows, e, n, k, dtype, gen, with_bias, n)
        ref = reference(a, b, bias, offsets, "identity")
        outs = []
        for _ in range(2):
            c = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
            st = gemms.sm90(a, stored(b, layout), bias, c, offsets, rows, n, k, layout)
            if refusal:
                assert_refused(st, refusal, gemms, c)
                return
            assert st == 0, gemms.error()
            check(c, ref, dtype)
            outs.append(c)
        assert torch.equal(outs[0], outs[1]), "plain grouped GEMM must be bit-reproducible"


@pytest.mark.parametrize("shape", [(8, 2, 512, 14336), (128, 3, 1536, 2048)])
def test_sm90_decode_without_workspace(gemms, shape):
    """A decode call needs no workspace: given none it runs (the decode kernel) instead of failing."""
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(5 + hash(shape) % 2**31)
    offsets = segments(e, rows, gen)
    a, b, bias = make(rows, e, n, k, torch.bfloat16, gen, True, n)
    c = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    st = gemms.lib.mb_grouped_gemm_sm90(a.data_ptr(), b.data_ptr(), bias.data_ptr(), c.data_ptr(),
                                        offsets.data_ptr(), e, rows, n, k, gemm_lib.MB_BF16,
                                        gemm_lib.LAYOUTS["row_major"], None, 0, torch.cuda.current_stream().cuda_stream)
    assert st == 0, gemms.error()
    check(c, reference(a, b, bias, offsets, "identity"), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_sm90_gated(gemms, sm90_path, layout, shape, dtype):
    """GEMM1 with the gated activation in its epilogue, on every path and tile: W1 is handed over
    gate/up-interleaved (then blocked, under blocked64), the reference multiplies the stacked W1
    (n = the intermediate size here)."""
    e, rows, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(4 + hash((shape, str(dtype), sm90_path, layout)) % 2**31)
    offsets = segments(e, rows, gen)
    refusal = layout_refusal(layout, sm90_path, 2 * n, k)
    for act, a, b, bias, alpha, limit in gated_cases(rows, e, n, k, dtype, gen):
        ref = reference(a, b, bias, offsets, act, alpha, limit)
        b_il = interleave_gate_up(b)
        bias_il = None if bias is None else interleave_gate_up(bias)
        outs = []
        for _ in range(2):
            c = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
            st = gemms.sm90_gated(a, stored(b_il, layout), bias_il, c, offsets, rows, n, k, act, alpha, limit, layout)
            if refusal:
                assert_refused(st, refusal, gemms, c)
                return
            assert st == 0, gemms.error()
            check(c, ref, dtype)
            outs.append(c)
        assert torch.equal(outs[0], outs[1]), "the gated GEMM (no atomics) must be bit-reproducible"


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("shape", [(16, 1000, 200, 136), (64, 4000, 1408, 2048), (8, 700, 2880, 512)])
def test_sm90_reads_past_segments_never_reach_outputs(gemms, sm90_path, layout, shape, gated):
    """The wgmma path's TMA tiles run past an expert's rows into the next expert's (and past off[E] up
    to max_rows), and past its N columns into the next expert's weights. Poisoned with NaN there (rows
    after off[E], the weights of experts with no rows), none of it may reach an output: the kept rows
    match the fp64 reference and the rows past off[E] are left unwritten."""
    e, used, n, k = shape
    extra = 77  # rows of A (and C) past off[E], up to max_rows
    gen = torch.Generator(device="cuda").manual_seed(6 + hash((shape, gated, sm90_path, layout)) % 2**31)
    counts = segments(e, used, gen).diff()
    counts[0] += counts[1]  # expert 1 gets no rows, so expert 0's last column tile reads its NaN weights
    counts[1] = 0
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    empty = (counts == 0).nonzero().flatten()
    act = "swiglu" if gated else "identity"
    a, b, bias = make(used + extra, e, 2 * n if gated else n, k, torch.bfloat16, gen, True, 2 * n if gated else n)
    ref = reference(a[:used], b, bias, offsets, act)
    a[used:] = float("nan")
    b[empty] = float("nan")
    c = torch.full((used + extra, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    if gated:
        st = gemms.sm90_gated(a, stored(interleave_gate_up(b), layout), interleave_gate_up(bias), c, offsets,
                              used + extra, n, k, act, layout=layout)
    else:
        st = gemms.sm90(a, stored(b, layout), bias, c, offsets, used + extra, n, k, layout)
    refusal = layout_refusal(layout, sm90_path, 2 * n if gated else n, k)
    if refusal:
        assert_refused(st, refusal, gemms, c)
        return
    assert st == 0, gemms.error()
    check(c[:used], ref, torch.bfloat16)
    assert torch.isnan(c[used:]).all(), "rows past off[E] were written"


def test_sm90_gated_rejects(gemms):
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    gen = torch.Generator(device="cuda").manual_seed(13)
    offsets = segments(8, 64, gen)
    a, b, _ = make(64, 8, 2 * 100, 128, torch.bfloat16, gen, False, 0)
    c = torch.empty(64, 100, dtype=torch.bfloat16, device="cuda")
    assert gemms.sm90_gated(a, b, None, c, offsets, 64, 100, 128, "swiglu") == 1  # inter % 8 != 0
    assert "multiple of 8" in gemms.error()
    a, b, _ = make(64, 8, 2 * 96, 128, torch.bfloat16, gen, False, 0)
    assert gemms.sm90_gated(a, b, None, c, offsets, 64, 96, 128, "silu") == 1  # not a gated activation
    assert "swiglu" in gemms.error()


@pytest.mark.parametrize("gated", [False, True])
def test_sm90_wgmma_rejects_a_misaligned_output(gemms, monkeypatch, gated):
    """The wgmma epilogues store 16-byte vectors: an output 2 bytes off alignment is refused with an
    error, never written."""
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    monkeypatch.setenv("MB_SM90_GEMM_PATH", "wgmma")
    gen = torch.Generator(device="cuda").manual_seed(14)
    rows, e, n, k = 256, 8, 128, 128
    offsets = segments(e, rows, gen)
    a, b, _ = make(rows, e, 2 * n if gated else n, k, torch.bfloat16, gen, False, 0)
    flat = torch.full((rows * n + 1,), float("nan"), dtype=torch.bfloat16, device="cuda")
    c = flat[1:].view(rows, n)
    st = gemms.sm90_gated(a, b, None, c, offsets, rows, n, k, "swiglu") if gated else \
        gemms.sm90(a, b, None, c, offsets, rows, n, k)
    assert st == 1
    assert "16-byte aligned" in gemms.error()
    assert torch.isnan(flat).all()


# (tokens, experts, top_k, n, k)
FINALIZE = [(1, 8, 2, 4096, 512), (16, 128, 8, 2048, 768), (300, 64, 6, 2048, 1408), (2048, 8, 2, 512, 1024),
            (1024, 32, 4, 2880, 2880), (700, 16, 1, 200, 136), (1, 8, 2, 1024, 14336), (3, 64, 6, 2048, 1408)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", FINALIZE)
def test_sm90_finalize(gemms, sm90_path, layout, case, dtype):
    t, e, top_k, n, k = case
    gen = torch.Generator(device="cuda").manual_seed(3 + hash((case, str(dtype), sm90_path, layout)) % 2**31)
    refusal = layout_refusal(layout, sm90_path, n, k)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows = t * top_k
    a, b, bias = make(rows, e, n, k, dtype, gen, with_bias=t % 2 == 0, bias_cols=n)
    w = torch.rand(t, top_k, generator=gen, device="cuda")
    pw = w.flatten()[p2u.long()].contiguous()
    # reference: out[t] = sum_j w[t,j] * (A[u2p[t*K+j]] @ B[ids[t,j]]^T + bias[ids[t,j]])
    y = reference(a, b, bias, offsets, "identity")
    ref = (y[u2p].view(t, top_k, n) * w.double().unsqueeze(-1)).sum(1)
    outs = []
    for _ in range(2):
        out = torch.zeros(t, n, dtype=dtype, device="cuda")
        st = gemms.sm90_finalize(a, stored(b, layout), bias, out, offsets, p2u, pw, rows, t, top_k, n, k, layout)
        if refusal:
            assert_refused(st, refusal, gemms, out)
            return
        assert st == 0, gemms.error()
        check(out, ref, dtype)
        outs.append(out)
    if top_k <= 2:
        assert torch.equal(outs[0], outs[1]), "finalize with top_k <= 2 must be bit-reproducible"


def test_sm90_rejects(gemms):
    gen = torch.Generator(device="cuda").manual_seed(11)
    offsets = segments(8, 64, gen)
    a, b, _ = make(64, 8, 96, 128, torch.bfloat16, gen, False, 0)
    c = torch.empty(64, 96, dtype=torch.bfloat16, device="cuda")
    if not is_sm90():
        assert gemms.sm90(a, b, None, c, offsets, 64, 96, 128) == 2
        return
    assert gemms.sm90(a, b, None, c, offsets, 64, 96, 120 + 4) == 1  # K % 8 != 0
    ws = gemms.workspace_sm90(8, 64, 96, 128)
    assert gemms.lib.mb_grouped_gemm_sm90(a.data_ptr(), b.data_ptr(), None, c.data_ptr(), offsets.data_ptr(), 8, 64,
                                          96, 128, gemm_lib.MB_BF16, 7, ws.data_ptr(), ws.numel(),
                                          torch.cuda.current_stream().cuda_stream) == 1  # no such weight layout
    assert "weight_layout 7" in gemms.error()
    assert gemms.sm90(a.float(), b.float(), None, c.float(), offsets, 64, 96, 128) == 2


# (tokens, experts, top_k, inter, hidden), all with >= 32 rows per expert (kPlacedMinAvgRows): few tiles
# (most CTAs have none and exit at once, so a later CTA of the same launch may land on their SM), about a
# wave, and many waves.
PLACEMENT = [(160, 8, 2, 256, 256), (500, 16, 4, 512, 512), (4096, 128, 8, 768, 2048)]


@pytest.mark.parametrize("case", PLACEMENT)
def test_sm90_launch_by_placement(gemms, case):
    """Given claim regions, the gated GEMM1 and the finalize GEMM2 launch after a trigger and start their
    CTAs by placement: GEMM1 bit-identical to its plain launch and GEMM2 against the fp64 reference, in
    launches back to back and in CUDA-graph replays (where a kernel's %gridid repeats), each leaving its
    region's claims zeroed for the next."""
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    t, e, top_k, inter, h = case
    gen = torch.Generator(device="cuda").manual_seed(17 + hash(case) % 2**31)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows, dtype = t * top_k, torch.bfloat16
    x, w1, _ = make(rows, e, 2 * inter, h, dtype, gen, False, 0)
    a2, w2, _ = make(rows, e, h, inter, dtype, gen, False, 0)
    w1_il = interleave_gate_up(w1)
    w = torch.rand(t, top_k, generator=gen, device="cuda")
    pw = w.flatten()[p2u.long()].contiguous()
    ref = (reference(a2, w2, None, offsets, "identity")[u2p].view(t, top_k, h) * w.double().unsqueeze(-1)).sum(1)
    regions = [torch.zeros(gemms.placement_ints(), dtype=torch.int32, device="cuda") for _ in range(2)]

    def layer(c, out, placed: bool) -> None:
        out.zero_()
        st = gemms.sm90_gated(x, w1_il, None, c, offsets, rows, inter, h, "swiglu",
                              placement=regions[0] if placed else None)
        assert st == 0, gemms.error()
        st = gemms.sm90_finalize(a2, w2, None, out, offsets, p2u, pw, rows, t, top_k, h, inter,
                                 placement=regions[1] if placed else None)
        assert st == 0, gemms.error()

    plain_c = torch.full((rows, inter), float("nan"), dtype=dtype, device="cuda")
    layer(plain_c, torch.empty(t, h, dtype=dtype, device="cuda"), placed=False)
    outs = [(torch.full((rows, inter), float("nan"), dtype=dtype, device="cuda"),
             torch.full((t, h), float("nan"), dtype=dtype, device="cuda")) for _ in range(3)]
    for c, out in outs:
        layer(c, out, placed=True)
    assert gemms.lib.mb_grouped_gemm_sm90_placement_recorded() == 1, "the first placed call records the placement"
    graph = torch.cuda.CUDAGraph()
    g_c = torch.full((rows, inter), float("nan"), dtype=dtype, device="cuda")
    g_out = torch.full((t, h), float("nan"), dtype=dtype, device="cuda")
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
def test_sm90_rows_past_whole_tiles(gemms, monkeypatch, gated):
    """Every row right, each expert's last partly filled tile included, in the gated GEMM1 and the finalize
    GEMM2 on the pingpong 64x256 tile, row by row against the fp64 reference (so that a wrong last row
    cannot hide in a whole-output norm)."""
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    monkeypatch.setenv("MB_SM90_GEMM_PATH", "wgmma")
    monkeypatch.setenv("MB_SM90_WGMMA_TILE", "pingpong64x256")
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
        c = torch.full((rows, n), float("nan"), dtype=dtype, device="cuda")
        st = gemms.sm90_gated(a, interleave_gate_up(b), interleave_gate_up(bias), c, offsets, rows, n, k, "swiglu")
        assert st == 0, gemms.error()
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
        st = gemms.sm90_finalize(a, b, bias, out, offsets, p2u, pw, rows, rows, 1, n, k)
        assert st == 0, gemms.error()
        err = row_errors(out, ref)
    worst = int(err.argmax())
    assert err.max() < TOL[dtype], f"row {worst} rel error {float(err.max()):.2e} (seed {seed}, offsets {offsets.tolist()})"


def test_sm90_output_l2_policy(gemms, monkeypatch):
    """The epilogues' L2 evict_last policy (the default) and MB_SM90_OUTPUT_L2=plain write the same values: the
    gated GEMM1 bit-identical both ways, the finalize GEMM2 against the fp64 reference both ways."""
    if not is_sm90():
        pytest.skip("sm_90a kernels need a compute capability 9.0 device")
    monkeypatch.setenv("MB_SM90_GEMM_PATH", "wgmma")
    t, e, top_k, inter, h = 1024, 32, 4, 256, 512
    gen = torch.Generator(device="cuda").manual_seed(31)
    ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
    rows, dtype = t * top_k, torch.bfloat16
    x, w1, _ = make(rows, e, 2 * inter, h, dtype, gen, False, 0)
    a2, w2, _ = make(rows, e, h, inter, dtype, gen, False, 0)
    w = torch.rand(t, top_k, generator=gen, device="cuda")
    pw = w.flatten()[p2u.long()].contiguous()
    ref = (reference(a2, w2, None, offsets, "identity")[u2p].view(t, top_k, h) * w.double().unsqueeze(-1)).sum(1)
    gated = {}
    for policy in ("evict_last", "plain"):
        if policy == "plain":
            monkeypatch.setenv("MB_SM90_OUTPUT_L2", "plain")
        c = torch.full((rows, inter), float("nan"), dtype=dtype, device="cuda")
        assert gemms.sm90_gated(x, interleave_gate_up(w1), None, c, offsets, rows, inter, h, "swiglu") == 0, gemms.error()
        out = torch.zeros(t, h, dtype=dtype, device="cuda")
        assert gemms.sm90_finalize(a2, w2, None, out, offsets, p2u, pw, rows, t, top_k, h, inter) == 0, gemms.error()
        torch.cuda.synchronize()
        assert not torch.isnan(c).any(), "unwritten (NaN-poisoned) rows"
        check(out, ref, dtype)
        gated[policy] = c
    assert torch.equal(gated["evict_last"], gated["plain"]), "the L2 policy changed the gated GEMM1's values"
