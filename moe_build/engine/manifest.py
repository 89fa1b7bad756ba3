"""The manifest next to every engine: what it was built from, and the checks that it still says so.

Why one module for both: the fields written at build time are the fields verified before an
engine is inspected or loaded. Schema `moe-build.manifest/14` (/4: the plan inside is `moe-build.plan/4`, with
token bands, weight layouts, GEMM tactics, the FP8 activation-quantization stages and expert parallelism's
`dispatch`; and the `ep` record; /5: the weight-only experts' stored form; /6: `moe-build.plan/5`, with
expert parallelism's `ep_format`; /7: `moe-build.plan/6`, with the FP8 GEMMs' `fp8_accumulation`; /8:
`moe-build.plan/7`, with the nccl dispatch's `nccl_exchange`; /9: `moe-build.plan/8`, with the weight-only
digits tile's `token_digits`; /10: `moe-build.plan/9`, with `routing`, the routing inside the fused prologue;
/11: `moe-build.plan/10`, with the path gate `plugin_kernels_sm`, whether moe-build's kernels run the plugin plan
on its SM; /12: `moe-build.plan/11`, whose `routing=prologue` holds in the three-step prologue too, which an older
runtime would run without routing; /13: `moe-build.plan/12`, with the FP8 row steps' kernels, the `*_tactic` stages of
the expansion, the activation and the quantize steps, which the kernels now take from the plan; /14:
`moe-build.plan/13`, whose `weight_layout` may be `int4_tiles` (a weight-only layer's int4 codes, its w1 / w2, in
16-row tiles), which an older runtime would read as rows):
- name, engine_file, engine_sha256, engine_bytes: the engine it describes (content-addressed);
- onnx_sha256 (OOTB; null on the plugin path, which has no ONNX), weights_sha256;
- spec, and the plan recorded whole (path, every stage with its gates; on the plugin path this
  includes the weight layout and the two GEMM tactics the runner will use);
- quant {mode, weight_scale_granularity, act_scale, weight_storage}: the quant mode; for FP8 experts the
  weights' scale granularity (tensor, channel, block128) and whether activation scales are static (in the
  engine) or dynamic (computed per row or 128-group at run time); for weight-only experts (w4a16_awq, w8a16,
  w4afp8, wfp4a16) the granularity (channel, group32 / 64 / 128) and `weight_storage`, the canonical form the
  checkpoint was converted to once, on load, which the kernels read as it is (moe_build/weights/woq.py:
  stored_form); null where it does not apply;
- flavour {name, version}, target {sm, compute_capability}, profile {min, opt, max};
- graph: routing_input, inputs, outputs, layers, and the path's own record: `expert_compute`
  (OOTB) or `plugin` {name, namespace, version, weights, choices} (plugin path);
- build: seconds, hostname, moe_build_version, optimization_level, workspace_bytes,
  timing_cache, created_unix;
- ep: null for a layer on one GPU (ep_size 1), else {size, rank, experts: [first, last_exclusive], dispatch}:
  the engine is rank `rank` of `size` and holds the weights of global experts first .. last_exclusive - 1
  only; dispatch is the plan's (`allreduce`, OOTB: the engine computes its experts over every token and its
  output is this rank's partial sum, which the ranks add; `nvlink` / `nccl`, plugin: tokens travel to their
  experts' ranks and back through ExpertParallelMoE). Why a record of its own: a reader must know an engine's output
  is not the layer's before using it, without re-deriving it from the spec.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from ..errors import MoeBuildError, VerificationError
from ..jsonfile import read_json_object
from ..planner import Plan
from ..spec import MoESpec, Quant
from ..weights.woq import QUANT_KIND, stored_form

MANIFEST_SCHEMA = "moe-build.manifest/14"
# TensorRT DataType names of the graph's input for each spec dtype.
TRT_DTYPE_NAMES = {"fp32": "FLOAT", "fp16": "HALF", "bf16": "BF16"}
PATHS = ("ootb", "plugin")
FP8_QUANTS = (Quant.FP8, Quant.FP8_BLOCK)
# Weight-scale granularities each quant mode's weights can carry (moe_build/weights/fp8.py).
GRANULARITIES = {Quant.FP8: ("tensor", "channel"), Quant.FP8_BLOCK: ("block128",)}
READ_ATTEMPTS = 3  # re-reads when a build publishes the pair while it is being read


def manifest_path_for(path: str | Path) -> tuple[Path, Path]:
    """(engine, manifest) paths from either of the two files' paths."""
    path = Path(path)
    base = path.with_suffix("") if path.suffix in (".engine", ".json") else path
    return base.with_suffix(".engine"), base.with_suffix(".json")


def describe_network(network: Any) -> dict[str, Any]:
    """What inspect shows where the engine cannot be deserialised: I/O and the layer list."""
    def tensor(t: Any) -> dict[str, Any]:
        return {"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape)}

    return {
        "inputs": [tensor(network.get_input(i)) for i in range(network.num_inputs)],
        "outputs": [tensor(network.get_output(i)) for i in range(network.num_outputs)],
        "layers": [{"name": network.get_layer(i).name, "type": network.get_layer(i).type.name}
                   for i in range(network.num_layers)],
    }


def quant_record(spec: MoESpec, weight_scale_granularity: str | None) -> dict[str, Any]:
    """The manifest's `quant` (the schema above): what a reader of the engine must know of its numbers
    that the spec alone does not say (FP8: the weights' scale granularity, given; weight-only: the stored form,
    from the spec)."""
    fp8 = spec.quant in FP8_QUANTS
    storage = stored_form(spec) if spec.quant in QUANT_KIND else None
    if storage is not None:
        weight_scale_granularity = storage["granularity"]
    elif not fp8:
        weight_scale_granularity = None
    return {"mode": spec.quant.value, "weight_scale_granularity": weight_scale_granularity,
            "act_scale": spec.act_scale.value if fp8 else None, "weight_storage": storage}


def ep_record(spec: MoESpec, plan: Plan) -> dict[str, Any] | None:
    """The manifest's `ep` (the schema above): None for ep_size 1; else the rank, its experts and the plan's
    dispatch. An engine is always one rank's, so a spec of an expert-parallel layer without its rank is refused."""
    if spec.ep_size == 1:
        return None
    if spec.ep_rank is None:
        raise MoeBuildError("ep_rank", f"an engine of an expert-parallel layer (ep_size={spec.ep_size}) is one "
                            "rank's", f"0..{spec.ep_size - 1}")
    first = spec.first_local_expert
    return {"size": spec.ep_size, "rank": spec.ep_rank, "experts": [first, first + spec.local_experts],
            "dispatch": plan.stage("dispatch").choice}


def make_manifest(*, name: str, engine: bytes, spec: MoESpec, plan: Plan, flavour: dict[str, str],
                  sm: int, compute_capability: str | None, graph: dict[str, Any], onnx_sha256: str | None,
                  weights_sha256: str, build: dict[str, Any],
                  weight_scale_granularity: str | None = None) -> dict[str, Any]:
    """The manifest of a freshly built engine (the schema above)."""
    target = plan.target
    return {
        "schema": MANIFEST_SCHEMA,
        "name": name,
        "engine_file": f"{name}.engine",
        "engine_sha256": hashlib.sha256(engine).hexdigest(),
        "engine_bytes": len(engine),
        "onnx_sha256": onnx_sha256,
        "weights_sha256": weights_sha256,
        "spec": spec.to_dict(),
        "quant": quant_record(spec, weight_scale_granularity),
        "plan": plan.to_dict(),
        "flavour": flavour,
        "target": {"sm": sm, "compute_capability": compute_capability},
        "profile": dict(target["profile"]),
        "graph": graph,
        "build": {**build, "created_unix": int(time.time())},
        "ep": ep_record(spec, plan),
    }


def _disagree(what: str, manifest_value: object, plan_value: object) -> VerificationError:
    return VerificationError(f"manifest and plan disagree on {what}: {manifest_value!r} vs {plan_value!r}")


def _check_path_record(plan: Plan, graph: dict[str, Any]) -> None:
    """The graph's record of its path against the plan: OOTB's expert compute, or the plugin's
    stage choices (layouts and tactics included) and its router-logits input."""
    if plan.path == "ootb":
        if "plugin" in graph:
            raise _disagree("path", "plugin engine", plan.path)
        if plan.stage("expert_compute").choice != graph.get("expert_compute"):
            raise _disagree("expert_compute", graph.get("expert_compute"), plan.stage("expert_compute").choice)
        return
    plugin = graph.get("plugin")
    if not isinstance(plugin, dict) or "expert_compute" in graph:
        raise _disagree("path", "ootb engine", plan.path)
    if plugin.get("choices") != plan.choices():
        raise _disagree("plugin stage choices", plugin.get("choices"), plan.choices())
    if graph.get("routing_input") != "logits":
        raise _disagree("routing_input", graph.get("routing_input"), "logits (the MoE plugin takes router logits)")


def _check_quant(spec: MoESpec, quant: Any) -> None:
    """The quant record against the spec: the same mode and activation scales, a granularity the mode's
    weights can have, and (weight-only) the stored form the spec implies."""
    if not isinstance(quant, dict):
        raise VerificationError(f"manifest is incomplete or malformed: quant is a {type(quant).__name__}, "
                                "not an object")
    if quant.get("mode") != spec.quant.value:
        raise _disagree("quant", quant.get("mode"), spec.quant.value)
    want = quant_record(spec, None)  # FP8's granularity comes from the weights: any of GRANULARITIES' below
    if quant.get("act_scale") != want["act_scale"]:
        raise _disagree("act_scale", quant.get("act_scale"), want["act_scale"])
    allowed = GRANULARITIES.get(spec.quant, (want["weight_scale_granularity"],))
    if quant.get("weight_scale_granularity") not in allowed:
        raise _disagree("weight_scale_granularity", quant.get("weight_scale_granularity"), allowed)
    if quant.get("weight_storage") != want["weight_storage"]:
        raise _disagree("weight_storage", quant.get("weight_storage"), want["weight_storage"])


def _check_ep(spec: MoESpec, plan: Plan, manifest: dict[str, Any]) -> None:
    """The ep record against the spec and the plan: present (an object) exactly for ep_size > 1, and equal to
    what `ep_record` makes of them (size, rank, experts, dispatch)."""
    if "ep" not in manifest:
        raise VerificationError("manifest is incomplete or malformed: KeyError: 'ep'")
    got = manifest["ep"]
    if got is not None and not isinstance(got, dict):
        raise VerificationError(f"manifest is incomplete or malformed: ep is a {type(got).__name__}, not an object")
    try:
        want = ep_record(spec, plan)
    except MoeBuildError:
        raise _disagree("ep_rank", spec.ep_rank, f"a rank of ep_size={spec.ep_size}") from None
    if got == want:
        return
    if got is None or want is None:
        raise _disagree("expert parallelism (ep)", got, want)
    for key in ("size", "rank", "experts", "dispatch"):
        if got.get(key) != want[key]:
            raise _disagree(f"ep {key}", got.get(key), want[key])
    raise _disagree("ep", got, want)  # an unknown key


def check_consistency(manifest: dict[str, Any]) -> Plan:
    """Manifest fields against the plan they claim to come from (path, spec, dtype, profile,
    target, flavour, and the path's own record). Returns the parsed plan."""
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise VerificationError(f"manifest schema {manifest.get('schema')!r} is not {MANIFEST_SCHEMA!r}: the engine was "
                                "built by another moe-build; rebuild it")
    try:
        plan = Plan.from_dict(manifest["plan"])
        spec = MoESpec.from_dict(manifest["spec"])
        graph, profile, target = manifest["graph"], manifest["profile"], manifest["target"]
        flavour = manifest["flavour"]["name"]
        for section, value in (("graph", graph), ("profile", profile), ("target", target)):
            if not isinstance(value, dict):
                raise TypeError(f"{section} is a {type(value).__name__}, not an object")
        if not all(isinstance(t, dict) and "name" in t for t in graph.get("inputs", [])):
            raise TypeError("graph inputs are not {name, dtype, shape} objects")
    except (KeyError, TypeError, ValueError, MoeBuildError) as exc:
        raise VerificationError(f"manifest is incomplete or malformed: {type(exc).__name__}: {exc}") from None
    if plan.path not in PATHS:
        raise VerificationError(f"manifest records an unknown path {plan.path!r} (known: {', '.join(PATHS)})")
    if plan.spec != manifest["spec"]:
        raise _disagree("spec", manifest["spec"], plan.spec)
    if plan.target.get("profile") != profile:
        raise _disagree("profile", profile, plan.target.get("profile"))
    if plan.target.get("sm") != target.get("sm"):
        raise _disagree("target sm", target.get("sm"), plan.target.get("sm"))
    if plan.target.get("flavour") != flavour:
        raise _disagree("flavour", flavour, plan.target.get("flavour"))
    _check_path_record(plan, graph)
    _check_quant(spec, manifest.get("quant"))
    _check_ep(spec, plan, manifest)
    hidden = next((t for t in graph.get("inputs", []) if t["name"] == "hidden"), None)
    if hidden is None or hidden["dtype"] != TRT_DTYPE_NAMES[spec.dtype.value]:
        raise _disagree("dtype", None if hidden is None else hidden["dtype"], spec.dtype.value)
    return plan


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _read_pair(engine_path: Path, manifest_path: Path) -> tuple[dict[str, Any], bytes, str, bool]:
    """(manifest, engine bytes, engine sha256, whether the manifest changed while being read)."""
    before = _stat_key(manifest_path)
    if before is None or not engine_path.is_file():
        missing = manifest_path if before is None else engine_path
        raise VerificationError(f"{missing} does not exist (an engine needs its manifest next to it)")
    try:
        manifest = read_json_object(manifest_path, "manifest")
    except MoeBuildError as exc:  # unreadable, not UTF-8, not JSON, not an object: not a manifest we wrote
        raise VerificationError(f"cannot read manifest {manifest_path}: {exc.problem}") from None
    try:
        engine = engine_path.read_bytes()
    except OSError as exc:
        raise VerificationError(f"cannot read engine {engine_path}: {exc}") from None
    return manifest, engine, hashlib.sha256(engine).hexdigest(), _stat_key(manifest_path) != before


def verify(path: str | Path) -> tuple[dict[str, Any], bytes]:
    """Read manifest + engine, check the engine's sha256 and the manifest/plan agreement.

    A pair replaced by a concurrent build (publish.py) is read again. Raises VerificationError
    (exit 1) on a missing, tampered or mismatched pair.
    """
    engine_path, manifest_path = manifest_path_for(path)
    for attempt in range(READ_ATTEMPTS):
        manifest, engine, digest, republished = _read_pair(engine_path, manifest_path)
        if digest == manifest.get("engine_sha256") or not republished:
            break
        time.sleep(0.05 * (attempt + 1))
    if digest != manifest.get("engine_sha256"):
        raise VerificationError(f"{engine_path.name}: sha256 {digest[:16]}... does not match the manifest's "
                                f"{str(manifest.get('engine_sha256'))[:16]}... (engine modified or swapped)")
    if manifest.get("engine_file") != engine_path.name:
        raise VerificationError(f"manifest describes {manifest.get('engine_file')!r}, not {engine_path.name!r}")
    check_consistency(manifest)
    return manifest, engine

