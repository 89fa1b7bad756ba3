"""Torch wrappers of the FP8 kernels: activation quantization (alone, in the row expansion, in the gated activation)
and the FP8 grouped GEMM (cpp/src/gemm/fp8_abi.cu)."""
from __future__ import annotations

import math

import torch

from ...planner.tactics import GemmTactic
from ...weights.halves import SCALE_ROWS
from ..abi import Activation, DType, Fp8Accumulation, Fp8Scaling, GemmKernel, StepTactic
from ..library import call, load_library
from .args import _check, _dtype_code, _enum, _out, _ptr, _stream, _workspace
from .gemm import tactic_struct
from .stages import _activation_args, _expansion_maps, _prequant

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


def _fp8_static(scale: torch.Tensor | None, dev: torch.device) -> int:
    """A static input scale's pointer (a one-element fp32 tensor on the device, checked as the FP8 kernels take it),
    or NULL (each row's own scale)."""
    _fp8_group(scale, None, dev)
    return _ptr(scale)


def _step_tactic(tactic: str | StepTactic) -> int:
    """The C `tactic` argument of an FP8 row step: a StepTactic, or its name as the plan spells it (block_rows,
    warp_rows, staged_rows, group_items)."""
    return _enum(tactic, StepTactic, "tactic")


def _fp8_scale_shape(rows: int, cols: int, group: int) -> tuple[int, ...]:
    return (rows,) if group == 0 else (rows, -(-cols // 128))


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


def expand_rows_fp8(input: torch.Tensor, unpermuted_to_permuted: torch.Tensor, topk_weights: torch.Tensor,
                    static_scale: torch.Tensor | None = None, group: int | None = None,
                    permuted_input: torch.Tensor | None = None, permuted_scales: torch.Tensor | None = None,
                    permuted_weights: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                    stream: int | torch.cuda.Stream | None = None, *, prequant_scale: torch.Tensor | None = None,
                    tactic: str | StepTactic = "block_rows") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """expand_rows with the rows quantized as quantize_fp8 quantizes them: input [T, H] fp16/bf16 ->
    (permuted_input [T*K, H] float8_e4m3fn, permuted_scales [T*K] or [T*K, ceil(H / 128)], permuted_weights
    [T*K]). `zero_out` as expand_rows'; `prequant_scale` [H] as quantize_fp8's (expand_rows=prequant_fused);
    `tactic` the kernel, block_rows or warp_rows (the plan's expand_rows_tactic)."""
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
          _ptr(zero_out), _step_tactic(tactic), _stream(stream, dev))
    return pin, ps, pw


def expand_rows_fp8_dequantized(input: torch.Tensor, unpermuted_to_permuted: torch.Tensor, topk_weights: torch.Tensor,
                                static_scale: torch.Tensor | None, permuted_input: torch.Tensor | None = None,
                                permuted_weights: torch.Tensor | None = None, zero_out: torch.Tensor | None = None,
                                stream: int | torch.cuda.Stream | None = None, *,
                                prequant_scale: torch.Tensor | None = None,
                                tactic: str | StepTactic = "block_rows") -> tuple[torch.Tensor, torch.Tensor]:
    """expand_rows_fp8's rows by a static scale (None: each row's dynamic scale), each stored dequantized in input's
    16-bit type (its e4m3 value times the scale in fp32, rounded to the type): input [T, H] -> (permuted_input
    [T*K, H], permuted_weights [T*K]). GEMM1's rows for W4AFP8, whose GEMMs are W4A16's on 16-bit rows. `tactic` as
    expand_rows_fp8's (a static scale: block_rows, the 16-bit expansion's kernel)."""
    _check(input, "input", (None, None))
    dev = input.device
    t, h = input.shape
    k = _expansion_maps(t, topk_weights, unpermuted_to_permuted, dev)
    scale = _fp8_static(static_scale, dev)
    pre = _prequant(prequant_scale, h, dev)
    pin = _out(permuted_input, "permuted_input", (t * k, h), input.dtype, dev)
    pw = _out(permuted_weights, "permuted_weights", (t * k,), torch.float32, dev)
    if zero_out is not None:
        _check(zero_out, "zero_out", (t, h), input.dtype, dev)
    call("mb_expand_rows_fp8_dequantized", input.data_ptr(), _dtype_code(input, "input"),
          unpermuted_to_permuted.data_ptr(), topk_weights.data_ptr(), pre, t, h, k, scale,
          pin.data_ptr(), pw.data_ptr(), _ptr(zero_out), _step_tactic(tactic), _stream(stream, dev))
    return pin, pw


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
                       stream: int | torch.cuda.Stream | None = None, *, prequant_scale: torch.Tensor | None = None,
                       tactic: str | StepTactic = "block_rows") -> tuple[torch.Tensor, torch.Tensor]:
    """fc1_activation's rows quantized as quantize_fp8 quantizes them (GEMM2's FP8 input in one pass):
    input [R, N1] fp16/bf16 -> (out [R, I] float8_e4m3fn, out_scales [R] or [R, ceil(I / 128)]);
    rows >= offsets[E] and their scales untouched. `prequant_scale` [I] as quantize_fp8's, on the activated rows
    (fc2_prequant=fused). `tactic` the kernel: block_rows, warp_rows, staged_rows or group_items (the plan's
    fc1_activation_tactic, or fc2_input_quant_tactic for the identity's quantize step)."""
    act, dev, rows, inter = _activation_args(input, expert_first_token_offset, activation, bias)
    e = expert_first_token_offset.shape[0] - 1
    g = _fp8_group(static_scale, group, dev)
    pre = _prequant(prequant_scale, inter, dev)
    q = _out(out, "out", (rows, inter), torch.float8_e4m3fn, dev)
    s = _out(out_scales, "out_scales", _fp8_scale_shape(rows, inter, g), torch.float32, dev)
    call("mb_fc1_activation_fp8", input.data_ptr(), _dtype_code(input, "input"), _ptr(bias),
          expert_first_token_offset.data_ptr(), e, rows, inter, int(act), swiglu_alpha, swiglu_limit,
          pre, _ptr(static_scale), g, q.data_ptr(), s.data_ptr(), _step_tactic(tactic), _stream(stream, dev))
    return q, s


# ---- the FP8 grouped GEMM ---------------------------------------------------------------------

def grouped_gemm_fp8_workspace_bytes(num_experts: int, max_rows: int, n: int, k: int) -> int:
    return int(load_library().mb_grouped_gemm_fp8_workspace(num_experts, max_rows, n, k))


def fp8_scale_shapes(scaling: Fp8Scaling, rows: int, experts: int, n: int, k: int, gate_up_halves: bool = False
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of scale_a and scale_b for `scaling` (cpp/include/moe_build_kernels.h, mb_grouped_gemm_fp8);
    gate_up_halves: the block-128 gated GEMM1 on the wgmma kernel, its W1 scales by 8 rows in the gate/up halves'
    order (mb_grouped_gemm_fp8_gated, moe_build.weights.fp8.gate_up_halves_scales)."""
    if scaling is Fp8Scaling.ROWWISE:
        return (rows,), (experts, n)
    kb = -(-k // 128)
    return (rows, kb), (experts, n // SCALE_ROWS if gate_up_halves else -(-n // 128), kb)


def _fp8_gemm_args(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                   expert_first_token_offset: torch.Tensor, scaling: int | str | Fp8Scaling, out_dtype: torch.dtype,
                   bias: torch.Tensor | None, gate_up_halves: bool = False
                   ) -> tuple[torch.device, int, int, int, int, Fp8Scaling]:
    """What the FP8 GEMM wrappers check: (device, rows, k, experts, n, scaling)."""
    _check(a, "A", (None, None), torch.float8_e4m3fn)
    dev, rows, k = a.device, a.shape[0], a.shape[1]
    _check(b, "B", (None, None, k), torch.float8_e4m3fn, dev)
    e, n = b.shape[0], b.shape[1]
    _check(expert_first_token_offset, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    mode = Fp8Scaling(_enum(scaling, Fp8Scaling, "scaling"))
    shape_a, shape_b = fp8_scale_shapes(mode, rows, e, n, k, gate_up_halves and mode is Fp8Scaling.BLOCK128)
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
                     stream: int | torch.cuda.Stream | None = None,
                     accumulation: int | str | Fp8Accumulation = Fp8Accumulation.PROMOTED, *,
                     tactic: GemmTactic | str) -> torch.Tensor:
    """C[p] = scaled A[p] @ B[x]^T (+ bias[x]); A [R, k] and B [E, n, k] float8_e4m3fn, scales fp32 as
    `scaling` says (fp8_scale_shapes) -> C [R, n] in out_dtype (bf16 or fp16), run as `tactic`, the wgmma kernel
    accumulating as `accumulation` says (fast: rowwise scales only)."""
    dev, rows, k, e, n, mode = _fp8_gemm_args(a, scale_a, b, scale_b, expert_first_token_offset, scaling, out_dtype,
                                              bias)
    out = _out(c, "C", (rows, n), out_dtype, dev)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_fp8_workspace_bytes(e, rows, n, k), dev)
    call("mb_grouped_gemm_fp8", a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), int(mode),
         _enum(accumulation, Fp8Accumulation, "accumulation"), _ptr(bias), out.data_ptr(), expert_first_token_offset.data_ptr(), e, rows, n, k,
         int(DType.BF16 if out_dtype == torch.bfloat16 else DType.FP16), tactic_struct(tactic), ws, ws_bytes,
         _stream(stream, dev))
    return out


def grouped_gemm_fp8_finalize(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                              expert_first_token_offset: torch.Tensor, permuted_to_unpermuted: torch.Tensor,
                              permuted_weights: torch.Tensor, num_tokens: int, top_k: int,
                              scaling: int | str | Fp8Scaling, out_dtype: torch.dtype = torch.bfloat16,
                              bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
                              workspace: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
                              accumulation: int | str | Fp8Accumulation = Fp8Accumulation.PROMOTED, *,
                              tactic: GemmTactic | str) -> torch.Tensor:
    """out[t] += w[p] * (scaled A[p] @ B[x]^T + bias[x]) for the token t of each permuted row p -> out [T, n]
    (grouped_gemm_sm90_finalize's epilogue on grouped_gemm_fp8's product, accumulated as grouped_gemm_fp8's). A
    given `out` must be zeroed by the caller; an allocated one is zeroed here."""
    dev, rows, k, e, n, mode = _fp8_gemm_args(a, scale_a, b, scale_b, expert_first_token_offset, scaling, out_dtype,
                                              bias)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    o = _out(out, "out", (num_tokens, n), out_dtype, dev, zero=True)
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_fp8_workspace_bytes(e, rows, n, k), dev)
    call("mb_grouped_gemm_fp8_finalize", a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(),
         int(mode), _enum(accumulation, Fp8Accumulation, "accumulation"), _ptr(bias), o.data_ptr(), expert_first_token_offset.data_ptr(), permuted_to_unpermuted.data_ptr(),
         permuted_weights.data_ptr(), e, rows, num_tokens, top_k, n, k,
         int(DType.BF16 if out_dtype == torch.bfloat16 else DType.FP16), tactic_struct(tactic), ws, ws_bytes,
         _stream(stream, dev))
    return o


def grouped_gemm_fp8_quantizing_finalize(a16: torch.Tensor, static_scale: torch.Tensor | None, b: torch.Tensor,
                                         scale_b: torch.Tensor, expert_first_token_offset: torch.Tensor,
                                         permuted_to_unpermuted: torch.Tensor, permuted_weights: torch.Tensor,
                                         num_tokens: int, top_k: int, bias: torch.Tensor | None = None,
                                         out: torch.Tensor | None = None, stream: int | torch.cuda.Stream | None = None,
                                         accumulation: int | str | Fp8Accumulation = Fp8Accumulation.PROMOTED,
                                         scaling: int | str | Fp8Scaling = Fp8Scaling.ROWWISE, *,
                                         tactic: GemmTactic | str) -> torch.Tensor:
    """grouped_gemm_fp8_finalize on the rows quantize_fp8(a16, static_scale, group) would write, which the kernel
    quantizes itself as it loads them (fc2_input_quant=gemm2): A16 [R, k] bf16/fp16 (the output dtype); rowwise
    scales: static_scale a float32 [1] or None (each row's own scale); block128 (static_scale None): each 128-column
    group's own, as quantize_fp8 with group 128 writes them. The decode tactic kernel only, k <=
    MB_FP8_QUANTIZING_MAX_K. A given `out` must be zeroed by the caller; an allocated one is zeroed here."""
    if a16.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"A16: {a16.dtype} is not bfloat16 or float16")
    _check(a16, "A16", (None, None), a16.dtype)
    dev, rows, k = a16.device, a16.shape[0], a16.shape[1]
    _check(b, "B", (None, None, k), torch.float8_e4m3fn, dev)
    e, n = b.shape[0], b.shape[1]
    _check(expert_first_token_offset, "expert_first_token_offset", (e + 1,), torch.int64, dev)
    mode = Fp8Scaling(_enum(scaling, Fp8Scaling, "scaling"))
    _check(scale_b, "scale_b", fp8_scale_shapes(mode, rows, e, n, k)[1], torch.float32, dev)
    if mode is Fp8Scaling.BLOCK128 and static_scale is not None:
        raise ValueError("static_scale: block128 rows take their 128-column groups' own scales")
    _fp8_group(static_scale, None, dev)  # a one-element fp32 scale, or None
    if bias is not None:
        _check(bias, "bias", (e, n), a16.dtype, dev)
    _check(permuted_to_unpermuted, "permuted_to_unpermuted", (num_tokens * top_k,), torch.int32, dev)
    _check(permuted_weights, "permuted_weights", (num_tokens * top_k,), torch.float32, dev)
    o = _out(out, "out", (num_tokens, n), a16.dtype, dev, zero=True)
    call("mb_grouped_gemm_fp8_quantizing_finalize", a16.data_ptr(), _ptr(static_scale), b.data_ptr(),
         scale_b.data_ptr(), int(mode), _enum(accumulation, Fp8Accumulation, "accumulation"), _ptr(bias), o.data_ptr(),
         expert_first_token_offset.data_ptr(), permuted_to_unpermuted.data_ptr(), permuted_weights.data_ptr(), e, rows,
         num_tokens, top_k, n, k, int(DType.BF16 if a16.dtype == torch.bfloat16 else DType.FP16),
         tactic_struct(tactic), _stream(stream, dev))
    return o


def grouped_gemm_fp8_gated(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                           expert_first_token_offset: torch.Tensor, scaling: int | str | Fp8Scaling,
                           activation: int | str | Activation, out_dtype: torch.dtype = torch.bfloat16,
                           bias: torch.Tensor | None = None, swiglu_alpha: float = 1.0, swiglu_limit: float = math.inf,
                           c: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                           stream: int | torch.cuda.Stream | None = None,
                           accumulation: int | str | Fp8Accumulation = Fp8Accumulation.PROMOTED, *,
                           tactic: GemmTactic | str) -> torch.Tensor:
    """C[p] = act(gate, up) of grouped_gemm_fp8's scaled product (+ bias[x]), the gated activation in GEMM1's
    epilogue -> C [R, I] in out_dtype. Rowwise scales: B [E, 2I, k], scale_b [E, 2I] and bias [E, 2I] in
    moe_build.weights.interleave_gate_up's order; block128 scales: B and bias stacked as the checkpoint stores them
    (gate rows, then up rows), scale_b its block scales on the decode tactic kernel, or on the wgmma kernel (I a
    multiple of 64) those scales in the gate/up halves' order (moe_build.weights.fp8.gate_up_halves_scales)."""
    return _gated(a, scale_a, b, scale_b, expert_first_token_offset, scaling, activation, out_dtype, bias, swiglu_alpha,
                  swiglu_limit, c, None, None, workspace, stream, accumulation, tactic)[0]


def grouped_gemm_fp8_gated_quantized(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
                                     expert_first_token_offset: torch.Tensor, activation: int | str | Activation,
                                     static_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                                     bias: torch.Tensor | None = None, swiglu_alpha: float = 1.0,
                                     swiglu_limit: float = math.inf, out: torch.Tensor | None = None,
                                     out_scales: torch.Tensor | None = None, workspace: torch.Tensor | None = None,
                                     stream: int | torch.cuda.Stream | None = None,
                                     accumulation: int | str | Fp8Accumulation = Fp8Accumulation.PROMOTED, *,
                                     tactic: GemmTactic | str) -> tuple[torch.Tensor, torch.Tensor]:
    """grouped_gemm_fp8_gated (rowwise scales) with GEMM2's FP8 input written by its epilogue (the plan's
    fc2_input_quant=gemm1): -> (q [R, I] float8_e4m3fn, scales fp32 [R]), exactly quantize_fp8(C, static_scale) of
    the C [R, I] in out_dtype that grouped_gemm_fp8_gated writes. static_scale: a float32 [1] (the checkpoint's
    static GEMM2 input scale)."""
    if static_scale is None:
        raise ValueError("static_scale: the quantized gated GEMM needs the static GEMM2 input scale")
    _fp8_group(static_scale, None, a.device)
    return _gated(a, scale_a, b, scale_b, expert_first_token_offset, Fp8Scaling.ROWWISE, activation, out_dtype, bias,
                  swiglu_alpha, swiglu_limit, out, static_scale, out_scales, workspace, stream, accumulation, tactic)


def _gated(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor,
           expert_first_token_offset: torch.Tensor, scaling: int | str | Fp8Scaling, activation: int | str | Activation,
           out_dtype: torch.dtype, bias: torch.Tensor | None, swiglu_alpha: float, swiglu_limit: float,
           c: torch.Tensor | None, static_scale: torch.Tensor | None, c_scales: torch.Tensor | None,
           workspace: torch.Tensor | None, stream: int | torch.cuda.Stream | None,
           accumulation: int | str | Fp8Accumulation, tactic: GemmTactic | str
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """mb_grouped_gemm_fp8_gated: C in out_dtype, or (static_scale given) e4m3 with its row scales."""
    halves = tactic_struct(tactic).kernel == GemmKernel.WGMMA  # block128 scale_b in the gate/up halves' order
    dev, rows, k, e, n2, mode = _fp8_gemm_args(a, scale_a, b, scale_b, expert_first_token_offset, scaling, out_dtype,
                                               bias, halves)
    act = _enum(activation, Activation, "activation")
    quantized = static_scale is not None
    out = _out(c, "C", (rows, n2 // 2), torch.float8_e4m3fn if quantized else out_dtype, dev)
    scales = _out(c_scales, "out_scales", (rows,), torch.float32, dev) if quantized else None
    ws, ws_bytes = _workspace(workspace, lambda: grouped_gemm_fp8_workspace_bytes(e, rows, n2, k), dev)
    call("mb_grouped_gemm_fp8_gated", a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), int(mode),
         _enum(accumulation, Fp8Accumulation, "accumulation"), _ptr(bias), out.data_ptr(), _ptr(static_scale),
         _ptr(scales), expert_first_token_offset.data_ptr(), e, rows, n2 // 2, k,
         int(DType.BF16 if out_dtype == torch.bfloat16 else DType.FP16), act, swiglu_alpha, swiglu_limit,
         tactic_struct(tactic), ws, ws_bytes, _stream(stream, dev))
    return out, scales


def fc1_activation_fp8_dequantized(input: torch.Tensor, expert_first_token_offset: torch.Tensor,
                                   activation: int | str | Activation, static_scale: torch.Tensor | None,
                                   bias: torch.Tensor | None = None, swiglu_alpha: float = 1.0,
                                   swiglu_limit: float = math.inf, out: torch.Tensor | None = None,
                                   stream: int | torch.cuda.Stream | None = None, *,
                                   prequant_scale: torch.Tensor | None = None,
                                   gate_up_interleaved: bool = False,
                                   tactic: str | StepTactic = "block_rows") -> torch.Tensor:
    """fc1_activation_fp8's values by a static scale (None: each row's dynamic scale), each stored dequantized in
    input's 16-bit type: input [R, N1] -> out [R, I]; rows >= offsets[E] untouched. With activation "identity" and no
    bias, input's own rows quantized (the separate step). GEMM2's input for W4AFP8, whose GEMMs are W4A16's on 16-bit
    rows. gate_up_interleaved (a static scale only): input's and bias's columns in W1's interleaved order, as
    fc1_activation's. `tactic` as fc1_activation_fp8's but group_items (a static scale: block_rows, the 16-bit
    activation's kernel)."""
    if gate_up_interleaved and static_scale is None:
        raise ValueError("gate_up_interleaved: per-row scales read gate and up stacked (a static scale only)")
    act, dev, rows, inter = _activation_args(input, expert_first_token_offset, activation, bias)
    e = expert_first_token_offset.shape[0] - 1
    scale = _fp8_static(static_scale, dev)
    pre = _prequant(prequant_scale, inter, dev)
    o = _out(out, "out", (rows, inter), input.dtype, dev)
    call("mb_fc1_activation_fp8_dequantized", input.data_ptr(), _dtype_code(input, "input"), _ptr(bias),
          expert_first_token_offset.data_ptr(), e, rows, inter, int(act), int(gate_up_interleaved), swiglu_alpha,
          swiglu_limit, pre, scale, o.data_ptr(), _step_tactic(tactic), _stream(stream, dev))
    return o
