"""Polygraphy's TensorRT loaders, bound to the module of the flavour a build targets.

Why a binding step: Polygraphy picks its TensorRT module once per process. Each module of
`polygraphy.backend.trt` captures `tensorrt` or `tensorrt_rtx` (a lazy import) when it is first
imported, as `polygraphy.config.USE_TENSORRT_RTX` (env `POLYGRAPHY_USE_TENSORRT_RTX`) says at that
moment, and its global TensorRT logger subclasses that module's `ILogger`. It cannot switch module
per call, so the first build of a process binds it to its flavour: `POLYGRAPHY_USE_TENSORRT_RTX`
and the config flag set to match, and, for TensorRT-RTX, the module name Polygraphy imports
(`tensorrt_rtx`) aliased to the PyPI wheel's `tensorrt_rtx_bindings`. A later build of the other
flavour in the same process is refused in one line rather than handing one module's objects to
the other's builder (a CLI run builds one flavour; two flavours need two processes).
"""
from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

from ..errors import MoeBuildError
from ..target import Flavour
from .backend import Backend

RTX_ENV = "POLYGRAPHY_USE_TENSORRT_RTX"
# The module name Polygraphy imports for each flavour (the PyPI TensorRT-RTX wheel is `tensorrt_rtx_bindings`).
POLYGRAPHY_MODULE = {Flavour.TENSORRT: "tensorrt", Flavour.TENSORRT_RTX: "tensorrt_rtx"}
_LOADER_MODULE = "polygraphy.backend.trt.loader"
_bound: dict[str, str] = {}  # "module" -> the name Polygraphy was bound to by this process


def bound_module_name() -> str | None:
    """The TensorRT module name Polygraphy's loaders use in this process; None while unbound."""
    if _LOADER_MODULE not in sys.modules:
        return None
    if "module" not in _bound:  # imported before moe-build bound it: it read the flag as it is now
        from polygraphy import config
        _bound["module"] = POLYGRAPHY_MODULE[Flavour.TENSORRT_RTX if config.USE_TENSORRT_RTX else Flavour.TENSORRT]
    return _bound["module"]


def _bind(backend: Backend) -> None:
    from polygraphy import config
    rtx = backend.flavour is Flavour.TENSORRT_RTX
    os.environ[RTX_ENV] = "1" if rtx else "0"
    config.USE_TENSORRT_RTX = rtx
    _bound["module"] = POLYGRAPHY_MODULE[backend.flavour]
    import polygraphy.backend.trt  # noqa: F401 - the import is the binding


def check_bindable(backend: Backend) -> str:
    """Refuse, before any work, a backend Polygraphy cannot drive in this process; returns the
    module name Polygraphy will import for it."""
    name = POLYGRAPHY_MODULE[backend.flavour]
    bound = bound_module_name()
    if bound is not None and bound != name:
        raise MoeBuildError("flavour", f"Polygraphy's TensorRT backend is bound to `{bound}` in this process "
                            f"(it imports one TensorRT module per process); build {backend.flavour.value} "
                            "engines in a separate process")
    present = sys.modules.get(name)
    if present is not None and present is not backend.trt:
        raise MoeBuildError("flavour", f"`{name}` in this process is {getattr(present, '__file__', present)}, "
                            f"not the {backend.flavour.value} module that was loaded ({backend.trt.__name__})")
    return name


def polygraphy_loaders(backend: Backend) -> ModuleType:
    """`polygraphy.backend.trt`, bound to `backend.trt` (binding it on first use)."""
    name = check_bindable(backend)
    if bound_module_name() is None:
        _bind(backend)
    sys.modules.setdefault(name, backend.trt)  # the name Polygraphy imports lazily: `tensorrt_rtx` is an alias
    import polygraphy.backend.trt as loaders
    return loaders


def config_loader_class(backend: Backend) -> Any:
    """Polygraphy's config loader for the flavour: CreateConfigRTX sets TensorRT-RTX compute
    capabilities; CreateConfig is the full TensorRT one."""
    loaders = polygraphy_loaders(backend)
    if backend.sets_compute_capability:
        from polygraphy.backend.tensorrt_rtx import CreateConfigRTX
        return CreateConfigRTX
    return loaders.CreateConfig
