"""The 16-bit GEMM's tactic (bf16 / fp16 activations and weights): its rules, each under a comment quoting its
condition and the measurement behind it, and `dense_tactic`, which applies them in order."""
from __future__ import annotations

from .decode_kernel import DECODE_WARPS
from .launch import decode_launch_rule, output_l2_rule, wgmma_launch_rule
from .rows import RowCount
from .tactic import GemmCall, GemmTactic


# kernel: the decode kernel while the average rows per expert <= 8, else the tiled kernel of the entry
# point (wgmma on sm90, mma on sm80). Decode shapes are weight-bandwidth bound and a 64- or 128-row tile
# mostly multiplies padding. H200, bf16, L2 flushed: 1 token of Mixtral / Qwen3-30B-A3B / DeepSeek-V2-Lite
# GEMM1 121-125 / 20 / 25 us on the decode kernel, 148 / 25 / 29 on mma tiles and 140 / 35 / 38 on wgmma.
# GEMM2 with the finalize epilogue leaves the decode kernel past 4 rows: whole layers, token sweep with the
# tactics forced, H200 (docs/performance.md, "Token sweep"): at 8 rows per expert the wgmma finalize GEMM2
# took Qwen3-30B-A3B 128 tokens to 335.5 us from 367.8, GPT-OSS-20B 64 tokens 438.0 from 465.1, Mixtral-8x7B
# 32 tokens 719.2 from 769.2; at 6 rows Mixtral 23 tokens 673.8 from 710.6, Qwen3 91 tokens 309.2 from 323.8;
# at 4 rows and below the two were within 2% (GPT-OSS 32 tokens 1-2% behind on wgmma). GEMM1 keeps the
# decode kernel to 8 rows: wgmma was 5-30% behind there on every shape.
# Deterministic 16-bit layers keep the tiled kernel at every count: the decode kernel sums its K slices in
# another order than the tiles' one K loop, so a row's output would change with how many rows share its expert
# (one GPU against an expert-parallel rank's received rows, or one batch size against another), while every tile
# of one kernel sums K in the same order whatever the rows around it.
DECODE_MAX_AVG_ROWS = 8
FINALIZE_DECODE_MAX_AVG_ROWS = 4


def kernel_rule(call: GemmCall, rows: RowCount) -> str:
    limit = FINALIZE_DECODE_MAX_AVG_ROWS if call.epilogue == "finalize" else DECODE_MAX_AVG_ROWS
    if not call.deterministic and rows.avg_at_most(limit):
        return "decode"
    return "wgmma" if call.entry == "sm90" else "mma"


# decode K slices per CTA: 2, or 8 where 2 slices give fewer CTAs than SMs (non-empty experts at most
# min(experts, rows), times the column blocks). H200, 1 and 16 tokens of the bench shapes, each split
# forced: 2 is best or within 5% of best at most points; 1 loses 5-45% (too few warps per row block);
# 8 wins only when the grid is small (Mixtral GEMM2 and GPT-OSS-20B at 1 token) and loses up to 2x for
# short K (Qwen3-30B-A3B GEMM2, K = 768).
def decode_k_split_rule(call: GemmCall, rows: RowCount) -> int:
    gated = call.epilogue == "gated"
    out_cols = call.n // 2 if gated else call.n  # the gated epilogue writes one column per gate/up pair
    cols_per_cta = (8 if gated else 16) * (DECODE_WARPS // 2)
    column_blocks = -(-out_cols // cols_per_cta)
    # ctas = min(experts, rows) * column_blocks < sm_count, i.e. rows below ceil(sm_count / column_blocks)
    # while that stays within the experts
    few = -(-call.sm_count // column_blocks)
    if few > call.experts:
        return 8
    return 8 if rows.rows_below(few) else 2


# mma tile: 16x64 up to 16 average rows per expert, 64x128 up to 64, else 128x128.
MMA_SMALL_MAX_AVG_ROWS = 16
MMA_MID_MAX_AVG_ROWS = 64


def mma_tile_rule(call: GemmCall, rows: RowCount) -> str:
    if rows.avg_at_most(MMA_SMALL_MAX_AVG_ROWS):
        return "16x64"
    return "64x128" if rows.avg_at_most(MMA_MID_MAX_AVG_ROWS) else "128x128"


# wgmma tile, plain store: pingpong 64x128 up to 32 average rows per expert (twice the tiles of 64x256:
# with few rows a GEMM streams the weights once and more, smaller tiles even out the last wave; 256 tokens
# of Qwen3 / DeepSeek-V2-Lite / GPT-OSS-20B GEMM1 2-3% and GEMM2 1-2% faster than 64x256, H200), else
# pingpong 64x256 in 2x1 clusters (the cluster's CTAs share one weight tile by TMA multicast: at 4096
# tokens DeepSeek-V2-Lite GEMM1 557 vs 590 us, GPT-OSS-20B 989 vs 1054, Mixtral 2979 vs 3217 against the
# best one-CTA tile), as 64x192 where narrow_columns_fit.
NARROW_MAX_AVG_ROWS = 32
# wgmma tile, gated epilogue: one-CTA pingpong 64x256 from 33 to 1024 average rows (against the 2x1
# cluster, H200: Qwen3 4096 tokens 437 vs 451 us, GPT-OSS 512 rows 905 vs 927, Mixtral 512 / 1024 rows
# 1532 vs 1579 and 2893 vs 2968), else as the plain store.
GATED_SINGLE_CTA_MAX_AVG_ROWS = 1024
# wgmma tile, finalize epilogue: pingpong 64x128 up to 64 average rows (Mixtral 256 tokens, 8 x 16 tiles
# of 64x256 for 132 SMs: GEMM2 259.4 vs 276.4 us), else pingpong 64x256 (from 96 rows: Mixtral 512 tokens
# 299.7 vs 313.3, GPT-OSS-20B 1024 tokens 176.6 vs 198.2; the 2x1 cluster gave no clear gain here).
FINALIZE_NARROW_MAX_AVG_ROWS = 64


def narrow_columns_fit(n: int) -> bool:
    """64x192 tiles pad none of n's columns where 256-wide ones would pad more than 1/16 of them (among
    the bench shapes only GPT-OSS-20B's N = 2880: GEMM2 at 4096 tokens 515.6-517.1 vs 532.1-533.7 us; every
    other shape, with no padding to save, loses 2-45%)."""
    pad256 = (256 - n % 256) % 256
    return n % 192 == 0 and pad256 * 16 > n


def wgmma_tile_rule(call: GemmCall, rows: RowCount) -> str:
    if call.epilogue == "finalize":
        return "pingpong64x128" if rows.avg_at_most(FINALIZE_NARROW_MAX_AVG_ROWS) else "pingpong64x256"
    if rows.avg_at_most(NARROW_MAX_AVG_ROWS):
        return "pingpong64x128"
    if call.epilogue == "gated" and rows.avg_at_most(GATED_SINGLE_CTA_MAX_AVG_ROWS):
        return "pingpong64x256"
    # 64x192 in 2x1 clusters multicasts 96-row weight slices, which 64 x 64 weight blocks do not tile
    return "pingpong64x192c2" if narrow_columns_fit(call.n) and not call.weights_blocked else "pingpong64x256c2"


def dense_tactic(call: GemmCall, rows: RowCount) -> GemmTactic:
    """The 16-bit rules above, in order, for one GEMM at one token count."""
    kernel = kernel_rule(call, rows)
    if kernel == "decode":
        return GemmTactic("decode", "none", decode_k_split_rule(call, rows), decode_launch_rule(call), "plain")
    if kernel == "mma":
        return GemmTactic("mma", mma_tile_rule(call, rows), 0, "plain", "plain")
    tile = wgmma_tile_rule(call, rows)
    return GemmTactic("wgmma", tile, 0, wgmma_launch_rule(call, rows, tile), output_l2_rule(call, kernel))
