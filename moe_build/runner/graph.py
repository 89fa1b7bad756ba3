"""A CUDA graph of one runner call: static inputs/outputs, replay without launch overhead.

Why it works: the runner allocates nothing per call and its workspace views have stable
addresses, so one captured call replays correctly after the static inputs are refilled.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .runner import MoERunner
    from .sequence import RoutingInput


class GraphedMoE:
    """`hidden` (and `router_logits` or `topk_ids`/`topk_weights`) in, `out` after `replay()`."""

    def __init__(self, runner: "MoERunner", tokens: int, routing_input: "RoutingInput" = "hidden") -> None:
        spec, dev = runner.spec, runner.device
        # The graph replays the runner's kernels on the runner's weights and workspace: holding the
        # runner keeps that memory alive for as long as the graph can be replayed.
        self.runner = runner
        self.tokens = tokens
        self.hidden = torch.randn(tokens, spec.hidden_size, device=dev).to(runner.dtype)
        self.out = torch.empty_like(self.hidden)
        self.router_logits = self.topk_ids = self.topk_weights = None
        kwargs: dict[str, torch.Tensor] = {}
        if routing_input == "logits":
            self.router_logits = kwargs["router_logits"] = torch.randn(tokens, spec.num_experts, device=dev)
        elif routing_input == "topk":
            self.topk_ids = kwargs["topk_ids"] = torch.stack(
                [torch.randperm(spec.num_experts, device=dev)[: spec.top_k] for _ in range(tokens)]).int()
            self.topk_weights = kwargs["topk_weights"] = torch.rand(tokens, spec.top_k, device=dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up off the capture: library handles, lazy module loads
            runner(self.hidden, out=self.out, **kwargs)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            runner(self.hidden, out=self.out, **kwargs)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out
