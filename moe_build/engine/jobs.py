"""What `moe-build build` builds: one job per engine, weights loaded lazily one layer at a time.

A job pairs a name, the planned spec and a loader of its weights; `run_build_jobs` hands each
to the engine builder in turn, so `--all-layers` never holds more than one layer in memory.
Making the jobs reads only the checkpoint's config (the layer index is checked there), so a
wrong `--layer` is refused before any weight is read.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable

from ..errors import MoeBuildError
from ..planner import Plan
from ..spec import ActScale, MoESpec, Quant
from ..weights import MoEWeights
from ..weights.fp8 import ScaleGranularity
from .build import BuildResult, build_engine
from .options import BuildOptions
from .progress import make_build_progress

WeightsLoader = Callable[[], tuple[MoEWeights, str | None]]


# An engine's file names add ".engine"/".json" and, while written, a temporary prefix of ~50 characters;
# most file systems hold 255 bytes per name.
MAX_ENGINE_NAME = 160


# Random FP8 experts get the scales most FP8 checkpoints carry: one per expert matrix for fp8 (ModelOpt's),
# 128 x 128 blocks for fp8_block (DeepSeek-V3's).
RANDOM_FP8_SCALES = {Quant.FP8: ScaleGranularity.TENSOR, Quant.FP8_BLOCK: ScaleGranularity.BLOCK128}


def random_weights(spec: MoESpec, seed: int) -> MoEWeights:
    """Random weights of `spec`, FP8 experts quantized (RANDOM_FP8_SCALES; static activation scales 1.0) so
    that an FP8 engine builds without a checkpoint."""
    weights = MoEWeights.random(spec, seed=seed)
    granularity = RANDOM_FP8_SCALES.get(spec.quant)
    if granularity is None:
        return weights
    return weights.quantized_fp8(granularity, static=spec.act_scale is ActScale.STATIC)


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
        from ..spec.hf_config import select_moe_layers
        base = safe_name(name or spec.name)
        if checkpoint is None:
            def load_random() -> tuple[MoEWeights, str | None]:
                return random_weights(spec, seed), None  # the builder hashes the tensors
            return _named([cls(base, spec, plan, load_random, f"random weights (seed {seed})")])

        def loader(index: int) -> WeightsLoader:
            def load() -> tuple[MoEWeights, str | None]:
                from ..weights.checkpoint import load_moe_layer
                loaded = load_moe_layer(checkpoint, index)
                loaded.weights.check(spec)  # CLI overrides must still fit the checkpoint's tensors
                return loaded.weights, loaded.sha256
            return load

        return _named([cls(f"{base}-layer{i}", spec, plan, loader(i), f"{checkpoint} layer {i}")
                       for i in select_moe_layers(checkpoint, layer, all_layers)])


def _named(jobs: list[BuildJob]) -> list[BuildJob]:
    """The jobs, once every engine name fits a file name (refused before any weight is read)."""
    for job in jobs:
        if len(job.name.encode()) > MAX_ENGINE_NAME:
            raise MoeBuildError("name", f"the engine name {job.name[:24]}... is {len(job.name.encode())} bytes, "
                                "too long for a file name with its suffixes", f"at most {MAX_ENGINE_NAME} bytes")
    return jobs


def run_build_jobs(jobs: list[BuildJob], options: BuildOptions) -> list[BuildResult]:
    """Build every job in order; each shows its phases (from loading its weights to writing) on
    stderr, labelled with its position so long runs show how far they are."""
    results: list[BuildResult] = []
    for i, job in enumerate(jobs, 1):
        try:
            with make_build_progress(options.progress, f"[{i}/{len(jobs)}] {job.name}") as progress:
                progress.begin(f"loading weights ({job.source})")
                weights, digest = job.load()
                job_options = dataclasses.replace(options, name=job.name, weights_sha256=digest)
                try:
                    results.append(build_engine(job.spec, weights, job.plan, job_options, progress))
                except OSError as exc:  # the machine refused: disk full, a name too long, no permission
                    where = exc.filename or options.output_dir
                    raise MoeBuildError("output", f"{exc.strerror or exc} while building {job.name} ({where})") \
                        from None
        except MoeBuildError as exc:
            if not results:
                raise
            # Each engine is published whole as it is built: say which ones this run leaves, so that a
            # failure at layer k is never mistaken for all-or-nothing.
            built = ", ".join(r.engine_path.name for r in results)
            raise MoeBuildError(exc.field, f"{exc.problem} (at {job.name}, {i} of {len(jobs)}; the {len(results)} "
                                f"built before it are complete and kept: {built})", exc.allowed) from None
    return results
