"""The tensors of one runner call: the caller's inputs/outputs plus this call's workspace views."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch


@dataclass
class Batch:
    """What every step reads and writes; steps mutate buffers, never rebind them."""

    tokens: int
    hidden: torch.Tensor                 # [T, H], model dtype, contiguous
    out: torch.Tensor                    # [T, H], model dtype
    views: dict[str, torch.Tensor]       # this call's workspace views (Workspace.views(T))
    stream: int                          # the CUDA stream every kernel of the call is launched on
    gemm1_tactic: object                 # the plan's tactics at this token count (kernels.tactic_struct)
    gemm2_tactic: object
    step_tactics: Mapping[str, object] = field(default_factory=dict)  # the FP8 row steps' (kernels.StepTactic) by stage
    logits: torch.Tensor | None = None   # [T, E] (caller's or the router GEMM's)
    topk_ids: torch.Tensor | None = None      # [T, K] int32
    topk_weights: torch.Tensor | None = None  # [T, K] fp32

    def v(self, name: str) -> torch.Tensor:
        return self.views[name]
