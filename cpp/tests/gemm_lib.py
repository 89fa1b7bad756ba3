"""Status-code-level access to the grouped-GEMM entry points for tests/gpu/test_gemm_kernels.py and the
bench scripts: raw status codes, and any tactic (also ones the wrappers cannot spell, such as enum values
outside their enums), not moe_build.kernels' exceptions. The library itself (and every argtype) comes
from moe_build.kernels.load_library().
"""
from __future__ import annotations

import ctypes

import torch

from moe_build.kernels import Activation, DType, GemmTacticStruct, WeightLayout, tactic_struct
from moe_build.planner.tactics import GemmTactic

# The header's codes by the names the tests use, from moe_build.kernels' enums (which
# tests/test_kernel_build.py checks against moe_build_kernels.h), so no value is written twice.
MB_BF16 = int(DType.BF16)
LAYOUTS = {layout.name.lower(): int(layout) for layout in WeightLayout}  # row_major, blocked64
ACT = {act.name.lower(): int(act) for act in Activation}
GATED = tuple(act.name.lower() for act in Activation if act.is_gated)
DTYPES = {torch.float32: int(DType.FP32), torch.float16: int(DType.FP16), torch.bfloat16: int(DType.BF16)}

Tactic = GemmTactic | str | GemmTacticStruct


def load() -> ctypes.CDLL:
    """The project's kernel library (moe_build.kernels: $MOE_BUILD_KERNELS_LIB or the cached build)."""
    from moe_build.kernels import load_library
    return load_library()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class Gemms:
    """Thin wrappers: tensors and a tactic in, status code back; the caller owns every output buffer."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self._ws: dict[int, torch.Tensor] = {}

    def error(self) -> str:
        return self.lib.mb_last_error().decode()

    def workspace_sm90(self, num_experts: int, max_rows: int, n: int, k: int) -> torch.Tensor:
        size = self.lib.mb_grouped_gemm_sm90_workspace(num_experts, max_rows, n, k)
        ws = self._ws.get(num_experts)
        if ws is None or ws.numel() < size:
            ws = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
            self._ws[num_experts] = ws
        return ws

    def placement_ints(self) -> int:
        return int(self.lib.mb_grouped_gemm_sm90_placement_ints())

    def sm80(self, a, b, bias, c, offsets, max_rows: int, n: int, k: int, act: str,
             alpha: float = 1.0, limit: float = 0.0, *, tactic: Tactic) -> int:
        gated = int(act in GATED)
        return self.lib.mb_grouped_gemm_sm80(_ptr(a), _ptr(b), _ptr(bias), _ptr(c), _ptr(offsets),
                                             offsets.numel() - 1, max_rows, n, k, DTYPES[a.dtype], ACT[act],
                                             gated, alpha, limit, tactic_struct(tactic), None, 0, _stream())

    def sm90(self, a, b, bias, c, offsets, max_rows: int, n: int, k: int, layout: str = "row_major", *,
             tactic: Tactic) -> int:
        e = offsets.numel() - 1
        ws = self.workspace_sm90(e, max_rows, n, k)
        return self.lib.mb_grouped_gemm_sm90(_ptr(a), _ptr(b), _ptr(bias), _ptr(c), _ptr(offsets), e, max_rows,
                                             n, k, DTYPES[a.dtype], LAYOUTS[layout], tactic_struct(tactic), _ptr(ws),
                                             ws.numel(), _stream())

    def sm90_gated(self, a, b, bias, c, offsets, max_rows: int, inter: int, k: int, act: str,
                   alpha: float = 1.0, limit: float = 0.0, layout: str = "row_major", placement=None, *,
                   tactic: Tactic) -> int:
        """b / bias in moe_build.weights.interleave_gate_up's order; c [rows, inter]; placement: a zeroed
        int32 claim region (placement_ints()) for a placed tactic, or None."""
        e = offsets.numel() - 1
        ws = self.workspace_sm90(e, max_rows, 2 * inter, k)
        return self.lib.mb_grouped_gemm_sm90_gated(_ptr(a), _ptr(b), _ptr(bias), _ptr(c), _ptr(offsets), e, max_rows,
                                                   inter, k, DTYPES[a.dtype], ACT[act], alpha, limit, LAYOUTS[layout],
                                                   tactic_struct(tactic), _ptr(placement), _ptr(ws), ws.numel(),
                                                   _stream())

    def sm90_finalize(self, a, b, bias, out, offsets, p2u, pw, max_rows: int, num_tokens: int, top_k: int,
                      n: int, k: int, layout: str = "row_major", placement=None, *, tactic: Tactic) -> int:
        e = offsets.numel() - 1
        ws = self.workspace_sm90(e, max_rows, n, k)
        return self.lib.mb_grouped_gemm_sm90_finalize(
            _ptr(a), _ptr(b), _ptr(bias), _ptr(out), _ptr(offsets), _ptr(p2u), _ptr(pw), e, max_rows,
            num_tokens, top_k, n, k, DTYPES[a.dtype], LAYOUTS[layout], tactic_struct(tactic), _ptr(placement), _ptr(ws),
            ws.numel(), _stream())


def route(num_tokens: int, num_experts: int, top_k: int, gen: torch.Generator):
    """Random distinct top-k experts per token -> (topk_ids, offsets int64 [E+1],
    permuted_to_unpermuted int32, unpermuted_to_permuted int64), permuted rows stable by expert."""
    scores = torch.rand(num_tokens, num_experts, generator=gen, device="cuda")
    ids = scores.topk(top_k, dim=1).indices.to(torch.int32)
    flat = ids.flatten().long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device="cuda")
    offsets[1:] = counts.cumsum(0)
    u2p = torch.empty_like(order)
    u2p[order] = torch.arange(order.numel(), device="cuda")
    return ids, offsets, order.to(torch.int32), u2p
