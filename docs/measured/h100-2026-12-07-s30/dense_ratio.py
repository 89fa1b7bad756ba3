"""cuBLAS's dense e4m3 GEMM (torch._scaled_mm, rowwise scales, fast accumulation) against its bf16 GEMM (torch.mm) on
the bench layers' GEMM shapes at 4096 tokens taken as one dense product (all routed rows against one expert's
weights: an upper bound on a grouped GEMM's rate), each timed hot: 1 s of back-to-back calls, then 30 timed calls
by CUDA events (median). Prints TFLOP/s of each and the e4m3 / bf16 speed ratio; JSON to argv[1]."""
import json
import sys
import time

import torch

SHAPES = {  # (rows = 4096 x top-k, n, k) of GEMM1 (gate and up stacked) and GEMM2
    "mixtral-8x7b": [(8192, 28672, 4096), (8192, 4096, 14336)],
    "qwen3-30b-a3b": [(32768, 1536, 2048), (32768, 2048, 768)],
    "deepseek-v2-lite": [(24576, 2816, 2048), (24576, 2048, 1408)],
    "gpt-oss-20b": [(16384, 5760, 2880), (16384, 2880, 2880)],
}


def hot_us(fn) -> float:
    t_end = time.time() + 1.0
    while time.time() < t_end:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


out = []
for name, gemms in SHAPES.items():
    for m, n, k in gemms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sa = torch.ones(m, 1, device="cuda"); sb = torch.ones(1, n, device="cuda")
        bf = hot_us(lambda: torch.mm(x, w.t()))
        f8 = hot_us(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                             use_fast_accum=True))
        fl = 2.0 * m * n * k
        rec = {"shape": name, "m": m, "n": n, "k": k, "bf16_us": bf, "e4m3_us": f8,
               "bf16_tflops": fl / bf / 1e6, "e4m3_tflops": fl / f8 / 1e6, "e4m3_over_bf16_speed": bf / f8}
        out.append(rec)
        print(f"{name:18s} {m:6d} x {n:6d} x {k:6d}  bf16 {bf:8.1f} us {rec['bf16_tflops']:6.0f} TF/s  "
              f"e4m3 {f8:8.1f} us {rec['e4m3_tflops']:6.0f} TF/s  speed {rec['e4m3_over_bf16_speed']:.2f}x", flush=True)
        del x, w, x8, w8
json.dump({"device": torch.cuda.get_device_name(), "points": out}, open(sys.argv[1], "w"), indent=1)
