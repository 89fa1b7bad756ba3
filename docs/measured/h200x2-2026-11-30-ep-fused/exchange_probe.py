"""Session probe (torchrun, 2 ranks): the non-blocking nvlink dispatch + combine replayed from a CUDA graph, and the
worst-case all_to_all_single pair beside it, per point (ms per call: moe_build.bench.ep's rounds), this tree."""
import json, os, sys
import torch
import torch.distributed as dist
from moe_build import kernels
from moe_build.bench.ep import dispatch_spec, exchange, init_rank, random_routing, time_graph
from moe_build.runner.dispatch import NvlinkDispatch

init_rank()
rank, ep = dist.get_rank(), dist.get_world_size()
res = []
for H in (2048, 7168):
    spec = dispatch_spec(H)
    for T in (1, 16, 128, 1024, 4096):
        hidden = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        ids, w = random_routing(T, spec.num_experts, spec.top_k, 1000 + rank)
        out = torch.empty_like(hidden)
        d = NvlinkDispatch(spec, kernels, T, recv_capacity=ep * T)
        ours = time_graph(exchange(d, hidden, ids, w, out), int(os.environ.get("ITERS", "15")))
        del d
        send, recv = hidden.repeat(ep, 1), torch.empty(ep * T, H, device="cuda", dtype=torch.bfloat16)
        def worst():
            dist.all_to_all_single(recv, send)
            dist.all_to_all_single(send, recv)
        pair = time_graph(worst, int(os.environ.get("ITERS", "15")))
        res.append(dict(hidden=H, tokens=T, nvlink_graph_us=1e3 * ours, worst_case_graph_us=1e3 * pair))
        if rank == 0:
            print(f"{os.environ.get('TAG', '')} H={H} T={T}: nvlink {1e3 * ours:.1f} us, pair {1e3 * pair:.1f}", flush=True)
if rank == 0:
    json.dump(res, open(os.path.join(os.environ["OUT"], f"exchange_{os.environ.get('TAG', 'x')}.json"), "w"))
dist.destroy_process_group()
