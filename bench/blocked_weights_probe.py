"""Weights in 64 x 64 blocks (MB_WEIGHTS_BLOCKED64) against row-major, one library, one process.

Why: the blocked layout is a trade (faster wgmma GEMMs at 16-384 rows per expert, slower past that on large
experts and in the decode kernel), and the runner's rule (runner/sequence.py, BLOCKED_MIN/MAX_AVG_ROWS) rests
on these side-by-side figures. Per shape and token count: the gated GEMM1 and the finalize GEMM2 alone (L2
flushed, interleaved, GEMM1 outputs asserted bit-identical), then whole layers by graph replay in interleaved
rounds, a runner with blocked weights against one forced to row-major (both sized for the call's tokens).
Usage: PYTHONPATH=. python bench/blocked_weights_probe.py [--tokens 4096,256] [--shapes a,b] [--rounds 3]
       [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from bench.env_ab_probe import replay_rounds, rounds_text
from bench.gemm_bench import SHAPES, gemm_lib, layer_gemms
from moe_build.bench import SHAPES as LAYER_SHAPES
from moe_build.bench import _device_weights, _interleaved_median_ms, bench_spec
from moe_build.runner import MoERunner
from moe_build.runner.graph import GraphedMoE
from moe_build.weights import block_64x64

LAYOUTS = ("row_major", "blocked64")


def gemms(name: str, tokens: int, iters: int, flush: torch.Tensor, gen: torch.Generator) -> dict[str, dict]:
    """GEMM1 (gated) and GEMM2 (finalize) of one shape, each layout's weights, us per layout."""
    g = gemm_lib.Gemms(gemm_lib.load())
    p, dt = layer_gemms(name, tokens, gen), torch.bfloat16
    h, inter, top_k, rows, offsets, p2u, x, a2, pw = p.h, p.inter, p.top_k, p.rows, p.offsets, p.p2u, p.x, p.a2, p.pw
    weights = {"row_major": (p.w1, p.w2), "blocked64": (block_64x64(p.w1), block_64x64(p.w2))}
    outs = {("g1", v): torch.full((rows, inter), float("nan"), device="cuda", dtype=dt) for v in LAYOUTS}
    outs.update({("fin", v): torch.zeros(tokens, h, device="cuda", dtype=dt) for v in LAYOUTS})

    def call(kind: str, v: str) -> None:
        b1, b2 = weights[v]
        if kind == "g1":
            st = g.sm90_gated(x, b1, None, outs[(kind, v)], offsets, rows, inter, h, "swiglu", layout=v)
        else:
            st = g.sm90_finalize(a2, b2, None, outs[(kind, v)], offsets, p2u, pw, rows, tokens, top_k, h, inter,
                                 layout=v)
        if st != 0:
            raise RuntimeError(g.error())

    for v in LAYOUTS:
        call("g1", v)
    assert torch.equal(outs[("g1", "row_major")], outs[("g1", "blocked64")]), "GEMM1 differs between layouts"
    fns = {(k, v): (lambda i, k=k, v=v: call(k, v)) for k in ("g1", "fin") for v in LAYOUTS}
    ms = _interleaved_median_ms(fns, iters, warmup=2, before=flush.zero_)
    return {k: {v: 1e3 * ms[(k, v)] for v in LAYOUTS} for k in ("g1", "fin")}


def layers(name: str, tokens: int, iters: int, rounds: int) -> list[dict]:
    """Whole layers at `tokens`: a runner with blocked weights vs one forced to row-major."""
    spec = bench_spec(name)
    runners = {v: MoERunner(spec, _device_weights(spec, seed=0), max_tokens=tokens, weight_layout=v) for v in LAYOUTS}
    graphs = {v: GraphedMoE(r, tokens, routing_input="logits") for v, r in runners.items()}
    for v in LAYOUTS[1:]:
        graphs[v].hidden.copy_(graphs["row_major"].hidden)
        graphs[v].router_logits.copy_(graphs["row_major"].router_logits)
    out = {v: gr.replay().float().clone() for v, gr in graphs.items()}
    rel = float((out["blocked64"] - out["row_major"]).norm() / out["row_major"].norm())
    assert rel < 1e-2, f"layers differ between layouts: rel {rel:.2e}"
    return replay_rounds(graphs, iters, rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="4096,256")
    ap.add_argument("--shapes", default=",".join(LAYER_SHAPES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "blocked_weights_probe.json"))
    a = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rec: dict[str, object] = {"device": torch.cuda.get_device_name()}
    for tokens in (int(t) for t in a.tokens.split(",")):
        for name in a.shapes.split(","):
            if name in SHAPES:  # the GEMM problems cover the shapes bench/gemm_bench.py knows
                r = rec[f"gemm/{tokens}/{name}"] = gemms(name, tokens, a.iters, flush, gen)
                print(f"{name:17s} T={tokens:5d} " + "  ".join(
                    f"{k} " + " ".join(f"{v} {u:7.1f}" for v, u in x.items()) for k, x in r.items()), flush=True)
                torch.cuda.empty_cache()
            rows = rec[f"layer/{tokens}/{name}"] = layers(name, tokens, a.iters, a.rounds)
            print(f"{name:17s} T={tokens:5d} layer {rounds_text(rows)}", flush=True)
            torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
