"""The build target: which GPU, which TensorRT, which switches and environment gates.

Detection (local GPU, installed TensorRT flavour, environment variables) happens here and
only here; the planner receives a finished `Target` and stays pure.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import MoeBuildError

SUPPORTED_SMS = (80, 86, 89, 90, 100, 103, 120, 121)
# TensorRT-RTX 1.7 `ComputeCapability` values (ENVIRONMENT.md); 90 and 100 are absent.
RTX_SMS = (75, 80, 86, 89, 120, 121)
# Largest dynamic shared memory one block may opt into, bytes (CUDA programming guide, per arch).
MAX_SMEM_PER_BLOCK = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024,
                      100: 227 * 1024, 103: 227 * 1024, 120: 99 * 1024, 121: 99 * 1024}
DEFAULT_SM_WITHOUT_GPU = 89  # an SM that both TensorRT flavours and the OOTB path can target
FINALIZE_FUSION_ENV = ("MOE_BUILD_DISABLE_FINALIZE_FUSION", "TRTLLM_MOE_DISABLE_FINALIZE_FUSION")


class Flavour(str, enum.Enum):
    TENSORRT = "tensorrt"          # full TensorRT: plugin layers available
    TENSORRT_RTX = "tensorrt-rtx"  # TensorRT for RTX: no custom plugin layers

    @property
    def supports_plugins(self) -> bool:
        return self is Flavour.TENSORRT


class MoePlugin(str, enum.Enum):
    AUTO = "auto"
    DISABLE = "disable"


@dataclass(frozen=True)
class TokenProfile:
    """Optimization profile over the token dimension."""

    min: int = 1
    opt: int = 16
    max: int = 256

    def __post_init__(self) -> None:
        for name in ("min", "opt", "max"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise MoeBuildError(f"{name}_tokens", f"must be a positive integer, got {v!r}", "integers >= 1")
        if not self.min <= self.opt <= self.max:
            raise MoeBuildError("min_tokens/opt_tokens/max_tokens",
                                f"need min <= opt <= max, got {self.min}/{self.opt}/{self.max}",
                                "min <= opt <= max")


@dataclass(frozen=True)
class Target:
    sm: int
    flavour: Flavour
    flavour_version: str | None = None
    moe_plugin: MoePlugin = MoePlugin.AUTO
    deterministic: bool = False
    finalize_fusion_disabled_by_env: bool = False
    profile: TokenProfile = TokenProfile()
    sm_source: str = "flag"          # flag | detected | default
    flavour_source: str = "flag"     # flag | detected | default

    def __post_init__(self) -> None:
        if self.sm not in SUPPORTED_SMS:
            raise MoeBuildError("sm", f"unsupported value {self.sm}", SUPPORTED_SMS)

    @property
    def max_smem_per_block(self) -> int:
        return MAX_SMEM_PER_BLOCK[self.sm]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["flavour"] = self.flavour.value
        d["moe_plugin"] = self.moe_plugin.value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Target":
        d = dict(d)
        d["flavour"] = Flavour(d["flavour"])
        d["moe_plugin"] = MoePlugin(d.get("moe_plugin", "auto"))
        d["profile"] = TokenProfile(**d.get("profile", {}))
        return cls(**d)


def env_disables_finalize_fusion(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(environ.get(name, "").strip() not in ("", "0") for name in FINALIZE_FUSION_ENV)


def detect_sm() -> int | None:
    """Compute capability of GPU 0 as an SM number, or None without a usable GPU.

    Asks the CUDA driver directly (libcuda through ctypes) rather than importing torch, which
    would add seconds to every `fusion-report`.
    """
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    attr_major, attr_minor = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
    if (cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), 0)
            or cuda.cuDeviceGetAttribute(ctypes.byref(major), attr_major, device)
            or cuda.cuDeviceGetAttribute(ctypes.byref(minor), attr_minor, device)):
        return None
    return major.value * 10 + minor.value


def detect_flavour() -> tuple[Flavour, str | None] | None:
    """Installed TensorRT flavour and version; full TensorRT wins when both are present."""
    for flavour, module in ((Flavour.TENSORRT, "tensorrt"), (Flavour.TENSORRT_RTX, "tensorrt_rtx_bindings")):
        if importlib.util.find_spec(module) is None:
            continue
        try:
            mod = __import__(module)
            return flavour, getattr(mod, "__version__", None)
        except Exception:  # a stub or a bindings-only wheel without its libraries
            continue
    return None


def resolve_target(sm: int | None = None, flavour: str | None = None, moe_plugin: str = "auto",
                   deterministic: bool = False, profile: TokenProfile | None = None,
                   environ: Mapping[str, str] | None = None) -> Target:
    """Fill the unspecified parts of a target from this machine, recording where each came from."""
    sm_source = "flag"
    if sm is None:
        sm = detect_sm()
        sm_source = "detected"
        if sm is not None and sm not in SUPPORTED_SMS:
            raise MoeBuildError("sm", f"detected GPU has SM {sm}, which moe-build does not target; pass --sm",
                                SUPPORTED_SMS)
        if sm is None:
            sm, sm_source = DEFAULT_SM_WITHOUT_GPU, "default"
    flavour_source, version = "flag", None
    if flavour is None:
        found = detect_flavour()
        if found is None:
            chosen, flavour_source = Flavour.TENSORRT, "default"
        else:
            (chosen, version), flavour_source = found, "detected"
    else:
        try:
            chosen = Flavour(flavour)
        except ValueError:
            raise MoeBuildError("flavour", f"unknown value {flavour!r}", [f.value for f in Flavour]) from None
        found = detect_flavour()
        if found and found[0] is chosen:
            version = found[1]
    try:
        plugin = MoePlugin(moe_plugin)
    except ValueError:
        raise MoeBuildError("moe_plugin", f"unknown value {moe_plugin!r}", [m.value for m in MoePlugin]) from None
    return Target(sm=sm, flavour=chosen, flavour_version=version, moe_plugin=plugin,
                  deterministic=deterministic,
                  finalize_fusion_disabled_by_env=env_disables_finalize_fusion(environ),
                  profile=profile or TokenProfile(), sm_source=sm_source, flavour_source=flavour_source)
