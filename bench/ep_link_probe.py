"""Which way moves rows between the GPUs of one NVLink domain fastest: SM kernels that push (read local, write a
peer), SM kernels that pull (read a peer, write local), or the copy engines (torchrun, one process per GPU).

Every rank moves `MIB` MiB to (push) or from (pull) each of its peers at once, one CUDA stream per peer, as an
all-to-all does; the SM kernels are torch's elementwise copy (`torch.mul(src, 1, out=dst)`), the copy engine
`dst.copy_(src)` (cudaMemcpyAsync). Peers' memory is torch symmetric memory (multicast off). Reported per rank:
GB/s sent (push) or received (pull) over the peers, the slowest rank's, median of rounds. The `nvlink` exchange
(cpp/src/stages/ep_nvlink.cu) pushes today; this says whether pulling would pay.

    torchrun --standalone --nproc-per-node=4 bench/ep_link_probe.py out.json
"""
from __future__ import annotations

import json
import statistics
import sys

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

from moe_build.bench.ep import init_rank

MIB = 64
ROUNDS = 7


def timed(moves: list, streams: list[torch.cuda.Stream]) -> float:  # noqa: ANN001
    """Seconds for every (fn) of `moves` run at once, one per stream, after a barrier: the slowest rank's."""
    dist.barrier()
    torch.cuda.synchronize()
    main = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(main)
    for fn, s in zip(moves, streams):
        s.wait_stream(main)
        with torch.cuda.stream(s):
            fn()
    for s in streams:
        main.wait_stream(s)
    end.record(main)
    torch.cuda.synchronize()
    t = torch.tensor([start.elapsed_time(end) / 1e3], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def main() -> None:
    init_rank()
    rank, ep = dist.get_rank(), dist.get_world_size()
    n = MIB * 2**20 // 2  # bf16 elements per peer
    buf = symm_mem.empty(ep * n, dtype=torch.bfloat16, device="cuda")
    handle = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
    buf.normal_()
    local = torch.randn(ep * n, dtype=torch.bfloat16, device="cuda")
    peers = [p for p in range(ep) if p != rank]
    # rank r's region r of a peer's buffer is where r writes (push) or reads (pull) there
    remote = {p: handle.get_buffer(p, (ep * n,), torch.bfloat16)[rank * n:(rank + 1) * n] for p in peers}
    mine = {p: local[p * n:(p + 1) * n] for p in peers}
    streams = [torch.cuda.Stream() for _ in peers]
    torch.cuda.synchronize()
    dist.barrier()
    ways = {
        "sm_push": [lambda p=p: torch.mul(mine[p], 1, out=remote[p]) for p in peers],
        "sm_pull": [lambda p=p: torch.mul(remote[p], 1, out=mine[p]) for p in peers],
        "ce_push": [lambda p=p: remote[p].copy_(mine[p]) for p in peers],
        "ce_pull": [lambda p=p: mine[p].copy_(remote[p]) for p in peers],
    }
    results = {}
    for name, moves in ways.items():
        timed(moves, streams)  # warm-up
        secs = statistics.median(timed(moves, streams) for _ in range(ROUNDS))
        results[name] = {"us": secs * 1e6, "gbps": len(peers) * n * 2 / secs / 1e9}
    if rank == 0:
        doc = {"ranks": ep, "mib_per_peer": MIB, "device": torch.cuda.get_device_name(), "results": results}
        with open(sys.argv[1], "w") as f:
            json.dump(doc, f, indent=1)
        for name, r in results.items():
            print(f"{name}: {r['us']:.0f} us, {r['gbps']:.0f} GB/s per rank over {len(peers)} peers")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
