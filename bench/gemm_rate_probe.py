"""Prefill grouped-GEMM rates, every variant timed side by side (interleaved rounds, order shuffled
each round, L2 flushed before every call, CUDA events, medians): under the GPU's power limit,
GEMMs timed one after another drift by up to ~7%, which hides any tile choice worth less.

Per shape and GEMM (GEMM1: x @ W1^T, N = 2I; GEMM2: h @ W2^T, N = H), on the same rows
(--gated: GEMM1 with the swiglu epilogue the layer runs, writing [rows, I]; --finalize: GEMM2 with the
finalize epilogue, added into [tokens, H]; mm / tmm stay plain):
  <tile>   : our sm90 grouped GEMM on random top-k routing, with MB_SM90_WGMMA_TILE=<tile>
             ("auto" = the library's own rule)
  uniform  : the auto rule with every expert given exactly rows/E rows (routing skew removed)
  mm       : torch.mm of all the rows against one expert's weights (cuBLAS; the floor's matmul)
  tmm      : torch._grouped_mm on the routed segments
Prints us and TFLOP/s per variant, writes --json (default $OUT/gemm_rate_probe.json).
Usage: PYTHONPATH=. python bench/gemm_rate_probe.py [--tokens 4096] [--tiles auto,pingpong64x256c2]
       [--shapes qwen3-30b-a3b,gpt-oss-20b] [--iters 24] [--gated] [--finalize] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from bench.gemm_bench import SHAPES, gemm_lib, gemm_problems, run_sm90_tile
from moe_build.bench import _interleaved_median_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--tiles", default="auto")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--iters", type=int, default=24, help="timed rounds, each calling every variant once")
    ap.add_argument("--gated", action="store_true", help="GEMM1 through the gated (swiglu) epilogue")
    ap.add_argument("--finalize", action="store_true", help="GEMM2 through the finalize epilogue")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gemm_rate_probe.json"))
    args = ap.parse_args()
    g = gemm_lib.Gemms(gemm_lib.load())
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    results = []
    for name, gemm, n, k, rows, w, a, routed, p2u in gemm_problems(args.shapes, args.tokens, gen):
        e = w.shape[0]
        gated = args.gated and gemm == "g1"
        c = torch.empty(rows, n, device="cuda", dtype=dt)
        out = torch.empty(rows, n // 2, device="cuda", dtype=dt) if gated else c
        finalize = None
        if args.finalize and gemm == "g2":
            out = torch.zeros(args.tokens, n, device="cuda", dtype=dt)
            pw = torch.rand(rows, generator=gen, device="cuda")
            finalize = (p2u, pw, args.tokens, SHAPES[name][3])
        routed32 = routed[1:].to(torch.int32)
        uniform = torch.tensor([(rows * i) // e for i in range(e + 1)], dtype=torch.int64, device="cuda")

        def ours(offsets, tile):
            return lambda: run_sm90_tile(g, tile, a, w, out, offsets, rows, n, k, gated, finalize)

        fns = {tile: ours(routed, tile) for tile in args.tiles.split(",")}
        fns["uniform"] = ours(uniform, "auto")
        fns["mm"] = lambda: torch.mm(a, w[0].t(), out=c)
        fns["tmm"] = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=routed32)
        ms = _interleaved_median_ms({key: (lambda i, fn=fn: fn()) for key, fn in fns.items()},
                                    args.iters, warmup=1, before=flush.zero_)
        us = {key: 1e3 * v for key, v in ms.items()}
        flops = 2.0 * rows * n * k
        row = {"shape": name, "gemm": gemm, "n": n, "k": k, "rows": rows, "tokens": args.tokens,
               "us": us, "tflops": {key: flops / v / 1e6 for key, v in us.items()}}
        results.append(row)
        print(f"{name:17s} {gemm} " + " ".join(f"{key} {v:7.1f}us/{row['tflops'][key]:3.0f}TF"
                                               for key, v in us.items()), flush=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
