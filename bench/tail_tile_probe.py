"""What an expert's last, partly filled row tile costs: one grouped GEMM at equal rows per expert, swept
across a tile boundary (e.g. 256, 257, 272, 288, 320 rows with 64-row tiles).

Why: routed experts rarely hold a multiple of a tile's rows (Qwen3-30B-A3B at 4096 tokens: 256 +- 16 per
expert), so each expert's last tile is mostly padding. If a tile with one valid row costs about what a full
one does, the padding's cost is the tail tiles' share of all tiles and only a finer row granularity
recovers it; if it costs in proportion to its rows, the padding is nearly free. Every expert gets the same
rows, so the tile count steps exactly at the boundary. Interleaved rounds, L2 flushed before every call,
medians (moe_build.bench._interleaved_median_ms), one process.
Usage: PYTHONPATH=. python bench/tail_tile_probe.py [--shape qwen3-30b-a3b] [--rows 256,257,272,288,320]
       [--tiles pingpong64x256,coop128x256] [--gemm g1|g2] [--iters 16] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from bench.gemm_bench import SHAPES, gemm_lib, run_sm90_tile
from moe_build.bench import _interleaved_median_ms

TILE_ROWS = {"pingpong64x256": 64, "pingpong64x128": 64, "pingpong64x256c2": 64, "coop128x256": 128}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="256,257,272,288,320", help="rows per expert, every expert alike")
    ap.add_argument("--tiles", default="pingpong64x256,coop128x256")
    ap.add_argument("--gemm", default="g1", choices=("g1", "g2"), help="g1: gated GEMM1; g2: plain-store GEMM2")
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "tail_tile_probe.json"))
    args = ap.parse_args()
    tiles = args.tiles.split(",")
    unknown = [t for t in tiles if t not in TILE_ROWS]
    if unknown:
        raise SystemExit(f"--tiles: unknown {unknown}; allowed: {', '.join(TILE_ROWS)}")
    g = gemm_lib.Gemms(gemm_lib.load())
    dt = torch.bfloat16
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    h, inter, e, _ = SHAPES[args.shape]
    n, k, gated = (2 * inter, h, True) if args.gemm == "g1" else (h, inter, False)
    w = torch.randn(e, n, k, device="cuda", dtype=dt) * k ** -0.5
    results = []
    for per in (int(r) for r in args.rows.split(",")):
        rows = e * per
        a = torch.randn(rows, k, device="cuda", dtype=dt)
        out = torch.empty(rows, n // 2 if gated else n, device="cuda", dtype=dt)
        offsets = torch.arange(e + 1, device="cuda", dtype=torch.int64) * per
        fns = {t: (lambda i, t=t: run_sm90_tile(g, t, a, w, out, offsets, rows, n, k, gated)) for t in tiles}
        ms = _interleaved_median_ms(fns, args.iters, warmup=1, before=flush.zero_)
        for t in tiles:
            tile_count = -(-per // TILE_ROWS[t]) * e
            results.append({"rows_per_expert": per, "tile": t, "us": 1e3 * ms[t], "row_tiles": tile_count,
                            "us_per_row_tile": 1e3 * ms[t] / tile_count})
            print(f"{args.shape} {args.gemm} {per:4d} rows/expert {t:16s} {1e3 * ms[t]:8.1f} us "
                  f"({tile_count} row tiles, {1e3 * ms[t] / tile_count:.3f} us each)")
    with open(args.json, "w") as f:
        json.dump({"shape": args.shape, "gemm": args.gemm, "n": n, "k": k, "experts": e, "results": results}, f,
                  indent=1)


if __name__ == "__main__":
    main()
