"""Plan data: gates, stage decisions and the plan itself. Plain, serialisable, no logic beyond lookups."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PLAN_SCHEMA_VERSION = "moe-build.plan/1"

# The seed's reference prefixes, abbreviated as the seed cites them.
MOE_KERNELS_CU = "cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_kernels.cu"
MOE_KERNELS_H = "cpp/tensorrt_llm/kernels/cutlass_kernels/include/moe_kernels.h"
GEMM_DISPATCH_H = "cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_template_dispatch.h"
MOE_PLUGIN_CPP = "cpp/tensorrt_llm/plugins/mixtureOfExperts/mixtureOfExpertsPlugin.cpp"
ENV_UTILS_CPP = "cpp/tensorrt_llm/common/envUtils.cpp"
PLUGIN_PY = "tensorrt_llm/plugin/plugin.py"
BUILDER_PY = "tensorrt_llm/builder.py"
MOE_PY = "tensorrt_llm/layers/moe.py"
OURS = "moe-build"          # a rule of ours, not the seed's (documented in README)
ENVIRONMENT = "shared/ENVIRONMENT.md"


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
class StageDecision:
    """The choice for one stage of the fusion matrix, with the gates that made it.

    `token_range` is the inclusive token-count range over which `choice` holds ([lo, None] is
    unbounded); outside it the stage takes `choice_outside_range`.
    """

    stage: str
    choice: str
    fallback: str
    gates: tuple[Gate, ...]
    token_range: tuple[int, int | None] = (1, None)
    choice_outside_range: str | None = None
    forced: bool = False
    summary: str = ""

    def choice_for(self, tokens: int) -> str:
        lo, hi = self.token_range
        if lo <= tokens and (hi is None or tokens <= hi):
            return self.choice
        assert self.choice_outside_range is not None, f"{self.stage}: no choice outside {self.token_range}"
        return self.choice_outside_range

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
            "token_range": list(self.token_range),
            "choice_outside_range": self.choice_outside_range,
            "forced": self.forced,
            "summary": self.summary,
            "gates": [g.to_dict() for g in self.gates],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageDecision":
        return cls(stage=d["stage"], choice=d["choice"], fallback=d["fallback"],
                   gates=tuple(Gate(**g) for g in d["gates"]),
                   token_range=(d["token_range"][0], d["token_range"][1]),
                   choice_outside_range=d.get("choice_outside_range"), forced=d.get("forced", False),
                   summary=d.get("summary", ""))


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
