"""Our grouped GEMMs against cuBLAS's batched GEMM on evenly split rows, and the kernel cuBLAS picks.

Why: on routed rows no peer runs the same grouped problem, so this gives the distance to a vendor kernel
on the nearest problem it does run: every expert given exactly rows / E rows (one [E, rows/E, K] @
[E, K, N] torch.bmm). GEMM1 is ours through the gated epilogue (half-width output, as the layer runs it),
cuBLAS's plain; GEMM2 is the plain store for both. Interleaved rounds, order shuffled each round, L2
flushed before every call, medians; then the name of the kernel cuBLAS launched (its tile and cluster).
Usage: PYTHONPATH=. python bench/cublas_batched_probe.py [--shape qwen3-30b-a3b] [--tokens 4096]
       [--tiles auto,coop128x256,pingpong64x256,pingpong64x256c2] [--iters 16]
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from bench.gemm_bench import SHAPES, gemm_lib, run_sm90_tile
from moe_build.bench import _interleaved_median_ms


def cuda_kernel_names(fn) -> list[str]:
    """The CUDA kernels one call of `fn` launches (torch.profiler / CUPTI)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [ev.name for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--tiles", default="auto,coop128x256,pingpong64x256,pingpong64x256c2")
    ap.add_argument("--iters", type=int, default=16)
    args = ap.parse_args()
    g = gemm_lib.Gemms(gemm_lib.load())
    dt = torch.bfloat16
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    h, inter, e, top_k = SHAPES[args.shape]
    rows = args.tokens * top_k
    if rows % e:
        raise SystemExit(f"--tokens: tokens x top-k ({rows}) must split evenly over the {e} experts")
    per = rows // e
    even = torch.arange(e + 1, device="cuda", dtype=torch.int64) * per
    for gemm, n, k, gated in (("g1", 2 * inter, h, True), ("g2", h, inter, False)):
        w = torch.randn(e, n, k, device="cuda", dtype=dt) * k ** -0.5
        a = torch.randn(rows, k, device="cuda", dtype=dt)
        out = torch.empty(rows, n // 2 if gated else n, device="cuda", dtype=dt)
        c = torch.empty(e, per, n, device="cuda", dtype=dt)
        fns = {"bmm": lambda: torch.bmm(a.view(e, per, k), w.transpose(1, 2), out=c)}
        for tile in args.tiles.split(","):
            fns[tile] = lambda tile=tile: run_sm90_tile(g, tile, a, w, out, even, rows, n, k, gated)
        ms = _interleaved_median_ms({key: (lambda i, fn=fn: fn()) for key, fn in fns.items()}, args.iters,
                                    warmup=1, before=flush.zero_)
        print(f"{args.shape} T={args.tokens} {gemm} ({per} rows per expert, n={n}, k={k}):",
              "  ".join(f"{key} {1e3 * v:.1f} us" for key, v in ms.items()))
        print("  cuBLAS kernel:", ", ".join(name for name in cuda_kernel_names(fns["bmm"]) if "emset" not in name))


if __name__ == "__main__":
    main()
