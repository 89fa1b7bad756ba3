"""Rowwise FP8 tiles with fast accumulation, one-CTA against 2x1 clusters (weight tile multicast), past 128 rows
per expert: GEMM time (L2 flushed, median of 20), plain store, every tile in two rounds (the second in reverse
order); one JSON line per point, to stdout. Evidence for fp8_wgmma_tile_rule's choice past 128 rows
(docs/experiments.md, "FP8 tiles with fewer L2 bytes per FLOP").

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/fp8_cluster_probe.py [TOKENS,...]
"""
import json
import sys

import torch
from gemm_probe_timing import tms

from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling
from moe_build.kernels.ops import fp8_scale_shapes

GEMMS = {"qwen3_g1": (128, 8, 1536, 2048), "qwen3_g2": (128, 8, 2048, 768), "mixtral_g1": (8, 2, 28672, 4096),
         "mixtral_g2": (8, 2, 4096, 14336), "dsv2_g1": (64, 6, 2816, 2048), "dsv2_g2": (64, 6, 2048, 1408),
         "gptoss_g1": (32, 4, 5760, 2880), "gptoss_g2": (32, 4, 2880, 2880)}
TILES = ["coop128x128", "coop128x192", "coop128x128c2", "coop128x192c2", "coop128x256", "pingpong64x128"]
TOKENS = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2048, 4096]
g = torch.Generator(device="cuda").manual_seed(0)


def probe(name, E, topk, n, k):
    b = (torch.randn(E, n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    for tokens in TOKENS:
        R = tokens * topk
        ids = torch.randint(0, E, (R,), device="cuda", generator=g)
        off = torch.zeros(E + 1, dtype=torch.int64, device="cuda")
        off[1:] = torch.bincount(ids, minlength=E).cumsum(0)
        a = (torch.randn(R, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
        sa_shape, sb_shape = fp8_scale_shapes(Fp8Scaling.ROWWISE, R, E, n, k)
        sa = torch.rand(sa_shape, device="cuda", generator=g) + 0.5
        sb = torch.rand(sb_shape, device="cuda", generator=g) + 0.5
        c = torch.empty(R, n, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(K.grouped_gemm_fp8_workspace_bytes(E, R, n, k) + 1, dtype=torch.uint8, device="cuda")
        ref = None
        for rnd in range(2):
            for tile in (TILES if rnd == 0 else TILES[::-1]):
                def call():
                    K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.ROWWISE, c=c, workspace=ws,
                                       accumulation=Fp8Accumulation.FAST, tactic=f"wgmma:{tile}:plain:plain")
                c.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                if ref is None:
                    ref = c.float().clone()
                err = float((c.float() - ref).norm() / ref.norm())
                print(json.dumps(dict(gemm=name, tokens=tokens, rows=R // E, tile=tile, round=rnd, us=round(tms(call), 1),
                                      diff_vs_first=float(f"{err:.3g}"))), flush=True)


for name, shape in GEMMS.items():
    probe(name, *shape)
    torch.cuda.empty_cache()
