"""The weight-only GEMM's tactic (int4, int8 or MXFP4 weights; 16-bit or FP8 activations): its rules, each under a
comment quoting its condition and the measurement behind it, and `woq_tactic`, which applies them in order."""
from __future__ import annotations

import functools
import math
from dataclasses import replace

from .decode_kernel import DECODE_TOKENS, ctas_at_most, decode_column_blocks, decode_k_slice
from .dense import wgmma_tile_rule
from .launch import decode_launch_rule
from .rows import RowCount
from .tactic import WOQ_WGMMA_TILES, GemmCall, GemmTactic


# Weight-only kernel: the decode kernel while the average rows per expert <= 8 (its CTAs take 8 token rows and
# read their weights once: beyond that each further 8 rows read the expert's weights again), else the mma
# tiles that dequantize each weight once per 64 or 128 token rows. bench/woq_tactics_probe.py, H200, int4 group
# 128 and MXFP4, L2 flushed, best decode split against best tile: at 4-6 average rows decode (Qwen3-30B-A3B GEMM1
# at 64 tokens 120 vs 232 us, DeepSeek-V2-Lite GEMM1 125 vs 210, Mixtral-8x7B GEMM1 at 16 tokens 258 vs 534), at 16
# and more the tiles (Mixtral GEMM1 at 64 tokens 498 vs 606, Qwen3 GEMM1 at 256 tokens 234 vs 271).
WOQ_DECODE_MAX_AVG_ROWS = 8
# The staged int4 tile (int4 codes with one scale per row or per 128 k, 16-bit activations, 8-row chunks that fit:
# woq_staged_rows) keeps the decode kernel to 12 average rows per expert, where the mixed-input wgmma tile's 32 token
# rows are a third to a half full.
# H200, W4A16 layers, graph replay, two rounds, both GEMMs forced onto the staged tile against the plan then (the
# mixed-input 128x32 tile past 8 rows), us (docs/measured/h200-2026-12-01-woq-staged-band): Qwen3-30B-A3B at 144 /
# 160 / 192 tokens (9 / 10 / 12 rows) 219.6-220.5 / 237.9-238.7 / 266.5-268.7 against 271.3-271.4 / 270.8-273.3 /
# 272.0-273.4, DeepSeek-V2-Lite at 96 / 107 / 128 tokens 192.8-193.6 / 206.6-207.7 / 226.9-227.7 against 239.1-241.1 /
# 240.7-241.4 / 239.0-239.7, Mixtral-8x7B's GEMM1 alone (its GEMM2's rows do not fit) at 36 / 48 tokens 416.1 / 482.8
# against 499.1 / 500.7; at 16 rows the tile loses (Qwen3-30B-A3B 256 tokens 328.8-330.3 against 277.7-278.8,
# DeepSeek-V2-Lite 171 tokens 272.7-274.6 against 265.3-267.7, Mixtral-8x7B 64 tokens 556.3 against 532.1). This rule's
# plan against both GEMMs on the 128x32 tile, one round: Qwen3-30B-A3B at 144 / 176 / 192 tokens 222.1 / 251.5 / 273.0
# against 269.1 / 272.8 / 282.1, DeepSeek-V2-Lite at 96 / 117 / 128 tokens 194.4 / 216.9 / 231.1 against 239.8 / 240.4
# / 242.3, Mixtral-8x7B at 36 / 44 / 48 tokens 420.8 / 466.8 / 485.9 against 519.7 / 505.0 / 516.5. Groups of 64 keep
# the 8-row band: GPT-OSS-20B's staged tile at 72 / 88 / 96 tokens (9 / 11 / 12 rows) 328.7-330.6 / 370.1-371.7 /
# 393.0-393.2 against 320.8-321.9 / 318.6-326.0 / 327.2-329.0 on the 128x32 tile, two rounds.
WOQ_STAGED_MAX_AVG_ROWS = 12
# MXFP4 (WFP4A16) where the mixed-input wgmma kernel does not take it (fp16 activations) keeps the decode kernel to 12
# rows as well: past 8 its alternative is the mma.sync tiles. With bf16 activations the alternative is the mixed-input
# kernel on its e5m2 form, which wins from 8 rows, so the decode kernel keeps MXFP4 to 7
# (WOQ_MXFP4_MIXED_DECODE_MAX_AVG_ROWS): H200, WFP4A16 layers, graph replay, both GEMMs forced onto woq128x32 over the
# plan's decode kernel (docs/measured/h200-2026-12-04-mxfp4-e5m2, bench_band.json, bench_tiles.json): Qwen3-30B-A3B at
# 96 / 128 / 144 / 192 tokens (6 / 8 / 9 / 12 rows) 1.02 / 0.89 / 0.80 / 0.68, DeepSeek-V2-Lite at 72 / 96 (7 / 9)
# 0.99 / 0.82, GPT-OSS-20B at 72 / 96 (9 / 12) 0.78 / 0.66.
# Before the e5m2 form (the fp16 case's evidence): H200, WFP4A16 layers, graph replay, one round, both GEMMs forced onto the
# decode kernel beside the plan then (mma 64x128), us (docs/measured/h200-2026-12-01-woq-staged-band, band3_*):
# Qwen3-30B-A3B at 144 / 192 tokens (9 / 12 rows) 296.3 / 354.0 against 364.6 / 364.5, DeepSeek-V2-Lite at 96 / 128
# 264.5 / 309.4 against 331.5 / 329.8 (int8 per channel, W8A16, lost there: 290.7 / 355.5 against 227.7 / 233.3 on
# DeepSeek-V2-Lite, the mixed-input tile's). This rule's plan beside both GEMMs forced onto mma 64x128, a second call:
# GPT-OSS-20B (its own MXFP4) at 72 / 96 tokens (9 / 12 rows) 359.8 / 426.5 against 460.9 / 461.8, Qwen3-30B-A3B at
# 144 / 192 297.5 / 353.7 against 362.9 / 364.1, DeepSeek-V2-Lite at 96 / 128 263.8 / 309.6 against 330.8 / 330.3.
WOQ_MXFP4_DECODE_MAX_AVG_ROWS = 12
WOQ_MXFP4_MIXED_DECODE_MAX_AVG_ROWS = 7
# int8 (W8A16), whose decode kernel reads a byte a weight as the mixed-input kernel does, keeps the decode kernel to 5
# rows: H200, W8A16 layers (per channel), graph replay, both GEMMs forced onto woq128x32 over the plan's decode kernel
# (docs/measured/h200-2026-12-04-mxfp4-e5m2, bench_w8_band.json): at 6 / 7 / 8 rows an expert Mixtral-8x7B 0.85 / 0.79
# / 0.77, Qwen3-30B-A3B 0.89 / 0.83 / 0.77, GPT-OSS-20B 0.90 / 0.84 / 0.75, DeepSeek-V2-Lite at 6 rows 0.91-0.96; at 2-5
# rows 0.97-1.05 on the four layers.
WOQ_INT8_DECODE_MAX_AVG_ROWS = 5
# The decode band of the kinds whose alternative past it is the mixed-input kernel with a band of their own.
WOQ_MIXED_DECODE_MAX_AVG_ROWS = {"mxfp4": WOQ_MXFP4_MIXED_DECODE_MAX_AVG_ROWS, "int8": WOQ_INT8_DECODE_MAX_AVG_ROWS}
# Where the mixed-input kernel does not take the weights (int4 in groups of 32, fp16 MXFP4; woq_mixed_input below;
# bf16 MXFP4 ran here too until its e5m2 form, and the figures below are its layers then): from 160
# average rows per expert on sm90 with 16-bit activations, the wgmma tactic with the layer's weights dequantized once
# into the workspace (gemm/woq_dequantize.cu), then the 16-bit wgmma GEMM; below, the mma tiles, whose time grows with
# the rows at a rate far below wgmma's while the pass costs the same at every count (it writes the experts' 16-bit
# weights: Mixtral-8x7B's 2.8 GB in 1.29 ms on an H200). H200, WFP4A16 layers, graph replay, both GEMMs
# forced dense against both forced onto mma 64x128 at 128 / 160 / 192 / 224 average rows, us
# (docs/measured/h200-2026-12-02-woq-dequantize-rows, call 5): GPT-OSS-20B 1122 / 1211 / 1224 / 1274 against 1109 /
# 1368 / 1704 / 1787, Qwen3-30B-A3B 917 / 1092 / 1017 / 1057 against 906 / 1106 / 1265 / 1482, DeepSeek-V2-Lite 774 /
# 855 / 861 / 904 against 808 / 954 / 1149 / 1305, Mixtral-8x7B 2344 / 2557 / 2522 / 2471 against 2050 / 2224 / 2610 /
# 3050 (its band of 160-191 rows 15% slower dense). From 128 rows until 2026-12-02, when the pass ran at 1.6 TB/s on
# MXFP4 (one 4-byte load and a conversion call a weight).
WOQ_DEQUANT_MIN_AVG_ROWS = 160


# Where the mixed-input kernel takes the weights (woq_mixed_input below), every count past the decode kernel's runs
# it: bench/woq_wgmma_probe.py (H200, int4 group 128 with zero points and int8 per channel, 11 GEMMs of the bench
# shapes at 8 to 1024 average rows per expert, L2 flushed) has the best mma tile at 1.04x the best mixed-input tile's
# time or more at every point (1.15x or more from 16 rows), and the weights dequantized for the 16-bit GEMM at 1.04x
# or more (1.24x or more up to 256 rows).
# The finalize epilogue exists on the decode kernel (mb_grouped_gemm_woq_finalize) and the mixed-input one
# (mb_grouped_gemm_woq_sm90_finalize): a GEMM2 with it takes the mixed-input kernel where the plain store would, and
# stays on the decode kernel everywhere else (the planner fuses the finalize only in those two kernels' bands; forced
# fused, it keeps decode beyond them).
def woq_kernel_rule(call: GemmCall, rows: RowCount) -> str:
    mixed = call.entry == "sm90" and woq_mixed_input(call)
    if mixed and call.woq in WOQ_MIXED_DECODE_MAX_AVG_ROWS:
        return "decode" if rows.avg_at_most(WOQ_MIXED_DECODE_MAX_AVG_ROWS[call.woq]) else "wgmma"
    if rows.avg_at_most(WOQ_DECODE_MAX_AVG_ROWS):
        return "decode"
    if staged_past_decode(call) and rows.avg_at_most(WOQ_STAGED_MAX_AVG_ROWS):
        return "decode"
    if call.woq == "mxfp4" and rows.avg_at_most(WOQ_MXFP4_DECODE_MAX_AVG_ROWS):
        return "decode"
    if mixed:
        return "wgmma"
    if call.epilogue == "finalize":
        return "decode"
    if call.entry == "sm90" and not rows.avg_at_most(WOQ_DEQUANT_MIN_AVG_ROWS - 1):
        return "wgmma"
    return "mma"


def staged_past_decode(call: GemmCall) -> bool:
    """Whether the staged int4 tile takes the call's 8-row chunks unsplit, its weights in groups of 128 or per row
    and its activations 16-bit (the decode band to WOQ_STAGED_MAX_AVG_ROWS)."""
    return woq_int4_codes(call) and woq_staged_rows(call, 1) >= DECODE_TOKENS


# The mixed-input kernel (gemm/woq_sm90.cu) takes int4 and int8 weights with 16-bit activations, one scale per
# output row or per 64 or 128 k (its k tile is 64), n a multiple of 8 (16-byte rows of its output and scales; a
# last weight tile past n reads TMA's zero fill) and k of 64, and MXFP4 with bf16 activations as its e5m2 form (one
# bf16 scale per 64 k: moe_build/weights/woq.py mxfp4_as_e5m2, made once by the runner); int4 in groups of 32 and
# fp16 MXFP4 are dequantized for the 16-bit wgmma GEMM instead. GPT-OSS-20B's GEMM2 (n 2880) ran the mma tiles at
# 9-127 rows per expert and the dequantized weights from 128 while the kernel took only n a multiple of 128.
def woq_mixed_input(call: GemmCall) -> bool:
    kinds = call.woq in ("int4", "int8") and call.woq_group in (0, 64, 128)
    mxfp4 = call.woq == "mxfp4" and call.dtype == "bf16"
    return (kinds or mxfp4) and call.n % 8 == 0 and call.k % 64 == 0


def on_mixed_input_tile(tactic: GemmTactic | None) -> bool:
    """Whether a weight-only GEMM's tactic is one of the mixed-input wgmma kernel's tiles (woq128x*)."""
    return tactic is not None and tactic.kernel == "wgmma" and tactic.tile in WOQ_WGMMA_TILES


def on_digits_tile(tactic: GemmTactic) -> bool:
    """Whether a GEMM's tactic is the decode kernel's digits tile (its token rows in 8-bit digits on the int8 mma)."""
    return tactic.kernel == "decode" and tactic.tile == "digits"


# Mixed-input tile, token rows per tile by average rows per expert: 32 up to 24, 64 up to 56, 128 up to 96 (same
# probe, each tile's worst time over the best tile's at its points: 128x32 1.04 at 8 rows and 1.02 at 16; 128x64 1.00
# at 32 and 1.08 at 48; 128x128 1.03 at 64; at 96, bench/woq_tile_rows_probe.py's first average, 1.00-1.06 on the
# eight W4A16 GEMMs of the bench shapes). 128x16 is there to be forced and probed (best at 8 rows on 5 of 11 GEMMs,
# 1.38x on the worst).
# The 32-row tile to 24 rows (was 16): H200, whole layers, both GEMMs forced onto woq128x32 beside the plan's
# woq128x64, graph replay (docs/measured/h200-2026-12-04-woq-tile32; the 18-28-row points of W8A16 and WFP4A16 on
# the other three shapes: docs/measured/h200-2026-12-04-mxfp4-e5m2): at 20 and 24 rows 0.87-0.93x the plan's time on
# W4A16 and W4AFP8 (the four bench shapes), W8A16 (Qwen3-30B-A3B 0.89 / 0.93; Mixtral-8x7B and DeepSeek-V2-Lite at
# 24: 0.88, 0.89) and WFP4A16 (Qwen3-30B-A3B 0.93 / 0.975; Mixtral-8x7B, DeepSeek-V2-Lite, GPT-OSS-20B at 18-24:
# 0.85-0.95); at 28 rows 0.88-1.03 (GPT-OSS-20B and WFP4A16 Qwen3-30B-A3B slower), at 32 rows 1.16-1.23 on every
# layer.
# The 64-row tile to 56 rows (was 48): the same method, W4A16 and W8A16 on the four bench shapes, both GEMMs forced onto
# woq128x64 and woq128x128 (docs/measured/h200-2026-12-04-woq-tile64): at 40-48 rows the 128-row tile 1.19-1.50x the
# 64-row one's time; at 52 and 56 rows the 64-row tile 0.69-0.95x the plan's 128-row one (Mixtral-8x7B W4A16 at 56:
# 1.001); at 64 rows it lost 3-15% (the e5m2 calls' tile heights, docs/measured/h200-2026-12-04-mxfp4-e5m2).
WOQ_TILE_32_MAX_AVG_ROWS = 24
WOQ_TILE_64_MAX_AVG_ROWS = 56
WOQ_TILE_128_MAX_AVG_ROWS = 96


# Past WOQ_TILE_128_MAX_AVG_ROWS, the token-row height that costs an expert least, expected over its routed count: a
# mixed-input tile converts its weights and multiplies all its token rows however few an expert's last tile holds,
# and uniform top-k routing spreads the counts binomially about the average (variance avg * (1 - top_k / experts)).
# An expert of X rows runs ceil(X / height) tiles, each costing its height plus a fixed part in token rows (the
# pipeline's fill and drain and the epilogue, which short K pays most): WOQ_TILE_FIXED_ROWS + WOQ_TILE_FIXED_ROW_K / k.
# woq128x320c2 only where its 2x1 clusters find the weight tiles in pairs (woq_weight_tiles_pair). Up to
# WOQ_TILE_COST_MAX_AVG_ROWS; past it the heights differ by a few percent and woq128x256 stays. Fitted on
# bench/woq_tile_rows_probe.py (H200, the eight W4A16 GEMMs of the bench shapes, every tile at 20 averages from 96 to
# 1024 rows, L2 flushed; docs/performance.md, "Mixed-input tiles of 160 to 320 token rows by the routed counts"), scored
# on the same run: the rule's tile 1.6% slower than the point's best on average, 25% at worst (Mixtral-8x7B's GEMM2
# at 208 rows), where the bands before it (128, 256, 320 in two bands) were 8.9% slower on average and 68% at worst.
# It keeps 128 rows to 117-119 average rows and takes 160 from there: at 128 average rows the 128-row tile ran
# 1.15-1.68x the best height on the eight GEMMs and the 160-row one 1.00-1.03x (the rule began past 128 rows until
# 2026-12-02; docs/performance.md, "Weight-only layers at the bench points and between them").
WOQ_TALL_TILE_ROWS = {"woq128x128": 128, "woq128x160": 160, "woq128x192": 192, "woq128x224": 224, "woq128x256": 256,
                      "woq128x320c2": 320}
WOQ_TILE_FIXED_ROWS = 96
WOQ_TILE_FIXED_ROW_K = 20000
WOQ_TILE_COST_MAX_AVG_ROWS = 1024


def woq_wgmma_tile_rule(call: GemmCall, rows: RowCount) -> str:
    if rows.avg_at_most(WOQ_TILE_32_MAX_AVG_ROWS):
        return "woq128x32"
    if rows.avg_at_most(WOQ_TILE_64_MAX_AVG_ROWS):
        return "woq128x64"
    if rows.avg_at_most(WOQ_TILE_128_MAX_AVG_ROWS):
        return "woq128x128"
    if not rows.avg_at_most(WOQ_TILE_COST_MAX_AVG_ROWS):
        return "woq128x256"
    tile = woq_cheapest_tile(call, rows.avg)
    # the answer holds until the average reaches the next count whose cheapest tile differs
    flip = next((avg for avg in range(rows.avg + 1, WOQ_TILE_COST_MAX_AVG_ROWS + 1)
                 if woq_cheapest_tile(call, avg) != tile), None)
    if flip is not None:
        rows.avg_at_most(flip - 1)
    return tile


@functools.lru_cache(maxsize=65536)
def woq_cheapest_tile(call: GemmCall, avg: int) -> str:
    """The WOQ_TALL_TILE_ROWS tile of least expected cost an expert at `avg` average rows (ties: the first)."""
    tiles = [t for t in WOQ_TALL_TILE_ROWS if t != "woq128x320c2" or woq_weight_tiles_pair(call)]
    return min(tiles, key=lambda t: woq_tile_cost(call, avg, WOQ_TALL_TILE_ROWS[t]))


def woq_tile_cost(call: GemmCall, avg: int, height: int) -> float:
    """Expected token rows an expert's tiles of `height` rows cost (module comment above): E[ceil(X / height)] for a
    count X ~ normal(avg, avg * (1 - top_k / experts)) with a continuity correction, times height plus the fixed
    part."""
    sd = math.sqrt(max(avg * (1 - call.top_k / call.experts), 1e-9))
    tiles = 1.0 + sum(0.5 * math.erfc((j * height + 0.5 - avg) / (sd * math.sqrt(2)))
                      for j in range(1, int((avg + 8 * sd) // height) + 2))
    return tiles * (height + WOQ_TILE_FIXED_ROWS + WOQ_TILE_FIXED_ROW_K / call.k)


# woq128x320c2's 2x1 clusters take the weight tiles (128 rows of n) in pairs: with an odd count its outputs were
# wrong on the H200 (GPT-OSS-20B's n 2880 and 5760; int4 at n 128 and 2880), and the kernel refuses them.
def woq_weight_tiles_pair(call: GemmCall) -> bool:
    return woq_weight_tiles(call) % 2 == 0


def woq_weight_tiles(call: GemmCall) -> int:
    """The mixed-input kernel's 128-row weight tiles across n (a last one past n reads TMA's zero fill)."""
    return -(-call.n // 128)


# Weight-only decode K slices: 1, doubled (up to 8) while the CTAs, non-empty experts times the column blocks at
# the current split, stay within one per SM. Same probe: at 1 token Mixtral GEMM2 (2 experts, 32 column blocks)
# 77.5 / 64.6 / 41.2 / 42.9 us at 1 / 2 / 4 / 8 slices, Qwen3 GEMM1 (8 experts x 12 blocks) 19.0 / 15.6 / 16.7 /
# 16.8, DeepSeek-V2-Lite GEMM1 (6 x 22) 21.2 / 16.6 / 17.7 / 20.1, Mixtral GEMM1 (2 x 224) 72.7 / 80.8 / 80.9 /
# 87.0; at 16 and 64 tokens one slice was best on every GEMM but MXFP4 Mixtral GEMM2 at 16 tokens (210 at 1,
# 158 at 4; int4 there: 131 at 1). Re-probed on the staged int4 kernel (int4 group 128, 1 and 16 tokens of the five
# GEMMs, docs/measured/h200-2026-11-29-woq-finalize/woq_gemm_probe_ksplit.json): the rule's split is the fastest at
# all ten points (16 tokens of Qwen3-30B-A3B GEMM1 / GEMM2: 58.6 / 37.8 us at one slice, 66.7 / 52.7 at two). The
# digits tile at every split (bench/woq_digits_probe.py, docs/measured/h200-2026-12-01-digits-wait/probe_ksplits.json):
# the rule's split fastest or within 0.4-1.4 us at 1-32 tokens (Qwen3-30B-A3B GEMM2 at 1 token 10.0 us at one slice,
# 10.4 at the rule's two).
def woq_decode_k_split_rule(call: GemmCall, rows: RowCount) -> int:
    k_split = 1
    while k_split < 8 and ctas_at_most(call, rows, decode_column_blocks(call, k_split), call.sm_count):
        k_split *= 2
    return k_split


# Weight-only decode form: the int4 codes forms (woq_int4_staged) stage a chunk's token rows in shared memory
# (gemm/woq_decode.cu, woq_decode_int4_staged_kernel: one wait per 3-4 KB of weights a warp instead of one per KB)
# wherever the rows fit it, else read them into a register ring (woq_decode_int4_codes_kernel; group 64 there takes
# the first decode kernel). H200, W4A16 layers
# at 1 and 16 tokens: 6-19% faster staged, except Mixtral-8x7B's GEMM2 at 8-row chunks, whose 229 KB of rows did not
# fit and ran slower in windows (docs/performance.md, "The staged int4 decode kernel").
def woq_decode_tile_rule(call: GemmCall, rows: RowCount, k_split: int) -> str:
    if woq_digits_rule(call, rows, k_split):
        return "digits"
    most = woq_staged_rows(call, k_split)
    if most == 0:
        return "none"
    # a chunk's rows, min(8, tokens * top_k), at most `most`
    if most >= DECODE_TOKENS or rows.rows_below(most + 1):
        return "staged"
    return "stagedc4" if woq_staged_cluster_rule(call) else "none"


# Where a chunk's token rows do not fit one CTA (long K: Mixtral-8x7B's GEMM2, k 14336, holds 3 of a chunk's 8 rows),
# the staged kernel in clusters of four CTAs along K, each staging its quarter of the rows, at K split 1 a CTA (the
# cluster's four CTAs are the split; woq_tactic), sm90 (clusters). H100, W4A16 and W4AFP8 (static) layers, graph replay,
# GEMM2 forced onto it beside the plan (the register-ring kernel, K split 2 at 2 tokens, 1 from 3), us
# (docs/measured/h100-2026-12-07-s36/call4): Mixtral-8x7B W4A16 at 2 / 3 / 4 / 8 / 16 / 32 tokens 135.3 / 222.4 /
# 227.3 / 298.2 / 337.4 / 417.6 against 139.5 / 244.0 / 246.8 / 317.5 / 361.1 / 478.6 (0.87-0.97x), W4AFP8 138.3 /
# 225.5 / 223.4 / 294.2 / 335.7 / 423.1 against 142.5 / 245.5 / 247.6 / 313.2 / 358.8 / 486.2 (0.87-0.97x).
def woq_staged_cluster_rule(call: GemmCall) -> bool:
    return call.sm >= 90 and woq_staged_rows(call, 1, STAGED_CLUSTER_PARTS) >= DECODE_TOKENS


# Weight-only decode on token digits (the digits tile: gemm/woq_decode_digits.cu on the rows' token digits, in place
# of the staged tile at its K split) where a chunk's digits fit and the average rows per expert is at most 3, on
# layers of 64 experts or more, to 2 on layers of 32 or more, or up to 4 rows in all. H200, the W4A16 bench GEMMs (int4, group 128, zeros) at 1-128
# tokens, both forms in CUDA graphs with L2 flushed, the digits step included (bench/woq_digits_probe.py,
# docs/measured/h200-2026-12-01-woq-digits/): Mixtral-8x7B 1.14-1.20x faster at 2-4 rows and 0.87x at 8 (chunks of
# 2-3 rows take two mmas a step where the staged kernel's two fill its tile at any count); Qwen3-30B-A3B's GEMM1
# 1.06-1.14x and GEMM2 1.04-1.08x at 4-32 tokens (GEMM2 0.93x at 1-2 tokens, where the step's launch is a tenth of
# its 9 us), 0.84-0.95x from 64; DeepSeek-V2-Lite 0.99-1.09x up to 16 tokens, 0.88-1.02x from 32. With the digits
# made by the expansion and the activation (token_digits=fused), the whole layers with both GEMMs forced onto the tile
# beside the rule then (2 rows), two rounds, graph replay, us (docs/measured/h200-2026-12-01-digits-three-rows):
# 3 rows, DeepSeek-V2-Lite at 32 tokens 122.3 / 121.3 against 128.5 / 128.1 and Qwen3-30B-A3B at 48 tokens 136.5 /
# 137.0 against 145.9 / 144.9; past it slower: 4-4.5 rows, Qwen3-30B-A3B at 64 tokens 155.0 / 154.3 against 152.3 /
# 150.9, DeepSeek-V2-Lite at 48 tokens 145.3 / 144.6 against 140.4 / 140.0. This rule's plan against both GEMMs forced
# onto the staged tile: Qwen3-30B-A3B at 33 / 40 / 48 tokens 118.1-118.9 / 128.8-129.5 / 137.9 against 133.5-134.4 /
# 140.9-142.1 / 145.7-146.3, DeepSeek-V2-Lite at 22 / 27 / 32 tokens 108.8-109.1 / 114.7-115.4 / 122.7-123.0 against
# 122.8-123.3 / 127.8-127.9 / 130.5-130.6. The bound is on the average rounded up (RowCount.avg_at_most): at 3.5 rows
# (Qwen3-30B-A3B 56 tokens, DeepSeek-V2-Lite 37) the digits tile was 2.4% faster, at 4 rows 2% slower, and both are 4.
# Layers of 32-63 experts take the tile to 2 average rows per expert. Groups of 64 (GPT-OSS-20B: 32 experts, k 2880),
# the layer against both GEMMs forced onto each tile (docs/measured/h200-2026-12-01-digits-group64, ab_call1.txt,
# ab_call8.txt): 1 token (4 rows in all) 39.7 against 49.1 staged; 4 tokens level (111.2 / 111.5 against 110.4 /
# 111.5), 5-12 tokens (0.6-1.5 rows) 2-8% faster (6: 119.1 / 119.2 against 129.1 / 128.7; 8: 141.1 / 139.1 against
# 148.4 / 145.6; 12: 175.9 / 175.3 against 179.9 / 179.7), 16 level (192.8 / 193.2 against 191.7), then slower (24:
# 219.0 against 217.5; 32: 237.5 against 226.8).
# MXFP4 (WFP4A16, where the alternative is the register-ring kernel: the staged one takes int4 only) as int4. On the
# stored form (before woq.mxfp4_quarters) the tile took 64+ experts to 1 average row only: H200, WFP4A16 layers, graph
# replay, the plan with int4's bounds (both GEMMs on the tile, but Mixtral-8x7B's GEMM2 past 1 token, whose 8-row chunks
# do not fit) against the ring kernel's plan, 2-3 alternated rounds, us (docs/measured/h200-2026-12-03-mxfp4-digits):
# GPT-OSS-20B (32 experts) at 1 / 2 / 4 / 8 / 12 / 16 tokens 51.2-51.9 / 72.7-73.3 / 112.5-114.9 / 142.1-142.5 /
# 186.4-187.3 / 204.5-212.0 against 61.6-63.0 / 91.6-93.5 / 140.9-143.0 / 171.1-172.7 / 217.6-217.8 / 226.1-228.6;
# Mixtral-8x7B at 1 / 2 119.8-122.7 / 194.4-199.7 against 123.4-125.6 / 201.9-202.8; DeepSeek-V2-Lite (64) at 1 / 2 / 4
# / 8 37.1-37.4 / 50.0-51.7 / 74.3-76.4 / 109.3-109.6 against 38.8-39.1 / 53.5-54.4 / 80.3-81.0 / 113.7-114.1;
# Qwen3-30B-A3B (128) at 1 / 2 / 4 / 8 / 16 35.0-35.2 / 45.7-46.1 / 64.4 / 94.3-94.7 / 142.6-142.8 against 34.9-35.2 /
# 46.4-47.0 / 67.4-67.6 / 97.8-99.2 / 141.5-141.7. At 2 rows (rounded up) Qwen3-30B-A3B lost, 24 / 32 tokens 171.0 /
# 189.6-190.8 against 164.9 / 175.5, where DeepSeek-V2-Lite won 1-4%, 12 / 16 tokens 131.0-132.7 / 151.8-152.4 against
# 133.0-134.7 / 156.6-158.1 (given up here); at 3 both lost, Qwen3-30B-A3B at 48 229.4 against 196.4, DeepSeek-V2-Lite
# at 24 / 32 175.4-177.1 / 205.2-208.0 against 166.2-167.6 / 178.8-180.5.
# On the quarters form, int4's bounds: H100, WFP4A16 layers, graph replay, two alternated rounds, the plan at int4's 3
# rows an expert on 64+ experts against 1 row, which the stored form's measurement had set (H200, 2026-12-03: at 2-3
# rows the stored form lost up to 17%), us (docs/measured/h100-2026-12-06-s22-mxfp4-quarters/call2/band.txt):
# DeepSeek-V2-Lite at 12 / 16 / 24 / 32 tokens 123.1-123.6 / 144.2-144.4 / 163.1-163.4 / 182.4-185.7 against 145.8-147.4
# / 175.8-176.4 / 185.1-185.2 / 201.2-201.7, Qwen3-30B-A3B at 24 / 32 151.4-152.7 / 167.0-167.8 against 180.4-181.6 /
# 190.5-191.1; at 1-8 tokens (and Qwen3-30B-A3B to 16), where both plans take the tile, within 1%.
# In 16-row tiles (the quarters form's since 2026-12-07), MXFP4 on layers of fewer than 64 experts takes the tile to 4
# average rows per expert, whatever its rows in all: int4's bounds there were set against the staged tile, MXFP4's
# alternative is the register-ring kernel. H100, WFP4A16 layers, graph replay, one process, GEMM1 (and GEMM2 where its
# chunks fit) forced onto the tile at K split 1 beside the plan then, us (docs/measured/h100-2026-12-07-s38/call3):
# GPT-OSS-20B (32 experts) at 24 / 32 tokens (3 / 4 rows) 226.2 / 257.8 against 297.1 / 304.0, Mixtral-8x7B (8) GEMM1
# at 4 / 16 tokens (1 / 4 rows) 261.5 / 422.3 against 330.0 / 451.4, then at 24 / 32 (6 / 8 rows) 538.1 / 582.8
# against 535.8 / 573.2.
DIGITS_MAX_AVG_ROWS = 3
DIGITS_MANY_EXPERTS = 64
DIGITS_FEW_ROWS = 4
DIGITS_MID_EXPERTS = 32
DIGITS_MID_MAX_AVG_ROWS = 2
DIGITS_MXFP4_MAX_AVG_ROWS = 4


def woq_digits_rule(call: GemmCall, rows: RowCount, k_split: int) -> bool:
    most = woq_digits_rows(call, k_split)
    fits = most > 0 and (most >= DECODE_TOKENS or rows.rows_below(most + 1))  # a chunk's rows, min(8, tokens * top_k)
    if call.woq == "mxfp4" and call.experts < DIGITS_MANY_EXPERTS:
        return fits and rows.avg_at_most(DIGITS_MXFP4_MAX_AVG_ROWS)
    few_per_expert = rows.avg_at_most(DIGITS_MAX_AVG_ROWS)
    few_rows = rows.rows_below(DIGITS_FEW_ROWS + 1)
    experts_fit = rows.avg_at_most(digits_experts_max_avg_rows(call))
    return fits and few_per_expert and (few_rows or experts_fit)


def digits_experts_max_avg_rows(call: GemmCall) -> int:
    """The most average rows per expert (rounded up) the digits tile takes by the layer's experts, beside its 4 rows in
    all: 3 on 64 or more, 2 on 32-63, none below."""
    if call.experts >= DIGITS_MANY_EXPERTS:
        return DIGITS_MAX_AVG_ROWS
    return DIGITS_MID_MAX_AVG_ROWS if call.experts >= DIGITS_MID_EXPERTS else 0


def woq_int4_codes(call: GemmCall) -> bool:
    """The weight-only GEMM's int4 codes forms on the ring kernel (gemm/woq.cuh int4_codes_fit): int4 weights
    with one scale per row or per 128 k, and whole 128-k batches."""
    return call.woq == "int4" and call.woq_group in (0, 128) and call.k % 128 == 0


def woq_int4_staged(call: GemmCall) -> bool:
    """The int4 codes forms on the staged and digits kernels (gemm/woq.cuh int4_staged_fit): the ring kernel's, and
    one scale per 64 k with k a multiple of 64 (GPT-OSS-20B's 2880 at group 64)."""
    return woq_int4_codes(call) or (call.woq == "int4" and call.woq_group == 64 and call.k % 64 == 0)


# gemm/woq_decode.cu's staged kernel: the shared memory of a chunk's token rows, 16-bit (e4m3 ones are stored
# converted), each K slice's rows padded by 64 bytes, and 256 bytes of zeros; at most 104 KB (two CTAs an SM). Its
# stagedc4 form splits K over the STAGED_CLUSTER_PARTS CTAs of a cluster, each holding its part's slices.
STAGED_TOKEN_BUDGET = 104 * 1024
STAGED_TOKEN_PAD = 64
STAGED_TOKEN_ZEROS = 256
STAGED_CLUSTER_PARTS = 4


def woq_staged_rows(call: GemmCall, k_split: int, parts: int = 1) -> int:
    """The most token rows a chunk may have for the staged kernel at `k_split` slices a CTA, K in `parts` CTAs (0
    where it does not take `call`): gemm/woq_decode.cu staged_smem within kTokenBudget."""
    if not woq_int4_staged(call):
        return 0
    slice_k = -(-min(call.k, decode_k_slice(call.k, parts * k_split)) // 128) * 128  # whole batches (k % 128 == 64)
    per_row = k_split * (slice_k * 2 + STAGED_TOKEN_PAD)
    return max(0, min(DECODE_TOKENS, (STAGED_TOKEN_BUDGET - STAGED_TOKEN_ZEROS) // per_row))


# gemm/woq_decode_digits.cu: a token row's digits take MB_TOKEN_DIGITS_BATCH_BYTES per 128-k group in shared memory
# (each K slice's rows at slice 0's length; k % 128 == 64: a half group at K's end), and 16 bytes of zeros; the
# staged kernel's budget.
DIGITS_GROUP_BYTES = 400
DIGITS_ZEROS = 16
# common/row_scale_digits.cuh: the digits of rows quantized by their own FP8 scale take a row a block, 32 warps of
# four 128-column groups at most
ROW_SCALE_DIGITS_MAX_COLS = 16384


# int8 weights take the digits tile as int4 does (its bands: woq_digits_rule), read as stored: no instruction widens
# them. H100, W8A16 layers (per-channel scales), graph replay, two rounds, main's plan (int8's register decode kernel)
# against this one, us (docs/measured/h100-2026-12-05-s19/call4): at 1 / 4 / 16 tokens Qwen3-30B-A3B 33.3-33.5 /
# 82.7-82.9 / 176.9-177.9 against 30.0-30.5 / 68.2-68.7 / 160.4-161.0, DeepSeek-V2-Lite 38.4-39.0 / 96.3-97.2 /
# 205.9-206.0 against 34.0-34.2 / 87.0-87.1 / 186.0-186.2, GPT-OSS-20B 65.6-65.8 / 189.3-191.9 / 313.7-314.4 against
# 58.4-58.8 / 175.2-176.1 / 303.9-304.8, Mixtral-8x7B at 1 token 154.0 against 146.7-147.1 (its 4 and 16 tokens not on
# the tile: level).
def woq_digits_weights(call: GemmCall) -> bool:
    """The weights the digits kernel takes (gemm/woq.cuh digits_fit): the staged kernel's int4 forms, MXFP4 with k a
    multiple of 64 (GPT-OSS-20B's 2880), and int8 with one scale per row and k a multiple of 64 or per 128 k."""
    int8 = call.woq == "int8" and ((call.woq_group == 0 and call.k % 64 == 0)
                                   or (call.woq_group == 128 and call.k % 128 == 0))
    return woq_int4_staged(call) or (call.woq == "mxfp4" and call.k % 64 == 0) or int8


def woq_digits_rows(call: GemmCall, k_split: int) -> int:
    """The most token rows a chunk may have for the digits kernel at `k_split` (0 where it does not take `call`):
    gemm/woq_decode_digits.cu digits_smem within kTokenBudget."""
    if not woq_digits_weights(call):
        return 0
    per_row = k_split * -(-min(call.k, decode_k_slice(call.k, k_split)) // 128) * DIGITS_GROUP_BYTES
    return max(0, min(DECODE_TOKENS, (STAGED_TOKEN_BUDGET - DIGITS_ZEROS) // per_row))


# Weight-only mma tile: 64 token rows up to 64 average rows per expert, else 128 on the sm80 entry; on sm90, where the
# tiles run only below the dequantized band (woq_kernel_rule), 64 throughout. H200, WFP4A16 layers, graph replay, both
# GEMMs forced onto mma 64x128 against the 128-row tile the rule took then, at 128 / 160 average rows
# (docs/measured/h200-2026-12-02-woq-dequantize-rows, call 5): GPT-OSS-20B 1109 / 1368 against 1180 / 1498 us,
# Mixtral-8x7B 2050 / 2224 against 2183 / 2483, Qwen3-30B-A3B 906 / 1106 against 959 / 1190, DeepSeek-V2-Lite 808 /
# 954 against 847 / 1036.
WOQ_NARROW_MAX_AVG_ROWS = 64


def woq_mma_tile_rule(call: GemmCall, rows: RowCount) -> str:
    return "64x128" if call.entry == "sm90" or rows.avg_at_most(WOQ_NARROW_MAX_AVG_ROWS) else "128x128"


def woq_tactic(call: GemmCall, rows: RowCount) -> GemmTactic:
    """The weight-only rules above, in order, for one GEMM at one token count."""
    kernel = woq_kernel_rule(call, rows)
    if kernel == "decode":
        k_split = woq_decode_k_split_rule(call, rows)
        tile = woq_decode_tile_rule(call, rows, k_split)
        return GemmTactic("decode", tile, 1 if tile == "stagedc4" else k_split, decode_launch_rule(call), "plain")
    if kernel == "mma":
        return GemmTactic("mma", woq_mma_tile_rule(call, rows), 0, "plain", "plain")
    if woq_mixed_input(call):
        return GemmTactic("wgmma", woq_wgmma_tile_rule(call, rows), 0, "plain", "plain")
    # the 16-bit wgmma GEMM on the dequantized weights: row-major, plain store and launch
    dense = replace(call, woq="none", woq_group=0, itemsize=2, weights_blocked=False, epilogue="store")
    return GemmTactic("wgmma", wgmma_tile_rule(dense, rows), 0, "plain", "plain")
