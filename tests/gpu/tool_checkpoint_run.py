"""What the tool-checkpoint GPU tests share (tests/gpu/test_runner_fp8_checkpoints.py, test_runner_woq_checkpoints.py):
one quantized checkpoint through moe-build's loader and the runner, and its dequantized twin through transformers'
own MoE block (fp32, on the CPU), on the same random tokens with routing pinned by the gate's fp32 logits."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F

from moe_build.target import Flavour, Target
from moe_build.weights.checkpoint import load_moe_layer


class ToolRun(NamedTuple):
    loaded: Any               # the quantized checkpoint's LoadedLayer
    x: torch.Tensor           # [tokens, H] bf16, on the CPU
    logits: torch.Tensor      # [tokens, E] fp32: transformers' gate on x
    transformers: torch.Tensor  # the block's output on the dequantized twin, fp32
    runner: torch.Tensor      # our runner's output on the quantized checkpoint, bf16, every element written


def run_tool_checkpoint(case_folder: Path, quantized: str, tokens: int) -> ToolRun:
    """`case_folder`/`quantized` through the runner and `case_folder`/dequantized through transformers."""
    from moe_build.runner import MoERunner
    transformers = pytest.importorskip("transformers")
    loaded = load_moe_layer(case_folder / quantized)
    model = transformers.AutoModelForCausalLM.from_pretrained(case_folder / "dequantized", dtype=torch.float32).eval()
    block = model.model.layers[loaded.layer].mlp
    g = torch.Generator().manual_seed(sum(map(ord, case_folder.name)))
    x = torch.randn(tokens, loaded.spec.hidden_size, generator=g).to(torch.bfloat16)
    gate = block.gate if hasattr(block, "gate") else block.router
    with torch.no_grad():
        logits = F.linear(x.float(), gate.weight.float())
        hf = block(x.float()[None])
    hf = (hf[0] if isinstance(hf, tuple) else hf)[0]

    major, minor = torch.cuda.get_device_capability()
    runner = MoERunner(loaded.spec, loaded.weights, target=Target(sm=major * 10 + minor, flavour=Flavour.TENSORRT),
                       max_tokens=tokens)
    out = torch.full((tokens, loaded.spec.hidden_size), float("nan"), dtype=torch.bfloat16, device="cuda")
    runner(x.cuda(), router_logits=logits.cuda(), out=out)
    torch.cuda.synchronize()
    got = out.cpu()
    assert not got.isnan().any(), "an output element was not written"
    return ToolRun(loaded, x, logits, hf, got)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()
