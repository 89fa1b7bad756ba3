"""ExpertParallelMoE: one rank of an expert-parallel MoE layer, run by our kernels as the rank's plan says.

The layer is seed 000's split: prepare (router and routing, where the tokens live), dispatch (the plan's
`dispatch` stage: tokens to the ranks holding their experts), the experts (a MoERunner over this rank's
experts, fed the dispatched rows already routed), combine (their partial rows back, summed per token), and
finalize's shared experts, again where the tokens live. Every rank calls it with its own tokens, at the same
time (the all-to-alls are collective).

Dual-batch overlap (`overlap=True`, seed 001): a call's tokens are split in two micro-batches, each with its own
dispatch state (dispatcher, received rows, the experts' output and workspace, the shared experts' buffers),
run on two CUDA streams forked from the caller's and joined back to it with events, so that one micro-batch's
dispatch or combine (NVLink / NCCL traffic) runs while the other's experts compute:

    caller's stream: routing | D0 | E0 | C0 S0 |               (join)
    side stream    :               | D1 | E1 | C1 S1 |
                                (D1 after D0, E1 after E0)

D = dispatch, E = the rank's experts, C = combine, S = shared experts. The host issues the steps in one order
on every rank (D0, E0, D1, C0, S0, E1, C1, S1), whatever its token count: each micro-batch's dispatcher pairs
its signals / all-to-alls only with the same micro-batch's on the other ranks, and a micro-batch without
tokens still takes part (the peers may send it rows).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
from .dispatch import Dispatched, NcclDispatch, NvlinkDispatch, NvlinkDispatched, PermutedDispatched, PermuteLayout
from .prepare_finalize import PrepareFinalize
from .runner import MoERunner, device_target, require_cuda
from .workspace import Workspace, workspace_layout

Dispatcher = NcclDispatch | NvlinkDispatch
Received = Dispatched | NvlinkDispatched | PermutedDispatched
GROUPED_FORMATS = ("permuted", "batched")  # the plan's ep_formats whose rows arrive grouped by expert


def micro_batch_spans(tokens: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The token ranges [lo, hi) of an overlapped call's two micro-batches: halves, the first taking the odd
    token (so one token leaves the second empty)."""
    half = (tokens + 1) // 2
    return (0, half), (half, tokens)


def micro_batch_capacity(recv_capacity: int, max_tokens: int) -> int:
    """Rows each micro-batch gathers in the non-blocking nvlink mode: recv_capacity's share for a micro-batch of
    at most ceil(max_tokens / 2) tokens, rounded up, so recv_capacity = ep_size * max_tokens (room for every
    row) still never overflows."""
    return -(-recv_capacity * micro_batch_spans(max_tokens)[0][1] // max_tokens)


def check_options(overlap: object, dispatch_sms: object, combine_sms: object, pad_multiple: object = 1,
                  expert_capacity: object = None) -> None:
    """The layer's switches, refused in one line before anything is built."""
    if not isinstance(overlap, bool):
        raise MoeBuildError("overlap", f"must be a bool, got {overlap!r}", (True, False))
    if isinstance(pad_multiple, bool) or not isinstance(pad_multiple, int) or pad_multiple < 1:
        raise MoeBuildError("pad_multiple", f"must be a positive row count, got {pad_multiple!r}", "integers >= 1")
    if expert_capacity is not None and (isinstance(expert_capacity, bool) or not isinstance(expert_capacity, int)
                                        or expert_capacity < 1):
        raise MoeBuildError("expert_capacity", f"must be a positive row count, got {expert_capacity!r}",
                            "integers >= 1, or None")
    for field, sms in (("dispatch_sms", dispatch_sms), ("combine_sms", combine_sms)):
        if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int) or sms < 1):
            raise MoeBuildError(field, f"must be a positive SM count, got {sms!r}",
                                "integers >= 1, or None (the kernels' own grid)")


@dataclass
class _MicroBatch:
    """What one in-flight micro-batch owns: its dispatcher (symmetric buffers and signals of its own), the
    experts' fixed output rows and workspace (non-blocking nvlink) and the shared experts' buffers."""

    dispatcher: Dispatcher
    fixed: tuple[torch.Tensor, torch.Tensor] | None   # (partial rows, the experts' flat workspace)
    shared: Workspace | None


class ExpertParallelMoE:
    """`layer(hidden, router_logits=None, topk_ids=None, topk_weights=None, out=None)` on rank `spec.ep_rank` of an
    `ep_size`-rank group.

    `spec` is the rank's (`MoESpec.for_rank`), `weights` the rank's (`MoEWeights.for_rank`: its experts, the
    router and shared experts whole). `max_tokens` (the same on every rank: the nvlink dispatch lays its peers'
    receive slots out by it) bounds a call's tokens on this rank; the experts may receive
    up to `ep_size` times as many rows (every rank's every token), so their plan covers that range, while
    their buffers are sized per call from the exchanged counts. With the `nvlink` dispatch, `recv_capacity`
    (rows) selects its non-blocking mode: the experts always run on that many received rows (rows past the
    received ones route nowhere; rows past it are dropped and `overflow` is set), with no host synchronization,
    so a call can be captured in a CUDA graph.

    `overlap=True` runs each call as two micro-batches on two streams (dual-batch overlap, see the module
    docstring), so one micro-batch's dispatch and combine hide behind the other's expert compute; the per-token
    math is the non-overlapped call's (its GEMMs see half the rows, so a bf16 rounding may fall otherwise). It
    works with both dispatches and stays graph-capturable in the non-blocking nvlink mode, where each
    micro-batch gathers `micro_batch_capacity(recv_capacity, max_tokens)` rows and drops (and flags) rows past
    that on its own. Every rank of the group must choose the same `overlap`.

    The plan's ep_format says how the rows reach this rank's experts: contiguous (the received rows with their
    top-k ids, each rank's partial sum per token returned), or grouped by local expert through either dispatch's
    dispatch_with_permute (permuted: groups padded to `pad_multiple` rows; batched: `expert_capacity` rows per
    expert, pairs past it dropped and flagged in `overflow`), the experts running their GEMMs alone and every
    (token, k) output going back to be weighted and summed in k order where the token lives (bit for bit the
    single-GPU layer's separate finalize; the planner takes it for deterministic targets).

    A call may give every rank's token count (`tokens_per_rank`, the same list on every rank, as a serving loop
    knows them once per step): the nccl dispatch then takes the plan's `nccl_exchange` band (`all_gather`: nothing
    read on the host, so the call is graph-capturable); without it the nccl dispatch finds them (the two phases).

    `dispatch_sms` / `combine_sms` (nvlink dispatch only; None: the kernels' own grid) cap the SMs the dispatch
    side (rows into the peers, the gather) and the combine side (partials back, the per-token sum) occupy: at
    most that many blocks, one SM each, leaving the rest to expert compute running beside them (overlap).
    """

    def __init__(self, spec: MoESpec, weights: MoEWeights, group: dist.ProcessGroup | None = None,
                 max_tokens: int = 4096, target: Target | None = None, device: torch.device | str = "cuda",
                 force: dict[str, str] | None = None, recv_capacity: int | None = None, overlap: bool = False,
                 dispatch_sms: int | None = None, combine_sms: int | None = None, pad_multiple: int = 1,
                 expert_capacity: int | None = None) -> None:
        if spec.ep_rank is None:
            raise MoeBuildError("ep_rank", "an expert-parallel layer is built per rank", f"0..{spec.ep_size - 1}")
        check_options(overlap, dispatch_sms, combine_sms, pad_multiple, expert_capacity)
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
        for field, sms in (("dispatch_sms", dispatch_sms), ("combine_sms", combine_sms)):
            if sms is not None and backend != "nvlink":
                raise MoeBuildError(field, f"{sms!r} with dispatch={backend}: NCCL sizes its own kernels",
                                    "an SM count with the nvlink dispatch, or None")
        fmt = plan.stage("ep_format").choice
        self.layout = None if fmt not in GROUPED_FORMATS else PermuteLayout(
            pad_multiple, 0 if expert_capacity is None else expert_capacity)
        if (fmt == "batched") != (expert_capacity is not None):
            raise MoeBuildError("expert_capacity", f"{expert_capacity!r} with ep_format={fmt}",
                                "max rows per expert with the batched format (force ep_format=batched), else None")
        if pad_multiple != 1 and fmt != "permuted":
            raise MoeBuildError("pad_multiple", f"{pad_multiple} with ep_format={fmt}",
                                "1, or any row count with the permuted format")
        if recv_capacity is not None and self.layout is not None:
            raise MoeBuildError("recv_capacity", f"{recv_capacity} with ep_format={fmt}: its layout is sized on the "
                                "device, with no host synchronization", "None")
        self.plan: Plan = plan
        self.experts = MoERunner(spec, weights, plan=plan, device=self.device)
        self.weights = self.experts.weights
        self.recv_capacity = recv_capacity
        self.overlap = overlap
        deterministic = bool(plan.target.get("deterministic", False))
        self.prepare_finalize = PrepareFinalize(spec, self.weights, kernels, deterministic)
        # Where the tokens live: the router's logits and the routed ids / weights, for the whole call (routed once,
        # then sliced per micro-batch, so a token's routing never depends on the split).
        steps = {S.ROUTER_GEMM, S.ROUTING} | ({S.SHARED_EXPERTS} if spec.shared.count else set())
        self._source = Workspace({k: v for k, v in workspace_layout(spec, steps, max_tokens).items()
                                  if k in ("topk_ids", "topk_weights", "logits")}, self.device)
        part_tokens = micro_batch_spans(max_tokens)[0][1] if overlap else max_tokens
        capacity = None if recv_capacity is None else (
            micro_batch_capacity(recv_capacity, max_tokens) if overlap else recv_capacity)
        self._parts = [self._micro_batch(backend, part_tokens, capacity, group, steps, dispatch_sms, combine_sms)
                       for _ in range(2 if overlap else 1)]
        if overlap:
            self._side = torch.cuda.Stream(self.device)
            self._dispatched, self._computed = torch.cuda.Event(), torch.cuda.Event()
            self._overflow = torch.zeros(1, dtype=torch.int32, device=self.device)

    def _micro_batch(self, backend: str, tokens: int, capacity: int | None, group: dist.ProcessGroup | None,
                     steps: set[str], dispatch_sms: int | None, combine_sms: int | None) -> _MicroBatch:
        """One micro-batch's own state for calls of up to `tokens` tokens (the whole call without overlap)."""
        spec = self.spec
        dispatcher: Dispatcher = (
            NvlinkDispatch(spec, kernels, tokens, group, capacity, self.device, dispatch_sms, combine_sms,
                           waits_in_kernels=not self.overlap, unpermute=self.layout)
            if backend == "nvlink" else NcclDispatch(spec, kernels, group, unpermute=self.layout,
                                                     exchange=self.plan.stage("nccl_exchange")))
        # non-blocking: the experts' rows, output and workspace are fixed, sized once (nvlink's grouped formats:
        # the layout's rows, top_k rows to a workspace token); the nccl dispatch sizes them per call
        if self.layout is not None and backend == "nvlink":
            rows = self.layout.rows(spec.ep_size, tokens, spec.top_k, spec.local_experts)
            fixed = (torch.empty(rows, spec.hidden_size, dtype=self.experts.dtype, device=self.device),
                     torch.empty(self.experts.workspace_bytes(rows // spec.top_k), dtype=torch.uint8,
                                 device=self.device))
        else:
            fixed = None if capacity is None else (
                torch.empty(capacity, spec.hidden_size, dtype=self.experts.dtype, device=self.device),
                torch.empty(self.experts.workspace_bytes(capacity), dtype=torch.uint8, device=self.device))
        shared = None
        if spec.shared.count:
            layout = workspace_layout(spec, steps, tokens)
            shared = Workspace({k: v for k, v in layout.items() if k.startswith("shared_")}, self.device)
        return _MicroBatch(dispatcher, fixed, shared)

    def __call__(self, hidden: torch.Tensor, router_logits: torch.Tensor | None = None,
                 topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, tokens_per_rank: Sequence[int] | None = None) -> torch.Tensor:
        """This rank's output for its tokens `hidden` [T, H] (into `out`, shaped and typed like it, where given);
        routing pinned with `router_logits` [T, E] or global `topk_ids` and `topk_weights` [T, K] (as MoERunner's).
        `tokens_per_rank`: every rank's T of this call, the same list on every rank, where the caller knows them (a
        serving loop exchanges them once per step for all its layers): the nccl dispatch then takes the plan's
        all-gather form, with no count exchange and no host synchronization (None: the two phases find them)."""
        x = self.experts.check_hidden(hidden)
        T = x.shape[0]
        if T > self.max_tokens:
            raise MoeBuildError("tokens", f"{T} exceeds max_tokens={self.max_tokens}", f"0..{self.max_tokens}")
        if tokens_per_rank is not None and (len(tokens_per_rank) != self.spec.ep_size
                                            or tokens_per_rank[self.spec.ep_rank] != T
                                            or any(isinstance(t, bool) or not isinstance(t, int)
                                                   or not 0 <= t <= self.max_tokens for t in tokens_per_rank)):
            raise MoeBuildError("tokens_per_rank", f"{list(tokens_per_rank)!r} for rank {self.spec.ep_rank}'s {T} "
                                f"tokens", f"{self.spec.ep_size} counts in 0..{self.max_tokens}, this rank's {T}, "
                                "or None")
        if out is None:
            out = torch.empty_like(hidden)
        elif out.shape != hidden.shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
            raise MoeBuildError("out", "must be a contiguous tensor shaped and typed like hidden", str(x.dtype))
        result, out = out, out.view(T, self.spec.hidden_size)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        views = self._source.views(T)
        b = Batch(T, x, out, views, stream, None, None, topk_ids=views["topk_ids"], topk_weights=views["topk_weights"])
        self.experts.bind_routing(b, router_logits, topk_ids, topk_weights)
        # The caller's tensors are checked above and every other is the layer's own, right by construction: the
        # kernel wrappers skip their per-tensor checks (as MoERunner's call does).
        with kernels.trusted_tensors():
            if topk_ids is None and T:
                if router_logits is None:
                    self.prepare_finalize.router_gemm(b)
                self.prepare_finalize.routing(b)
            counts = None if tokens_per_rank is None else list(tokens_per_rank)
            if self.overlap:
                self._overlapped(b, counts)
            else:
                part = self._parts[0]
                d = self._dispatch(part, b, 0, T, counts)
                self._finish(part, b, d, self._experts(part, d), 0, T)
        return result

    def _overlapped(self, b: Batch, tokens_per_rank: list[int] | None) -> None:
        """The two micro-batches, issued in the order of the module docstring (the same on every rank): the side
        stream forks from the caller's after the routing and joins it before the call returns, through events
        only (no host synchronization of its own), so a CUDA graph captures both streams."""
        main, side = torch.cuda.current_stream(self.device), self._side
        first, second = self._parts
        (lo0, hi0), (lo1, hi1) = micro_batch_spans(b.tokens)
        # every rank's micro-batches, split as that rank splits its call
        counts = [None, None] if tokens_per_rank is None else [
            [hi - lo for lo, hi in (micro_batch_spans(t)[i] for t in tokens_per_rank)] for i in (0, 1)]
        side.wait_stream(main)  # fork: the routed ids and weights are there
        d0 = self._dispatch(first, b, lo0, hi0, counts[0])
        self._dispatched.record(main)
        p0 = self._experts(first, d0)
        self._computed.record(main)
        with torch.cuda.stream(side):
            side.wait_event(self._dispatched)  # one dispatch at a time: D0 gets the links to itself
            d1 = self._dispatch(second, b, lo1, hi1, counts[1])
        self._finish(first, b, d0, p0, lo0, hi0)  # C0 + S0 beside E1
        with torch.cuda.stream(side):
            # one expert computation at a time: two would only split the SMs, and the placed GEMMs lay their tiles
            # out for a GPU of their own
            side.wait_event(self._computed)
            self._finish(second, b, d1, self._experts(second, d1), lo1, hi1)
        main.wait_stream(side)  # join
        flags = self._overflow_flags()
        if flags is not None:  # on the stream, so a captured call updates it on every replay
            torch.maximum(flags[0], flags[1], out=self._overflow)

    def _dispatch(self, part: _MicroBatch, b: Batch, lo: int, hi: int,
                  tokens_per_rank: list[int] | None) -> Received:
        """Tokens [lo, hi) of the call to the ranks holding their experts, on the current stream (collective:
        called for every micro-batch, however few tokens it has); `tokens_per_rank`: every rank's count of this
        (micro-)batch where the caller gave them (the nccl dispatch's all-gather form)."""
        if self.layout is not None:
            return part.dispatcher.dispatch_with_permute(b.hidden[lo:hi], b.topk_ids[lo:hi], b.topk_weights[lo:hi])
        if isinstance(part.dispatcher, NcclDispatch):
            return part.dispatcher.dispatch(b.hidden[lo:hi], b.topk_ids[lo:hi], b.topk_weights[lo:hi],
                                            tokens_per_rank)
        return part.dispatcher.dispatch(b.hidden[lo:hi], b.topk_ids[lo:hi], b.topk_weights[lo:hi])

    def _experts(self, part: _MicroBatch, d: Received) -> torch.Tensor:
        """This rank's experts over the rows `d` received, on the current stream: their partial output rows."""
        if isinstance(d, PermutedDispatched):
            if part.fixed is not None:
                partial, flat = part.fixed
            else:
                partial = torch.empty_like(d.rows)
                flat = torch.empty(self.experts.workspace_bytes(d.rows.shape[0] // self.spec.top_k),
                                   dtype=torch.uint8, device=self.device)
            return self.experts.grouped_experts(d.rows, d.expert_offsets, partial, flat)
        rows = d.hidden.shape[0]
        if part.fixed is not None:
            partial, flat = part.fixed
        else:
            partial = torch.empty_like(d.hidden)
        if rows:
            if part.fixed is None:
                flat = torch.empty(self.experts.workspace_bytes(rows), dtype=torch.uint8, device=self.device)
            self.experts(d.hidden, topk_ids=d.topk_ids, topk_weights=d.topk_weights, out=partial, workspace=flat)
        return partial

    def _finish(self, part: _MicroBatch, b: Batch, d: Received, partial: torch.Tensor, lo: int, hi: int) -> None:
        """Combine (collective) into out[lo:hi], then the shared experts of those tokens, on the current stream."""
        out = b.out[lo:hi]
        if isinstance(d, PermutedDispatched):
            part.dispatcher.combine_with_unpermute(partial, d, b.topk_ids[lo:hi], b.topk_weights[lo:hi], out)
        else:
            part.dispatcher.combine(partial, d, out)
        if part.shared is not None and hi > lo:
            stream = torch.cuda.current_stream(self.device).cuda_stream
            self.prepare_finalize.shared_experts(Batch(hi - lo, b.hidden[lo:hi], out, part.shared.views(hi - lo),
                                                       stream, None, None))

    @property
    def overflow(self) -> torch.Tensor | None:
        """The last call's overflow flag ([1] int32 on the device: 1 where received rows past recv_capacity, or the
        batched format's pairs past an expert's max rows, were dropped, by either micro-batch with overlap); None
        where nothing can be dropped."""
        flags = self._overflow_flags()
        if flags is None:
            return None
        return self._overflow if self.overlap else flags[0]

    def _overflow_flags(self) -> list[torch.Tensor] | None:
        """Each micro-batch's overflow flag of its last call, None where nothing can be dropped."""
        if self.layout is not None:
            if not self.layout.expert_capacity:
                return None
            return [part.dispatcher.unpermute_overflow for part in self._parts]
        if self.recv_capacity is None:
            return None
        return [part.dispatcher.overflow for part in self._parts]


def rank_layer(spec: MoESpec, weights: MoEWeights, rank: int, **kwargs: object) -> ExpertParallelMoE:
    """Rank `rank`'s layer from the whole layer's spec and weights (every expert), as a test or a single-host
    deployment holds them."""
    return ExpertParallelMoE(spec.for_rank(rank), weights.for_rank(spec, rank), **kwargs)  # type: ignore[arg-type]
