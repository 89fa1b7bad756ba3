"""One adapter over the two TensorRT flavours: which module, and what that flavour can do.

Full TensorRT (`import tensorrt`) and TensorRT-RTX (`import tensorrt_rtx_bindings`) share the
builder/network/parser API; they differ in a few places this module names explicitly:
- TensorRT-RTX targets compute capabilities chosen in the builder config (it builds on a CPU);
  full TensorRT builds for the GPU it runs on and has no such setting.
- the progress monitor is probed, not assumed; the timing cache is real only in full TensorRT
  (TensorRT-RTX keeps the API as documented no-ops).
- TensorRT-RTX has no plugin layers (ENVIRONMENT.md): its networks have no `add_plugin_v3`.
The builder itself is driven through Polygraphy (see polygraphy_trt.py); runtime.py uses the
module directly to deserialise.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from ..errors import MoeBuildError
from ..target import Flavour

MODULE_NAMES = {Flavour.TENSORRT: "tensorrt", Flavour.TENSORRT_RTX: "tensorrt_rtx_bindings"}
INSTALL_HINTS = {Flavour.TENSORRT: "pip install 'moe-build[trt]' from NVIDIA's index",
                 Flavour.TENSORRT_RTX: "pip install 'moe-build[rtx]'"}


class FlavourUnavailable(MoeBuildError):
    """The flavour's module is missing or unusable; `reason` is the import failure in a few words."""

    def __init__(self, flavour: Flavour, reason: str):
        self.flavour, self.reason = flavour, reason
        super().__init__("flavour", f"{flavour.value} is not usable here ({reason}); {INSTALL_HINTS[flavour]}")


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
        return (self.flavour is Flavour.TENSORRT_RTX and hasattr(self.trt, "ComputeCapability")
                and hasattr(self.trt.IBuilderConfig, "set_compute_capability"))

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

    def compute_capability(self, sm: int) -> tuple[int, int] | None:
        """(major, minor) for a TensorRT-RTX build targeting SM `sm` (what Polygraphy's
        CreateConfigRTX takes); None for full TensorRT, which builds for the GPU it runs on."""
        if not self.sets_compute_capability:
            return None
        if not hasattr(self.trt.ComputeCapability, f"SM{sm}"):
            allowed = [n for n in self.trt.ComputeCapability.__members__ if n.startswith("SM")]
            raise MoeBuildError("sm", f"{self.flavour.value} {self.version} cannot target SM {sm}", allowed)
        return sm // 10, sm % 10


def load_backend(flavour: Flavour | str) -> Backend:
    """Import the flavour's module; a missing or stub install is a one-line FlavourUnavailable."""
    flavour = Flavour(flavour)
    try:
        module = importlib.import_module(MODULE_NAMES[flavour])
        module.Builder  # noqa: B018 - a bindings-only stub imports but has no builder
    except Exception as exc:  # ImportError, or a stub whose libraries are missing
        detail = str(exc).splitlines()[0] if str(exc) else "no detail"
        raise FlavourUnavailable(flavour, f"{type(exc).__name__}: {detail}") from None
    return Backend(flavour, module)
