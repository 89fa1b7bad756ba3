"""Session probe: mb_ep_layout alone, per call, from a CUDA graph of 20 calls back to back (us), this library."""
import json, os, sys
import torch
from moe_build import kernels as K

res = []
for ep in (2, 4, 8):
    for T in (1, 16, 128, 1024, 4096):
        g = torch.Generator().manual_seed(T)
        ids = torch.stack([torch.randperm(128, generator=g)[:8] for _ in range(T)]).int().cuda()
        per = 128 // ep
        counts = torch.empty(ep, dtype=torch.int32, device="cuda")
        rows = torch.empty(T * ep, dtype=torch.int32, device="cuda")
        slots = torch.empty(T, ep, dtype=torch.int32, device="cuda")
        K.ep_layout(ids, ep, per, counts, rows, slots)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                K.ep_layout(ids, ep, per, counts, rows, slots)
        ts = []
        for _ in range(15):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record(); graph.replay(); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1e3 / 20)
        ts.sort()
        res.append(dict(ep=ep, tokens=T, us=ts[len(ts) // 2]))
        print(f"{os.environ.get('TAG', '')} ep {ep} tokens {T:5d}: {ts[len(ts) // 2]:6.2f} us per call", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), f"layout_probe_{os.environ.get('TAG', 'x')}.json"), "w"))
