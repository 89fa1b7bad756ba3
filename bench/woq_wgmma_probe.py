"""Where the weight-only GEMM's wgmma tactics take over from the mma tiles: every tactic that runs from 8 average rows
per expert up (the mma tiles, the mixed-input wgmma tiles of gemm/woq_sm90.cu, the dequantize-then-16-bit-wgmma
path), int4 group 128 with zero points and int8 per channel, on the bench shapes' GEMMs at 8 to 1024 average rows per
expert, beside the bf16 grouped GEMM on the same shapes. L2 flushed before each call, median of 10. The evidence for
WOQ_MIXED_MIN_AVG_ROWS and the woq tile rule in moe_build/planner/tactics/woq.py. Writes woq_wgmma_probe.json to $OUT
(or the working directory) and prints a table of each tactic's time over the best.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/woq_wgmma_probe.py
"""
import json, os, torch
from gemm_probe_timing import tms, woq_mixed_weights
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind

# name: (experts, top_k, n, k) of the layer GEMMs of the bench shapes (GEMM1: gate and up rows)
GEMMS = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "mixtral_g1": (8, 2, 28672, 4096),
         "mixtral_g2": (8, 2, 4096, 14336), "dsv2_g1": (64, 6, 2816, 2048), "gptoss_g1": (32, 4, 5760, 2880)}
AVG_ROWS = (8, 16, 32, 48, 64, 128, 256, 512, 768, 1024)
rows = []
for name, (E, topk, n, k) in GEMMS.items():
    for kind, group in ((WoqKind.INT4, 128), (WoqKind.INT8, 0)):
        if k % 64 or n % 128:
            continue
        g = group if group else k
        if k % g:
            continue
        b, zeros, scales, s_mn, z_mn = woq_mixed_weights(kind, group, E, n, k)
        dense = torch.empty(E, n, k, dtype=torch.bfloat16, device="cuda")
        for avg in AVG_ROWS:
            tokens = max(1, avg * E // topk)
            R = tokens * topk
            if R * max(n, k) * 2 > (8 << 30):
                continue
            ids = torch.randint(0, E, (R,), device="cuda")
            off = torch.zeros(E + 1, dtype=torch.int64, device="cuda")
            off[1:] = torch.bincount(ids, minlength=E).cumsum(0)
            a = torch.randn(R, k, device="cuda").to(torch.bfloat16)
            c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
            res = {}
            decode = ("decode:ksplit1:after_trigger:plain",) if avg <= 16 else ()
            for t in (*decode, "mma:64x128:plain:plain", "mma:128x128:plain:plain"):
                res[t] = tms(lambda: K.grouped_gemm_woq(a, b, kind.value, scales, off, group, zeros=zeros, c=c,
                                                        tactic=t), iters=10)
            for t in (f"wgmma:woq128x{n}:plain:plain" for n in (16, 32, 64, 128, 256)):
                res[t] = tms(lambda: K.grouped_gemm_woq_sm90(a, b, kind.value, s_mn, z_mn, off, group, c=c, tactic=t),
                             iters=10)

            def dequantized() -> None:
                K.woq_dequantize(b, kind.value, scales, group, zeros=zeros, out=dense)
                K.grouped_gemm_sm90(a, dense, off, c=c, tactic="wgmma:coop128x256:plain:plain")
            res["dequantize+coop128x256"] = tms(dequantized, iters=10)
            res["bf16:coop128x256"] = tms(lambda: K.grouped_gemm_sm90(a, dense, off, c=c,
                                                                      tactic="wgmma:coop128x256:plain:plain"), iters=10)
            res = {t: round(v, 1) for t, v in res.items()}
            best = min((t for t in res if not t.startswith("bf16")), key=res.get)
            print(name, kind.value, avg, tokens, res, "best", best, flush=True)
            rows.append(dict(gemm=name, kind=kind.value, avg_rows=avg, tokens=tokens, times=res))
json.dump(dict(rows=rows), open(os.path.join(os.environ.get("OUT", "."), "woq_wgmma_probe.json"), "w"), indent=1)
tacs = ["decode:ksplit1:after_trigger:plain", *(t for t in rows[0]["times"] if not t.startswith("decode:"))]
print("\ntime / best weight-only tactic (bf16: the 16-bit GEMM on the same shape)")
print(f"{'gemm':<11} {'kind':<5} {'avg':>5} " + " ".join(f"{t.split(':')[1] if ':' in t else t:>14}" for t in tacs))
for r in rows:
    best = min(v for t, v in r["times"].items() if not t.startswith("bf16"))
    print(f"{r['gemm']:<11} {r['kind']:<5} {r['avg_rows']:>5} " +
          " ".join(f"{r['times'][t] / best:>14.2f}" if t in r["times"] else f"{'-':>14}" for t in tacs) +
          f"   best {best:.1f} us")
