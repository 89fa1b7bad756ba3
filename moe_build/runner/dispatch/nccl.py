"""The `nccl` dispatch: two-phase, exact-size exchanges over the NCCL communicator of torch.distributed's process
group.

Phase one (layout and counts): `mb_ep_layout` finds, from the routed top-k ids, the ranks each token goes to
(once per rank, however many of its experts that rank holds), groups the send rows by rank and keeps that
layout (`Dispatched`), so the combine never sorts again; one small exchange swaps the row counts. The counts
come to the host (the one synchronization), and every buffer is sized exactly from them, from torch's caching
allocator (no cudaMalloc once warm), instead of the worst case of every rank's every token arriving (ep_size *
tokens rows).
Phase two (payload): `mb_ep_pack_send` packs the send rows with their top-k ids (already local to the rank each
row goes to) and weights, and one exchange moves all three, landing as the experts read them. Combine is the
reverse exchange of the experts' partial rows (each already the weighted sum over the receiving rank's
experts), summed per token in rank order by `mb_ep_combine`.

The all-gather form (the plan's nccl_exchange `all_gather`, for calls that give every rank's token count, as a
serving loop knows them once per step, within the plan's band): every rank's tokens, ids and weights go to every
rank in one NCCL all-gather (a broadcast per rank where the counts differ), this rank's experts take the rows
holding its experts (`mb_ep_local_ids` maps the others' ids to -1: they route nowhere, their partial rows stay
zero), and one reduce-scatter sums each token's partial rows back into its rank's output. Nothing is counted or
read on the host, so the call also runs inside a CUDA graph; it moves the worst case's bytes, which at top-8 over 2
to 4 ranks is about what the exact sizes move (a token reaches nearly every rank). Eagerly, at decode sizes, its
host time is the call: a dispatch keeps each eager call's launches as a CUDA graph, with the buffers it wrote, by
everything the launches depend on, and replays the graph for the next call with the same key (kept.py).

The exchanges are `mb_ep_nccl_exchange` (cpp/src/stages/ep_nccl.cu): NCCL point-to-point sends and receives in
one group on the caller's stream, over the process group's own communicator (`ProcessGroupNCCL._comm_ptr()`),
rather than torch.distributed.all_to_all_single, whose wrapper's host time made most of the 25 to 90 us each of
the four per dispatch + combine cost before this (bench/ep_host_probe.py, docs/performance.md). Like a collective, every rank of the group makes the
same exchanges in the same order.

dispatch_with_permute / combine_with_unpermute (the plan's ep_format permuted or batched, an instance made with
`unpermute=PermuteLayout(...)`): the same two phases, each row's meta also carrying its token index; the rows
land dense, source after source, and `mb_ep_permute_layout` / `mb_ep_permute_rows` (cap 0: dense) group them by
local expert as for the nvlink dispatch. Back, every row's expert output travels to its token's rank with its
index token * K + k (its count exchanged first: a batched layout may have dropped pairs), lands there in a
zeroed buffer, and `mb_finalize` weights and sums each token's K rows in k order, as one GPU's separate finalize.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.distributed as dist

from ...errors import MoeBuildError
from ...planner.gates import StageDecision
from ...spec import MoESpec
from .group import rank_group
from .kept import KeptGraphs, tensor_key
from .permuted import PermutedDispatched, PermuteLayout, sum_pairs


@dataclass
class Dispatched:
    """One dispatch's result and what its combine needs (seed 004's `handle`)."""

    hidden: torch.Tensor          # [R, H] the rows this rank received, grouped by source rank
    topk_ids: torch.Tensor        # [R, K] int32, this rank's local expert ids; -1 for other ranks' experts
    topk_weights: torch.Tensor    # [R, K] fp32
    send_splits: list[int]        # rows sent to each rank (the combine receives as many back)
    recv_splits: list[int]        # rows received from each rank
    # [T, ep_size] int32: token t's send row for rank d, -1 where not sent; None in the all-gather form (every
    # token goes everywhere: recv_splits are every rank's tokens, and a reduce-scatter sums them back)
    token_slots: torch.Tensor | None
    gathered: bool = False        # the all-gather form

    @property
    def sent_rows(self) -> int:
        return sum(self.send_splits)


def communicator(group: dist.ProcessGroup, device: torch.device) -> int:
    """The address of `group`'s NCCL communicator on `device` (made by a first collective where torch has not made
    it yet), refused in one line where the group's backend is not NCCL."""
    try:
        backend = group._get_backend(device)
        comm = backend._comm_ptr()
        if comm == 0:  # torch makes a group's communicator at its first collective on the device
            dist.all_reduce(torch.zeros(1, device=device), group=group)
            comm = backend._comm_ptr()
    except (AttributeError, RuntimeError) as e:
        raise MoeBuildError("dispatch", f"the nccl dispatch needs a process group with torch's NCCL backend on "
                            f"{device} ({e})", "dist.init_process_group('nccl'), torch >= 2.8") from None
    if not comm:
        raise MoeBuildError("dispatch", f"no NCCL communicator for {device} in the process group",
                            "dist.init_process_group('nccl') with this rank's GPU as the current device")
    return int(comm)


class NcclDispatch:
    """Dispatch and combine for one rank of `spec`'s expert-parallel group over `group`'s NCCL communicator. Made
    on every rank together where the group has no communicator yet (`communicator` makes it with a collective).
    One call in flight per instance: its counts buffer, and an eager all-gather call's buffers, are reused by the
    next call (dual-batch overlap makes one instance per micro-batch)."""

    def __init__(self, spec: MoESpec, kernels: ModuleType, group: dist.ProcessGroup | None = None,
                 unpermute: PermuteLayout | None = None, exchange: StageDecision | None = None) -> None:
        self.spec = spec
        self.k = kernels
        self.group = rank_group(spec, group)
        self.ep = spec.ep_size
        self.first = spec.first_local_expert
        self.local = spec.local_experts
        self.unpermute = unpermute
        self.unpermute_overflow: torch.Tensor | None = None  # the last grouped call's (batched: pairs dropped)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.comm = communicator(self.group, self.device)
        self.counts = torch.zeros((2, self.ep), dtype=torch.int32, device=self.device)  # rows to, from each rank
        self._ones = [1] * self.ep
        if exchange is not None and exchange.stage != "nccl_exchange":
            raise MoeBuildError("exchange", f"expected the plan's nccl_exchange decision, got {exchange.stage}",
                                "plan.stage('nccl_exchange')")
        self.exchange = exchange  # the plan's nccl_exchange (None: the two phases at every count)
        self._kept = KeptGraphs()  # the all-gather form's eager dispatches and combines

    def gathers(self, tokens_per_rank: Sequence[int]) -> bool:
        """Whether a call given every rank's token count runs the all-gather form: the plan's band at every rank's
        tokens together (a call without them, or a dispatch made without the plan's decision, runs the two phases)."""
        if self.exchange is None:
            return False
        if len(tokens_per_rank) != self.ep or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                                  for t in tokens_per_rank):
            raise MoeBuildError("tokens_per_rank", f"expected {self.ep} token counts >= 0, got {tokens_per_rank!r}",
                                "every rank's token count of this call, or None")
        # no token anywhere (an empty micro-batch): nothing moves, on every rank alike (the band at one token)
        return self.exchange.choice_for(max(sum(tokens_per_rank), 1)) == "all_gather"

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 tokens_per_rank: Sequence[int] | None = None) -> Dispatched:
        """Send each token of `hidden` [T, H] with its top-k ids [T, K] (global) and weights to the ranks holding
        its experts; returns the rows this rank received, their ids made local. `tokens_per_rank`: every rank's T
        of this call where the caller knows them (the same list on every rank): the all-gather form, as the plan's
        nccl_exchange band says."""
        if tokens_per_rank is not None and self.gathers(tokens_per_rank):
            return self._all_gather(hidden, topk_ids, topk_weights, tuple(tokens_per_rank))
        K, H = topk_ids.shape[1], hidden.shape[1]
        counts, send_tokens, slots = self.k.ep_layout(topk_ids, self.ep, self.local, send_counts=self.counts[0])
        send_splits, recv_splits = self._exchange_counts()
        sent, received = sum(send_splits), sum(recv_splits)
        send_rows = torch.empty((sent, H), dtype=hidden.dtype, device=hidden.device)
        send_meta = torch.empty((2, sent, K), dtype=torch.int32, device=hidden.device)  # local ids, weights' bits
        self.k.ep_pack_send(hidden, topk_ids, topk_weights, self.ep, self.local, counts, send_tokens, sent,
                            send_rows, send_meta)
        recv_rows = torch.empty((received, H), dtype=hidden.dtype, device=hidden.device)
        recv_meta = torch.empty((2, received, K), dtype=torch.int32, device=hidden.device)
        self.k.ep_nccl_exchange(self.comm, send_splits, recv_splits,
                                ((send_rows, recv_rows), (send_meta[0], recv_meta[0]), (send_meta[1], recv_meta[1])))
        return Dispatched(recv_rows, recv_meta[0], recv_meta[1].view(torch.float32), send_splits, recv_splits, slots)

    def _all_gather(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    tokens: tuple[int, ...]) -> Dispatched:
        """The all-gather form: every rank's tokens with their ids and weights, rank d's after ranks 0..d-1's. An
        eager call with the key of a kept one replays its graph into the buffers it returned (kept.py); a call
        being captured runs the wrappers into buffers of the graph's pool."""
        def run() -> tuple[Callable[[], None], Dispatched, int]:
            rank = self.spec.ep_rank
            if hidden.shape[0] != tokens[rank]:
                raise MoeBuildError("tokens_per_rank", f"gives rank {rank} {tokens[rank]} tokens, the call has "
                                    f"{hidden.shape[0]}", "every rank's token count of this call, the same on every "
                                    "rank")
            R, K, dev = sum(tokens), topk_ids.shape[1], hidden.device
            rows = torch.empty((R, hidden.shape[1]), dtype=hidden.dtype, device=dev)
            ids = torch.empty((R, K), dtype=torch.int32, device=dev)
            weights = torch.empty((R, K), dtype=torch.float32, device=dev)

            def launches() -> None:
                self.k.ep_nccl_all_gather(self.comm, rank, tokens, ((hidden, rows), (topk_ids, ids),
                                                                    (topk_weights, weights)))
                self.k.ep_local_ids(ids, self.first, self.local)
            launches()
            d = Dispatched(rows, ids, weights, list(tokens), list(tokens), None, gathered=True)
            return launches, d, rows.nbytes + ids.nbytes + weights.nbytes

        key = ("dispatch", tokens, tensor_key(hidden), tensor_key(topk_ids), tensor_key(topk_weights))
        return self._kept.call(key, run, self.device)  # type: ignore[return-value]

    def _exchange_counts(self) -> tuple[list[int], list[int]]:
        """Phase one: self.counts[0] (rows for each rank, on the device) to every rank, theirs into self.counts[1];
        both to the host (the synchronization: exact sizes follow) -> (send splits, receive splits)."""
        if torch.cuda.is_current_stream_capturing():
            raise MoeBuildError("dispatch", "the nccl dispatch reads the row counts on the host, which a CUDA graph "
                                "capture cannot", "nvlink with recv_capacity (no host synchronization) to capture")
        self.k.ep_nccl_exchange(self.comm, self._ones, self._ones, ((self.counts[0], self.counts[1]),))
        send_splits, recv_splits = self.counts.tolist()
        return send_splits, recv_splits

    def _exchange_rows(self, hidden: torch.Tensor, meta: torch.Tensor, send_tokens: torch.Tensor,
                       send_splits: list[int], recv_splits: list[int], recv_meta: torch.Tensor) -> torch.Tensor:
        """Phase two of the grouped formats: each send row's hidden row and meta row (row send_tokens[i] of both)
        to its rank; the meta received lands in `recv_meta` [received rows, ...]; returns the rows received. (The
        unpermuted combine sends its expert outputs back the same way, with their return indices as the meta.)"""
        rows = send_tokens[: sum(send_splits)]
        recv_hidden = torch.empty((sum(recv_splits), hidden.shape[1]), dtype=hidden.dtype, device=hidden.device)
        self.k.ep_nccl_exchange(self.comm, send_splits, recv_splits,
                                ((hidden.index_select(0, rows), recv_hidden), (meta.index_select(0, rows), recv_meta)))
        return recv_hidden

    def dispatch_with_permute(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                              topk_weights: torch.Tensor) -> PermutedDispatched:
        """`hidden` [T, H]'s tokens to the ranks holding their experts, received here grouped by local expert (the
        instance's PermuteLayout), every buffer sized exactly for this call."""
        if self.unpermute is None:
            raise MoeBuildError("unpermute", "this dispatch was made without a permute layout",
                                "NcclDispatch(..., unpermute=PermuteLayout(...))")
        T, K = topk_ids.shape
        dev, H, E = hidden.device, hidden.shape[1], self.local
        _, send_tokens, _ = self.k.ep_layout(topk_ids, self.ep, self.local, send_counts=self.counts[0])
        send_splits, recv_splits = self._exchange_counts()
        n_recv = sum(recv_splits)
        token = torch.arange(T, dtype=torch.int32, device=dev).unsqueeze(1)
        meta = torch.cat([topk_ids, topk_weights.view(torch.int32), token], dim=1)  # [T, 2K + 1]
        # at least one row: the layout kernel takes real pointers, also where nothing arrives (it reads none then)
        slots = max(n_recv, 1)
        recv_meta = torch.empty((slots, 2 * K + 1), dtype=torch.int32, device=dev)
        recv_hidden = self._exchange_rows(hidden, meta, send_tokens, send_splits, recv_splits, recv_meta[:n_recv])
        layout = self.unpermute
        P = layout.rows(1, n_recv, K, E)  # the dense rows as one source's
        d = PermutedDispatched(torch.empty((P, H), dtype=hidden.dtype, device=dev),
                               torch.empty(E + 1, dtype=torch.int64, device=dev),
                               torch.empty(E, dtype=torch.int32, device=dev),
                               torch.full((P,), -1, dtype=torch.int32, device=dev),  # rows past the layout: none
                               torch.empty(P, dtype=torch.int32, device=dev),
                               torch.empty(1, dtype=torch.int32, device=dev))
        pair_row = torch.empty(slots * K, dtype=torch.int32, device=dev)
        received = self.counts[1]  # copied on the stream before the return's counts take the buffer
        dense_counts = torch.stack([received, torch.zeros_like(received)], dim=1).contiguous()
        self.k.ep_permute_layout(recv_meta, dense_counts, 0, K, self.first, d.expert_offsets, d.expert_counts,
                                 pair_row, d.row_src_rank, d.row_return, d.overflow,
                                 pad_multiple=layout.pad_multiple, expert_capacity=layout.expert_capacity)
        if n_recv:
            self.k.ep_permute_rows(recv_hidden, recv_meta[:n_recv], dense_counts, 0, pair_row[: n_recv * K], d.rows,
                                   None)
        self.unpermute_overflow = d.overflow
        return d

    def combine_with_unpermute(self, expert_out: torch.Tensor, d: PermutedDispatched, topk_ids: torch.Tensor,
                               topk_weights: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Every row's expert output `expert_out` [P, H] back to its token's rank (with its token * K + k), there
        into a zeroed [T * K, H] (a dropped pair stays zero), then each token's K rows weighted and summed in k
        order into `out` [T, H] (topk_ids / topk_weights: this rank's tokens' [T, K], global ids)."""
        T, K = topk_ids.shape
        dev, H = expert_out.device, expert_out.shape[1]
        src = d.row_src_rank
        order = torch.argsort(src, stable=True)  # padding (-1) first, then by source rank
        self.counts[0].copy_(torch.bincount(src[src >= 0].long(), minlength=self.ep))
        send_splits, recv_splits = self._exchange_counts()
        keep = order[order.shape[0] - sum(send_splits):]
        at = torch.empty(sum(recv_splits), dtype=torch.int32, device=dev)
        rows = self._exchange_rows(expert_out, d.row_return, keep, send_splits, recv_splits, at)
        if T == 0:
            return out
        returned = torch.zeros((T * K, H), dtype=expert_out.dtype, device=dev)
        returned.index_copy_(0, at.long(), rows)
        identity = torch.arange(T * K, dtype=torch.int32, device=dev)
        return sum_pairs(self.k, returned, topk_ids, topk_weights, identity, out)

    def combine(self, partial: torch.Tensor, d: Dispatched, out: torch.Tensor) -> torch.Tensor:
        """The received rows' partial outputs `partial` [R, H] back to their ranks, summed per token into `out`
        [T, H] (rank order, fp32; the all-gather form: NCCL's reduce-scatter)."""
        if d.gathered:
            return self._reduce_scatter(partial, d.recv_splits, out)
        returned = torch.empty((d.sent_rows, partial.shape[1]), dtype=partial.dtype, device=partial.device)
        self.k.ep_nccl_exchange(self.comm, d.recv_splits, d.send_splits, ((partial, returned),))
        return self.k.ep_combine(returned, d.token_slots, out=out)

    def _reduce_scatter(self, partial: torch.Tensor, rows: list[int], out: torch.Tensor) -> torch.Tensor:
        """The all-gather form's combine; an eager call with the key of a kept one replays its graph."""
        def run() -> tuple[Callable[[], None], bool, int]:  # keeps no tensor: the caller's `out` is returned
            def launches() -> None:
                self.k.ep_nccl_reduce_scatter(self.comm, self.spec.ep_rank, rows, partial, out)
            launches()
            return launches, True, 0

        self._kept.call(("combine", tuple(rows), tensor_key(partial), tensor_key(out)), run, self.device)
        return out
