"""Grouped-GEMM timings (bf16, SwiGLU MoE shapes) of our kernels against torch._grouped_mm.

Per shape (H, I, E, top-k) and token count: GEMM1 (x @ W1^T, W1 [E, 2I, H]) and GEMM2 (h @ W2^T,
W2 [E, H, I]) on balanced-random routing, each timed by triton.testing.do_bench (median, L2
flushed before every run, so expert weights come from HBM as in a real layer). Columns:
  g1_tmm / g2_tmm : torch._grouped_mm, GEMM1 / GEMM2 (no activation, no scatter)
  g1_fused        : mb_grouped_gemm_sm80 fused SwiGLU (GEMM1 + activation in one kernel)
  g1_sm90         : mb_grouped_gemm_sm90 plain GEMM1 (auto path)
  g2_fin          : mb_grouped_gemm_sm90_finalize (GEMM2 + unpermute + weight + reduce), auto path
  g2_sm90         : mb_grouped_gemm_sm90 plain GEMM2 (auto path; g2_fin minus this = the scatter's cost)
  ours_layer      : g1_fused + zeroing the output + g2_fin (routing/permute kernels excluded)
  ours_layer90    : g1_sm90 + silu(gate)*up (torch, standing in for mb_activation) + zeroing + g2_fin
  ours_rule       : the layer a runner following the sm90 path rule gets: ours_layer when the
                    average rows per expert (T * top_k / E) is <= 8 (fused gated mma.sync GEMM1),
                    else ours_layer90 (wgmma GEMM1 + activation)
  tmm_layer       : _grouped_mm GEMM1 + silu*up + _grouped_mm GEMM2 + weighted index_add
  floor           : max(touched expert weight bytes / BW, FLOPs / 790 TFLOP/s) for the GEMMs
--paths adds every forced sm90 path (decode, mma, each wgmma tile); --tokens 1,16 limits the
token counts.
Writes JSON to $OUT/gemm_bench.json (or ./gemm_bench.json) and prints a table last.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton.testing

_spec = importlib.util.spec_from_file_location(
    "gemm_lib", Path(__file__).resolve().parents[1] / "cpp" / "tests" / "gemm_lib.py")
gemm_lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemm_lib)

SHAPES = {"mixtral": (4096, 14336, 8, 2), "qwen3-30b-a3b": (2048, 768, 128, 8),
          "deepseek-v2-lite": (2048, 1408, 64, 6), "gpt-oss-20b": (2880, 2880, 32, 4)}
TOKENS = (1, 16, 256, 4096)
WGMMA_TILES = ("coop128x256", "pingpong64x256", "pingpong64x128", "pingpong64x256c2", "pingpong64x192c2")
FORCED_PATHS = (("decode", ""), ("mma", ""), *(("wgmma", tile) for tile in WGMMA_TILES))
PEAK_FLOPS = 790e12
# --tokens 1,16 limits the token counts (default: all of TOKENS)
TOKENS_RUN = tuple(int(x) for x in sys.argv[sys.argv.index("--tokens") + 1].split(",")) if "--tokens" in sys.argv \
    else TOKENS


def gemm_problems(shapes: str, tokens: int, gen: torch.Generator):
    """Each prefill GEMM of each named shape on random top-k routing, as the probes time them:
    (shape, "g1" | "g2", n, k, rows, w [E, n, k], a [rows, k], expert offsets [E + 1],
    permuted_to_unpermuted [rows] int32)."""
    dt = torch.bfloat16
    for name in shapes.split(","):
        h, inter, e, top_k = SHAPES[name]
        rows = tokens * top_k
        for gemm, (n, k) in (("g1", (2 * inter, h)), ("g2", (h, inter))):
            w = torch.randn(e, n, k, generator=gen, device="cuda", dtype=dt) * k ** -0.5
            a = torch.randn(rows, k, generator=gen, device="cuda", dtype=dt)
            _, routed, p2u, _ = gemm_lib.route(tokens, e, top_k, gen)
            yield name, gemm, n, k, rows, w, a, routed, p2u


@dataclass
class LayerGemms:
    """One shape's two prefill GEMMs on random top-k routing, as the A/B probes time them: GEMM1 x @ W1^T
    (W1 [E, 2I, H], its gated epilogue writing [rows, I]) and GEMM2 a2 @ W2^T (W2 [E, H, I]), with the routing
    maps and weights GEMM2's finalize epilogue needs."""
    h: int
    inter: int
    e: int
    top_k: int
    tokens: int
    rows: int
    offsets: torch.Tensor
    p2u: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    x: torch.Tensor
    a2: torch.Tensor
    pw: torch.Tensor


def layer_gemms(name: str, tokens: int, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16) -> LayerGemms:
    h, inter, e, top_k = SHAPES[name]
    rows = tokens * top_k
    _, offsets, p2u, _ = gemm_lib.route(tokens, e, top_k, gen)
    w1 = torch.randn(e, 2 * inter, h, generator=gen, device="cuda", dtype=dtype) * h ** -0.5
    w2 = torch.randn(e, h, inter, generator=gen, device="cuda", dtype=dtype) * inter ** -0.5
    x = torch.randn(rows, h, generator=gen, device="cuda", dtype=dtype)
    a2 = torch.randn(rows, inter, generator=gen, device="cuda", dtype=dtype)
    pw = torch.rand(rows, generator=gen, device="cuda")
    return LayerGemms(h, inter, e, top_k, tokens, rows, offsets, p2u, w1, w2, x, a2, pw)


def run_sm90_tile(g, tile: str, a, w, out, offsets, rows: int, n: int, k: int, gated: bool,
                  finalize: tuple | None = None, layout: str = "row_major") -> None:
    """One sm90 grouped GEMM at a forced wgmma tile (MB_SM90_WGMMA_TILE; "auto" = the library's rule):
    out = a @ w^T per expert segment, or with `gated` GEMM1 through the swiglu epilogue into out [rows, n/2],
    or with `finalize` = (permuted_to_unpermuted, permuted weights, tokens, top_k) GEMM2 through the finalize
    epilogue, added into out [tokens, n]. `layout`: w's layout (gemm_lib.LAYOUTS)."""
    if tile == "auto":
        os.environ.pop("MB_SM90_WGMMA_TILE", None)
    else:
        os.environ["MB_SM90_WGMMA_TILE"] = tile
    try:
        if finalize is not None:
            p2u, pw, tokens, top_k = finalize
            st = g.sm90_finalize(a, w, None, out, offsets, p2u, pw, rows, tokens, top_k, n, k, layout)
        elif gated:
            st = g.sm90_gated(a, w, None, out, offsets, rows, n // 2, k, "swiglu", layout=layout)
        else:
            st = g.sm90(a, w, None, out, offsets, rows, n, k, layout)
    finally:
        os.environ.pop("MB_SM90_WGMMA_TILE", None)
    if st != 0:
        raise RuntimeError(g.error())


def bench_us(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def main() -> None:
    g = gemm_lib.Gemms(gemm_lib.load())
    bw = 4.3e12 if "H200" in torch.cuda.get_device_name() else 3.0e12
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    results = []
    for name, (h, inter, e, top_k) in SHAPES.items():
        w1 = (torch.randn(e, 2 * inter, h, generator=gen, device="cuda", dtype=dt) * h ** -0.5)
        w2 = (torch.randn(e, h, inter, generator=gen, device="cuda", dtype=dt) * inter ** -0.5)
        for t in TOKENS_RUN:
            ids, offsets, p2u, u2p = gemm_lib.route(t, e, top_k, gen)
            rows = t * top_k
            x = torch.randn(t, h, generator=gen, device="cuda", dtype=dt)
            a1 = x[(p2u.long() // top_k)].contiguous()
            a2 = torch.randn(rows, inter, generator=gen, device="cuda", dtype=dt)
            w = torch.rand(t, top_k, generator=gen, device="cuda")
            pw = w.flatten()[p2u.long()].contiguous()
            offs32 = offsets[1:].to(torch.int32)
            c1 = torch.empty(rows, 2 * inter, device="cuda", dtype=dt)
            c1f = torch.empty(rows, inter, device="cuda", dtype=dt)
            out = torch.empty(t, h, device="cuda", dtype=dt)
            active = int((offsets[1:] > offsets[:-1]).sum())
            floor = max(active * 3 * h * inter * 2 / bw, 2 * rows * 3 * h * inter / PEAK_FLOPS) * 1e6

            def check(st: int) -> None:
                if st != 0:
                    raise RuntimeError(g.error())

            def g1_fused():
                check(g.sm80(a1, w1, None, c1f, offsets, rows, inter, h, "swiglu"))

            def g1_sm90():
                check(g.sm90(a1, w1, None, c1, offsets, rows, 2 * inter, h))

            c2 = torch.empty(rows, h, device="cuda", dtype=dt)

            def g2_sm90():
                check(g.sm90(a2, w2, None, c2, offsets, rows, h, inter))

            def ours_layer90():
                g1_sm90()
                hh = torch.nn.functional.silu(c1[:, :inter]) * c1[:, inter:]
                out.zero_()
                check(g.sm90_finalize(hh, w2, None, out, offsets, p2u, pw, rows, t, top_k, h, inter))

            def g2_fin():
                check(g.sm90_finalize(a2, w2, None, out, offsets, p2u, pw, rows, t, top_k, h, inter))

            def ours_layer():
                g1_fused()
                out.zero_()
                check(g.sm90_finalize(c1f, w2, None, out, offsets, p2u, pw, rows, t, top_k, h, inter))

            def g1_tmm():
                return torch._grouped_mm(a1, w1.transpose(-2, -1), offs=offs32)

            def g2_tmm():
                return torch._grouped_mm(a2, w2.transpose(-2, -1), offs=offs32)

            def tmm_layer():
                y = torch._grouped_mm(a1, w1.transpose(-2, -1), offs=offs32)
                hh = torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]
                z = torch._grouped_mm(hh, w2.transpose(-2, -1), offs=offs32) * pw.unsqueeze(1).to(dt)
                o = torch.zeros(t, h, device="cuda", dtype=dt)
                o.index_add_(0, p2u.long() // top_k, z)
                return o

            row = {"shape": name, "tokens": t, "floor": floor}
            for key, fn in [("g1_tmm", g1_tmm), ("g1_fused", g1_fused), ("g1_sm90", g1_sm90), ("g2_tmm", g2_tmm),
                            ("g2_sm90", g2_sm90), ("g2_fin", g2_fin), ("ours_layer", ours_layer),
                            ("ours_layer90", ours_layer90), ("tmm_layer", tmm_layer)]:
                row[key] = bench_us(fn)
            row["ours_rule"] = row["ours_layer"] if rows <= 8 * e else row["ours_layer90"]
            if "--paths" in sys.argv:  # forced sm90 paths and wgmma tiles, to place the auto rules
                for path, tile in FORCED_PATHS:
                    os.environ["MB_SM90_GEMM_PATH"] = path
                    if tile:
                        os.environ["MB_SM90_WGMMA_TILE"] = tile
                    tag = tile or path
                    row[f"g1_sm90_{tag}"] = bench_us(g1_sm90)
                    row[f"g2_fin_{tag}"] = bench_us(g2_fin)
                    row[f"g2_sm90_{tag}"] = bench_us(g2_sm90)
                    os.environ.pop("MB_SM90_WGMMA_TILE", None)
                os.environ.pop("MB_SM90_GEMM_PATH")
            results.append(row)
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        w1 = w2 = None  # free this shape's weights before the next shape's (closures above hold the names)
        torch.cuda.empty_cache()
    out_dir = Path(os.environ.get("OUT", "."))
    (out_dir / "gemm_bench.json").write_text(json.dumps(results, indent=1))
    cols = ["floor", "g1_tmm", "g1_fused", "g1_sm90", "g2_tmm", "g2_sm90", "g2_fin", "ours_layer", "ours_layer90",
            "ours_rule", "tmm_layer"]
    print(f"device: {torch.cuda.get_device_name()}  (microseconds, median)")
    print(f"{'shape':17}{'T':>5}" + "".join(f"{c:>13}" for c in cols))
    for r in results:
        print(f"{r['shape']:17}{r['tokens']:>5}" + "".join(f"{r[c]:>13.1f}" for c in cols))
    if "--paths" in sys.argv:
        tags = [tile or path for path, tile in FORCED_PATHS]
        print("forced sm90 paths: g1_sm90 / g2_fin / g2_sm90, microseconds")
        print(f"{'shape':17}{'T':>5}" + "".join(f"{tag:>22}" for tag in tags))
        for r in results:
            print(f"{r['shape']:17}{r['tokens']:>5}" + "".join(
                f"{r[f'g1_sm90_{x}']:>8.1f}/{r[f'g2_fin_{x}']:.1f}/{r[f'g2_sm90_{x}']:<6.1f}" for x in tags))

if __name__ == "__main__":
    main()
