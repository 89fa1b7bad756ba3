"""Our FP8 grouped GEMM (rowwise scales, fast accumulation, plain store) on each wgmma tile against cuBLAS's dense
e4m3 GEMM (torch._scaled_mm, fast accumulation) and bf16 GEMM on the same rows, hot (1 s of calls, then the median of
30 by CUDA events). Ours runs both as one group (E=1: the kernel's rate alone) and as the layer's experts with equal
rows (the grouping's cost). JSON to argv[1]."""
import json, sys, time
import torch
from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Scaling
from moe_build.kernels.ops import fp8_scale_shapes

SHAPES = {"mixtral_g1": (8, 8192, 28672, 4096), "mixtral_g2": (8, 8192, 4096, 14336),
          "gptoss_g1": (32, 16384, 5760, 2880), "gptoss_g2": (32, 16384, 2880, 2880),
          "dsv2_g1": (64, 24576, 2816, 2048), "dsv2_g2": (64, 24576, 2048, 1408)}
TILES = ["pingpong128x128", "pingpong128x128c2", "coop128x256", "coop128x192", "coop128x128"]


def hot_us(fn):
    t_end = time.time() + 0.5
    while time.time() < t_end:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    ts = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[15]


out = []
for name, (E, m, n, k) in SHAPES.items():
    x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = (torch.randn(E, n, k, device="cuda") / 4).to(torch.float8_e4m3fn)
    c = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    sa1 = torch.ones(m, 1, device="cuda"); sb1 = torch.ones(1, n, device="cuda")
    rec = {"gemm": name, "E": E, "m": m, "n": n, "k": k, "us": {}}
    rec["us"]["cublas_e4m3"] = hot_us(lambda: torch._scaled_mm(x, w[0].t(), scale_a=sa1, scale_b=sb1,
                                                                out_dtype=torch.bfloat16, use_fast_accum=True))
    xb, wb = x.to(torch.bfloat16), w[0].to(torch.bfloat16)
    rec["us"]["cublas_bf16"] = hot_us(lambda: torch.mm(xb, wb.t()))
    del xb, wb
    for groups in (1, E):
        off = torch.tensor([m * g // groups for g in range(groups + 1)], dtype=torch.int64, device="cuda")
        wg = w[:groups]
        sa_s, sb_s = fp8_scale_shapes(Fp8Scaling.ROWWISE, m, groups, n, k)
        sa, sb = torch.ones(sa_s, device="cuda"), torch.ones(sb_s, device="cuda")
        ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(groups, m, n, k) + 1, dtype=torch.uint8, device="cuda")
        for t in TILES:
            try:
                rec["us"][f"E{groups}:{t}"] = hot_us(lambda: K.grouped_gemm_fp8(
                    x, sa, wg, sb, off, Fp8Scaling.ROWWISE, c=c, workspace=ws, accumulation="fast",
                    tactic=f"wgmma:{t}:plain:plain"))
            except Exception as e:
                print(name, groups, t, "refused:", str(e)[:120], flush=True)
    fl = 2.0 * m * n * k
    print(f"{name:11s} " + "  ".join(f"{v}={u:.1f}({fl / u / 1e6:.0f})" for v, u in rec["us"].items()), flush=True)
    out.append(rec)
    del x, w, c
    torch.cuda.empty_cache()
json.dump({"device": torch.cuda.get_device_name(), "points": out}, open(sys.argv[1], "w"), indent=1)
