"""Mixed-input x256 tile variants on the routed counts at 4096 tokens: k tile 64 (today), k tile 128 (tactic slot
woq128x16 in this experimental library), 2x1 cluster (slot woq128x32)."""
import json, os, sys, torch
sys.path.insert(0, "bench")
from gemm_probe_timing import tms, woq_mixed_weights
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind

GEMMS = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "dsv2_g1": (64, 6, 2816, 2048),
         "dsv2_g2": (64, 6, 2048, 1408), "gptoss_g1": (32, 4, 5760, 2880), "gptoss_g2": (32, 4, 2880, 2880),
         "mixtral_g1": (8, 2, 28672, 4096), "mixtral_g2": (8, 2, 4096, 14336)}
TOKENS = [int(t) for t in os.environ.get("PROBE_TOKENS", "4096").split(",")]
VARIANTS = {"k64": "woq128x256", "convert_only": "woq128x16", "k64c2": "woq128x32"}
out = []
torch.manual_seed(0)
for T in TOKENS:
  for name, (E, topk, n, k) in GEMMS.items():
    for kind, group in ((WoqKind.INT4, 128), (WoqKind.INT8, 0)):
        g = group if group else k
        if k % g:
            continue
        b, zeros, scales, s_mn, z_mn = woq_mixed_weights(kind, group, E, n, k)
        ids = torch.rand(T, E, device="cuda").topk(topk, dim=1).indices.flatten()
        o = torch.zeros(E + 1, dtype=torch.int64, device="cuda")
        o[1:] = torch.bincount(ids, minlength=E).cumsum(0)
        R = T * topk
        a = torch.randn(R, k, device="cuda").to(torch.bfloat16)
        res, ref = {}, None
        for v, tile in VARIANTS.items():
            c = torch.full((R, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            f = lambda: K.grouped_gemm_woq_sm90(a, b, kind.value, s_mn, z_mn, o, group, c=c,
                                                tactic=f"wgmma:{tile}:plain:plain")
            try:
                res[v] = round(tms(f, iters=10), 1)
            except Exception as e:
                res[v] = None; print(v, "failed", str(e)[:200]); continue
            if ref is None:
                ref = c.float()
            else:
                err = (c.float() - ref).abs().max().item()
                if not err <= 1e-2 * ref.abs().max().item():
                    print(name, v, "MISMATCH", err)
        print(T, name, kind.value, res, {v: round(t / res["k64"], 3) for v, t in res.items() if t}, flush=True)
        out.append(dict(tokens=T, gemm=name, kind=kind.value, times=res))
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tilek_probe.json"), "w"), indent=1)
