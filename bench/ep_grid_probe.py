"""The `nvlink` dispatch + combine's time against its grid: the kernels' own grid (None) and caps of N blocks
(dispatch_sms = combine_sms = N), non-blocking, replayed from a CUDA graph (torchrun, one process per GPU).

    torchrun --standalone --nproc-per-node=4 bench/ep_grid_probe.py out.json
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from moe_build import kernels
from moe_build.bench.ep import dispatch_spec, exchange, init_rank, random_routing, time_graph
from moe_build.runner.dispatch import NvlinkDispatch

CAPS = (None, 16, 32, 64, 132, 264, 528)
POINTS = ((7168, 512), (7168, 4096), (2048, 4096))


def main() -> None:
    init_rank()
    rank, ep = dist.get_rank(), dist.get_world_size()
    rows = []
    for H, T in POINTS:
        spec = dispatch_spec(H)
        hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        ids, w = random_routing(T, spec.num_experts, spec.top_k, 1000 + rank)
        out = torch.empty_like(hidden)
        for cap in CAPS:
            d = NvlinkDispatch(spec, kernels, T, recv_capacity=ep * T, dispatch_sms=cap, combine_sms=cap)
            ms = time_graph(exchange(d, hidden, ids, w, out), 5)
            rows.append({"hidden": H, "tokens": T, "sms": cap, "us": 1e3 * ms})
            if rank == 0:
                print(f"H={H} T={T} sms={cap}: {1e3 * ms:.1f} us", flush=True)
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
