"""Verify an engine against its manifest and describe it.

Why both sources: TensorRT's EngineInspector needs a deserialised engine, which needs a GPU the
flavour supports; on machines without one the report shows what the builder recorded (I/O,
layers, plan) and says that deserialisation was unavailable, never pretending otherwise.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .errors import MoeBuildError, VerificationError
from .planner import Plan
from .spec import MoESpec

# TensorRT DataType names of the graph's input for each spec dtype.
TRT_DTYPE_NAMES = {"fp32": "FLOAT", "fp16": "HALF", "bf16": "BF16"}


def manifest_path_for(path: str | Path) -> tuple[Path, Path]:
    """(engine, manifest) paths from either of the two files' paths."""
    path = Path(path)
    base = path.with_suffix("") if path.suffix in (".engine", ".json") else path
    return base.with_suffix(".engine"), base.with_suffix(".json")


def _disagree(what: str, manifest_value: object, plan_value: object) -> VerificationError:
    return VerificationError(f"manifest and plan disagree on {what}: {manifest_value!r} vs {plan_value!r}")


def check_consistency(manifest: dict[str, Any]) -> Plan:
    """Manifest fields against the plan they claim to come from (path, spec, dtype, profile,
    target, expert compute). Returns the parsed plan."""
    try:
        plan = Plan.from_dict(manifest["plan"])
        spec = MoESpec.from_dict(manifest["spec"])
        graph, profile, target = manifest["graph"], manifest["profile"], manifest["target"]
    except (KeyError, TypeError, ValueError, MoeBuildError) as exc:
        raise VerificationError(f"manifest is incomplete or malformed: {type(exc).__name__}: {exc}") from None
    if plan.path != "ootb":
        raise _disagree("path", "ootb engine", plan.path)
    if plan.spec != manifest["spec"]:
        raise _disagree("spec", manifest["spec"], plan.spec)
    if plan.target.get("profile") != profile:
        raise _disagree("profile", profile, plan.target.get("profile"))
    if plan.target.get("sm") != target.get("sm"):
        raise _disagree("target sm", target.get("sm"), plan.target.get("sm"))
    if plan.target.get("flavour") != manifest["flavour"]["name"]:
        raise _disagree("flavour", manifest["flavour"]["name"], plan.target.get("flavour"))
    if plan.stage("expert_compute").choice != graph.get("expert_compute"):
        raise _disagree("expert_compute", graph.get("expert_compute"), plan.stage("expert_compute").choice)
    hidden = next((t for t in graph.get("inputs", []) if t["name"] == "hidden"), None)
    if hidden is None or hidden["dtype"] != TRT_DTYPE_NAMES[spec.dtype.value]:
        raise _disagree("dtype", None if hidden is None else hidden["dtype"], spec.dtype.value)
    return plan


def verify(path: str | Path) -> tuple[dict[str, Any], bytes]:
    """Read manifest + engine, check the engine's sha256 and the manifest/plan agreement.

    Raises VerificationError (exit 1) on a missing, tampered or mismatched pair.
    """
    engine_path, manifest_path = manifest_path_for(path)
    for p in (engine_path, manifest_path):
        if not p.is_file():
            raise VerificationError(f"{p} does not exist (an engine needs its manifest next to it)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise VerificationError(f"cannot read manifest {manifest_path}: {exc}") from None
    engine = engine_path.read_bytes()
    digest = hashlib.sha256(engine).hexdigest()
    if digest != manifest.get("engine_sha256"):
        raise VerificationError(f"{engine_path.name}: sha256 {digest[:16]}... does not match the manifest's "
                                f"{str(manifest.get('engine_sha256'))[:16]}... (engine modified or swapped)")
    if manifest.get("engine_file") != engine_path.name:
        raise VerificationError(f"manifest describes {manifest.get('engine_file')!r}, not {engine_path.name!r}")
    check_consistency(manifest)
    return manifest, engine


def _inspect_deserialised(manifest: dict[str, Any], engine: bytes) -> dict[str, Any]:
    """TensorRT's own view of the engine, or why it cannot be had on this machine."""
    from .runtime import deserialize, ensure_runnable_here
    try:
        backend, sm = ensure_runnable_here(manifest)
    except MoeBuildError as exc:
        return {"available": False, "reason": str(exc)}
    cuda_engine = deserialize(backend, engine)
    trt = backend.trt
    inspector = cuda_engine.create_engine_inspector()
    io = []
    for i in range(cuda_engine.num_io_tensors):
        name = cuda_engine.get_tensor_name(i)
        io.append({"name": name, "mode": cuda_engine.get_tensor_mode(name).name,
                   "dtype": cuda_engine.get_tensor_dtype(name).name, "shape": list(cuda_engine.get_tensor_shape(name))})
    layers = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return {"available": True, "device_sm": sm, "io": io, "layers": layers}


def inspect_engine(path: str | Path) -> dict[str, Any]:
    """Verify the engine/manifest pair and return a report dict (what `moe-build inspect` prints)."""
    manifest, engine = verify(path)
    graph = manifest["graph"]
    return {
        "verified": True,
        "engine": str(manifest_path_for(path)[0]),
        "engine_sha256": manifest["engine_sha256"],
        "engine_bytes": manifest["engine_bytes"],
        "flavour": manifest["flavour"],
        "target": manifest["target"],
        "profile": manifest["profile"],
        "spec": manifest["spec"],
        "plan_path": manifest["plan"]["path"],
        "expert_compute": graph["expert_compute"],
        "recorded": {"inputs": graph["inputs"], "outputs": graph["outputs"], "layers": graph["layers"]},
        "deserialised": _inspect_deserialised(manifest, engine),
        "build": manifest["build"],
    }
