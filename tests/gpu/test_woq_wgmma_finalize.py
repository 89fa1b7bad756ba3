"""The weight-only GEMM2 on wgmma with the finalize in its epilogue (mb_grouped_gemm_woq_sm90_finalize) against an fp64
reference, on a compute capability 9.0 GPU.

Operands as tests/gpu/test_woq_gemm.case makes them (fresh random packed weights, the reference dequantizing them
exactly in fp64), routed as that file's finalize cases (tests/gpu/finalize_routing.py: empty experts, one heavy
expert whose segment spans several token tiles, remote experts' rows past off[E] that must reach no output, and with
top_k <= 4 a token on remote experts only). The expected output, in fp64: each permuted row's product (+ b2) times its
routing weight, added into its token's row of a random pre-filled output (the kernel adds; a remote-only token keeps
its fill exactly).

Error bound, per output element, over the token's local rows j with weights w_j: each row's fp32 value within the
plain store's bound (tests/gpu/test_woq_wgmma.py: 2^-7 (|ref_j| + S_j) + 2^-8 M_j, M_j for int4 only), times w_j,
rounded to the output type before its atomic add, and each of the top_k adds rounds the running sum (at most M1 +
|fill|, M1 = sum_j |w_j ref_j|) once: |out - ref| <= sum_j |w_j| (2^-7 (|ref_j| + S_j) + 2^-8 M_j) + top_k u (M1 +
|fill|), u 2^-8 (bf16) or 2^-11 (fp16). A row added to the wrong token, a feature octet transposed wrongly, a missed
weight or bias put errors of the order of the outputs themselves on most elements.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from test_woq_gemm import case, check_finalize, finalize_case  # noqa: E402
from test_woq_wgmma import TILES, operands, refused_odd_weight_tiles, term_magnitude  # noqa: E402

from moe_build import kernels as K  # noqa: E402
from moe_build.weights.woq import WoqKind, wgmma_scales  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="needs a compute capability 9.0 GPU (scripts/device_run.sh runs these on one)")]


def run(kind: WoqKind, n: int, k: int, group: int, zeros: bool, tile: str, tokens: int, top_k: int,
        bias: bool = False, dtype: torch.dtype = torch.bfloat16) -> None:
    c = finalize_case(kind, n, k, group, zeros, bias, dtype, tokens, top_k)
    dev = c.dev
    b, kernel_kind, s, zs, kernel_group = operands(kind, dev["b"], dev["scales"], dev["zeros"], group, dtype)
    out = c.fill.cuda()
    args = (dev["a"], b, kernel_kind, s, zs, dev["off"], kernel_group, c.ptu, c.weights.cuda(), tokens, top_k)
    kw = dict(bias=dev["bias"], out=out, tactic=f"wgmma:{tile}:plain:plain")
    where = (f"(seed {c.seed}, {kind.value}, counts {c.counts}, n {n}, k {k}, group {group}, zeros {zeros}, {tile}, "
             f"tokens {tokens}, top_k {top_k}, bias {bias}, {dtype})")
    if refused_odd_weight_tiles(tile, n, lambda: K.grouped_gemm_woq_sm90_finalize(*args, **kw),
                                lambda: torch.equal(out.cpu(), c.fill), where):
        return
    K.grouped_gemm_woq_sm90_finalize(*args, **kw)
    torch.cuda.synchronize()
    terms = (term_magnitude(dev, c.counts, c.ref.shape[0], group) if kind is WoqKind.INT4
             else torch.zeros_like(c.ref))[:c.used]
    row_err = 2.0 ** -7 * (c.ref[:c.used].abs() + c.mag[:c.used]) + 2.0 ** -8 * terms
    check_finalize(c, out, row_err, top_k, dtype, where)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("group, zeros", [(64, True), (128, False), (0, True)])
@pytest.mark.parametrize("tokens, top_k", [(300, 4), (40, 2)])
def test_int4_against_fp64(tile: str, group: int, zeros: bool, tokens: int, top_k: int) -> None:
    run(WoqKind.INT4, 208, 512, group, zeros, tile, tokens, top_k)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("n, k, tokens, top_k", [(208, 512, 300, 4), (2880, 2880, 40, 2)])
def test_mxfp4_as_e5m2_against_fp64(tile: str, n: int, k: int, tokens: int, top_k: int) -> None:
    """MXFP4 W2 through its e5m2 form (tests/gpu/test_woq_wgmma.py's operands), with b2."""
    run(WoqKind.MXFP4, n, k, 32, False, tile, tokens, top_k, bias=True)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_int8_bias_and_dtypes(tile: str, dtype: torch.dtype) -> None:
    run(WoqKind.INT8, 256, 768, 0, False, tile, 200, 8, bias=True, dtype=dtype)


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("n, k, group", [(2880, 2880, 64), (2048, 1408, 128), (264, 512, 128)])
@pytest.mark.parametrize("tokens, top_k", [(1, 1), (257, 6)])
def test_int4_shapes_and_counts(tile: str, n: int, k: int, group: int, tokens: int, top_k: int) -> None:
    """n off a multiple of 128 (GPT-OSS's 2880, 264): the last weight tile's features past n add nothing; one token
    of one expert (a tile holding a single token row) and 257 tokens at top-6, with b2."""
    run(WoqKind.INT4, n, k, group, True, tile, tokens, top_k, bias=True)


def test_refusals() -> None:
    """MXFP4, a map or weights of the wrong size, and a non-woq tactic are refused in one line, nothing launched."""
    dev, _, _, _ = case(WoqKind.INT4, [4, 4], 128, 256, 128, True, False, torch.bfloat16, 0, pad_rows=0)
    s, zs = wgmma_scales(WoqKind.INT4, dev["scales"], dev["zeros"], torch.bfloat16)
    ptu, w = torch.arange(8, dtype=torch.int32, device="cuda"), torch.ones(8, device="cuda")
    t = "wgmma:woq128x64:plain:plain"
    with pytest.raises(ValueError, match="mxfp4"):
        K.grouped_gemm_woq_sm90_finalize(dev["a"], dev["b"], "mxfp4", s, zs, dev["off"], 128, ptu, w, 4, 2, tactic=t)
    with pytest.raises(ValueError, match="permuted_weights"):
        K.grouped_gemm_woq_sm90_finalize(dev["a"], dev["b"], "int4", s, zs, dev["off"], 128, ptu, w[:6], 4, 2,
                                         tactic=t)
    out = torch.full((4, 128), 7.0, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(K.KernelError, match="no kernel for tactic"):
        K.grouped_gemm_woq_sm90_finalize(dev["a"], dev["b"], "int4", s, zs, dev["off"], 128, ptu, w, 4, 2, out=out,
                                         tactic="wgmma:coop128x128:plain:plain")
    torch.cuda.synchronize()
    assert bool((out == 7.0).all()), "a refused call wrote its output"
