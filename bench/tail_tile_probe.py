"""What an expert's last, partly filled row tile costs: one grouped GEMM at equal rows per expert, swept
across a tile boundary (e.g. 256, 257, 272, 288, 320 rows with 64-row tiles).

Why: routed experts rarely hold a multiple of a tile's rows (Qwen3-30B-A3B at 4096 tokens: 256 +- 16 per
expert), so each expert's last tile is mostly padding. If a tile with one valid row costs about what a full
one does, the padding's cost is the tail tiles' share of all tiles and only a finer row granularity
recovers it; if it costs in proportion to its rows, the padding is nearly free. Every expert gets the same
rows, so the tile count steps exactly at the boundary. Interleaved rounds, L2 flushed before every call,
medians (moe_build.bench._interleaved_median_ms), one process.
With --routed TOKENS it bounds what computing the short tails elsewhere could gain instead: the rule's tile
on randomly routed rows (gemm_lib.route) against the same GEMM with every expert's last row tile left out
wherever it holds at most 16, 32 or 63 rows (not a correct product: the cost of the tiles that remain).
Usage: PYTHONPATH=. python bench/tail_tile_probe.py [--shape qwen3-30b-a3b] [--rows 256,257,272,288,320]
       [--tiles pingpong64x256,coop128x256] [--gemm g1|g2] [--routed TOKENS] [--iters 16] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import re

import torch

from bench.gemm_bench import SHAPES, WGMMA_TILES, gemm_lib, run_sm90_tile
from moe_build.bench import _interleaved_median_ms

# Each wgmma tile's rows, from its name (coop128x256 -> 128).
TILE_ROWS = {t: int(re.search(r"(\d+)x", t).group(1)) for t in WGMMA_TILES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="256,257,272,288,320", help="rows per expert, every expert alike")
    ap.add_argument("--tiles", default="pingpong64x256,coop128x256")
    ap.add_argument("--gemm", default="g1", choices=("g1", "g2"), help="g1: gated GEMM1; g2: plain-store GEMM2")
    ap.add_argument("--routed", type=int, default=0, help="tokens: routed rows with short tails left out")
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
    if args.routed:
        return routed(args, g, w, e, n, k, gated, flush)
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


def without_short_tails(offsets: torch.Tensor, tail_max: int) -> torch.Tensor:
    """Offsets with each expert's rows cut to a multiple of 64 where the cut is at most `tail_max` rows
    and at least one full 64-row tile remains."""
    counts = offsets.diff()
    tails = counts % 64
    cut = torch.where((tails <= tail_max) & (counts >= 64), counts - tails, counts)
    return torch.cat([offsets[:1], offsets[:1] + cut.cumsum(0)])


def routed(args: argparse.Namespace, g, w: torch.Tensor, e: int, n: int, k: int, gated: bool,
           flush: torch.Tensor) -> None:
    _, _, _, top_k = SHAPES[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    _, offsets, _, _ = gemm_lib.route(args.routed, e, top_k, gen)
    rows = args.routed * top_k
    a = torch.randn(rows, k, device="cuda", dtype=w.dtype)
    out = torch.empty(rows, n // 2 if gated else n, device="cuda", dtype=w.dtype)
    variants = {"routed": offsets, **{f"tails<={t} left out": without_short_tails(offsets, t) for t in (16, 32, 63)}}
    fns = {v: (lambda i, o=o: run_sm90_tile(g, "auto", a, w, out, o, rows, n, k, gated)) for v, o in variants.items()}
    ms = _interleaved_median_ms(fns, args.iters, warmup=1, before=flush.zero_)
    results = []
    for v, o in variants.items():
        row_tiles = int(((o.diff() + 63) // 64).sum())
        results.append({"variant": v, "us": 1e3 * ms[v], "rows": int(o[-1] - o[0]), "row_tiles": row_tiles})
        print(f"{args.shape} {args.gemm} T={args.routed} {v:22s} {1e3 * ms[v]:8.1f} us ({row_tiles} row tiles of 64, "
              f"{int(o[-1] - o[0])} rows)")
    with open(args.json, "w") as f:
        json.dump({"shape": args.shape, "gemm": args.gemm, "tokens": args.routed, "n": n, "k": k, "experts": e,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
