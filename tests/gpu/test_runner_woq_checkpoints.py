"""Weight-only checkpoints written by their producers' own code, run end to end through the runner on the GPU.

scripts/make_woq_tool_checkpoints.py (run on a CPU machine with compressed-tensors and ModelOpt, the folder then
carried to the GPU, whose machine lacks the tools) writes tiny Qwen3-MoE, Mixtral and DeepSeek-V3 checkpoints:
compressed-tensors W4A16 (group 32), W4A16 asymmetric (group 64) and W8A16 (per channel), ModelOpt W4A16_AWQ (group
64, with pre-quant scales) and AutoAWQ GEMM (group 64); beside each, the same model dequantized in bf16 (by
compressed-tensors itself where it has a decompressor), the pre-quant scales folded into the weights. Here each
checkpoint goes through moe-build's loader and the weight-only runner, and is compared with
- transformers' own MoE block on the dequantized twin (fp32, on the CPU): the same math, the weights rounded to bf16
  on both sides (the runner's pre-quant scale multiplies the activations instead of the weights, one rounding apart);
  the CPU machine measured 2.2e-3 to 3.0e-3 of the output norm between that twin and the fp64 reference, so the bound
  is the weight-only runner's own (tests/gpu/test_runner_woq.py): 2 % of the output norm;
- the fp64 reference of the same layer (moe_build.reference): 2 % of the output norm, 4 % per token.
Routing is pinned: both sides get the fp32 router logits transformers' gate computes from the same inputs.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tool_checkpoint_run import rel, run_tool_checkpoint

from moe_build.reference import moe_reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

ENV = "MOE_BUILD_WOQ_TOOL_CHECKPOINTS"
FOLDER = Path(os.environ.get(ENV, "")) if os.environ.get(ENV) else None
CASES = sorted(p.name for p in FOLDER.iterdir()) if FOLDER is not None and FOLDER.is_dir() else []
TOOL_BOUND = 0.02
REL_TOL, TOKEN_TOL = 0.02, 0.04
TOKENS = 48


def test_the_tool_checkpoints_are_here() -> None:
    """Without the carried folder every case below would be absent, not passed: say so instead."""
    if FOLDER is None:
        pytest.skip(f"{ENV} is not set (scripts/make_woq_tool_checkpoints.py writes the folder on a CPU machine "
                    "with compressed-tensors and ModelOpt; scripts/device_run.sh passes it)")
    assert len(CASES) == 15, f"expected 3 families x 5 formats under {FOLDER}, found {CASES}"


@pytest.mark.parametrize("case", CASES)
def test_tool_checkpoint_through_the_runner(case: str) -> None:
    r = run_tool_checkpoint(FOLDER / case, "woq", TOKENS)
    assert r.loaded.weights.woq is not None, f"{case}: the experts did not stay quantized"
    tool = rel(r.runner, r.transformers)
    assert tool < TOOL_BOUND, f"{case}: {tool:.4f} from transformers on the dequantized twin"
    ref = moe_reference(r.loaded.spec, r.loaded.weights, r.x, router_logits=r.logits)
    per_token = ((r.runner.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max().item()
    assert rel(r.runner, ref) < REL_TOL and per_token < TOKEN_TOL, \
        f"{case}: rel {rel(r.runner, ref):.4f}, worst token {per_token:.4f} against the fp64 reference"
