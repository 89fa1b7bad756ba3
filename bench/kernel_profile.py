"""Where a layer's time goes: per-kernel GPU time of the default plan, replayed from a CUDA graph.

Why: the bench gives one number per (shape, tokens); choosing what to speed up next needs the
split between the GEMMs and the small stages. Each (shape, tokens) is captured once as a graph
(router logits in), replayed REPLAYS times under torch.profiler (CUPTI sees graph kernels), and
each kernel's device time is averaged per replay. `total` is the CUDA-event median of a replay,
so total - sum(kernels) is the time between kernels (launch gaps, ramp-up and tails).

Usage: python bench/kernel_profile.py [--shapes a,b] [--tokens 1,16] [--force finalize=separate,...] [--json PATH]
(--force: the runner's force options, as the bench's "ours:<key>=<value>" variants set them)
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from moe_build.bench import SHAPES, TOKENS, _device_weights, _median_ms, bench_spec
from moe_build.runner import MoERunner
from moe_build.runner.graph import GraphedMoE

REPLAYS = 50


def short(name: str) -> str:
    """A kernel's name without template arguments and namespaces (CUTLASS names run to kilobytes)."""
    if "cutlass" in name and "GemmUniversal" in name:
        # MoeEpilogue<T, kEpi>: gemm_common.cuh's EpilogueKind (0 store, 1 gated, 2 finalize)
        epi = re.search(r"MoeEpilogue<[^,<>]+,\s*(\d)", name)
        return "cutlass_wgmma_gemm" + {"1": ":gated", "2": ":finalize"}.get(epi.group(1) if epi else "", "")
    base = name.removeprefix("void ").split("(")[0].split("<")[0]
    return base.split("::")[-1] or name[:40]


def profile_point(runner: MoERunner, tokens: int) -> dict[str, object]:
    g = GraphedMoE(runner, tokens, routing_input="logits")
    total = 1e3 * _median_ms(lambda i: g.replay(), REPLAYS, 20)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            g.replay()
        torch.cuda.synchronize()
    per: dict[str, float] = defaultdict(float)
    kernels = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda ev: ev.time_range.start)
    for ev in kernels:
        per[short(ev.name)] += ev.device_time / REPLAYS
    # one replay's kernels in launch order (names repeat: GEMM1 and GEMM2 are the same kernel)
    n = len(kernels) // REPLAYS
    order = [(short(ev.name), round(ev.device_time, 1)) for ev in kernels[-n:]] if n else []
    return {"total_us": total, "kernels_us": dict(per), "gap_us": total - sum(per.values()), "order": order}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--force", default="", help="comma-separated key=value plan overrides")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    force = dict(kv.split("=", 1) for kv in a.force.split(",") if kv) or None
    tokens = [int(t) for t in a.tokens.split(",")]
    out: dict[str, object] = {"device": torch.cuda.get_device_name(), "force": force}
    for name in a.shapes.split(","):
        spec = bench_spec(name)
        runner = MoERunner(spec, _device_weights(spec, seed=0), max_tokens=max(tokens), force=force)
        for T in tokens:
            rec = profile_point(runner, T)
            out[f"{name}/T{T}"] = rec
            ks = ", ".join(f"{k} {v}" for k, v in rec["order"])
            print(f"{name:16s} T={T:<5d} total {rec['total_us']:8.1f} gap {rec['gap_us']:6.1f} | {ks}", flush=True)
        del runner
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
