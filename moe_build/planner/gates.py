"""Plan data: gates, stage decisions and the plan itself. Plain, serialisable, no logic beyond lookups."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

PLAN_SCHEMA_VERSION = "moe-build.plan/13"

# Upstream sources of the fusion matrix's conditions: files of the TensorRT-LLM repository (NVIDIA/TensorRT-LLM),
# cited as file:line; the prefix keeps them apart from this repository's own files.
UPSTREAM = "TensorRT-LLM "
MOE_KERNELS_CU = UPSTREAM + "cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_kernels.cu"
MOE_KERNELS_H = UPSTREAM + "cpp/tensorrt_llm/kernels/cutlass_kernels/include/moe_kernels.h"
GEMM_DISPATCH_H = UPSTREAM + "cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_template_dispatch.h"
MOE_PLUGIN_CPP = UPSTREAM + "cpp/tensorrt_llm/plugins/mixtureOfExperts/mixtureOfExpertsPlugin.cpp"
ENV_UTILS_CPP = UPSTREAM + "cpp/tensorrt_llm/common/envUtils.cpp"
PLUGIN_PY = UPSTREAM + "tensorrt_llm/plugin/plugin.py"
BUILDER_PY = UPSTREAM + "tensorrt_llm/builder.py"
MOE_PY = UPSTREAM + "tensorrt_llm/layers/moe.py"
OURS = "moe-build"          # a rule of ours, not the seed's (README, "The planner and the fusion matrix")
RTX_FACTS = "docs/tensorrt_rtx.md"  # what TensorRT-RTX 1.7 can and cannot do, as measured


@dataclass(frozen=True)
class Gate:
    """One condition that took part in a decision: what was seen, what was required, and whether it held."""

    name: str
    value: Any
    condition: str
    held: bool
    source: str
    token_dependent: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Band:
    """One range of token counts, `lo`..`hi` inclusive (`hi` None: no upper end), and the stage's choice there."""

    lo: int
    hi: int | None
    choice: str

    def holds(self, tokens: int) -> bool:
        return self.lo <= tokens and (self.hi is None or tokens <= self.hi)

    def to_list(self) -> list[Any]:
        return [self.lo, self.hi, self.choice]


def bands_text(bands: Sequence[Band], sep: str = "; ", choice_first: bool = False) -> str:
    """Bands as "1-256 fused; 257+ three_step" (a one-count band as "7 fused"), or with `choice_first` as
    finalize's summary has them: "fused 1-16; separate 17-128; fused 129+" (a one-count band "fused 7-7")."""
    def span(b: Band) -> str:
        if b.hi is None:
            return f"{b.lo}+"
        return f"{b.lo}" if b.hi == b.lo and not choice_first else f"{b.lo}-{b.hi}"
    return sep.join(f"{b.choice} {span(b)}" if choice_first else f"{span(b)} {b.choice}" for b in bands)


@dataclass(frozen=True)
class StageDecision:
    """The choice for one stage of the fusion matrix, with the gates that made it.

    `choice` is the choice at the plan's token count. `bands` cover every token count from 1 in order,
    each with the stage's choice over it; a stage that does not depend on tokens has one band. The
    runner and the plugin see every count of their profile, so they read `choice_for(tokens)`, never
    re-plan.
    """

    stage: str
    choice: str
    fallback: str
    gates: tuple[Gate, ...]
    bands: tuple[Band, ...] = ()
    forced: bool = False
    summary: str = ""

    def __post_init__(self) -> None:
        if not self.bands:
            object.__setattr__(self, "bands", (Band(1, None, self.choice),))

    def choice_for(self, tokens: int) -> str:
        for band in self.bands:
            if band.holds(tokens):
                return band.choice
        raise ValueError(f"{self.stage}: no band holds {tokens} tokens")

    @property
    def token_dependent(self) -> bool:
        return len(self.bands) > 1

    @property
    def fused(self) -> bool:
        return self.choice != self.fallback

    def failed_gates(self) -> list[Gate]:
        return [g for g in self.gates if not g.held]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "choice": self.choice,
            "fallback": self.fallback,
            "bands": [b.to_list() for b in self.bands],
            "forced": self.forced,
            "summary": self.summary,
            "gates": [g.to_dict() for g in self.gates],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageDecision":
        return cls(stage=d["stage"], choice=d["choice"], fallback=d["fallback"],
                   gates=tuple(Gate(**g) for g in d["gates"]),
                   bands=tuple(Band(int(lo), None if hi is None else int(hi), str(c)) for lo, hi, c in d["bands"]),
                   forced=d.get("forced", False), summary=d.get("summary", ""))


@dataclass(frozen=True)
class Plan:
    """The whole build plan for one layer on one target at one token count."""

    path: str                         # plugin | ootb
    path_gates: tuple[Gate, ...]
    stages: tuple[StageDecision, ...]
    tokens: int
    spec: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    schema: str = PLAN_SCHEMA_VERSION

    def stage(self, name: str) -> StageDecision:
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(f"plan has no stage {name!r}; stages: {[s.stage for s in self.stages]}")

    def path_gate(self, name: str) -> Gate:
        for g in self.path_gates:
            if g.name == name:
                return g
        raise KeyError(f"plan has no path gate {name!r}; path gates: {[g.name for g in self.path_gates]}")

    def band_edges(self, max_tokens: int, stages: Iterable[str] | None = None,
                   starts_only: bool = False) -> list[int]:
        """The token counts within 1..max_tokens where a band of `stages` (default every stage) starts or
        ends (`starts_only`: starts), ascending: the counts at which some rule switches. 1 is always one
        (every stage's first band starts there); max_tokens only where a band starts or ends there."""
        names = None if stages is None else set(stages)
        return sorted({t for s in self.stages if names is None or s.stage in names for b in s.bands
                       for t in ((b.lo,) if starts_only else (b.lo, b.hi)) if t is not None and 1 <= t <= max_tokens})

    def choices(self, tokens: int | None = None) -> dict[str, str]:
        """Each stage's choice: as planned, or at `tokens` (token-dependent stages' `choice_for`)."""
        return {s.stage: s.choice if tokens is None else s.choice_for(tokens) for s in self.stages}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "path": self.path,
            "tokens": self.tokens,
            "path_gates": [g.to_dict() for g in self.path_gates],
            "stages": [s.to_dict() for s in self.stages],
            "spec": self.spec,
            "target": self.target,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        return cls(path=d["path"], path_gates=tuple(Gate(**g) for g in d["path_gates"]),
                   stages=tuple(StageDecision.from_dict(s) for s in d["stages"]), tokens=d["tokens"],
                   spec=d.get("spec", {}), target=d.get("target", {}), schema=d.get("schema", PLAN_SCHEMA_VERSION))
