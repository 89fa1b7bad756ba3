"""The MoE plugin's identity and serialized fields, and the checks that a spec and plan describe one plugin layer.

Fields: `spec` and `plan` (UTF-8 JSON of `MoESpec.to_dict()` / `Plan.to_dict()`), and `ep_size` / `ep_rank`
(UTF-8 JSON integers, TensorRT-LLM's MoE plugin's names for expert parallelism; ep_rank null for a whole
layer): they repeat the spec's so that a tool reading an engine's plugin fields sees the rank without parsing
the spec, and are refused where they disagree with it. Everything else (input order, shapes, dtypes, the FP8
scales' granularity) is derived from the spec, so nothing serialized can disagree with them; the plan is
checked against the spec and against the planner when the fields are decoded, and a plugin is never built
from fields that fail those checks. A plan whose `dispatch` is not `none` (expert parallelism) is serialized
and read back, but no runner is made from it: a rank's experts run only through
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from moe_build.errors import MoeBuildError
from moe_build.jsonfile import parse_json_object
from moe_build.planner import PLAN_SCHEMA_VERSION, Plan, make_plan
from moe_build.spec import DType, MoESpec
from moe_build.target import Target

from .slots import PLUGIN_QUANTS, output_dtype

PLUGIN_NAME = "MoEPlugin"
PLUGIN_NAMESPACE = "moe_build"
PLUGIN_VERSION = "1"
FIELD_SPEC = "spec"
FIELD_PLAN = "plan"
FIELD_EP_SIZE = "ep_size"
FIELD_EP_RANK = "ep_rank"
FIELD_NAMES = (FIELD_SPEC, FIELD_PLAN, FIELD_EP_SIZE, FIELD_EP_RANK)


def forced_choices(plan: Plan) -> dict[str, str]:
    """The stages the user pinned when the plan was made: re-planning with these reproduces the plan."""
    return {s.stage: s.choice for s in plan.stages if s.forced}


def _canonical_json(data: Mapping[str, Any]) -> bytes:
    """Deterministic JSON, so equal spec/plans serialize to identical bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode_fields(spec: MoESpec, plan: Plan) -> dict[str, bytes]:
    """Field name -> bytes for `spec` and `plan`, after checking they describe one plugin layer."""
    check_spec_and_plan(spec, plan)
    return {FIELD_SPEC: _canonical_json(spec.to_dict()), FIELD_PLAN: _canonical_json(plan.to_dict()),
            FIELD_EP_SIZE: json.dumps(spec.ep_size).encode(), FIELD_EP_RANK: json.dumps(spec.ep_rank).encode()}


def _field_error(name: str, problem: str) -> MoeBuildError:
    return MoeBuildError(f"{PLUGIN_NAME} field {name!r}", problem)


def decode_fields(fields: Mapping[str, bytes]) -> tuple[MoESpec, Plan]:
    """Parse and check the serialized fields; any problem is a one-line `MoeBuildError`."""
    unknown = sorted(set(fields) - set(FIELD_NAMES))
    if unknown:
        raise MoeBuildError(f"{PLUGIN_NAME} fields", f"unknown field(s) {unknown}", FIELD_NAMES)
    parsed: dict[str, dict[str, Any]] = {}
    for name in (FIELD_SPEC, FIELD_PLAN):  # the ep fields are read against the spec (_check_ep_fields)
        if name not in fields:
            raise _field_error(name, "missing")
        parsed[name] = parse_json_object(bytes(fields[name]), f"{PLUGIN_NAME} field {name!r}", "the field")
    try:
        spec = MoESpec.from_dict(parsed[FIELD_SPEC])
    except MoeBuildError as exc:
        raise _field_error(FIELD_SPEC, f"describes no valid layer ({exc})") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise _field_error(FIELD_SPEC, f"is not a moe-build spec ({type(exc).__name__}: {exc})") from None
    try:
        plan = Plan.from_dict(parsed[FIELD_PLAN])
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise _field_error(FIELD_PLAN, f"is not a moe-build plan ({type(exc).__name__}: {exc})") from None
    check_spec_and_plan(spec, plan)
    _check_ep_fields(spec, fields)
    return spec, plan


def _check_ep_fields(spec: MoESpec, fields: Mapping[str, bytes]) -> None:
    """`ep_size` / `ep_rank` as JSON integers (ep_rank null: the whole layer), equal to the spec's."""
    for name, want in ((FIELD_EP_SIZE, spec.ep_size), (FIELD_EP_RANK, spec.ep_rank)):
        if name not in fields:
            raise _field_error(name, "missing")
        try:
            got = json.loads(bytes(fields[name]).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise _field_error(name, "is not a JSON integer") from None
        if got is not None and (isinstance(got, bool) or not isinstance(got, int)):
            raise _field_error(name, f"is {got!r}, not an integer")
        if got != want:
            raise _field_error(name, f"is {got!r} but the 'spec' field says {name}={want!r}")


def check_spec_and_plan(spec: MoESpec, plan: Plan) -> None:
    """Refuse a spec/plan pair the plugin cannot run as given.

    The plan must be a plugin-path plan for exactly this spec, and it must be what the planner
    decides for (spec, plan's target, plan's tokens, plan's forced stages): that catches a
    hand-edited plan and a plan made by a different moe-build, whose choices the runner of this
    one would not reproduce.
    """
    if plan.schema != PLAN_SCHEMA_VERSION:
        raise _field_error(FIELD_PLAN, f"has schema {plan.schema!r}; this moe-build reads {PLAN_SCHEMA_VERSION!r}")
    if plan.path != "plugin":
        raise _field_error(FIELD_PLAN, f"is a {plan.path!r}-path plan; the MoE plugin runs plugin-path plans only")
    if json.loads(_canonical_json(plan.spec)) != json.loads(_canonical_json(spec.to_dict())):
        raise _field_error(FIELD_PLAN, "was made for a different spec than the 'spec' field")
    if spec.quant not in PLUGIN_QUANTS:
        raise MoeBuildError("quant", f"the MoE plugin's inputs carry no {spec.quant.value} weights or scales",
                            [q.value for q in PLUGIN_QUANTS])
    if spec.lora:
        raise MoeBuildError("lora", "the MoE plugin has no LoRA inputs", "false")
    if spec.fp8_input:
        raise MoeBuildError("fp8_input", "the MoE plugin's hidden input is in the spec's 16-bit dtype", "false")
    if spec.dtype is DType.FP32:
        raise MoeBuildError("dtype", "the MoE plugin's grouped GEMMs are fp16/bf16 only (fp32 is not implemented)",
                            ("fp16", "bf16"))
    output_dtype(spec)
    try:
        target = Target.from_dict(plan.target)
    except (TypeError, ValueError, KeyError, MoeBuildError) as exc:
        raise _field_error(FIELD_PLAN, f"has an invalid target ({type(exc).__name__}: {exc})") from None
    try:
        replanned = make_plan(spec, target, plan.tokens, forced_choices(plan))
    except MoeBuildError as exc:
        raise _field_error(FIELD_PLAN, f"cannot be reproduced by the planner ({exc})") from None
    if json.loads(_canonical_json(replanned.to_dict())) != json.loads(_canonical_json(plan.to_dict())):
        differ = [s.stage for s, r in zip(plan.stages, replanned.stages) if s.to_dict() != r.to_dict()]
        raise _field_error(FIELD_PLAN, "differs from what the planner decides for its spec/target/tokens "
                           f"(stages {differ or 'path gates'}): tampered or made by another moe-build; rebuild")


def fields_from_collection(collection: Any) -> dict[str, bytes]:
    """Name -> raw bytes of a PluginFieldCollection (its `data` arrive as numpy arrays)."""
    return {str(f.name): bytes(memoryview(f.data).cast("B")) for f in collection}
