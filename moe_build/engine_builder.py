"""Build an OOTB MoE engine: ONNX export -> OnnxParser -> strongly typed network -> engine + manifest.

Outputs `<output_dir>/<name>.engine` and `<output_dir>/<name>.json`. Both are written to temp
files in the same folder and moved into place with os.replace, so a failed build leaves no
engine, no manifest and no temp file behind.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import __version__
from .backend import Backend, load_backend
from .errors import MoeBuildError
from .ootb_graph import export_onnx, onnx_sha256, weights_sha256
from .planner import Plan
from .progress import make_monitor, make_progress
from .spec import MoESpec
from .target import Target
from .weights import MoEWeights

MANIFEST_SCHEMA = "moe-build.manifest/1"
TIMING_CACHE_NAME = "moe-build.timing.cache"


@dataclass(frozen=True)
class BuildOptions:
    """How to build; none of this changes what the engine computes."""

    output_dir: Path = Path("engines")
    name: str | None = None                  # default: the spec's name
    optimization_level: int = 3              # TensorRT builder optimization level 0..5
    workspace_bytes: int | None = None       # memory pool limit for the workspace; None: TensorRT default
    timing_cache: Path | None = None         # default: <output_dir>/moe-build.timing.cache
    use_timing_cache: bool = True
    progress: bool = True
    routing_input: str = "hidden"            # hidden | logits | topk: what the engine takes besides hidden
    weights_sha256: str | None = None        # hash of the source weights; None: hash the tensors


@dataclass(frozen=True)
class BuildResult:
    engine_path: Path
    manifest_path: Path
    manifest: dict[str, Any] = field(repr=False)


class _Logger:
    """Collects the builder's warnings/errors so a failure is reported with TensorRT's words."""

    @staticmethod
    def make(backend: Backend) -> Any:
        base = backend.trt.ILogger
        severity = base.Severity

        class Logger(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                base.__init__(self)
                self.errors: list[str] = []

            def log(self, level: Any, msg: str) -> None:
                if level in (severity.ERROR, severity.INTERNAL_ERROR):
                    self.errors.append(msg.strip())

        return Logger()


def _check_output_dir(output_dir: Path) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MoeBuildError("output", f"cannot create {output_dir}: {exc.strerror or exc}") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise MoeBuildError("output", f"{output_dir} is not writable")


def _check_inputs(spec: MoESpec, plan: Plan, options: BuildOptions) -> Target:
    if plan.path != "ootb":
        raise MoeBuildError("path", f"the engine builder builds the ootb path; the plan chose {plan.path!r} "
                            "(plugin engines need the MoE plugin and full TensorRT)", ["ootb"])
    if plan.spec != spec.to_dict():
        raise MoeBuildError("plan", "the plan was made for a different spec", "a plan from make_plan(spec, ...)")
    if not 0 <= options.optimization_level <= 5:
        raise MoeBuildError("optimization_level", f"{options.optimization_level} is out of range", "0..5")
    if options.workspace_bytes is not None and options.workspace_bytes <= 0:
        raise MoeBuildError("workspace", f"must be positive, got {options.workspace_bytes}", "bytes >= 1")
    return Target.from_dict(plan.target)


@contextlib.contextmanager
def _atomic_outputs(output_dir: Path, names: tuple[str, ...]) -> Iterator[dict[str, Path]]:
    """Temp paths in `output_dir` for each final name; moved into place only if the body
    completes, removed (with any half-moved final file) if anything fails."""
    temps: dict[str, Path] = {}
    moved: list[Path] = []
    try:
        for name in names:
            fd, tmp = tempfile.mkstemp(dir=output_dir, prefix=f".{name}.", suffix=".tmp")
            os.close(fd)
            temps[name] = Path(tmp)
        yield temps
        umask = os.umask(0)
        os.umask(umask)
        for name in names:
            os.chmod(temps[name], 0o666 & ~umask)  # mkstemp makes 0600; finished files get the usual mode
            os.replace(temps[name], output_dir / name)
            moved.append(output_dir / name)
    except BaseException:
        for path in (*temps.values(), *moved):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        raise


def _write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _describe_network(network: Any) -> dict[str, Any]:
    """What inspect shows where the engine cannot be deserialised: I/O and the layer list."""
    def tensor(t: Any) -> dict[str, Any]:
        return {"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape)}

    return {
        "inputs": [tensor(network.get_input(i)) for i in range(network.num_inputs)],
        "outputs": [tensor(network.get_output(i)) for i in range(network.num_outputs)],
        "layers": [{"name": network.get_layer(i).name, "type": network.get_layer(i).type.name}
                   for i in range(network.num_layers)],
    }


def _parse(backend: Backend, builder: Any, onnx_path: Path, logger: Any) -> tuple[Any, Any]:
    network = builder.create_network(backend.strongly_typed_flags())
    parser = backend.trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or logger.errors
        raise MoeBuildError("build", f"the ONNX parser rejected the graph: {' | '.join(errors)[:500]}")
    return network, parser


def _load_timing_cache(backend: Backend, config: Any, path: Path | None) -> Any:
    if path is None or not backend.has_timing_cache:
        return None
    data = path.read_bytes() if path.exists() else b""
    cache = config.create_timing_cache(data)
    config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def build_engine(spec: MoESpec, weights: MoEWeights, plan: Plan, options: BuildOptions = BuildOptions()) -> BuildResult:
    """Build the engine the plan describes and write engine + manifest atomically.

    The target (flavour, SM, token profile) is the plan's: the plan is the single record of
    what was decided. Raises MoeBuildError (exit 2) for bad inputs, an unwritable output
    folder or a builder failure; on any failure no output file remains.
    """
    target = _check_inputs(spec, plan, options)
    output_dir = Path(options.output_dir)
    _check_output_dir(output_dir)
    backend = load_backend(target.flavour)
    name = options.name or spec.name
    cache_path = (options.timing_cache or output_dir / TIMING_CACHE_NAME) if options.use_timing_cache else None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".onnx-") as tmp:
        onnx_path = export_onnx(spec, weights, plan, Path(tmp) / f"{name}.onnx", options.routing_input)
        onnx_hash = onnx_sha256(onnx_path)
        logger = _Logger.make(backend)
        builder = backend.trt.Builder(logger)
        network, _parser = _parse(backend, builder, onnx_path, logger)
        config = builder.create_builder_config()
        compute_capability = backend.set_target_sm(config, target.sm)
        config.builder_optimization_level = options.optimization_level
        if options.workspace_bytes is not None:
            config.set_memory_pool_limit(backend.trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
        profile = builder.create_optimization_profile()
        p = target.profile
        for i in range(network.num_inputs):
            t = network.get_input(i)
            last = tuple(t.shape)[1:]
            profile.set_shape(t.name, (p.min, *last), (p.opt, *last), (p.max, *last))
        config.add_optimization_profile(profile)
        cache = _load_timing_cache(backend, config, cache_path)
        progress = make_progress() if options.progress else None
        if progress is not None and backend.has_progress_monitor:
            config.progress_monitor = make_monitor(backend, progress)
        with progress if progress is not None else contextlib.nullcontext():
            serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise MoeBuildError("build", "TensorRT could not build the engine: "
                                + (" | ".join(logger.errors)[:500] or "no error was logged"))
        engine = bytes(serialized)
        seconds = time.perf_counter() - start
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "name": name,
            "engine_file": f"{name}.engine",
            "engine_sha256": hashlib.sha256(engine).hexdigest(),
            "engine_bytes": len(engine),
            "onnx_sha256": onnx_hash,
            "weights_sha256": options.weights_sha256 or weights_sha256(weights),
            "spec": spec.to_dict(),
            "plan": plan.to_dict(),
            "flavour": {"name": backend.flavour.value, "version": backend.version},
            "target": {"sm": target.sm, "compute_capability": compute_capability},
            "profile": {"min": p.min, "opt": p.opt, "max": p.max},
            "graph": {"expert_compute": plan.stage("expert_compute").choice,
                      "routing_input": options.routing_input, **_describe_network(network)},
            "build": {"seconds": round(seconds, 3), "hostname": socket.gethostname(),
                      "moe_build_version": __version__, "optimization_level": options.optimization_level,
                      "workspace_bytes": options.workspace_bytes,
                      "timing_cache": str(cache_path) if cache is not None else None,
                      "created_unix": int(time.time())},
        }
        with _atomic_outputs(output_dir, (f"{name}.engine", f"{name}.json")) as temps:
            _write_bytes(temps[f"{name}.engine"], engine)
            _write_bytes(temps[f"{name}.json"], (json.dumps(manifest, indent=2) + "\n").encode())
        if cache is not None and cache_path is not None:
            _save_timing_cache(config, cache_path)
    return BuildResult(output_dir / f"{name}.engine", output_dir / f"{name}.json", manifest)


def _save_timing_cache(config: Any, path: Path) -> None:
    """Persist the (possibly grown) timing cache atomically; a cache is an optimisation, so a
    failure to save it never fails the build."""
    with contextlib.suppress(OSError):
        data = bytes(config.get_timing_cache().serialize())
        with _atomic_outputs(path.parent, (path.name,)) as temps:
            _write_bytes(temps[path.name], data)
