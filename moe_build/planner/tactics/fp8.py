"""The FP8 GEMM's tactic (e4m3 operands with rowwise or block-128 scales): its rules, each under a comment quoting its
condition and the measurement behind it, and `fp8_tactic`, which applies them in order."""
from __future__ import annotations

from .decode_kernel import ctas_at_most, decode_column_blocks, decode_k_slice
from .launch import decode_launch_rule, output_l2_rule, wgmma_launch_rule
from .rows import RowCount
from .tactic import GemmCall, GemmTactic


# FP8 kernel (bench/fp8_tactics_probe.py, H200, the bench shapes' GEMMs at 1 and 16 tokens, L2 flushed):
# rowwise scales kept the decode kernel to 16 average rows per expert (6 since 2026-11-30, below) and 255 rows
# in all (16 tokens, 32-128 rows: Qwen3-30B-A3B GEMM1 72 vs 78 us on the best wgmma tile, GEMM2 42 vs 52,
# DeepSeek-V2-Lite GEMM1 88 vs 95, Mixtral-8x7B GEMM1 239 vs 272; from 2048 rows the wgmma tiles were measured
# alone); block-128 scales leave it from 64 rows in all (its per-block scale loads cost more: 16 tokens of
# Qwen3 GEMM1 80 vs 74 on pingpong 64x128, GEMM2 55 vs 44, DeepSeek-V2-Lite 96 vs 90, while Mixtral's 32
# rows stay on decode, 257 vs 271). Where there is no FP8 wgmma kernel (the sm80 entry: SM 8.9 runs the
# decode kernel only; the mma tiles have no FP8 form) the decode kernel runs at every count. GEMM2 with the
# finalize epilogue takes the same thresholds, but with fast accumulation and K up to 4096 it leaves the decode kernel
# past 1 row (FP8_FINALIZE_DECODE_MAX_AVG_ROWS below, measured on the finalize). Rowwise scales leave it past 6 average
# rows per expert, where its 8-row chunks begin to read an expert's weights twice: H200, both GEMMs forced onto pingpong
# 64x128 beside the rule's decode kernel, the whole layer, two rounds (docs/measured/h200-2026-11-30-fp8-decode-band):
# Mixtral-8x7B at 20 / 24 / 28 / 40 / 48 tokens (5 / 6 / 7 / 10 / 12 rows) 348.5-350.8 / 368.6-374.7 / 411.4-415.7 /
# 541.3-548.3 / 560.4-572.8 us on decode, 368.9-369.1 / 376.3 / 368.8-370.4 / 363.8-364.7 / 361.4-362.2 on the tiles;
# GPT-OSS-20B at 48 tokens (6 rows) 242.0-242.2 against 222.7-222.9, past it (49-63 tokens) now on the tiles too.
FP8_ROWWISE_DECODE_MAX_AVG_ROWS = 6
FP8_ROWWISE_DECODE_ROWS = 256
# A fast-accumulating finalize GEMM2 of K up to 4096 (FP8_FINALIZE_C2_MAX_K) leaves the decode kernel past 1 average row
# an expert (ceil), for pingpong64x128c2 (FP8_FINALIZE_C2_MAX_AVG_ROWS). H200, whole layers, graph replay, mean us of
# two rounds (docs/measured/h200-2026-12-04-fp8-finalize-decode-band). GEMM2 forced beside the plan's decode kernel,
# decode / c2: Qwen3-30B-A3B at 8 / 16 / 24 tokens (1 / 1 / 2 rows) 81.8 / 120.8 / 137.6 against 83.7 / 119.5 / 135.6,
# DeepSeek-V2-Lite at 8 / 16 / 32 (1 / 2 / 3) 96.3 / 129.2 / 151.3 against 98.0 / 128.6 / 150.1, GPT-OSS-20B at 8 / 16 /
# 32 / 48 (1 / 2 / 4 / 6) 144.0 / 195.7 / 228.8 / 237.0 against 148.4 / 194.2 / 225.3 / 230.3; Mixtral-8x7B's GEMM2 (K
# 14336) at 1 / 2 / 4 rows 233.5 / 307.4 / 346.4 against 247.1 / 316.4 / 349.9. This band against the old one set in the
# process, the points that move, dynamic and static input scales: 0.966-1.000x, GPT-OSS-20B with static scales at 16
# tokens 1.011x (192.5 against 190.4).
FP8_FINALIZE_DECODE_MAX_AVG_ROWS = 1
FP8_BLOCK_DECODE_ROWS = 64
# Block-128 on a GPU of slower memory (peak DRAM rate at most FP8_BLOCK_SLOW_MEMORY: an H100's 3.35 TB/s, not an H200's
# 4.8) keeps the decode kernel past 64 rows on layers of 64 experts or more, to 4 average rows an expert (ceil) and 512
# rows in all. H100, block-128 layers, both GEMMs forced onto the two-CTA decode tile (the tactic the decode rules then
# give) beside the plan's pingpong 64x128 tiles, two rounds, graph replay, us, plan / decode
# (docs/measured/h100-2026-12-06-s28, call4 and call5): Qwen3-30B-A3B at 8 / 12 / 16 / 24 / 32 / 48 / 64 tokens (0.5-4
# rows) 108.5, 108.8 / 129.2, 128.3 / 156.7, 159.3 / 184.1, 184.6 / 197.7, 198.0 / 220.1, 219.7 / 224.2, 223.3 against
# 102.3, 102.1 / 122.1, 122.6 / 149.5, 148.7 / 176.1, 175.6 / 188.4, 188.8 / 209.8, 209.7 / 212.8, 213.7, at 96 (6
# rows) level, at 128 (8) 250.0, 248.0 against 235.2, 234.1; DeepSeek-V2-Lite at 12 / 16 / 24 / 32 tokens (1.1-3 rows)
# 148.1, 148.1 / 177.5, 177.9 / 190.5, 190.4 / 206.8, 206.4 against 146.0, 145.0 / 176.3, 177.1 / 188.7, 188.9 / 201.6,
# 201.6, at 48 (4.5) level, at 64 (6) 211.4, 210.5 against 213.8, 213.3; DeepSeek-V3 at 8 / 16 (0.25-0.5 rows)
# 698.8, 698.5 / 1022.9, 1025.5 against 681.5, 681.9 / 1007.4, 1007.0. GPT-OSS-20B (32 experts) lost 8-10% at 16-32
# tokens (256.3, 257.4 against 282.6, 283.2 at 16). On an H200 (2026-12-02, docs/experiments.md, "The block-128 decode
# kernel at two CTAs an SM past its 64-row band") the tile lost at every such point but two, where it was level; again
# on 2026-12-06 after the finalize tiles of 2026-12-04 (docs/measured/h200-2026-12-06-s29/call1), plan / decode, us:
# Qwen3-30B-A3B at 16 / 32 / 64 tokens 121.1 / 147.1 / 167.1 against 125.0 / 156.6 / 177.0, DeepSeek-V2-Lite at 16 / 32
# / 42 136.9 / 155.0 / 158.4 against 142.8 / 161.8 / 165.7, DeepSeek-V3 at 16 / 32 / 64 750.3 / 993.5 / 1294.4 against
# 813.1 / 1130.0 / 1555.4. The H100's points no call had timed, 2026-12-07 (docs/measured/h100-2026-12-07-s30, two
# rounds), plan (decode) / pingpong 64x128: DeepSeek-V2-Lite at 36 / 40 / 42 tokens 209.5, 210.3 / 213.6, 214.5 /
# 210.7, 210.0 against 213.6, 214.6 / 215.8, 216.0 / 214.9, 214.2; DeepSeek-V3 at 24 / 32 / 48 1331.9, 1332.5 / 1434.6,
# 1434.4 / 1721.8, 1721.4 against 1370.9, 1368.7 / 1465.8, 1464.2 / 1727.2, 1728.2, at 64 (512 rows) 1947.6, 1946.0
# against 1920.9, 1921.4 (1.3% slower, one point of one layer at the edge).
FP8_BLOCK_SLOW_MEMORY = 4 * 10**12
FP8_BLOCK_WIDE_BAND_MIN_EXPERTS = 64
FP8_BLOCK_WIDE_BAND_MAX_AVG_ROWS = 4
FP8_BLOCK_WIDE_BAND_ROWS = 512


def fp8_kernel_rule(call: GemmCall, rows: RowCount) -> str:
    if call.entry != "sm90":
        return "decode"
    if call.fp8 == "block128":
        return "decode" if rows.rows_below(FP8_BLOCK_DECODE_ROWS) or fp8_block_wide_band(call, rows) else "wgmma"
    # rowwise: decode to avg rows <= 6 (a short fast finalize: <= 1) and rows < 256
    most = FP8_FINALIZE_DECODE_MAX_AVG_ROWS if short_fast_finalize(call) else FP8_ROWWISE_DECODE_MAX_AVG_ROWS
    few = rows.avg_at_most(most) and rows.rows_below(FP8_ROWWISE_DECODE_ROWS)
    return "decode" if few else "wgmma"


# peak DRAM rate <= FP8_BLOCK_SLOW_MEMORY, experts >= 64, avg rows <= 4 and rows <= 512: block-128 stays on decode
def fp8_block_wide_band(call: GemmCall, rows: RowCount) -> bool:
    return (call.memory_bytes_per_s <= FP8_BLOCK_SLOW_MEMORY and call.experts >= FP8_BLOCK_WIDE_BAND_MIN_EXPERTS
            and rows.avg_at_most(FP8_BLOCK_WIDE_BAND_MAX_AVG_ROWS) and rows.rows_below(FP8_BLOCK_WIDE_BAND_ROWS + 1))


# FP8 decode K slices, rowwise scales: 1, doubled while each warp's K slice stays at least 1024 bytes, up to 8.
# bench/fp8_tactics_probe.py, H200, L2 flushed by a read (docs/measured/h200x2-2026-11-28-tiles-decode): 1 token
# of Mixtral GEMM1 (K = 4096) 69.3 / 66.4 / 64.4 / 68.1 us at 1 / 2 / 4 / 8 slices, GEMM2 (K = 14336) 37.7 at 4
# and 38.3 at 8 (the rule's 8; 59 unsplit), DeepSeek-V2-Lite GEMM1 (K = 2048) 19.7 / 15.8 at 1 / 2; 16 tokens of
# Mixtral GEMM1 234.0 / 230.7 / 224.9 at 1 / 2 / 4; a slice under 1024 bytes lost everywhere (Qwen3-30B-A3B
# GEMM2, K = 768: 44.9 us unsplit, 60.0 at 2 slices of 384).
# Block-128 scales split less: doubled only while the CTAs (non-empty experts times column blocks) are fewer than
# two per SM and each slice stays at least 2048 bytes (each slice loads its own scale rows). Its first probe
# (written L2 flush, docs/measured/h200-2026-11-28-fp8): 1 token of Qwen3 GEMM1 13.7 / 15.9 / 16.7 us at 1 / 2 /
# 4 slices, Mixtral GEMM1 74.3 / 73.3 / 81.0; and in the layer the rowwise rule cost Mixtral-8x7B block-128 7 us
# at 1 token and 52 at 16 (moe-build bench, docs/measured/h200-2026-11-28-fp8-tiles/bench_fp8.json).
# Nor do rowwise scales double to slices under 2048 bytes where the CTAs fit in one resident wave (two an SM) and
# the doubled ones would fill less than half of a second wave, which then streams on few SMs after the
# first. H200, `moe-build bench --quant fp8` with each K split forced, two rounds each, graph replay, layer us
# (docs/measured/h200-2026-11-30-fp8-decode-wave): GPT-OSS-20B at 1 token, GEMM1 (K 2880; 180 CTAs unsplit, 360
# at 2 slices) 47.1-48.2 unsplit against 49.0-50.2 at 2 slices, at 2 tokens GEMM2 70.4-71.3 against 74.6-74.7;
# Qwen3-30B-A3B at 2 tokens, GEMM1 (K 2048) 37.1-38.0 against 38.9-39.0. Longer slices split on: DeepSeek-V3 at 1
# token, GEMM1 (K 7168; 256 CTAs unsplit, 512 at 2) 124.6-125.5 unsplit against 113.2-114.7 at 4 slices;
# Mixtral-8x7B at 3 tokens, GEMM2 (K 14336; 192 CTAs unsplit, 384 at 2) 237.0-239.7 against 228.0-228.8 at 8.
# And a rowwise GEMM2 with the finalize epilogue stops short of slices of the minimum (1024 bytes) where its unsplit
# CTAs already fill a resident wave. H200, `moe-build bench --quant fp8` with GEMM2 forced unsplit beside the rule's
# 2 slices, two rounds, graph replay, layer us (docs/measured/h200-2026-11-30-fp8-gemm2-unsplit): DeepSeek-V3
# (K 2048; 8 experts x 56 column blocks = 448 CTAs at 1 token) at 1 / 2 / 8 / 16 / 24 tokens 107.2-108.8 /
# 173.0-174.2 / 502.2-504.6 / 727.0-740.6 / 999.7-1001.5 unsplit against 112.6-114.4 / 178.1-181.9 / 514.0-514.7 /
# 775.3-794.6 / 1073.6-1075.1, at 4 tokens 325.3-325.8 against 322.8-323.9. Longer slices keep splitting: GPT-OSS-20B
# (K 2880, slices of 1440 bytes) unsplit at 1 / 4 tokens 48.4-49.3 / 118.0 against 43.6-43.7 / 113.6-114.8.
FP8_DECODE_MIN_SLICE_BYTES = 1024
FP8_DECODE_WAVE_SLICE_BYTES = 2048
FP8_BLOCK_DECODE_MIN_SLICE_BYTES = 2048


def fp8_decode_k_split_rule(call: GemmCall, rows: RowCount) -> int:
    block = call.fp8 == "block128"
    min_slice = FP8_BLOCK_DECODE_MIN_SLICE_BYTES if block else FP8_DECODE_MIN_SLICE_BYTES
    k_split = 1
    while k_split < 8 and (next_slice := call.k // (2 * k_split)) >= min_slice:
        column_blocks = decode_column_blocks(call, k_split)
        if block and not ctas_at_most(call, rows, column_blocks, 2 * call.sm_count - 1):
            break
        if (not block and next_slice < FP8_DECODE_WAVE_SLICE_BYTES
                and short_second_wave(call, rows, column_blocks, decode_column_blocks(call, 2 * k_split))):
            break
        if not block and finalize_wave_of_whole_slices(call, rows, column_blocks, next_slice):
            break
        k_split *= 2
    return k_split


# FP8 decode form, block-128 scales: two CTAs an SM ("twocta": the kernel held to 128 registers, 36-124 bytes of
# spills) where the launch has more CTAs (non-empty experts x column blocks) than SMs, else one (166-182 registers:
# fewer CTAs than SMs leave nothing for a second one). H200, block-128 layers, graph replay, two rounds, every decode
# launch at two CTAs an SM against one, us (docs/measured/h200-2026-12-01-fp8-block-two-ctas): DeepSeek-V3 at 1 / 2 / 4
# tokens 123.6-125.6 / 197.3-198.0 / 352.1-352.8 against 132.9-133.7 / 215.9-216.7 / 384.1-389.5; Qwen3-30B-A3B at 2 /
# 4 tokens 35.4-37.4 / 62.4-63.4 against 42.4-46.6 / 69.3-71.6; DeepSeek-V2-Lite at 2 / 8 45.0-45.6 / 101.4-101.9
# against 53.7-54.7 / 117.2-117.9; Mixtral-8x7B at 16 391.6-391.7 against 397.8-404.3; but at 1 token, where GEMM1 has
# 96 and 132 CTAs, Qwen3-30B-A3B 29.5-30.0 against 27.3-27.6 and DeepSeek-V2-Lite 35.4-36.3 against 32.8 (one point
# runs against the rule: GPT-OSS-20B at 4 tokens, 138.3-138.6 against 133.8-136.0).
# A GEMM2 with the finalize epilogue keeps one CTA an SM where its warps' K slices are longer than 4096 bytes. H200,
# block-128 layers, GEMM2 alone forced back to one CTA an SM beside the plan, graph replay, us
# (docs/measured/h200-2026-12-02-fp8-block-bench-and-bands): Mixtral-8x7B (K 14336 in 2 slices of 7168) at 4 / 6 / 8 /
# 16 tokens 276.5, 278.8 / 322.5, 320.0 / 384.0 / 386.8 at one CTA against 288.3, 289.3 / 329.4, 328.8 / 391.5 / 390.5;
# GPT-OSS-20B (one slice of 2880) 3-4 us faster at one CTA at 4-5 tokens but 2-6 us slower at 2, 8 and 12; the
# shorter slices 3-32 us slower at one CTA at 2-6 tokens (Qwen3-30B-A3B 768, DeepSeek-V2-Lite 1408, DeepSeek-V3
# 2048; level once).
FP8_BLOCK_TWOCTA_MAX_FINALIZE_SLICE_BYTES = 4096


def fp8_block_decode_tile_rule(call: GemmCall, rows: RowCount, k_split: int) -> str:
    # epilogue == finalize and a warp's K slice > FP8_BLOCK_TWOCTA_MAX_FINALIZE_SLICE_BYTES: one CTA an SM
    if call.epilogue == "finalize" and decode_k_slice(call.k, k_split) > FP8_BLOCK_TWOCTA_MAX_FINALIZE_SLICE_BYTES:
        return "none"
    return "none" if ctas_at_most(call, rows, decode_column_blocks(call, k_split), call.sm_count) else "twocta"


def short_second_wave(call: GemmCall, rows: RowCount, column_blocks: int, doubled: int) -> bool:
    """The rowwise decode launch fits in one resident wave (two CTAs an SM) at `column_blocks` per chunk, and at
    the doubled split's `doubled` its CTAs would fill less than half of a second wave."""
    wave = 2 * call.sm_count
    return (ctas_at_most(call, rows, column_blocks, wave)
            and not ctas_at_most(call, rows, doubled, wave) and ctas_at_most(call, rows, doubled, wave + wave // 2))


# finalize epilogue, next slice <= FP8_DECODE_MIN_SLICE_BYTES, CTAs at column_blocks >= one resident wave (2 an SM)
def finalize_wave_of_whole_slices(call: GemmCall, rows: RowCount, column_blocks: int, next_slice: int) -> bool:
    """A finalize GEMM2 whose next halving would leave slices of the minimum, while its CTAs at `column_blocks`
    already fill a resident wave: it stays at this split (DeepSeek-V3's GEMM2, the comment above the constants)."""
    return (call.epilogue == "finalize" and next_slice <= FP8_DECODE_MIN_SLICE_BYTES
            and not ctas_at_most(call, rows, column_blocks, 2 * call.sm_count - 1))


# FP8 wgmma tile: pingpong 64x128 up to 32 average rows per expert, else cooperative 128x128 (same probe:
# 256 tokens of Qwen3 GEMM1, 16 rows, 120 vs 147 us rowwise, DeepSeek-V2-Lite, 24 rows, 112 vs 135; Mixtral
# GEMM1 at 64 rows 293 vs 312 (block: 275 vs 315); 4096 tokens of Qwen3 GEMM1 301 vs 320, Mixtral 2040 vs
# 2695; one loss: Qwen3 GEMM2 rowwise at 4096 tokens, 221 vs 207). Rowwise scales take cooperative 128x192 past
# 128 average rows: it reads a third fewer bytes from L2 per FLOP than 128x128, which at the FP8 rate is what
# limits 128x128 (docs/experiments.md), and still holds the promoted accumulators in registers; at 256 to 1024
# rows it was 5-9% faster than 128x128 on every GEMM measured (Qwen3 GEMM1 266 vs 292 us, GEMM2 210 vs 225,
# Mixtral GEMM1 1917 vs 2016, GEMM2 838 vs 883, DeepSeek-V2-Lite GEMM1 343 vs 369), at 64 rows 2% (Mixtral GEMM1)
# and 24% (GEMM2) slower (docs/measured/h200x2-2026-11-28-tiles-decode). Block-128 scales stay on 128x128: its
# blockwise mainloop has no 192-column form, and in 2x1 clusters it won on two GEMMs and lost on one. The
# finalize epilogue takes the same tiles: at 16-24 rows (Qwen3-30B-A3B and DeepSeek-V2-Lite GEMM2 at 128-384 tokens,
# the whole layer, docs/measured/h200-2026-11-30-fp8-gemm2-unsplit/gemm2_tiles_round*.json) pingpong 64x128 was
# within 2.4 us of the best (2x1 clusters), the cooperative tiles 12-30 us slower.
# With fast accumulation (rowwise scales) pingpong 64x128 holds up to 128 rows: bench/fp8_accumulation_probe.py
# (H200, plain store, L2 flushed; docs/measured/h200-2026-11-29-fp8-fast-accum) DeepSeek-V3 at 4096 tokens, 128
# rows, GEMM1 2605 vs 2894 us on 128x128, GEMM2 1520 vs 1691; Mixtral at 256 tokens, 64 rows, GEMM1 264.5 and
# GEMM2 128.2 the best of the four tiles; past 128 rows it loses to the rule's 128x192 on 6 of 8 GEMMs (GPT-OSS
# GEMM1 at 512 rows 792 vs 601 us, Mixtral GEMM1 at 1024 rows 1996 vs 1785) and wins on 2 by 1-16%. The layers
# (moe-build bench, this bound against 32, one device call, two rounds: tile_rule_ab/summary.txt there) 6-17% faster
# at 10 of the 11 points it moves (Mixtral 512 tokens 532 vs 605 us, Qwen3 1024 240 vs 274, DeepSeek-V3 2048 3095 vs
# 3378), 5.5% slower at one (GPT-OSS 1024 tokens, 128 rows: 394 vs 373).
# Between 33 and 128 rows an expert has two or three 64-row tiles, and a fast-accumulating GEMM at least 5760 columns
# wide runs them in 2x1 clusters, two row tiles on one multicast weight tile (pingpong64x128c2).
# bench/fp8_cluster_probe.py (H200, FP8_PROBE_ROWS=64,128, pingpong64x128 / c2, us;
# docs/measured/h200-2026-11-29-fp8-narrow-c2): the three
# wide GEMMs win at both counts, DeepSeek-V3 GEMM2 (7168 columns) 1208 / 1028 and 1484 / 1297, GPT-OSS GEMM1
# (5760) 158 / 149 and 223 / 188, Mixtral GEMM1 (28672) 330 / 319 and 374 / 372; of the seven narrower ones
# (1536-4096) none wins by more than 5% and four lose 5-44% at one count (DeepSeek-V3 GEMM1 2819 / 3201 at 128
# rows, DeepSeek-V2-Lite GEMM1 107 / 154 at 64, Mixtral GEMM2 210 / 237 at 128). The layers (moe-build bench, this
# rule against pingpong64x128 there, one library, two rounds): GPT-OSS-20B at 1024 tokens 394 / 400 -> 352 / 354
# us, DeepSeek-V3 at 4096 4696 / 4705 -> 4596 / 4599, Mixtral-8x7B at 256 tokens 1% faster, at 512 1-3% slower.
FP8_NARROW_MAX_AVG_ROWS = 32
# Block-128 scales keep pingpong 64x128 to 40 rows: H200, whole layers, both GEMMs forced onto it beside the plan's
# coop 128x128 (docs/measured/h200-2026-12-04-block128-narrow): Mixtral-8x7B 0.84-0.85x at 33-40 rows, 0.87 / 0.90 /
# 0.98 at 44 / 48 / 56; DeepSeek-V3 0.955 / 0.968 / 1.000 at 33 / 36 / 40, then 1.03-1.07x at 44-56.
FP8_BLOCK_NARROW_MAX_AVG_ROWS = 40
FP8_NARROW_C2_MIN_N = 5760
# With fast accumulation a finalize GEMM2 of K up to 4096 takes pingpong64x128c2 at every width from its first wgmma
# rows to 48 an expert: where an expert has one 64-row tile the cluster's two CTAs take two of its column tiles. Whole
# layers, H200, the plan beside the other tile forced, graph replay, mean us of two rounds
# (docs/measured/h200-2026-12-04-fp8-finalize-c2, three calls), c2 / pingpong64x128, dynamic scales at 256 tokens:
# GPT-OSS-20B (K 2880) 221.5 / 227.1 and 227.9 / 230.4, DeepSeek-V2-Lite (1408) 159.3 / 161.5 and 162.2 / 163.8,
# Qwen3-30B-A3B (768) 178.1 / 178.0 and 179.1 / 181.3, DeepSeek-V3 (2048) at 512 1889.5 / 1902.5 and 1937.9 / 1954.1;
# over all 38 points of these four (1-48 rows, dynamic and static scales) 0.975-1.001x. Mixtral-8x7B's GEMM2 (K 14336,
# two waves of long tiles) was not settled: 0.3-3.2% faster in one call, level to 1.9% slower in the next, so long K
# keeps pingpong64x128. Block-128 scales (promoted): 0.99-1.01x, they keep it too.
FP8_FINALIZE_C2_MAX_AVG_ROWS = 48
FP8_FINALIZE_C2_MAX_K = 4096
FP8_FAST_NARROW_MAX_AVG_ROWS = 128
FP8_WIDE_MIN_AVG_ROWS = 129
# With fast accumulation the gated GEMM1 takes pingpong 128x128 from 256 average rows per expert (from 33 where k is at
# least 7168), the finalize GEMM2 pingpong 128x128 in 2x1 clusters from 192; the plain store keeps the tiles above. A
# warpgroup's tile is 128 rows, two 64-row wgmmas on each weight tile it loads, and one warpgroup's epilogue runs under
# the other's mainloop. Whole layers, H200, one GEMM forced onto a tile beside the plan, two rounds, graph replay, us
# (moe-build bench --quant fp8; docs/measured/h200-2026-11-30-fp8-pingpong128, docs/performance.md "FP8 pingpong 128 x
# 128"). GEMM1 on pingpong128x128 at 384-1024 rows faster on every point (Mixtral-8x7B 4096 tokens 2823.5 / 2823.1 ->
# 2598.7 / 2625.0, 2048 tokens 1278.4 / 1305.0 -> 1239.3 / 1273.3, GPT-OSS-20B 4096 963.3 / 917.3 -> 919.9 / 901.9,
# DeepSeek-V2-Lite 4096 557.3 / 554.9 -> 541.8 / 544.0); at 256 rows Qwen3-30B-A3B 534.7 / 538.6 -> 511.7 / 522.6,
# Mixtral 1024 tokens 795.2 / 834.3 -> 804.4 / 820.3, GPT-OSS 2048 496.4 / 490.2 -> 498.0 / 503.8; at 64-128 rows it
# lost 1-6% (Qwen3 2048 tokens 310.7 -> 330.0, Mixtral 256 385.8 -> 406.2) but on DeepSeek-V3's GEMM1 (k 7168): 4096
# tokens (128 rows) 4727.1 / 4674.7 -> 4370.8 / 4327.8, 2048 (64) 3184.7 / 3191.9 -> 3094.0 / 3069.9, 1024 (32)
# 2485.7 / 2495.6 -> 2505.2 / 2505.6. In 2x1 clusters GEMM1 ran within 1% of that but once. GEMM2 on
# pingpong128x128c2 beside the tiles then planned: at 192-384 rows against coop128x192 Mixtral 1024 tokens 813.4 /
# 805.9 -> 778.4 / 768.1, GPT-OSS 2048 499.0 / 499.9 -> 489.4 / 484.7, DeepSeek-V2-Lite 2048 342.6 / 340.6 -> 335.0 /
# 332.9 and 4096 540.9 / 567.6 -> 526.6 / 549.4, Qwen3 4096 507.1 / 501.1 -> 513.2 / 506.4; at 512-1024 rows within
# 0.5% of pingpong128x128 (Mixtral 4096 2591.8 / 2562.4 -> 2596.3 / 2563.3), which had beaten coop128x192 there
# (Mixtral 4096 2823.5 / 2823.1 -> 2724.1 / 2758.4, GPT-OSS 4096 963.3 / 917.3 -> 926.3 / 886.8); below 192 rows
# within 1% of the narrow tiles either way.
FP8_PINGPONG128_GATED_MIN_AVG_ROWS = 256
FP8_PINGPONG128_LONG_K = 7168
FP8_PINGPONG128_FINALIZE_MIN_AVG_ROWS = 192
# The gated GEMM1 on pingpong 128x128 runs in 2x1 clusters (two row tiles of an expert on one multicast weight tile)
# where k is under FP8_PINGPONG128_LONG_K. H100, whole layers, GEMM1 forced onto pingpong128x128c2 beside the plan's
# pingpong128x128, one round, graph replay, us, plan / c2 (docs/measured/h100-2026-12-07-s31, call2), dynamic and
# static input scales: Mixtral-8x7B 1024 tokens (256 rows) 802.2 / 798.4 and 809.9 / 792.6, 2048 1324.8 / 1373.4 and
# 1387.9 / 1253.6, 4096 3008.0 / 2663.6 and 2907.2 / 2507.7, 8192 6349.5 / 5554.9 and 6187.6 / 5394.7; GPT-OSS-20B 2048
# 525.1 / 490.7 and 514.3 / 475.0, 4096 932.6 / 847.9 and 919.1 / 825.4, 8192 1844.6 / 1596.1 and 1758.1 / 1504.2;
# DeepSeek-V2-Lite 3072 436.9 / 433.3 and 453.2 / 433.5, 4096 524.7 / 490.0 and 510.6 / 486.0, 8192 996.4 / 921.3 and
# 946.2 / 861.2; Qwen3-30B-A3B 4096 (256 rows) 467.6 / 473.8 and 466.6 / 470.7, 8192 886.8 / 866.7 and 842.3 / 790.9.
# Slower at 3 of these 24 points: Qwen3-30B-A3B at 4096 by 1.3% / 0.9%, Mixtral-8x7B's dynamic layer at 2048 by 3.7%
# (its static one 9.7% faster); Mixtral-8x7B and GPT-OSS-20B 9-14% faster from 4096 tokens on. The long-k GEMM1 of
# DeepSeek-V3 (k 7168, 40-128 rows) keeps the single CTA: 1280 / 2048 / 4096 tokens 3299.5 / 3284.2, 3704.8 / 3743.8,
# 5012.5 / 5160.7 and 3175.0 / 3178.7, 3613.5 / 3611.1, 4891.4 / 4951.1. Mixtral-8x7B's GEMM1 alone at 4096 tokens
# (plain store, hot; call1's tiles_vs_cublas.py): 1833.3 single, 1742.8 in clusters, cuBLAS's dense e4m3 GEMM of the
# same rows 1512.7. On an H200 (2026-11-30, docs/experiments.md, "FP8 pingpong 128x128 in 2x1 clusters for the gated
# GEMM1") the clusters ran within 1% at 1024-4096 tokens but one round 5% faster.


# rowwise scales, fast accumulation, finalize epilogue, k <= 4096: the short finalize GEMM2 whose decode band
# (FP8_FINALIZE_DECODE_MAX_AVG_ROWS) and clustered narrow tile (FP8_FINALIZE_C2_MAX_AVG_ROWS) were measured
def short_fast_finalize(call: GemmCall) -> bool:
    return (call.fp8 == "rowwise" and call.fp8_accumulation == "fast" and call.epilogue == "finalize"
            and call.k <= FP8_FINALIZE_C2_MAX_K)


# fast accumulation, and gated: avg rows >= 256 -> pingpong128x128c2, or > 32 with k >= 7168 -> pingpong128x128;
# finalize: avg rows >= 192 -> pingpong128x128c2
def fp8_pingpong128_rule(call: GemmCall, rows: RowCount) -> str | None:
    if call.fp8 != "rowwise" or call.fp8_accumulation != "fast":
        return None
    if call.epilogue == "gated":
        if call.k >= FP8_PINGPONG128_LONG_K:
            return None if rows.avg_at_most(FP8_NARROW_MAX_AVG_ROWS) else "pingpong128x128"
        return None if rows.avg_at_most(FP8_PINGPONG128_GATED_MIN_AVG_ROWS - 1) else "pingpong128x128c2"
    if call.epilogue == "finalize" and not rows.avg_at_most(FP8_PINGPONG128_FINALIZE_MIN_AVG_ROWS - 1):
        return "pingpong128x128c2"
    return None


def fp8_wgmma_tile_rule(call: GemmCall, rows: RowCount) -> str:
    fast = call.fp8 == "rowwise" and call.fp8_accumulation == "fast"
    pingpong128 = fp8_pingpong128_rule(call, rows)
    if pingpong128 is not None:
        return pingpong128
    # a short fast finalize: avg rows <= 48 -> pingpong64x128c2
    if short_fast_finalize(call) and rows.avg_at_most(FP8_FINALIZE_C2_MAX_AVG_ROWS):
        return "pingpong64x128c2"
    if rows.avg_at_most(FP8_BLOCK_NARROW_MAX_AVG_ROWS if call.fp8 == "block128" else FP8_NARROW_MAX_AVG_ROWS):
        return "pingpong64x128"
    if fast and rows.avg_at_most(FP8_FAST_NARROW_MAX_AVG_ROWS):
        return "pingpong64x128c2" if call.n >= FP8_NARROW_C2_MIN_N else "pingpong64x128"
    if call.fp8 == "rowwise" and not rows.avg_at_most(FP8_WIDE_MIN_AVG_ROWS - 1):
        return "coop128x192"
    return "coop128x128"


def fp8_tactic(call: GemmCall, rows: RowCount) -> GemmTactic:
    """The FP8 rules above, in order, for one GEMM at one token count (the FP8 GEMM has no mma tiles)."""
    if fp8_kernel_rule(call, rows) == "decode":
        k_split = fp8_decode_k_split_rule(call, rows)
        tile = fp8_block_decode_tile_rule(call, rows, k_split) if call.fp8 == "block128" else "none"
        return GemmTactic("decode", tile, k_split, decode_launch_rule(call), "plain")
    tile = fp8_wgmma_tile_rule(call, rows)
    return GemmTactic("wgmma", tile, 0, wgmma_launch_rule(call, rows, tile), output_l2_rule(call, "wgmma"))
