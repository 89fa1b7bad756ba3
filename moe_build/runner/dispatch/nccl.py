"""The `nccl` dispatch: two-phase, exact-size all-to-all over torch.distributed's NCCL process group.

Phase one (layout and counts): `mb_ep_layout` finds, from the routed top-k ids, the ranks each token goes to
(once per rank, however many of its experts that rank holds), groups the send rows by rank and keeps that
layout (`Dispatched`), so the gather and the combine never sort again; one small all-to-all exchanges the
row counts. The counts come to the host (the one synchronization), and every receive buffer is sized exactly
from them, from torch's caching allocator (no cudaMalloc once warm), instead of the worst case of every
rank's every token arriving (ep_size * tokens rows).
Phase two (payload): `all_to_all_single` with those split sizes moves the rows, then their top-k ids and
weights (one int32 tensor). Combine is the reverse all-to-all of the experts' partial rows (each already
the weighted sum over the receiving rank's experts), summed per token in rank order by `mb_ep_combine`.

dispatch_with_permute / combine_with_unpermute (the plan's ep_format permuted or batched, an instance made with
`unpermute=PermuteLayout(...)`): the same two phases, each row's meta also carrying its token index; the rows
land dense, source after source, and `mb_ep_permute_layout` / `mb_ep_permute_rows` (cap 0: dense) group them by
local expert as for the nvlink dispatch. Back, every row's expert output travels to its token's rank with its
index token * K + k (its count exchanged first: a batched layout may have dropped pairs), lands there in a
zeroed buffer, and `mb_finalize` weights and sums each token's K rows in k order, as one GPU's separate finalize.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.distributed as dist

from ...errors import MoeBuildError
from ...spec import MoESpec
from .group import rank_group
from .permuted import PermutedDispatched, PermuteLayout, sum_pairs


@dataclass
class Dispatched:
    """One dispatch's result and what its combine needs (seed 004's `handle`)."""

    hidden: torch.Tensor          # [R, H] the rows this rank received, grouped by source rank
    topk_ids: torch.Tensor        # [R, K] int32, this rank's local expert ids; -1 for other ranks' experts
    topk_weights: torch.Tensor    # [R, K] fp32
    send_splits: list[int]        # rows sent to each rank (the combine receives as many back)
    recv_splits: list[int]        # rows received from each rank
    token_slots: torch.Tensor     # [T, ep_size] int32: token t's send row for rank d, -1 where not sent

    @property
    def sent_rows(self) -> int:
        return sum(self.send_splits)


class NcclDispatch:
    """Dispatch and combine for one rank of `spec`'s expert-parallel group over `group` (NCCL)."""

    def __init__(self, spec: MoESpec, kernels: ModuleType, group: dist.ProcessGroup | None = None,
                 unpermute: PermuteLayout | None = None) -> None:
        self.spec = spec
        self.k = kernels
        self.group = rank_group(spec, group)
        self.ep = spec.ep_size
        self.first = spec.first_local_expert
        self.local = spec.local_experts
        self.unpermute = unpermute
        self.unpermute_overflow: torch.Tensor | None = None  # the last grouped call's (batched: pairs dropped)

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """Send each token of `hidden` [T, H] with its top-k ids [T, K] (global) and weights to the ranks holding
        its experts; returns the rows this rank received, their ids made local."""
        T, K = topk_ids.shape
        dev = hidden.device
        counts, send_tokens, slots = self.k.ep_layout(topk_ids, self.ep, self.local)
        send_splits, recv_splits, _ = self._exchange_counts(counts)
        meta = torch.cat([topk_ids, topk_weights.view(torch.int32)], dim=1)  # [T, 2K]: ids, then weights' bits
        recv_meta = torch.empty((sum(recv_splits), 2 * K), dtype=torch.int32, device=dev)
        recv_hidden = self._exchange_rows(hidden, meta, send_tokens, send_splits, recv_splits, recv_meta)
        ids = recv_meta[:, :K] - self.first
        local_ids = torch.where((ids >= 0) & (ids < self.local), ids, torch.full_like(ids, -1))
        weights = recv_meta[:, K:].contiguous().view(torch.float32)
        return Dispatched(recv_hidden, local_ids.contiguous(), weights, send_splits, recv_splits, slots)

    def _exchange_counts(self, counts: torch.Tensor) -> tuple[list[int], list[int], torch.Tensor]:
        """Phase one: rows for each rank -> (send splits, receive splits, the receive counts on the device)."""
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        both = torch.cat([counts, recv_counts]).tolist()  # the synchronization: exact sizes follow
        return both[: self.ep], both[self.ep:], recv_counts

    def _exchange_rows(self, hidden: torch.Tensor, meta: torch.Tensor, send_tokens: torch.Tensor,
                       send_splits: list[int], recv_splits: list[int], recv_meta: torch.Tensor) -> torch.Tensor:
        """Phase two: each send row's hidden row and meta row (row send_tokens[i] of both) to its rank; the meta
        received lands in `recv_meta` [received rows, ...]; returns the rows received. (The unpermuted combine sends
        its expert outputs back the same way, with their return indices as the meta.)"""
        rows = send_tokens[: sum(send_splits)]
        recv_hidden = torch.empty((sum(recv_splits), hidden.shape[1]), dtype=hidden.dtype, device=hidden.device)
        dist.all_to_all_single(recv_hidden, hidden.index_select(0, rows), recv_splits, send_splits, group=self.group)
        dist.all_to_all_single(recv_meta, meta.index_select(0, rows), recv_splits, send_splits, group=self.group)
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
        counts, send_tokens, _ = self.k.ep_layout(topk_ids, self.ep, self.local)
        send_splits, recv_splits, recv_counts = self._exchange_counts(counts)
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
        dense_counts = torch.stack([recv_counts, torch.zeros_like(recv_counts)], dim=1).contiguous()
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
        back = torch.bincount(src[src >= 0].long(), minlength=self.ep).int()
        send_splits, recv_splits, _ = self._exchange_counts(back)
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
        [T, H] (rank order, fp32)."""
        returned = torch.empty((d.sent_rows, partial.shape[1]), dtype=partial.dtype, device=partial.device)
        dist.all_to_all_single(returned, partial, d.send_splits, d.recv_splits, group=self.group)
        return self.k.ep_combine(returned, d.token_slots, out=out)
