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
import torch.nn.functional as F

from moe_build.reference import moe_reference
from moe_build.target import Flavour, Target
from moe_build.weights.checkpoint import load_moe_layer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (scripts/device_run.sh runs these on one)")]

ENV = "MOE_BUILD_WOQ_TOOL_CHECKPOINTS"
FOLDER = Path(os.environ.get(ENV, "")) if os.environ.get(ENV) else None
CASES = sorted(p.name for p in FOLDER.iterdir()) if FOLDER is not None and FOLDER.is_dir() else []
TOOL_BOUND = 0.02
REL_TOL, TOKEN_TOL = 0.02, 0.04
TOKENS = 48


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_the_tool_checkpoints_are_here() -> None:
    """Without the carried folder every case below would be absent, not passed: say so instead."""
    if FOLDER is None:
        pytest.skip(f"{ENV} is not set (scripts/make_woq_tool_checkpoints.py writes the folder on a CPU machine "
                    "with compressed-tensors and ModelOpt; scripts/device_run.sh passes it)")
    assert len(CASES) == 15, f"expected 3 families x 5 formats under {FOLDER}, found {CASES}"


@pytest.mark.parametrize("case", CASES)
def test_tool_checkpoint_through_the_runner(case: str) -> None:
    from moe_build.runner import MoERunner
    transformers = pytest.importorskip("transformers")
    loaded = load_moe_layer(FOLDER / case / "woq")
    assert loaded.weights.woq is not None, f"{case}: the experts did not stay quantized"
    model = transformers.AutoModelForCausalLM.from_pretrained(FOLDER / case / "dequantized",
                                                              dtype=torch.float32).eval()
    block = model.model.layers[loaded.layer].mlp
    g = torch.Generator().manual_seed(sum(map(ord, case)))
    x = torch.randn(TOKENS, loaded.spec.hidden_size, generator=g).to(torch.bfloat16)
    gate = block.gate if hasattr(block, "gate") else block.router
    with torch.no_grad():
        logits = F.linear(x.float(), gate.weight.float())
        hf = block(x.float()[None])
    hf = (hf[0] if isinstance(hf, tuple) else hf)[0]

    major, minor = torch.cuda.get_device_capability()
    runner = MoERunner(loaded.spec, loaded.weights, target=Target(sm=major * 10 + minor, flavour=Flavour.TENSORRT),
                       max_tokens=TOKENS)
    out = torch.full((TOKENS, loaded.spec.hidden_size), float("nan"), dtype=torch.bfloat16, device="cuda")
    runner(x.cuda(), router_logits=logits.cuda(), out=out)
    torch.cuda.synchronize()
    got = out.cpu()
    assert not got.isnan().any(), "an output element was not written"

    tool = _rel(got, hf)
    assert tool < TOOL_BOUND, f"{case}: {tool:.4f} from transformers on the dequantized twin"
    ref = moe_reference(loaded.spec, loaded.weights, x, router_logits=logits)
    per_token = ((got.double() - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max().item()
    assert _rel(got, ref) < REL_TOL and per_token < TOKEN_TOL, \
        f"{case}: rel {_rel(got, ref):.4f}, worst token {per_token:.4f} against the fp64 reference"
