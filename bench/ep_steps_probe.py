"""Where a non-blocking `nvlink` dispatch + combine spends its time, kernel by kernel (torchrun, one process per GPU).

Each point's dispatch + combine (and the Qwen3-30B-A3B EP layer at 1 token) is captured in a CUDA graph, replayed
back to back under torch.profiler; per kernel name: calls and device time per replay, the slowest rank's, beside
the replay's time from CUDA events (the gap between the two is launch latency and idle time between kernels).

    torchrun --standalone --nproc-per-node=4 bench/ep_steps_probe.py out.json [HIDDEN:TOKENS,...]

The optional second argument replaces the default points (POINTS), e.g. 2048:1,2048:4096.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from graph_kernel_times import kernel_times, print_kernel_times

from moe_build import kernels
from moe_build.bench.ep import capture, dispatch_spec, exchange, init_rank, random_routing, random_weights
from moe_build.runner.dispatch import NvlinkDispatch
from moe_build.runner.expert_parallel import rank_layer
from moe_build.spec import MoESpec

REPLAYS = 20
POINTS = ((7168, 1), (7168, 128), (7168, 512), (7168, 4096), (2048, 1))


def profile(fn, label: str) -> dict:  # noqa: ANN001
    """fn captured once, replayed REPLAYS times under the profiler: per-kernel us per replay, replay us."""
    graph = capture(fn)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    row = {"label": label, **kernel_times(graph, REPLAYS, lambda name: name[:60])}
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return max(rows, key=lambda r: r["replay_us"])  # type: ignore[arg-type,return-value]


def main() -> None:
    init_rank()
    rank, ep = dist.get_rank(), dist.get_world_size()
    results = []
    points = POINTS if len(sys.argv) < 3 else tuple(tuple(int(v) for v in p.split(":")) for p in sys.argv[2].split(","))
    for H, T in points:
        spec = dispatch_spec(H)
        d = NvlinkDispatch(spec, kernels, T, recv_capacity=ep * T)
        hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        ids, w = random_routing(T, spec.num_experts, spec.top_k, 1000 + rank)
        results.append(profile(exchange(d, hidden, ids, w, torch.empty_like(hidden)),
                               f"dispatch+combine H={H} T={T}"))
    spec = MoESpec(2048, 768, 128, 8, ep_size=ep, name="qwen3-30b-a3b")
    weights = random_weights(spec, seed=7)
    layer = rank_layer(spec, weights, rank, max_tokens=1, force={"dispatch": "nvlink"}, recv_capacity=ep)
    hidden = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    ids, w = random_routing(1, 128, 8, 2000 + rank)
    out = torch.empty_like(hidden)
    results.append(profile(lambda: layer(hidden, topk_ids=ids, topk_weights=w, out=out), "qwen3 EP layer T=1"))
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=1)
        for r in results:
            print_kernel_times(r["label"], r)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
