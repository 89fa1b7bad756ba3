"""Which token-row height of the mixed-input wgmma tile (gemm/woq_sm90.cu) multiplies the fewest wasted rows: every
woq tile from 128 to 320 token rows on the W4A16 GEMMs of the bench shapes (int4 with zero points, groups of 128, 64
where k is not a multiple of 128) at 96 to 1024 average rows per expert, the rows routed uniformly at random (each
expert's count binomial about the average, as the bench's routing gives), L2 flushed before each call, median of 10.
The evidence for the woq tile rule in moe_build/planner/tactics/woq.py (woq_wgmma_tile_rule). Writes
woq_tile_rows_probe.json to $OUT (or the working directory) and prints each tile's time over the point's best.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so [PROBE_TILES=t,t] python bench/woq_tile_rows_probe.py [avg,...]
"""
import json, os, sys, torch
from gemm_probe_timing import tms, woq_mixed_weights
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind

# name: (experts, top_k, n, k) of the layer GEMMs of the bench shapes (GEMM1: gate and up rows)
GEMMS = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "dsv2_g1": (64, 6, 2816, 2048),
         "dsv2_g2": (64, 6, 2048, 1408), "gptoss_g1": (32, 4, 5760, 2880), "gptoss_g2": (32, 4, 2880, 2880),
         "mixtral_g1": (8, 2, 28672, 4096), "mixtral_g2": (8, 2, 4096, 14336)}
AVG_ROWS = tuple(int(a) for a in sys.argv[1].split(",")) if len(sys.argv) > 1 else (
    96, 128, 144, 160, 176, 192, 208, 224, 256, 288, 320, 352, 384, 448, 512, 576, 640, 768, 896, 1024)
TILES = tuple(os.environ.get("PROBE_TILES", "woq128x128,woq128x160,woq128x192,woq128x224,woq128x256,woq128x320c2")
              .split(","))  # PROBE_TILES: a subset, e.g. for a library without the newer tiles

rows = []
gen = torch.Generator(device="cuda").manual_seed(0)
for name, (E, topk, n, k) in GEMMS.items():
    group = 128 if k % 128 == 0 else 64
    b, _zeros, _scales, s_mn, z_mn = woq_mixed_weights(WoqKind.INT4, group, E, n, k)
    for avg in AVG_ROWS:
        tokens = max(1, avg * E // topk)
        R = tokens * topk
        if R * max(n, k) * 2 > (8 << 30):
            continue
        ids = torch.randint(0, E, (R,), device="cuda", generator=gen)
        counts = torch.bincount(ids, minlength=E)
        off = torch.zeros(E + 1, dtype=torch.int64, device="cuda")
        off[1:] = counts.cumsum(0)
        a = torch.randn(R, k, device="cuda", generator=gen).to(torch.bfloat16)
        c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
        res = {}
        for t in TILES:
            if t == "woq128x320c2" and -(-n // 128) % 2:  # its 2x1 clusters take the weight tiles in pairs
                continue
            res[t] = round(tms(lambda: K.grouped_gemm_woq_sm90(a, b, WoqKind.INT4.value, s_mn, z_mn, off, group, c=c,
                                                               tactic=f"wgmma:{t}:plain:plain"), iters=10), 1)
        best = min(res, key=res.get)
        print(name, avg, tokens, "max rows", int(counts.max()), res, "best", best, flush=True)
        rows.append(dict(gemm=name, avg_rows=avg, tokens=tokens, max_rows=int(counts.max()),
                         min_rows=int(counts.min()), counts=counts.tolist(), times=res))
out_name = os.environ.get("PROBE_JSON", "woq_tile_rows_probe.json")
json.dump(dict(tiles=TILES, rows=rows), open(os.path.join(os.environ.get("OUT", "."), out_name), "w"), indent=1)
print("\ntime / the point's best tile")
print(f"{'gemm':<11} {'avg':>5} " + " ".join(f"{t[6:]:>8}" for t in TILES))
for r in rows:
    best = min(r["times"].values())
    print(f"{r['gemm']:<11} {r['avg_rows']:>5} " +
          " ".join(f"{r['times'][t] / best:>8.2f}" if t in r["times"] else f"{'-':>8}" for t in TILES) +
          f"   best {best:.1f} us")
