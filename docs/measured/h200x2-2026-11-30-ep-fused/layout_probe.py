"""Session probe: mb_ep_layout alone, per call, from a CUDA graph of 20 calls back to back (us), this tree's library."""
import inspect, json, os
import torch
from moe_build import kernels as K

new_api = "block_counts" in inspect.signature(K.ep_layout).parameters
res = []
for ep in (2, 4, 8):
    for T in (1, 16, 128, 1024, 2048, 4096, 8192):
        g = torch.Generator().manual_seed(T)
        ids = torch.stack([torch.randperm(128, generator=g)[:8] for _ in range(T)]).int().cuda()
        per = 128 // ep
        counts = torch.empty(ep, dtype=torch.int32, device="cuda")
        rows = torch.empty(T * ep, dtype=torch.int32, device="cuda")
        slots = torch.empty(T, ep, dtype=torch.int32, device="cuda")
        extra = {"block_counts": torch.empty(max(1, K.layout_block_counts(T, ep)), dtype=torch.int32,
                                             device="cuda")} if new_api else {}
        K.ep_layout(ids, ep, per, counts, rows, slots, **extra)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                K.ep_layout(ids, ep, per, counts, rows, slots, **extra)
        ts = []
        for _ in range(15):
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record(); graph.replay(); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) * 1e3 / 20)
        ts.sort()
        res.append(dict(ep=ep, tokens=T, us=ts[len(ts) // 2]))
        print(f"{os.environ.get('TAG', '')} ep {ep} tokens {T:5d}: {ts[len(ts) // 2]:6.2f} us per call", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), f"layout_probe_{os.environ.get('TAG', 'x')}.json"), "w"))
