"""Stage kernels (routing, both routing prologues, expand rows, FC1 activation, finalize; cpp/src/stages/)
against fp64 PyTorch references written here.

Every case draws fresh random inputs, poisons the outputs (NaN for floats, a sentinel for ints)
and checks that every element was written. Prologue maps must equal a torch stable sort exactly;
numeric outputs are compared by ||out - ref|| / ||ref|| with METHOD.md's per-dtype bounds.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

from moe_build import kernels as K  # noqa: E402  (after the skip: loading may build the library)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}
TOPKS = (1, 2, 3, 4, 5, 6, 8)
TOKENS = (1, 255, 256, 257, 8192)
SENTINEL = -(2 ** 31)


@pytest.fixture(scope="module", autouse=True)
def lib():
    return K.load_library()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "output has NaN (unwritten or poisoned)"
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def nan_like(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def sentinel(shape: tuple[int, ...], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.full(shape, SENTINEL, dtype=dtype, device="cuda")


def stable_topk(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest per row, equal keys toward the lower index (stable sort)."""
    return torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :k]


def random_ids(t: int, e: int, k: int) -> torch.Tensor:
    """k distinct experts per token, as routing produces."""
    return torch.rand(t, e, device="cuda").argsort(dim=1)[:, :k].to(torch.int32).contiguous()


# ---- routing ----------------------------------------------------------------------------------

def ref_group_mask(key: torch.Tensor, groups: int, topk_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(eligible-expert mask, group scores) for grouped top-k: score = sum of a group's top-2."""
    t, e = key.shape
    gscore = key.view(t, groups, e // groups).topk(2, dim=-1).values.sum(-1)
    chosen = torch.zeros(t, groups, dtype=torch.bool, device=key.device)
    chosen.scatter_(1, stable_topk(gscore, topk_groups), True)
    return chosen.repeat_interleave(e // groups, dim=1), gscore


def ref_weights(x: torch.Tensor, ids: torch.Tensor, method: K.Routing, renorm: bool, scale: float) -> torch.Tensor:
    """fp64 routing weights of the experts `ids` for logits x (fp64)."""
    ids = ids.long()
    if method is K.Routing.SOFTMAX_TOPK:
        w = torch.softmax(x, dim=-1).gather(1, ids)
    elif method is K.Routing.TOPK_SOFTMAX:
        w = torch.softmax(x.gather(1, ids), dim=-1)
    else:
        w = torch.sigmoid(x).gather(1, ids)
    if renorm and method is not K.Routing.TOPK_SOFTMAX:
        w = w / w.sum(-1, keepdim=True)
    return w * scale


def run_routing(logits: torch.Tensor, k: int, method: K.Routing, renorm: bool, bias: torch.Tensor | None,
                groups: int, topk_groups: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    t = logits.shape[0]
    ids, w = sentinel((t, k)), nan_like((t, k), torch.float32)
    K.routing(logits, k, method, renorm, bias, groups, topk_groups, scale, topk_ids=ids, topk_weights=w)
    torch.cuda.synchronize()
    assert (ids != SENTINEL).all() and not torch.isnan(w).any(), "routing left outputs unwritten"
    assert ((ids >= 0) & (ids < logits.shape[1])).all()
    assert (ids.sort(dim=1).values.diff(dim=1) != 0).all(), "an expert chosen twice for one token"
    return ids, w


ROUTING_CASES = [
    # (method, renormalize, groups, topk_groups, scale)
    (K.Routing.SOFTMAX_TOPK, False, 1, 1, 1.0),
    (K.Routing.SOFTMAX_TOPK, True, 1, 1, 1.0),
    (K.Routing.TOPK_SOFTMAX, False, 1, 1, 1.0),
    (K.Routing.SIGMOID_GROUPED, True, 8, 4, 2.5),   # DeepSeek-V3 style
    (K.Routing.SIGMOID_GROUPED, False, 1, 1, 1.0),  # plain sigmoid top-k with bias
]


@pytest.mark.parametrize("case", ROUTING_CASES, ids=lambda c: f"{c[0].name.lower()}-renorm{int(c[1])}-g{c[2]}")
@pytest.mark.parametrize("k", TOPKS)
def test_routing(case: tuple, k: int) -> None:
    method, renorm, groups, topk_groups, scale = case
    for i, t in enumerate(TOKENS):
        e = (8, 64, 128, 256, 256)[(i + k) % 5]
        dtype = DTYPES[(i + k) % 3]
        if groups > 1 and e // groups < 2:
            e = 64
        logits = (torch.randn(t, e, device="cuda") * 2).to(dtype)
        sigmoid = method is K.Routing.SIGMOID_GROUPED
        bias = torch.randn(e, device="cuda") * 0.1 if sigmoid else None
        ids, w = run_routing(logits, k, method, renorm, bias, groups, topk_groups, scale)
        check_routing(logits, bias, ids, w, case, k)


def check_routing(logits: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor, w: torch.Tensor, case: tuple,
                  k: int) -> None:
    """ids / weights of a routing (ROUTING_CASES' `case`) against the fp64 reference: the ids of a stable top-k of
    the keys (exactly where the keys are the logits), the weights within 1e-5."""
    method, renorm, groups, topk_groups, scale = case
    t, e = logits.shape
    sigmoid = method is K.Routing.SIGMOID_GROUPED
    x = logits.double()
    key = torch.sigmoid(x) + bias.double() if sigmoid else x
    eligible, gscore = (ref_group_mask(key, groups, topk_groups) if groups > 1
                        else (torch.ones_like(key, dtype=torch.bool), None))
    ref_ids = stable_topk(key.masked_fill(~eligible, -math.inf), k)
    if not sigmoid:
        # Keys are the logits themselves, exact in fp32: the selection must match exactly.
        assert torch.equal(ids.long(), ref_ids), f"t={t} e={e} dtype={logits.dtype}"
    else:
        # Keys are rounded fp32 sums: accept a different choice only at a near-tie.
        tol = 1e-6
        sel = key.gather(1, ids.long())
        assert (sel.diff(dim=1) <= tol).all(), "ids not in descending key order"
        kth = key.masked_fill(~eligible, -math.inf).sort(dim=1, descending=True).values[:, k - 1:k]
        clear = torch.ones(t, dtype=torch.bool, device="cuda")
        if gscore is not None:
            gs = gscore.sort(dim=1, descending=True).values
            clear = gs[:, topk_groups - 1] - gs[:, topk_groups] > tol
            picked_groups = ids.long() // (e // groups)
            assert (gscore.gather(1, picked_groups) >= gs[:, topk_groups - 1:topk_groups] - tol).all()
        assert (sel[clear] >= kth[clear] - tol).all(), "a clearly non-top-k expert was chosen"
        assert (ids.long() != ref_ids).any(dim=1).float().mean() < 0.01
    assert rel_err(w, ref_weights(x, ids, method, renorm, scale)) < 1e-5


@pytest.mark.parametrize("method", list(K.Routing), ids=lambda m: m.name.lower())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_routing_ties_break_toward_lower_id(method: K.Routing, dtype: torch.dtype) -> None:
    """Integer logits tie everywhere; the ids must match a stable sort exactly."""
    t, e, k = 1024, 64, 6
    sigmoid = method is K.Routing.SIGMOID_GROUPED
    # Non-negative for sigmoid: sigmoid(a) + sigmoid(-a) == 1 would create group-score ties that
    # only rounding breaks.
    logits = torch.randint(0 if sigmoid else -3, 4, (t, e), device="cuda").to(dtype)
    groups, topk_groups = (8, 3) if sigmoid else (1, 1)
    ids, _ = run_routing(logits, k, method, True, None, groups, topk_groups, 1.0)
    key = torch.sigmoid(logits.double()) if sigmoid else logits.double()
    if sigmoid:
        eligible, _ = ref_group_mask(key, groups, topk_groups)
        key = key.masked_fill(~eligible, -math.inf)
    assert torch.equal(ids.long(), stable_topk(key, k))


@pytest.mark.parametrize("e,groups,topk_groups", [(1024, 64, 8), (512, 256, 20)])
def test_routing_more_groups_than_lanes(e: int, groups: int, topk_groups: int) -> None:
    """More groups than a warp's 32 lanes (each lane scores groups lane, lane + 32, ...), of 16 and of 2 experts."""
    t, k = 300, 8
    logits = torch.randn(t, e, device="cuda") * 2
    bias = torch.randn(e, device="cuda") * 0.1
    ids, w = run_routing(logits, k, K.Routing.SIGMOID_GROUPED, True, bias, groups, topk_groups, 1.0)
    x = logits.double()
    key = torch.sigmoid(x) + bias.double()
    eligible, _ = ref_group_mask(key, groups, topk_groups)
    ref_ids = stable_topk(key.masked_fill(~eligible, -math.inf), k)
    assert (ids.long() != ref_ids).any(dim=1).float().mean() < 0.01  # fp32 keys: a different pick at near-ties only
    assert rel_err(w, ref_weights(x, ids, K.Routing.SIGMOID_GROUPED, True, 1.0)) < 1e-5


@pytest.mark.parametrize("e,k", [(1024, 8), (1024, 1024), (512, 300)])
def test_routing_many_experts(e: int, k: int) -> None:
    """Large E and K: the per-warp staging passes 48 KB of shared memory at (1024, 1024)."""
    logits = torch.randn(300, e, device="cuda")
    ids, w = run_routing(logits, k, K.Routing.SOFTMAX_TOPK, True, None, 1, 1, 1.0)
    assert torch.equal(ids.long(), stable_topk(logits.double(), k))
    assert rel_err(w, ref_weights(logits.double(), ids, K.Routing.SOFTMAX_TOPK, True, 1.0)) < 1e-5


@pytest.mark.parametrize("route", (K.routing, K.routing_prologue_fused_routing, K.routing_prologue_three_step_routing),
                         ids=("routing", "in_fused_prologue", "in_three_step_prologue"))
def test_routing_rejects_bad_arguments(route) -> None:
    """Every routing entry point (the routing kernel's and the two prologues' that route) checks alike."""
    logits = torch.randn(4, 8, device="cuda")
    with pytest.raises(K.KernelError, match="top_k") as err:
        route(logits, 9)
    assert err.value.status is K.Status.INVALID_ARGUMENT
    with pytest.raises(K.KernelError, match="num_groups"):
        route(logits, 2, K.Routing.SIGMOID_GROUPED, num_groups=3, topk_groups=1)
    with pytest.raises(K.KernelError, match="correction_bias"):
        route(logits, 2, correction_bias=torch.zeros(8, device="cuda"))
    with pytest.raises(ValueError, match="logits"):
        route(logits.cpu(), 2)
    with pytest.raises(K.KernelError) as err:
        route(torch.randn(4, 1025, device="cuda"), 2)
    assert err.value.status is K.Status.UNSUPPORTED


# ---- routing prologues ------------------------------------------------------------------------

def ref_maps(ids: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    key = ids.flatten().long()
    key = torch.where((key >= 0) & (key < e), key, e)
    sorted_keys, ptu = torch.sort(key, stable=True)
    utp = torch.empty_like(ptu)
    utp[ptu] = torch.arange(ptu.numel(), device=ptu.device)
    off = torch.searchsorted(sorted_keys, torch.arange(e + 1, device=key.device))
    return ptu, utp, off


def check_maps(build, ids: torch.Tensor, e: int) -> None:
    ptu, utp, off = build(ids, e)
    torch.cuda.synchronize()
    r_ptu, r_utp, r_off = ref_maps(ids, e)
    assert torch.equal(ptu.long(), r_ptu), "permuted_to_unpermuted"
    assert torch.equal(utp.long(), r_utp), "unpermuted_to_permuted"
    assert torch.equal(off, r_off), "expert_first_token_offset"


def poisoned(build):
    """Run a map builder into sentinel-filled outputs (fresh torch.empty memory could already hold
    the right answer from a previous case)."""
    def run(ids: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = ids.numel()
        return build(ids, e, sentinel((n,)), sentinel((n,)), sentinel((e + 1,), torch.int64))
    return run


@pytest.mark.parametrize("k", (1, 2, 4, 6, 8))
@pytest.mark.parametrize("e", (8, 64, 256, 510))
@pytest.mark.parametrize("t", (1, 4, 16, 33, 255, 256))  # up to 32 rows the maps are counted straight off the keys
def test_routing_prologue_fused(t: int, e: int, k: int) -> None:
    check_maps(poisoned(K.routing_prologue_fused), random_ids(t, e, k), e)
    # Wrapper path, and ids of experts on other nodes (outside [0, E)) sorting last.
    ids = torch.randint(-2, e + 3, (t, k), device="cuda", dtype=torch.int32)
    check_maps(K.routing_prologue_fused, ids, e)


@pytest.mark.parametrize("k", TOPKS)
@pytest.mark.parametrize("t", TOKENS)
def test_routing_prologue_three_step(t: int, k: int) -> None:
    for e in (8, 256):
        check_maps(poisoned(K.routing_prologue_three_step), random_ids(t, e, k), e)
    # Skewed load (most rows on a few experts) and out-of-node ids.
    ids = (torch.rand(t, k, device="cuda") ** 4 * 70).to(torch.int32) - 2
    check_maps(poisoned(K.routing_prologue_three_step), ids.contiguous(), 64)


@pytest.mark.parametrize("t,k,e", [(40000, 8, 256), (20000, 8, 8), (3000, 6, 4096), (0, 4, 64)])
def test_routing_prologue_three_step_tilings(t: int, k: int, e: int) -> None:
    """Tiles past 1024 rows (more rows than 64 such tiles hold), fewer warps per tile (many experts,
    several rounds per warp), the shared-memory opt-in past 48 KB (4096 experts), and no rows at all."""
    check_maps(poisoned(K.routing_prologue_three_step), random_ids(t, e, k), e)
    skewed = ((torch.rand(t, k, device="cuda") ** 6) * (e + 4)).to(torch.int32) - 2
    check_maps(poisoned(K.routing_prologue_three_step), skewed.contiguous(), e)


def test_routing_prologue_three_step_workspace_serves_every_smaller_call() -> None:
    """A runner sizes the workspace once, for its largest call: the size never falls as the tokens grow (a count's own
    tiling can have more tiles than a larger count's, where the tile doubles), and a workspace sized for 9216 tokens of
    top-8 over 128 experts (Qwen3-30B-A3B, 72 tiles of 1024 rows: 36 of 2048) serves 6144 tokens (48 tiles of 1024)."""
    sizes = [K.three_step_workspace_bytes(t, 8, 128) for t in range(0, 20001, 16)]
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))
    ws = torch.empty(K.three_step_workspace_bytes(9216, 8, 128), dtype=torch.uint8, device="cuda")
    for t in (6144, 8191, 8192, 9216):
        ids = random_ids(t, 128, 8)
        check_maps(poisoned(lambda i, e, *maps: K.routing_prologue_three_step(i, e, *maps, workspace=ws)), ids, 128)


@pytest.mark.parametrize("t,k,e,h,dtype", [(4096, 8, 128, 2048, torch.bfloat16), (300, 3, 64, 100, torch.float16),
                                           (1, 1, 8, 7, torch.float16), (3000, 6, 4096, 2816, torch.bfloat16),
                                           (0, 4, 64, 64, torch.bfloat16)])
@pytest.mark.parametrize("offset", (0, 1))
def test_routing_prologue_three_step_zeroes_output(t: int, k: int, e: int, h: int, dtype: torch.dtype,
                                                   offset: int) -> None:
    """zero_out: the finalize GEMM's output is zeroed by the map build's extra blocks, exactly its bytes
    (a view one element into a NaN buffer: unaligned ends, neighbours untouched; 4096 experts leave one
    warp per block, so the zero blocks stride), and the maps are unchanged."""
    whole = nan_like((t * h + offset + 9,), dtype)
    z = whole[offset:offset + t * h].view(t, h)

    def build(ids: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = ids.numel()
        return K.routing_prologue_three_step(ids, e, sentinel((n,)), sentinel((n,)),
                                             sentinel((e + 1,), torch.int64), zero_out=z)
    check_maps(build, random_ids(t, e, k), e)
    assert (z == 0).all(), "zero_out not fully zeroed"
    outside = torch.cat([whole[:offset], whole[offset + t * h:]])
    assert outside.isnan().all(), "bytes outside zero_out were written"


@pytest.mark.parametrize("t,k,e", [(257, 2, 8), (16, 3, 8), (16, 5, 64), (16, 2, 511), (300, 8, 256)])
def test_routing_prologue_fused_unsupported(t: int, k: int, e: int) -> None:
    with pytest.raises(K.KernelError) as err:
        K.routing_prologue_fused(random_ids(t, e, k), e)
    assert err.value.status is K.Status.UNSUPPORTED


# The prologues that route: the fused one (T <= 256, K in {1, 2, 4, 6, 8}) and the three-step one (T * K <= 1024).
ROUTED_PROLOGUES = {"fused": K.routing_prologue_fused_routing, "three_step": K.routing_prologue_three_step_routing}


def run_routed_prologue(form: str, logits: torch.Tensor, k: int, case: tuple, bias: torch.Tensor | None,
                        **extra) -> tuple[torch.Tensor, ...]:
    """A prologue that routes (`form` of ROUTED_PROLOGUES) into poisoned outputs, every one checked written: (ids,
    weights, the maps)."""
    method, renorm, groups, topk_groups, scale = case
    t, e = logits.shape
    ids, w = sentinel((t, k)), nan_like((t, k), torch.float32)
    ptu, utp, off = sentinel((t * k,)), sentinel((t * k,)), sentinel((e + 1,), torch.int64)
    ROUTED_PROLOGUES[form](logits, k, method, renorm, bias, groups, topk_groups, scale, topk_ids=ids, topk_weights=w,
                           permuted_to_unpermuted=ptu, unpermuted_to_permuted=utp, expert_first_token_offset=off,
                           **extra)
    torch.cuda.synchronize()
    assert (ids != SENTINEL).all() and not torch.isnan(w).any(), "routing left outputs unwritten"
    assert (ptu != SENTINEL).all() and (utp != SENTINEL).all() and (off != SENTINEL).all(), "maps left unwritten"
    return ids, w, ptu, utp, off


def check_routed_prologue(form: str, logits: torch.Tensor, k: int, case: tuple, bias: torch.Tensor | None,
                          **extra) -> None:
    """Its ids and weights against the fp64 reference, its maps against a stable sort of those ids, and both bit for
    bit what the routing kernel and then the map build write."""
    method, renorm, groups, topk_groups, scale = case
    t, e = logits.shape
    ids, w, ptu, utp, off = run_routed_prologue(form, logits, k, case, bias, **extra)
    if t:
        check_routing(logits, bias, ids, w, case, k)
    r_ptu, r_utp, r_off = ref_maps(ids, e)
    assert torch.equal(ptu.long(), r_ptu) and torch.equal(utp.long(), r_utp) and torch.equal(off, r_off), \
        f"maps: t={t} e={e} k={k}"
    if t:
        two_ids, two_w = run_routing(logits, k, method, renorm, bias, groups, topk_groups, scale)
        assert torch.equal(ids, two_ids) and torch.equal(w, two_w), f"t={t} e={e}: not the routing kernel's"


@pytest.mark.parametrize("case", ROUTING_CASES, ids=lambda c: f"{c[0].name.lower()}-renorm{int(c[1])}-g{c[2]}")
@pytest.mark.parametrize("form,k", [(f, k) for f in ROUTED_PROLOGUES for k in (1, 2, 3, 4, 6, 8)
                                    if f == "three_step" or k != 3])  # the fused one refuses top-k 3
def test_routing_prologue_that_routes(form: str, case: tuple, k: int) -> None:
    """Each prologue that routes, over token counts to its limit (the three-step one's 1024 rows: 128 tokens of top-8),
    expert counts and logit dtypes."""
    method, renorm, groups, topk_groups, scale = case
    for i, t in enumerate((0, 1, 16, 17, 64, 255, 256)):
        if form == "three_step" and t * k > 1024:
            t = 1024 // k
        e = (8, 64, 256, 510, 128, 33, 300)[(i + k) % 7]
        if groups > 1 and (e % groups or e // groups < 2):
            e = (64, 256)[i % 2]
        dtype = DTYPES[(i + k) % 3]
        logits = (torch.randn(t, e, device="cuda") * 2).to(dtype)
        bias = torch.randn(e, device="cuda") * 0.1 if method is K.Routing.SIGMOID_GROUPED else None
        check_routed_prologue(form, logits, k, case, bias)


@pytest.mark.parametrize("form,e,groups,topk_groups", [(f, *g) for f in ROUTED_PROLOGUES
                                                        for g in [(496, 248, 8), (64, 32, 4), (1024, 512, 8)]
                                                        if f == "three_step" or g[0] <= 510])  # fused: expert_log <= 9
def test_routing_prologue_that_routes_groups_in_shared_memory(form: str, e: int, groups: int, topk_groups: int) -> None:
    """Grouped selection's per-warp scratch: in the fused prologue it leaves the counters' 32 KB to 9 routing warps
    (496 experts in 248 groups; 256 tokens, each warp routing up to 29 in turn); in the three-step one its 8 warps'
    scratch passes the default 48 KB at 1024 experts in 512 groups (the opt-in; 128 tokens); many small groups."""
    case = (K.Routing.SIGMOID_GROUPED, True, groups, topk_groups, 1.5)
    t = 256 if form == "fused" else 128
    logits = torch.randn(t, e, device="cuda") * 2
    check_routed_prologue(form, logits, 8, case, torch.randn(e, device="cuda") * 0.1)


@pytest.mark.parametrize("t,k,e", [(5, 3, 8), (1, 8, 128), (128, 8, 256), (0, 4, 64)])
def test_routing_prologue_three_step_routing_zeroes_output(t: int, k: int, e: int) -> None:
    """zero_out in the three-step prologue that routes: exactly its bytes zeroed (a view one element into a NaN
    buffer), the routing and the maps unchanged."""
    h = 100
    whole = nan_like((t * h + 10,), torch.bfloat16)
    z = whole[1:1 + t * h].view(t, h)
    check_routed_prologue("three_step", torch.randn(t, e, device="cuda"), k, ROUTING_CASES[1], None, zero_out=z)
    assert (z == 0).all(), "zero_out not fully zeroed"
    assert torch.cat([whole[:1], whole[1 + t * h:]]).isnan().all(), "bytes outside zero_out were written"


@pytest.mark.parametrize("t,k,e", [(257, 2, 8), (16, 3, 8), (16, 5, 64), (16, 2, 511)])
def test_routing_prologue_fused_routing_unsupported(t: int, k: int, e: int) -> None:
    with pytest.raises(K.KernelError) as err:
        K.routing_prologue_fused_routing(torch.randn(t, e, device="cuda"), k)
    assert err.value.status is K.Status.UNSUPPORTED


@pytest.mark.parametrize("t,k,e", [(129, 8, 64), (1025, 1, 8)])
def test_routing_prologue_three_step_routing_unsupported(t: int, k: int, e: int) -> None:
    """Past the one block's 1024 rows."""
    with pytest.raises(K.KernelError, match="1024") as err:
        K.routing_prologue_three_step_routing(torch.randn(t, e, device="cuda"), k)
    assert err.value.status is K.Status.UNSUPPORTED


# ---- expand rows ------------------------------------------------------------------------------

@pytest.mark.parametrize("prequant", (False, True), ids=("plain", "prequant"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h,k", [(1, 4096, 1), (257, 4096, 8), (8192, 2880, 2), (255, 200, 3), (256, 100, 5),
                                   (3, 64, 40)])
def test_expand_rows(t: int, h: int, k: int, dtype: torch.dtype, prequant: bool) -> None:
    e = max(32, k)
    x = torch.randn(t, h, device="cuda").to(dtype)
    w = torch.rand(t, k, device="cuda")
    ptu, utp, _ = ref_maps(random_ids(t, e, k), e)
    scale = torch.rand(h, device="cuda") + 0.5 if prequant else None
    out, pw = nan_like((t * k, h), dtype), nan_like((t * k,), torch.float32)
    K.expand_rows(x, utp.to(torch.int32), w, scale, permuted_input=out, permuted_weights=pw)
    torch.cuda.synchronize()
    src = ptu.long() // k
    assert torch.equal(pw, w.flatten()[ptu.long()])
    if prequant:
        assert rel_err(out, x.double()[src] * scale.double()) < TOL[dtype]
    else:
        assert torch.equal(out, x[src]), "a plain expansion must copy bits"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h,k", [(1, 2048, 8), (16, 2880, 4), (257, 200, 3), (5, 100, 1)])
def test_expand_rows_zeroes_output(t: int, h: int, k: int, dtype: torch.dtype) -> None:
    """zero_out: the finalize GEMM's output is zeroed by the expansion launch, the copy unchanged."""
    x = torch.randn(t, h, device="cuda").to(dtype)
    w = torch.rand(t, k, device="cuda")
    ptu, utp, _ = ref_maps(random_ids(t, 32, k), 32)
    out, pw, z = nan_like((t * k, h), dtype), nan_like((t * k,), torch.float32), nan_like((t, h), dtype)
    K.expand_rows(x, utp.to(torch.int32), w, permuted_input=out, permuted_weights=pw, zero_out=z)
    torch.cuda.synchronize()
    assert torch.equal(out, x[ptu.long() // k]) and torch.equal(pw, w.flatten()[ptu.long()])
    assert (z == 0).all(), "zero_out not fully zeroed"


@pytest.mark.parametrize("side", ("below", "above"))
def test_expand_rows_and_finalize_either_side_of_l2(side: str) -> None:
    """GEMM2's rows just below and just above the device's L2 size, where finalize switches to its
    evict-first loads and stores: the same results either side (the rows made by the expansion, so
    this also checks the expansion at a prefill size)."""
    h, k, e, dtype = 2048, 8, 64, torch.bfloat16
    per_token = k * h * 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    t = l2 // per_token - 4 if side == "below" else l2 // per_token + 4
    x = torch.randn(t, h, device="cuda").to(dtype)
    w = torch.rand(t, k, device="cuda")
    ids = random_ids(t, e, k)
    ptu, utp, _ = ref_maps(ids, e)
    pin, pw = nan_like((t * k, h), dtype), nan_like((t * k,), torch.float32)
    K.expand_rows(x, utp.to(torch.int32), w, permuted_input=pin, permuted_weights=pw)
    out = nan_like((t, h), dtype)
    K.finalize(pin, w, ids, utp.to(torch.int32), out=out)
    torch.cuda.synchronize()
    assert torch.equal(pin, x[ptu // k]) and torch.equal(pw, w.flatten()[ptu])
    assert rel_err(out, w.double().sum(1, keepdim=True) * x.double()) < TOL[dtype]


def test_expand_rows_zero_out_must_not_overlap_input() -> None:
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    utp = torch.arange(8, device="cuda", dtype=torch.int32)
    with pytest.raises(K.KernelError, match="overlap") as err:
        K.expand_rows(x, utp, torch.rand(8, 1, device="cuda"), zero_out=x)
    assert err.value.status is K.Status.INVALID_ARGUMENT


# ---- FC1 activation ---------------------------------------------------------------------------

def ref_activation(x: torch.Tensor, act: K.Activation, alpha: float, limit: float) -> torch.Tensor:
    f = torch.nn.functional
    if act.is_gated:
        gate, up = x.chunk(2, dim=-1)
        if act is K.Activation.SWIGLU:
            return f.silu(gate) * up
        if act is K.Activation.GEGLU:
            return f.gelu(gate, approximate="tanh") * up
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
        return (up + 1) * gate * torch.sigmoid(alpha * gate)
    return {K.Activation.IDENTITY: lambda v: v, K.Activation.RELU: torch.relu, K.Activation.SILU: f.silu,
            K.Activation.GELU: lambda v: f.gelu(v, approximate="tanh")}[act](x)


def random_offsets(e: int, rows: int, filled: int) -> torch.Tensor:
    """Offsets [E+1] with `filled` rows spread unevenly (some experts empty)."""
    cuts = torch.sort(torch.randint(0, filled + 1, (e - 1,), device="cuda")).values
    zero = torch.zeros(1, dtype=torch.int64, device="cuda")
    return torch.cat([zero, cuts, zero + filled])


@pytest.mark.parametrize("act", list(K.Activation), ids=lambda a: a.name.lower())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inter,with_bias,prequant", [(2880, True, False), (200, False, True), (4096, True, True),
                                                      (100, True, False)])
def test_fc1_activation(act: K.Activation, dtype: torch.dtype, inter: int, with_bias: bool, prequant: bool) -> None:
    e, rows = 16, 1200
    filled = rows - 37  # rows past off[E] (other nodes' experts) must stay untouched
    off = random_offsets(e, rows, filled)
    n1 = 2 * inter if act.is_gated else inter
    x = (torch.randn(rows, n1, device="cuda") * 3).to(dtype)
    b = (torch.randn(e, n1, device="cuda") * 0.5).to(dtype) if with_bias else None
    s = torch.rand(inter, device="cuda") + 0.5 if prequant else None
    alpha, limit = 1.702, 2.0
    out = nan_like((rows, inter), dtype)
    K.fc1_activation(x, off, act, b, alpha, limit, s, out=out)
    torch.cuda.synchronize()
    xin = x.double()[:filled]
    if b is not None:
        expert = torch.searchsorted(off, torch.arange(filled, device="cuda"), right=True) - 1
        xin = xin + b.double()[expert]
    ref = ref_activation(xin, act, alpha, limit)
    if s is not None:
        ref = ref * s.double()
    assert rel_err(out[:filled], ref) < TOL[dtype]
    assert torch.isnan(out[filled:]).all(), "rows past off[E] were written"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("e,rows,filled", [(1, 8, 8), (8, 8, 5), (160, 16, 13), (256, 2048, 2000)])
def test_fc1_activation_bias_of_row_expert(e: int, rows: int, filled: int, dtype: torch.dtype) -> None:
    """Each row's bias comes from its expert, found by a warp-wide search over off: no search (E=1),
    one round (E <= 32) and two (E > 32, most experts empty at 16 rows), at decode row counts
    (where a row's columns are split over several warps) and a prefill-like one; inter 768 is the
    Qwen3-30B-A3B width."""
    inter = 768
    off = random_offsets(e, rows, filled)
    x = (torch.randn(rows, 2 * inter, device="cuda") * 3).to(dtype)
    b = (torch.randn(e, 2 * inter, device="cuda") * 0.5).to(dtype)
    out = nan_like((rows, inter), dtype)
    K.fc1_activation(x, off, K.Activation.SWIGLU, b, out=out)
    torch.cuda.synchronize()
    expert = torch.searchsorted(off, torch.arange(filled, device="cuda"), right=True) - 1
    ref = ref_activation(x.double()[:filled] + b.double()[expert], K.Activation.SWIGLU, 1.0, math.inf)
    assert rel_err(out[:filled], ref) < TOL[dtype]
    assert torch.isnan(out[filled:]).all(), "rows past off[E] were written"


# ---- finalize ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t,h,k,with_bias", [(1, 4096, 1, True), (255, 2880, 3, False), (257, 200, 8, True),
                                             (8192, 4096, 2, True), (256, 100, 5, False), (16, 2048, 4, True),
                                             (33, 2880, 6, False), (64, 1408, 12, True), (4096, 2048, 8, False)])
def test_finalize(t: int, h: int, k: int, with_bias: bool, dtype: torch.dtype) -> None:
    e = 64
    rows = t * k + 5  # gemm2_out may have spare rows
    g = torch.randn(rows, h, device="cuda").to(dtype)
    ids = random_ids(t, e, k)
    w = torch.rand(t, k, device="cuda")
    utp = torch.randperm(rows, device="cuda")[: t * k].to(torch.int32)
    b = torch.randn(e, h, device="cuda").to(dtype) if with_bias else None
    outs = []
    for deterministic in (True, True, False):
        out = nan_like((t, h), dtype)
        K.finalize(g, w, ids, utp, b, deterministic, out=out)
        outs.append(out)
    torch.cuda.synchronize()
    rowsel = g.double()[utp.long()].view(t, k, h)
    if b is not None:
        rowsel = rowsel + b.double()[ids.long()]
    ref = (w.double().unsqueeze(-1) * rowsel).sum(1)
    assert rel_err(outs[0], ref) < TOL[dtype]
    assert torch.equal(outs[0], outs[1]), "deterministic finalize differs between runs"
    assert torch.equal(outs[0], outs[2]), "the two modes must be bit-identical"


# ---- past the grid cap ------------------------------------------------------------------------

BIG = 4 * 2 ** 20 + 40  # more rows (tokens) than the capped grid has warps: the grid-stride loops run


def test_expand_rows_past_grid_cap() -> None:
    t, h, k = BIG, 8, 2  # a warp per token: more tokens than the capped grid has warps
    x = torch.randn(t, h, device="cuda")
    w = torch.rand(t, k, device="cuda")
    ptu, utp, _ = ref_maps(random_ids(t, 16, k), 16)
    out, pw = nan_like((t * k, h), torch.float32), nan_like((t * k,), torch.float32)
    K.expand_rows(x, utp.to(torch.int32), w, permuted_input=out, permuted_weights=pw)
    torch.cuda.synchronize()
    assert torch.equal(out, x[ptu.long() // k]) and torch.equal(pw, w.flatten()[ptu.long()])


def test_fc1_activation_past_grid_cap() -> None:
    rows, inter, filled = BIG, 8, BIG - 7
    off = random_offsets(4, rows, filled)
    x = torch.randn(rows, 2 * inter, device="cuda")
    out = nan_like((rows, inter), torch.float32)
    K.fc1_activation(x, off, K.Activation.SWIGLU, out=out)
    torch.cuda.synchronize()
    assert rel_err(out[:filled], ref_activation(x.double()[:filled], K.Activation.SWIGLU, 1.0, math.inf)) < 1e-5
    assert torch.isnan(out[filled:]).all(), "rows past off[E] were written"


def test_finalize_past_grid_cap() -> None:
    t, h, k = BIG, 8, 1
    g = torch.randn(t * k, h, device="cuda")
    w = torch.rand(t, k, device="cuda")
    utp = torch.randperm(t * k, device="cuda").to(torch.int32)
    out = nan_like((t, h), torch.float32)
    K.finalize(g, w, random_ids(t, 4, k), utp, out=out)
    torch.cuda.synchronize()
    assert rel_err(out, (w.double() * g.double()[utp.long()]).view(t, h)) < 1e-6


# ---- the AWQ pre-quant scales' separate step (stages/scale_columns.cu) -------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows, cols", [(1, 8), (255, 2048), (8192, 768), (37, 2888)])
def test_scale_columns_rounds_each_fp32_product_once(dtype: torch.dtype, rows: int, cols: int) -> None:
    """Bit for bit the fp32 product of each element and its column's scale rounded once to the row type (written
    here in fp64, exact for a product of a 16-bit value and an fp32 scale); rows past `rows` untouched."""
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    x = torch.randn(rows + 3, cols, generator=gen, device="cuda").to(dtype)
    scale = torch.rand(cols, generator=gen, device="cuda") * 4 + 0.01
    ref = (x[:rows].double() * scale.double()).float().to(dtype)  # exact product, rounded to fp32 then to dtype
    tail = x[rows:].clone()
    K.scale_columns(x[:rows], scale)
    torch.cuda.synchronize()
    assert torch.equal(x[:rows], ref) and torch.equal(x[rows:], tail)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scale_columns_into_another_buffer_leaves_the_input(dtype: torch.dtype) -> None:
    """Out of place (the runner's fc1_prequant on the tokens' rows): out gets the same once-rounded products, x is
    left as it was, and out's rows past `rows` keep their poison."""
    rows, cols = 300, 2880
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(rows, cols, generator=gen, device="cuda").to(dtype)
    scale = torch.rand(cols, generator=gen, device="cuda") * 4 + 0.01
    before = x.clone()
    out = torch.full((rows + 2, cols), float("nan"), dtype=dtype, device="cuda")
    assert K.scale_columns(x, scale, out=out[:rows]).data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    assert torch.equal(out[:rows], (x.double() * scale.double()).float().to(dtype)) and torch.equal(x, before)
    assert out[rows:].isnan().all()


def test_scale_columns_refuses_bad_arguments() -> None:
    x = torch.zeros(4, 12, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(K.KernelError, match="multiple of 8"):
        K.scale_columns(x, torch.ones(12, device="cuda"))
    with pytest.raises(ValueError, match="scale"):
        K.scale_columns(torch.zeros(4, 16, dtype=torch.bfloat16, device="cuda"), torch.ones(8, device="cuda"))
    y = torch.zeros(8, 16, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="overlap"):
        K.scale_columns(y[:4], torch.ones(16, device="cuda"), out=y[2:6])
    with pytest.raises(ValueError, match="out"):
        K.scale_columns(y[:4], torch.ones(16, device="cuda"), out=y[:4].to(torch.float16))
