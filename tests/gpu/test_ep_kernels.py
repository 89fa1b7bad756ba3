"""The expert-parallel token stages (cpp/src/stages/ep_dispatch.cu: layout, send packing, combine) and the
finalize's other-rank skip, against layouts and sums written here in plain Python / fp64, on fresh random routing
with poisoned outputs."""
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
# one block up to 1024 tokens; past it blocks of 1024 counted first (a partial last block, whole blocks)
@pytest.mark.parametrize("tokens", [0, 1, 31, 1023, 1024, 1025, 2048, 5000])
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
# one column chunk (vectors; single elements), several with a partial last one (vectors; single elements)
@pytest.mark.parametrize("hidden", [256, 100, 2056, 1001])
@pytest.mark.parametrize("ep,tokens,top_k", [(1, 5, 2), (2, 0, 8), (3, 1, 8), (4, 300, 8), (8, 1025, 3)])
def test_pack_send_packs_each_rows_token_with_ids_local_to_its_rank(dtype: torch.dtype, hidden: int, ep: int,
                                                                    tokens: int, top_k: int) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    per_rank = max(1, -(-top_k // ep)) * 2
    ids = _ids(tokens, top_k, ep * per_rank, g)
    ids[::7, 0] = -1  # a pair routed nowhere (another layer's padding) goes to no rank's expert
    weights = torch.rand(tokens, top_k, generator=g)
    hidden_rows = torch.randn(tokens, hidden, generator=g).to(dtype)
    counts, send_tokens, _ = K.ep_layout(ids.cuda(), ep, per_rank)
    rows = int(counts.sum())
    out_rows = torch.full((rows, hidden), float("nan"), dtype=dtype, device="cuda")
    out_meta = torch.full((2, rows, top_k), -7, dtype=torch.int32, device="cuda")
    K.ep_pack_send(hidden_rows.cuda(), ids.cuda(), weights.cuda(), ep, per_rank, counts, send_tokens, rows, out_rows,
                   out_meta)
    # expected, by hand: row i is token send_tokens[i] (the layout's own test checks those), going to the rank d
    # whose segment of counts holds i; its ids shifted to d's first expert, -1 outside d's experts
    got_rows, got_meta, token = out_rows.cpu(), out_meta.cpu(), send_tokens.cpu()
    at = 0
    for d, n in enumerate(counts.tolist()):
        for i in range(at, at + n):
            t = int(token[i])
            assert torch.equal(got_rows[i], hidden_rows[t]), f"seed {seed}, row {i}"
            want = [int(x) - d * per_rank if d * per_rank <= int(x) < (d + 1) * per_rank else -1 for x in ids[t]]
            assert got_meta[0, i].tolist() == want, f"seed {seed}, row {i}"
            assert torch.equal(got_meta[1, i].view(torch.float32), weights[t]), f"seed {seed}, row {i}"
        at += n
    assert at == rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# one column chunk (vectors; single elements), several with a partial last one (vectors; single elements)
@pytest.mark.parametrize("hidden", [256, 100, 2056, 1001])
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


# ---- the nvlink kernels on any grid: `ep` ranks simulated on one GPU ------------------------------------------
# Each simulated rank's "symmetric" buffers are ordinary device tensors and the peer tables hold their addresses,
# so the kernels run the whole exchange (dispatch, gather, the experts as a scale by rank + 1, return, combine) in
# stream order, where the real layer puts its barriers. Default grid against max_sms 1 and 3: the same bits.
# `in_kernels`: the non-blocking gather and the combine wait for their flags themselves (every block; the last
# lowers them; the combine returns the rows itself first, so the ranks' combines run at once on streams of their
# own), else the one-block wait kernel runs before each.

def _nvlink_exchange(ep: int, tokens: int, hidden: int, capacity: int | None, sms: int | None, seed: int,
                     per_rank: int = 2, top_k: int = 2, in_kernels: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    bf16 = torch.bfloat16
    xs = [torch.randn(tokens, hidden, generator=g).to("cuda", bf16) for _ in range(ep)]
    ids = [_ids(tokens, top_k, ep * per_rank, g).cuda() for _ in range(ep)]
    ws = [torch.rand(tokens, top_k, generator=g).cuda() for _ in range(ep)]
    bufs = [{"recv_rows": torch.full((ep * tokens, hidden), 7.0, dtype=bf16, device="cuda"),
             "recv_meta": torch.full((ep * tokens, 2 * top_k + 1), -7, dtype=torch.int32, device="cuda"),
             "recv_counts": torch.zeros(ep, 2, dtype=torch.int32, device="cuda"),
             "returned": torch.full((ep * tokens, hidden), 3.0, dtype=bf16, device="cuda"),
             "flags": torch.zeros(2, ep, dtype=torch.int32, device="cuda")} for _ in range(ep)]
    done = torch.zeros(ep, 2, 1, dtype=torch.int32, device="cuda")  # each rank's dispatch / return block counters
    seen = torch.zeros(ep, 2, 1, dtype=torch.int32, device="cuda")  # each rank's gather / combine wait counters
    peers = {name: torch.tensor([b[name].data_ptr() for b in bufs], dtype=torch.int64, device="cuda")
             for name in bufs[0]}
    token_slots = []  # each rank's, for its combine
    for r in range(ep):  # the dispatch lays the tokens out itself: as ep_layout does (that test checks it by hand)
        counts, slots = K.ep_nvlink_dispatch(xs[r], ids[r], ws[r], r, per_rank, tokens, peers["recv_rows"],
                                             peers["recv_meta"], peers["recv_counts"], peers["flags"], done[r, 0],
                                             send_counts=torch.full((ep,), -7, dtype=torch.int32, device="cuda"),
                                             token_slots=torch.full((tokens, ep), -7, dtype=torch.int32,
                                                                    device="cuda"), sms=sms)
        want_counts, _, want_slots = K.ep_layout(ids[r], ep, per_rank)
        assert torch.equal(counts, want_counts) and torch.equal(slots, want_slots), f"rank {r}, seed {seed}"
        token_slots.append(slots)
    torch.cuda.synchronize()
    # every source raised its dispatch flag on every rank; the waits (stream order: already raised) lower them
    assert all((b["flags"][0] == 1).all() for b in bufs) and (done == 0).all()
    gather_waits = in_kernels and capacity is not None  # the blocking mode reads the counts after a wait kernel
    if not gather_waits:
        for b in bufs:
            K.ep_nvlink_wait(b["flags"][0])
    gathered = []
    in_place = capacity == ep * tokens  # room for every slot: the rows stay where they landed
    for r in range(ep):
        rows = capacity if capacity is not None else int(bufs[r]["recv_counts"][:, 0].sum())
        d = {"hidden": bufs[r]["recv_rows"] if in_place else torch.full((rows, hidden), 5.0, dtype=bf16, device="cuda"),
             "ids": torch.full((rows, top_k), -9, dtype=torch.int32, device="cuda"),
             "weights": torch.full((rows, top_k), -1.0, device="cuda"),
             "src_rank": torch.full((rows,), -9, dtype=torch.int32, device="cuda"),
             "src_row": torch.full((rows,), -9, dtype=torch.int32, device="cuda"),
             "received": torch.full((1,), -9, dtype=torch.int32, device="cuda"),
             "overflow": torch.full((1,), -9, dtype=torch.int32, device="cuda")}
        K.ep_nvlink_gather(bufs[r]["recv_rows"], bufs[r]["recv_meta"], bufs[r]["recv_counts"], tokens, r * per_rank,
                           per_rank, None if in_place else d["hidden"], d["ids"], d["weights"], d["src_rank"], d["src_row"], d["received"],
                           d["overflow"], peers["returned"], sms=sms,
                           wait=(bufs[r]["flags"][0], seen[r, 0]) if gather_waits else None)
        gathered.append(d)
    # this rank's "experts": its received rows times r + 1
    partials = [(gathered[r]["hidden"].float() * (r + 1)).to(bf16) for r in range(ep)]
    outs = [torch.full_like(xs[r], float("nan")) for r in range(ep)]
    if in_kernels:  # return, wait and sum in one kernel a rank, each waiting for the others' returns: the simulated
        # ranks run at once on streams of their own, each grid capped so that all of them fit the GPU together
        share = torch.cuda.get_device_properties(0).multi_processor_count // ep
        streams = [torch.cuda.Stream() for _ in range(ep)]
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        for r in range(ep):
            K.ep_nvlink_combine(partials[r], gathered[r]["src_rank"], gathered[r]["src_row"], peers["returned"], r,
                                peers["flags"], done[r, 1], bufs[r]["returned"], token_slots[r], bufs[r]["flags"][1],
                                seen[r, 1], out=outs[r], stream=streams[r], sms=min(sms or share, share))
    else:
        for r in range(ep):
            K.ep_nvlink_return(partials[r], gathered[r]["src_rank"], gathered[r]["src_row"], peers["returned"], r,
                               peers["flags"], done[r, 1], sms=sms)
        torch.cuda.synchronize()
        assert all((b["flags"][1] == 1).all() and (b["flags"][0] == 0).all() for b in bufs) and (done == 0).all()
        for r, b in enumerate(bufs):
            K.ep_nvlink_wait(b["flags"][1])
            K.ep_combine(b["returned"], token_slots[r], out=outs[r], sms=sms)
    torch.cuda.synchronize()
    assert (done == 0).all()
    assert all((b["flags"] == 0).all() for b in bufs) and (seen == 0).all()
    counts = [[int(n) for n in b["recv_counts"][:, 0].tolist()] for b in bufs]
    return {"xs": xs, "ids": ids, "gathered": gathered, "outs": outs, "counts": counts}


def _expected_outs(xs: list[torch.Tensor], ids: list[torch.Tensor], per_rank: int, capacity: int | None
                   ) -> tuple[list[torch.Tensor], list[int]]:
    """Each source's tokens summed over the ranks that kept its row (a receiver keeps its first `capacity` rows,
    sources in rank order, tokens in order) of (row * (d + 1)) in bf16, in fp32 in rank order; and each rank's
    received row count."""
    ep = len(xs)
    sent = [[((i.cpu() >= d * per_rank) & (i.cpu() < (d + 1) * per_rank)).any(dim=1).nonzero().flatten().tolist()
             for d in range(ep)] for i in ids]
    received = [sum(len(sent[s][d]) for s in range(ep)) for d in range(ep)]
    outs = [torch.zeros(x.shape, dtype=torch.float32) for x in xs]
    for s in range(ep):
        for d in range(ep):
            before = sum(len(sent[p][d]) for p in range(s))
            kept = [t for i, t in enumerate(sent[s][d]) if capacity is None or before + i < capacity]
            outs[s][kept] += (xs[s][kept].float() * (d + 1)).to(torch.bfloat16).float().cpu()
    return outs, received


@pytest.mark.parametrize("sms", [1, 3])
# 300 tokens (the layout kernels, then the rows) and 100 or 1 (one kernel lays them out and sends them), blocking;
# non-blocking with every rank overflowing (about 540 of 300 tokens' rows arrive, 180 of 100's), with room to spare,
# and with room for every slot (3 x tokens: in place)
@pytest.mark.parametrize("tokens,capacity", [(300, None), (300, 200), (300, 700), (300, 900), (100, None), (100, 60),
                                             (100, 250), (100, 300), (1, None), (1, 3)])
# one column chunk (16-byte vectors; single elements), several with a partial last one (vectors; single elements)
@pytest.mark.parametrize("hidden", [256, 100, 2056, 1001])
@pytest.mark.parametrize("in_kernels", [False, True])
def test_nvlink_kernels_give_the_same_rows_on_a_capped_grid(sms: int, tokens: int, capacity: int | None, hidden: int,
                                                            in_kernels: bool) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    ep, per_rank = 3, 2
    full = _nvlink_exchange(ep, tokens, hidden, capacity, None, seed, per_rank, in_kernels=in_kernels)
    capped = _nvlink_exchange(ep, tokens, hidden, capacity, sms, seed, per_rank, in_kernels=in_kernels)
    for r in range(ep):
        for name, t in full["gathered"][r].items():
            assert torch.equal(t, capped["gathered"][r][name]), f"rank {r} {name}, max_sms {sms}, seed {seed}"
        assert torch.equal(full["outs"][r], capped["outs"][r]), f"rank {r} out, max_sms {sms}, seed {seed}"
    want, received = _expected_outs(capped["xs"], capped["ids"], per_rank, capacity)
    for r in range(ep):
        d = capped["gathered"][r]
        keep = received[r] if capacity is None else min(received[r], capacity)
        assert int(d["received"]) == keep and int(d["overflow"]) == int(capacity is not None and received[r] > capacity)
        if capacity == ep * tokens:  # in place: source s's rows are slots s * tokens onwards, the rest route nowhere
            counts = capped["counts"][r]
            want_src = torch.cat([torch.tensor([s] * n + [-1] * (tokens - n), dtype=torch.int32)
                                  for s, n in enumerate(counts)])
            assert torch.equal(d["src_rank"].cpu(), want_src) and sum(counts) == keep, f"seed {seed}"
            assert (d["ids"][d["src_rank"] < 0] == -1).all(), f"seed {seed}"
        else:
            assert (d["src_rank"][keep:] == -1).all() and (d["ids"][keep:] == -1).all(), f"seed {seed}"
        got = capped["outs"][r].double().cpu()
        w = want[r].to(torch.bfloat16).double()
        assert torch.isfinite(got).all(), f"rank {r}: unwritten output, seed {seed}"
        assert ((got - w).abs() <= 2.0 ** -8 * w.abs() + 1e-6).all(), f"rank {r}, max_sms {sms}, seed {seed}"
    if capacity is not None:  # the non-blocking cases cover what they claim: dropped rows, then empty rows
        assert all((r > capacity) == (capacity in (200, 60)) for r in received), (received, capacity)


# ---- dispatch_with_permute's layout (stages/ep_permute.cu): `ep` ranks simulated on one GPU, as above ------------
# After the dispatch, each rank lays its received (row, local expert) pairs out by expert: every group holds exactly
# the pairs that chose its expert (checked as (source, token, k) sets against the routing), padded to pad_multiple
# (contiguous) or fixed at expert_capacity rows (batched, the rest dropped and flagged); every row's copy is its
# token's hidden row; padding rows go back nowhere. Then each row, scaled by (its global expert + 1) as the
# "experts", goes back to (token * K + k) at its source, and the source's mb_finalize with the identity map sums the
# K rows: against an fp64 expectation.

def _ids_distinct(tokens: int, top_k: int, experts: int, g: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).int() if tokens else \
        torch.empty(0, top_k, dtype=torch.int32)


@pytest.mark.parametrize("pad,expert_capacity", [(1, 0), (8, 0), (128, 0), (1, 4), (1, 1000)])
@pytest.mark.parametrize("tokens,top_k,hidden", [(1, 2, 256), (300, 8, 1001), (97, 3, 2056)])
@pytest.mark.parametrize("dense", [False, True])  # the nvlink receive slots, or nccl's dense rows (cap 0)
def test_permute_layout_groups_every_pair_by_expert(pad: int, expert_capacity: int, tokens: int, top_k: int,
                                                    hidden: int, dense: bool) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    ep, per_rank, bf16 = 3, 8, torch.bfloat16
    E = ep * per_rank
    xs = [torch.randn(tokens, hidden, generator=g).to("cuda", bf16) for _ in range(ep)]
    ids = [_ids_distinct(tokens, top_k, E, g).cuda() for _ in range(ep)]
    ws = [torch.rand(tokens, top_k, generator=g).cuda() for _ in range(ep)]
    bufs = [{"recv_rows": torch.full((ep * tokens, hidden), 7.0, dtype=bf16, device="cuda"),
             "recv_meta": torch.full((ep * tokens, 2 * top_k + 1), -7, dtype=torch.int32, device="cuda"),
             "recv_counts": torch.zeros(ep, 2, dtype=torch.int32, device="cuda"),
             "returned": torch.full((top_k * tokens, hidden), float("nan"), dtype=bf16, device="cuda"),
             "flags": torch.zeros(2, ep, dtype=torch.int32, device="cuda")} for _ in range(ep)]
    done = torch.zeros(ep, 2, 1, dtype=torch.int32, device="cuda")
    seen = torch.zeros(ep, 1, dtype=torch.int32, device="cuda")
    peers = {name: torch.tensor([b[name].data_ptr() for b in bufs], dtype=torch.int64, device="cuda")
             for name in bufs[0]}
    for r in range(ep):
        K.ep_nvlink_dispatch(xs[r], ids[r], ws[r], r, per_rank, tokens, peers["recv_rows"], peers["recv_meta"],
                             peers["recv_counts"], peers["flags"], done[r, 0])
    rows_cap = per_rank * expert_capacity if expert_capacity else ep * tokens * top_k + per_rank * (pad - 1)
    if dense:  # each rank's received rows source after source, as nccl's exact-size all-to-all lands them, in at
        # least one row of meta as NcclDispatch gives it (the layout kernel takes real pointers, also where nothing
        # arrives: with one token of three sources a rank receives no row about one run in twelve)
        torch.cuda.synchronize()
        for b in bufs:
            K.ep_nvlink_wait(b["flags"][0])
            n = b["recv_counts"][:, 0].tolist()
            b["dense_rows"] = torch.cat([b["recv_rows"][s * tokens: s * tokens + c] for s, c in enumerate(n)])
            meta = [b["recv_meta"][s * tokens: s * tokens + c] for s, c in enumerate(n)]
            b["dense_meta"] = torch.cat(meta + ([] if sum(n) else [torch.full_like(b["recv_meta"][:1], -7)]))
            b["dense_counts"] = torch.stack([b["recv_counts"][:, 0], torch.zeros_like(b["recv_counts"][:, 0])],
                                            dim=1).contiguous()
    lay = []
    for r in range(ep):
        slots = bufs[r]["dense_meta"].shape[0] if dense else ep * tokens
        d = {"offsets": torch.full((per_rank + 1,), -9, dtype=torch.int64, device="cuda"),
             "counts": torch.full((per_rank,), -9, dtype=torch.int32, device="cuda"),
             "pair_row": torch.full((slots * top_k,), -9, dtype=torch.int32, device="cuda"),
             "src": torch.full((rows_cap,), -9, dtype=torch.int32, device="cuda"),
             "ret": torch.full((rows_cap,), -9, dtype=torch.int32, device="cuda"),
             "overflow": torch.full((1,), -9, dtype=torch.int32, device="cuda"),
             "rows": torch.full((rows_cap, hidden), float("nan"), dtype=bf16, device="cuda")}
        if dense:
            b = bufs[r]
            K.ep_permute_layout(b["dense_meta"], b["dense_counts"], 0, top_k, r * per_rank, d["offsets"], d["counts"],
                                d["pair_row"], d["src"], d["ret"], d["overflow"], pad_multiple=pad,
                                expert_capacity=expert_capacity)
            if b["dense_rows"].shape[0]:  # as NcclDispatch: no rows to move where none arrived
                K.ep_permute_rows(b["dense_rows"], b["dense_meta"], b["dense_counts"], 0, d["pair_row"], d["rows"],
                                  None)
        else:
            K.ep_permute_layout(bufs[r]["recv_meta"], bufs[r]["recv_counts"], tokens, top_k, r * per_rank,
                                d["offsets"], d["counts"], d["pair_row"], d["src"], d["ret"], d["overflow"],
                                pad_multiple=pad, expert_capacity=expert_capacity,
                                wait=(bufs[r]["flags"][0], seen[r]))
            K.ep_permute_rows(bufs[r]["recv_rows"], bufs[r]["recv_meta"], bufs[r]["recv_counts"], tokens,
                              d["pair_row"], d["rows"], peers["returned"])
        lay.append(d)
    torch.cuda.synchronize()
    ids_c = [i.cpu() for i in ids]
    for r in range(ep):
        d = {k: v.cpu() for k, v in lay[r].items()}
        offsets, counts, src, ret = d["offsets"].tolist(), d["counts"].tolist(), d["src"], d["ret"]
        over = False
        for e in range(per_rank):
            x = r * per_rank + e
            want = {(s, t, k) for s in range(ep) for t in range(tokens) for k in range(top_k) if ids_c[s][t, k] == x}
            lo, size = offsets[e], offsets[e + 1] - offsets[e]
            if expert_capacity:
                assert lo == e * expert_capacity and size == expert_capacity, f"seed {seed}"
                assert counts[e] == min(len(want), expert_capacity), f"seed {seed}"
                over |= len(want) > expert_capacity
            else:
                assert lo % pad == 0 and size == -(-len(want) // pad) * pad and counts[e] == len(want), f"seed {seed}"
            got = {(int(src[i]), int(ret[i]) // top_k, int(ret[i]) % top_k) for i in range(lo, lo + counts[e])}
            assert got <= want and len(got) == counts[e], f"rank {r} expert {e}: rows {got} of pairs {want}, seed {seed}"
            assert (src[lo + counts[e]: lo + size] == -1).all(), f"padding rows must go back nowhere, seed {seed}"
            for i in range(lo, lo + counts[e]):
                s, t = int(src[i]), int(ret[i]) // top_k
                assert torch.equal(d["rows"][i], xs[s][t].cpu()), f"rank {r} row {i}, seed {seed}"
        assert int(d["overflow"]) == int(over), f"seed {seed}"
    for r in range(ep):  # the "experts": each row times (its global expert + 1), then back to its source
        d = lay[r]
        scale = torch.zeros(rows_cap, 1, device="cuda")
        for e in range(per_rank):
            scale[int(d["offsets"][e]): int(d["offsets"][e + 1])] = r * per_rank + e + 1
        expert_out = (d["rows"].float().nan_to_num() * scale).to(bf16)
        K.ep_nvlink_return(expert_out, d["src"], d["ret"], peers["returned"], r, peers["flags"], done[r, 1],
                           rows_limit=d["offsets"][per_rank:])
    torch.cuda.synchronize()
    identity = torch.arange(tokens * top_k, dtype=torch.int32, device="cuda")
    for r in range(ep):
        K.ep_nvlink_wait(bufs[r]["flags"][1])
        out = K.finalize(bufs[r]["returned"], ws[r], ids[r], identity, out=torch.full_like(xs[r], float("nan")))
        torch.cuda.synchronize()
        if expert_capacity and any(int(lay[d]["overflow"]) for d in range(ep)):
            continue  # which pairs an overflowing expert kept follows the atomics; the layout checks above hold
        want = torch.zeros(tokens, hidden, dtype=torch.float64)
        for t in range(tokens):
            for k in range(top_k):
                row = (xs[r][t].float() * (int(ids_c[r][t, k]) + 1)).to(bf16).double().cpu()
                want[t] += ws[r][t, k].double().cpu() * row
        got = out.double().cpu()
        assert torch.isfinite(got).all(), f"rank {r}: unwritten output, seed {seed}"
        assert ((got - want).abs() <= 2.0 ** -8 * want.abs() + 1e-5).all(), f"rank {r}, seed {seed}"
