"""What `moe-build build` builds: one job per engine, weights loaded lazily one layer at a time.

A job pairs a name, the planned spec and a loader of its weights; `run_build_jobs` hands each
to the engine builder in turn, so `--all-layers` never holds more than one layer in memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console

from .engine_builder import BuildOptions, BuildResult, build_engine
from .planner import Plan
from .spec import MoESpec
from .weights import MoEWeights

WeightsLoader = Callable[[], tuple[MoEWeights, str | None]]


def safe_name(text: str) -> str:
    """A file-name-safe engine name (checkpoint names may hold '/' from the hub id)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "moe"


@dataclass(frozen=True)
class BuildJob:
    name: str
    spec: MoESpec
    plan: Plan
    load: WeightsLoader
    source: str

    @classmethod
    def for_source(cls, spec: MoESpec, plan: Plan, checkpoint: str | None, layer: int | None, all_layers: bool,
                   seed: int, name: str | None) -> list["BuildJob"]:
        """Jobs for a checkpoint (one layer, the first MoE layer, or all) or for random weights."""
        if checkpoint is None:
            def random_weights() -> tuple[MoEWeights, str | None]:
                return MoEWeights.random(spec, seed=seed), None  # the builder hashes the tensors
            return [cls(safe_name(name or spec.name), spec, plan, random_weights, f"random weights (seed {seed})")]

        from .checkpoint import load_moe_layer
        from .hf_config import moe_layer_indices
        indices = moe_layer_indices(checkpoint) if all_layers else [layer if layer is not None
                                                                    else moe_layer_indices(checkpoint)[0]]
        base = safe_name(name or spec.name)

        def loader(index: int) -> WeightsLoader:
            def load() -> tuple[MoEWeights, str | None]:
                loaded = load_moe_layer(checkpoint, index)
                loaded.weights.check(spec)  # CLI overrides must still fit the checkpoint's tensors
                return loaded.weights, loaded.sha256
            return load

        return [cls(f"{base}-layer{i}", spec, plan, loader(i), f"{checkpoint} layer {i}") for i in indices]


def run_build_jobs(jobs: list[BuildJob], out_dir: Path, opt_level: int, workspace_mb: int | None,
                   timing_cache: str | None, routing_input: str, console: Console) -> list[BuildResult]:
    """Build every job in order, announcing each with its position so long runs show progress."""
    results = []
    for i, job in enumerate(jobs, 1):
        console.print(f"[{i}/{len(jobs)}] {job.name}: loading {job.source}")
        weights, digest = job.load()
        options = BuildOptions(output_dir=out_dir, name=job.name, optimization_level=opt_level,
                               workspace_bytes=None if workspace_mb is None else workspace_mb * 2**20,
                               timing_cache=Path(timing_cache) if timing_cache else None,
                               routing_input=routing_input, weights_sha256=digest)
        console.print(f"[{i}/{len(jobs)}] {job.name}: building ({job.plan.path} path)")
        results.append(build_engine(job.spec, weights, job.plan, options))
    return results
