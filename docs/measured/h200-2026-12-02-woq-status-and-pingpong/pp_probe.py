"""s32 probe: the mixed-input GEMM on CUTLASS's ptr-array pingpong schedule (64 weight rows a warpgroup, each
warpgroup its own tile; the probe library maps woq128x160 -> pingpong 64x256, woq128x192 -> 64x128, woq128x224 ->
64x192) beside the cooperative 128-row tiles, on the bench shapes' W4A16 GEMMs with uniformly routed counts at the
averages of 2048 and 4096 tokens, and with equal counts. Each pingpong output is compared with the cooperative 256's."""
import json, os, sys, torch
sys.path.insert(0, "bench")
from gemm_probe_timing import tms, woq_mixed_weights
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind

GEMMS = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "dsv2_g1": (64, 6, 2816, 2048),
         "dsv2_g2": (64, 6, 2048, 1408), "gptoss_g1": (32, 4, 5760, 2880), "gptoss_g2": (32, 4, 2880, 2880),
         "mixtral_g1": (8, 2, 28672, 4096), "mixtral_g2": (8, 2, 4096, 14336)}
TILES = {"coop128x128": "woq128x128", "coop128x256": "woq128x256",
         "pp64x256": "woq128x160", "pp64x128": "woq128x192", "pp64x192": "woq128x224"}
rows_out = []
gen = torch.Generator(device="cuda").manual_seed(0)
print(f"{'gemm':<11} {'tok':>5} {'form':<6} " + " ".join(f"{t:>11}" for t in TILES if TILES[t]) + "  maxrel(pp vs coop256)")
for name, (E, topk, n, k) in GEMMS.items():
    group = 128 if k % 128 == 0 else 64
    b, _z, _s, s_mn, z_mn = woq_mixed_weights(WoqKind.INT4, group, E, n, k)
    for tokens in (2048, 4096):
        R = tokens * topk
        for form in ("routed", "equal"):
            if form == "routed":
                ids = torch.randint(0, E, (R,), device="cuda", generator=gen)
                counts = torch.bincount(ids, minlength=E)
            else:
                counts = torch.full((E,), R // E, device="cuda", dtype=torch.int64)
            off = torch.zeros(E + 1, dtype=torch.int64, device="cuda"); off[1:] = counts.cumsum(0)
            rows = int(off[-1])
            a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
            outs, res = {}, {}
            for label, t in TILES.items():
                if t is None:
                    continue
                c = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                fn = lambda c=c, t=t: K.grouped_gemm_woq_sm90(a, b, WoqKind.INT4.value, s_mn, z_mn, off, group, c=c,
                                                              tactic=f"wgmma:{t}:plain:plain")
                fn(); torch.cuda.synchronize(); outs[label] = c.float()
                res[label] = round(tms(fn, iters=10), 1)
            ref = outs["coop128x256"]
            scale = ref.abs().max().item()
            err = {l: round((o - ref).abs().max().item() / scale, 5) if torch.isfinite(o).all() else "nan"
                   for l, o in outs.items() if l.startswith("pp")}
            print(f"{name:<11} {tokens:>5} {form:<6} " + " ".join(f"{res[l]:>11.1f}" for l in res) + f"  {err}", flush=True)
            rows_out.append(dict(gemm=name, tokens=tokens, form=form, times=res, err=err, counts=counts.tolist()))
json.dump(rows_out, open(os.path.join(os.environ.get("OUT", "."), "pp_probe.json"), "w"), indent=1)
