"""Decode-path probe: the sm90 grouped GEMMs at 1 and 16 tokens, decode kernel (each K-slice count)
against the mma.sync tiles, with the read and copy bandwidth measured in the same run.

Why: cpp/src/gemm_decode.cu's K-slice rule (choose_wk) and gemm_sm90.cu's path rule are placed
from these numbers. Timings are triton.testing.do_bench medians with L2 flushed before every run
(expert weights come from HBM, as in a layer); each cell prints us(TB/s of touched weights).

Usage: python bench/decode_probe.py   (MOE_BUILD_KERNELS_LIB selects a prebuilt library)
"""
from __future__ import annotations

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
# (MB_SM90_GEMM_PATH, MB_DECODE_KSPLIT); None: the automatic choice
VARIANTS = [("mma", None), ("decode", None), ("decode", "1"), ("decode", "2"), ("decode", "4"), ("decode", "8")]


def bench_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def main() -> None:
    x = torch.empty(235 * 2**20, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    t = bench_us(lambda: x.sum())
    print(f"read (x.sum over {x.numel() * 2 >> 20} MiB): {t:.1f} us = {x.numel() * 2 / t / 1e6:.2f} TB/s")
    t = bench_us(lambda: y.copy_(x))
    print(f"copy: {t:.1f} us = {2 * x.numel() * 2 / t / 1e6:.2f} TB/s (read + write)")
    del x, y
    g = gemm_lib.Gemms(gemm_lib.load())
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    print("GEMM1 / GEMM2 (plain sm90 entry point), us(TB/s)")
    for name, (h, inter, e, k) in SHAPES.items():
        w1 = torch.randn(e, 2 * inter, h, device="cuda", dtype=dt) * h ** -0.5
        w2 = torch.randn(e, h, inter, device="cuda", dtype=dt) * inter ** -0.5
        for tokens in (1, 16):
            _, offsets, _, _ = gemm_lib.route(tokens, e, k, gen)
            rows = tokens * k
            a1 = torch.randn(rows, h, device="cuda", dtype=dt)
            a2 = torch.randn(rows, inter, device="cuda", dtype=dt)
            c1 = torch.empty(rows, 2 * inter, device="cuda", dtype=dt)
            c2 = torch.empty(rows, h, device="cuda", dtype=dt)
            active = int((offsets[1:] > offsets[:-1]).sum())
            b1, b2 = active * 2 * inter * h * 2, active * inter * h * 2
            cells = []
            for path, ksplit in VARIANTS:
                os.environ["MB_SM90_GEMM_PATH"] = path
                os.environ.pop("MB_DECODE_KSPLIT", None)
                if ksplit:
                    os.environ["MB_DECODE_KSPLIT"] = ksplit
                t1 = bench_us(lambda: g.sm90(a1, w1, None, c1, offsets, rows, 2 * inter, h))
                t2 = bench_us(lambda: g.sm90(a2, w2, None, c2, offsets, rows, h, inter))
                tag = path if path == "mma" else f"decode:{ksplit or 'auto'}"
                cells.append(f"{tag} {t1:.1f}({b1 / t1 / 1e6:.2f})/{t2:.1f}({b2 / t2 / 1e6:.2f})")
            print(f"{name:9s} T={tokens:<3d} " + " | ".join(cells), flush=True)
        del w1, w2
    os.environ.pop("MB_SM90_GEMM_PATH", None)
    os.environ.pop("MB_DECODE_KSPLIT", None)


if __name__ == "__main__":
    main()
