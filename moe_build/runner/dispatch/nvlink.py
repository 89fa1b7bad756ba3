"""The `nvlink` dispatch: rows written straight into the other GPUs' memory over NVLink (seed 004's intra-node
design), through buffers every rank of the group maps: torch's symmetric memory (multicast stays off).

Each rank allocates once, for `max_tokens` tokens per call: recv slots for every source (ep_size x max_tokens
rows, the worst case: a token goes at most once to a rank), their ids / weights, the counts, the returned
partial rows, and two flags per source. A call: `mb_ep_nvlink_dispatch` (the ranks each token goes to, as
`mb_ep_layout` finds them, then the rows into the peers' slots and a flag raised on each peer; up to 128 tokens
one kernel), `mb_ep_nvlink_gather`
(once every source's flag is up: the received rows made dense, with local expert ids and where each goes back);
after the experts, `mb_ep_nvlink_combine` (partials into their sources' returned rows, a flag on each peer, then
once every partial owed here is back the per-token sum, in one kernel). No collective, no barrier kernel and no
allocation per call: each rank waits only for the signals it needs.

Who waits: with `waits_in_kernels` (the default) the gather (non-blocking mode) and the combine wait for their
flags in every block, two launches fewer per call; else `mb_ep_nvlink_wait`, one block, runs before each (and the
combine's return and sum are kernels of their own, `mb_ep_nvlink_return` and `mb_ep_combine`), so that a second
micro-batch's kernels (dual-batch overlap) always find SMs beside a kernel still waiting.

Blocking mode (recv_capacity None) reads the received row count to the host after the first wait (the one
synchronization) and gathers exactly that many rows. Non-blocking mode gathers a fixed `recv_capacity` rows
(seed 004's num_permuted_tokens): rows past the received ones route nowhere, rows past the capacity are
dropped (their tokens get a zero row back from this rank: they lack its experts' part) and set `overflow` (a
device flag, per call) — nothing else is touched; with no host synchronization
the whole layer can be captured in a CUDA graph. With room for every slot (recv_capacity = ep_size x
max_tokens) nothing can overflow and no row is copied: the experts read the receive slots in place, slot by
slot (empty slots route nowhere), and the gather writes only their ids, weights and origins.

dispatch_with_permute / combine_with_unpermute (seed 004; the plan's ep_format permuted or batched, an instance
made with `unpermute=PermuteLayout(...)`): after the rows land, `mb_ep_permute_layout` (one block) and
`mb_ep_permute_rows` expand them to one row per (row, local expert) pair, grouped by expert, padded to
`pad_multiple` (or experts x `expert_capacity` rows: the batched format, pairs past it dropped and flagged), so
the experts run their GEMMs only. Back, `mb_ep_nvlink_return` sends every row's expert output to its token's rank
at token * K + k, and that rank weights and sums each token's K rows in k order with `mb_finalize`, as one GPU's
separate finalize does: bit for bit the single-GPU layer where the GEMMs agree (the planner's deterministic
rules). No host synchronization either way: the layout's size stays on the device.

`dispatch_sms` / `combine_sms` cap the grids of the dispatch side (mb_ep_nvlink_dispatch, mb_ep_nvlink_gather) and
of the combine side (mb_ep_nvlink_return, the combine) at that many blocks, so they occupy at most that many SMs
while expert compute runs beside them (dual-batch overlap); None leaves the kernels' own grids. Their loops stride
over the grid, so any grid gives the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.distributed as dist

from ...errors import MoeBuildError
from ...spec import MoESpec
from ...weights.dtypes import TORCH_DTYPE
from ..workspace import BufferSpec, Workspace, layout_bytes
from .group import rank_group
from .permuted import PermutedDispatched, PermuteLayout, sum_pairs


@dataclass
class NvlinkDispatched:
    """One nvlink dispatch's received rows and what its combine needs (seed 004's `handle`)."""

    hidden: torch.Tensor          # [R or capacity, H] received rows, sources in rank order
    topk_ids: torch.Tensor        # [.., K] int32 local expert ids, -1 for other ranks' experts (and empty rows)
    topk_weights: torch.Tensor    # [.., K] fp32
    src_rank: torch.Tensor        # [..] int32: the rank each row came from (-1: no row)
    src_row: torch.Tensor         # [..] int32: its send row there (where its partial output goes)
    token_slots: torch.Tensor     # [T, ep_size] int32: this rank's tokens' send rows, -1 where not sent


class NvlinkDispatch:
    """Dispatch and combine for one rank of `spec`'s group over NVLink-mapped buffers of every rank in `group`
    (all on one NVLink domain). `recv_capacity`: None for the blocking mode, else the rows gathered per call;
    `dispatch_sms` / `combine_sms`: the SM caps of the module docstring (None: the kernels' own grids). An
    instance signals through its own buffer's flags and counters, so two instances in flight at once (dual-batch
    overlap's two micro-batches) never take each other's signals. `waits_in_kernels`: who waits for the flags
    (module docstring); an instance with another in flight beside it must pass False."""

    def __init__(self, spec: MoESpec, kernels: ModuleType, max_tokens: int, group: dist.ProcessGroup | None = None,
                 recv_capacity: int | None = None, device: torch.device | str = "cuda",
                 dispatch_sms: int | None = None, combine_sms: int | None = None,
                 waits_in_kernels: bool = True, unpermute: PermuteLayout | None = None) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        self.spec, self.k = spec, kernels
        self.group = rank_group(spec, group)
        self.ep, self.rank = spec.ep_size, spec.ep_rank
        if recv_capacity is not None and recv_capacity < 1:
            raise MoeBuildError("recv_capacity", f"must be a positive row count, got {recv_capacity!r}",
                                "integers >= 1, or None (blocking)")
        self.cap, self.capacity = max_tokens, recv_capacity
        self.dispatch_sms, self.combine_sms = dispatch_sms, combine_sms
        H, K, ep, dev = spec.hidden_size, spec.top_k, self.ep, torch.device(device)
        dtype = TORCH_DTYPE[spec.dtype]
        # the symmetric buffer carved as a runner workspace is (each region 256-byte aligned), every rank alike
        regions = {"recv_rows": BufferSpec((ep * self.cap, H), dtype),
                   "recv_meta": BufferSpec((ep * self.cap, 2 * K + 1), torch.int32),
                   "recv_counts": BufferSpec((ep, 2), torch.int32),
                   # a partial row per (token, rank), or with unpermute every (token, k) row
                   "returned": BufferSpec(((K if unpermute else ep) * self.cap, H), dtype),
                   "flags": BufferSpec((2, ep), torch.int32)}  # [0][s]: s's rows are here; [1][s]: s's partials
        self.buffer = symm_mem.empty(layout_bytes(regions), dtype=torch.uint8, device=dev)
        self.handle = symm_mem.rendezvous(self.buffer, self.group.group_name)
        self.local = Workspace(regions, flat=self.buffer).buffers
        ptrs = list(self.handle.buffer_ptrs)
        offsets = {name: t.data_ptr() - self.buffer.data_ptr() for name, t in self.local.items()}
        self.peers = {name: torch.tensor([p + offsets[name] for p in ptrs], dtype=torch.int64, device=dev)
                      for name in regions}
        self.local["recv_counts"].zero_()
        self.local["flags"].zero_()
        self.done = torch.zeros(2, 1, dtype=torch.int32, device=dev)  # the signalling kernels' block counters
        self.seen = torch.zeros(2, 1, dtype=torch.int32, device=dev)  # the waiting kernels' block counters
        self.waits_in_kernels = waits_in_kernels
        # per call, sized once: the layout's outputs and (non-blocking) the gathered rows
        self.counts = torch.empty(ep, dtype=torch.int32, device=dev)
        self.send_tokens = torch.empty(max_tokens * ep, dtype=torch.int32, device=dev)
        self.token_slots = torch.empty(max_tokens, ep, dtype=torch.int32, device=dev)
        self.block_counts = torch.empty(max(1, kernels.layout_block_counts(max_tokens, ep)), dtype=torch.int32,
                                        device=dev)  # the layout's scratch past 1024 tokens
        self.received = torch.zeros(1, dtype=torch.int32, device=dev)
        self.overflow = torch.zeros(1, dtype=torch.int32, device=dev)
        # room for every slot: the experts read the slots in place (no row is copied)
        self.in_place = recv_capacity == ep * self.cap
        self._dense = None if recv_capacity is None else self._dense_rows(recv_capacity, dtype, dev, self.in_place)
        self.unpermute = unpermute
        self._permuted = None if unpermute is None else self._permuted_rows(unpermute, dtype, dev)
        # every rank's buffer is zeroed before any rank writes into it: a host barrier over the group (torch's
        # signal-pad barrier here hung one rank after many short-lived symmetric buffers: docs/performance.md)
        torch.cuda.synchronize(dev)
        dist.barrier(group=self.group, device_ids=[dev.index if dev.index is not None else torch.cuda.current_device()])

    def _dense_rows(self, rows: int, dtype: torch.dtype, dev: torch.device, in_place: bool = False
                    ) -> dict[str, torch.Tensor]:
        H, K = self.spec.hidden_size, self.spec.top_k
        return {"hidden": self.local["recv_rows"] if in_place else torch.empty(rows, H, dtype=dtype, device=dev),
                "ids": torch.empty(rows, K, dtype=torch.int32, device=dev),
                "weights": torch.empty(rows, K, dtype=torch.float32, device=dev),
                "src_rank": torch.empty(rows, dtype=torch.int32, device=dev),
                "src_row": torch.empty(rows, dtype=torch.int32, device=dev)}

    def _permuted_rows(self, layout: PermuteLayout, dtype: torch.dtype, dev: torch.device) -> PermutedDispatched:
        E, K = self.spec.local_experts, self.spec.top_k
        rows = layout.rows(self.ep, self.cap, K, E)
        # the pair table is read for received slots only; the identity map is the finalize's (t, k) -> t * K + k
        self._pair_row = torch.empty(self.ep * self.cap * K, dtype=torch.int32, device=dev)
        self._identity = torch.arange(self.cap * K, dtype=torch.int32, device=dev)
        return PermutedDispatched(torch.empty(rows, self.spec.hidden_size, dtype=dtype, device=dev),
                                  torch.zeros(E + 1, dtype=torch.int64, device=dev),
                                  torch.zeros(E, dtype=torch.int32, device=dev),
                                  torch.full((rows,), -1, dtype=torch.int32, device=dev),
                                  torch.zeros(rows, dtype=torch.int32, device=dev),
                                  torch.zeros(1, dtype=torch.int32, device=dev))

    @property
    def unpermute_overflow(self) -> torch.Tensor:
        """The batched layout's overflow flag ([1] int32, per call: a pair past an expert's max rows was dropped)."""
        return self._permuted.overflow

    def _send(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The layout and the rows into the peers' slots (both formats); returns the tokens' send slots."""
        T = hidden.shape[0]
        if T > self.cap:
            raise MoeBuildError("tokens", f"{T} exceeds the dispatch's max_tokens={self.cap}", f"0..{self.cap}")
        _, slots = self.k.ep_nvlink_dispatch(hidden, topk_ids, topk_weights, self.rank, self.spec.local_experts,
                                             self.cap, self.peers["recv_rows"], self.peers["recv_meta"],
                                             self.peers["recv_counts"], self.peers["flags"], self.done[0],
                                             self.counts, self.send_tokens[: T * self.ep], self.token_slots[:T],
                                             self.block_counts, sms=self.dispatch_sms)
        return slots

    def dispatch_with_permute(self, hidden: torch.Tensor, topk_ids: torch.Tensor,
                              topk_weights: torch.Tensor) -> PermutedDispatched:
        """`hidden` [T, H]'s tokens to the ranks holding their experts, received here grouped by local expert
        (the instance's PermuteLayout); no host synchronization."""
        if self._permuted is None:
            raise MoeBuildError("unpermute", "this dispatch was made without a permute layout",
                                "NvlinkDispatch(..., unpermute=PermuteLayout(...))")
        self._send(hidden, topk_ids, topk_weights)
        landed = (self.local["flags"][0], self.seen[0])
        if not self.waits_in_kernels:
            self.k.ep_nvlink_wait(landed[0])
        d, layout = self._permuted, self.unpermute
        self.k.ep_permute_layout(self.local["recv_meta"], self.local["recv_counts"], self.cap, self.spec.top_k,
                                 self.spec.first_local_expert, d.expert_offsets, d.expert_counts, self._pair_row,
                                 d.row_src_rank, d.row_return, d.overflow, pad_multiple=layout.pad_multiple,
                                 expert_capacity=layout.expert_capacity,
                                 wait=landed if self.waits_in_kernels else None)
        self.k.ep_permute_rows(self.local["recv_rows"], self.local["recv_meta"], self.local["recv_counts"], self.cap,
                               self._pair_row, d.rows, self.peers["returned"], sms=self.dispatch_sms)
        return d

    def combine_with_unpermute(self, expert_out: torch.Tensor, d: PermutedDispatched, topk_ids: torch.Tensor,
                               topk_weights: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Every row's expert output `expert_out` [P, H] back to its token's rank; there each token's K rows
        weighted and summed in k order (topk_ids / topk_weights: this rank's tokens' [T, K], global ids) into
        `out` [T, H]."""
        E = self.spec.local_experts
        self.k.ep_nvlink_return(expert_out, d.row_src_rank, d.row_return, self.peers["returned"], self.rank,
                                self.peers["flags"], self.done[1], sms=self.combine_sms,
                                rows_limit=d.expert_offsets[E:])
        self.k.ep_nvlink_wait(self.local["flags"][1])
        return sum_pairs(self.k, self.local["returned"], topk_ids, topk_weights, self._identity, out)

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> NvlinkDispatched:
        slots = self._send(hidden, topk_ids, topk_weights)
        landed = (self.local["flags"][0], self.seen[0])  # every source's rows are here once these are up
        if self._dense is None:
            self.k.ep_nvlink_wait(landed[0])
            rows = int(self.local["recv_counts"][:, 0].sum())  # blocking: the one host synchronization
            dense, wait = self._dense_rows(rows, hidden.dtype, hidden.device), None
        elif self.waits_in_kernels:
            dense, wait = self._dense, landed
        else:
            self.k.ep_nvlink_wait(landed[0])
            dense, wait = self._dense, None
        self.k.ep_nvlink_gather(self.local["recv_rows"], self.local["recv_meta"], self.local["recv_counts"], self.cap,
                                self.spec.first_local_expert, self.spec.local_experts,
                                None if self.in_place else dense["hidden"], dense["ids"],
                                dense["weights"], dense["src_rank"], dense["src_row"], self.received, self.overflow,
                                self.peers["returned"], sms=self.dispatch_sms, wait=wait)
        return NvlinkDispatched(dense["hidden"], dense["ids"], dense["weights"], dense["src_rank"], dense["src_row"],
                                slots)

    def combine(self, partial: torch.Tensor, d: NvlinkDispatched, out: torch.Tensor) -> torch.Tensor:
        back = self.local["flags"][1]  # every partial row owed here is back once these are up
        if self.waits_in_kernels:
            return self.k.ep_nvlink_combine(partial, d.src_rank, d.src_row, self.peers["returned"], self.rank,
                                            self.peers["flags"], self.done[1], self.local["returned"], d.token_slots,
                                            back, self.seen[1], out=out, sms=self.combine_sms)
        self.k.ep_nvlink_return(partial, d.src_rank, d.src_row, self.peers["returned"], self.rank, self.peers["flags"],
                                self.done[1], sms=self.combine_sms)
        self.k.ep_nvlink_wait(back)
        return self.k.ep_combine(self.local["returned"], d.token_slots, out=out, sms=self.combine_sms)
