"""Two kernel libraries' prefill GEMMs side by side in one process: the gated GEMM1 (g1), the plain
GEMM2 (g2) and GEMM2 with the finalize epilogue (fin), each library's call interleaved with the other's
(order shuffled each round, L2 flushed before every call, CUDA events, medians), then each output of
the two compared (g1 and g2 bit-identical expected; fin's atomics add in run-time order).
Why one process: GEMMs timed in separate processes drift by several percent under the GPU's power limit.
Usage: PYTHONPATH=. python bench/lib_ab_probe.py OLD.so NEW.so [--tokens 4096] [--shapes a,b] [--iters 15]
       [--json PATH]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import tempfile

import torch

from bench.gemm_bench import SHAPES, gemm_lib, layer_gemms
from moe_build.bench import _interleaved_median_ms
from moe_build.kernels import SIGNATURES


def load(path: str) -> gemm_lib.Gemms:
    """The library at `path`, loaded from a private copy (two copies of one file would share a handle)."""
    copy = os.path.join(tempfile.mkdtemp(), os.path.basename(path))
    shutil.copy(path, copy)
    lib = ctypes.CDLL(copy)
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, list(argtypes)
    return gemm_lib.Gemms(lib)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "lib_ab_probe.json"))
    args = ap.parse_args()
    libs = {"old": load(args.old), "new": load(args.new)}
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    results = {}
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name in args.shapes.split(","):
            p = layer_gemms(name, tokens, gen, dt)
            h, inter, top_k, rows, offsets, p2u = p.h, p.inter, p.top_k, p.rows, p.offsets, p.p2u
            w1, w2, x, a2, pw = p.w1, p.w2, p.x, p.a2, p.pw
            outs = {"g1": torch.empty(rows, inter, device="cuda", dtype=dt),
                    "g2": torch.empty(rows, h, device="cuda", dtype=dt),
                    "fin": torch.zeros(tokens, h, device="cuda", dtype=dt)}

            def call(g: gemm_lib.Gemms, kind: str) -> None:
                if kind == "g1":
                    st = g.sm90_gated(x, w1, None, outs["g1"], offsets, rows, inter, h, "swiglu")
                elif kind == "g2":
                    st = g.sm90(a2, w2, None, outs["g2"], offsets, rows, h, inter)
                else:
                    st = g.sm90_finalize(a2, w2, None, outs["fin"], offsets, p2u, pw, rows, tokens, top_k, h, inter)
                if st != 0:
                    raise RuntimeError(g.error())

            fns = {(kind, lib): (lambda i, g=g, kind=kind: call(g, kind))
                   for kind in outs for lib, g in libs.items()}
            ms = _interleaved_median_ms(fns, args.iters, warmup=2, before=flush.zero_)
            row = {f"{kind}_{lib}": v * 1e3 for (kind, lib), v in ms.items()}
            for kind, out in outs.items():
                got = []
                for g in libs.values():
                    out.zero_()
                    call(g, kind)
                    got.append(out.float())
                row[f"{kind}_max_abs_diff"] = (got[0] - got[1]).abs().max().item()
            results[f"{name}@{tokens}"] = row
            print(f"{name:17s} T={tokens:5d} " + "  ".join(
                f"{kind} {row[f'{kind}_old']:8.1f} -> {row[f'{kind}_new']:8.1f} us (max|diff| "
                f"{row[f'{kind}_max_abs_diff']:.3g})" for kind in outs), flush=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
