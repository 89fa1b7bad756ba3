"""Each non-GEMM stage kernel alone, replayed from a CUDA graph, at decode token counts.

Why graphs: at 1-16 tokens a stage is a few microseconds of GPU work, and what a deployment sees
is the kernel as a graph node, not the Python/ctypes launch. Each stage is captured REPS times
back to back in one graph (on one stream, so each copy waits for the previous one as in the
layer); time per stage = median replay time / REPS. "chain" is the layer's non-GEMM sequence
(routing, the prologue the plan runs at that count (fused up to 256 tokens, else three-step), expansion,
activation, and the zeroing of `out` for the fused finalize, folded into the three-step map build or else
the expansion, as the runner places it) in one graph, once.

Usage: python bench/stage_bench.py [--shapes a,b] [--tokens 1,16] [--json PATH]
(set MOE_BUILD_KERNELS_LIB to a prebuilt library on a machine without CUTLASS headers).
"""
from __future__ import annotations

import argparse
import json
from typing import Callable

import torch

from moe_build import kernels as K
from moe_build.bench import SHAPES, _median_ms
from moe_build.planner.rules import FUSED_PROLOGUE_MAX_TOKENS

REPS = 20
REPLAYS = 200


def graph_us(fn: Callable[[], object], reps: int) -> float:
    """Median microseconds of one fn() as a graph node (fn captured `reps` times in one graph)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside capture (library load, lazy module init)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return 1e3 * _median_ms(lambda i: g.replay(), REPLAYS, 20) / reps


def bench_shape(name: str, T: int) -> dict[str, float]:
    H, I, E, k, _ = SHAPES[name]
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(T * 1000 + E)
    logits = torch.randn(T, E, device=dev).to(dt)
    hidden = torch.randn(T, H, device=dev).to(dt)
    ids, w = K.routing(logits, k, K.Routing.SOFTMAX_TOPK, renormalize=True)
    ws = torch.empty(K.three_step_workspace_bytes(T, k, E), device=dev, dtype=torch.uint8)
    fused = T <= FUSED_PROLOGUE_MAX_TOKENS
    prologue = (lambda i, m: K.build_maps_fused(i, E, *m)) if fused else \
        (lambda i, m: K.build_maps_three_step(i, E, *m, workspace=ws))
    ptu, utp, off = prologue(ids, (None, None, None))
    pin = torch.empty(T * k, H, device=dev, dtype=dt)
    pw = torch.empty(T * k, device=dev)
    fc1 = torch.randn(T * k, 2 * I, device=dev).to(dt)
    act = torch.empty(T * k, I, device=dev, dtype=dt)
    g2 = torch.randn(T * k, H, device=dev).to(dt)
    out = torch.empty(T, H, device=dev, dtype=dt)
    ids_o, w_o = torch.empty_like(ids), torch.empty_like(w)
    maps = (torch.empty_like(ptu), torch.empty_like(utp), torch.empty_like(off))
    # Where the layer zeroes `out`: the three-step map build where it runs, else the expansion.
    zero_kw = {"zero_out": out} if fused else {}
    chain_prologue = prologue if fused else \
        (lambda i, m: K.build_maps_three_step(i, E, *m, workspace=ws, zero_out=out))
    src_rows = (ptu // k).long()

    def chain() -> None:
        K.routing(logits, k, K.Routing.SOFTMAX_TOPK, renormalize=True, topk_ids=ids_o, topk_weights=w_o)
        chain_prologue(ids_o, maps)
        K.expand_rows(hidden, maps[1], w_o, permuted_input=pin, permuted_weights=pw, **zero_kw)
        K.activation(fc1, maps[2], K.Activation.SWIGLU, out=act)

    one = torch.zeros(1, device=dev)
    stages: dict[str, Callable[[], object]] = {
        "empty_node": lambda: one.add_(1),  # the cost of any graph node: the floor for a tiny stage
        "routing": lambda: K.routing(logits, k, K.Routing.SOFTMAX_TOPK, renormalize=True, topk_ids=ids_o,
                                     topk_weights=w_o),
        "prologue_three_step": lambda: K.build_maps_three_step(ids, E, *maps, workspace=ws),
        "expand_rows": lambda: K.expand_rows(hidden, utp, w, permuted_input=pin, permuted_weights=pw),
        "zero_output(memset)": lambda: out.zero_(),
        "activation": lambda: K.activation(fc1, off, K.Activation.SWIGLU, out=act),
        "finalize": lambda: K.finalize(g2, w, ids, utp, out=out),
        # bandwidth references for the two copies above, same bytes: a pure write of the expanded
        # rows, torch's gather of them, and a plain read + write of the GEMM2 output's size
        "ref:fill(T*k rows)": lambda: pin.fill_(0),
        "ref:index_select": lambda: torch.index_select(hidden, 0, src_rows, out=pin),
        "ref:copy(T*k rows)": lambda: pin.copy_(g2),
    }
    if fused:
        stages["prologue_fused"] = lambda: K.build_maps_fused(ids, E, *maps)
    stages["expand_rows+zero_out"] = lambda: K.expand_rows(hidden, utp, w, permuted_input=pin, permuted_weights=pw,
                                                           zero_out=out)
    stages["prologue_three_step+zero_out"] = lambda: K.build_maps_three_step(ids, E, *maps, workspace=ws,
                                                                            zero_out=out)
    res = {n: graph_us(f, REPS) for n, f in stages.items()}
    res["chain(non-GEMM)"] = graph_us(chain, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    K.load_library()
    cols, table = [], {}
    for name in a.shapes.split(","):
        for T in (int(t) for t in a.tokens.split(",")):
            col = f"{name.split('-')[0]}/T{T}"
            cols.append(col)
            table[col] = bench_shape(name, T)
    rows = list(dict.fromkeys(r for col in table.values() for r in col))
    print(f"stage kernels, CUDA-graph node time (us, median), {torch.cuda.get_device_name()}")
    print(f"{'stage':<22}" + "".join(f"{c:>13}" for c in cols))
    for r in rows:
        print(f"{r:<22}" + "".join(f"{table[c].get(r, float('nan')):>13.2f}" for c in cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "us": table}, f, indent=1)


if __name__ == "__main__":
    main()
