"""One rank of the expert-parallel correctness run (torchrun --nproc-per-node N tests/gpu/ep_worker.py OUT.json).

Every case: the same random layer on every rank (a seed rank 0 draws and broadcasts), each rank's own random
tokens and pinned routing; the rank's ExpertParallelMoE output (NaN-poisoned before the call) against
- the fp64 reference of the whole layer on the same tokens and routing (rel-norm error < REF_TOL, as the
  single-GPU runner's tests hold it), and
- the single-GPU runner (every expert on this GPU) on the same tokens and routing: the two differ only in
  where bf16 roundings fall (the EP path rounds each rank's partial sum before adding the ranks' sums, and
  its GEMMs may run another tactic for their row counts, so an intermediate bf16 rounding can fall the other
  way), measured 4e-3 at worst: rel-norm < RUNNER_TOL, two bf16 roundings. Bit-identity with the single-GPU
  runner is not claimed; a deterministic plan's EP output is bit-identical from run to run.
Routing variants: random top-k, skewed (every token to rank 0's experts: the other ranks receive nothing),
and one rank receiving nothing (no token picks the last rank's experts). Deterministic plans are also run
twice and must be bit-identical. Rank 0 writes every case's errors to OUT.json; any failure raises (exit 1).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from moe_build.reference import moe_reference
from moe_build.runner import MoERunner
from moe_build.runner.expert_parallel import rank_layer
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
    n, E = spec.local_experts, spec.num_experts
    pool = {"random": E, "skewed": n, "last_rank_idle": E - n}[how]
    ids = torch.stack([torch.randperm(pool, generator=g)[: spec.top_k] for _ in range(tokens)]) if tokens else \
        torch.empty(0, spec.top_k, dtype=torch.int64)
    return ids.int(), torch.rand(tokens, spec.top_k, generator=g)


def run_case(spec: MoESpec, tokens: int, how: str, backend: str, capacity: int | None = None,
             deterministic: bool = False) -> dict:
    """One case on this rank; `capacity` (nvlink only): the non-blocking mode's received rows per call."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seed_t = torch.tensor([random.SystemRandom().randrange(1 << 30)], device="cuda")
    dist.broadcast(seed_t, 0)
    seed = int(seed_t.item())
    weights = MoEWeights.random(spec, seed=seed)
    g = torch.Generator().manual_seed(seed + 1 + rank)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch.bfloat16)
    ids, w = _routing(spec, tokens, how, seed, rank)
    ids_d, w_d = ids.cuda(), w.cuda()
    target = _target(deterministic)
    layer = rank_layer(spec, weights, rank, max_tokens=max(tokens, 1), target=target, force={"dispatch": backend},
                       recv_capacity=capacity)
    out = torch.full_like(hidden, float("nan"))
    layer(hidden, topk_ids=ids_d, topk_weights=w_d, out=out)
    torch.cuda.synchronize()
    case = (f"{spec.name} T={tokens} K={spec.top_k} E={spec.num_experts} {how} {backend} capacity={capacity} "
            f"det={deterministic} seed={seed}")
    assert torch.isfinite(out).all(), f"rank {rank}: unwritten/non-finite output ({case})"
    if deterministic:
        again = torch.full_like(hidden, float("nan"))
        layer(hidden, topk_ids=ids_d, topk_weights=w_d, out=again)
        assert torch.equal(out, again), f"rank {rank}: deterministic EP run not bit-identical ({case})"
    result = {"case": case, "rank": rank, "world": world, "tokens": tokens, "backend": backend}
    kept = w
    if capacity is not None:
        dropped = _dropped_pairs(spec, tokens, how, seed, capacity)
        overflowed = int(layer.overflow.item())
        result["overflow"] = overflowed
        received = _received_rows(spec, tokens, how, seed)
        assert overflowed == int(received[rank] > capacity), f"rank {rank}: overflow flag {overflowed} ({case})"
        kept = torch.where(dropped, torch.zeros_like(w), w)  # a dropped row's experts add nothing to its token
    if tokens:
        single = MoERunner(dataclasses.replace(spec, ep_size=1), weights, target=target, max_tokens=tokens)
        alone = single(hidden, topk_ids=ids_d, topk_weights=kept.cuda())
        ref = moe_reference(spec, weights, hidden.cpu(), topk_ids=ids, topk_weights=kept)
        o, a = out.double().cpu(), alone.double().cpu()
        if float(ref.norm()) == 0.0:  # every pair of this rank's tokens was dropped (overflow): exact zeros
            assert float(o.abs().max()) == 0.0, f"rank {rank}: nonzero output where every row was dropped ({case})"
            ref, a = ref + 1, a + 1  # the errors below then measure the exact zeros against ones
            o = o + 1
        result["rel_err_reference"] = float((o - ref).norm() / ref.norm())
        result["rel_err_runner"] = float((o - a).norm() / a.norm())
        assert result["rel_err_reference"] < REF_TOL, f"rank {rank}: {result} ({case})"
        assert result["rel_err_runner"] < RUNNER_TOL, f"rank {rank}: {result} ({case})"
    if capacity is not None and backend == "nvlink" and tokens:
        result["graph_rel_err"] = _graph_replay(layer, spec, tokens, how, seed, out)
    return result


def _destinations(spec: MoESpec, tokens: int, how: str, seed: int, src: int) -> list[list[int]]:
    """For each rank d, the tokens of rank `src` sent to d (ascending): those with an expert on d."""
    ids, _ = _routing(spec, tokens, how, seed, src)
    n = spec.local_experts
    return [[t for t in range(tokens) if any(d * n <= int(x) < (d + 1) * n for x in ids[t])]
            for d in range(spec.ep_size)]


def _received_rows(spec: MoESpec, tokens: int, how: str, seed: int) -> list[int]:
    sent = [_destinations(spec, tokens, how, seed, s) for s in range(spec.ep_size)]
    return [sum(len(sent[s][d]) for s in range(spec.ep_size)) for d in range(spec.ep_size)]


def _dropped_pairs(spec: MoESpec, tokens: int, how: str, seed: int, capacity: int) -> torch.Tensor:
    """[T, K] bool for this rank's tokens: the pair's expert sits on a rank that dropped the token's row (a
    receiver keeps the first `capacity` rows, sources in rank order, each source's in token order)."""
    rank, n = dist.get_rank(), spec.local_experts
    ids, _ = _routing(spec, tokens, how, seed, rank)
    sent = [_destinations(spec, tokens, how, seed, s) for s in range(spec.ep_size)]
    dropped = torch.zeros(tokens, spec.top_k, dtype=torch.bool)
    for d in range(spec.ep_size):
        before = sum(len(sent[s][d]) for s in range(rank))
        for i, t in enumerate(sent[rank][d]):
            if before + i >= capacity:
                dropped[t] |= (ids[t] >= d * n) & (ids[t] < (d + 1) * n)
    return dropped


def _graph_replay(layer, spec: MoESpec, tokens: int, how: str, seed: int, eager: torch.Tensor) -> float:  # noqa: ANN001
    """The non-blocking layer captured in a CUDA graph and replayed on the same inputs: its output against
    the eager call's (the same kernels on the same data: equal but for the order of a top-k > 2 fused finalize's
    bf16 atomic adds; a top-2 layer's replays came out bit-identical)."""
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(seed + 1 + rank)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch.bfloat16)
    ids, w = _routing(spec, tokens, how, seed, rank)
    ids, w = ids.cuda(), w.cuda()
    out = torch.full_like(hidden, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(hidden, topk_ids=ids, topk_weights=w, out=out)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(hidden, topk_ids=ids, topk_weights=w, out=out)
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


def cases(world: int) -> list[tuple[MoESpec, int, str, str, int | None, bool]]:
    """(spec, tokens per rank, routing, backend, non-blocking capacity, deterministic)."""
    base = MoESpec(256, 384, 8 * world, 2, routing=Routing(RoutingMethod.SOFTMAX_TOPK, renormalize=True),
                   ep_size=world, name="ep")
    wide = MoESpec(512, 256, 64 * world, 8, ep_size=world, name="ep-wide")  # 64 experts per rank, top-8
    shared = MoESpec(256, 128, 4 * world, 2, ep_size=world, shared=SharedExperts(1, 256), name="ep-shared")
    gelu = MoESpec(128, 136, 4 * world, 2, activation=Activation.GELU, expert_bias=True, ep_size=world,
                   name="ep-bias-gelu")  # sizes off multiples of 128, biases, a non-gated activation
    out = []
    for backend in ("nvlink", "nccl"):
        for tokens in (1, 255, 256, 257, 8192):
            out.append((base, tokens, "random", backend, None, False))
        for top_k in (1, 3, 4, 6, 8):
            out.append((base.with_overrides(top_k=top_k), 200, "random", backend, None, False))
        out += [(wide, 1000, "random", backend, None, False), (wide, 64, "skewed", backend, None, False),
                (wide, 64, "last_rank_idle", backend, None, False), (shared, 100, "random", backend, None, False),
                (gelu, 77, "random", backend, None, False), (base, 300, "random", backend, None, True),
                (base, 0, "random", backend, None, False)]  # a rank with no tokens still takes part
    # non-blocking nvlink: room for every row, then too little room (overflow), then skewed into one rank
    out += [(base, 100, "random", "nvlink", 100 * world, False), (wide, 64, "random", "nvlink", 40, False),
            (wide, 64, "skewed", "nvlink", 64 * world - 3, False)]
    return out


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    results = []
    start = time.perf_counter()
    for spec, tokens, how, backend, capacity, det in cases(dist.get_world_size()):
        results.append(run_case(spec, tokens, how, backend, capacity, det))
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
