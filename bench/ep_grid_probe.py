"""The `nvlink` dispatch + combine's time against its grid: the kernels' own grid (None) and caps of N blocks
(dispatch_sms = combine_sms = N), non-blocking, replayed from a CUDA graph (torchrun, one process per GPU).

    torchrun --standalone --nproc-per-node=4 bench/ep_grid_probe.py out.json
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from moe_build import kernels
from moe_build.bench.ep import _routing, _time_graph
from moe_build.runner.dispatch import NvlinkDispatch
from moe_build.spec import MoESpec

CAPS = (None, 16, 32, 64, 132, 264, 528)
POINTS = ((7168, 512), (7168, 4096), (2048, 4096))


def main() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    rank, ep = dist.get_rank(), dist.get_world_size()
    rows = []
    for H, T in POINTS:
        spec = MoESpec(H, 256, 128 if H == 2048 else 256, 8, ep_size=ep, ep_rank=rank)
        hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        ids, w = _routing(T, spec.num_experts, spec.top_k, 1000 + rank)
        out = torch.empty_like(hidden)
        for cap in CAPS:
            d = NvlinkDispatch(spec, kernels, T, recv_capacity=ep * T, dispatch_sms=cap, combine_sms=cap)

            def call() -> None:
                got = d.dispatch(hidden, ids, w)  # noqa: B023
                d.combine(got.hidden, got, out)  # noqa: B023
            ms = _time_graph(call, 5)
            rows.append({"hidden": H, "tokens": T, "sms": cap, "us": 1e3 * ms})
            if rank == 0:
                print(f"H={H} T={T} sms={cap}: {1e3 * ms:.1f} us", flush=True)
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
