"""Engine builds through Polygraphy's loaders: real TensorRT-RTX builds of the tiny spec, the plugin
path through a full-TensorRT double, manifest contents, atomic publishing, refusals.

The double (`full_tensorrt_double`) is `tensorrt_rtx_bindings` dressed as the module `tensorrt`:
its networks gain the `add_plugin_v3` only full TensorRT has (recorded, and standing in with an
identity layer so the network stays buildable), its `Weights` record the bytes each constant is made
from, and its builder records the build. Polygraphy binds one TensorRT module per process, so the
plugin-path builds (the tiny spec, and its FP8 variant) run this file as a script in a fresh process
(`python tests/test_engine_build.py OUT`), where `tensorrt` is the double from the start.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_build import outputs
from moe_build.engine import networks, publish
from moe_build.engine.build import BuildResult, build_engine
from moe_build.engine.manifest import verify
from moe_build.engine.options import BuildOptions
from moe_build.engine.progress import LineProgress
from moe_build.errors import MoeBuildError, UnsupportedCombination, VerificationError
from moe_build.graph.ootb import weights_sha256
from moe_build.planner import Plan, make_plan
from moe_build.spec import ActScale, DType, MoESpec, Quant, Routing, RoutingMethod, SharedExperts
from moe_build.spec.presets import get_preset
from moe_build.target import Flavour, Target, TokenProfile
from moe_build.weights import MoEWeights
from moe_build.weights.fp8 import ScaleGranularity
from moe_build.weights.woq import WoqKind

PROFILE = TokenProfile(1, 8, 64)
DOUBLE_VERSION = "10.13.0.35"  # what the double reports: a full TensorRT version Polygraphy accepts


def _target(sm: int = 89, flavour: Flavour = Flavour.TENSORRT_RTX) -> Target:
    return Target(sm=sm, flavour=flavour, profile=PROFILE)


def _tiny_plan(expert_compute: str = "dense_masked") -> Plan:
    return make_plan(get_preset("tiny"), _target(), force={"expert_compute": expert_compute})


def _plugin_plan(spec: MoESpec | None = None) -> Plan:
    plan = make_plan(spec or get_preset("tiny"), _target(flavour=Flavour.TENSORRT), tokens=8)
    assert plan.path == "plugin"
    return plan


def _fp8_plugin_case() -> tuple[MoESpec, MoEWeights]:
    """The tiny spec with FP8 experts: per-tensor weight scales, static activation scales (every scale input)."""
    spec = dataclasses.replace(get_preset("tiny"), quant=Quant.FP8, act_scale=ActScale.STATIC, name="tiny-fp8")
    weights = MoEWeights.random(spec, seed=3).quantized_fp8(ScaleGranularity.TENSOR, static=True, a1_scale=0.02,
                                                            a2_scale=0.03)
    return spec, weights


# weight-only plugin builds: name -> (quant, stored kind, group (None: per channel), zero points, AWQ scales)
WOQ_BUILDS = {"woq": (Quant.W4A16_AWQ, WoqKind.INT4, 32, True, True),
              "w8a16": (Quant.W8A16, WoqKind.INT8, None, False, False),
              "mxfp4": (Quant.WFP4A16, WoqKind.MXFP4, 32, False, False)}


def _woq_plugin_case(name: str = "woq") -> tuple[MoESpec, MoEWeights]:
    """The tiny spec with weight-only experts of WOQ_BUILDS[name]: "woq" as AutoAWQ stores them (int4 in groups of
    32 with zero points, and AWQ pre-quant scales), "w8a16" int8 per channel, "mxfp4" as GPT-OSS stores them."""
    quant, kind, group, zeros, awq = WOQ_BUILDS[name]
    tiny = get_preset("tiny")
    weights = MoEWeights.random(tiny, seed=4).quantized_woq(kind, group, asymmetric=zeros, awq=awq, seed=4)
    spec = dataclasses.replace(tiny, quant=quant, quant_group_size=group or 128, name=f"tiny-{name}",
                               **weights.woq.storage_flags())
    return spec, weights


def _full_plugin_case() -> tuple[MoESpec, MoEWeights]:
    """Every optional plugin input of an unquantized layer: expert biases, grouped sigmoid routing with a
    correction bias, a shared expert with its sigmoid gate (DeepSeek-style)."""
    spec = dataclasses.replace(get_preset("tiny"), expert_bias=True, name="tiny-full",
                               routing=Routing(RoutingMethod.SIGMOID_GROUPED, num_groups=4, topk_groups=2,
                                               correction_bias=True, renormalize=True, routed_scaling_factor=2.5),
                               shared=SharedExperts(count=1, intermediate_size=96, sigmoid_gate=True))
    return spec, MoEWeights.random(spec, seed=6)


def _options(out: Path, **kw: Any) -> BuildOptions:
    return BuildOptions(output_dir=out, progress=False, **kw)


# ---- the full-TensorRT double (runs in its own process) ---------------------------------------

# bytes per element of the DataTypes the plugin's constants use
ITEMSIZE = {"FP8": 1, "INT8": 1, "HALF": 2, "BF16": 2, "FLOAT": 4}


def full_tensorrt_double(calls: dict[str, list[Any]]) -> types.ModuleType:
    """`tensorrt_rtx_bindings` as the module `tensorrt`, recording add_plugin_v3, the constants' weights
    (type, size and sha256 of the bytes they point to) and the build in `calls`."""
    import tensorrt_rtx_bindings as rtx

    def weights(*args: Any) -> Any:
        if len(args) == 3:  # (DataType, pointer, count): what add_moe_plugin makes its constants from
            dtype, pointer, count = args
            data = ctypes.string_at(pointer, count * ITEMSIZE[dtype.name])
            calls["weights"].append([dtype.name, len(data), hashlib.sha256(data).hexdigest()])
        return rtx.Weights(*args)

    class RecordingNetwork:
        """An RTX network plus full TensorRT's add_plugin_v3 (as tests/test_plugin.py's double)."""

        def __init__(self, network: Any):
            self.network = network

        def __getattr__(self, name: str) -> Any:
            return getattr(self.network, name)

        def __iter__(self) -> Any:
            return iter(self.network)

        def __len__(self) -> int:
            return len(self.network)

        def add_plugin_v3(self, inputs: list[Any], shape_inputs: list[Any], plugin: Any) -> Any:
            calls["plugin"].append({"inputs": [(t.name, t.dtype.name, list(t.shape)) for t in inputs],
                                    "plugin": type(plugin).__name__, "fields": sorted(
                                        f.name for f in plugin.get_fields_to_serialize())})
            return self.network.add_identity(inputs[0])  # a real layer, so the network stays buildable

    class Builder:
        def __init__(self, logger: Any):
            self.builder = rtx.Builder(logger)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.builder, name)

        def create_network(self, flags: int = 0) -> RecordingNetwork:
            return RecordingNetwork(self.builder.create_network(flags))

        def build_serialized_network(self, network: RecordingNetwork, config: Any) -> Any:
            strongly_typed = network.get_flag(rtx.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
            calls["build"].append({"layers": [(network.get_layer(i).name, network.get_layer(i).type.name)
                                              for i in range(network.num_layers)],
                                   "optimization_level": config.builder_optimization_level,
                                   "strongly_typed": strongly_typed})
            return self.builder.build_serialized_network(network.network, config)

    double = types.ModuleType("tensorrt")
    double.__dict__.update({k: getattr(rtx, k) for k in dir(rtx) if not k.startswith("__")})
    double.__version__ = DOUBLE_VERSION
    double.Builder, double.INetworkDefinition, double.Weights = Builder, RecordingNetwork, weights
    return double


def build_plugin_engines_with_double(out: Path) -> dict[str, dict[str, Any]]:
    """The plugin-path builds of the tiny spec ("unquantized") and of its FP8 ("fp8") and weight-only (WOQ_BUILDS)
    variants with the double as full TensorRT, one after the other in this process (fresh process only)."""
    calls: dict[str, list[Any]] = {"plugin": [], "build": [], "weights": []}
    sys.modules["tensorrt"] = full_tensorrt_double(calls)
    from moe_build.engine.polygraphy_trt import RTX_ENV, bound_module_name
    tiny = get_preset("tiny")
    results = {}
    for key, (spec, weights) in {"unquantized": (tiny, MoEWeights.random(tiny, seed=2)),
                                 "fp8": _fp8_plugin_case(), "full": _full_plugin_case(),
                                 **{n: _woq_plugin_case(n) for n in WOQ_BUILDS}}.items():
        for recorded in calls.values():
            recorded.clear()
        progress = io.StringIO()
        with LineProgress(spec.name, progress) as lines:
            result = build_engine(spec, weights, _plugin_plan(spec), BuildOptions(output_dir=out, workspace_mib=16),
                                  lines)
        import polygraphy.backend.trt.loader as loader
        results[key] = {"calls": json.loads(json.dumps(calls)), "manifest": result.manifest,
                        "engine_path": str(result.engine_path), "progress": progress.getvalue().splitlines(),
                        "bound": bound_module_name(), "env": os.environ[RTX_ENV],
                        "polygraphy_trt_version": loader.trt.__version__}
    for sm in (100, 120):  # a plugin-path plan for an SM the kernel library has no code for
        plan = make_plan(tiny, _target(sm=sm, flavour=Flavour.TENSORRT), tokens=8)
        try:
            build_engine(tiny, UnreadableWeights(), plan, BuildOptions(output_dir=out / f"sm{sm}"))  # type: ignore
            results[f"sm{sm}"] = {"refused": None}
        except MoeBuildError as exc:
            results[f"sm{sm}"] = {"refused": str(exc), "field": exc.field,
                                  "out_exists": (out / f"sm{sm}").exists()}
    return results


# ---- OOTB builds: real TensorRT-RTX engines -----------------------------------------------------

pytestmark = pytest.mark.trt


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildResult, MoEWeights]:
    pytest.importorskip("tensorrt_rtx_bindings")
    spec = get_preset("tiny")
    weights = MoEWeights.random(spec, seed=1)
    out = tmp_path_factory.mktemp("engines")
    return build_engine(spec, weights, _tiny_plan(), _options(out)), weights


def test_manifest_records_the_build(tiny_build: tuple[BuildResult, MoEWeights]) -> None:
    result, weights = tiny_build
    m = json.loads(result.manifest_path.read_text())
    engine = result.engine_path.read_bytes()
    assert result.engine_path.name == "tiny.engine" and m["engine_file"] == "tiny.engine" and m == result.manifest
    assert m["engine_sha256"] == hashlib.sha256(engine).hexdigest() and m["engine_bytes"] == len(engine)
    assert m["weights_sha256"] == weights_sha256(weights)
    assert len(m["onnx_sha256"]) == 64
    import tensorrt_rtx_bindings as trt
    assert m["flavour"] == {"name": "tensorrt-rtx", "version": trt.__version__}
    assert m["target"] == {"sm": 89, "compute_capability": "SM89"}
    assert m["profile"] == {"min": 1, "opt": 8, "max": 64}
    assert m["spec"] == get_preset("tiny").to_dict() and m["plan"]["spec"] == m["spec"]
    assert m["plan"]["path"] == "ootb" and m["graph"]["expert_compute"] == "dense_masked"
    assert "plugin" not in m["graph"] and m["graph"]["routing_input"] == "hidden"
    assert m["graph"]["inputs"] == [{"name": "hidden", "dtype": "HALF", "shape": [-1, 64]}]
    assert m["graph"]["outputs"][0]["name"] == "output" and m["graph"]["layers"]
    assert m["build"]["seconds"] > 0 and m["build"]["hostname"] and m["build"]["moe_build_version"]
    assert m["build"]["timing_cache"] is None  # timing-cache operations are no-ops in TensorRT-RTX
    assert sorted(p.name for p in result.engine_path.parent.iterdir()) == ["tiny.engine", "tiny.json"]
    assert verify(result.engine_path)[1] == engine  # the hashes verify


def test_ootb_build_went_through_polygraphy_bound_to_tensorrt_rtx(tiny_build: tuple[BuildResult, MoEWeights]) -> None:
    import polygraphy.backend.trt.loader as loader
    import tensorrt_rtx_bindings
    from moe_build.engine.polygraphy_trt import RTX_ENV, bound_module_name
    assert bound_module_name() == "tensorrt_rtx" and os.environ[RTX_ENV] == "1"
    assert sys.modules["tensorrt_rtx"] is tensorrt_rtx_bindings
    assert loader.trt.__version__ == tensorrt_rtx_bindings.__version__


def test_a_second_flavour_in_one_process_is_refused(tiny_build: tuple[BuildResult, MoEWeights]) -> None:
    from moe_build.engine.backend import Backend
    from moe_build.engine.polygraphy_trt import polygraphy_loaders
    with pytest.raises(MoeBuildError, match="bound to `tensorrt_rtx` in this process.*separate process"):
        polygraphy_loaders(Backend(Flavour.TENSORRT, types.ModuleType("tensorrt")))


def test_polygraphy_imported_first_by_someone_else_still_builds(tmp_path: Path) -> None:
    """Polygraphy's TensorRT backend already imported in RTX mode (env set by the user), before any
    moe-build build: the binding adopts it, and supplies the `tensorrt_rtx` name it will import."""
    pytest.importorskip("tensorrt_rtx_bindings")
    code = ("import polygraphy.backend.trt, sys; from pathlib import Path; "
            "from moe_build.engine.build import build_engine; from moe_build.engine.options import BuildOptions; "
            "from moe_build.spec.presets import get_preset; from moe_build.weights import MoEWeights; "
            "import test_engine_build as t; spec = get_preset('tiny'); "
            "r = build_engine(spec, MoEWeights.random(spec), t._tiny_plan(), "
            "BuildOptions(output_dir=Path(sys.argv[1]), progress=False)); print(r.manifest['flavour']['name'])")
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "POLYGRAPHY_USE_TENSORRT_RTX": "1", "PYTHONPATH": path})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "tensorrt-rtx" and (tmp_path / "tiny.engine").exists()


def test_bf16_sm86_with_logits_input_and_options(tiny_build: tuple[BuildResult, MoEWeights]) -> None:
    result, _ = tiny_build
    spec = dataclasses.replace(get_preset("tiny"), dtype=DType.BF16, name="tiny-bf16")
    plan = make_plan(spec, _target(86), force={"expert_compute": "dense_masked"})
    r = build_engine(spec, MoEWeights.random(spec), plan,
                     _options(result.engine_path.parent, routing_input="logits", optimization_level=1,
                              workspace_mib=8))
    assert r.manifest["target"]["compute_capability"] == "SM86"
    assert [i["name"] for i in r.manifest["graph"]["inputs"]] == ["hidden", "router_logits"]
    assert r.manifest["graph"]["inputs"][0]["dtype"] == "BF16"
    assert r.manifest["build"]["optimization_level"] == 1 and r.manifest["build"]["workspace_bytes"] == 8 << 20


def test_every_phase_is_shown(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    spec, stream = get_preset("tiny"), io.StringIO()
    with LineProgress("tiny", stream) as progress:
        build_engine(spec, MoEWeights.random(spec), _tiny_plan(), _options(tmp_path), progress)
    lines = stream.getvalue().splitlines()
    ours = [line for line in lines if "TensorRT:" not in line]
    assert ours == ["tiny: exporting ONNX", "tiny: parsing ONNX", "tiny: building engine (TensorRT)",
                    "tiny: writing engine + manifest"]
    assert "tiny:   TensorRT: Building engine" in lines  # TensorRT's own top-level phase, one line


# ---- atomic publishing ------------------------------------------------------------------------

def _fail_parse(spec: Any, weights: Any, plan: Any, path: Path, routing_input: str) -> Path:
    Path(path).write_bytes(b"not an onnx model")
    return Path(path)


def _interrupt(*args: Any, **kwargs: Any) -> Any:
    raise KeyboardInterrupt


class CtrlCInTensorRT(LineProgress):
    """Ctrl-C arriving while TensorRT builds, where a Python handler would run next: inside one of the
    progress monitor's callbacks (`at`), the first time TensorRT calls it."""

    def __init__(self, at: str) -> None:
        super().__init__("tiny", io.StringIO())
        self.at, self.sent = at, False

    def _send(self, where: str) -> None:
        if where == self.at and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    def trt_phase_start(self, name: str, parent: str | None, steps: int) -> None:
        self._send("phase_start")

    def trt_step(self, name: str, step: int) -> None:
        self._send("step")

    def trt_phase_finish(self, name: str) -> None:
        self._send("phase_finish")


@pytest.mark.parametrize("fail_at", ["parse", "export_interrupted", "trt_phase_start_interrupted",
                                     "trt_step_interrupted", "trt_phase_finish_interrupted", "manifest_write",
                                     "commit_interrupted"])
def test_failed_or_interrupted_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    request: pytest.FixtureRequest, fail_at: str) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    spec = get_preset("tiny")
    expected: type[BaseException] = MoeBuildError
    progress = None
    if fail_at.startswith("trt_"):
        # a real SIGINT under Python's own handler (set here: pytest started in the background by a
        # non-interactive shell has SIGINT ignored): held while TensorRT builds (a KeyboardInterrupt raised in
        # TensorRT's callback would fail the build as "Invalid Engine"), the build cancelled, then raised
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
        progress = CtrlCInTensorRT(fail_at.removeprefix("trt_").removesuffix("_interrupted"))
        expected = KeyboardInterrupt
    elif fail_at == "parse":
        monkeypatch.setattr(networks, "export_onnx", _fail_parse)
    elif fail_at == "export_interrupted":
        monkeypatch.setattr(networks, "export_onnx", _interrupt)
        expected = KeyboardInterrupt
    elif fail_at == "manifest_write":
        real_write = publish._write_temp

        def write(folder: Path, final_name: str, data: bytes) -> Path:
            if final_name.endswith(".json"):
                raise OSError("disk full")
            return real_write(folder, final_name, data)
        monkeypatch.setattr(publish, "_write_temp", write)
        expected = OSError
    else:
        real_replace, calls = os.replace, []

        def replace(src: Any, dst: Any) -> None:
            calls.append(dst)
            if len(calls) == 2:  # the engine is in place; the manifest's rename is the commit
                raise KeyboardInterrupt
            real_replace(src, dst)
        monkeypatch.setattr(publish.os, "replace", replace)
        expected = KeyboardInterrupt
    with pytest.raises(expected) as exc:
        build_engine(spec, MoEWeights.random(spec), _tiny_plan(), _options(tmp_path), progress)
    if progress is not None:
        assert progress.sent, f"TensorRT never called the monitor's {progress.at}"
    if fail_at == "parse":
        assert exc.value.field == "build" and "ONNX" in str(exc.value) and len(str(exc.value).splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_ignored_sigint_does_not_cancel_the_build(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A build in a job whose SIGINT is ignored (started in the background by a non-interactive shell) is not
    cancelled by one: the signal stays ignored while TensorRT builds, and the engine is published."""
    pytest.importorskip("tensorrt_rtx_bindings")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    progress = CtrlCInTensorRT("step")
    result = build_engine(get_preset("tiny"), MoEWeights.random(get_preset("tiny")), _tiny_plan(),
                          _options(tmp_path), progress)
    assert progress.sent and result.engine_path.is_file() and result.manifest_path.is_file()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_rebuild_replaces_the_pair(tiny_build: tuple[BuildResult, MoEWeights], tmp_path: Path) -> None:
    result, _ = tiny_build
    for suffix in (".engine", ".json"):
        (tmp_path / f"tiny{suffix}").write_bytes(result.engine_path.with_suffix(suffix).read_bytes())
    spec = get_preset("tiny")
    r = build_engine(spec, MoEWeights.random(spec, seed=9), _tiny_plan(), _options(tmp_path))
    assert r.manifest["weights_sha256"] != result.manifest["weights_sha256"]
    assert verify(tmp_path / "tiny.engine")[0] == r.manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.engine", "tiny.json"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temps_of_dead_processes_are_swept(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    dead, me = _dead_pid(), os.getpid()
    start = outputs.process_start(me) or 0
    stale_file = tmp_path / f"{outputs.TEMP_PREFIX}{dead}-123-ab12cd34.tiny.engine"
    stale_dir = tmp_path / f"{outputs.TEMP_PREFIX}{dead}-123-xyz.onnx"
    reused_pid = tmp_path / f"{outputs.TEMP_PREFIX}{me}-{start + 1}-ab12cd34.tiny.json"  # our PID, not our start
    live = tmp_path / f"{outputs.TEMP_PREFIX}{me}-{start}-ab12cd34.other.engine"
    unrelated = tmp_path / ".moe-build-tmp-notes.txt"
    for path in (stale_file, reused_pid, live, unrelated):
        path.write_bytes(b"x")
    stale_dir.mkdir()
    (stale_dir / "tiny.onnx").write_bytes(b"x")
    spec = get_preset("tiny")
    build_engine(spec, MoEWeights.random(spec), _tiny_plan(), _options(tmp_path))
    left = sorted(p.name for p in tmp_path.iterdir())
    if outputs.process_start(me) is None:  # no /proc: a live PID keeps its files whatever their start time
        assert left == sorted([live.name, reused_pid.name, unrelated.name, "tiny.engine", "tiny.json"])
    else:
        assert left == sorted([live.name, unrelated.name, "tiny.engine", "tiny.json"])


# ---- refusals before any work -----------------------------------------------------------------

class UnreadableWeights:
    """Weights that fail if anything touches them: a refusal must come first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"weights.{name} was read before the refusal")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="full TensorRT is installed here")
def test_plugin_path_without_full_tensorrt_is_refused_before_any_work(tmp_path: Path) -> None:
    spec = get_preset("tiny")
    out = tmp_path / "engines"
    with pytest.raises(MoeBuildError) as exc:
        build_engine(spec, UnreadableWeights(), _plugin_plan(), _options(out))  # type: ignore[arg-type]
    text = str(exc.value)
    assert exc.value.field == "path" and exc.value.exit_code == 2 and len(text.splitlines()) == 1
    assert "plugin path, which needs full TensorRT (add_plugin_v3); TensorRT is not installed here" in text
    assert "pip install 'moe-build[trt]'" in text and "--flavour tensorrt-rtx --sm 89" in text
    assert not out.exists()


@pytest.mark.parametrize("options,field", [
    ({"optimization_level": 6}, "opt_level"),
    ({"workspace_mib": 0}, "workspace_mb"),
    ({"routing_input": "router"}, "routing_input"),
])
def test_bad_options_are_refused_before_any_work(tmp_path: Path, options: dict[str, Any], field: str) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    with pytest.raises(MoeBuildError) as exc:
        build_engine(get_preset("tiny"), UnreadableWeights(), _tiny_plan(),  # type: ignore[arg-type]
                     _options(tmp_path / "o", **options))
    assert exc.value.field == field
    if field == "workspace_mb":
        assert "0 MiB" in str(exc.value)
    assert not (tmp_path / "o").exists()


def test_unwritable_output_folder(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(MoeBuildError) as exc:
        build_engine(get_preset("tiny"), UnreadableWeights(), _tiny_plan(),  # type: ignore[arg-type]
                     _options(blocker / "engines"))
    assert exc.value.field == "output" and exc.value.exit_code == 2


def test_min_greater_than_max_profile_is_refused() -> None:
    with pytest.raises(MoeBuildError) as exc:
        TokenProfile(min=64, opt=8, max=1)
    assert "min_tokens" in exc.value.field and exc.value.exit_code == 2


def test_per_expert_gather_is_refused_on_rtx_by_the_planner() -> None:
    # TensorRT-RTX has no NonZero runner (docs/tensorrt_rtx.md), so the planner never asks for it there.
    spec = dataclasses.replace(get_preset("tiny"), num_experts=64)
    rtx = Target(sm=89, flavour=Flavour.TENSORRT_RTX)
    assert make_plan(spec, rtx).stage("expert_compute").choice == "dense_masked"
    with pytest.raises(UnsupportedCombination) as exc:
        make_plan(spec, rtx, force={"expert_compute": "per_expert_gather"})
    assert exc.value.rule == "ootb_nonzero"


def test_plan_for_another_spec_is_refused(tmp_path: Path) -> None:
    spec = dataclasses.replace(get_preset("tiny"), top_k=1)
    with pytest.raises(MoeBuildError) as exc:
        build_engine(spec, MoEWeights.random(spec), _tiny_plan(), _options(tmp_path))
    assert exc.value.field == "plan"


def test_progress_monitor_drives_rich_tasks() -> None:
    pytest.importorskip("tensorrt_rtx_bindings")
    from rich.console import Console

    from moe_build.engine.backend import load_backend
    from moe_build.engine.interrupts import HeldInterrupts
    from moe_build.engine.progress import RichProgress, make_monitor
    progress = RichProgress("tiny", Console(file=io.StringIO(), force_terminal=True))
    with progress:
        progress.begin("building engine (TensorRT)")
        held = HeldInterrupts()
        monitor = make_monitor(load_backend("tensorrt-rtx"), progress, held)
        monitor.phase_start("Building engine", None, 3)
        assert monitor.step_complete("Building engine", 1) is True
        phase, trt_phase = progress._progress.tasks
        assert trt_phase.total == 3 and trt_phase.completed == 2 and phase.total is None
        held.pending = signal.SIGINT  # a held Ctrl-C: TensorRT is told to stop at its next step
        assert monitor.step_complete("Building engine", 2) is False
        held.pending = None
        monitor.phase_finish("Building engine")
        assert [t.description for t in progress._progress.tasks] == ["tiny: building engine (TensorRT)"]
    assert progress._progress.tasks[0].finished


# ---- the plugin path through the full-TensorRT double -----------------------------------------

@pytest.fixture(scope="module")
def plugin_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    pytest.importorskip("tensorrt_rtx_bindings")
    out = tmp_path_factory.mktemp("plugin-engines")
    r = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "POLYGRAPHY_USE_TENSORRT_RTX": "1"})  # the binding must override it
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plugin_build(plugin_builds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return plugin_builds["unquantized"]


def test_plugin_path_goes_through_the_loaders_to_the_builder(plugin_build: dict[str, Any]) -> None:
    calls = plugin_build["calls"]
    assert plugin_build["bound"] == "tensorrt" and plugin_build["env"] == "0"  # Polygraphy on full TensorRT
    assert plugin_build["polygraphy_trt_version"] == DOUBLE_VERSION
    (plugin,) = calls["plugin"]
    assert plugin["plugin"] == "MoEPlugin" and plugin["fields"] == ["ep_rank", "ep_size", "plan", "spec"]
    assert plugin["inputs"][:2] == [["hidden", "HALF", [-1, 64]], ["router_logits", "HALF", [-1, 8]]]
    assert [name for name, _, _ in plugin["inputs"][2:]] == ["moe.w1_output", "moe.w2_output"]
    (build,) = calls["build"]
    assert build["strongly_typed"] and build["optimization_level"] == 3
    assert [layer for layer in build["layers"] if layer[1] == "CONSTANT"] == [["moe.w1", "CONSTANT"],
                                                                              ["moe.w2", "CONSTANT"]]
    assert plugin_build["progress"][0] == "tiny: adding the MoE plugin layer"
    assert plugin_build["progress"][-1] == "tiny: writing engine + manifest"


def test_plugin_path_for_an_sm_without_kernels_is_refused_before_any_work(
        plugin_builds: dict[str, dict[str, Any]]) -> None:
    """With full TensorRT, an SM 10.x / 12.x plugin-path plan would build an engine whose enqueue has no kernels to
    run: refused first, naming the SM, and no weight read."""
    for sm in (100, 120):
        r = plugin_builds[f"sm{sm}"]
        assert r["refused"] is not None and r["field"] == "sm" and not r["out_exists"], r
        assert r["refused"].startswith(f"sm: moe-build's CUDA kernels are built for SM 8.x and 9.0; sm{sm} has none")


def test_plugin_manifest_records_the_plan_whole(plugin_build: dict[str, Any]) -> None:
    m, plan = plugin_build["manifest"], _plugin_plan()
    assert m["plan"] == json.loads(json.dumps(plan.to_dict()))
    assert m["flavour"] == {"name": "tensorrt", "version": DOUBLE_VERSION} and m["onnx_sha256"] is None
    assert m["target"] == {"sm": 89, "compute_capability": None}  # full TensorRT builds for the GPU it runs on
    graph = m["graph"]
    assert "expert_compute" not in graph and graph["routing_input"] == "logits"
    assert graph["plugin"] == {"name": "MoEPlugin", "namespace": "moe_build", "version": "1", "weights": "constants",
                               "choices": plan.choices()}
    assert {"weight_layout", "w1_order", "gemm1_tactic", "gemm2_tactic"} <= set(graph["plugin"]["choices"])
    assert m["build"]["workspace_bytes"] == 16 << 20
    manifest, _ = verify(plugin_build["engine_path"])  # path-aware consistency holds, hashes verify
    assert manifest == m


def test_fp8_plugin_build_bakes_fp8_weights_and_fp32_scales(plugin_builds: dict[str, dict[str, Any]]) -> None:
    """The FP8 layer through the loaders: W1 / W2 become FP8 constants holding the checkpoint's e4m3 bytes,
    the scales fp32 constants (per-tensor weight scales repeated per channel), all in the plugin's slot order,
    and the manifest records the quant mode with the checkpoint's granularity."""
    from moe_build.plugins.slots import input_slots, plan_weights
    fp8 = plugin_builds["fp8"]
    spec, weights = _fp8_plugin_case()
    plan = _plugin_plan(spec)
    slots = input_slots(spec)[2:]
    (plugin,) = fp8["calls"]["plugin"]
    assert plugin["inputs"][:2] == [["hidden", "HALF", [-1, 64]], ["router_logits", "HALF", [-1, 8]]]
    assert plugin["inputs"][2:] == [[f"moe.{s.name}_output", "FP8" if s.name in ("w1", "w2") else "FLOAT",
                                     list(s.shape)] for s in slots]
    assert [s.name for s in slots] == ["w1", "w2", "fp8.w1_scale", "fp8.w2_scale", "fp8.a1_scale", "fp8.a2_scale"]
    planned = dict(plan_weights(plan, weights).named())

    def record(name: str, dtype: str) -> list[Any]:
        data = planned[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return [dtype, len(data), hashlib.sha256(data).hexdigest()]

    assert fp8["calls"]["weights"] == [record(s.name, "FP8" if s.name in ("w1", "w2") else "FLOAT") for s in slots]
    raw = weights.w1.contiguous().view(torch.uint8).numpy().tobytes()  # the stored e4m3 bytes, as given
    assert fp8["calls"]["weights"][0] == ["FP8", len(raw), hashlib.sha256(raw).hexdigest()]
    assert planned["fp8.w1_scale"].shape == (8, 256)  # one scale per output row of W1 (N1 = 2 * 128)
    (build,) = fp8["calls"]["build"]
    assert [name for name, kind in build["layers"] if kind == "CONSTANT"] == [f"moe.{s.name}" for s in slots]
    m = fp8["manifest"]
    assert m["quant"] == {"mode": "fp8", "weight_scale_granularity": "tensor", "act_scale": "static",
                          "weight_storage": None}
    assert m["spec"]["quant"] == "fp8" and m["graph"]["plugin"]["choices"] == plan.choices()
    assert m["weights_sha256"] == weights_sha256(weights)
    assert verify(fp8["engine_path"])[0] == m


def test_woq_plugin_build_records_the_stored_form(plugin_builds: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """A weight-only layer through the loaders: W1 / W2 baked as the packed uint8 codes as loaded, and the
    manifest's quant record names that stored form (kind, packing, group, zero points, pre-quant scales), which
    verify() holds against the spec: a manifest claiming another form is refused."""
    woq = plugin_builds["woq"]
    spec, weights = _woq_plugin_case()
    (plugin,) = woq["calls"]["plugin"]
    # the uint8 codes, scales' zero points cross as INT8 constants (TensorRT's constants take no UINT8)
    assert [(name, dtype) for name, dtype, _ in plugin["inputs"][2:]] == [
        ("moe.w1_output", "INT8"), ("moe.w2_output", "INT8"), ("moe.woq.w1_scale_output", "FLOAT"),
        ("moe.woq.w2_scale_output", "FLOAT"), ("moe.woq.w1_zero_output", "INT8"), ("moe.woq.w2_zero_output", "INT8"),
        ("moe.woq.fc1_act_scale_output", "FLOAT"), ("moe.woq.fc2_act_scale_output", "FLOAT")]
    raw = weights.woq.w1.contiguous().numpy().tobytes()  # the codes as the reader stored them, byte for byte
    assert woq["calls"]["weights"][0] == ["INT8", len(raw), hashlib.sha256(raw).hexdigest()]
    zeros = weights.woq.w1_zero.contiguous().numpy().tobytes()
    assert woq["calls"]["weights"][4] == ["INT8", len(zeros), hashlib.sha256(zeros).hexdigest()]
    m = woq["manifest"]
    assert m["quant"] == {"mode": "w4a16_awq", "weight_scale_granularity": "group32", "act_scale": None,
                          "weight_storage": {"kind": "int4",
                                             "weights": "uint8 [E, out, in/2], two codes a byte, the low nibble "
                                                        "the even column",
                                             "scales": "fp32 [E, out, in/32]",
                                             "zero_points": "uint8 [E, out, in/32] in 0..15",
                                             "prequant_scales": "fp32 [hidden], [intermediate]",
                                             "granularity": "group32"}}
    assert verify(woq["engine_path"])[0] == m
    from rich.console import Console

    from moe_build.engine.inspect import inspect_engine, render_inspection
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    render_inspection(inspect_engine(woq["engine_path"]), console)
    assert "w4a16_awq: int4 weights, group32 scales, zero points, pre-quant scales" in console.file.getvalue()
    engine = Path(woq["engine_path"])
    for field, value in (("zero_points", None), ("kind", "int8")):
        folder = tmp_path / field
        folder.mkdir()
        (folder / engine.name).write_bytes(engine.read_bytes())
        tampered = json.loads(json.dumps(m))
        tampered["quant"]["weight_storage"][field] = value
        (folder / engine.with_suffix(".json").name).write_text(json.dumps(tampered))
        with pytest.raises(VerificationError, match="weight_storage"):
            verify(folder / engine.name)


def test_every_optional_input_builds(plugin_builds: dict[str, dict[str, Any]]) -> None:
    """Biases, the correction bias and the shared expert with its gate go in as constants in the plugin's slot
    order, each holding the given tensor's bytes in the slot's dtype, and the manifest verifies."""
    from moe_build.plugins.slots import input_slots, plan_weights
    build = plugin_builds["full"]
    spec, weights = _full_plugin_case()
    slots = input_slots(spec)[2:]
    assert [s.name for s in slots] == ["w1", "w2", "b1", "b2", "correction_bias", "shared_w1", "shared_w2",
                                       "shared_gate"]
    (plugin,) = build["calls"]["plugin"]
    assert [name for name, _, _ in plugin["inputs"][2:]] == [f"moe.{s.name}_output" for s in slots]
    planned = dict(plan_weights(_plugin_plan(spec), weights).named())
    for slot, got in zip(slots, build["calls"]["weights"]):
        data = planned[slot.name].to(slot.dtypes[0]).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert got[1:] == [len(data), hashlib.sha256(data).hexdigest()], slot.name
    assert verify(build["engine_path"])[0] == build["manifest"]


@pytest.mark.parametrize("name, weight_type, scale_type", [("w8a16", "INT8", "FLOAT"), ("mxfp4", "INT8", "INT8")])
def test_other_weight_only_plugin_builds_verify(plugin_builds: dict[str, dict[str, Any]], name: str,
                                                weight_type: str, scale_type: str) -> None:
    """int8 per-channel and MXFP4 experts build through the loaders too: W1 / W2 and the e8m0 exponents as INT8
    constants holding the stored bytes, and a manifest whose stored form verify() holds against the spec."""
    build = plugin_builds[name]
    spec, weights = _woq_plugin_case(name)
    (plugin,) = build["calls"]["plugin"]
    assert [dtype for _, dtype, _ in plugin["inputs"][2:6]] == [weight_type, weight_type, scale_type, scale_type]
    raw = weights.woq.w2_scale.contiguous().numpy().tobytes()
    assert build["calls"]["weights"][3] == [scale_type, len(raw), hashlib.sha256(raw).hexdigest()]
    m = build["manifest"]
    assert m["quant"]["weight_storage"]["kind"] == WOQ_BUILDS[name][1].value
    assert m["quant"]["weight_scale_granularity"] == ("channel" if name == "w8a16" else "group32")
    assert verify(build["engine_path"])[0] == m


if __name__ == "__main__":
    print(json.dumps(build_plugin_engines_with_double(Path(sys.argv[1]))))
