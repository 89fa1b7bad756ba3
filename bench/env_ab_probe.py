"""Whole layers under library switches set in the environment, side by side in one process.

Why: the kernel library reads a few switches (MB_SM90_LAUNCH, MB_SM90_WGMMA_TILE, ...) at each launch, and
a CUDA graph keeps what it captured, so one runner captured once per setting gives layers that differ only
in those launches. Whole layers timed in separate processes drift by several microseconds under the GPU's
power limit; interleaved replays in one process do not. Per shape and token count: one runner (sized for
the call), one graph per variant (each captured with its variables set), outputs checked against the first
variant's (rel. error < 1e-2: the finalize epilogue's atomics add in run-time order), then --rounds rounds
of interleaved replays (each after a 1 s idle gap), us per variant and round.
Usage: PYTHONPATH=. python bench/env_ab_probe.py --variants 'default=;plain=MB_SM90_LAUNCH=plain'
       [--shapes a,b] [--tokens 4096,256] [--rounds 3] [--iters 20] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from moe_build.bench import SHAPES, _device_weights, _interleaved_median_ms, bench_spec
from moe_build.runner import MoERunner
from moe_build.runner.graph import GraphedMoE


def parse_variants(text: str) -> dict[str, dict[str, str]]:
    """'name=VAR=value,VAR2=value;name2=' -> {name: {VAR: value, ...}, name2: {}}."""
    variants: dict[str, dict[str, str]] = {}
    for item in filter(None, (v.strip() for v in text.split(";"))):
        name, _, assigns = item.partition("=")
        env = {}
        for a in filter(None, assigns.split(",")):
            key, sep, value = a.partition("=")
            if not sep:
                raise SystemExit(f"--variants: '{a}' in '{item}' is not VAR=value")
            env[key] = value
        variants[name] = env
    if len(variants) < 2:
        raise SystemExit("--variants: give at least two, e.g. 'default=;plain=MB_SM90_LAUNCH=plain'")
    return variants


def capture(runner: MoERunner, tokens: int, env: dict[str, str]) -> GraphedMoE:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return GraphedMoE(runner, tokens, routing_input="logits")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def layer_ab(name: str, tokens: int, variants: dict[str, dict[str, str]], iters: int, rounds: int) -> list[dict]:
    spec = bench_spec(name)
    runner = MoERunner(spec, _device_weights(spec, seed=0), max_tokens=tokens)
    graphs = {v: capture(runner, tokens, env) for v, env in variants.items()}
    first = next(iter(graphs.values()))
    for g in graphs.values():
        g.hidden.copy_(first.hidden)
        g.router_logits.copy_(first.router_logits)
    ref = first.replay().float().clone()
    for v, g in graphs.items():
        rel = float((g.replay().float() - ref).norm() / ref.norm())
        assert rel < 1e-2, f"{name} T={tokens}: variant {v} differs from the first: rel {rel:.2e}"
    return replay_rounds(graphs, iters, rounds)


def replay_rounds(graphs: dict[str, GraphedMoE], iters: int, rounds: int) -> list[dict[str, float]]:
    """`rounds` rounds of the graphs' replays interleaved (_interleaved_median_ms), each after a 1 s idle
    gap so that every round starts from the same power state; us per graph and round."""
    out = []
    for r in range(rounds):
        time.sleep(1.0)
        ms = _interleaved_median_ms({v: (lambda i, g=g: g.replay()) for v, g in graphs.items()}, iters,
                                    warmup=2, seed=r)
        out.append({v: 1e3 * t for v, t in ms.items()})
    return out


def rounds_text(rows: list[dict[str, float]]) -> str:
    """replay_rounds' result on one line: 'a 581.0 b 586.2 | a 580.9 b 586.4 | ...'."""
    return " | ".join(" ".join(f"{v} {u:7.1f}" for v, u in x.items()) for x in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", required=True, help="'name=VAR=value,...;name2=...' (an empty list: as is)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "env_ab_probe.json"))
    a = ap.parse_args()
    variants = parse_variants(a.variants)
    rec: dict[str, object] = {"device": torch.cuda.get_device_name(), "variants": variants}
    for tokens in (int(t) for t in a.tokens.split(",")):
        for name in a.shapes.split(","):
            rows = rec[f"{name}/{tokens}"] = layer_ab(name, tokens, variants, a.iters, a.rounds)
            print(f"{name:17s} T={tokens:5d} {rounds_text(rows)}", flush=True)
            torch.cuda.empty_cache()
    with open(a.json, "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
