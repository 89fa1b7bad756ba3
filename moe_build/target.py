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
# TensorRT-RTX 1.7 `ComputeCapability` values (docs/tensorrt_rtx.md); 90 and 100 are absent.
RTX_SMS = (75, 80, 86, 89, 120, 121)
RTX_TARGET_SMS = tuple(sm for sm in RTX_SMS if sm in SUPPORTED_SMS)  # what moe-build builds with TensorRT-RTX


@dataclass(frozen=True)
class GpuPart:
    """What the GEMM tactic rules read of a GPU, named (GPU_PARTS) or detected (detect_gpu): its SM, multiprocessors,
    L2 bytes and peak DRAM bytes/s (0 where a driver does not say)."""

    sm: int
    sm_count: int
    l2_bytes: int
    memory_bytes_per_s: int


# The parts a target may name (`--gpu`), from their makers' data sheets: an ahead-of-time build on a machine without
# the GPU plans for that part's memory rate and size, not for its SM's default part (an H200 is SM 90 as an H100 is,
# and the block-128 decode band, tactics.fp8.fp8_block_wide_band, differs between them).
GPU_PARTS = {
    "a100-sxm": GpuPart(80, 108, 40 << 20, 2_039 * 10**9),   # A100 SXM 80 GB
    "a100-pcie": GpuPart(80, 108, 40 << 20, 1_935 * 10**9),  # A100 PCIe 80 GB
    "rtx-3090": GpuPart(86, 82, 6 << 20, 936 * 10**9),
    "rtx-4090": GpuPart(89, 128, 72 << 20, 1_008 * 10**9),
    "l40s": GpuPart(89, 142, 96 << 20, 864 * 10**9),
    "h100-sxm": GpuPart(90, 132, 50 << 20, 3_352 * 10**9),
    "h100-pcie": GpuPart(90, 114, 50 << 20, 2_000 * 10**9),
    "h100-nvl": GpuPart(90, 132, 50 << 20, 3_900 * 10**9),
    "h200": GpuPart(90, 132, 50 << 20, 4_800 * 10**9),       # SXM and NVL alike
    "b200": GpuPart(100, 148, 126 << 20, 8_000 * 10**9),
    "rtx-5090": GpuPart(120, 170, 96 << 20, 1_792 * 10**9),
    "gb10": GpuPart(121, 48, 24 << 20, 273 * 10**9),
}
# The part assumed for an SM when no GPU of it is here to ask and no --gpu names one: a part of each generation; SM
# 103 (B300) takes B200's figures.
DEFAULT_GPU = {80: GPU_PARTS["a100-sxm"], 86: GPU_PARTS["rtx-3090"], 89: GPU_PARTS["rtx-4090"],
               90: GPU_PARTS["h100-sxm"], 100: GPU_PARTS["b200"], 103: GPU_PARTS["b200"],
               120: GPU_PARTS["rtx-5090"], 121: GPU_PARTS["gb10"]}
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


MAX_TOKENS = 1 << 20  # a profile's largest token count: rows (tokens * top_k) stay within int32


@dataclass(frozen=True)
class TokenProfile:
    """Optimization profile over the token dimension."""

    min: int = 1
    opt: int = 16
    max: int = 256

    def __post_init__(self) -> None:
        for name in ("min", "opt", "max"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_TOKENS:
                raise MoeBuildError(f"{name}_tokens", f"must be an integer from 1 to {MAX_TOKENS}, got {v!r}",
                                    f"1..{MAX_TOKENS}")
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
    sm_count: int = 0                # multiprocessors (0: DEFAULT_GPU's for the SM)
    l2_bytes: int = 0                # L2 cache bytes (0: DEFAULT_GPU's for the SM)
    memory_bytes_per_s: int = 0      # peak DRAM bytes/s (0: DEFAULT_GPU's for the SM)
    sm_source: str = "flag"          # flag | detected | default | gpu NAME (a part of GPU_PARTS, --gpu)
    flavour_source: str = "flag"     # flag | detected | default | target (why the installed one is not used)

    def __post_init__(self) -> None:
        if self.sm not in SUPPORTED_SMS:
            raise MoeBuildError("sm", f"unsupported value {self.sm}", SUPPORTED_SMS)
        part = DEFAULT_GPU[self.sm]
        if not self.sm_count:
            object.__setattr__(self, "sm_count", part.sm_count)
        if not self.l2_bytes:
            object.__setattr__(self, "l2_bytes", part.l2_bytes)
        if not self.memory_bytes_per_s:
            object.__setattr__(self, "memory_bytes_per_s", part.memory_bytes_per_s)

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


def peak_memory_bytes_per_s(memory_clock_khz: int, bus_width_bits: int) -> int:
    """A GPU's peak DRAM rate from its memory clock and bus width as the driver reports them: two transfers a
    clock (HBM and GDDR alike report the clock that way), 0 where either is unknown."""
    return 2 * memory_clock_khz * 1000 * bus_width_bits // 8


def detect_gpu() -> GpuPart | None:
    """GPU 0's SM number, multiprocessor count, L2 bytes and peak DRAM rate, or None without a usable GPU.

    Asks the CUDA driver directly (libcuda through ctypes) rather than importing torch, which
    would add seconds to every `fusion-report`.
    """
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device = ctypes.c_int()
    if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), 0):
        return None
    def attribute(attr: int) -> int | None:
        v = ctypes.c_int()
        return None if cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, device) else v.value

    # CU_DEVICE_ATTRIBUTE_ COMPUTE_CAPABILITY_MAJOR, _MINOR, MULTIPROCESSOR_COUNT, L2_CACHE_SIZE
    values = [attribute(attr) for attr in (75, 76, 16, 38)]
    if None in values:
        return None
    # MEMORY_CLOCK_RATE (kHz), GLOBAL_MEMORY_BUS_WIDTH (bits): 0 where a driver does not say (Target then takes the
    # SM's default part's rate)
    memory = peak_memory_bytes_per_s(attribute(36) or 0, attribute(37) or 0)
    return GpuPart(values[0] * 10 + values[1], values[2], values[3], memory)


# Each flavour's import name and the distributions that may provide it (their metadata gives the version
# without importing the module, which takes a second and loads the TensorRT libraries).
FLAVOUR_MODULES = {Flavour.TENSORRT: ("tensorrt", ("tensorrt", "tensorrt-cu13", "tensorrt-cu12",
                                                   "tensorrt-cu13-bindings", "tensorrt-cu12-bindings")),
                   Flavour.TENSORRT_RTX: ("tensorrt_rtx_bindings", ("tensorrt-rtx-cu13-bindings",
                                                                    "tensorrt-rtx-cu12-bindings"))}


def _installed_version(distributions: tuple[str, ...]) -> str | None:
    import importlib.metadata
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def detect_flavour() -> tuple[Flavour, str | None] | None:
    """The installed TensorRT flavour and its version, full TensorRT first when both are installed.
    Found by module spec and package metadata, not imported: whether the install works is the engine
    builder's concern (moe_build.engine.backend.load_backend), not the planner's."""
    for flavour, (module, distributions) in FLAVOUR_MODULES.items():
        if importlib.util.find_spec(module) is not None:
            return flavour, _installed_version(distributions)
    return None


GPU_SOURCE_PREFIX = "gpu "  # Target.sm_source of a target named by its part: "gpu h200"


def named_part(sm_source: str) -> str | None:
    """The part a target's sm_source names (--gpu), or None (flag, detected, default)."""
    return sm_source[len(GPU_SOURCE_PREFIX):] if sm_source.startswith(GPU_SOURCE_PREFIX) else None


def gpu_part(name: str, sm: int | None = None) -> GpuPart:
    """The part `name` of GPU_PARTS (--gpu), refused in one line where it is unknown or another SM than `sm` (an --sm
    given beside it)."""
    part = GPU_PARTS.get(name)
    if part is None:
        raise MoeBuildError("gpu", f"unknown part {name!r}", list(GPU_PARTS))
    if sm is not None and sm != part.sm:
        raise MoeBuildError("gpu", f"{name} is SM {part.sm}, but --sm says {sm}", f"--sm {part.sm}, or no --sm")
    return part


def resolve_target(sm: int | None = None, flavour: str | None = None, moe_plugin: str = "auto",
                   deterministic: bool = False, profile: TokenProfile | None = None,
                   environ: Mapping[str, str] | None = None, gpu: str | None = None) -> Target:
    """Fill the unspecified parts of a target from this machine, recording where each came from. A named part (`gpu`)
    gives the SM, multiprocessors, L2 and memory rate instead of the local GPU."""
    sm_source, part = "flag", None
    if gpu is not None:
        part, sm_source = gpu_part(gpu, sm), GPU_SOURCE_PREFIX + gpu
    elif sm is None:
        part, sm_source = detect_gpu(), "detected"
        if part is not None and part.sm not in SUPPORTED_SMS:
            raise MoeBuildError("sm", f"detected GPU has SM {part.sm}, which moe-build does not target; pass --sm",
                                SUPPORTED_SMS)
        if part is None:
            sm, sm_source = DEFAULT_SM_WITHOUT_GPU, "default"
    if part is None:
        sm_count = l2_bytes = memory = 0  # Target fills them from the SM's default part
    else:
        sm, sm_count, l2_bytes, memory = part.sm, part.sm_count, part.l2_bytes, part.memory_bytes_per_s
    flavour_source, version = "flag", None
    if flavour is None:
        found = detect_flavour()
        if found is None:
            chosen, flavour_source = Flavour.TENSORRT, "default"
        elif found[0] is Flavour.TENSORRT_RTX and sm not in RTX_SMS:
            # TensorRT-RTX cannot target this SM: the plan is full TensorRT's, what a user of this GPU builds with
            chosen, flavour_source = Flavour.TENSORRT, f"target (TensorRT-RTX cannot target sm{sm})"
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
                  profile=profile or TokenProfile(), sm_count=sm_count, l2_bytes=l2_bytes,
                  memory_bytes_per_s=memory, sm_source=sm_source,
                  flavour_source=flavour_source)
