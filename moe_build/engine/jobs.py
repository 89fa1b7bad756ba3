"""What `moe-build build` builds: one job per engine, weights loaded lazily one layer at a time.

A job pairs a name, the planned spec and a loader of its weights; `run_build_jobs` hands each
to the engine builder in turn, so `--all-layers` never holds more than one layer in memory.
Making the jobs reads only the checkpoint's config (the layer index is checked there), so a
wrong `--layer` is refused before any weight is read. An expert-parallel job (`ranks`) loads its layer
once and builds one engine per rank from that rank's slice of the weights and its own plan, each into
its rank folder (ranks.py) and published whole as it is built.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..errors import MoeBuildError
from ..planner import Plan
from ..spec import ActScale, MoESpec, Quant
from ..weights import MoEWeights
from ..weights.fp8 import ScaleGranularity
from .build import BuildResult, build_engine
from .options import BuildOptions
from .progress import BuildProgress, make_build_progress
from .ranks import rank_folder

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
    # Expert parallelism: (rank, that rank's plan) for each rank to build; empty for a layer on one GPU.
    ranks: tuple[tuple[int, Plan], ...] = ()

    @classmethod
    def for_source(cls, spec: MoESpec, plan: Plan, checkpoint: str | None, layer: int | None, all_layers: bool,
                   seed: int, name: str | None, ranks: Sequence[tuple[int, Plan]] = ()) -> list["BuildJob"]:
        """Jobs for a checkpoint (one layer, the first MoE layer, or all) or for random weights; `spec` is the
        whole layer's (ranks.split_ranks), `ranks` the (rank, plan) pairs each job builds."""
        from ..spec.hf_config import select_moe_layers
        base = safe_name(name or spec.name)
        ranks = tuple(ranks)
        if checkpoint is None:
            def load_random() -> tuple[MoEWeights, str | None]:
                return random_weights(spec, seed), None  # the builder hashes the tensors
            return _named([cls(base, spec, plan, load_random, f"random weights (seed {seed})", ranks)])

        from ..weights.checkpoint import checkpoint_shards
        checkpoint_shards(Path(checkpoint))  # no weights file, or a broken index: refused before the plan prints

        def loader(index: int) -> WeightsLoader:
            def load() -> tuple[MoEWeights, str | None]:
                from ..weights.checkpoint import load_moe_layer
                loaded = load_moe_layer(checkpoint, index)
                return loaded.weights.for_spec(spec), loaded.sha256  # the overrides must fit its tensors
            return load

        return _named([cls(f"{base}-layer{i}", spec, plan, loader(i), f"{checkpoint} layer {i}", ranks)
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
    stderr, labelled with its position (and rank) so long runs show how far they are."""
    results: list[BuildResult] = []
    for i, job in enumerate(jobs, 1):
        label = f"[{i}/{len(jobs)}] {job.name}"
        current = job.name
        try:
            with make_build_progress(options.progress, label) as progress:
                progress.begin(f"loading weights ({job.source})")
                weights, digest = job.load()
                if not job.ranks:
                    job_options = dataclasses.replace(options, name=job.name, weights_sha256=digest)
                    results.append(_build(job.spec, weights, job.plan, job_options, progress, job.name))
            for rank, plan in job.ranks:
                current = f"{job.name} rank {rank}"
                results.append(_build_rank(job, weights, rank, plan, options, label))
        except MoeBuildError as exc:
            if not results:
                raise
            # Each engine is published whole as it is built: say which ones this run leaves, so that a
            # failure at layer k (or rank r) is never mistaken for all-or-nothing.
            built = ", ".join(_shown(r.engine_path, options.output_dir) for r in results)
            raise MoeBuildError(exc.field, f"{exc.problem} (at {current}, {i} of {len(jobs)}; the {len(results)} "
                                f"built before it are complete and kept: {built})", exc.allowed) from None
    return results


def _build(spec: MoESpec, weights: MoEWeights, plan: Plan, options: BuildOptions, progress: BuildProgress,
           what: str) -> BuildResult:
    """One engine; an OSError (the machine refused: disk full, a name too long, no permission) as one line."""
    try:
        return build_engine(spec, weights, plan, options, progress)
    except OSError as exc:
        where = exc.filename or options.output_dir
        raise MoeBuildError("output", f"{exc.strerror or exc} while building {what} ({where})") from None


def _build_rank(job: BuildJob, weights: MoEWeights, rank: int, plan: Plan, options: BuildOptions,
                label: str) -> BuildResult:
    """Rank `rank`'s engine: its experts' weights only, its own plan, into its rank folder, digest of its own
    tensors (the builder hashes them: a checkpoint's digest is the whole layer's). A rank folder this build
    made and could not fill is removed again, so an interrupted build leaves no empty rank behind."""
    spec = job.spec.for_rank(rank)
    folder = rank_folder(options.output_dir, job.name, rank)
    made = [p for p in (folder, folder.parent) if not p.exists()]
    # One timing cache for all ranks (full TensorRT), where a layer on one GPU keeps its own: the output folder.
    rank_options = dataclasses.replace(options, output_dir=folder, name=job.name, weights_sha256=None,
                                       timing_cache=options.timing_cache_path())
    try:
        with make_build_progress(options.progress, f"{label} rank {rank} of {spec.ep_size}") as progress:
            return _build(spec, weights.for_rank(job.spec, rank), plan, rank_options, progress,
                          f"{job.name} rank {rank}")
    except BaseException:
        for path in made:  # innermost first; rmdir leaves a folder that something else has written to
            try:
                path.rmdir()
            except OSError:
                pass
        raise


def _shown(path: Path, output_dir: Path | str) -> str:
    """An engine's path as the user's output folder sees it (rank folders included)."""
    try:
        return str(path.relative_to(output_dir))
    except ValueError:
        return path.name
