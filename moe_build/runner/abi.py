"""Direct ABI calls for the entry points whose torch wrappers allocate per call.

Why: `moe_build.kernels`' wrappers for the map builders and grouped GEMMs allocate their outputs
and scratch on every call; the runner must write into its preallocated workspace instead (no
allocation per call, stable addresses for CUDA graphs). These calls take every buffer from the
caller and otherwise mirror the wrappers (same library, same KernelError).
"""
from __future__ import annotations

import torch

from .. import kernels as K


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _call(name: str, *args: object) -> None:
    status = getattr(K.load_library(), name)(*args)
    if status != K.Status.OK:
        raise K.KernelError(name, status, K.last_error())


def _dtype(t: torch.Tensor) -> int:
    return int({torch.float32: K.DType.FP32, torch.float16: K.DType.FP16, torch.bfloat16: K.DType.BF16}[t.dtype])


def three_step_workspace_bytes(tokens: int, top_k: int, experts: int) -> int:
    return int(K.load_library().mb_build_maps_three_step_workspace(tokens, top_k, experts))


def sm80_workspace_bytes(experts: int) -> int:
    return int(K.load_library().mb_grouped_gemm_sm80_workspace(experts))


def sm90_workspace_bytes(experts: int, max_rows: int, n: int, k: int) -> int:
    return int(K.load_library().mb_grouped_gemm_sm90_workspace(experts, max_rows, n, k))


def build_maps(fused: bool, topk_ids: torch.Tensor, experts: int, ptu: torch.Tensor, utp: torch.Tensor,
               offsets: torch.Tensor, workspace: torch.Tensor | None) -> None:
    t, k = topk_ids.shape
    if fused:
        _call("mb_build_maps_fused", topk_ids.data_ptr(), t, k, experts, ptu.data_ptr(), utp.data_ptr(),
              offsets.data_ptr(), _stream(topk_ids))
    else:
        _call("mb_build_maps_three_step", topk_ids.data_ptr(), t, k, experts, ptu.data_ptr(), utp.data_ptr(),
              offsets.data_ptr(), _ptr(workspace), _nbytes(workspace), _stream(topk_ids))


def gemm_sm80(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, c: torch.Tensor, offsets: torch.Tensor,
              workspace: torch.Tensor | None, activation: int, fused_gated: bool, swiglu_alpha: float = 1.0,
              swiglu_limit: float = float("inf")) -> None:
    _call("mb_grouped_gemm_sm80", a.data_ptr(), b.data_ptr(), _ptr(bias), c.data_ptr(), offsets.data_ptr(),
          b.shape[0], a.shape[0], c.shape[1], a.shape[1], _dtype(a), activation, int(fused_gated), swiglu_alpha,
          swiglu_limit, _ptr(workspace), _nbytes(workspace), _stream(a))


def gemm_sm90(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, c: torch.Tensor, offsets: torch.Tensor,
              workspace: torch.Tensor | None) -> None:
    _call("mb_grouped_gemm_sm90", a.data_ptr(), b.data_ptr(), _ptr(bias), c.data_ptr(), offsets.data_ptr(),
          b.shape[0], a.shape[0], c.shape[1], a.shape[1], _dtype(a), _ptr(workspace), _nbytes(workspace), _stream(a))


def gemm_sm90_finalize(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                       offsets: torch.Tensor, ptu: torch.Tensor, permuted_weights: torch.Tensor, top_k: int,
                       workspace: torch.Tensor | None) -> None:
    _call("mb_grouped_gemm_sm90_finalize", a.data_ptr(), b.data_ptr(), _ptr(bias), out.data_ptr(),
          offsets.data_ptr(), ptu.data_ptr(), permuted_weights.data_ptr(), b.shape[0], a.shape[0], out.shape[0],
          top_k, out.shape[1], a.shape[1], _dtype(a), _ptr(workspace), _nbytes(workspace), _stream(a))
