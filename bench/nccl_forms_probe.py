"""The nccl dispatch's all-gather form against the worst-case all-to-all, piece by piece (torchrun, one process per
GPU): each piece replayed from a CUDA graph (GPU time alone, no host), torch's own all-gather / reduce-scatter /
all-to-all of the same bytes beside ours, and our eager dispatch + combine under torch.profiler (where its host
time goes).

    torchrun --standalone --nproc-per-node=2 bench/nccl_forms_probe.py out.json
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from moe_build import kernels
from moe_build.bench.ep import _time, dispatch_spec, exchange, init_rank, nccl_exchange, random_routing, time_graph
from moe_build.runner.dispatch import NcclDispatch

POINTS = ((2048, 1), (2048, 128), (2048, 4096), (7168, 1), (7168, 128), (7168, 1024), (7168, 4096))
ITERS = 10


def point(H: int, T: int) -> dict:
    ep = dist.get_world_size()
    spec = dispatch_spec(H)
    d = NcclDispatch(spec, kernels, exchange=nccl_exchange(spec, T))
    hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    ids, w = random_routing(T, spec.num_experts, spec.top_k, 1000 + dist.get_rank())
    out = torch.empty_like(hidden)
    counts = [T] * ep
    got = d.dispatch(hidden, ids, w, counts)
    partial = got.hidden.clone()
    x = hidden.repeat(ep, 1)
    y = torch.empty_like(x)
    gathered = torch.empty_like(x)
    us = {
        "pair_a2a": time_graph(lambda: (dist.all_to_all_single(y, x), dist.all_to_all_single(x, y)), ITERS),
        "one_a2a": time_graph(lambda: dist.all_to_all_single(y, x), ITERS),
        "torch_all_gather": time_graph(lambda: dist.all_gather_into_tensor(gathered, hidden), ITERS),
        "torch_reduce_scatter": time_graph(lambda: dist.reduce_scatter_tensor(out, partial), ITERS),
        "ours_dispatch": time_graph(lambda: d.dispatch(hidden, ids, w, counts), ITERS),
        "ours_combine": time_graph(lambda: d.combine(partial, got, out), ITERS),
        "ours_pair": time_graph(exchange(d, hidden, ids, w, out, counts), ITERS),
        "ours_pair_eager": _time(exchange(d, hidden, ids, w, out, counts), ITERS),
        "pair_a2a_eager": _time(lambda: (dist.all_to_all_single(y, x), dist.all_to_all_single(x, y)), ITERS),
    }
    return {"hidden": H, "tokens": T, **{k: 1e3 * v for k, v in us.items()}}


def host_profile(H: int, T: int, top: int = 16) -> list[dict]:
    """Our eager all-gather dispatch + combine under torch.profiler: host ops by self CPU us per call."""
    from torch.profiler import ProfilerActivity, profile
    spec = dispatch_spec(H)
    d = NcclDispatch(spec, kernels, exchange=nccl_exchange(spec, T))
    hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    ids, w = random_routing(T, spec.num_experts, spec.top_k, 7)
    call = exchange(d, hidden, ids, w, torch.empty_like(hidden), [T] * dist.get_world_size())
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(ITERS):
            call()
        torch.cuda.synchronize()
    rows = [{"name": e.key[:70], "calls": e.count / ITERS, "self_cpu_us": e.self_cpu_time_total / ITERS}
            for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r["self_cpu_us"])[:top]


def main() -> None:
    init_rank()
    result = {"world": dist.get_world_size(), "points": [point(H, T) for H, T in POINTS],
              "host_profile_7168_1": host_profile(7168, 1)}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)
        for p in result["points"]:
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items()))
        for r in result["host_profile_7168_1"]:
            print(f"  {r['self_cpu_us']:7.1f} us x{r['calls']:.0f} {r['name']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
