"""How much of the mixed-input GEMM's time at 4096 tokens is the last, part-filled token tile of each expert:
the x256 tile on the routed counts, against (a) the same rows in equal counts, (b) a body kernel on whole 256-row
tiles plus a tail kernel on narrow tiles for the remainders that fit them."""
import json, os, sys, torch
sys.path.insert(0, "bench")
from gemm_probe_timing import tms, woq_mixed_weights
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind

GEMMS = {"dsv2_g1": (64, 6, 2816, 2048),
         "dsv2_g2": (64, 6, 2048, 1408), "gptoss_g1": (32, 4, 5760, 2880), "gptoss_g2": (32, 4, 2880, 2880),
         "mixtral_g1": (8, 2, 28672, 4096), "mixtral_g2": (8, 2, 4096, 14336)}
TOKENS = int(os.environ.get("PROBE_TOKENS", "4096"))
out = []
torch.manual_seed(0)


def offs(counts):
    o = torch.zeros(len(counts) + 1, dtype=torch.int64, device="cuda")
    o[1:] = counts.cumsum(0)
    return o


for name, (E, topk, n, k) in GEMMS.items():
    for kind, group in ((WoqKind.INT4, 128), (WoqKind.INT8, 0)):
        b, zeros, scales, s_mn, z_mn = woq_mixed_weights(kind, group, E, n, k)
        ids = torch.rand(TOKENS, E, device="cuda").topk(topk, dim=1).indices.flatten()
        counts = torch.bincount(ids, minlength=E)
        R = int(counts.sum())
        a = torch.randn(R, k, device="cuda").to(torch.bfloat16)
        c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")

        def run(cnt, tile):
            o = offs(cnt)
            rows = int(cnt.sum())
            return lambda: K.grouped_gemm_woq_sm90(a[:rows], b, kind.value, s_mn, z_mn, o, group, c=c[:rows],
                                                   tactic=f"wgmma:woq128x{tile}:plain:plain")
        res = {}
        for tile in (128, 256):
            res[f"x{tile}"] = tms(run(counts, tile), iters=10)
        eq = torch.full((E,), R // E, dtype=torch.int64, device="cuda")
        res["x256_equal_counts"] = tms(run(eq, 256), iters=10)
        for w in (32, 64, 128):
            r = counts % 256
            tail = torch.where((r > 0) & (r <= w), r, torch.zeros_like(r))
            body = counts - tail
            if int(tail.sum()) == 0:
                continue
            fb, ft = run(body, 256), run(tail, w)

            def both():
                fb(); ft()
            res[f"x256+tail{w}"] = tms(both, iters=10)
            res[f"tail{w}_alone"] = tms(ft, iters=10)
        dense = torch.empty(E, n, k, dtype=torch.bfloat16, device="cuda")
        o = offs(counts)
        res["bf16:coop128x256"] = tms(lambda: K.grouped_gemm_sm90(a, dense, o, c=c,
                                                                  tactic="wgmma:coop128x256:plain:plain"), iters=10)
        res = {t: round(v, 1) for t, v in res.items()}
        tiles256 = int(((counts + 255) // 256).sum())
        print(name, kind.value, f"avg {R / E:.0f} rows, {tiles256} x256 tiles for {R / 256:.1f} whole", res,
              flush=True)
        out.append(dict(gemm=name, kind=kind.value, tokens=TOKENS, counts=counts.tolist(), times=res))
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tail_probe.json"), "w"), indent=1)
print("\nname kind x256 | equal/x256 | best split/x256 (which) | bf16/x256")
for r in out:
    t = r["times"]
    splits = {kk: v for kk, v in t.items() if kk.startswith("x256+")}
    best = min(splits, key=splits.get) if splits else "x256"
    splits.setdefault("x256", t["x256"])
    print(f"{r['gemm']:<11} {r['kind']:<5} {t['x256']:8.1f} | {t['x256_equal_counts'] / t['x256']:.3f} | "
          f"{splits[best] / t['x256']:.3f} ({best}) | {t['bf16:coop128x256'] / t['x256']:.3f}")
