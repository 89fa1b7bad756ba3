"""The `nvlink` dispatch: rows written straight into the other GPUs' memory over NVLink (seed 004's intra-node
design), through buffers every rank of the group maps: torch's symmetric memory (multicast stays off).

Each rank allocates once, for `max_tokens` tokens per call: recv slots for every source (ep_size x max_tokens
rows, the worst case: a token goes at most once to a rank), their ids / weights, the counts, the returned
partial rows, and two flags per source. A call: `mb_ep_layout` (the ranks each token goes to),
`mb_ep_nvlink_dispatch` (the rows into the peers' slots, then a flag raised on each peer), `mb_ep_nvlink_gather`
(once every source's flag is up: the received rows made dense, with local expert ids and where each goes back);
after the experts, `mb_ep_nvlink_return` (partials into their sources' returned rows, then a flag on each peer),
`mb_ep_nvlink_combine` (once every partial owed here is back: the per-token sum). No collective, no barrier kernel
and no allocation per call: each rank waits only for the signals it needs.

Who waits: with `waits_in_kernels` (the default) the gather (non-blocking mode) and the combine wait for their
flags in every block, two launches fewer per call; else `mb_ep_nvlink_wait`, one block, runs before each, so that
a second micro-batch's kernels (dual-batch overlap) always find SMs beside a kernel still waiting.

Blocking mode (recv_capacity None) reads the received row count to the host after the first wait (the one
synchronization) and gathers exactly that many rows. Non-blocking mode gathers a fixed `recv_capacity` rows
(seed 004's num_permuted_tokens): rows past the received ones route nowhere, rows past the capacity are
dropped (their tokens get a zero row back from this rank: they lack its experts' part) and set `overflow` (a
device flag, per call) — nothing else is touched; with no host synchronization
the whole layer can be captured in a CUDA graph. With room for every slot (recv_capacity = ep_size x
max_tokens) nothing can overflow and no row is copied: the experts read the receive slots in place, slot by
slot (empty slots route nowhere), and the gather writes only their ids, weights and origins.

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
from ..workspace import TORCH_DTYPE, BufferSpec, Workspace, layout_bytes
from .group import rank_group


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
                 waits_in_kernels: bool = True) -> None:
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
                   "recv_meta": BufferSpec((ep * self.cap, 2 * K), torch.int32),
                   "recv_counts": BufferSpec((ep, 2), torch.int32), "returned": BufferSpec((ep * self.cap, H), dtype),
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
        self.received = torch.zeros(1, dtype=torch.int32, device=dev)
        self.overflow = torch.zeros(1, dtype=torch.int32, device=dev)
        # room for every slot: the experts read the slots in place (no row is copied)
        self.in_place = recv_capacity == ep * self.cap
        self._dense = None if recv_capacity is None else self._dense_rows(recv_capacity, dtype, dev, self.in_place)
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

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> NvlinkDispatched:
        T = hidden.shape[0]
        if T > self.cap:
            raise MoeBuildError("tokens", f"{T} exceeds the dispatch's max_tokens={self.cap}", f"0..{self.cap}")
        counts, send_tokens, slots = self.k.ep_layout(topk_ids, self.ep, self.spec.local_experts, self.counts,
                                                      self.send_tokens[: T * self.ep], self.token_slots[:T])
        self.k.ep_nvlink_dispatch(hidden, topk_ids, topk_weights, self.rank, self.cap, counts, send_tokens,
                                  self.peers["recv_rows"], self.peers["recv_meta"], self.peers["recv_counts"],
                                  self.peers["flags"], self.done[0], sms=self.dispatch_sms)
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
        self.k.ep_nvlink_return(partial, d.src_rank, d.src_row, self.peers["returned"], self.rank, self.peers["flags"],
                                self.done[1], sms=self.combine_sms)
        back = self.local["flags"][1]  # every partial row owed here is back once these are up
        if self.waits_in_kernels:
            return self.k.ep_nvlink_combine(self.local["returned"], d.token_slots, back, self.seen[1], out=out,
                                            sms=self.combine_sms)
        self.k.ep_nvlink_wait(back)
        return self.k.ep_combine(self.local["returned"], d.token_slots, out=out, sms=self.combine_sms)
