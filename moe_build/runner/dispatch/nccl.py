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
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.distributed as dist

from ...spec import MoESpec
from .group import rank_group


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

    def __init__(self, spec: MoESpec, kernels: ModuleType, group: dist.ProcessGroup | None = None) -> None:
        self.spec = spec
        self.k = kernels
        self.group = rank_group(spec, group)
        self.ep = spec.ep_size
        self.first = spec.first_local_expert
        self.local = spec.local_experts

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched:
        """Send each token of `hidden` [T, H] with its top-k ids [T, K] (global) and weights to the ranks holding
        its experts; returns the rows this rank received, their ids made local."""
        T, K = topk_ids.shape
        dev = hidden.device
        counts, send_tokens, slots = self.k.ep_layout(topk_ids, self.ep, self.local)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        both = torch.cat([counts, recv_counts]).tolist()  # the one synchronization: exact sizes follow
        send_splits, recv_splits = both[: self.ep], both[self.ep:]
        n_send, n_recv = sum(send_splits), sum(recv_splits)
        rows = send_tokens[:n_send]
        meta = torch.cat([topk_ids, topk_weights.view(torch.int32)], dim=1)  # [T, 2K]: ids, then weights' bits
        send_hidden = hidden.index_select(0, rows)
        send_meta = meta.index_select(0, rows)
        recv_hidden = torch.empty((n_recv, hidden.shape[1]), dtype=hidden.dtype, device=dev)
        recv_meta = torch.empty((n_recv, 2 * K), dtype=torch.int32, device=dev)
        dist.all_to_all_single(recv_hidden, send_hidden, recv_splits, send_splits, group=self.group)
        dist.all_to_all_single(recv_meta, send_meta, recv_splits, send_splits, group=self.group)
        ids = recv_meta[:, :K] - self.first
        local_ids = torch.where((ids >= 0) & (ids < self.local), ids, torch.full_like(ids, -1))
        weights = recv_meta[:, K:].contiguous().view(torch.float32)
        return Dispatched(recv_hidden, local_ids.contiguous(), weights, send_splits, recv_splits, slots)

    def combine(self, partial: torch.Tensor, d: Dispatched, out: torch.Tensor) -> torch.Tensor:
        """The received rows' partial outputs `partial` [R, H] back to their ranks, summed per token into `out`
        [T, H] (rank order, fp32)."""
        returned = torch.empty((d.sent_rows, partial.shape[1]), dtype=partial.dtype, device=partial.device)
        dist.all_to_all_single(returned, partial, d.send_splits, d.recv_splits, group=self.group)
        return self.k.ep_combine(returned, d.token_slots, out=out)
