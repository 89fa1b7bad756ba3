"""Every intermediate buffer of the fused runner, sized once for `max_tokens` and reused.

Why: a call must not allocate (allocation costs time, fragments the caching allocator and
breaks CUDA-graph capture), so the layout is computed up front from the spec and the set of
steps the plan can run, and each call takes leading-row views of these buffers.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..planner.tactics.woq import DIGITS_GROUP_BYTES
from ..spec import MoESpec, Quant
from ..weights.dtypes import TORCH_DTYPE
from . import sequence as S



@dataclass(frozen=True)
class BufferSpec:
    """Shape and dtype of one buffer; `rows_per_token` says how many leading rows one token uses."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    rows_per_token: int = 0   # 0: not token-indexed (sliced whole)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def workspace_layout(spec: MoESpec, steps: set[str], max_tokens: int, *, gemm_workspace_bytes: int = 0,
                     three_step_workspace_bytes: int = 0) -> dict[str, BufferSpec]:
    """Buffers needed by `steps` (from `sequence.steps_up_to`) for calls of up to `max_tokens` tokens.

    The kernel-specific scratch sizes come from the kernel library's own size queries and are
    passed in, so this function stays pure arithmetic.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    M, K, E = max_tokens, spec.top_k, spec.local_experts
    H, I, N1 = spec.hidden_size, spec.intermediate_size, spec.fc1_out_features
    R = M * K
    dt = TORCH_DTYPE[spec.dtype]
    out: dict[str, BufferSpec] = {
        "topk_ids": BufferSpec((M, K), torch.int32, 1),
        "topk_weights": BufferSpec((M, K), torch.float32, 1),
        "permuted_to_unpermuted": BufferSpec((R,), torch.int32, K),
        "unpermuted_to_permuted": BufferSpec((R,), torch.int32, K),
        "expert_offsets": BufferSpec((E + 1,), torch.int64),
        "permuted_input": BufferSpec((R, H), dt, K),
        "permuted_weights": BufferSpec((R,), torch.float32, K),
        "fc1_act": BufferSpec((R, I), dt, K),
    }
    if steps & {S.GEMM1_FP8, S.GEMM1_FP8_GATED, S.GEMM1_FP8_GATED_QUANTIZED}:
        out.update(_fp8_buffers(spec, steps, max_tokens))
    if steps & {S.EXPAND_ROWS_16BIT, S.EXPAND_ROWS_16BIT_ZERO_OUTPUT}:  # W4AFP8's plain expansion, quantized after
        out["expanded_input"] = BufferSpec((R, H), dt, K)
    if steps & {S.GEMM1_FP8, S.GEMM1_FP8_GATED, S.GEMM1_FP8_GATED_QUANTIZED} \
            and S.QUANTIZE_FC2_INPUT not in steps \
            and S.FC1_ACTIVATION not in steps and S.GEMM2_FP8_QUANTIZING_FINALIZE not in steps:
        del out["fc1_act"]  # the activation (or GEMM1's epilogue) writes GEMM2's FP8 input straight away
    if S.ROUTER_GEMM in steps:
        out["logits"] = BufferSpec((M, spec.num_experts), dt, 1)  # the router scores every expert
    if S.THREE_STEP_PROLOGUES & steps and three_step_workspace_bytes:
        out["prologue_workspace"] = BufferSpec((three_step_workspace_bytes,), torch.uint8)
    if steps & {S.FC1_ACTIVATION, S.FC1_ACTIVATION_FP8, S.FC1_ACTIVATION_PREQUANT,
                 S.FC1_ACTIVATION_DIGITS, S.FC1_ACTIVATION_PREQUANT_DIGITS, S.FC1_ACTIVATION_FP8_DEQUANTIZED,
                 S.FC1_ACTIVATION_FP8_DEQUANTIZED_DIGITS}:
        out["fc1_out"] = BufferSpec((R, N1), dt, K)
    if S.FINALIZE in steps:
        out["gemm2_out"] = BufferSpec((R, H), dt, K)
    if S.FC1_PREQUANT in steps:
        out["prequant_input"] = BufferSpec((M, H), dt, 1)  # the tokens' rows times the AWQ FC1 pre-quant scale
    if gemm_workspace_bytes:
        out["gemm_workspace"] = BufferSpec((gemm_workspace_bytes,), torch.uint8)
    if steps & S.WOQ_DIGITS_STEPS:  # one GEMM's input rows as token digits at a time
        out["token_digits"] = BufferSpec((R, -(-max(H, I) // 128) * DIGITS_GROUP_BYTES), torch.uint8, K)
    if steps & {S.GEMM1_WOQ_DENSE, S.GEMM2_WOQ_DENSE}:  # one GEMM's experts dequantized at a time, W1 or W2
        out["woq_dense"] = BufferSpec((spec.local_experts, max(N1 * H, H * I)), dt)
    if S.SHARED_EXPERTS in steps:
        si = spec.shared.intermediate_size
        n1s = si * (2 if spec.activation.is_gated else 1)
        out["shared_fc1"] = BufferSpec((M, n1s), dt, 1)
        out["shared_act"] = BufferSpec((M, si), dt, 1)
        out["shared_out"] = BufferSpec((M, H), dt, 1)
        out["shared_offsets"] = BufferSpec((2,), torch.int64)
        if spec.shared.sigmoid_gate:
            out["shared_gate"] = BufferSpec((M, 1), dt, 1)
    return out


def _fp8_buffers(spec: MoESpec, steps: set[str], max_tokens: int) -> dict[str, BufferSpec]:
    """An FP8 layer's GEMM inputs (e4m3 rows and their fp32 scales, one per row or per 128 columns:
    moe_build/weights/fp8.py), replacing the 16-bit permuted_input; fc1_act stays 16-bit where the separate
    quantize step reads it (after the activation kernel or GEMM1's gated epilogue)."""
    M, K, H, I = max_tokens, spec.top_k, spec.hidden_size, spec.intermediate_size
    R = M * K

    def scales(rows: int, cols: int, per_token: int) -> BufferSpec:
        shape = (rows, -(-cols // 128)) if spec.quant is Quant.FP8_BLOCK else (rows,)
        return BufferSpec(shape, torch.float32, per_token)

    out = {"permuted_input": BufferSpec((R, H), torch.float8_e4m3fn, K), "permuted_input_scales": scales(R, H, K),
           "fc2_input": BufferSpec((R, I), torch.float8_e4m3fn, K), "fc2_input_scales": scales(R, I, K)}
    if S.QUANTIZE_INPUT in steps:
        out["input_fp8"] = BufferSpec((M, H), torch.float8_e4m3fn, 1)
        out["input_scales"] = scales(M, H, 1)
    return out


VIEW_CACHE_TOKEN_COUNTS = 64  # token counts whose views a Workspace keeps (a decode loop reuses a few)
ALIGN = 256  # bytes: every buffer starts aligned for 16-byte vector loads and TMA descriptors


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layout_bytes(layout: dict[str, BufferSpec]) -> int:
    """Bytes of one flat buffer holding every buffer of `layout`, each start aligned to ALIGN."""
    return sum(_aligned(b.nbytes) for b in layout.values())


def _token_view(spec: BufferSpec, buffer: torch.Tensor, tokens: int) -> torch.Tensor:
    return buffer[: tokens * spec.rows_per_token] if spec.rows_per_token else buffer


def _token_views(layout: dict[str, BufferSpec], buffers: dict[str, torch.Tensor], tokens: int
                 ) -> dict[str, torch.Tensor]:
    return {name: _token_view(layout[name], buffers[name], tokens) for name in buffers}


class Workspace:
    """The buffers of one layout, carved from one flat byte buffer (owned, or the caller's, e.g.
    TensorRT's workspace); `view(name, tokens)` gives a call's leading rows, `views(tokens)` all of
    them (kept for the last token counts: a call then makes no tensor views of its own)."""

    def __init__(self, layout: dict[str, BufferSpec], device: torch.device | str | None = None,
                 flat: torch.Tensor | None = None) -> None:
        self.layout = dict(layout)
        need = layout_bytes(layout)
        if flat is None:
            flat = torch.empty(need, dtype=torch.uint8, device=device)
        if flat.dtype != torch.uint8 or flat.dim() != 1 or not flat.is_contiguous() or flat.numel() < need \
                or (flat.is_cuda and flat.data_ptr() % ALIGN):  # CUDA allocations are 512-byte aligned
            raise ValueError(f"workspace: need a contiguous 1-D uint8 buffer of >= {need} bytes aligned to {ALIGN}, "
                             f"got {flat.dtype} {tuple(flat.shape)}")
        self.flat = flat
        self.buffers: dict[str, torch.Tensor] = {}
        offset = 0
        for name, b in layout.items():
            self.buffers[name] = flat[offset: offset + b.nbytes].view(b.dtype).view(b.shape)
            offset += _aligned(b.nbytes)
        # over the layout and buffers, not `self` (no reference cycle: a dropped workspace frees at once)
        self.views = functools.lru_cache(maxsize=VIEW_CACHE_TOKEN_COUNTS)(
            functools.partial(_token_views, self.layout, self.buffers))

    def __contains__(self, name: str) -> bool:
        return name in self.buffers

    def view(self, name: str, tokens: int) -> torch.Tensor:
        """Leading rows for `tokens` tokens (a view: no allocation, stable address for graphs)."""
        return _token_view(self.layout[name], self.buffers[name], tokens)

    @property
    def nbytes(self) -> int:
        return layout_bytes(self.layout)
