"""Torch wrappers of the stage kernels (cpp/src/stages/): routing, the routing prologues, the row expansion, the
gated activation, the scale kernel and the finalize."""
from __future__ import annotations

import math

import torch

from ..abi import Activation, Routing
from ..library import call, load_library
from .args import _check, _dtype_code, _enum, _out, _ptr, _stream, _workspace


def routing(logits: torch.Tensor, top_k: int, method: int | str | Routing = Routing.SOFTMAX_TOPK,
            renormalize: bool = False, correction_bias: torch.Tensor | None = None, num_groups: int = 1,
            topk_groups: int = 1, routed_scaling_factor: float = 1.0, topk_ids: torch.Tensor | None = None,
            topk_weights: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (topk_ids [T, K] int32, topk_weights [T, K] float32)."""
    m, ids, w = _routing_args(logits, top_k, method, correction_bias, topk_ids, topk_weights)
    t, e = logits.shape
    call("mb_routing", logits.data_ptr(), _dtype_code(logits, "logits"), _ptr(correction_bias), t, e, top_k, m,
          int(bool(renormalize)), num_groups, topk_groups, routed_scaling_factor, ids.data_ptr(), w.data_ptr(),
          _stream(stream, logits.device))
    return ids, w


def _routing_args(logits: torch.Tensor, top_k: int, method: int | str | Routing, correction_bias: torch.Tensor | None,
                  topk_ids: torch.Tensor | None, topk_weights: torch.Tensor | None
                  ) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The routing's checked tensors, as every entry point that routes takes them: (method code, topk_ids,
    topk_weights)."""
    _check(logits, "logits", (None, None))
    dev = logits.device
    t, e = logits.shape
    m = _enum(method, Routing, "method")
    if correction_bias is not None:
        _check(correction_bias, "correction_bias", (e,), torch.float32, dev)
    return (m, _out(topk_ids, "topk_ids", (t, top_k), torch.int32, dev),
            _out(topk_weights, "topk_weights", (t, top_k), torch.float32, dev))


def _map_outputs(topk_ids: torch.Tensor, num_experts: int, ptu: torch.Tensor | None, utp: torch.Tensor | None,
                 off: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(topk_ids, "topk_ids", (None, None), torch.int32)
    if num_experts < 1:
        raise ValueError(f"num_experts: must be >= 1, got {num_experts}")
    n, dev = topk_ids.numel(), topk_ids.device
    return (_out(ptu, "permuted_to_unpermuted", (n,), torch.int32, dev),
            _out(utp, "unpermuted_to_permuted", (n,), torch.int32, dev),
            _out(off, "expert_first_token_offset", (num_experts + 1,), torch.int64, dev))


def _zeroed(zero_out: torch.Tensor | None, dev: torch.device) -> tuple[int | None, int]:
    """(pointer, bytes) of the three-step prologue's `zero_out` (any contiguous tensor on `dev`), or (NULL, 0)."""
    if zero_out is None:
        return None, 0
    _check(zero_out, "zero_out", device=dev)
    return _ptr(zero_out), zero_out.numel() * zero_out.element_size()


def three_step_workspace_bytes(num_tokens: int, top_k: int, num_experts: int) -> int:
    return int(load_library().mb_routing_prologue_three_step_workspace(num_tokens, top_k, num_experts))


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


def routing_prologue_fused_routing(logits: torch.Tensor, top_k: int, method: int | str | Routing = Routing.SOFTMAX_TOPK,
                                   renormalize: bool = False, correction_bias: torch.Tensor | None = None,
                                   num_groups: int = 1, topk_groups: int = 1, routed_scaling_factor: float = 1.0,
                                   topk_ids: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                                   permuted_to_unpermuted: torch.Tensor | None = None,
                                   unpermuted_to_permuted: torch.Tensor | None = None,
                                   expert_first_token_offset: torch.Tensor | None = None,
                                   stream: int | torch.cuda.Stream | None = None
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`routing` then `routing_prologue_fused` in one launch: logits [T, E] -> (topk_ids, topk_weights, and the
    three maps over the E experts), the same values as the two calls; KernelError(UNSUPPORTED) outside the fused
    prologue's limits."""
    m, ids, w = _routing_args(logits, top_k, method, correction_bias, topk_ids, topk_weights)
    t, e = logits.shape
    ptu, utp, off = _map_outputs(ids, e, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset)
    call("mb_routing_prologue_fused_routing", logits.data_ptr(), _dtype_code(logits, "logits"), _ptr(correction_bias),
         t, e, top_k, m, int(bool(renormalize)), num_groups, topk_groups, routed_scaling_factor, ids.data_ptr(),
         w.data_ptr(), ptu.data_ptr(), utp.data_ptr(), off.data_ptr(), _stream(stream, logits.device))
    return ids, w, ptu, utp, off


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
    call("mb_routing_prologue_three_step", topk_ids.data_ptr(), t, k, num_experts, ptu.data_ptr(), utp.data_ptr(),
          off.data_ptr(), ws, ws_bytes, *_zeroed(zero_out, topk_ids.device), _stream(stream, topk_ids.device))
    return ptu, utp, off


def routing_prologue_three_step_routing(
        logits: torch.Tensor, top_k: int, method: int | str | Routing = Routing.SOFTMAX_TOPK,
        renormalize: bool = False, correction_bias: torch.Tensor | None = None, num_groups: int = 1,
        topk_groups: int = 1, routed_scaling_factor: float = 1.0, topk_ids: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None, permuted_to_unpermuted: torch.Tensor | None = None,
        unpermuted_to_permuted: torch.Tensor | None = None, expert_first_token_offset: torch.Tensor | None = None,
        workspace: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
        stream: int | torch.cuda.Stream | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`routing` then `routing_prologue_three_step` in two launches rather than three (the first routes and counts):
    logits [T, E] -> (topk_ids, topk_weights, and the three maps over the E experts), the same values as the two calls;
    KernelError(UNSUPPORTED) past T * top_k = 1024 rows (one block routes)."""
    m, ids, w = _routing_args(logits, top_k, method, correction_bias, topk_ids, topk_weights)
    t, e = logits.shape
    ptu, utp, off = _map_outputs(ids, e, permuted_to_unpermuted, unpermuted_to_permuted, expert_first_token_offset)
    ws, ws_bytes = _workspace(workspace, lambda: three_step_workspace_bytes(t, top_k, e), logits.device)
    call("mb_routing_prologue_three_step_routing", logits.data_ptr(), _dtype_code(logits, "logits"),
         _ptr(correction_bias), t, e, top_k, m, int(bool(renormalize)), num_groups, topk_groups, routed_scaling_factor,
         ids.data_ptr(), w.data_ptr(), ptu.data_ptr(), utp.data_ptr(), off.data_ptr(), ws, ws_bytes,
         *_zeroed(zero_out, logits.device), _stream(stream, logits.device))
    return ids, w, ptu, utp, off


def scale_columns(x: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None,
                  stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """x [rows, cols] (bf16 / fp16) times scale [cols] (fp32) per column, each product in fp32 rounded once, into
    `out` (x's shape and dtype; None: x itself, in place): the AWQ pre-quant scales' separate step. Returns out."""
    _check(x, "x", (None, None))
    dev = x.device
    _check(scale, "scale", (x.shape[1],), torch.float32, dev)
    if out is None:
        out = x
    else:
        _check(out, "out", tuple(x.shape), x.dtype, dev)
        nbytes = x.numel() * x.element_size()
        if out.data_ptr() != x.data_ptr() and abs(out.data_ptr() - x.data_ptr()) < nbytes:
            raise ValueError("out: must be x itself (in place) or not overlap it")
    call("mb_scale_columns", x.data_ptr(), out.data_ptr(), _dtype_code(x, "x"), scale.data_ptr(), x.shape[0],
         x.shape[1], _stream(stream, dev))
    return out


def _expansion_maps(t: int, topk_weights: torch.Tensor, unpermuted_to_permuted: torch.Tensor,
                    dev: torch.device) -> int:
    """top_k, after checking topk_weights [T, K] and unpermuted_to_permuted [T*K]."""
    _check(topk_weights, "topk_weights", (t, None), torch.float32, dev)
    k = topk_weights.shape[1]
    _check(unpermuted_to_permuted, "unpermuted_to_permuted", (t * k,), torch.int32, dev)
    return k


def _prequant(prequant_scale: torch.Tensor | None, cols: int, dev: torch.device) -> int | None:
    """The pointer of an AWQ pre-quant scale (fp32 [cols]: the rows times it, before W4AFP8 quantizes them or as
    W4A16's GEMMs read them), after its check, or None."""
    if prequant_scale is not None:
        _check(prequant_scale, "prequant_scale", (cols,), torch.float32, dev)
    return _ptr(prequant_scale)


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
    k = _expansion_maps(t, topk_weights, unpermuted_to_permuted, dev)
    pre = _prequant(prequant_scale, h, dev)
    pin = _out(permuted_input, "permuted_input", (t * k, h), input.dtype, dev)
    pw = _out(permuted_weights, "permuted_weights", (t * k,), torch.float32, dev)
    if zero_out is not None:
        _check(zero_out, "zero_out", (t, h), input.dtype, dev)
    call("mb_expand_rows", input.data_ptr(), _dtype_code(input, "input"), unpermuted_to_permuted.data_ptr(),
          topk_weights.data_ptr(), pre, t, h, k, pin.data_ptr(), pw.data_ptr(), _ptr(zero_out),
          _stream(stream, dev))
    return pin, pw


def _activation_args(input: torch.Tensor, offsets: torch.Tensor, activation: int | str | Activation,
                     bias: torch.Tensor | None, gate_up_interleaved: bool = False
                     ) -> tuple[Activation, torch.device, int, int]:
    """The checks both activation wrappers make: (activation, device, rows, output width)."""
    act = Activation(_enum(activation, Activation, "activation"))
    _check(input, "input", (None, None))
    dev = input.device
    rows, n1 = input.shape
    if act.is_gated and n1 % 2:
        raise ValueError(f"input: gated activation {act.name.lower()} needs an even width, got {n1}")
    if gate_up_interleaved and not (act.is_gated and n1 % 16 == 0):
        raise ValueError(f"gate_up_interleaved: needs a gated activation and a width a multiple of 16 (blocks of 8 "
                         f"features), got {act.name.lower()} at width {n1}")
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
               out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None, *,
               gate_up_interleaved: bool = False) -> torch.Tensor:
    """input [R, N1] (N1 = 2I for gated activations) -> out [R, I]; rows >= offsets[E] untouched.
    gate_up_interleaved: input's and bias's columns in W1's interleaved order (interleave_gate_up's, I a multiple of
    8), as a weight-only GEMM1 on W1 interleaved for the gated epilogue writes them."""
    act, dev, rows, inter = _activation_args(input, expert_first_token_offset, activation, bias, gate_up_interleaved)
    e = expert_first_token_offset.shape[0] - 1
    pre = _prequant(prequant_scale, inter, dev)
    o = _out(out, "out", (rows, inter), input.dtype, dev)
    call("mb_fc1_activation", input.data_ptr(), _dtype_code(input, "input"), _ptr(bias),
          expert_first_token_offset.data_ptr(), e, rows, inter, int(act), int(gate_up_interleaved), swiglu_alpha,
          swiglu_limit, pre, o.data_ptr(), _stream(stream, dev))
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
