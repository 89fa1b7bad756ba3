"""Rowwise FP8 tiles with fast accumulation, one-CTA against 2x1 clusters (weight tile multicast): GEMM time (L2
flushed, median of 20), plain store, every tile in two rounds (the second in reverse order); one JSON line per point,
to stdout. Evidence for fp8_wgmma_tile_rule's choices (docs/experiments.md, "FP8 tiles with fewer L2 bytes per
FLOP"): by default past 128 rows per expert, at 2048 and 4096 tokens of every bench GEMM but DeepSeek-V3's;
FP8_PROBE_ROWS (average rows per expert, comma-separated) times each GEMM at the token counts giving those rows
instead, FP8_PROBE_GEMMS and FP8_PROBE_TILES pick GEMMs (gemm_probe_timing.FP8_GEMMS's names) and tiles.

    MOE_BUILD_KERNELS_LIB=.../libmoe_build_kernels.so python bench/fp8_cluster_probe.py [TOKENS,...]
"""
import json
import os
import sys

import torch
from gemm_probe_timing import FP8_GEMMS, rowwise_fp8_problem, tms

from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling

PICKED = os.environ.get("FP8_PROBE_GEMMS")
GEMMS = ({name: FP8_GEMMS[name] for name in PICKED.split(",")} if PICKED else
         {name: shape for name, shape in FP8_GEMMS.items() if not name.startswith("dsv3")})
TILES = os.environ.get("FP8_PROBE_TILES", "coop128x128,coop128x192,coop128x128c2,coop128x192c2,coop128x256,"
                       "pingpong64x128,pingpong64x128c2").split(",")
ROWS = [int(x) for x in os.environ["FP8_PROBE_ROWS"].split(",")] if os.environ.get("FP8_PROBE_ROWS") else None
TOKENS = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2048, 4096]
g = torch.Generator(device="cuda").manual_seed(0)


def probe(name, E, topk, n, k):
    b = (torch.randn(E, n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    for tokens in ([r * E // topk for r in ROWS] if ROWS else TOKENS):
        R = tokens * topk
        off, a, sa, sb, c, ws = rowwise_fp8_problem(b, topk, tokens, g)
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
                print(json.dumps(dict(gemm=name, tokens=tokens, rows=R // E, tile=tile, round=rnd,
                                      us=round(tms(call), 1),
                                      diff_vs_first=float(f"{err:.3g}"))), flush=True)


for name, shape in GEMMS.items():
    probe(name, *shape)
    torch.cuda.empty_cache()
