"""Where an eager `nccl` dispatch + combine spends its time (torchrun, one process per GPU).

For each point: the call's time as `moe-build bench-ep` takes it (10 calls back to back), the same with
`torch.profiler` over the calls (host ops by self CPU time, kernels by device time), and the building blocks
timed alone the same way: one equal-split `all_to_all_single`, one with split lists, a counts all-to-all read
to the host.

    torchrun --standalone --nproc-per-node=2 bench/ep_host_probe.py out.json
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from moe_build import kernels
from moe_build.bench.ep import _time, dispatch_spec, exchange, init_rank, random_routing
from moe_build.runner.dispatch import NcclDispatch

POINTS = ((7168, 1), (7168, 128), (7168, 4096), (2048, 1))
ITERS = 10


def blocks(H: int, T: int) -> dict:
    """The exchange's building blocks, each timed alone: us per call."""
    ep = dist.get_world_size()
    x = torch.randn(T * ep, H, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    splits = [T] * ep
    counts = torch.full((ep,), T, dtype=torch.int32, device="cuda")
    recv = torch.empty_like(counts)

    def counts_to_host() -> None:
        dist.all_to_all_single(recv, counts)
        recv.tolist()

    return {"a2a_equal_us": 1e3 * _time(lambda: dist.all_to_all_single(y, x), ITERS),
            "a2a_splits_us": 1e3 * _time(lambda: dist.all_to_all_single(y, x, splits, splits), ITERS),
            "counts_to_host_us": 1e3 * _time(counts_to_host, ITERS),
            "sync_only_us": 1e3 * _time(lambda: recv.tolist(), ITERS)}


def profiled(fn, top: int = 18) -> list[dict]:  # noqa: ANN001
    """fn called ITERS times under torch.profiler: host ops by self CPU us per call, and device kernels."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        rows.append({"name": e.key[:70], "calls": e.count / ITERS, "self_cpu_us": e.self_cpu_time_total / ITERS,
                     "device_us": getattr(e, "self_device_time_total", 0) / ITERS})
    return sorted(rows, key=lambda r: -max(r["self_cpu_us"], r["device_us"]))[:top]


def main() -> None:
    init_rank()
    rank = dist.get_rank()
    out = {"world": dist.get_world_size(), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "points": []}
    pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
    out["backend_attrs"] = sorted(a for a in dir(pg) if "comm" in a.lower() or "nccl" in a.lower())
    for H, T in POINTS:
        spec = dispatch_spec(H)
        d = NcclDispatch(spec, kernels)
        hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        ids, w = random_routing(T, spec.num_experts, spec.top_k, 1000 + rank)
        o = torch.empty_like(hidden)
        call = exchange(d, hidden, ids, w, o)
        point = {"hidden": H, "tokens": T, "nccl_us": 1e3 * _time(call, ITERS), **blocks(H, T)}
        point["profile"] = profiled(call)
        out["points"].append(point)
        if rank == 0:
            print(json.dumps({k: v for k, v in point.items() if k != "profile"}), flush=True)
            for r in point["profile"]:
                print(f"   {r['name']:70s} {r['calls']:5.1f} {r['self_cpu_us']:8.1f} {r['device_us']:8.1f}")
    if rank == 0:
        print(json.dumps({k: out[k] for k in ("world", "torch", "nccl", "backend_attrs")}))
        if len(sys.argv) > 1:
            with open(sys.argv[1], "w") as f:
                json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
