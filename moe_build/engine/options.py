"""How to build (none of it changes what the engine computes), and the checks on it that need nothing else.

Why checked apart from the build: the CLI validates every option before it prints the plan or
loads a weight, and a bad option is the user's to fix, so each refusal is one line naming the
option in the unit it was given in (the workspace in MiB, as typed).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import MoeBuildError
from ..graph.ootb import check_routing_input
from ..outputs import check_writable_folder

OPTIMIZATION_LEVELS = range(0, 6)   # TensorRT builder optimization levels
TIMING_CACHE_NAME = "moe-build.timing.cache"
# What the engine takes besides `hidden` when not given: the OOTB graph routes on hidden itself;
# the MoE plugin has no router GEMM and takes router logits.
DEFAULT_ROUTING_INPUT = {"ootb": "hidden", "plugin": "logits"}
MAX_WORKSPACE_MIB = 1 << 20  # 1 TiB: more than any GPU holds
PLUGIN_ROUTING_INPUTS = ("logits",)


@dataclass(frozen=True)
class BuildOptions:
    """How to build; none of this changes what the engine computes."""

    output_dir: Path = Path("engines")
    name: str | None = None                  # default: the spec's name
    optimization_level: int = 3              # TensorRT builder optimization level 0..5
    workspace_mib: int | None = None         # memory pool limit for the workspace, MiB; None: TensorRT default
    timing_cache: Path | None = None         # default: <output_dir>/moe-build.timing.cache (full TensorRT)
    progress: bool = True
    routing_input: str | None = None         # hidden | logits | topk; None: the path's default
    weights_sha256: str | None = None        # hash of the source weights; None: hash the tensors

    @property
    def workspace_bytes(self) -> int | None:
        return None if self.workspace_mib is None else self.workspace_mib * 2**20

    def routing_input_for(self, path: str) -> str:
        return self.routing_input or DEFAULT_ROUTING_INPUT[path]

    def timing_cache_path(self) -> Path:
        return self.timing_cache or Path(self.output_dir) / TIMING_CACHE_NAME


def check_options(options: BuildOptions, path: str | None = None) -> None:
    """Every option on its own (and the routing input against the plan's `path`, when given)."""
    if options.optimization_level not in OPTIMIZATION_LEVELS:
        raise MoeBuildError("opt_level", f"{options.optimization_level} is out of range", "0..5")
    if options.workspace_mib is not None and not 1 <= options.workspace_mib <= MAX_WORKSPACE_MIB:
        raise MoeBuildError("workspace_mb",
                            f"{options.workspace_mib} MiB is not a workspace size TensorRT can be given",
                            f"1..{MAX_WORKSPACE_MIB} MiB")
    if options.routing_input is not None:
        check_routing_input(options.routing_input)
    if path == "plugin" and options.routing_input_for(path) not in PLUGIN_ROUTING_INPUTS:
        raise MoeBuildError("routing_input", f"{options.routing_input!r} is not an input of a plugin-path engine: "
                            "the MoE plugin has no router GEMM and takes router logits", PLUGIN_ROUTING_INPUTS)
    check_writable_folder("output", Path(options.output_dir))
    if options.timing_cache is not None:
        if options.timing_cache.is_dir():  # full TensorRT would find out only when saving it, after the build
            raise MoeBuildError("timing_cache", f"{options.timing_cache} is a folder",
                                f"a file path such as {TIMING_CACHE_NAME}")
        check_writable_folder("timing_cache", options.timing_cache.parent)
