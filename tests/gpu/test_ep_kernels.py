"""The expert-parallel token stages (cpp/src/stages/ep_dispatch.cu) and the finalize's other-rank skip, against
layouts and sums written here in plain Python / fp64, on fresh random routing with poisoned outputs."""
from __future__ import annotations

import random

import pytest
import torch

from moe_build import kernels as K

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]


def _ids(tokens: int, top_k: int, experts: int, g: torch.Generator) -> torch.Tensor:
    if not tokens:
        return torch.empty(0, top_k, dtype=torch.int32)
    return torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).int()


@pytest.mark.parametrize("ep", [1, 2, 3, 4, 8, 32])
@pytest.mark.parametrize("tokens", [0, 1, 31, 1023, 1024, 1025, 5000])
@pytest.mark.parametrize("top_k", [1, 2, 8])
def test_layout_groups_rows_by_rank_in_token_order(ep: int, tokens: int, top_k: int) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    per_rank = max(1, -(-top_k // ep)) * 2
    ids = _ids(tokens, top_k, ep * per_rank, g)
    slots_poison = torch.full((tokens, ep), -7, dtype=torch.int32, device="cuda")
    rows_poison = torch.full((tokens * ep,), -7, dtype=torch.int32, device="cuda")
    counts, rows, slots = K.ep_layout(ids.cuda(), ep, per_rank, send_tokens=rows_poison, token_slots=slots_poison)
    # expected, by hand: rank d's rows are the tokens with an expert in [d * per_rank, (d + 1) * per_rank)
    want_rows: list[int] = []
    want_slots = [[-1] * ep for _ in range(tokens)]
    want_counts = []
    for d in range(ep):
        mine = [t for t in range(tokens) if any(d * per_rank <= int(x) < (d + 1) * per_rank for x in ids[t])]
        for t in mine:
            want_slots[t][d] = len(want_rows)
            want_rows.append(t)
        want_counts.append(len(mine))
    assert counts.tolist() == want_counts, f"seed {seed}"
    assert rows[: len(want_rows)].tolist() == want_rows, f"seed {seed}"
    assert slots.cpu().tolist() == want_slots, f"seed {seed}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden", [256, 100])
def test_combine_sums_each_tokens_rows_in_rank_order(dtype: torch.dtype, hidden: int) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    tokens, ep = 300, 4
    sent = torch.rand(tokens, ep, generator=g) < 0.6
    sent[:, 0] |= ~sent.any(dim=1)  # every token goes somewhere
    slots = torch.full((tokens, ep), -1, dtype=torch.int32)
    n = 0
    for d in range(ep):
        for t in range(tokens):
            if sent[t, d]:
                slots[t, d] = n
                n += 1
    returned = torch.randn(n, hidden, generator=g).to(dtype)
    out = torch.full((tokens, hidden), float("nan"), dtype=dtype, device="cuda")
    K.ep_combine(returned.cuda(), slots.cuda(), out=out)
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for d in range(ep):
            if slots[t, d] >= 0:
                want[t] += returned[slots[t, d]].double()
    got = out.double().cpu()
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -23}[dtype]
    # fp32 sums of <= 4 terms, rounded once to dtype: within one rounding of the exact sum (plus fp32's own)
    assert ((got - want).abs() <= eps * want.abs() + 1e-6 * (1 + want.abs())).all(), f"seed {seed}"


@pytest.mark.parametrize("bias", [False, True])
def test_finalize_skips_other_ranks_experts(bias: bool) -> None:
    """Pairs whose id is outside [0, num_experts) add nothing, even where their gemm2_out rows hold NaN."""
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    tokens, top_k, local, hidden = 64, 4, 3, 128
    ids = torch.randint(-1, local + 2, (tokens, top_k), generator=g).int()  # -1 and local.. are other ranks'
    w = torch.rand(tokens, top_k, generator=g)
    utp = torch.randperm(tokens * top_k, generator=g).int()
    g2 = torch.randn(tokens * top_k, hidden, generator=g).to(torch.bfloat16)
    here = (ids >= 0) & (ids < local)
    g2[utp[~here.flatten()].long()] = float("nan")  # what another rank's rows hold here: nothing
    b2 = torch.randn(local, hidden, generator=g).to(torch.bfloat16) if bias else None
    out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    K.finalize(g2.cuda(), w.cuda(), ids.cuda(), utp.cuda(), None if b2 is None else b2.cuda(), out=out,
               num_experts=local)
    want = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(top_k):
            if here[t, j]:
                row = g2[utp[t * top_k + j]].double() + (b2[ids[t, j]].double() if bias else 0)
                want[t] += w[t, j].double() * row
    got = out.double().cpu()
    assert torch.isfinite(got).all(), f"seed {seed}"
    assert ((got - want).abs() <= 2.0 ** -8 * want.abs() + 1e-5).all(), f"seed {seed}"
