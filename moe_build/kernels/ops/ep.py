"""Torch wrappers of the expert-parallel kernels (cpp/src/stages/ep_*.cu): the token side of dispatch and combine,
the NVLink backend's peer writes, and dispatch_with_permute's receiving side."""
from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import torch

from ..library import call
from .args import _check, _dtype_code, _out, _ptr, _stream

# ---- expert parallelism: the token side of dispatch and combine (cpp/src/stages/ep_dispatch.cu) ------

def _max_sms(sms: int | None) -> int:
    """The kernels' `max_sms` argument: 0 for their own grid (None), else the cap, a positive int."""
    if sms is None:
        return 0
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
        raise ValueError(f"sms: must be a positive int or None, got {sms!r}")
    return sms


LAYOUT_BLOCK_TOKENS = 1024  # mb_ep_layout's tokens per block past one block: its block_counts scratch is per block


def layout_block_counts(tokens: int, ep_size: int) -> int:
    """The int32 scratch mb_ep_layout takes past one block of tokens (0 up to LAYOUT_BLOCK_TOKENS)."""
    return 0 if tokens <= LAYOUT_BLOCK_TOKENS else -(-tokens // LAYOUT_BLOCK_TOKENS) * ep_size


def ep_layout(topk_ids: torch.Tensor, ep_size: int, experts_per_rank: int, send_counts: torch.Tensor | None = None,
              send_tokens: torch.Tensor | None = None, token_slots: torch.Tensor | None = None,
              block_counts: torch.Tensor | None = None,
              stream: int | torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] -> (send_counts [ep_size], send_tokens [T * ep_size], token_slots [T, ep_size]) int32: rows
    for each rank, the token of each send row (grouped by rank, tokens ascending; only the first
    sum(send_counts) are written) and token t's send row for rank d (-1: not sent). `block_counts`: the kernels'
    scratch past 1024 tokens (int32, at least layout_block_counts(T, ep_size); made here where None)."""
    _check(topk_ids, "topk_ids", (None, None), torch.int32)
    dev = topk_ids.device
    t, k = topk_ids.shape
    counts = _out(send_counts, "send_counts", (ep_size,), torch.int32, dev)
    rows = _out(send_tokens, "send_tokens", (t * ep_size,), torch.int32, dev)
    slots = _out(token_slots, "token_slots", (t, ep_size), torch.int32, dev)
    scratch = _block_counts(block_counts, t, ep_size, dev)
    call("mb_ep_layout", topk_ids.data_ptr(), t, k, ep_size, experts_per_rank, counts.data_ptr(), rows.data_ptr(),
         slots.data_ptr(), _ptr(scratch), _stream(stream, dev))
    return counts, rows, slots


def _block_counts(block_counts: torch.Tensor | None, tokens: int, ep_size: int, dev: torch.device
                  ) -> torch.Tensor | None:
    """mb_ep_layout's scratch: the caller's (checked to be large enough), a new one, or None where none is needed."""
    need = layout_block_counts(tokens, ep_size)
    if block_counts is None:
        return _out(None, "block_counts", (need,), torch.int32, dev) if need else None
    _check(block_counts, "block_counts", (None,), torch.int32, dev)
    if block_counts.shape[0] < need:
        raise ValueError(f"block_counts: needs {need} int32 for {tokens} tokens on {ep_size} ranks, "
                         f"got {block_counts.shape[0]}")
    return block_counts


def _token_args(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
                ) -> tuple[torch.device, int, int, int]:
    """A dispatch's checked token arguments, `hidden` [T, H] with its top-k ids / weights [T, K]: (device, T, H, K)."""
    _check(hidden, "hidden", (None, None))
    dev = hidden.device
    t, h = hidden.shape
    k = topk_ids.shape[1]
    _check(topk_ids, "topk_ids", (t, k), torch.int32, dev)
    _check(topk_weights, "topk_weights", (t, k), torch.float32, dev)
    return dev, t, h, k


def ep_pack_send(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, ep_size: int,
                 experts_per_rank: int, send_counts: torch.Tensor, send_tokens: torch.Tensor, send_rows: int,
                 out_rows: torch.Tensor, out_meta: torch.Tensor,
                 stream: int | torch.cuda.Stream | None = None) -> None:
    """ep_layout's first `send_rows` send rows packed for the payload exchange: out_rows [send_rows, H] the tokens'
    rows of `hidden` [T, H], out_meta [2, send_rows, K] int32 their top-k ids made local to the rank each row goes
    to (-1: not held there), then their weights' fp32 bits."""
    dev, t, h, k = _token_args(hidden, topk_ids, topk_weights)
    _check(send_counts, "send_counts", (ep_size,), torch.int32, dev)
    _check(send_tokens, "send_tokens", (None,), torch.int32, dev)
    if send_rows > send_tokens.shape[0]:
        raise ValueError(f"send_rows: {send_rows} rows, but send_tokens holds {send_tokens.shape[0]}")
    _check(out_rows, "out_rows", (send_rows, h), hidden.dtype, dev)
    _check(out_meta, "out_meta", (2, send_rows, k), torch.int32, dev)
    ids = out_meta.data_ptr()
    call("mb_ep_pack_send", hidden.data_ptr(), _dtype_code(hidden, "hidden"), topk_ids.data_ptr(),
         topk_weights.data_ptr(), h, k, ep_size, experts_per_rank, send_counts.data_ptr(), send_tokens.data_ptr(),
         send_rows, out_rows.data_ptr(), ids, ids + 4 * send_rows * k, _stream(stream, dev))


def _row_bytes(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:]) * t.element_size()


def _payload_args(payloads: Sequence[tuple[torch.Tensor, torch.Tensor]], sent: int, received: int) -> list[object]:
    """The NCCL exchanges' three (send, recv, row bytes) argument triples from up to three `payloads`, each checked
    to move `sent` rows out and `received` in, of one row size (absent payloads: NULL, NULL, 0)."""
    if not 1 <= len(payloads) <= 3:
        raise ValueError(f"payloads: 1 to 3 (send, recv) pairs, got {len(payloads)}")
    args: list[object] = []
    for j, (send, recv) in enumerate(payloads):
        _check(send, f"payloads[{j}] send")
        _check(recv, f"payloads[{j}] recv", None, send.dtype, send.device)
        if send.shape[0] != sent or recv.shape[0] != received or _row_bytes(send) != _row_bytes(recv):
            raise ValueError(f"payloads[{j}]: {sent} rows to send and {received} to receive, of equal size; got "
                             f"{list(send.shape)} and {list(recv.shape)}")
        args += [send.data_ptr(), recv.data_ptr(), _row_bytes(send)]
    return args + [None, None, 0] * (3 - len(payloads))


def ep_nccl_exchange(comm: int, send_rows: Sequence[int], recv_rows: Sequence[int],
                     payloads: Sequence[tuple[torch.Tensor, torch.Tensor]],
                     stream: int | torch.cuda.Stream | None = None) -> None:
    """One exchange over NCCL communicator `comm` (ProcessGroupNCCL._comm_ptr()) of ep_size = len(send_rows)
    ranks: for each (send, recv) of up to three `payloads` (contiguous, rows grouped by rank, the same bytes per
    row), send_rows[d] rows to rank d and recv_rows[d] rows from it; one NCCL group on `stream`."""
    ep = len(send_rows)
    if len(recv_rows) != ep:
        raise ValueError(f"recv_rows: {len(recv_rows)} counts for {ep} ranks")
    args = _payload_args(payloads, sum(send_rows), sum(recv_rows))
    rows = ctypes.c_int32 * ep
    call("mb_ep_nccl_exchange", comm, ep, rows(*send_rows), rows(*recv_rows), *args,
         _stream(stream, payloads[0][0].device))


def _rank_rows(rows: Sequence[int]) -> ctypes.Array:
    """Every rank's row count as the host array the all-gather form's exchanges take."""
    if not rows or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in rows):
        raise ValueError(f"rows: a row count >= 0 for every rank, got {list(rows)!r}")
    return (ctypes.c_int32 * len(rows))(*rows)


def ep_nccl_all_gather(comm: int, rank: int, rows: Sequence[int],
                       payloads: Sequence[tuple[torch.Tensor, torch.Tensor]],
                       stream: int | torch.cuda.Stream | None = None) -> None:
    """The all-gather form over NCCL communicator `comm`, this process rank `rank` of len(rows): for each (send,
    recv) of up to three `payloads`, this rank's rows[rank] rows of send to every rank, every rank's landing in
    recv [sum(rows), ...] in rank order; one NCCL group on `stream` (every rank passes the same `rows`)."""
    counts = _rank_rows(rows)
    args = _payload_args(payloads, rows[rank], sum(rows))
    call("mb_ep_nccl_all_gather", comm, len(rows), counts, *args, _stream(stream, payloads[0][0].device))


def ep_local_ids(topk_ids: torch.Tensor, first_expert: int, experts_per_rank: int,
                 stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """The all-gather form's received top-k ids (int32, any shape) made local to the rank holding experts
    [first_expert, first_expert + experts_per_rank), in place: id - first_expert there, -1 elsewhere. Returns them."""
    _check(topk_ids, "topk_ids", None, torch.int32)
    call("mb_ep_local_ids", topk_ids.data_ptr(), topk_ids.numel(), first_expert, experts_per_rank,
         _stream(stream, topk_ids.device))
    return topk_ids


def ep_nccl_reduce_scatter(comm: int, rank: int, rows: Sequence[int], partial: torch.Tensor, out: torch.Tensor,
                           stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """The all-gather form's return: `partial` [sum(rows), H] (every rank's rows, as ep_nccl_all_gather landed
    them) summed over the ranks into this rank's `out` [rows[rank], H] (NCCL's sum, in its order)."""
    counts = _rank_rows(rows)
    _check(partial, "partial", (sum(rows), None))
    _check(out, "out", (rows[rank], partial.shape[1]), partial.dtype, partial.device)
    call("mb_ep_nccl_reduce_scatter", comm, len(rows), counts, partial.shape[1], _dtype_code(partial, "partial"),
         partial.data_ptr(), out.data_ptr(), _stream(stream, partial.device))
    return out


def ep_combine(returned: torch.Tensor, token_slots: torch.Tensor, out: torch.Tensor | None = None,
               stream: int | torch.cuda.Stream | None = None, sms: int | None = None) -> torch.Tensor:
    """returned [rows, H] (the ranks' partial rows, in send-row order) -> out [T, H]: each token's rows summed in
    rank order, in fp32, rounded once; `sms` caps the grid at that many blocks (None: the kernel's own)."""
    dev, t, ep, h, o = _combine_args(returned, token_slots, out)
    call("mb_ep_combine", returned.data_ptr(), _dtype_code(returned, "returned"), token_slots.data_ptr(), t, h, ep,
         o.data_ptr(), _max_sms(sms), _stream(stream, dev))
    return o


def _combine_args(returned: torch.Tensor, token_slots: torch.Tensor, out: torch.Tensor | None
                  ) -> tuple[torch.device, int, int, int, torch.Tensor]:
    """A combine's checked arguments: (device, tokens, ep_size, hidden, the output [T, H])."""
    _check(returned, "returned", (None, None))
    dev = returned.device
    _check(token_slots, "token_slots", (None, None), torch.int32, dev)
    t, ep = token_slots.shape
    h = returned.shape[1]
    return dev, t, ep, h, _out(out, "out", (t, h), returned.dtype, dev)


def ep_nvlink_dispatch(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, rank: int,
                       experts_per_rank: int, cap: int, peer_rows: torch.Tensor, peer_meta: torch.Tensor,
                       peer_counts: torch.Tensor, peer_flags: torch.Tensor, done: torch.Tensor,
                       send_counts: torch.Tensor | None = None, send_tokens: torch.Tensor | None = None,
                       token_slots: torch.Tensor | None = None, block_counts: torch.Tensor | None = None,
                       stream: int | torch.cuda.Stream | None = None,
                       sms: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout of `hidden` [T, H]'s tokens (as ep_layout) and their send rows (with their ids and weights)
    written into every peer's recv slots for this rank, over NVLink, then every peer's flags[0][rank] raised;
    peer_* are int64 device tensors [ep_size] of the peers' buffer addresses, `done` a [1] int32 counter (zero, and
    left zero); `sms` caps the grid at that many blocks (None: the kernel's own). send_tokens and block_counts are
    the layout's scratch (made here where None). Returns (send_counts [ep_size], token_slots [T, ep_size])."""
    dev, t, h, k = _token_args(hidden, topk_ids, topk_weights)
    ep = peer_rows.shape[0]
    for name, ptrs in (("peer_rows", peer_rows), ("peer_meta", peer_meta), ("peer_counts", peer_counts),
                       ("peer_flags", peer_flags)):
        _check(ptrs, name, (ep,), torch.int64, dev)
    _check(done, "done", (1,), torch.int32, dev)
    counts = _out(send_counts, "send_counts", (ep,), torch.int32, dev)
    rows = _out(send_tokens, "send_tokens", (t * ep,), torch.int32, dev)
    slots = _out(token_slots, "token_slots", (t, ep), torch.int32, dev)
    scratch = _block_counts(block_counts, t, ep, dev)
    call("mb_ep_nvlink_dispatch", hidden.data_ptr(), _dtype_code(hidden, "hidden"), topk_ids.data_ptr(),
         topk_weights.data_ptr(), t, h, k, rank, ep, experts_per_rank, cap, counts.data_ptr(), rows.data_ptr(),
         slots.data_ptr(), _ptr(scratch), peer_rows.data_ptr(), peer_meta.data_ptr(),
         peer_counts.data_ptr(), peer_flags.data_ptr(), done.data_ptr(), _max_sms(sms), _stream(stream, dev))
    return counts, slots


def ep_nvlink_wait(flags: torch.Tensor, stream: int | torch.cuda.Stream | None = None) -> None:
    """Waits on the device (one block) until every entry of `flags` (one kind of this rank's flags: [ep_size]
    int32, contiguous) is raised by its source, then lowers them."""
    _check(flags, "flags", (None,), torch.int32)
    call("mb_ep_nvlink_wait", flags.data_ptr(), flags.shape[0], _stream(stream, flags.device))


def ep_nvlink_gather(recv_rows: torch.Tensor, recv_meta: torch.Tensor, recv_counts: torch.Tensor, cap: int,
                     first_expert: int, local_experts: int, out_hidden: torch.Tensor | None, out_ids: torch.Tensor,
                     out_weights: torch.Tensor, src_rank: torch.Tensor, src_row: torch.Tensor,
                     received: torch.Tensor, overflow: torch.Tensor, peer_returned: torch.Tensor,
                     stream: int | torch.cuda.Stream | None = None, sms: int | None = None,
                     wait: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The rows this rank received (its recv slots, [ep * cap, H]) as one dense block of out_hidden's rows (the
    capacity), with local ids, weights and where each row's partial output goes; `received` [1] and `overflow` [1]
    int32 written on the device; rows past the capacity send their sources (peer_returned) a zero row. out_hidden
    None: in place, the rows are recv_rows' every slot (capacity ep * cap), only ids, weights and origins written
    (`received`: the rows that arrived). `sms` caps
    the grid at that many blocks (None: the kernel's own). `wait` = (flags [ep] int32: this rank's flags[0], seen
    [1] int32: a zero counter, left zero): every block first waits for the flags, and they are lowered (None: after
    ep_nvlink_wait)."""
    dev = recv_rows.device
    ep = recv_counts.shape[0]
    h = recv_rows.shape[1]
    capacity = ep * cap if out_hidden is None else out_hidden.shape[0]
    k = out_ids.shape[1]
    _check(recv_rows, "recv_rows", (ep * cap, h))
    _check(recv_meta, "recv_meta", (ep * cap, 2 * k + 1), torch.int32, dev)
    _check(recv_counts, "recv_counts", (ep, 2), torch.int32, dev)
    if out_hidden is not None:
        _check(out_hidden, "out_hidden", (capacity, h), recv_rows.dtype, dev)
    _check(out_ids, "out_ids", (capacity, k), torch.int32, dev)
    _check(out_weights, "out_weights", (capacity, k), torch.float32, dev)
    for name, t in (("src_rank", src_rank), ("src_row", src_row)):
        _check(t, name, (capacity,), torch.int32, dev)
    for name, t in (("received", received), ("overflow", overflow)):
        _check(t, name, (1,), torch.int32, dev)
    _check(peer_returned, "peer_returned", (ep,), torch.int64, dev)
    flags, seen = _wait_args(wait, ep, dev)
    call("mb_ep_nvlink_gather", recv_rows.data_ptr(), _dtype_code(recv_rows, "recv_rows"), recv_meta.data_ptr(),
         recv_counts.data_ptr(), ep, cap, h, k, first_expert, local_experts, capacity, int(out_hidden is None),
         0 if out_hidden is None else out_hidden.data_ptr(),
         out_ids.data_ptr(), out_weights.data_ptr(), src_rank.data_ptr(), src_row.data_ptr(), received.data_ptr(),
         overflow.data_ptr(), peer_returned.data_ptr(), flags, seen, _max_sms(sms), _stream(stream, dev))


def _wait_args(wait: tuple[torch.Tensor, torch.Tensor] | None, ep: int, dev: torch.device) -> tuple[int, int]:
    """The (flags, seen) addresses of a kernel that waits for its flags itself (0, 0: it does not)."""
    if wait is None:
        return 0, 0
    flags, seen = wait
    _check(flags, "flags", (ep,), torch.int32, dev)
    _check(seen, "seen", (1,), torch.int32, dev)
    return flags.data_ptr(), seen.data_ptr()


def _return_args(partial: torch.Tensor, src_rank: torch.Tensor, src_row: torch.Tensor, peer_returned: torch.Tensor,
                 peer_flags: torch.Tensor, done: torch.Tensor, ep: int) -> None:
    """The return's checked arguments (ep_nvlink_return's, ep_nvlink_combine's): an origin for each of partial's rows,
    the peers' [ep] addresses, the [1] block counter."""
    dev, rows = partial.device, partial.shape[0]
    for name, t in (("src_rank", src_rank), ("src_row", src_row)):
        _check(t, name, (None,), torch.int32, dev)
        if t.shape[0] < rows:
            raise ValueError(f"{name}: needs >= {rows} entries, got {t.shape[0]}")
    for name, ptrs in (("peer_returned", peer_returned), ("peer_flags", peer_flags)):
        _check(ptrs, name, (ep,), torch.int64, dev)
    _check(done, "done", (1,), torch.int32, dev)


def ep_nvlink_return(partial: torch.Tensor, src_rank: torch.Tensor, src_row: torch.Tensor,
                     peer_returned: torch.Tensor, rank: int, peer_flags: torch.Tensor, done: torch.Tensor,
                     stream: int | torch.cuda.Stream | None = None, sms: int | None = None,
                     rows_limit: torch.Tensor | None = None) -> None:
    """Row j of `partial` [rows, H] written into rank src_rank[j]'s returned rows at src_row[j] (src_rank -1:
    none), over NVLink, then every peer's flags[1][rank] raised (with no rows too); `done` a [1] int32 counter
    (zero, and left zero); `sms` caps the grid at that many blocks (None: the kernel's own); `rows_limit` (an int64
    on the device, e.g. a permuted layout's expert_offsets[E]): only the rows before it go back."""
    _check(partial, "partial", (None, None))
    dev = partial.device
    rows, h = partial.shape
    ep = peer_returned.shape[0]
    _return_args(partial, src_rank, src_row, peer_returned, peer_flags, done, ep)
    if rows_limit is not None:
        _check(rows_limit, "rows_limit", (1,), torch.int64, dev)
    call("mb_ep_nvlink_return", partial.data_ptr(), _dtype_code(partial, "partial"), src_rank.data_ptr(),
         src_row.data_ptr(), rows, 0 if rows_limit is None else rows_limit.data_ptr(), h, peer_returned.data_ptr(),
         rank, ep, peer_flags.data_ptr(), done.data_ptr(), _max_sms(sms), _stream(stream, dev))


def ep_nvlink_combine(partial: torch.Tensor, src_rank: torch.Tensor, src_row: torch.Tensor,
                      peer_returned: torch.Tensor, rank: int, peer_flags: torch.Tensor, done: torch.Tensor,
                      returned: torch.Tensor, token_slots: torch.Tensor, flags: torch.Tensor, seen: torch.Tensor,
                      out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
                      sms: int | None = None) -> torch.Tensor:
    """ep_nvlink_return of `partial` (its arguments as there), ep_nvlink_wait(flags) and ep_combine in one kernel:
    the rows go back and the peers are signalled, every block waits until this rank's flags[1] (`flags` [ep] int32)
    are raised, the last lowers them (`seen` [1] int32: a zero counter, left zero), then each token's `returned`
    rows (this rank's) are summed in rank order, in fp32. Launched with no rows and no tokens too. Every block of
    its grid waits, so the library caps the grid at what the SMs hold at once: nothing may need SMs it spins on
    (with another exchange in flight beside it, return, wait and combine apart)."""
    dev, t, ep, h, o = _combine_args(returned, token_slots, out)
    rows = partial.shape[0]
    _check(partial, "partial", (rows, h), returned.dtype, dev)
    _return_args(partial, src_rank, src_row, peer_returned, peer_flags, done, ep)
    f, s = _wait_args((flags, seen), ep, dev)
    call("mb_ep_nvlink_combine", partial.data_ptr(), _dtype_code(partial, "partial"), src_rank.data_ptr(),
         src_row.data_ptr(), rows, h, peer_returned.data_ptr(), rank, ep, peer_flags.data_ptr(), done.data_ptr(),
         returned.data_ptr(), token_slots.data_ptr(), t, o.data_ptr(), f, s, _max_sms(sms), _stream(stream, dev))
    return o


# ---- dispatch_with_permute: the receiving side (cpp/src/stages/ep_permute.cu) ----------------------

def ep_permute_layout(recv_meta: torch.Tensor, recv_counts: torch.Tensor, cap: int, top_k: int, first_expert: int,
                      expert_offsets: torch.Tensor, expert_counts: torch.Tensor, pair_row: torch.Tensor,
                      row_src_rank: torch.Tensor, row_return: torch.Tensor, overflow: torch.Tensor,
                      pad_multiple: int = 1, expert_capacity: int = 0,
                      wait: tuple[torch.Tensor, torch.Tensor] | None = None,
                      stream: int | torch.cuda.Stream | None = None) -> None:
    """The received rows' (row, local expert) pairs laid out by expert, on the device (one block): expert_offsets
    [E + 1] int64 (groups padded to pad_multiple, or expert_capacity rows each where > 0: batched), expert_counts
    [E] int32, pair_row [slots * K] int32 (-1 elsewhere, -2 dropped), row_src_rank / row_return [rows] int32
    (where each row's expert output goes back; -1 for padding), overflow [1] int32. `wait` as ep_nvlink_gather's.
    cap 0: the received rows are dense (recv_meta [rows, 2K + 1], sources one after another: nccl's)."""
    dev = recv_meta.device
    ep = recv_counts.shape[0]
    e = expert_counts.shape[0]
    slots = ep * cap if cap else recv_meta.shape[0]
    _check(recv_meta, "recv_meta", (slots, 2 * top_k + 1), torch.int32, dev)
    _check(recv_counts, "recv_counts", (ep, 2), torch.int32, dev)
    _check(expert_offsets, "expert_offsets", (e + 1,), torch.int64, dev)
    _check(expert_counts, "expert_counts", (e,), torch.int32, dev)
    _check(pair_row, "pair_row", (slots * top_k,), torch.int32, dev)
    _check(row_src_rank, "row_src_rank", (None,), torch.int32, dev)
    _check(row_return, "row_return", (row_src_rank.shape[0],), torch.int32, dev)
    _check(overflow, "overflow", (1,), torch.int32, dev)
    flags, seen = _wait_args(wait, ep, dev)
    call("mb_ep_permute_layout", recv_meta.data_ptr(), recv_counts.data_ptr(), ep, cap, top_k, first_expert, e,
         pad_multiple, expert_capacity, expert_offsets.data_ptr(), expert_counts.data_ptr(), pair_row.data_ptr(),
         row_src_rank.data_ptr(), row_return.data_ptr(), overflow.data_ptr(), flags, seen, _stream(stream, dev))


def ep_permute_rows(recv_rows: torch.Tensor, recv_meta: torch.Tensor, recv_counts: torch.Tensor, cap: int,
                    pair_row: torch.Tensor, rows: torch.Tensor, peer_returned: torch.Tensor | None,
                    stream: int | torch.cuda.Stream | None = None, sms: int | None = None) -> None:
    """After ep_permute_layout: each received row (recv_rows [ep * cap, H], or with cap 0 the dense [rows, H])
    copied into `rows` at its pairs' rows; a dropped pair's source gets a zero row back (peer_returned as
    ep_nvlink_return's; None: nothing is sent back)."""
    dev = recv_rows.device
    ep = recv_counts.shape[0]
    h = recv_rows.shape[1]
    k = (recv_meta.shape[1] - 1) // 2
    slots = ep * cap if cap else recv_rows.shape[0]
    _check(recv_rows, "recv_rows", (slots, h))
    _check(recv_meta, "recv_meta", (slots, 2 * k + 1), torch.int32, dev)
    _check(recv_counts, "recv_counts", (ep, 2), torch.int32, dev)
    _check(pair_row, "pair_row", (slots * k,), torch.int32, dev)
    _check(rows, "rows", (None, h), recv_rows.dtype, dev)
    if peer_returned is not None:
        _check(peer_returned, "peer_returned", (ep,), torch.int64, dev)
    call("mb_ep_permute_rows", recv_rows.data_ptr(), _dtype_code(recv_rows, "recv_rows"), recv_meta.data_ptr(),
         recv_counts.data_ptr(), ep, cap, slots, h, k, pair_row.data_ptr(), rows.data_ptr(), _ptr(peer_returned),
         _max_sms(sms), _stream(stream, dev))
