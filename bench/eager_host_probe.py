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
from collections.abc import Callable

import torch

from moe_build.bench import SHAPES, _device_weights, bench_spec
from moe_build.runner import MoERunner


def host_us(call: Callable[[], object], calls: int) -> float:
    """Host microseconds per call(): 20 warm-up calls, then `calls` queued back to back (the GPU
    drained before and after, no sync inside)."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / calls * 1e6


def print_profile(call: Callable[[], object], calls: int, top: int = 15) -> None:
    """cProfile of host_us(call, calls), by own time."""
    prof = cProfile.Profile()
    prof.runcall(host_us, call, calls)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


def probe_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--profile", action="store_true")
    return ap.parse_args()


def eager_call(runner: MoERunner, tokens: int) -> Callable[[], object]:
    """One eager layer call on fresh inputs of `tokens` tokens, into a preallocated output."""
    spec = runner.spec
    hidden = torch.randn(tokens, spec.hidden_size, device="cuda").to(runner.dtype)
    logits = torch.randn(tokens, spec.num_experts, device="cuda")
    out = torch.empty_like(hidden)
    return lambda: runner(hidden, router_logits=logits, out=out)


def main() -> None:
    a = probe_args(__doc__.splitlines()[0])
    for name in a.shapes.split(","):
        spec = bench_spec(name)
        runner = MoERunner(spec, _device_weights(spec, 0), max_tokens=4096)
        call = eager_call(runner, a.tokens)
        print(f"{name:>18} T={a.tokens}: {host_us(call, a.calls):7.1f} us host per eager call "
              f"({len(runner.kernel_sequence(a.tokens, 'logits'))} steps)", flush=True)
        if a.profile:
            print_profile(call, a.calls)
        del runner, call
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
