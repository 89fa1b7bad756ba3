"""Host time of one eager runner call: what a PyTorch caller pays per layer without a CUDA graph.

Why: at decode sizes an eager call is bound by the host (Python, ctypes, tensor checks), not the
GPU, so its time is the host's launch loop; this times that loop alone (calls queued back to back,
no sync inside) and, with --profile, names where it goes (cProfile, by own time).

Usage: PYTHONPATH=. python bench/eager_host_probe.py [--shapes a,b] [--tokens 1] [--calls 500] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from moe_build.bench import SHAPES, _device_weights, bench_spec
from moe_build.runner import MoERunner


def host_us_per_call(runner: MoERunner, tokens: int, calls: int) -> float:
    spec = runner.spec
    hidden = torch.randn(tokens, spec.hidden_size, device="cuda").to(runner.dtype)
    logits = torch.randn(tokens, spec.num_experts, device="cuda")
    out = torch.empty_like(hidden)
    for _ in range(20):
        runner(hidden, router_logits=logits, out=out)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        runner(hidden, router_logits=logits, out=out)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    for name in a.shapes.split(","):
        spec = bench_spec(name)
        runner = MoERunner(spec, _device_weights(spec, 0), max_tokens=4096)
        us = host_us_per_call(runner, a.tokens, a.calls)
        print(f"{name:>18} T={a.tokens}: {us:7.1f} us host per eager call "
              f"({len(runner.kernel_sequence(a.tokens, 'logits'))} steps)", flush=True)
        if a.profile:
            prof = cProfile.Profile()
            prof.runcall(host_us_per_call, runner, a.tokens, a.calls)
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            print(text.getvalue())
        del runner
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
