"""ExpertParallelMoE: one rank of an expert-parallel MoE layer, run by our kernels as the rank's plan says.

The layer is seed 000's split: prepare (router and routing, where the tokens live), dispatch (the plan's
`dispatch` stage: tokens to the ranks holding their experts), the experts (a MoERunner over this rank's
experts, fed the dispatched rows already routed), combine (their partial rows back, summed per token), and
finalize's shared experts, again where the tokens live. Every rank calls it with its own tokens, at the same
time (the all-to-alls are collective).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import kernels
from ..errors import MoeBuildError
from ..planner import Plan, make_plan
from ..spec import MoESpec
from ..target import Target
from ..weights import MoEWeights
from . import sequence as S
from .batch import Batch
from .dispatch import NcclDispatch, NvlinkDispatch
from .prepare_finalize import PrepareFinalize
from .runner import MoERunner, device_target, require_cuda
from .workspace import Workspace, workspace_layout


class ExpertParallelMoE:
    """`layer(hidden, router_logits=None, topk_ids=None, topk_weights=None, out=None)` on rank `spec.ep_rank` of an
    `ep_size`-rank group.

    `spec` is the rank's (`MoESpec.for_rank`), `weights` the rank's (`MoEWeights.for_rank`: its experts, the
    router and shared experts whole). `max_tokens` bounds a call's tokens on this rank; the experts may receive
    up to `ep_size` times as many rows (every rank's every token), so their plan covers that range, while
    their buffers are sized per call from the exchanged counts. With the `nvlink` dispatch, `recv_capacity`
    (rows) selects its non-blocking mode: the experts always run on that many received rows (rows past the
    received ones route nowhere; rows past it are dropped and `overflow` is set), with no host synchronization,
    so a call can be captured in a CUDA graph.
    """

    def __init__(self, spec: MoESpec, weights: MoEWeights, group: dist.ProcessGroup | None = None,
                 max_tokens: int = 4096, target: Target | None = None, device: torch.device | str = "cuda",
                 force: dict[str, str] | None = None, recv_capacity: int | None = None) -> None:
        if spec.ep_rank is None:
            raise MoeBuildError("ep_rank", "an expert-parallel layer is built per rank", f"0..{spec.ep_size - 1}")
        self.device = require_cuda(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.spec = spec
        self.max_tokens = max_tokens
        plan = make_plan(spec, device_target(self.device, max_tokens * spec.ep_size, target),
                         tokens=max_tokens * spec.ep_size, force=force)
        backend = plan.stage("dispatch").choice
        if backend not in ("nccl", "nvlink"):
            raise MoeBuildError("dispatch", f"the plan's dispatch is {backend!r}; this layer runs a rank's experts "
                                "with tokens dispatched to them", ("nvlink", "nccl"))
        if recv_capacity is not None and (backend != "nvlink" or not 1 <= recv_capacity <= max_tokens * spec.ep_size):
            raise MoeBuildError("recv_capacity", f"{recv_capacity!r} with dispatch={backend}",
                                f"1..{max_tokens * spec.ep_size} rows with the nvlink dispatch, or None")
        self.plan: Plan = plan
        self.experts = MoERunner(spec, weights, plan=plan, device=self.device)
        self.weights = self.experts.weights
        self.recv_capacity = recv_capacity
        self.dispatcher: NcclDispatch | NvlinkDispatch = (
            NvlinkDispatch(spec, kernels, max_tokens, group, recv_capacity, self.device) if backend == "nvlink"
            else NcclDispatch(spec, kernels, group))
        # non-blocking: the experts' rows, output and workspace are fixed, sized once
        self._fixed = None if recv_capacity is None else (
            torch.empty(recv_capacity, spec.hidden_size, dtype=self.experts.dtype, device=self.device),
            torch.empty(self.experts.workspace_bytes(recv_capacity), dtype=torch.uint8, device=self.device))
        deterministic = bool(plan.target.get("deterministic", False))
        self.prepare_finalize = PrepareFinalize(spec, self.weights, kernels, deterministic)
        # Where the tokens live: the router's logits, the routed ids / weights and the shared experts' buffers.
        source_steps = {S.ROUTER_GEMM, S.ROUTING} | ({S.SHARED_EXPERTS} if spec.shared.count else set())
        layout = {k: v for k, v in workspace_layout(spec, source_steps, max_tokens).items()
                  if k in ("topk_ids", "topk_weights", "logits") or k.startswith("shared_")}
        self._source = Workspace(layout, self.device)

    def __call__(self, hidden: torch.Tensor, router_logits: torch.Tensor | None = None,
                 topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's output for its tokens `hidden` [T, H] (into `out`, shaped and typed like it, where given);
        routing pinned with `router_logits` [T, E] or global `topk_ids` and `topk_weights` [T, K] (as MoERunner's)."""
        x = self.experts.check_hidden(hidden)
        T = x.shape[0]
        if T > self.max_tokens:
            raise MoeBuildError("tokens", f"{T} exceeds max_tokens={self.max_tokens}", f"0..{self.max_tokens}")
        if out is None:
            out = torch.empty_like(hidden)
        elif out.shape != hidden.shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
            raise MoeBuildError("out", "must be a contiguous tensor shaped and typed like hidden", str(x.dtype))
        result, out = out, out.view(T, self.spec.hidden_size)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        views = self._source.views(T)
        b = Batch(T, x, out, views, stream, None, None, topk_ids=views["topk_ids"], topk_weights=views["topk_weights"])
        self.experts.bind_routing(b, router_logits, topk_ids, topk_weights)
        if topk_ids is None and T:
            if router_logits is None:
                self.prepare_finalize.router_gemm(b)
            self.prepare_finalize.routing(b)
        d = self.dispatcher.dispatch(x, b.topk_ids, b.topk_weights)
        rows = d.hidden.shape[0]
        if self._fixed is not None:
            partial, flat = self._fixed
        else:
            partial = torch.empty_like(d.hidden)
        if rows:
            if self._fixed is None:
                flat = torch.empty(self.experts.workspace_bytes(rows), dtype=torch.uint8, device=self.device)
            self.experts(d.hidden, topk_ids=d.topk_ids, topk_weights=d.topk_weights, out=partial, workspace=flat)
        self.dispatcher.combine(partial, d, out)
        if self.spec.shared.count and T:
            self.prepare_finalize.shared_experts(b)
        return result

    @property
    def overflow(self) -> torch.Tensor | None:
        """The last call's overflow flag ([1] int32 on the device: 1 where received rows past recv_capacity were
        dropped); None outside the non-blocking nvlink mode."""
        return self.dispatcher.overflow if self.recv_capacity is not None else None


def rank_layer(spec: MoESpec, weights: MoEWeights, rank: int, **kwargs: object) -> ExpertParallelMoE:
    """Rank `rank`'s layer from the whole layer's spec and weights (every expert), as a test or a single-host
    deployment holds them."""
    return ExpertParallelMoE(spec.for_rank(rank), weights.for_rank(spec, rank), **kwargs)  # type: ignore[arg-type]

