"""Torch wrappers of the kernel library's entry points: each validates its tensors and passes raw
pointers and the current CUDA stream. The wrappers allocate outputs they are not given and return them;
a failing entry point raises `KernelError` (library.call)."""
from __future__ import annotations

import contextlib
import enum
import functools
import math
import threading
from typing import Callable, Iterator, Sequence

import torch

from ..planner.tactics import DECODE_TILES, MMA_TILES, WGMMA_TILES, GemmTactic
from .abi import (Activation, DType, Fp8Scaling, GemmKernel, GemmLaunch, GemmTacticStruct, GemmTile, OutputL2, WoqInput,
                  WoqKind, Routing, WeightLayout)
from .library import call, load_library

# ---- argument checks --------------------------------------------------------------------------

_trust = threading.local()


@contextlib.contextmanager
def trusted_tensors() -> Iterator[None]:
    """Inside this block the wrappers skip their per-tensor checks (`_check`). For a caller whose
    tensors are right by construction and who checks its own inputs once per call: the runner, on
    its own workspace views and weights. Those checks were about a quarter of an eager decode call's
    host time (25 per call). The kernels' own argument checks still run."""
    before = getattr(_trust, "on", False)
    _trust.on = True
    try:
        yield
    finally:
        _trust.on = before


def _dtype_code(t: torch.Tensor, name: str) -> int:
    codes = {torch.float32: DType.FP32, torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
    if t.dtype not in codes:
        raise ValueError(f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
    return int(codes[t.dtype])


def _check(t: torch.Tensor | None, name: str, shape: Sequence[int | None] | None = None,
           dtype: torch.dtype | None = None, device: torch.device | None = None) -> None:
    """Raise ValueError naming `name` unless `t` is a contiguous CUDA tensor of that shape/dtype
    (a None in `shape` matches any size) on `device`. Skipped inside `trusted_tensors()`."""
    if getattr(_trust, "on", False):
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name}: must be a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, but the other tensors are on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: dtype must be {dtype}, got {t.dtype}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name}: shape must be {want}, got {list(t.shape)}")


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream(stream: int | torch.cuda.Stream | None, device: torch.device) -> int:
    if stream is None:
        return torch.cuda.current_stream(device).cuda_stream
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    return int(stream)


def _enum(value: int | str | enum.IntEnum, cls: type[enum.IntEnum], name: str) -> int:
    if isinstance(value, str):
        try:
            return int(cls[value.upper()])
        except KeyError:
            raise ValueError(f"{name}: {value!r} is not one of {', '.join(m.name.lower() for m in cls)}") from None
    try:
        return int(cls(int(value)))
    except ValueError:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(m.name.lower() for m in cls)}") from None


def _out(t: torch.Tensor | None, name: str, shape: Sequence[int], dtype: torch.dtype,
         device: torch.device, zero: bool = False) -> torch.Tensor:
    if t is None:
        return (torch.zeros if zero else torch.empty)(tuple(shape), dtype=dtype, device=device)
    _check(t, name, shape, dtype, device)
    return t


# ---- stage wrappers ---------------------------------------------------------------------------

def routing(logits: torch.Tensor, top_k: int, method: int | str | Routing = Routing.SOFTMAX_TOPK,
            renormalize: bool = False, correction_bias: torch.Tensor | None = None, num_groups: int = 1,
            topk_groups: int = 1, routed_scaling_factor: float = 1.0, topk_ids: torch.Tensor | None = None,
            topk_weights: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (topk_ids [T, K] int32, topk_weights [T, K] float32)."""
    _check(logits, "logits", (None, None))
    dev = logits.device
    t, e = logits.shape
    m = _enum(method, Routing, "method")
    if correction_bias is not None:
        _check(correction_bias, "correction_bias", (e,), torch.float32, dev)
    ids = _out(topk_ids, "topk_ids", (t, top_k), torch.int32, dev)
    w = _out(topk_weights, "topk_weights", (t, top_k), torch.float32, dev)
    call("mb_routing", logits.data_ptr(), _dtype_code(logits, "logits"), _ptr(correction_bias), t, e, top_k, m,
          int(bool(renormalize)), num_groups, topk_groups, routed_scaling_factor, ids.data_ptr(), w.data_ptr(),
          _stream(stream, dev))
    return ids, w


def _map_outputs(topk_ids: torch.Tensor, num_experts: int, ptu: torch.Tensor | None, utp: torch.Tensor | None,
                 off: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(topk_ids, "topk_ids", (None, None), torch.int32)
    if num_experts < 1:
        raise ValueError(f"num_experts: must be >= 1, got {num_experts}")
    n, dev = topk_ids.numel(), topk_ids.device
    return (_out(ptu, "permuted_to_unpermuted", (n,), torch.int32, dev),
            _out(utp, "unpermuted_to_permuted", (n,), torch.int32, dev),
            _out(off, "expert_first_token_offset", (num_experts + 1,), torch.int64, dev))


def _placement(placement: torch.Tensor | None, dev: torch.device) -> int | None:
    if placement is not None:
        _check(placement, "placement", (gemm_placement_ints(),), torch.int32, dev)
    return _ptr(placement)


def _workspace(workspace: torch.Tensor | None, nbytes: Callable[[], int], dev: torch.device
               ) -> tuple[int | None, int]:
    """(pointer, bytes) of the caller's scratch, or of a fresh one of `nbytes()` bytes (NULL when none
    is needed; the size query runs only then). The runner passes its preallocated workspace (no
    allocation per call, stable addresses for CUDA graphs); the kernels check the size themselves
    (an sm90 workspace below the split-K size only turns splitting off)."""
    if workspace is None:
        size = nbytes()
        if size == 0:
            return None, 0
        workspace = torch.empty(size, dtype=torch.uint8, device=dev)
    else:
        _check(workspace, "workspace", None, None, dev)
    return workspace.data_ptr(), workspace.numel() * workspace.element_size()


def three_step_workspace_bytes(num_tokens: int, top_k: int, num_experts: int) -> int:
    return int(load_library().mb_routing_prologue_three_step_workspace(num_tokens, top_k, num_experts))


def grouped_gemm_sm80_workspace_bytes(num_experts: int) -> int:
    return int(load_library().mb_grouped_gemm_sm80_workspace(num_experts))


def grouped_gemm_sm90_workspace_bytes(num_experts: int, max_rows: int, n: int, k: int) -> int:
    return int(load_library().mb_grouped_gemm_sm90_workspace(num_experts, max_rows, n, k))


@functools.lru_cache(maxsize=None)
def gemm_placement_ints() -> int:
    """int32 elements of one sm90 GEMM claim region (mb_grouped_gemm_sm90_placement_ints)."""
    return int(load_library().mb_grouped_gemm_sm90_placement_ints())


def new_gemm_placement(device: torch.device | str) -> torch.Tensor:
    """A zeroed claim region for one sm90 gated or finalize GEMM that may run at the same time as another
    (its `placement`), which a tactic with launch "placed" needs: that GEMM then starts its CTAs by placement
    (cpp/include/moe_build_kernels.h). Each call leaves it as the next needs it; give it to no concurrent call."""
    return torch.zeros(gemm_placement_ints(), dtype=torch.int32, device=device)


def routing_prologue_fused(topk_ids: torch.Tensor, num_experts: int, permuted_to_unpermuted: torch.Tensor | None = None,
                     unpermuted_to_permuted: torch.Tensor | None = None,
                     expert_first_token_offset: torch.Tensor | None = None,
                     stream: int | torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] int32 -> (permuted_to_unpermuted [T*K], unpermuted_to_permuted [T*K],
    expert_first_token_offset [E+1] int64); KernelError(UNSUPPORTED) outside the fused limits."""
    ptu, utp, off = _map_outputs(topk_ids, num_experts, permuted_to_unpermuted, unpermuted_to_permuted,
                                 expert_first_token_offset)
    t, k = topk_ids.shape
    call("mb_routing_prologue_fused", topk_ids.data_ptr(), t, k, num_experts, ptu.data_ptr(), utp.data_ptr(),
          off.data_ptr(), _stream(stream, topk_ids.device))
    return ptu, utp, off


def routing_prologue_three_step(topk_ids: torch.Tensor, num_experts: int,
                          permuted_to_unpermuted: torch.Tensor | None = None,
                          unpermuted_to_permuted: torch.Tensor | None = None,
                          expert_first_token_offset: torch.Tensor | None = None,
                          workspace: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                          stream: int | torch.cuda.Stream | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same maps as `routing_prologue_fused`, for any token count (workspace allocated unless given).
    `zero_out` (any contiguous CUDA tensor), if given, is zeroed by the same launch: the output that
    grouped_gemm_sm90_finalize accumulates into, when the layer builds its maps in three steps."""
    ptu, utp, off = _map_outputs(topk_ids, num_experts, permuted_to_unpermuted, unpermuted_to_permuted,
                                 expert_first_token_offset)
    t, k = topk_ids.shape
    ws, ws_bytes = _workspace(workspace, lambda: three_step_workspace_bytes(t, k, num_experts), topk_ids.device)
    if zero_out is not None:
        _check(zero_out, "zero_out", device=topk_ids.device)
    zero_bytes = zero_out.numel() * zero_out.element_size() if zero_out is not None else 0
    call("mb_routing_prologue_three_step", topk_ids.data_ptr(), t, k, num_experts, ptu.data_ptr(), utp.data_ptr(),
          off.data_ptr(), ws, ws_bytes, _ptr(zero_out), zero_bytes, _stream(stream, topk_ids.device))
    return ptu, utp, off


def scale_columns(x: torch.Tensor, scale: torch.Tensor, stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """x [rows, cols] (bf16 / fp16) times scale [cols] (fp32) per column, in place, each product in fp32 rounded once:
    the AWQ pre-quant scales' separate step. Returns x."""
    _check(x, "x", (None, None))
    dev = x.device
    _check(scale, "scale", (x.shape[1],), torch.float32, dev)
    call("mb_scale_columns", x.data_ptr(), _dtype_code(x, "x"), scale.data_ptr(), x.shape[0], x.shape[1],
         _stream(stream, dev))
    return x


def expand_rows(input: torch.Tensor, unpermuted_to_permuted: torch.Tensor, topk_weights: torch.Tensor,
                prequant_scale: torch.Tensor | None = None, permuted_input: torch.Tensor | None = None,
                permuted_weights: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                stream: int | torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """input [T, H], topk_weights [T, K] -> (permuted_input [T*K, H], permuted_weights [T*K]): token t's
    row goes to permuted row unpermuted_to_permuted[t*K + j] for each j (the prologue's inverse map).
    `zero_out` [T, H] (input's dtype, not overlapping input), if given, is zeroed by the same launch:
    the output that grouped_gemm_sm90_finalize accumulates into."""
    _check(input, "input", (None, None))
    dev = input.device
    t, h = input.shape
    _check(topk_weights, "topk_weights", (t, None), torch.float32, dev)
    k = topk_weights.shape[1]
    _check(unpermuted_to_permuted, "unpermuted_to_permuted", (t * k,), torch.int32, dev)
    if prequant_scale is not None:
        _check(prequant_scale, "prequant_scale", (h,), torch.float32, dev)
    pin = _out(permuted_input, "permuted_input", (t * k, h), input.dtype, dev)
    pw = _out(permuted_weights, "permuted_weights", (t * k,), torch.float32, dev)
    if zero_out is not None:
        _check(zero_out, "zero_out", (t, h), input.dtype, dev)
    call("mb_expand_rows", input.data_ptr(), _dtype_code(input, "input"), unpermuted_to_permuted.data_ptr(),
          topk_weights.data_ptr(), _ptr(prequant_scale), t, h, k, pin.data_ptr(), pw.data_ptr(), _ptr(zero_out),
          _stream(stream, dev))
    return pin, pw


def _activation_args(input: torch.Tensor, offsets: torch.Tensor, activation: int | str | Activation,
                     bias: torch.Tensor | None) -> tuple[Activation, torch.device, int, int]:
    """The checks both activation wrappers make: (activation, device, rows, output width)."""
    act = Activation(_enum(activation, Activation, "activation"))
    _check(input, "input", (None, None))
    dev = input.device
    rows, n1 = input.shape
    if act.is_gated and n1 % 2:
        raise ValueError(f"input: gated activation {act.name.lower()} needs an even width, got {n1}")
    _check(offsets, "expert_first_token_offset", (None,), torch.int64, dev)
    e = offsets.shape[0] - 1
    if e < 1:
        raise ValueError("expert_first_token_offset: needs E+1 >= 2 entries")
    if bias is not None:
        _check(bias, "bias", (e, n1), input.dtype, dev)
    return act, dev, rows, n1 // 2 if act.is_gated else n1


def fc1_activation(input: torch.Tensor, expert_first_token_offset: torch.Tensor,
               activation: int | str | Activation, bias: torch.Tensor | None = None, swiglu_alpha: float = 1.0,
               swiglu_limit: float = math.inf, prequant_scale: torch.Tensor | None = None,
               out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None
               ) -> torch.Tensor:
    """input [R, N1] (N1 = 2I for gated activations) -> out [R, I]; rows >= offsets[E] untouched."""
    act, dev, rows, inter = _activation_args(input, expert_first_token_offset, activation, bias)
    e = expert_first_token_offset.shape[0] - 1
    if prequant_scale is not None:
        _check(prequant_scale, "prequant_scale", (inter,), torch.float32, dev)
    o = _out(out, "out", (rows, inter), input.dtype, dev)
    call("mb_fc1_activation", input.data_ptr(), _dtype_code(input, "input"), _ptr(bias),
          expert_first_token_offset.data_ptr(), e, rows, inter, int(act), swiglu_alpha, swiglu_limit,
          _ptr(prequant_scale), o.data_ptr(), _stream(stream, dev))
    return o


def finalize(gemm2_out: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
             unpermuted_to_permuted: torch.Tensor, bias: torch.Tensor | None = None, deterministic: bool = True,
             out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
             num_experts: int = 0) -> torch.Tensor:
    """gemm2_out [R >= T*K, H] -> out [T, H] = sum_j w[t,j] * (gemm2_out[utp[t*K+j]] + bias[ids[t,j]]), over the
    pairs whose id is in [0, num_experts) (this rank's experts; the default 0 counts every pair)."""
    _check(gemm2_out, "gemm2_out", (None, None))
    dev = gemm2_out.device
    h = gemm2_out.shape[1]
    _check(topk_weights, "topk_weights", (None, None), torch.float32, dev)
    t, k = topk_weights.shape
    _check(topk_ids, "topk_ids", (t, k), torch.int32, dev)
    _check(unpermuted_to_permuted, "unpermuted_to_permuted", (t * k,), torch.int32, dev)
    if gemm2_out.shape[0] < t * k:
        raise ValueError(f"gemm2_out: needs >= {t * k} rows, got {gemm2_out.shape[0]}")
    if bias is not None:
        _check(bias, "bias", (None, h), gemm2_out.dtype, dev)
    o = _out(out, "out", (t, h), gemm2_out.dtype, dev)
    call("mb_finalize", gemm2_out.data_ptr(), _dtype_code(gemm2_out, "gemm2_out"), _ptr(bias),
          topk_weights.data_ptr(), topk_ids.data_ptr(), unpermuted_to_permuted.data_ptr(), t, h, k,
          int(num_experts), int(bool(deterministic)), o.data_ptr(), _stream(stream, dev))
    return o


# ---- expert parallelism: the token side of dispatch and combine (cpp/src/stages/ep_dispatch.cu) ------

def _max_sms(sms: int | None) -> int:
    """The kernels' `max_sms` argument: 0 for their own grid (None), else the cap, a positive int."""
    if sms is None:
        return 0
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
        raise ValueError(f"sms: must be a positive int or None, got {sms!r}")
    return sms


def ep_layout(topk_ids: torch.Tensor, ep_size: int, experts_per_rank: int, send_counts: torch.Tensor | None = None,
              send_tokens: torch.Tensor | None = None, token_slots: torch.Tensor | None = None,
              stream: int | torch.cuda.Stream | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] -> (send_counts [ep_size], send_tokens [T * ep_size], token_slots [T, ep_size]) int32: rows
    for each rank, the token of each send row (grouped by rank, tokens ascending; only the first
    sum(send_counts) are written) and token t's send row for rank d (-1: not sent)."""
    _check(topk_ids, "topk_ids", (None, None), torch.int32)
    dev = topk_ids.device
    t, k = topk_ids.shape
    counts = _out(send_counts, "send_counts", (ep_size,), torch.int32, dev)
    rows = _out(send_tokens, "send_tokens", (t * ep_size,), torch.int32, dev)
    slots = _out(token_slots, "token_slots", (t, ep_size), torch.int32, dev)
    call("mb_ep_layout", topk_ids.data_ptr(), t, k, ep_size, experts_per_rank, counts.data_ptr(), rows.data_ptr(),
         slots.data_ptr(), _stream(stream, dev))
    return counts, rows, slots


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
                       cap: int, send_counts: torch.Tensor, send_tokens: torch.Tensor, peer_rows: torch.Tensor,
                       peer_meta: torch.Tensor, peer_counts: torch.Tensor, peer_flags: torch.Tensor,
                       done: torch.Tensor, stream: int | torch.cuda.Stream | None = None,
                       sms: int | None = None) -> None:
    """ep_layout's send rows of `hidden` [T, H] (with their ids and weights) written into every peer's recv slots
    for this rank, over NVLink, then every peer's flags[0][rank] raised; peer_* are int64 device tensors
    [ep_size] of the peers' buffer addresses, `done` a [1] int32 counter (zero, and left zero); `sms` caps the
    grid at that many blocks (None: the kernel's own)."""
    _check(hidden, "hidden", (None, None))
    dev = hidden.device
    t, h = hidden.shape
    k = topk_ids.shape[1]
    _check(topk_ids, "topk_ids", (t, k), torch.int32, dev)
    _check(topk_weights, "topk_weights", (t, k), torch.float32, dev)
    ep = send_counts.shape[0]
    _check(send_counts, "send_counts", (ep,), torch.int32, dev)
    for name, ptrs in (("peer_rows", peer_rows), ("peer_meta", peer_meta), ("peer_counts", peer_counts),
                       ("peer_flags", peer_flags)):
        _check(ptrs, name, (ep,), torch.int64, dev)
    _check(done, "done", (1,), torch.int32, dev)
    call("mb_ep_nvlink_dispatch", hidden.data_ptr(), _dtype_code(hidden, "hidden"), topk_ids.data_ptr(),
         topk_weights.data_ptr(), h, k, rank, ep, cap, send_counts.data_ptr(), send_tokens.data_ptr(), t * ep,
         peer_rows.data_ptr(), peer_meta.data_ptr(), peer_counts.data_ptr(), peer_flags.data_ptr(), done.data_ptr(),
         _max_sms(sms), _stream(stream, dev))


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
    for name, t in (("src_rank", src_rank), ("src_row", src_row)):
        _check(t, name, (None,), torch.int32, dev)
        if t.shape[0] < rows:
            raise ValueError(f"{name}: needs >= {rows} entries, got {t.shape[0]}")
    ep = peer_returned.shape[0]
    for name, ptrs in (("peer_returned", peer_returned), ("peer_flags", peer_flags)):
        _check(ptrs, name, (ep,), torch.int64, dev)
    _check(done, "done", (1,), torch.int32, dev)
    if rows_limit is not None:
        _check(rows_limit, "rows_limit", (1,), torch.int64, dev)
    call("mb_ep_nvlink_return", partial.data_ptr(), _dtype_code(partial, "partial"), src_rank.data_ptr(),
         src_row.data_ptr(), rows, 0 if rows_limit is None else rows_limit.data_ptr(), h, peer_returned.data_ptr(),
         rank, ep, peer_flags.data_ptr(), done.data_ptr(), _max_sms(sms), _stream(stream, dev))


def ep_nvlink_combine(returned: torch.Tensor, token_slots: torch.Tensor, flags: torch.Tensor, seen: torch.Tensor,
                      out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
                      sms: int | None = None) -> torch.Tensor:
    """ep_nvlink_wait(flags) and ep_combine in one kernel: every block waits until this rank's flags[1] (`flags`
    [ep] int32) are raised, the last lowers them (`seen` [1] int32: a zero counter, left zero), then each token's
    returned rows are summed in rank order, in fp32. Launched with no tokens too (its wait lowers the flags)."""
    dev, t, ep, h, o = _combine_args(returned, token_slots, out)
    f, s = _wait_args((flags, seen), ep, dev)
    call("mb_ep_nvlink_combine", returned.data_ptr(), _dtype_code(returned, "returned"), token_slots.data_ptr(), t, h,
         ep, o.data_ptr(), f, s, _max_sms(sms), _stream(stream, dev))
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


# ---- FP8 activation quantization (issue 46; cpp/include/moe_build_kernels.h) -----------------------
# The kernels write moe_build.weights.fp8.quantize_rows' bytes and scales bit for bit. Scales come back
# [rows] (static: the static scale repeated, so the FP8 GEMMs always read a per-row array; dynamic per
# row: quantize_rows' [rows, 1]) or [rows, ceil(cols / 128)] (group 128).

def _fp8_group(static_scale: torch.Tensor | None, group: int | None, dev: torch.device) -> int:
    """The C `group` argument: 0 per row (None), 128 per 128-column group; a static scale (a one-element fp32
    CUDA tensor) takes group None."""
    if group not in (None, 0, 128):
        raise ValueError(f"group: must be None (per row) or 128, got {group!r}")
    if static_scale is not None:
        _check(static_scale, "static_scale", None, torch.float32, dev)
        if static_scale.numel() != 1:
            raise ValueError(f"static_scale: must hold one value, got shape {list(static_scale.shape)}")
        if group:
            raise ValueError("group: a static scale takes group None (one scale per row)")
    return int(group or 0)


def _fp8_scale_shape(rows: int, cols: int, group: int) -> tuple[int, ...]:
    return (rows,) if group == 0 else (rows, -(-cols // 128))


def _prequant(prequant_scale: torch.Tensor | None, cols: int, dev: torch.device) -> int | None:
    """The pointer of an AWQ pre-quant scale (fp32 [cols]: W4AFP8's GEMM inputs are x * scale before they are
    quantized), after its check, or None."""
    if prequant_scale is not None:
        _check(prequant_scale, "prequant_scale", (cols,), torch.float32, dev)
    return _ptr(prequant_scale)


def quantize_fp8(input: torch.Tensor, static_scale: torch.Tensor | None = None, group: int | None = None,
                 out: torch.Tensor | None = None, out_scales: torch.Tensor | None = None,
                 stream: int | torch.cuda.Stream | None = None, *, prequant_scale: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """input [R, C] fp16/bf16 -> (q [R, C] float8_e4m3fn, scales fp32 [R] or [R, ceil(C / 128)]):
    quantize_rows(input, static_scale, group). static_scale None: dynamic, per row (group None) or per
    128 columns (group 128). prequant_scale fp32 [C]: quantize_rows(input.float() * prequant_scale, ...)
    (W4AFP8's AWQ pre-quant scale, one fp32 product per element)."""
    _check(input, "input", (None, None))
    dev = input.device
    rows, cols = input.shape
    g = _fp8_group(static_scale, group, dev)
    pre = _prequant(prequant_scale, cols, dev)
    q = _out(out, "out", (rows, cols), torch.float8_e4m3fn, dev)
    s = _out(out_scales, "out_scales", _fp8_scale_shape(rows, cols, g), torch.float32, dev)
    call("mb_quantize_fp8", input.data_ptr(), _dtype_code(input, "input"), rows, cols, pre, _ptr(static_scale), g,
          q.data_ptr(), s.data_ptr(), _stream(stream, dev))
    return q, s


def _expansion_maps(t: int, topk_weights: torch.Tensor, unpermuted_to_permuted: torch.Tensor,
                    dev: torch.device) -> int:
    """top_k, after checking topk_weights [T, K] and unpermuted_to_permuted [T*K]."""
    _check(topk_weights, "topk_weights", (t, None), torch.float32, dev)
    k = topk_weights.shape[1]
    _check(unpermuted_to_permuted, "unpermuted_to_permuted", (t * k,), torch.int32, dev)
    return k


def expand_rows_fp8(input: torch.Tensor, unpermuted_to_permuted: torch.Tensor, topk_weights: torch.Tensor,
                    static_scale: torch.Tensor | None = None, group: int | None = None,
                    permuted_input: torch.Tensor | None = None, permuted_scales: torch.Tensor | None = None,
                    permuted_weights: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                    stream: int | torch.cuda.Stream | None = None, *, prequant_scale: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """expand_rows with the rows quantized as quantize_fp8 quantizes them: input [T, H] fp16/bf16 ->
    (permuted_input [T*K, H] float8_e4m3fn, permuted_scales [T*K] or [T*K, ceil(H / 128)], permuted_weights
    [T*K]). `zero_out` as expand_rows'; `prequant_scale` [H] as quantize_fp8's (expand_rows=prequant_fused)."""
    _check(input, "input", (None, None))
    dev = input.device
    t, h = input.shape
    k = _expansion_maps(t, topk_weights, unpermuted_to_permuted, dev)
    g = _fp8_group(static_scale, group, dev)
    pre = _prequant(prequant_scale, h, dev)
    pin = _out(permuted_input, "permuted_input", (t * k, h), torch.float8_e4m3fn, dev)
    ps = _out(permuted_scales, "permuted_scales", _fp8_scale_shape(t * k, h, g), torch.float32, dev)
    pw = _out(permuted_weights, "permuted_weights", (t * k,), torch.float32, dev)
    if zero_out is not None:
        _check(zero_out, "zero_out", (t, h), input.dtype, dev)
    call("mb_expand_rows_fp8", input.data_ptr(), _dtype_code(input, "input"), unpermuted_to_permuted.data_ptr(),
          topk_weights.data_ptr(), pre, t, h, k, _ptr(static_scale), g, pin.data_ptr(), ps.data_ptr(), pw.data_ptr(),
          _ptr(zero_out), _stream(stream, dev))
    return pin, ps, pw


def expand_rows_fp8_prequantized(input: torch.Tensor, input_scales: torch.Tensor,
                                 unpermuted_to_permuted: torch.Tensor, topk_weights: torch.Tensor,
                                 permuted_input: torch.Tensor | None = None,
                                 permuted_scales: torch.Tensor | None = None,
                                 permuted_weights: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                                 stream: int | torch.cuda.Stream | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The expansion of rows quantize_fp8 quantized: input [T, H] float8_e4m3fn and input_scales [T] or
    [T, ceil(H / 128)] -> (permuted_input [T*K, H], permuted_scales [T*K] or [T*K, ceil(H / 128)],
    permuted_weights [T*K]), the bytes and scales copied. `zero_out` [T, H] (fp32, fp16 or bf16), if given,
    is zeroed by the same launch."""
    _check(input, "input", (None, None), torch.float8_e4m3fn)
    dev = input.device
    t, h = input.shape
    k = _expansion_maps(t, topk_weights, unpermuted_to_permuted, dev)
    groups = -(-h // 128)
    if input_scales.dim() == 1:
        _check(input_scales, "input_scales", (t,), torch.float32, dev)
        scale_shape, scale_cols = (t * k,), 1
    else:
        _check(input_scales, "input_scales", (t, groups), torch.float32, dev)
        scale_shape, scale_cols = (t * k, groups), groups
    pin = _out(permuted_input, "permuted_input", (t * k, h), torch.float8_e4m3fn, dev)
    ps = _out(permuted_scales, "permuted_scales", scale_shape, torch.float32, dev)
    pw = _out(permuted_weights, "permuted_weights", (t * k,), torch.float32, dev)
    zero_dtype = 0
    if zero_out is not None:
        _check(zero_out, "zero_out", (t, h), None, dev)
        zero_dtype = _dtype_code(zero_out, "zero_out")
    call("mb_expand_rows_fp8_prequantized", input.data_ptr(), input_scales.data_ptr(), scale_cols,
          unpermuted_to_permuted.data_ptr(), topk_weights.data_ptr(), t, h, k, pin.data_ptr(), ps.data_ptr(),
          pw.data_ptr(), _ptr(zero_out), zero_dtype, _stream(stream, dev))
    return pin, ps, pw


def fc1_activation_fp8(input: torch.Tensor, expert_first_token_offset: torch.Tensor,
                       activation: int | str | Activation, bias: torch.Tensor | None = None,
                       swiglu_alpha: float = 1.0, swiglu_limit: float = math.inf,
                       static_scale: torch.Tensor | None = None, group: int | None = None,
                       out: torch.Tensor | None = None, out_scales: torch.Tensor | None = None,
                       stream: int | torch.cuda.Stream | None = None, *, prequant_scale: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """fc1_activation's rows quantized as quantize_fp8 quantizes them (GEMM2's FP8 input in one pass):
    input [R, N1] fp16/bf16 -> (out [R, I] float8_e4m3fn, out_scales [R] or [R, ceil(I / 128)]);
    rows >= offsets[E] and their scales untouched. `prequant_scale` [I] as quantize_fp8's, on the activated rows
    (fc2_prequant=fused)."""
    act, dev, rows, inter = _activation_args(input, expert_first_token_offset, activation, bias)
    e = expert_first_token_offset.shape[0] - 1
    g = _fp8_group(static_scale, group, dev)
    pre = _prequant(prequant_scale, inter, dev)
    q = _out(out, "out", (rows, inter), torch.float8_e4m3fn, dev)
    s = _out(out_scales, "out_scales", _fp8_scale_shape(rows, inter, g), torch.float32, dev)
    call("mb_fc1_activation_fp8", input.data_ptr(), _dtype_code(input, "input"), _ptr(bias),
          expert_first_token_offset.data_ptr(), e, rows, inter, int(act), swiglu_alpha, swiglu_limit,
          pre, _ptr(static_scale), g, q.data_ptr(), s.data_ptr(), _stream(stream, dev))
    return q, s


# ---- end of FP8 activation quantization ----------------------------------------------------------


# ---- GEMM wrappers (cpp/src/gemm/) ---------------------------------------------------------------

# A tactic's tile -> mb_gemm_tile, matched by name (decode "staged" is DECODE_STAGED, mma "16x64" is MMA_16x64, wgmma
# "pingpong64x256c2" is PINGPONG_64x256_C2): a tile added to tactics.py without its enum member fails here, at import.
_TILE_MEMBERS = {m.name.lower().replace("_", ""): m for m in GemmTile}
_TILES = {tile: _TILE_MEMBERS[prefix + tile]
          for prefix, tiles in (("", ("none",)), ("decode", DECODE_TILES[1:]), ("mma", MMA_TILES), ("", WGMMA_TILES))
          for tile in tiles}


def tactic_struct(tactic: GemmTactic | str | GemmTacticStruct) -> GemmTacticStruct:
    """The mb_gemm_tactic of a plan's tactic (or its name, or the struct itself); the entry points take it by
    value. The runner converts each band's tactic once and passes the struct."""
    if isinstance(tactic, GemmTacticStruct):
        return tactic
    return _struct_of(GemmTactic.parse(tactic) if isinstance(tactic, str) else tactic)


@functools.lru_cache(maxsize=256)
def _struct_of(t: GemmTactic) -> GemmTacticStruct:
    return GemmTacticStruct(GemmKernel[t.kernel.upper()], _TILES[t.tile], t.k_split,
                            GemmLaunch[t.launch.upper()], OutputL2[t.output_l2.upper()])


def _gemm_common(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor
                 ) -> tuple[torch.device, int, int, int, int]:
    _check(a, "A", (None, None))
    dev = a.device
    _check(b, "B", (None, None, a.shape[1]), a.dtype, dev)
    _check(offsets, "expert_first_token_offset", (b.shape[0] + 1,), torch.int64, dev)
    return dev, a.shape[0], a.shape[1], b.shape[0], b.shape[1]


def grouped_gemm_sm80(a: torch.Tensor, b: torch.Tensor, expert_first_token_offset: torch.Tensor,
                      activation: int | str | Activation = Activation.IDENTITY, fused_gated: bool = False,
                      bias: torch.Tensor | None = None, swiglu_alpha: float = 1.0, swiglu_limit: float = math.inf,
                      c: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                      stream: int | torch.cuda.Stream | None = None, *, tactic: GemmTactic | str) -> torch.Tensor:
    """C[p] = act(A[p] @ B[x]^T + bias[x]); A [R, k], B [E, n, k] (fused_gated: [E, 2n, k]) -> C [R, n],
    run as `tactic` (a decode or mma tactic)."""
    dev, rows, k, e, bn = _gemm_common(a, b, expert_first_token_offset)
    act = _enum(activation, Activation, "activation")
    if fused_gated and bn % 2:
        raise ValueError(f"B: fused_gated needs an even output width, got {bn}")
    n = bn // 2 if fused_gated else bn
    if bias is not None:
        _check(bias, "bias", (e, bn), a.dtype, dev)
    out = _out(c, "C", (rows, n), a.dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_sm80_workspace_bytes(e), dev)
    call("mb_grouped_gemm_sm80", a.data_ptr(), b.data_ptr(), _ptr(bias), out.data_ptr(),
          expert_first_token_offset.data_ptr(), e, rows, n, k, _dtype_code(a, "A"), act, int(bool(fused_gated)),
          swiglu_alpha, swiglu_limit, tactic_struct(tactic), ws, ws_bytes, _stream(stream, dev))
    return out


def grouped_gemm_sm90(a: torch.Tensor, b: torch.Tensor, expert_first_token_offset: torch.Tensor,
                      bias: torch.Tensor | None = None, c: torch.Tensor | None = None,
                      workspace: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
                      weight_layout: int | str | WeightLayout = WeightLayout.ROW_MAJOR, *,
                      tactic: GemmTactic | str) -> torch.Tensor:
    """C[p] = A[p] @ B[x]^T (+ bias[x]); A [R, k], B [E, n, k] -> C [R, n], run as `tactic`.
    B's storage is `weight_layout`'s (blocked64: moe_build.weights.block_64x64's; its shape stays [E, n, k])."""
    dev, rows, k, e, n = _gemm_common(a, b, expert_first_token_offset)
    if bias is not None:
        _check(bias, "bias", (e, n), a.dtype, dev)
    out = _out(c, "C", (rows, n), a.dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_sm90_workspace_bytes(e, rows, n, k), dev)
    call("mb_grouped_gemm_sm90", a.data_ptr(), b.data_ptr(), _ptr(bias), out.data_ptr(),
          expert_first_token_offset.data_ptr(), e, rows, n, k, _dtype_code(a, "A"),
          _enum(weight_layout, WeightLayout, "weight_layout"), tactic_struct(tactic), ws, ws_bytes,
          _stream(stream, dev))
    return out


def grouped_gemm_sm90_finalize(a: torch.Tensor, b: torch.Tensor, expert_first_token_offset: torch.Tensor,
                               permuted_to_unpermuted: torch.Tensor, permuted_weights: torch.Tensor,
                               num_tokens: int, top_k: int, bias: torch.Tensor | None = None,
                               out: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                               stream: int | torch.cuda.Stream | None = None,
                               weight_layout: int | str | WeightLayout = WeightLayout.ROW_MAJOR,
                               placement: torch.Tensor | None = None, *, tactic: GemmTactic | str) -> torch.Tensor:
    """out[t] += w[p] * (A[p] @ B[x]^T + bias[x]) for the token t of each permuted row p -> out [T, n].
    A given `out` must be zeroed by the caller; an allocated one is zeroed here. B as grouped_gemm_sm90's;
    `placement` from new_gemm_placement (needed by a placed tactic)."""
    dev, rows, k, e, n = _gemm_common(a, b, expert_first_token_offset)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    if bias is not None:
        _check(bias, "bias", (e, n), a.dtype, dev)
    o = _out(out, "out", (num_tokens, n), a.dtype, dev, zero=True)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_sm90_workspace_bytes(e, rows, n, k), dev)
    call("mb_grouped_gemm_sm90_finalize", a.data_ptr(), b.data_ptr(), _ptr(bias), o.data_ptr(),
          expert_first_token_offset.data_ptr(), permuted_to_unpermuted.data_ptr(), permuted_weights.data_ptr(), e,
          rows, num_tokens, top_k, n, k, _dtype_code(a, "A"), _enum(weight_layout, WeightLayout, "weight_layout"),
          tactic_struct(tactic), _placement(placement, dev), ws, ws_bytes, _stream(stream, dev))
    return o


def grouped_gemm_sm90_gated(a: torch.Tensor, b: torch.Tensor, expert_first_token_offset: torch.Tensor,
                            activation: int | str | Activation, bias: torch.Tensor | None = None,
                            swiglu_alpha: float = 1.0, swiglu_limit: float = math.inf,
                            c: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                            stream: int | torch.cuda.Stream | None = None,
                            weight_layout: int | str | WeightLayout = WeightLayout.ROW_MAJOR,
                            placement: torch.Tensor | None = None, *, tactic: GemmTactic | str) -> torch.Tensor:
    """C[p] = act(gate, up) of A[p] @ B[x]^T (+ bias[x]), the gated activation in GEMM1's epilogue.
    B [E, 2I, k] and bias [E, 2I] in moe_build.weights.interleave_gate_up's order (B then stored in
    `weight_layout`'s layout, as grouped_gemm_sm90's) -> C [R, I]. `placement` as grouped_gemm_sm90_finalize's."""
    dev, rows, k, e, n2 = _gemm_common(a, b, expert_first_token_offset)
    act = _enum(activation, Activation, "activation")
    if bias is not None:
        _check(bias, "bias", (e, n2), a.dtype, dev)
    out = _out(c, "C", (rows, n2 // 2), a.dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_sm90_workspace_bytes(e, rows, n2, k), dev)
    call("mb_grouped_gemm_sm90_gated", a.data_ptr(), b.data_ptr(), _ptr(bias), out.data_ptr(),
          expert_first_token_offset.data_ptr(), e, rows, n2 // 2, k, _dtype_code(a, "A"), act, swiglu_alpha,
          swiglu_limit, _enum(weight_layout, WeightLayout, "weight_layout"), tactic_struct(tactic),
          _placement(placement, dev), ws, ws_bytes, _stream(stream, dev))
    return out


# ---- the FP8 grouped GEMM ---------------------------------------------------------------------

def grouped_gemm_fp8_workspace_bytes(num_experts: int, max_rows: int, n: int, k: int) -> int:
    return int(load_library().mb_grouped_gemm_fp8_workspace(num_experts, max_rows, n, k))


def fp8_scale_shapes(scaling: Fp8Scaling, rows: int, experts: int, n: int, k: int
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of scale_a and scale_b for `scaling` (cpp/include/moe_build_kernels.h, mb_grouped_gemm_fp8)."""
    if scaling is Fp8Scaling.ROWWISE:
        return (rows,), (experts, n)
    kb = -(-k // 128)
    return (rows, kb), (experts, -(-n // 128), kb)


def _fp8_gemm_args(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                   expert_first_token_offset: torch.Tensor, scaling: int | str | Fp8Scaling, out_dtype: torch.dtype,
                   bias: torch.Tensor | None) -> tuple[torch.device, int, int, int, int, Fp8Scaling]:
    """What both FP8 GEMM wrappers check: (device, rows, k, experts, n, scaling)."""
    _check(a, "A", (None, None), torch.float8_e4m3fn)
    dev, rows, k = a.device, a.shape[0], a.shape[1]
    _check(b, "B", (None, None, k), torch.float8_e4m3fn, dev)
    e, n = b.shape[0], b.shape[1]
    _check(expert_first_token_offset, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    mode = Fp8Scaling(_enum(scaling, Fp8Scaling, "scaling"))
    shape_a, shape_b = fp8_scale_shapes(mode, rows, e, n, k)
    _check(scale_a, "scale_a", shape_a, torch.float32, dev)
    _check(scale_b, "scale_b", shape_b, torch.float32, dev)
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"out_dtype: {out_dtype} is not bfloat16 or float16 (the FP8 GEMM has no FP8 output)")
    if bias is not None:
        _check(bias, "bias", (e, n), out_dtype, dev)
    return dev, rows, k, e, n, mode


def grouped_gemm_fp8(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                     expert_first_token_offset: torch.Tensor, scaling: int | str | Fp8Scaling,
                     out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
                     c: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                     stream: int | torch.cuda.Stream | None = None, *, tactic: GemmTactic | str) -> torch.Tensor:
    """C[p] = scaled A[p] @ B[x]^T (+ bias[x]); A [R, k] and B [E, n, k] float8_e4m3fn, scales fp32 as
    `scaling` says (fp8_scale_shapes) -> C [R, n] in out_dtype (bf16 or fp16), run as `tactic`."""
    dev, rows, k, e, n, mode = _fp8_gemm_args(a, scale_a, b, scale_b, expert_first_token_offset, scaling, out_dtype,
                                              bias)
    out = _out(c, "C", (rows, n), out_dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_fp8_workspace_bytes(e, rows, n, k), dev)
    call("mb_grouped_gemm_fp8", a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), int(mode),
         _ptr(bias), out.data_ptr(), expert_first_token_offset.data_ptr(), e, rows, n, k,
         int(DType.BF16 if out_dtype == torch.bfloat16 else DType.FP16), tactic_struct(tactic), ws, ws_bytes,
         _stream(stream, dev))
    return out


def grouped_gemm_fp8_finalize(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                              expert_first_token_offset: torch.Tensor, permuted_to_unpermuted: torch.Tensor,
                              permuted_weights: torch.Tensor, num_tokens: int, top_k: int,
                              scaling: int | str | Fp8Scaling, out_dtype: torch.dtype = torch.bfloat16,
                              bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
                              workspace: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
                              *, tactic: GemmTactic | str) -> torch.Tensor:
    """out[t] += w[p] * (scaled A[p] @ B[x]^T + bias[x]) for the token t of each permuted row p -> out [T, n]
    (grouped_gemm_sm90_finalize's epilogue on grouped_gemm_fp8's product). A given `out` must be zeroed by the
    caller; an allocated one is zeroed here."""
    dev, rows, k, e, n, mode = _fp8_gemm_args(a, scale_a, b, scale_b, expert_first_token_offset, scaling, out_dtype,
                                              bias)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    o = _out(out, "out", (num_tokens, n), out_dtype, dev, zero=True)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_fp8_workspace_bytes(e, rows, n, k), dev)
    call("mb_grouped_gemm_fp8_finalize", a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(),
         int(mode), _ptr(bias), o.data_ptr(), expert_first_token_offset.data_ptr(), permuted_to_unpermuted.data_ptr(),
         permuted_weights.data_ptr(), e, rows, num_tokens, top_k, n, k,
         int(DType.BF16 if out_dtype == torch.bfloat16 else DType.FP16), tactic_struct(tactic), ws, ws_bytes,
         _stream(stream, dev))
    return o


# ---- weight-only grouped GEMM (issue 47; cpp/src/gemm/woq_abi.cu) ------------------------------------------

def _check_woq_scales(mode: WoqKind, scales: torch.Tensor, zeros: torch.Tensor | None, group: int, e: int, n: int,
                      k: int, dev: torch.device) -> None:
    """A weight-only layer's scales (fp32 [E, n, k/group], [E, n, 1] for group 0; MXFP4: uint8 e8m0 [E, n, k/32])
    and int4 zeros (uint8, shaped as the scales)."""
    groups = k // 32 if mode is WoqKind.MXFP4 else (1 if group == 0 else k // group)
    _check(scales, "scales", (e, n, groups), torch.uint8 if mode is WoqKind.MXFP4 else torch.float32, dev)
    if zeros is not None:
        _check(zeros, "zeros", (e, n, groups), torch.uint8, dev)


def _woq_gemm_args(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                   expert_first_token_offset: torch.Tensor, group: int, zeros: torch.Tensor | None,
                   bias: torch.Tensor | None, scale_a: torch.Tensor | None, out_dtype: torch.dtype | None
                   ) -> tuple[torch.device, int, int, int, int, WoqKind, torch.dtype]:
    """grouped_gemm_woq's operand checks (shared with its finalize form) -> (device, rows, k, experts, n, kind,
    output dtype)."""
    fp8 = scale_a is not None
    _check(a, "A", (None, None), torch.float8_e4m3fn if fp8 else None)
    dev, rows, k = a.device, a.shape[0], a.shape[1]
    if fp8:
        _check(scale_a, "scale_a", (rows,), torch.float32, dev)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"out_dtype: {out_dtype} is not bfloat16 or float16 (e4m3 A needs the output dtype)")
    else:
        out_dtype = a.dtype
    mode = WoqKind(_enum(kind, WoqKind, "kind"))
    packed = mode is not WoqKind.INT8
    _check(b, "B", (None, None, k // 2 if packed else k), torch.uint8 if packed else torch.int8, dev)
    e, n = b.shape[0], b.shape[1]
    _check(expert_first_token_offset, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    _check_woq_scales(mode, scales, zeros, group, e, n, k, dev)
    if bias is not None:
        _check(bias, "bias", (e, n), out_dtype, dev)
    return dev, rows, k, e, n, mode, out_dtype


def grouped_gemm_woq(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                     expert_first_token_offset: torch.Tensor, group: int, zeros: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, c: torch.Tensor | None = None,
                     stream: int | torch.cuda.Stream | None = None, *, tactic: GemmTactic | str,
                     scale_a: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """C[p] = A[p] @ dequant(B[x])^T (+ bias[x]): A [R, k] bf16/fp16, B in moe_build/weights/woq.py's packed form
    of `kind` ([E, n, k/2] uint8 for int4 / mxfp4, [E, n, k] int8), scales fp32 [E, n, k/group] ([E, n, 1] for
    group 0; uint8 e8m0 [E, n, k/32] for mxfp4), int4 zeros uint8 like the scales or None -> C [R, n]. `tactic`:
    the decode kernel (decode:ksplitN, or decode:staged_ksplitN for the int4 forms with one scale per row or per 128
    k: the token rows staged in shared memory) for a few rows per expert, the mma tiles (mma:64x128, mma:128x128) for many.
    W4AFP8: A float8_e4m3fn with `scale_a` fp32 [R] (C[p] = scale_a[p] * A[p] @ dequant(B[x])^T (+ bias)), int4
    weights, C in `out_dtype` (bf16 or fp16, required then; else A's dtype)."""
    dev, rows, k, e, n, mode, out_dtype = _woq_gemm_args(a, b, kind, scales, expert_first_token_offset, group, zeros,
                                                         bias, scale_a, out_dtype)
    out = _out(c, "C", (rows, n), out_dtype, dev)
    call("mb_grouped_gemm_woq", a.data_ptr(), int(WoqInput.DTYPE if scale_a is None else WoqInput.E4M3),
         _ptr(scale_a), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros), group, _ptr(bias), out.data_ptr(),
         expert_first_token_offset.data_ptr(), e, rows, n, k, _dtype_code(out, "C"), tactic_struct(tactic),
         _stream(stream, dev))
    return out


def grouped_gemm_woq_finalize(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                              expert_first_token_offset: torch.Tensor, group: int,
                              permuted_to_unpermuted: torch.Tensor, permuted_weights: torch.Tensor, num_tokens: int,
                              top_k: int, zeros: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                              out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None, *,
                              tactic: GemmTactic | str, scale_a: torch.Tensor | None = None,
                              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[t] += w[p] * (grouped_gemm_woq's C[p] + bias[x]) for the token t of each permuted row p -> out [T, n], on
    the decode kernel only (a decode tactic). A given `out` must be zeroed by the caller; an allocated one is zeroed
    here."""
    dev, rows, k, e, n, mode, out_dtype = _woq_gemm_args(a, b, kind, scales, expert_first_token_offset, group, zeros,
                                                         bias, scale_a, out_dtype)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    o = _out(out, "out", (num_tokens, n), out_dtype, dev, zero=True)
    call("mb_grouped_gemm_woq_finalize", a.data_ptr(), int(WoqInput.DTYPE if scale_a is None else WoqInput.E4M3),
         _ptr(scale_a), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros), group, _ptr(bias), o.data_ptr(),
         expert_first_token_offset.data_ptr(), permuted_to_unpermuted.data_ptr(), permuted_weights.data_ptr(), e,
         rows, num_tokens, top_k, n, k, _dtype_code(o, "out"), tactic_struct(tactic), _stream(stream, dev))
    return o


def grouped_gemm_woq_sm90_workspace_bytes(num_experts: int) -> int:
    return int(load_library().mb_grouped_gemm_woq_sm90_workspace(num_experts))


def grouped_gemm_woq_sm90(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                          zeros: torch.Tensor | None, expert_first_token_offset: torch.Tensor, group: int,
                          c: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                          stream: int | torch.cuda.Stream | None = None, *, tactic: GemmTactic | str) -> torch.Tensor:
    """grouped_gemm_woq's C = A @ dequant(B[x])^T on wgmma (compute capability 9.0; a wgmma tactic on a woq tile,
    tactics.WOQ_WGMMA_TILES): the weights converted in registers by CUTLASS's mixed-input mainloop. A [R, k] bf16/fp16, B
    int4 ([E, n, k/2] uint8) or int8 ([E, n, k]); scales in A's dtype, MN-major [E, groups, n]; int4 zeros the same,
    holding (8 - z) * s (moe_build/weights/woq.py's wgmma_scales writes both) -> C [R, n]."""
    _check(a, "A", (None, None))
    dev, rows, k = a.device, a.shape[0], a.shape[1]
    mode = WoqKind(_enum(kind, WoqKind, "kind"))
    if mode is WoqKind.MXFP4:
        raise ValueError("kind: mxfp4 has no wgmma weight-only kernel (int4 or int8)")
    packed = mode is WoqKind.INT4
    _check(b, "B", (None, None, k // 2 if packed else k), torch.uint8 if packed else torch.int8, dev)
    e, n = b.shape[0], b.shape[1]
    _check(expert_first_token_offset, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    groups = k // group if group > 0 else 1
    _check(scales, "scales", (e, groups, n), a.dtype, dev)
    if zeros is not None:
        _check(zeros, "zeros", (e, groups, n), a.dtype, dev)
    out = _out(c, "C", (rows, n), a.dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_woq_sm90_workspace_bytes(e), dev)
    call("mb_grouped_gemm_woq_sm90", a.data_ptr(), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros), group,
         out.data_ptr(), expert_first_token_offset.data_ptr(), e, rows, n, k, _dtype_code(out, "C"),
         tactic_struct(tactic), ws, ws_bytes, _stream(stream, dev))
    return out


def woq_dequantize(b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor, group: int,
                   zeros: torch.Tensor | None = None, out: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                   stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """grouped_gemm_woq's stored weights B (with its scales, zeros and group) dequantized -> [E, n, k] row-major in
    `dtype` (bf16 or fp16; out's where given), each weight computed in fp32 and rounded once: the weights a
    weight-only GEMM's wgmma tactic hands the 16-bit wgmma GEMM."""
    mode = WoqKind(_enum(kind, WoqKind, "kind"))
    packed = mode is not WoqKind.INT8
    _check(b, "B", (None, None, None), torch.uint8 if packed else torch.int8)
    dev = b.device
    e, n = b.shape[0], b.shape[1]
    k = b.shape[2] * (2 if packed else 1)
    _check_woq_scales(mode, scales, zeros, group, e, n, k, dev)
    o = _out(out, "out", (e, n, k), dtype or (out.dtype if out is not None else torch.bfloat16), dev)
    call("mb_woq_dequantize", int(mode), b.data_ptr(), scales.data_ptr(), _ptr(zeros), group, e, n, k,
         _dtype_code(o, "out"), o.data_ptr(), _stream(stream, dev))
    return o
