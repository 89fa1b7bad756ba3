"""Everything a build can refuse before it reads a weight, exports a graph or starts TensorRT.

Why a separate step: the CLI runs it before printing the plan and loading a checkpoint, and
the builder runs it again first thing, so the plugin path on a machine without full TensorRT,
an SM the flavour cannot target, a plugin the spec cannot use or a bad option all cost nothing
but one line. What it settles (the flavour's module, Polygraphy's loaders bound to it, the
compute capability, the routing input) is what the build then runs with.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..errors import MoeBuildError
from ..planner import Plan
from ..spec import MoESpec
from ..target import DEFAULT_SM_WITHOUT_GPU, RTX_SMS, Target, named_part
from .backend import Backend, FlavourUnavailable, load_backend
from .options import BuildOptions, check_options
from .polygraphy_trt import config_loader_class, polygraphy_loaders


@dataclass(frozen=True)
class Toolchain:
    """What one build runs with, settled before any heavy work."""

    backend: Backend
    loaders: ModuleType                      # polygraphy.backend.trt, bound to backend.trt
    create_config: Any                       # Polygraphy's CreateConfig, or CreateConfigRTX for TensorRT-RTX
    target: Target
    routing_input: str
    compute_capability: tuple[int, int] | None


def plugin_needs_full_tensorrt(target: Target, why: str) -> MoeBuildError:
    """The one line for a plugin-path plan where full TensorRT cannot build it, with both ways out (a target named
    by its part, --gpu, takes the SM in its place: the two may not disagree)."""
    sm = target.sm if target.sm in RTX_SMS else DEFAULT_SM_WITHOUT_GPU
    instead = " in place of --gpu" if named_part(target.sm_source) else ""
    return MoeBuildError("path", f"the plan takes the plugin path, which needs full TensorRT (add_plugin_v3); {why}: "
                         "pip install 'moe-build[trt]' from NVIDIA's index, or build an OOTB engine with "
                         f"--flavour tensorrt-rtx --sm {sm}{instead} (or --moe-plugin disable)")


def _backend_for(plan: Plan, target: Target) -> Backend:
    try:
        backend = load_backend(target.flavour)
    except FlavourUnavailable as exc:
        if plan.path == "plugin":
            raise plugin_needs_full_tensorrt(target, f"TensorRT is not installed here ({exc.reason})") from None
        raise
    if plan.path == "plugin" and not backend.supports_plugins:
        raise plugin_needs_full_tensorrt(target, f"{backend.flavour.value} {backend.version} has no add_plugin_v3")
    return backend


def prepare_build(spec: MoESpec, plan: Plan, options: BuildOptions) -> Toolchain:
    """Refuse (one-line MoeBuildError) what cannot be built; else the toolchain to build it with."""
    if plan.spec != spec.to_dict():
        raise MoeBuildError("plan", "the plan was made for a different spec", "a plan from make_plan(spec, ...)")
    target = Target.from_dict(plan.target)
    backend = _backend_for(plan, target)
    check_options(options, plan.path)
    if plan.path == "plugin":
        from ..plugins.enqueue import check_local_dispatch
        from ..plugins.fields import check_spec_and_plan
        from ..runner.sequence import check_runnable
        check_spec_and_plan(spec, plan)  # quant modes without kernels, LoRA, fp32: what the plugin cannot run
        check_local_dispatch(plan)  # an expert-parallel rank needs a process group the plugin does not have
        check_runnable(plan)  # what the runner in its enqueue has no kernels for: an SM past 9.0, a stage's form
    compute_capability = backend.compute_capability(target.sm)
    return Toolchain(backend=backend, loaders=polygraphy_loaders(backend), create_config=config_loader_class(backend),
                     target=target, routing_input=options.routing_input_for(plan.path),
                     compute_capability=compute_capability)
