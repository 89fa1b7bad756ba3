"""The decode kernel's facts that every family's rules read (gemm/decode_launch.cuh, gemm/decode.cu): its chunks of
token rows, its warps, their K slices, and how many CTAs a launch makes."""
from __future__ import annotations

from .rows import RowCount
from .tactic import GemmCall

DECODE_TOKENS = 8  # gemm/decode_launch.cuh kDecodeTokens: token rows per chunk
DECODE_WARPS = 8  # gemm/decode.cu kDecodeWarps: a CTA covers (gated ? 8 : 16) * (8 / k_split) columns


def decode_k_slice(k: int, k_split: int) -> int:
    """gemm/decode_launch.cuh decode_k_slice: a warp's K slice, whole 128-k batches."""
    return -(-k // (k_split * 128)) * 128


def decode_column_blocks(call: GemmCall, k_split: int) -> int:
    """The decode kernel's CTAs per (expert, row chunk): 16 weight rows a warp, DECODE_WARPS / k_split warps across N."""
    return -(-call.n // (16 * (DECODE_WARPS // k_split)))


def ctas_at_most(call: GemmCall, rows: RowCount, column_blocks: int, limit: int) -> bool:
    """A decode launch's CTAs, non-empty experts (at most min(experts, rows)) times `column_blocks`, <= `limit`:
    min(experts, rows) <= limit // column_blocks, constant where every expert fits, else while the rows do (the
    threshold recorded in `rows`, so the token bands end where the answer flips)."""
    most = limit // column_blocks
    return call.experts <= most or rows.rows_below(most + 1)
