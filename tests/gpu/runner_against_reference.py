"""What the quantized runner GPU tests share (tests/gpu/test_runner_fp8.py, test_runner_woq.py): the device's
target, the spec's torch dtype, and one fresh case run through MoERunner and the fp64 reference."""
from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from moe_build.errors import UnsupportedCombination
from moe_build.reference import moe_reference
from moe_build.spec import DType, MoESpec
from moe_build.target import Flavour, Target
from moe_build.weights import MoEWeights


def device_target(deterministic: bool = False) -> Target:
    major, minor = torch.cuda.get_device_capability()
    return Target(sm=major * 10 + minor, flavour=Flavour.TENSORRT, deterministic=deterministic)


def torch_dtype(spec: MoESpec) -> torch.dtype:
    return {DType.BF16: torch.bfloat16, DType.FP16: torch.float16}[spec.dtype]


def assert_graph_replay_equals_eager(spec: MoESpec, weights: MoEWeights, tokens: int = 64) -> None:
    """A deterministic-target runner's CUDA-graph replay writes exactly its eager call's output, on fresh inputs."""
    from moe_build.runner import MoERunner
    runner = MoERunner(spec, weights, target=device_target(deterministic=True), max_tokens=tokens)
    hidden = torch.randn(tokens, spec.hidden_size, device="cuda").to(torch_dtype(spec))
    logits = torch.randn(tokens, spec.num_experts, device="cuda")
    graphed = runner.capture_graph(tokens, "logits")
    graphed.hidden.copy_(hidden)
    graphed.router_logits.copy_(logits)
    replayed = graphed.replay().clone()
    assert torch.equal(replayed, runner(hidden, router_logits=logits))


class Errors(NamedTuple):
    rel: float         # relative L2 error over the whole output
    per_token: float   # the worst token's relative L2 error
    steps: list[str]   # what the runner ran, for the failure message


def errors_against_reference(spec: MoESpec, weights: MoEWeights, seed: int, tokens: int,
                             force: dict[str, str] | None = None, max_tokens: int | None = None) -> Errors:
    """The runner's output on fresh random tokens (from `seed + 1`, routing pinned by giving both sides the same
    logits) against the fp64 reference; the test is skipped where the planner refuses `force`, and fails where an
    output element (poisoned with NaN first) is left unwritten."""
    from moe_build.runner import MoERunner
    try:
        runner = MoERunner(spec, weights, target=device_target(), max_tokens=max_tokens or tokens, force=force)
    except UnsupportedCombination as e:
        pytest.skip(f"planner refuses {force} for this spec: {e}")
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(tokens, spec.hidden_size, generator=g).to("cuda", torch_dtype(spec))
    logits = torch.randn(tokens, spec.num_experts, generator=g)
    out = torch.full_like(hidden, float("nan"))
    runner(hidden, router_logits=logits.cuda(), out=out)
    torch.cuda.synchronize()
    steps = runner.kernel_sequence(tokens, "logits")
    assert not out.isnan().any(), f"output element not written (seed {seed}, steps {steps})"
    ref = moe_reference(spec, weights, hidden.cpu(), router_logits=logits)
    got = out.double().cpu()
    rel = ((got - ref).norm() / ref.norm()).item()
    per_token = ((got - ref).norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max().item()
    return Errors(rel, per_token, steps)
