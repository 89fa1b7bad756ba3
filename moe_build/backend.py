"""One adapter over the two TensorRT flavours, so the builder is written once.

Full TensorRT (`import tensorrt`) and TensorRT-RTX (`import tensorrt_rtx_bindings`) share the
builder/network/parser API; they differ in a few places this module names explicitly:
- TensorRT-RTX targets compute capabilities chosen in the builder config (it builds on a CPU);
  full TensorRT builds for the GPU it runs on and has no such setting.
- the strongly-typed network flag and the progress monitor exist in both recent releases but
  are probed, not assumed; the timing cache is real only in full TensorRT (no-op in RTX).
- TensorRT-RTX has no plugin layers (ENVIRONMENT.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .errors import MoeBuildError
from .target import Flavour

MODULE_NAMES = {Flavour.TENSORRT: "tensorrt", Flavour.TENSORRT_RTX: "tensorrt_rtx_bindings"}


@dataclass(frozen=True)
class Backend:
    """The imported module of one flavour plus what that flavour can do."""

    flavour: Flavour
    trt: ModuleType

    @property
    def version(self) -> str:
        return str(self.trt.__version__)

    @property
    def sets_compute_capability(self) -> bool:
        """True when the builder config chooses the target GPU (TensorRT-RTX AOT builds)."""
        return hasattr(self.trt, "ComputeCapability") and hasattr(self.trt.IBuilderConfig, "set_compute_capability")

    @property
    def has_progress_monitor(self) -> bool:
        return hasattr(self.trt, "IProgressMonitor")

    @property
    def has_timing_cache(self) -> bool:
        """TensorRT-RTX keeps the timing-cache API but documents its operations as no-ops
        (deprecated since RTX 1.2), so only full TensorRT gets a cache file."""
        return self.flavour is Flavour.TENSORRT and hasattr(self.trt.IBuilderConfig, "create_timing_cache")

    @property
    def supports_plugins(self) -> bool:
        return self.flavour.supports_plugins and hasattr(self.trt.INetworkDefinition, "add_plugin_v3")

    def strongly_typed_flags(self) -> int:
        """Network creation flags for a strongly typed network (types come from the ONNX graph)."""
        flag = getattr(self.trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if flag is None:
            raise MoeBuildError("flavour", f"{self.flavour.value} {self.version} has no strongly typed networks",
                                "TensorRT >= 9 or TensorRT-RTX")
        return 1 << int(flag)

    def set_target_sm(self, config: Any, sm: int) -> str | None:
        """Point a TensorRT-RTX build at compute capability `sm`; returns the enum name used
        (None for full TensorRT, which builds for the GPU it runs on)."""
        if not self.sets_compute_capability:
            return None
        name = f"SM{sm}"
        cc = getattr(self.trt.ComputeCapability, name, None)
        if cc is None:
            allowed = [n for n in self.trt.ComputeCapability.__members__ if n.startswith("SM")]
            raise MoeBuildError("sm", f"{self.flavour.value} {self.version} cannot target SM {sm}", allowed)
        config.num_compute_capabilities = 1
        if not config.set_compute_capability(cc, 0):
            raise MoeBuildError("sm", f"the builder refused compute capability {name}")
        return name


def load_backend(flavour: Flavour | str) -> Backend:
    """Import the flavour's module; a missing or stub install is a one-line MoeBuildError."""
    flavour = Flavour(flavour)
    name = MODULE_NAMES[flavour]
    try:
        module = importlib.import_module(name)
        module.Builder  # noqa: B018 - a bindings-only stub imports but has no builder
    except Exception as exc:  # ImportError, or a stub whose libraries are missing
        hint = "pip install 'moe-build[rtx]'" if flavour is Flavour.TENSORRT_RTX else "pip install 'moe-build[trt]'"
        raise MoeBuildError("flavour", f"{flavour.value} is not usable here ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); {hint}") from None
    return Backend(flavour, module)
