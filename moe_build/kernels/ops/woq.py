"""Torch wrappers of the weight-only grouped GEMMs (issue 47; cpp/src/gemm/woq_abi.cu, woq_sm90.cu,
woq_dequantize.cu)."""
from __future__ import annotations

import math

import torch

from ...planner.tactics import GemmTactic
from ...planner.tactics.woq import DIGITS_GROUP_BYTES, ROW_SCALE_DIGITS_MAX_COLS
from ...weights.woq import TILE_ROWS
from ..abi import Activation, WoqInput, WoqKind
from ..library import call, load_library
from .args import _check, _dtype_code, _enum, _out, _ptr, _stream, _workspace
from .fp8 import _fp8_static
from .gemm import tactic_struct
from .stages import _activation_args, _expansion_maps, _prequant


def _check_woq_scales(mode: WoqKind, scales: torch.Tensor, zeros: torch.Tensor | None, group: int, e: int, n: int,
                      k: int, dev: torch.device) -> None:
    """A weight-only layer's scales (fp32 [E, n, k/group], [E, n, 1] for group 0; MXFP4: uint8 e8m0 [E, n, k/32], in
    its quarters form [E, n, 4 ceil(k/128)]) and int4 zeros (uint8, shaped as the scales)."""
    if mode is WoqKind.MXFP4_QUARTERS:
        _check(scales, "scales", (e, n, 4 * -(-k // 128)), torch.uint8, dev)
        return
    groups = k // 32 if mode is WoqKind.MXFP4 else (1 if group == 0 else k // group)
    _check(scales, "scales", (e, n, groups), torch.uint8 if mode is WoqKind.MXFP4 else torch.float32, dev)
    if zeros is not None:
        _check(zeros, "zeros", (e, n, groups), torch.uint8, dev)


def _digits_width(k: int, group: int, name: str) -> int:
    """The digit records of a row of `k` values for a GEMM whose weights have one scale per `group` k (0, 32, 64,
    128; 32: MXFP4's): ceil(k / 128), the last a half group where k % 128 == 64 (groups 32 and 64 only)."""
    if group not in (0, 32, 64, 128):
        raise ValueError(f"group: {group} is not 0, 32, 64 or 128 (the GEMM's weights' scale group)")
    whole = 64 if group in (32, 64) else 128
    if k % whole:
        raise ValueError(f"{name}: {k} is not a multiple of {whole} (the digits' groups at weight group {group})")
    return -(-k // 128)


def token_digits(a: torch.Tensor, out: torch.Tensor | None = None, group: int = 128,
                 stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """The rows a [R, k] (bf16 or fp16) as the decode kernel's digits tile reads them for weights with one scale per
    `group` k (int4: 0 (per row), 64 or 128; MXFP4 and int8 weights, whatever their scales: 32; k % 128 == 0, or
    k % 64 == 0 at groups 32 and 64) -> uint8
    [R, ceil(k / 128), 400]:
    per 128-k group three 8-bit digits a value under one power-of-two factor, exact for every bf16 value within 2^10
    of the group's largest and every fp16 one within 2^7 (stages/token_digits.cu; the layout, in the order of
    `group`'s mma steps: cpp/src/common/token_digits.cuh)."""
    _check(a, "A", (None, None))
    rows, k = a.shape
    width = _digits_width(k, group, "A: k")
    o = _out(out, "out", (rows, width, DIGITS_GROUP_BYTES), torch.uint8, a.device)
    call("mb_token_digits", a.data_ptr(), _dtype_code(a, "A"), rows, k, group, o.data_ptr(),
         _stream(stream, a.device))
    return o


def _fp8_scaling(static_scale: torch.Tensor | None, row_scale: bool, cols: int, name: str, dev: torch.device
                 ) -> tuple[int | None, int]:
    """The digits writers' FP8 arguments (fp8_static_scale's pointer, fp8_row_scale): W4AFP8's static input scale, or
    each row's own (row_scale: none static, rows of at most ROW_SCALE_DIGITS_MAX_COLS), or neither (W4A16)."""
    if row_scale and static_scale is not None:
        raise ValueError("fp8_row_scale: takes no fp8_static_scale (a row's scale is its own)")
    if row_scale and cols > ROW_SCALE_DIGITS_MAX_COLS:
        raise ValueError(f"fp8_row_scale: {name} must be at most {ROW_SCALE_DIGITS_MAX_COLS}, got {cols}")
    return _fp8_static(static_scale, dev), int(row_scale)


def expand_rows_digits(input: torch.Tensor, unpermuted_to_permuted: torch.Tensor, topk_weights: torch.Tensor,
                       prequant_scale: torch.Tensor | None = None, permuted_digits: torch.Tensor | None = None,
                       permuted_weights: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                       group: int = 128, stream: int | torch.cuda.Stream | None = None, *,
                       fp8_static_scale: torch.Tensor | None = None, fp8_row_scale: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """expand_rows writing the permuted rows as token digits for GEMM1's weight `group` (token_digits'): input
    [T, H] -> (permuted_digits uint8 [T*K, ceil(H / 128), 400], permuted_weights [T*K]), the bytes of expand_rows then
    token_digits (stages/expand_rows.cu); prequant_scale and zero_out as expand_rows'. fp8_static_scale (W4AFP8's, a
    one-element fp32 tensor) or fp8_row_scale (W4AFP8's per-row scales, H at most 16384): the digits of the rows
    expand_rows_fp8_dequantized writes with that scale instead."""
    _check(input, "input", (None, None))
    dev = input.device
    t, h = input.shape
    width = _digits_width(h, group, "input: hidden")
    k = _expansion_maps(t, topk_weights, unpermuted_to_permuted, dev)
    pre = _prequant(prequant_scale, h, dev)
    fp8, row_scale = _fp8_scaling(fp8_static_scale, fp8_row_scale, h, "input: hidden", dev)
    pd = _out(permuted_digits, "permuted_digits", (t * k, width, DIGITS_GROUP_BYTES), torch.uint8, dev)
    pw = _out(permuted_weights, "permuted_weights", (t * k,), torch.float32, dev)
    if zero_out is not None:
        _check(zero_out, "zero_out", (t, h), input.dtype, dev)
    call("mb_expand_rows_digits", input.data_ptr(), _dtype_code(input, "input"), unpermuted_to_permuted.data_ptr(),
         topk_weights.data_ptr(), pre, fp8, row_scale, t, h, k, group, pd.data_ptr(), pw.data_ptr(), _ptr(zero_out),
         _stream(stream, dev))
    return pd, pw


def fc1_activation_digits(input: torch.Tensor, expert_first_token_offset: torch.Tensor,
                          activation: int | str | Activation, bias: torch.Tensor | None = None,
                          swiglu_alpha: float = 1.0, swiglu_limit: float = math.inf,
                          prequant_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                          group: int = 128, stream: int | torch.cuda.Stream | None = None, *,
                          fp8_static_scale: torch.Tensor | None = None, fp8_row_scale: bool = False,
                          gate_up_interleaved: bool = False) -> torch.Tensor:
    """fc1_activation writing GEMM2's input as token digits for GEMM2's weight `group` (token_digits'): input
    [R, N1] -> out uint8 [R, ceil(I / 128), 400], the bytes of fc1_activation then token_digits for the rows below
    offsets[E] (stages/fc1_activation.cu). fp8_static_scale or fp8_row_scale (W4AFP8's, I at most 16384 for the
    latter): the digits of the rows fc1_activation_fp8_dequantized writes with that scale instead.
    gate_up_interleaved as fc1_activation's."""
    act, dev, rows, inter = _activation_args(input, expert_first_token_offset, activation, bias, gate_up_interleaved)
    width = _digits_width(inter, group, "input: the activation's width")
    e = expert_first_token_offset.shape[0] - 1
    pre = _prequant(prequant_scale, inter, dev)
    fp8, row_scale = _fp8_scaling(fp8_static_scale, fp8_row_scale, inter, "input: the activation's width", dev)
    o = _out(out, "out", (rows, width, DIGITS_GROUP_BYTES), torch.uint8, dev)
    call("mb_fc1_activation_digits", input.data_ptr(), _dtype_code(input, "input"), _ptr(bias),
         expert_first_token_offset.data_ptr(), e, rows, inter, int(act), int(gate_up_interleaved), swiglu_alpha,
         swiglu_limit, pre, fp8, row_scale, group, o.data_ptr(), _stream(stream, dev))
    return o


def _a_input(a: torch.Tensor, out_dtype: torch.dtype | None, k_b: int | None
             ) -> tuple[WoqInput, int, int, torch.dtype]:
    """A's form (16-bit rows, or token_digits' uint8 [R, ceil(k / 128), 400], k then B's: `k_b`) -> (form, rows, k,
    output dtype)."""
    if a.dtype == torch.uint8 and a.dim() == 3:
        _check(a, "A", (None, None if k_b is None else -(-k_b // 128), DIGITS_GROUP_BYTES), torch.uint8)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"out_dtype: {out_dtype} is not bfloat16 or float16 (digits A needs the output dtype)")
        return WoqInput.DIGITS, a.shape[0], a.shape[1] * 128 if k_b is None else k_b, out_dtype
    _check(a, "A", (None, None))
    return WoqInput.DTYPE, a.shape[0], a.shape[1], a.dtype


def _stored_kind(kind: int | str | WoqKind) -> WoqKind:
    """A stored weight-only kind (the decode, mma and dequantize kernels' B); e5m2 is the wgmma kernel's alone."""
    mode = WoqKind(_enum(kind, WoqKind, "kind"))
    if mode is WoqKind.E5M2:
        raise ValueError("kind: e5m2 weights run on the wgmma weight-only kernel only (grouped_gemm_woq_sm90)")
    return mode


def _check_tiles(mode: WoqKind, n: int) -> None:
    """int4 codes in 16-row tiles need whole tiles (weights/woq.py's int4_tiles)."""
    if mode is WoqKind.INT4_TILES and n % TILE_ROWS:
        raise ValueError(f"B: int4_tiles hold {TILE_ROWS} rows a tile; n {n} is not a multiple of it")


def _woq_gemm_args(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                   expert_first_token_offset: torch.Tensor, group: int, zeros: torch.Tensor | None,
                   bias: torch.Tensor | None, out_dtype: torch.dtype | None
                   ) -> tuple[torch.device, int, int, int, int, WoqKind, torch.dtype, WoqInput]:
    """grouped_gemm_woq's operand checks (shared with its finalize form) -> (device, rows, k, experts, n, kind,
    output dtype, A's form)."""
    mode = _stored_kind(kind)
    packed = mode is not WoqKind.INT8
    k_b = b.shape[-1] * (2 if packed else 1) if b.dim() == 3 else None  # B's k (a B of another rank fails below)
    form, rows, k, out_dtype = _a_input(a, out_dtype, k_b)
    if mode is WoqKind.MXFP4 and form is WoqInput.DIGITS:
        raise ValueError("kind: MXFP4 on the token digits takes its quarters form (mxfp4_quarters: "
                         "moe_build/weights/woq.py's mxfp4_quarters)")
    if mode is WoqKind.MXFP4_QUARTERS and form is not WoqInput.DIGITS:
        raise ValueError("A: mxfp4_quarters weights are the digits tile's form: A must be token digits "
                         "(uint8 [R, ceil(k / 128), 400])")
    dev = a.device
    _check(b, "B", (None, None, k // 2 if packed else k), torch.uint8 if packed else torch.int8, dev)
    e, n = b.shape[0], b.shape[1]
    _check_tiles(mode, n)
    _check(expert_first_token_offset, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    _check_woq_scales(mode, scales, zeros, group, e, n, k, dev)
    if bias is not None:
        _check(bias, "bias", (e, n), out_dtype, dev)
    return dev, rows, k, e, n, mode, out_dtype, form


def grouped_gemm_woq(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                     expert_first_token_offset: torch.Tensor, group: int, zeros: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, c: torch.Tensor | None = None,
                     stream: int | torch.cuda.Stream | None = None, *, tactic: GemmTactic | str,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """C[p] = A[p] @ dequant(B[x])^T (+ bias[x]): A [R, k] bf16/fp16, B in moe_build/weights/woq.py's packed form
    of `kind` ([E, n, k/2] uint8 for int4 / mxfp4, [E, n, k] int8), scales fp32 [E, n, k/group] ([E, n, 1] for
    group 0; uint8 e8m0 [E, n, k/32] for mxfp4), int4 zeros uint8 like the scales or None -> C [R, n]. `tactic`:
    the decode kernel (decode:ksplitN, or decode:staged_ksplitN for the int4 forms with one scale per row or per 128
    k: the token rows staged in shared memory; decode:digits_ksplitN on token digits, below) for a few rows per
    expert, the mma tiles (mma:64x128, mma:128x128) for many.
    Token digits: A uint8 [R, ceil(k / 128), 400] (token_digits for this GEMM's `group`; k is B's) with the decode
    kernel's digits tile (decode:digits_ksplitN), int4 weights with one scale per row or per 128 k (k % 128 == 0) or
    per 64 k (k % 64 == 0), MXFP4 in its quarters form (kind mxfp4_quarters, moe_build/weights/woq.py's
    mxfp4_quarters: B's k the layer's padded to whole 128-k groups, A's groups as many), or int8 with one scale per
    row (k % 64 == 0) or per 128 k (k % 128 == 0), the last two on the digits of group 32's order, C in `out_dtype`
    (required)."""
    dev, rows, k, e, n, mode, out_dtype, form = _woq_gemm_args(a, b, kind, scales, expert_first_token_offset, group,
                                                               zeros, bias, out_dtype)
    out = _out(c, "C", (rows, n), out_dtype, dev)
    call("mb_grouped_gemm_woq", a.data_ptr(), int(form), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros),
         group, _ptr(bias), out.data_ptr(), expert_first_token_offset.data_ptr(), e, rows, n, k, _dtype_code(out, "C"),
         tactic_struct(tactic), _stream(stream, dev))
    return out


def grouped_gemm_woq_finalize(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                              expert_first_token_offset: torch.Tensor, group: int,
                              permuted_to_unpermuted: torch.Tensor, permuted_weights: torch.Tensor, num_tokens: int,
                              top_k: int, zeros: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                              out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None, *,
                              tactic: GemmTactic | str, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """out[t] += w[p] * (grouped_gemm_woq's C[p] + bias[x]) for the token t of each permuted row p -> out [T, n], on
    the decode kernel only (a decode tactic). A given `out` must be zeroed by the caller; an allocated one is zeroed
    here."""
    dev, rows, k, e, n, mode, out_dtype, form = _woq_gemm_args(a, b, kind, scales, expert_first_token_offset, group,
                                                               zeros, bias, out_dtype)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    o = _out(out, "out", (num_tokens, n), out_dtype, dev, zero=True)
    call("mb_grouped_gemm_woq_finalize", a.data_ptr(), int(form), b.data_ptr(), int(mode), scales.data_ptr(),
         _ptr(zeros), group, _ptr(bias), o.data_ptr(), expert_first_token_offset.data_ptr(),
         permuted_to_unpermuted.data_ptr(), permuted_weights.data_ptr(), e, rows, num_tokens, top_k, n, k,
         _dtype_code(o, "out"), tactic_struct(tactic), _stream(stream, dev))
    return o


def grouped_gemm_woq_sm90_workspace_bytes(num_experts: int) -> int:
    return int(load_library().mb_grouped_gemm_woq_sm90_workspace(num_experts))


def _woq_sm90_args(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                   zeros: torch.Tensor | None, offsets: torch.Tensor, group: int
                   ) -> tuple[torch.device, int, int, int, int, WoqKind]:
    """The checks both mixed-input wgmma wrappers make: (device, rows, k, experts, n, kind)."""
    _check(a, "A", (None, None))
    dev, rows, k = a.device, a.shape[0], a.shape[1]
    mode = WoqKind(_enum(kind, WoqKind, "kind"))
    if mode in (WoqKind.MXFP4, WoqKind.MXFP4_QUARTERS):
        raise ValueError(f"kind: {mode.name.lower()} has no wgmma weight-only kernel (int4, int8, or e5m2: "
                         "moe_build/weights/woq.py's mxfp4_as_e5m2)")
    if mode is WoqKind.E5M2 and a.dtype != torch.bfloat16:
        raise ValueError(f"A: e5m2 weights take bf16 activations, got {a.dtype}")
    packed = mode is WoqKind.INT4
    data_dtype = {WoqKind.INT4: torch.uint8, WoqKind.INT8: torch.int8, WoqKind.E5M2: torch.float8_e5m2}[mode]
    _check(b, "B", (None, None, k // 2 if packed else k), data_dtype, dev)
    e, n = b.shape[0], b.shape[1]
    _check(offsets, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    groups = k // group if group > 0 else 1
    _check(scales, "scales", (e, groups, n), a.dtype, dev)
    if zeros is not None:
        _check(zeros, "zeros", (e, groups, n), a.dtype, dev)
    return dev, rows, k, e, n, mode


def grouped_gemm_woq_sm90(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                          zeros: torch.Tensor | None, expert_first_token_offset: torch.Tensor, group: int,
                          c: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                          stream: int | torch.cuda.Stream | None = None, *, tactic: GemmTactic | str) -> torch.Tensor:
    """grouped_gemm_woq's C = A @ dequant(B[x])^T on wgmma (compute capability 9.0; a wgmma tactic on a woq tile,
    tactics.tactic.WOQ_WGMMA_TILES): the weights converted in registers by CUTLASS's mixed-input mainloop. A [R, k]
    bf16/fp16, B int4 ([E, n, k/2] uint8), int8 ([E, n, k]) or e5m2 ([E, n, k] float8_e5m2, A bf16: MXFP4 re-encoded);
    scales in A's dtype, MN-major [E, groups, n]; int4 zeros the same, holding (8 - z) * s (moe_build/weights/woq.py's
    wgmma_operand writes them) -> C [R, n]."""
    dev, rows, k, e, n, mode = _woq_sm90_args(a, b, kind, scales, zeros, expert_first_token_offset, group)
    out = _out(c, "C", (rows, n), a.dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_woq_sm90_workspace_bytes(e), dev)
    call("mb_grouped_gemm_woq_sm90", a.data_ptr(), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros), group,
         out.data_ptr(), expert_first_token_offset.data_ptr(), e, rows, n, k, _dtype_code(out, "C"),
         tactic_struct(tactic), ws, ws_bytes, _stream(stream, dev))
    return out


def grouped_gemm_woq_sm90_gated(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                                zeros: torch.Tensor | None, expert_first_token_offset: torch.Tensor, group: int,
                                activation: int | str | Activation, bias: torch.Tensor | None = None,
                                prequant_scale: torch.Tensor | None = None, swiglu_alpha: float = 1.0,
                                swiglu_limit: float = math.inf, out: torch.Tensor | None = None,
                                workspace: torch.Tensor | None = None,
                                stream: int | torch.cuda.Stream | None = None, *,
                                tactic: GemmTactic | str, fp8_scale: torch.Tensor | None = None) -> torch.Tensor:
    """GEMM1 on grouped_gemm_woq_sm90's kernel with the gated activation in its epilogue: out [R, I] = act(gate + bg,
    up + bu) (* prequant_scale) for W1 (b, scales, zeros) and bias [E, 2I] in interleave_gate_up's order (I a multiple
    of 8), each feature's gate and up products never stored. prequant_scale fp32 [I] (AWQ's FC2 pre-quant scale) or
    None. fp8_scale (W4AFP8's static GEMM2 input scale, a one-element fp32 tensor; int4 weights): each value stored as
    fc1_activation_fp8_dequantized stores it (the activation rounded to out's type, times prequant_scale, quantized to
    e4m3 by fp8_scale, dequantized). The rest as grouped_gemm_woq_sm90's."""
    act = Activation(_enum(activation, Activation, "activation"))
    if not act.is_gated:
        raise ValueError(f"activation: the gated epilogue takes a gated activation, got {act.name.lower()}")
    dev, rows, k, e, n, mode = _woq_sm90_args(a, b, kind, scales, zeros, expert_first_token_offset, group)
    if n % 16:
        raise ValueError(f"B: W1's rows (2I) must be a multiple of 16 (blocks of 8 features), got {n}")
    if bias is not None:
        _check(bias, "bias", (e, n), a.dtype, dev)
    pre = _prequant(prequant_scale, n // 2, dev)
    fp8 = _fp8_static(fp8_scale, dev)
    o = _out(out, "out", (rows, n // 2), a.dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_woq_sm90_workspace_bytes(e), dev)
    call("mb_grouped_gemm_woq_sm90_gated", a.data_ptr(), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros),
         group, _ptr(bias), pre, fp8, int(act), swiglu_alpha, swiglu_limit, o.data_ptr(),
         expert_first_token_offset.data_ptr(), e, rows, n // 2, k, _dtype_code(o, "out"), tactic_struct(tactic), ws,
         ws_bytes, _stream(stream, dev))
    return o


def grouped_gemm_woq_sm90_finalize(a: torch.Tensor, b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor,
                                   zeros: torch.Tensor | None, expert_first_token_offset: torch.Tensor, group: int,
                                   permuted_to_unpermuted: torch.Tensor, permuted_weights: torch.Tensor,
                                   num_tokens: int, top_k: int, bias: torch.Tensor | None = None,
                                   out: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                                   stream: int | torch.cuda.Stream | None = None, *,
                                   tactic: GemmTactic | str) -> torch.Tensor:
    """GEMM2 on grouped_gemm_woq_sm90's kernel with the finalize in its epilogue: out[t] += w[p] * (C[p] + bias[x]) for
    the token t of each permuted row p -> out [T, n] in A's dtype, the [R, n] product never stored. A given `out` must
    be zeroed by the caller; an allocated one is zeroed here. bias [E, n] or None; the rest as
    grouped_gemm_woq_sm90's."""
    dev, rows, k, e, n, mode = _woq_sm90_args(a, b, kind, scales, zeros, expert_first_token_offset, group)
    if bias is not None:
        _check(bias, "bias", (e, n), a.dtype, dev)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    o = _out(out, "out", (num_tokens, n), a.dtype, dev, zero=True)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_woq_sm90_workspace_bytes(e), dev)
    call("mb_grouped_gemm_woq_sm90_finalize", a.data_ptr(), b.data_ptr(), int(mode), scales.data_ptr(), _ptr(zeros),
         group, _ptr(bias), o.data_ptr(), expert_first_token_offset.data_ptr(), permuted_to_unpermuted.data_ptr(),
         permuted_weights.data_ptr(), e, rows, num_tokens, top_k, n, k, _dtype_code(o, "out"), tactic_struct(tactic),
         ws, ws_bytes, _stream(stream, dev))
    return o


def woq_dequantize(b: torch.Tensor, kind: int | str | WoqKind, scales: torch.Tensor, group: int,
                   zeros: torch.Tensor | None = None, out: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                   stream: int | torch.cuda.Stream | None = None) -> torch.Tensor:
    """grouped_gemm_woq's stored weights B (with its scales, zeros and group) dequantized -> [E, n, k] row-major in
    `dtype` (bf16 or fp16; out's where given), each weight computed in fp32 and rounded once: the weights a
    weight-only GEMM's wgmma tactic hands the 16-bit wgmma GEMM."""
    mode = _stored_kind(kind)
    if mode is WoqKind.MXFP4_QUARTERS:
        raise ValueError("kind: mxfp4_quarters weights run on the digits tile only (grouped_gemm_woq on token digits)")
    packed = mode is not WoqKind.INT8
    _check(b, "B", (None, None, None), torch.uint8 if packed else torch.int8)
    dev = b.device
    e, n = b.shape[0], b.shape[1]
    _check_tiles(mode, n)
    k = b.shape[2] * (2 if packed else 1)
    _check_woq_scales(mode, scales, zeros, group, e, n, k, dev)
    o = _out(out, "out", (e, n, k), dtype or (out.dtype if out is not None else torch.bfloat16), dev)
    call("mb_woq_dequantize", int(mode), b.data_ptr(), scales.data_ptr(), _ptr(zeros), group, e, n, k,
         _dtype_code(o, "out"), o.data_ptr(), _stream(stream, dev))
    return o
