"""A CUDA graph of one runner call: static inputs/outputs, replay without launch overhead.

Why it works: the runner allocates nothing per call and its workspace views have stable
addresses, so one captured call replays correctly after the static inputs are refilled.
"""
from __future__ import annotations

from typing import Protocol

import torch

from ..spec import MoESpec
from .sequence import RoutingInput


class Runner(Protocol):
    """What a graph needs of the runner it captures (moe_build.runner.MoERunner)."""

    spec: MoESpec
    device: torch.device
    dtype: torch.dtype

    def __call__(self, hidden: torch.Tensor, router_logits: torch.Tensor | None = None,
                 topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor: ...


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _capture_stream(dev: torch.device) -> torch.cuda.Stream:
    """One stream per device for every graph's warm-up and capture: the runner keeps a workspace per
    stream, so the graphs of one runner share the one it allocates for this stream at the first warm-up
    (as they shared its single workspace before), instead of each graph's own stream adding one."""
    if dev not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[dev] = torch.cuda.Stream(dev)
    return _CAPTURE_STREAMS[dev]


class GraphedMoE:
    """`hidden` (and `router_logits` or `topk_ids`/`topk_weights`) in, `out` after `replay()`."""

    def __init__(self, runner: Runner, tokens: int, routing_input: RoutingInput = "hidden") -> None:
        spec, dev = runner.spec, runner.device
        # The graph replays the runner's kernels on the runner's weights and its workspace for the capture
        # stream: holding the runner keeps that memory alive for as long as the graph can be replayed.
        # Graphs of one runner share that workspace, so replay them on one stream at a time.
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
        capture = _capture_stream(dev)
        capture.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(capture):  # warm-up off the capture: library handles, lazy module loads
            runner(self.hidden, out=self.out, **kwargs)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=capture):
            runner(self.hidden, out=self.out, **kwargs)
        torch.cuda.current_stream(dev).wait_stream(capture)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out
