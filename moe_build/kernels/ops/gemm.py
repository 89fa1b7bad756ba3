"""Torch wrappers of the 16-bit grouped GEMMs (cpp/src/gemm/): a plan's tactic as the library's mb_gemm_tactic, the
sm80 and sm90 entry points, their workspaces and placement regions."""
from __future__ import annotations

import functools
import math

import torch

from ...planner.tactics.tactic import DECODE_TILES, MMA_TILES, WGMMA_TILES, GemmTactic
from ..abi import Activation, GemmKernel, GemmLaunch, GemmTacticStruct, GemmTile, OutputL2, WeightLayout
from ..library import call, load_library
from .args import _check, _dtype_code, _enum, _out, _ptr, _stream, _workspace


def _placement(placement: torch.Tensor | None, dev: torch.device) -> int | None:
    if placement is not None:
        _check(placement, "placement", (gemm_placement_ints(),), torch.int32, dev)
    return _ptr(placement)


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


# A tactic's tile -> mb_gemm_tile, matched by name (decode "staged" is DECODE_STAGED, mma "16x64" is MMA_16x64, wgmma
# "pingpong64x256c2" is PINGPONG_64x256_C2): a tile added to tactics/tactic.py without its enum member fails here, at
# import.
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
