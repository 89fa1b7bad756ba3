"""Time OOTB engine builds: the tiny default layer and a Mixtral-8x7B-shaped layer (random weights).

A benchmark, not a test: the Mixtral layer holds 8*3*4096*14336 bf16 weights (2.8 GB), so its
ONNX export uses external data (protobuf's 2 GiB limit) and the build takes minutes.
Usage: python bench/build_bench.py [--only tiny|mixtral] [--flavour tensorrt-rtx] [--sm 89]
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch

from moe_build.engine.build import build_engine
from moe_build.engine.options import BuildOptions
from moe_build.planner import make_plan
from moe_build.spec.presets import get_preset
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights


def bench(preset: str, flavour: str, sm: int, out: Path) -> None:
    spec = get_preset(preset)
    target = Target(sm=sm, flavour=Flavour(flavour), profile=TokenProfile(1, 16, 256))
    plan = make_plan(spec, target)
    t0 = time.perf_counter()
    weights = MoEWeights.random(spec, dtype=torch.bfloat16 if spec.dtype.value == "bf16" else torch.float16)
    t1 = time.perf_counter()
    result = build_engine(spec, weights, plan, BuildOptions(output_dir=out, progress=False))
    t2 = time.perf_counter()
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    m = result.manifest
    print(f"{preset}: {spec.dtype.value} H={spec.hidden_size} I={spec.intermediate_size} E={spec.num_experts} "
          f"k={spec.top_k} expert_compute={m['graph']['expert_compute']} target={m['target']['compute_capability']}")
    print(f"  weights {t1 - t0:.1f} s | export+build+write {t2 - t1:.1f} s (builder-recorded {m['build']['seconds']} s)"
          f" | engine {m['engine_bytes'] / 1e6:.1f} MB | peak RSS {rss_gib:.1f} GiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("tiny", "mixtral"), default=None)
    ap.add_argument("--flavour", default="tensorrt-rtx")
    ap.add_argument("--sm", type=int, default=89)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moe-build-bench-") as tmp:
        for name, preset in (("tiny", "tiny"), ("mixtral", "mixtral-8x7b")):
            if args.only in (None, name):
                bench(preset, args.flavour, args.sm, Path(tmp))


if __name__ == "__main__":
    main()
