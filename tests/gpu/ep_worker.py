"""One rank of the expert-parallel correctness run (torchrun --nproc-per-node N tests/gpu/ep_worker.py OUT.json).

Every case: the same random layer on every rank (a seed rank 0 draws and broadcasts), each rank's own random
tokens and pinned routing; the rank's ExpertParallelMoE output (NaN-poisoned before the call) against
- the fp64 reference of the whole layer on the same tokens and routing (rel-norm error < REF_TOL, as the
  single-GPU runner's tests hold it), and
- the single-GPU runner (every expert on this GPU) on the same tokens and routing: the two differ only in
  where bf16 roundings fall (the EP path rounds each rank's partial sum before adding the ranks' sums, and
  its GEMMs may run another tactic for their row counts, so an intermediate bf16 rounding can fall the other
  way), measured 4e-3 at worst: rel-norm < RUNNER_TOL, two bf16 roundings. Bit-identity with the single-GPU
  runner is claimed for deterministic plans, on both dispatches (their ep_format is permuted: every (token, k)
  row comes back and the token's rank sums them in k order, as the single-GPU runner's separate finalize does,
  and the GEMMs keep one kernel at every count); any deterministic plan's EP output is bit-identical from run
  to run.
Grouped formats (the nvlink dispatch_with_permute, forced): permuted (groups padded to pad_multiple) and batched
(experts x max rows); a batched case that overflows an expert's rows must raise the flag, and the tokens none of
whose pairs went to an overflowing expert must still match the reference (which pairs past the max rows are
dropped follows the order the layout kernel's atomics take).
Routing variants: random top-k, skewed (every token to rank 0's experts: the other ranks receive nothing),
one rank receiving nothing (no token picks the last rank's experts), and hot (over half the tokens take the same
top_k experts, spread over the ranks: a batched max rows between the two halves' counts drops pairs of those
experts only). Deterministic plans are also run
twice and must be bit-identical. Dual-batch overlap cases (two micro-batches on two streams) are also held
against the same layer without overlap (rel-norm < RUNNER_TOL: the same math per token, GEMMs over half the
rows), where neither drops a row; `ragged` cases give rank 0 one token (its second micro-batch empty) while
the others have many, and `sms` cases cap the nvlink kernels' grids at 1 or 3 blocks. Rank 0 writes every
case's errors to OUT.json; any failure raises (exit 1).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from moe_build.reference import moe_reference
from moe_build.runner import MoERunner
from moe_build.runner.expert_parallel import (ExpertParallelMoE, micro_batch_capacity, micro_batch_spans,
                                              rank_layer)
from moe_build.spec import Activation, MoESpec, Routing, RoutingMethod, SharedExperts
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights

REF_TOL = 1e-2
RUNNER_TOL = 2 * 2.0 ** -8  # two bf16 roundings (2^-8 each) of the output's norm


def _target(deterministic: bool = False) -> Target:
    major, minor = torch.cuda.get_device_capability()
    return Target(sm=major * 10 + minor, flavour=Flavour.TENSORRT, deterministic=deterministic)


def _routing(spec: MoESpec, tokens: int, how: str, seed: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids (distinct per token) and weights for rank `rank`'s tokens (any rank can redraw any rank's)."""
    g = torch.Generator().manual_seed(seed + 1000 + rank)
    n, E, K = spec.local_experts, spec.num_experts, spec.top_k
    if how == "hot":  # the first hot_tokens() tokens take the K hot experts, the rest K of the others at random
        hot = hot_experts(spec)
        cold = torch.tensor([x for x in range(E) if x not in hot])
        rows = [torch.tensor(hot)[torch.randperm(K, generator=g)] if t < hot_tokens(tokens)
                else cold[torch.randperm(E - K, generator=g)[:K]] for t in range(tokens)]
    else:
        pool = {"random": E, "skewed": n, "last_rank_idle": E - n}[how]
        rows = [torch.randperm(pool, generator=g)[:K] for _ in range(tokens)]
    ids = torch.stack(rows) if tokens else torch.empty(0, K, dtype=torch.int64)
    return ids.int(), torch.rand(tokens, K, generator=g)


def hot_experts(spec: MoESpec) -> list[int]:
    """The "hot" routing's K experts, spread evenly over the global ids (so over the ranks: each holds some where
    top_k >= ep_size)."""
    return [i * spec.num_experts // spec.top_k for i in range(spec.top_k)]


def hot_tokens(tokens: int) -> int:
    """The "hot" routing's tokens that take the hot experts: more than half. With every rank's tokens so routed, a
    hot expert receives ep_size * hot_tokens pairs, past a batched max rows of ep_size * (tokens - hot_tokens)
    (it overflows), and any other expert at most that many (a token picks it once at most: it never does), so the
    other tokens, untouched by the drops, are compared."""
    return tokens // 2 + 1


@dataclasses.dataclass(frozen=True)
class Case:
    """One expert-parallel case, the same on every rank."""

    spec: MoESpec
    tokens: int                        # tokens per rank (the layers' max_tokens: every rank sizes alike)
    how: str = "random"                # routing variant (_routing)
    backend: str = "nvlink"
    capacity: int | None = None        # nvlink non-blocking: received rows per call
    deterministic: bool = False
    overlap: bool = False              # dual-batch overlap
    sms: tuple[int, int] | None = None  # nvlink (dispatch_sms, combine_sms)
    ragged: bool = False               # rank 0 has one token, the others `tokens`
    fmt: str | None = None             # forced ep_format (None: the plan's)
    pad: int = 1                       # permuted: pad_multiple
    expert_cap: int | None = None      # batched: max rows per expert
    counts: bool = False               # calls give every rank's token count (nccl: the plan's all-gather form)

    def tokens_of(self, rank: int) -> int:
        return 1 if self.ragged and rank == 0 else self.tokens

    def tokens_per_rank(self) -> dict:
        """The layer call's tokens_per_rank keyword: every rank's count where the case gives them."""
        return {"tokens_per_rank": [self.tokens_of(r) for r in range(self.spec.ep_size)]} if self.counts else {}

    def spans(self, rank: int, overlap: bool) -> tuple[tuple[int, int], ...]:
        """Rank `rank`'s micro-batches as token ranges (one without overlap)."""
        n = self.tokens_of(rank)
        return micro_batch_spans(n) if overlap else ((0, n),)

    def rows_kept(self, overlap: bool) -> int:
        """Received rows each micro-batch keeps (non-blocking)."""
        assert self.capacity is not None
        return micro_batch_capacity(self.capacity, max(self.tokens, 1)) if overlap else self.capacity

    def layer(self, weights: MoEWeights, rank: int, target: Target, overlap: bool) -> ExpertParallelMoE:
        dispatch_sms, combine_sms = self.sms or (None, None)
        force = {"dispatch": self.backend, **({"ep_format": self.fmt} if self.fmt else {})}
        return rank_layer(self.spec, weights, rank, max_tokens=max(self.tokens, 1), target=target,
                          force=force, recv_capacity=self.capacity, overlap=overlap,
                          dispatch_sms=dispatch_sms, combine_sms=combine_sms, pad_multiple=self.pad,
                          expert_capacity=self.expert_cap)

    def overflowing_experts(self, seed: int) -> set[int]:
        """Batched: the global experts more (token, k) pairs chose than max rows (no overlap)."""
        if self.expert_cap is None:
            return set()
        counts: dict[int, int] = {}
        for src in range(self.spec.ep_size):
            ids, _ = _routing(self.spec, self.tokens_of(src), self.how, seed, src)
            for x in ids.flatten().tolist():
                counts[x] = counts.get(x, 0) + 1
        return {x for x, c in counts.items() if c > self.expert_cap}


def run_case(case: Case) -> dict:
    """One case on this rank."""
    spec, how, backend, capacity = case.spec, case.how, case.backend, case.capacity
    rank, world = dist.get_rank(), dist.get_world_size()
    seed_t = torch.tensor([random.SystemRandom().randrange(1 << 30)], device="cuda")
    dist.broadcast(seed_t, 0)
    seed = int(seed_t.item())
    weights = MoEWeights.random(spec, seed=seed)
    tokens = case.tokens_of(rank)
    g = torch.Generator().manual_seed(seed + 1 + rank)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch.bfloat16)
    ids, w = _routing(spec, tokens, how, seed, rank)
    ids_d, w_d = ids.cuda(), w.cuda()
    target = _target(case.deterministic)
    layer = case.layer(weights, rank, target, case.overlap)
    out = torch.full_like(hidden, float("nan"))
    layer(hidden, topk_ids=ids_d, topk_weights=w_d, out=out, **case.tokens_per_rank())
    torch.cuda.synchronize()
    desc = (f"{spec.name} T={tokens} K={spec.top_k} E={spec.num_experts} {how} {backend} capacity={capacity} "
            f"counts={case.counts} "
            f"det={case.deterministic} overlap={case.overlap} sms={case.sms} ragged={case.ragged} "
            f"format={layer.plan.stage('ep_format').choice} pad={case.pad} expert_cap={case.expert_cap} seed={seed}")
    assert torch.isfinite(out).all(), f"rank {rank}: unwritten/non-finite output ({desc})"
    if case.deterministic:
        again = torch.full_like(hidden, float("nan"))
        layer(hidden, topk_ids=ids_d, topk_weights=w_d, out=again, **case.tokens_per_rank())
        assert torch.equal(out, again), f"rank {rank}: deterministic EP run not bit-identical ({desc})"
    fmt = layer.plan.stage("ep_format").choice
    result = {"case": desc, "rank": rank, "world": world, "tokens": tokens, "backend": backend,
              "overlap": case.overlap, "format": fmt, "counts": case.counts}
    kept = w
    rows = torch.ones(tokens, dtype=torch.bool)  # the token rows compared
    if case.expert_cap is not None:
        hot = case.overflowing_experts(seed)
        mine = range(rank * spec.local_experts, (rank + 1) * spec.local_experts)
        result["overflow"] = overflowed = int(layer.overflow.item())
        assert overflowed == int(any(x in hot for x in mine)), f"rank {rank}: overflow flag {overflowed} ({desc})"
        rows = torch.tensor([not any(int(x) in hot for x in ids[t]) for t in range(tokens)], dtype=torch.bool)
    if capacity is not None:
        dropped = _dropped_pairs(case, seed, case.overlap)
        overflowed = int(layer.overflow.item())
        result["overflow"] = overflowed
        assert overflowed == _overflows(case, seed, case.overlap), f"rank {rank}: overflow flag {overflowed} ({desc})"
        kept = torch.where(dropped, torch.zeros_like(w), w)  # a dropped row's experts add nothing to its token
    if tokens and rows.any():
        # deterministic + permuted: the single-GPU layer with its finalize separate (a top-2 plan may fuse it, whose
        # bf16 atomic adds round twice), which the EP layer then equals bit for bit
        exact = case.deterministic and fmt == "permuted"
        single = MoERunner(dataclasses.replace(spec, ep_size=1), weights, target=target, max_tokens=tokens,
                           force={"finalize": "separate"} if exact else None)
        alone = single(hidden, topk_ids=ids_d, topk_weights=kept.cuda())
        if exact:
            assert torch.equal(out, alone), (f"rank {rank}: deterministic EP output not bit-identical to the "
                                             f"single-GPU runner: max diff {(out.float() - alone.float()).abs().max()}"
                                             f" ({desc})")
            result["bit_identical"] = True
        ref = moe_reference(spec, weights, hidden.cpu(), topk_ids=ids, topk_weights=kept)
        o, a = out.double().cpu()[rows], alone.double().cpu()[rows]
        ref = ref[rows]
        if float(ref.norm()) == 0.0:  # every pair of this rank's tokens was dropped (overflow): exact zeros
            assert float(o.abs().max()) == 0.0, f"rank {rank}: nonzero output where every row was dropped ({desc})"
            ref, a = ref + 1, a + 1  # the errors below then measure the exact zeros against ones
            o = o + 1
        result["rel_err_reference"] = float((o - ref).norm() / ref.norm())
        result["rel_err_runner"] = float((o - a).norm() / a.norm())
        assert result["rel_err_reference"] < REF_TOL, f"rank {rank}: {result} ({desc})"
        assert result["rel_err_runner"] < RUNNER_TOL, f"rank {rank}: {result} ({desc})"
    if case.overlap:  # every rank builds and calls the plain layer (collective), whatever its tokens
        err = _against_plain(case, weights, rank, target, hidden, ids_d, w_d, out, seed)
        if err is not None:
            result["rel_err_plain"] = err
    no_sync = capacity is not None or (fmt in ("permuted", "batched") and not result.get("overflow"))
    # the nccl dispatch's all-gather form reads nothing on the host: its calls capture too (the two phases refuse)
    gathered = backend == "nccl" and case.counts and fmt == "contiguous"
    if ((no_sync and backend == "nvlink") or gathered) and case.tokens:
        result["graph_rel_err"] = _graph_replay(layer, case, how, seed, out)
    return result


def _against_plain(case: Case, weights: MoEWeights, rank: int, target: Target, hidden: torch.Tensor,
                   ids: torch.Tensor, w: torch.Tensor, overlapped: torch.Tensor, seed: int) -> float | None:
    """The same layer without overlap on the same tokens: the overlapped output must match it (rel-norm <
    RUNNER_TOL) wherever no row of this rank's tokens is dropped by either (None: not compared)."""
    plain = case.layer(weights, rank, target, overlap=False)
    out = torch.full_like(hidden, float("nan"))
    plain(hidden, topk_ids=ids, topk_weights=w, out=out, **case.tokens_per_rank())
    torch.cuda.synchronize()
    drops = case.capacity is not None and any(_dropped_pairs(case, seed, o).any() for o in (True, False))
    if drops or not hidden.shape[0]:
        return None
    err = float((overlapped.double() - out.double()).norm() / out.double().norm())
    assert err < RUNNER_TOL, f"rank {rank}: overlap differs from the plain layer by {err:.3g} ({case}, seed {seed})"
    return err


def _destinations(case: Case, seed: int, src: int) -> list[list[int]]:
    """For each rank d, the tokens of rank `src` sent to d (ascending): those with an expert on d."""
    spec = case.spec
    ids, _ = _routing(spec, case.tokens_of(src), case.how, seed, src)
    n = spec.local_experts
    return [[t for t in range(len(ids)) if any(d * n <= int(x) < (d + 1) * n for x in ids[t])]
            for d in range(spec.ep_size)]


def _sent(case: Case, seed: int, overlap: bool) -> list[list[list[list[int]]]]:
    """[micro-batch][source s][destination d]: the tokens of s's micro-batch sent to d (micro-batch m of every
    rank pairs with micro-batch m of the others)."""
    ep = case.spec.ep_size
    dests = [_destinations(case, seed, s) for s in range(ep)]
    out = []
    for m in range(len(case.spans(0, overlap))):
        per_source = []
        for s in range(ep):
            lo, hi = case.spans(s, overlap)[m]
            per_source.append([[t for t in dests[s][d] if lo <= t < hi] for d in range(ep)])
        out.append(per_source)
    return out


def _overflows(case: Case, seed: int, overlap: bool) -> int:
    """1 where a micro-batch of this rank received more rows than it keeps."""
    rank, ep = dist.get_rank(), case.spec.ep_size
    keep = case.rows_kept(overlap)
    return int(any(sum(len(sent[s][rank]) for s in range(ep)) > keep for sent in _sent(case, seed, overlap)))


def _dropped_pairs(case: Case, seed: int, overlap: bool) -> torch.Tensor:
    """[T, K] bool for this rank's tokens: the pair's expert sits on a rank that dropped the token's row (a
    receiver's micro-batch keeps its first rows_kept rows, sources in rank order, each source's in token order)."""
    spec = case.spec
    rank, n = dist.get_rank(), spec.local_experts
    ids, _ = _routing(spec, case.tokens_of(rank), case.how, seed, rank)
    keep = case.rows_kept(overlap)
    dropped = torch.zeros(len(ids), spec.top_k, dtype=torch.bool)
    for sent in _sent(case, seed, overlap):
        for d in range(spec.ep_size):
            before = sum(len(sent[s][d]) for s in range(rank))
            for i, t in enumerate(sent[rank][d]):
                if before + i >= keep:
                    dropped[t] |= (ids[t] >= d * n) & (ids[t] < (d + 1) * n)
    return dropped


def _graph_replay(layer, case: Case, how: str, seed: int, eager: torch.Tensor) -> float:  # noqa: ANN001
    """The non-blocking layer (or the nccl dispatch's all-gather form) captured in a CUDA graph and replayed on the
    same inputs: its output against
    the eager call's (the same kernels on the same data: equal but for the order of a top-k > 2 fused finalize's
    bf16 atomic adds; a top-2 layer's replays came out bit-identical)."""
    rank = dist.get_rank()
    spec, tokens, counts = case.spec, case.tokens_of(rank), case.tokens_per_rank()
    g = torch.Generator().manual_seed(seed + 1 + rank)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch.bfloat16)
    ids, w = _routing(spec, tokens, how, seed, rank)
    ids, w = ids.cuda(), w.cuda()
    out = torch.full_like(hidden, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(hidden, topk_ids=ids, topk_weights=w, out=out, **counts)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(hidden, topk_ids=ids, topk_weights=w, out=out, **counts)
    torch.cuda.synchronize()
    dist.barrier()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), f"rank {rank}: graph replay left unwritten outputs"
    err = float((out.double() - eager.double()).norm() / eager.double().norm().clamp_min(1e-30))
    # the same kernels on the same data; only a top-k > 2 fused finalize's bf16 atomic adds may land in another
    # order (each add rounds: up to a few bf16 roundings apart), as two eager calls may
    assert err < RUNNER_TOL, f"rank {rank}: graph replay differs from the eager call by {err:.3g}"
    return err


def cases(world: int) -> list[Case]:
    """The cases of a `world`-rank run, in order (every rank runs the same list)."""
    base = MoESpec(256, 384, 8 * world, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
                   ep_size=world, name="ep")
    wide = MoESpec(512, 256, 64 * world, 8, ep_size=world, name="ep-wide")  # 64 experts per rank, top-8
    shared = MoESpec(256, 128, 4 * world, 2, ep_size=world, shared=SharedExperts(1, 256), name="ep-shared")
    hot_cap = world * (64 - hot_tokens(64))  # "hot" routing of 64 tokens a rank: its hot experts overflow
    gelu = MoESpec(128, 136, 4 * world, 2, activation=Activation.GELU, expert_bias=True, ep_size=world,
                   name="ep-bias-gelu")  # sizes off multiples of 128, biases, a non-gated activation
    out = []
    for backend in ("nvlink", "nccl"):
        for tokens in (1, 255, 256, 257, 8192):
            out.append(Case(base, tokens, backend=backend))
        for top_k in (1, 3, 4, 6, 8):
            out.append(Case(base.with_overrides(top_k=top_k), 200, backend=backend))
        out += [Case(wide, 1000, backend=backend), Case(wide, 64, "skewed", backend),
                Case(wide, 64, "last_rank_idle", backend), Case(shared, 100, backend=backend),
                Case(gelu, 77, backend=backend), Case(base, 300, backend=backend, deterministic=True),
                Case(base, 0, backend=backend)]  # a rank with no tokens still takes part
    # non-blocking nvlink: room for every row, then too little room (overflow), then skewed into one rank
    out += [Case(base, 100, capacity=100 * world), Case(wide, 64, capacity=40),
            Case(wide, 64, "skewed", capacity=64 * world - 3)]
    # dual-batch overlap, both dispatches: one token (the second micro-batch empty), an odd count, a large one,
    # skewed routing, shared experts, no tokens, a deterministic plan, and rank 0 with one token beside many
    for backend in ("nvlink", "nccl"):
        out += [Case(base, 1, backend=backend, overlap=True), Case(base, 257, backend=backend, overlap=True),
                Case(base, 2048, backend=backend, overlap=True), Case(wide, 64, "skewed", backend, overlap=True),
                Case(shared, 101, backend=backend, overlap=True), Case(base, 0, backend=backend, overlap=True),
                Case(base, 300, backend=backend, deterministic=True, overlap=True),
                Case(base, 200, backend=backend, overlap=True, ragged=True)]
    # overlap in the non-blocking nvlink mode (each replayed from a CUDA graph): room for every row, overflow,
    # skewed; then the SM caps (1 and 3 blocks), blocking and non-blocking, with and without overlap
    out += [Case(base, 100, capacity=100 * world, overlap=True), Case(wide, 65, capacity=40, overlap=True),
            Case(wide, 64, "skewed", capacity=64 * world - 3, overlap=True),
            Case(base, 257, sms=(1, 1)), Case(wide, 64, capacity=40, sms=(3, 1)),
            Case(base, 100, capacity=100 * world, overlap=True, sms=(1, 3))]
    # grouped formats (nvlink dispatch_with_permute): permuted, padded and not, skewed, idle ranks, no tokens, top-k
    # 1 to 8, many tokens; batched with room and overflowing; overlap; SM caps; deterministic plans (permuted by
    # the planner) bit-identical to the single-GPU runner at 1 to 8192 tokens and top-k 1 to 8
    out += [Case(base, 257, fmt="permuted"), Case(wide, 1000, fmt="permuted", pad=64),
            Case(wide, 64, "skewed", fmt="permuted", pad=8), Case(wide, 64, "last_rank_idle", fmt="permuted"),
            Case(base, 0, fmt="permuted"), Case(base.with_overrides(top_k=1), 100, fmt="permuted", pad=128),
            Case(base, 8192, fmt="permuted"), Case(shared, 100, fmt="permuted"),
            Case(base, 100, fmt="batched", expert_cap=100 * world),
            Case(wide, 64, "hot", fmt="batched", expert_cap=hot_cap),
            Case(base, 257, fmt="permuted", overlap=True), Case(wide, 64, fmt="batched", expert_cap=64 * world,
                                                                  overlap=True),
            Case(wide, 64, fmt="permuted", sms=(1, 3))]
    for tokens, top_k in ((1, 2), (255, 8), (256, 3), (257, 1), (8192, 8), (1000, 6)):
        out.append(Case(wide.with_overrides(top_k=top_k), tokens, deterministic=True))
    out.append(Case(base, 300, deterministic=True, overlap=True))
    # the nccl dispatch's grouped formats (dense rows, exact sizes): permuted padded, skewed, idle, no tokens,
    # batched with room and overflowing, overlap, and deterministic plans bit-identical at 1 to 8192 tokens
    out += [Case(base, 257, "random", "nccl", fmt="permuted", pad=8), Case(wide, 64, "skewed", "nccl", fmt="permuted"),
            Case(wide, 64, "last_rank_idle", "nccl", fmt="permuted"), Case(base, 0, backend="nccl", fmt="permuted"),
            Case(base, 100, backend="nccl", fmt="batched", expert_cap=100 * world),
            Case(wide, 64, "hot", "nccl", fmt="batched", expert_cap=hot_cap),
            Case(base, 257, backend="nccl", fmt="permuted", overlap=True)]
    for tokens, top_k in ((1, 2), (255, 8), (8192, 8)):
        out.append(Case(wide.with_overrides(top_k=top_k), tokens, backend="nccl", deterministic=True))
    # the nccl dispatch's all-gather form (calls give every rank's token count; each also replayed from a CUDA
    # graph): 1 to 8192 tokens, top-k 1 and 8, skewed, an idle rank, shared experts, biases and a non-gated
    # activation, rank 0 with one token beside many (unequal counts: a broadcast per rank there, a reduce per rank
    # back), no tokens, overlap
    nccl = functools.partial(Case, backend="nccl", counts=True)
    out += [nccl(base, 1), nccl(base, 257), nccl(base, 8192), nccl(base.with_overrides(top_k=1), 200),
            nccl(wide, 1000), nccl(wide, 64, "skewed"), nccl(wide, 64, "last_rank_idle"), nccl(shared, 100),
            nccl(gelu, 77), nccl(base, 200, ragged=True), nccl(base, 0), nccl(base, 1, overlap=True),
            nccl(base, 257, overlap=True), nccl(base, 200, overlap=True, ragged=True)]
    return out


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    results = []
    start = time.perf_counter()
    for case in cases(dist.get_world_size()):
        results.append(run_case(case))
    gathered: list[list[dict]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, results)
    if rank == 0:
        flat = [r for per_rank in gathered for r in per_rank]
        with open(sys.argv[1], "w") as f:
            json.dump({"world": dist.get_world_size(), "seconds": time.perf_counter() - start, "cases": flat}, f,
                      indent=1)
        worst = max((r.get("rel_err_runner", 0.0) for r in flat), default=0.0)
        print(f"ep_worker: {len(flat)} rank-cases passed on {dist.get_world_size()} GPUs; worst rel err vs the "
              f"single-GPU runner {worst:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
