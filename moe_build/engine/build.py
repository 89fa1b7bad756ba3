"""Build an MoE engine through Polygraphy's loaders, then publish it with its manifest.

The steps are Polygraphy-style loaders, composed lazily and run by the last one:

    OOTB:   ExportOnnx -> BeginPhase("parsing") -> HoldInterrupts -> NetworkFromOnnxPath(strongly_typed)
    plugin: CreateNetwork(strongly_typed) -> MoePluginNetwork (inputs, plugin layer, keep-alive)
    both:   RecordNetwork -> EngineBytesFromNetwork(network, HoldInterrupts(BeginPhase("building",
            TokenProfileConfig))) -> ReleaseInterrupts -> PublishEngine (manifest, then engine + manifest
            published as one unit: publish.py)

Ctrl-C and SIGTERM are held while TensorRT parses and builds and raised once it returns (interrupts.py).

`prepare_build` runs first, so every refusal that needs no weights comes before any work.
Outputs: `<output_dir>/<name>.engine` and `<output_dir>/<name>.json`; a failed or interrupted
build leaves neither, and no temporary file. One rank of an expert-parallel layer (spec.ep_rank set,
weights `MoEWeights.for_rank`, its own plan) is built the same way; jobs.py points `output_dir` at the
rank's folder (ranks.py), and the manifest's `ep` record says which rank and experts it holds.
"""
from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from polygraphy import util
from polygraphy.backend.base import BaseLoader

from .. import __version__
from ..graph.ootb import onnx_sha256, weights_sha256
from ..outputs import make_folder, scratch_folder, sweep_stale_temps
from ..planner import Plan
from ..spec import MoESpec
from ..weights import MoEWeights
from .config import engine_config
from .interrupts import HeldInterrupts, HoldInterrupts, ReleaseInterrupts
from .manifest import make_manifest
from .networks import ExportOnnx, MoePluginNetwork, NetworkLoader, NetworkRecord, RecordNetwork
from .options import BuildOptions
from .polygraphy_log import polygraphy_errors
from .preflight import Toolchain, prepare_build
from .progress import BeginPhase, BuildProgress, make_build_progress
from .publish import publish_pair


@dataclass(frozen=True)
class BuildResult:
    engine_path: Path
    manifest_path: Path
    manifest: dict[str, Any] = field(repr=False)


class PublishEngine(BaseLoader):
    """The final step: the engine's bytes, the manifest made for them, both published as one unit."""

    def __init__(self, engine: Callable[[], Any], manifest: Callable[[bytes], dict[str, Any]], folder: Path,
                 name: str, progress: BuildProgress):
        self._engine, self._manifest, self._folder = engine, manifest, folder
        self._name, self._progress = name, progress

    def call_impl(self) -> BuildResult:
        ret, _ = util.invoke_if_callable(self._engine)
        engine = bytes(ret)
        self._progress.begin("writing engine + manifest")
        manifest = self._manifest(engine)
        paths = publish_pair(self._folder, self._name, engine, (json.dumps(manifest, indent=2) + "\n").encode())
        return BuildResult(*paths, manifest)


def _network(chain: Toolchain, spec: MoESpec, weights: MoEWeights, plan: Plan, onnx_file: Path | None,
             progress: BuildProgress, held: HeldInterrupts) -> NetworkLoader:
    """The path's network loader (see the module docstring); signals are held from TensorRT's parsing on."""
    if onnx_file is None:
        return MoePluginNetwork(chain.loaders.CreateNetwork(strongly_typed=True), chain.backend.trt, spec, plan,
                                weights, progress)
    onnx = HoldInterrupts(held, BeginPhase(progress, "parsing ONNX",
                                           ExportOnnx(spec, weights, plan, onnx_file, chain.routing_input, progress)))
    return chain.loaders.NetworkFromOnnxPath(onnx, strongly_typed=True)


def _path_record(plan: Plan) -> dict[str, Any]:
    """The manifest's record of what the path put in the network (checked by manifest.check_consistency)."""
    if plan.path == "ootb":
        return {"expert_compute": plan.stage("expert_compute").choice}
    from ..plugins.fields import PLUGIN_NAME, PLUGIN_NAMESPACE, PLUGIN_VERSION
    return {"plugin": {"name": PLUGIN_NAME, "namespace": PLUGIN_NAMESPACE, "version": PLUGIN_VERSION,
                       "weights": "constants", "choices": plan.choices()}}


def build_engine(spec: MoESpec, weights: MoEWeights, plan: Plan, options: BuildOptions = BuildOptions(),
                 progress: BuildProgress | None = None) -> BuildResult:
    """Build the engine the plan describes (OOTB or plugin path) and publish engine + manifest.

    The target (flavour, SM, token profile) is the plan's: the plan is the single record of what
    was decided. `progress` is the caller's display (jobs.py shows weight loading in it too);
    without one the build makes its own from `options.progress`. Raises MoeBuildError (exit 2) for
    what cannot be built, an unwritable output folder or a builder failure, KeyboardInterrupt for
    a Ctrl-C (also one that cancelled TensorRT's build: interrupts.py); on any of them no output
    file remains.
    """
    chain = prepare_build(spec, plan, options)
    name = options.name or spec.name
    folder = Path(options.output_dir)
    cache = options.timing_cache_path() if chain.backend.has_timing_cache else None
    make_folder("output", folder)
    sweep_stale_temps(folder)
    if cache is not None:
        make_folder("timing_cache", cache.parent)
    with contextlib.ExitStack() as stack:
        if progress is None:
            progress = stack.enter_context(make_build_progress(options.progress, name))
        return _run(chain, spec, weights, plan, options, name, folder, cache, progress)


def _run(chain: Toolchain, spec: MoESpec, weights: MoEWeights, plan: Plan, options: BuildOptions, name: str,
         folder: Path, cache: Path | None, progress: BuildProgress) -> BuildResult:
    """Compose the loaders (see the module docstring) and run them, the ONNX export in a scratch folder."""
    start = time.perf_counter()
    with polygraphy_errors("build"), contextlib.ExitStack() as stack:  # Polygraphy logs from its first loader
        scratch = stack.enter_context(scratch_folder(folder, ".onnx")) if plan.path == "ootb" else None
        onnx_file = None if scratch is None else scratch / f"{name}.onnx"
        record, held = NetworkRecord(), HeldInterrupts()
        network = RecordNetwork(_network(chain, spec, weights, plan, onnx_file, progress, held), record)
        config = HoldInterrupts(held, BeginPhase(progress, "building engine (TensorRT)",
                                                 engine_config(chain, options, progress, held, cache)))
        engine = ReleaseInterrupts(held, chain.loaders.EngineBytesFromNetwork(
            network, config, save_timing_cache=None if cache is None else str(cache)))

        def manifest_for(data: bytes) -> dict[str, Any]:
            cc = chain.compute_capability
            return make_manifest(
                name=name, engine=data, spec=spec, plan=plan,
                flavour={"name": chain.backend.flavour.value, "version": chain.backend.version},
                sm=chain.target.sm, compute_capability=None if cc is None else f"SM{cc[0]}{cc[1]}",
                graph={"routing_input": chain.routing_input, **record.description, **_path_record(plan)},
                onnx_sha256=None if onnx_file is None else onnx_sha256(onnx_file),
                weights_sha256=options.weights_sha256 or weights_sha256(weights),
                weight_scale_granularity=None if weights.fp8 is None else weights.fp8.granularity.value,
                build={"seconds": round(time.perf_counter() - start, 3), "hostname": socket.gethostname(),
                       "moe_build_version": __version__, "optimization_level": options.optimization_level,
                       "workspace_bytes": options.workspace_bytes,
                       "timing_cache": None if cache is None else str(cache)})

        return PublishEngine(engine, manifest_for, folder, name, progress)()
