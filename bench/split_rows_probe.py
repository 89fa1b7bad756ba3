"""Whether splitting each expert's routed rows into whole 128-row pairs and a remainder pays: the pairs
on the cooperative 128x256 tile (one weight-tile fill per 128 rows), the remainder (< 128 rows) on the
rule's pingpong 64x256 tile, as two grouped GEMMs, against the rule's tile on all rows in one.

Why: on evenly split rows the cooperative tile runs 1-7% ahead of the pingpong tile, but on routed rows
it pads each expert to a multiple of 128 rows (README, "What an expert's last row tile costs"). Run on
the pairs only, it pads nothing, and the remainder keeps the pingpong tile's 64-row padding. Each part
is given its own compacted copy of the rows (timing only: the parts' outputs are not the layer's), so
this bounds the split before any kernel change: two plain launches, each with its own last wave.
Interleaved rounds, L2 flushed before every call, medians, one process, weights in 64 x 64 blocks as the
runner stores them at prefill.
Usage: PYTHONPATH=. python bench/split_rows_probe.py [--shapes qwen3-30b-a3b,deepseek-v2-lite]
       [--tokens 4096] [--iters 16] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from bench.gemm_bench import SHAPES, gemm_lib, run_sm90_tile
from moe_build.bench import _interleaved_median_ms
from moe_build.weights import block_64x64

PAIR = 128  # the cooperative tile's rows


def split_rows(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expert offsets -> (row indices of whole pairs, their offsets, row indices of the rest, their offsets)."""
    off = offsets.tolist()
    pairs, rest, off_pairs, off_rest = [], [], [0], [0]
    for g in range(len(off) - 1):
        m = off[g + 1] - off[g]
        f = (m // PAIR) * PAIR
        pairs.extend(range(off[g], off[g] + f))
        rest.extend(range(off[g] + f, off[g + 1]))
        off_pairs.append(off_pairs[-1] + f)
        off_rest.append(off_rest[-1] + m - f)
    dev = offsets.device
    as_idx = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)
    return as_idx(pairs), as_idx(off_pairs), as_idx(rest), as_idx(off_rest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v2-lite")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "split_rows_probe.json"))
    args = ap.parse_args()
    g = gemm_lib.Gemms(gemm_lib.load())
    dt = torch.bfloat16
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for name in args.shapes.split(","):
        h, inter, e, top_k = SHAPES[name]
        _, offsets, p2u, _ = gemm_lib.route(args.tokens, e, top_k, gen)
        rows = args.tokens * top_k
        i_pairs, o_pairs, i_rest, o_rest = split_rows(offsets)
        for gemm, (n, k) in (("g1", (2 * inter, h)), ("g2", (h, inter))):
            w = block_64x64(torch.randn(e, n, k, generator=gen, device="cuda", dtype=dt) * k ** -0.5)
            a = torch.randn(rows, k, generator=gen, device="cuda", dtype=dt)
            gated = gemm == "g1"
            pw = torch.rand(rows, generator=gen, device="cuda")
            out_all = torch.zeros(args.tokens, n, device="cuda", dtype=dt) if not gated else \
                torch.empty(rows, n // 2, device="cuda", dtype=dt)

            def part(idx: torch.Tensor | None, off: torch.Tensor):
                """A part's own rows, output and finalize maps (`idx` None: all rows)."""
                if idx is None:
                    return a, off, rows, out_all, (p2u, pw, args.tokens, top_k)
                pa = a[idx].contiguous()
                po = out_all if not gated else torch.empty(idx.numel(), n // 2, device="cuda", dtype=dt)
                return pa, off, idx.numel(), po, (p2u[idx].contiguous(), pw[idx].contiguous(), args.tokens, top_k)

            def call(tile: str, p) -> None:
                pa, off, prow, po, fin = p
                run_sm90_tile(g, tile, pa, w, po, off, prow, n, k, gated, None if gated else fin, "blocked64")

            whole, pairs, rest = part(None, offsets), part(i_pairs, o_pairs), part(i_rest, o_rest)
            fns = {
                "auto": lambda i: call("auto", whole),
                "coop_all": lambda i: call("coop128x256", whole),
                "coop_pairs": lambda i: call("coop128x256", pairs),
                "pp_pairs": lambda i: call("pingpong64x256", pairs),
                "pp_rest": lambda i: call("pingpong64x256", rest),
                "split": lambda i: (call("coop128x256", pairs), call("pingpong64x256", rest)),
                "split_pp": lambda i: (call("pingpong64x256", pairs), call("pingpong64x256", rest)),
            }
            ms = _interleaved_median_ms(fns, args.iters, warmup=1, before=flush.zero_)
            us = {key: 1e3 * v for key, v in ms.items()}
            row = {"shape": name, "gemm": gemm, "tokens": args.tokens, "rows": rows, "pair_rows": i_pairs.numel(),
                   "rest_rows": i_rest.numel(), "us": us}
            results.append(row)
            print(f"{name:17s} {gemm} pairs {i_pairs.numel()} rest {i_rest.numel()} | "
                  + " ".join(f"{key} {v:6.1f}" for key, v in us.items()), flush=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
