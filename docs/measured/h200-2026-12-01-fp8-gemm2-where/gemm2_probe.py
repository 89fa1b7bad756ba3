"""FP8 GEMM2 at 1024/4096 tokens: each rowwise tile with the store epilogue and the finalize epilogue (fast
accumulation), L2 flushed, median of 20. Where the finalize GEMM2's time goes: atomics vs mainloop."""
import json, os, sys, torch
sys.path.insert(0, "bench")
from gemm_probe_timing import FP8_GEMMS, tms
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling, Fp8Accumulation
from moe_build.kernels.ops import fp8_scale_shapes

names = os.environ.get("G2_GEMMS", "qwen3_g2,dsv2_g2,gptoss_g2").split(",")
tiles = os.environ.get("G2_TILES", "pingpong128x128,pingpong128x128c2,coop128x192,coop128x256,coop128x128").split(",")
out = []
for name in names:
    E, topk, n, k = FP8_GEMMS[name]
    b = torch.randn(E, n, k, device="cuda").to(torch.float8_e4m3fn)
    for tokens in [int(t) for t in os.environ.get("G2_TOKENS", "1024,4096").split(",")]:
        R = tokens * topk
        g = torch.Generator(device="cuda").manual_seed(0)
        ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:topk] for _ in range(tokens)]).view(-1)
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=E)
        off = torch.zeros(E + 1, dtype=torch.int64, device="cuda"); off[1:] = counts.cumsum(0)
        p2u = (order // 1).to(torch.int32)  # permuted row p -> unpermuted index (token * topk + j)
        w = torch.rand(R, device="cuda")
        a = torch.randn(R, k, device="cuda").to(torch.float8_e4m3fn)
        sa_s, sb_s = fp8_scale_shapes(Fp8Scaling.ROWWISE, R, E, n, k)
        sa, sb = torch.rand(sa_s, device="cuda"), torch.rand(sb_s, device="cuda")
        c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
        o = torch.zeros(tokens, n, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
        for t in tiles:
            tac = f"wgmma:{t}:plain:plain"
            row = dict(gemm=name, tokens=tokens, tile=t)
            try:
                row["store"] = round(tms(lambda: K.grouped_gemm_fp8(a, sa, b, sb, off, "rowwise", c=c, workspace=ws,
                                         accumulation=Fp8Accumulation.FAST, tactic=tac)), 1)
            except K.KernelError as e:
                row["store"] = None; print("refused store", name, t, e)
            try:
                row["finalize"] = round(tms(lambda: K.grouped_gemm_fp8_finalize(a, sa, b, sb, off, p2u, w, tokens, topk,
                                            "rowwise", out=o, workspace=ws, accumulation=Fp8Accumulation.FAST,
                                            tactic=tac)), 1)
            except K.KernelError as e:
                row["finalize"] = None; print("refused finalize", name, t, e)
            fl = 2 * R * n * k
            row["pf_store"] = round(fl / (row["store"] or 1e9) / 1e9, 2)
            row["pf_finalize"] = round(fl / (row["finalize"] or 1e9) / 1e9, 2)
            print(row, flush=True)
            out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "gemm2_probe.json"), "w"), indent=1)
