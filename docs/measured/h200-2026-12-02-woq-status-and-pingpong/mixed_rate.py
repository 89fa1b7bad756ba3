"""s32 diagnosis: the mixed-input wgmma GEMM's rate on whole tiles (equal counts, no tail waste) beside the bf16
grouped GEMM on the same shape. argv[1]: 'time' (print a table of every variant) or one variant name for ncu."""
import sys, torch
sys.path.insert(0, "bench")
from gemm_probe_timing import tms, woq_mixed_weights
from moe_build import kernels as K
from moe_build.weights.woq import WoqKind

SHAPES = {"dsv2_g1": (64, 2816, 2048), "dsv2_g2": (64, 2048, 1408), "qwen3_g1": (128, 1536, 2048),
          "mixtral_g1": (8, 28672, 4096)}
BF16_TILES = ("pingpong64x256c2", "coop128x256")


def problem(name, rows):
    E, n, k = SHAPES[name]
    off = torch.arange(E + 1, dtype=torch.int64, device="cuda") * rows
    a = torch.randn(E * rows, k, device="cuda").to(torch.bfloat16)
    c = torch.empty(E * rows, n, dtype=torch.bfloat16, device="cuda")
    return E, n, k, off, a, c


def variants(name, rows):
    E, n, k, off, a, c = problem(name, rows)
    g = 128 if k % 128 == 0 else 64
    b4, _, _, s4, z4 = woq_mixed_weights(WoqKind.INT4, g, E, n, k)
    b8, _, _, s8, _ = woq_mixed_weights(WoqKind.INT8, 0, E, n, k)
    w16 = (torch.randn(E, n, k, device="cuda") * 0.02).to(torch.bfloat16)
    out = {}
    for tile in ("woq128x256", "woq128x128"):
        out[f"int4_{tile}"] = lambda tile=tile: K.grouped_gemm_woq_sm90(a, b4, WoqKind.INT4.value, s4, z4, off, g, c=c,
                                                                        tactic=f"wgmma:{tile}:plain:plain")
        out[f"int8_{tile}"] = lambda tile=tile: K.grouped_gemm_woq_sm90(a, b8, WoqKind.INT8.value, s8, None, off, 0, c=c,
                                                                        tactic=f"wgmma:{tile}:plain:plain")
    for tile in BF16_TILES:
        out[f"bf16_{tile}"] = lambda tile=tile: K.grouped_gemm_sm90(a, w16, off, c=c, tactic=f"wgmma:{tile}:plain:plain")
    return E, n, k, out


if sys.argv[1] == "time":
    print(f"{'gemm':<11} {'rows':>5} {'variant':<24} {'us':>8} {'TFLOP/s':>8}")
    for name in SHAPES:
        for rows in (256, 512):
            E, n, k, vs = variants(name, rows)
            for v, fn in vs.items():
                try:
                    t = tms(fn, iters=10)
                except Exception as exc:  # a tile the library refuses
                    print(name, rows, v, "refused:", str(exc)[:80]); continue
                print(f"{name:<11} {rows:>5} {v:<24} {t:>8.1f} {2 * E * rows * n * k / t / 1e6:>8.0f}", flush=True)
else:
    E, n, k, vs = variants("dsv2_g1", 256)
    fn = vs[sys.argv[1]]
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
