"""Decode-path probe: the sm90 grouped GEMMs at few rows per expert, the decode kernel (each K-slice
count) against the mma.sync tiles and wgmma, with the read and copy bandwidth
measured in the same run.

Why: cpp/src/gemm_decode.cu's K-slice rule (choose_wk) and the entry points'
path rule (decode_rows_fit) are placed from these numbers. Timings are triton.testing.do_bench medians with L2 flushed before every run
(expert weights come from HBM, as in a layer); each cell prints us(TB/s of touched weights).

Usage: python bench/decode_probe.py [--tokens 1,16,256] [--variants mma,decode,decode:ksplit=2,...]
(MOE_BUILD_KERNELS_LIB selects a prebuilt library)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

import torch
import triton.testing

_spec = importlib.util.spec_from_file_location(
    "gemm_lib", Path(__file__).resolve().parents[1] / "cpp" / "tests" / "gemm_lib.py")
gemm_lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemm_lib)

SHAPES = {"mixtral": (4096, 14336, 8, 2), "qwen3": (2048, 768, 128, 8), "deepseek": (2048, 1408, 64, 6),
          "gptoss": (2880, 2880, 32, 4)}
# PATH[:knob=value]: MB_SM90_GEMM_PATH and one decode K-slice count or wgmma tile; plain "decode" is the automatic choice
VARIANTS = "mma,wgmma,decode,decode:ksplit=1,decode:ksplit=2,decode:ksplit=4,decode:ksplit=8"
KNOBS = {"ksplit": "MB_DECODE_KSPLIT", "tile": "MB_SM90_WGMMA_TILE"}


def set_variant(variant: str) -> None:
    """Sets the environment knobs of one VARIANTS entry (the library reads them per call)."""
    path, _, option = variant.partition(":")
    os.environ["MB_SM90_GEMM_PATH"] = path
    for env in KNOBS.values():
        os.environ.pop(env, None)
    if option:
        name, _, value = option.partition("=")
        os.environ[KNOBS[name]] = value


def bench_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--variants", default=VARIANTS)
    args = ap.parse_args()
    x = torch.empty(235 * 2**20, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    t = bench_us(lambda: x.sum())
    print(f"read (x.sum over {x.numel() * 2 >> 20} MiB): {t:.1f} us = {x.numel() * 2 / t / 1e6:.2f} TB/s")
    t = bench_us(lambda: y.copy_(x))
    print(f"copy: {t:.1f} us = {2 * x.numel() * 2 / t / 1e6:.2f} TB/s (read + write)")
    x = y = None  # free the probe buffers (the timed lambdas hold the names)
    g = gemm_lib.Gemms(gemm_lib.load())
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    print("GEMM1 / GEMM2 (plain sm90 entry point), us(TB/s)")
    for name in args.shapes.split(","):
        h, inter, e, k = SHAPES[name]
        w1 = torch.randn(e, 2 * inter, h, device="cuda", dtype=dt) * h ** -0.5
        w2 = torch.randn(e, h, inter, device="cuda", dtype=dt) * inter ** -0.5
        for tokens in map(int, args.tokens.split(",")):
            _, offsets, _, _ = gemm_lib.route(tokens, e, k, gen)
            rows = tokens * k
            a1 = torch.randn(rows, h, device="cuda", dtype=dt)
            a2 = torch.randn(rows, inter, device="cuda", dtype=dt)
            c1 = torch.empty(rows, 2 * inter, device="cuda", dtype=dt)
            c2 = torch.empty(rows, h, device="cuda", dtype=dt)
            active = int((offsets[1:] > offsets[:-1]).sum())
            b1, b2 = active * 2 * inter * h * 2, active * inter * h * 2
            cells = []
            for variant in args.variants.split(","):
                set_variant(variant)
                t1 = bench_us(lambda: g.sm90(a1, w1, None, c1, offsets, rows, 2 * inter, h))
                t2 = bench_us(lambda: g.sm90(a2, w2, None, c2, offsets, rows, h, inter))
                cells.append(f"{variant} {t1:.1f}({b1 / t1 / 1e6:.2f})/{t2:.1f}({b2 / t2 / 1e6:.2f})")
            print(f"{name:9s} T={tokens:<4d} " + " | ".join(cells), flush=True)
        w1 = w2 = None  # free this shape's weights before the next shape's
    os.environ.pop("MB_SM90_GEMM_PATH", None)
    for env in KNOBS.values():
        os.environ.pop(env, None)


if __name__ == "__main__":
    main()
