"""Probe (not product): the rowwise FP8 wgmma tiles with fast accumulation against the pingpong 128x128 tile, plain store, L2 flushed, median of 20; every GEMM's output
checked against fp64 on the exact e4m3 inputs (relative norm over up to 64 rows of 4 experts). One JSON line a point."""
import json
import os
import sys

import torch
from gemm_probe_timing import FP8_GEMMS, rowwise_fp8_problem, tms

from moe_build import kernels as K
from moe_build.kernels.abi import Fp8Accumulation, Fp8Scaling

TILES = [t for t in os.environ.get("PP_TILES", "coop128x192,pingpong64x128,pingpong64x128c2,pingpong128x128").split(",")]
TOKENS = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1024, 4096]
g = torch.Generator(device="cuda").manual_seed(0)


def probe(name: str, E: int, topk: int, n: int, k: int) -> None:
    b = (torch.randn(E, n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
    for tokens in TOKENS:
        R = tokens * topk
        off, a, sa, sb, c, ws = rowwise_fp8_problem(b, topk, tokens, g)
        offs = off.cpu().tolist()
        have = [e for e in range(E) if offs[e + 1] > offs[e]]
        picks = [have[i * (len(have) - 1) // 3] for i in range(4)]
        spans = [(offs[e], min(offs[e + 1], offs[e] + 64)) for e in picks]
        refs = [(a[lo:hi].double() @ b[e].double().t()) * sa[lo:hi].double()[:, None] * sb[e].double()[None, :]
                for e, (lo, hi) in zip(picks, spans)]
        for tile in TILES:
            def call() -> None:
                K.grouped_gemm_fp8(a, sa, b, sb, off, Fp8Scaling.ROWWISE, c=c, workspace=ws,
                                   accumulation=Fp8Accumulation.FAST, tactic=f"wgmma:{tile}:plain:plain")
            c.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            num = sum(float((c[lo:hi].double() - ref).norm() ** 2) for (lo, hi), ref in zip(spans, refs))
            den = sum(float(ref.norm() ** 2) for ref in refs)
            us = tms(call)
            print(json.dumps(dict(gemm=name, tokens=tokens, tile=tile, us=round(us, 1),
                                  pflops=round(2 * R * n * k / us / 1e9, 3),
                                  rel_err=float(f"{(num / den) ** .5:.3g}"))), flush=True)


for name, shape in FP8_GEMMS.items():
    probe(name, *shape)
    torch.cuda.empty_cache()
