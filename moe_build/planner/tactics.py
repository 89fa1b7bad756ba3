"""GEMM tactics: how each grouped GEMM runs at each token count, from one table of measured rules.

A tactic names the kernel (decode | mma | wgmma), its tile (or the decode kernel's K slices), how it is
launched and how its outputs are written to L2. The kernel library runs exactly the tactic it is given
(cpp/include/moe_build_kernels.h, mb_gemm_tactic); this module is the only place that chooses one. The
rules read the GEMM's shape and the average rows per expert, ceil(tokens * top_k / experts), so each
GEMM's tactic is a function of the token count: `tactic_bands` turns it into bands of token counts,
which the plan records and the runner looks up per call.

Each rule is one small function under a comment quoting its condition and the measurement behind it
(docs/performance.md has the token sweep that checks the whole table; docs/experiments.md what was tried
and dropped).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

from ..errors import MoeBuildError

KERNELS = ("decode", "mma", "wgmma")
MMA_TILES = ("16x64", "64x128", "128x128")
WGMMA_TILES = ("coop128x256", "pingpong64x256", "pingpong64x128", "pingpong64x256c2", "pingpong64x192c2",
               "coop128x128", "coop128x128c2", "coop128x192", "coop128x192c2", "woq128x16", "woq128x32", "woq128x64",
               "woq128x128", "woq128x256", "woq128x320c2", "pingpong64x128c2", "pingpong128x128",
               "pingpong128x128c2", "woq128x160", "woq128x192", "woq128x224")
FP8_SCALINGS = ("none", "rowwise", "block128")  # the GEMM's FP8 scales (mb_fp8_scaling), none for 16-bit
FP8_ACCUMULATIONS = ("none", "fast", "promoted")  # the FP8 wgmma GEMM's accumulation (mb_fp8_accumulation)
WOQ_KINDS = ("none", "int4", "int8", "mxfp4")  # the weight-only GEMM's stored weights (mb_woq_kind), none otherwise
# The weight-only GEMM's kernels (gemm/woq_abi.cu): decode, and mma.sync tiles of token rows x output columns.
WOQ_MMA_TILES = ("64x128", "128x128")
# The weight-only GEMM's wgmma tiles (gemm/woq_sm90.cu, CUTLASS's mixed-input mainloop): 128 weight rows x 16 to 320
# token rows, the 320-row tile in 2x1 clusters (a TMA box holds at most 256 rows: each CTA of the pair loads half the
# token tile for both); the weight-only GEMM's other wgmma tactics run the 16-bit tiles on its weights dequantized.
WOQ_WGMMA_TILES = ("woq128x16", "woq128x32", "woq128x64", "woq128x128", "woq128x160", "woq128x192", "woq128x224",
                   "woq128x256", "woq128x320c2")
# The FP8 GEMM's wgmma tiles by scaling (gemm/fp8_sm90.cu): the blockwise mainloop's tiles are 128 columns
# wide; the c2 tiles run in 2x1 clusters that multicast their weight tile; pingpong128x128 (a warpgroup's tile two
# 64-row wgmmas) holds no promoted accumulators and runs with fast accumulation only. The rules choose coop128x128,
# pingpong64x128, pingpong64x128c2, coop128x192, pingpong128x128 and pingpong128x128c2 (as measured); the others are
# there to be forced and probed
# (bench/fp8_tactics_probe.py, bench/fp8_cluster_probe.py).
FP8_WGMMA_TILES = {"rowwise": ("coop128x128", "coop128x256", "pingpong64x128", "pingpong64x128c2", "coop128x128c2",
                               "coop128x192", "coop128x192c2", "pingpong128x128", "pingpong128x128c2"),
                   "block128": ("coop128x128", "pingpong64x128", "pingpong64x128c2", "coop128x128c2")}
FP8_FAST_ONLY_TILES = ("pingpong128x128", "pingpong128x128c2")
# The wgmma tiles that only the FP8 GEMM has (its k blocks of 128; the 16-bit kernels' are 64).
FP8_ONLY_TILES = ("coop128x128", "coop128x128c2", "coop128x192", "coop128x192c2", "pingpong64x128c2",
                  "pingpong128x128", "pingpong128x128c2")
K_SPLITS = (1, 2, 4, 8)
# The decode kernel's forms: token rows read where they lie ("none"), first staged in shared memory ("staged": the
# weight-only int4 codes kernel only, woq_staged_rows below), or split into 8-bit digits by a step before the GEMM and
# multiplied on the int8 mma ("digits": the weight-only int4 forms with 16-bit activations, woq_digits_rows below), or
# held to 128 registers a thread, two CTAs an SM ("twocta": the FP8 kernel with block-128 scales,
# fp8_block_decode_tile_rule below).
DECODE_TILES = ("none", "staged", "digits", "twocta")
_DECODE_TILE_PREFIX = {"none": "", "staged": "staged_", "digits": "digits_", "twocta": "twocta_"}
LAUNCHES = ("plain", "after_trigger", "placed")
OUTPUT_L2 = ("plain", "evict_last")
EPILOGUES = ("store", "gated", "finalize")
# wgmma tiles whose CTAs can start by placement: the one-CTA 64-row pingpong tiles.
PLACED_TILES = ("pingpong64x256", "pingpong64x128")
# wgmma tiles that read weights in 64 x 64 blocks: each CTA's weight slice must be whole blocks.
BLOCKED_TILES = ("coop128x256", "pingpong64x256", "pingpong64x128", "pingpong64x256c2")


@dataclass(frozen=True)
class GemmTactic:
    """One grouped GEMM's tactic; `name` is its spelling in plans, reports and --force."""

    kernel: str          # decode | mma | wgmma
    tile: str            # a DECODE_TILES entry (decode) | an MMA_TILES entry (mma) | a WGMMA_TILES entry (wgmma)
    k_split: int         # decode: K slices per CTA (K_SPLITS); 0 for the other kernels
    launch: str          # plain | after_trigger | placed
    output_l2: str       # plain | evict_last

    @property
    def name(self) -> str:
        tile = self.tile
        if self.kernel == "decode":
            tile = f"{_DECODE_TILE_PREFIX[self.tile]}ksplit{self.k_split}"
        return f"{self.kernel}:{tile}:{self.launch}:{self.output_l2}"

    @classmethod
    def parse(cls, name: str) -> "GemmTactic":
        """The tactic spelled `name` (KERNEL:TILE:LAUNCH:OUTPUT_L2, decode's TILE being ksplitN, staged_ksplitN,
        digits_ksplitN or twocta_ksplitN)."""
        parts = name.split(":")
        form = "KERNEL:TILE:LAUNCH:OUTPUT_L2, e.g. wgmma:pingpong64x128:plain:plain or decode:ksplit2:plain:plain"
        if len(parts) != 4:
            raise MoeBuildError("force", f"tactic {name!r} is not {form}", form)
        kernel, tile, launch, l2 = parts
        if kernel not in KERNELS:
            raise MoeBuildError("force", f"tactic {name!r}: unknown kernel {kernel!r}", KERNELS)
        if kernel == "decode":
            forms = {f"{prefix}ksplit{k}": (form, k) for form, prefix in _DECODE_TILE_PREFIX.items()
                     for k in K_SPLITS}
            if tile not in forms:
                raise MoeBuildError("force", f"tactic {name!r}: the decode kernel's tile is its K split, plain, staged, "
                                    "on digits or at two CTAs an SM", list(forms))
            form, k_split = forms[tile]
            tactic = cls(kernel, form, k_split, launch, l2)
        else:
            tiles = MMA_TILES if kernel == "mma" else WGMMA_TILES
            if tile not in tiles:
                raise MoeBuildError("force", f"tactic {name!r}: unknown {kernel} tile {tile!r}", tiles)
            tactic = cls(kernel, tile, 0, launch, l2)
        if launch not in LAUNCHES:
            raise MoeBuildError("force", f"tactic {name!r}: unknown launch {launch!r}", LAUNCHES)
        if l2 not in OUTPUT_L2:
            raise MoeBuildError("force", f"tactic {name!r}: unknown output_l2 {l2!r}", OUTPUT_L2)
        return tactic


@dataclass(frozen=True)
class GemmCall:
    """What the rules read about one grouped GEMM of a layer: the target SM and which entry point runs it
    (sm90 or sm80), its epilogue, its shape per expert (n output columns, k), the experts and top_k, the
    weight layout, and the GPU's multiprocessor count and L2 size."""

    sm: int
    entry: str           # sm90 (TMA warp-specialized GEMMs) | sm80 (Ampere GEMMs)
    epilogue: str        # store | gated | finalize
    n: int               # the GEMM's columns per expert (gated: gate and up, 2 * intermediate)
    k: int
    experts: int
    top_k: int
    itemsize: int
    weights_blocked: bool
    sm_count: int
    l2_bytes: int
    fp8: str = "none"    # FP8_SCALINGS: the FP8 GEMM (e4m3 operands; plain store or finalize) with these scales
    woq: str = "none"    # WOQ_KINDS: the weight-only GEMM (16-bit activations, plain store) with these weights
    woq_group: int = 0   # the weight-only GEMM's k per scale (0: one scale per output row)
    dtype: str = "bf16"  # the layer's activations (spec dtype): MXFP4's mixed-input form needs bf16
    deterministic: bool = False  # the target's deterministic request (a row's output independent of the batch)
    fp8_accumulation: str = "none"  # the FP8 wgmma GEMM's: fast | promoted (the plan's fp8_accumulation) | none

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"GemmCall epilogue {self.epilogue!r} is not one of {', '.join(EPILOGUES)}")
        if self.fp8 not in FP8_SCALINGS:
            raise ValueError(f"GemmCall fp8 {self.fp8!r} is not one of {', '.join(FP8_SCALINGS)}")
        if self.fp8_accumulation not in FP8_ACCUMULATIONS:
            raise ValueError(f"GemmCall fp8_accumulation {self.fp8_accumulation!r} is not one of "
                             f"{', '.join(FP8_ACCUMULATIONS)}")
        if self.woq not in WOQ_KINDS:
            raise ValueError(f"GemmCall woq {self.woq!r} is not one of {', '.join(WOQ_KINDS)}")

    @property
    def expert_weight_bytes(self) -> int:
        """One expert's weight bytes as stored (4-bit weights: half a byte each)."""
        return self.n * self.k // 2 if self.woq in ("int4", "mxfp4") else self.n * self.k * self.itemsize


class RowCount:
    """A GEMM call's rows at one token count (tokens * top_k, and their average per expert), recording
    every threshold a rule compares them with: `next_change` is then the smallest larger token count at
    which any answer the rules gave here can change, so the rules' result is constant up to it."""

    def __init__(self, tokens: int, top_k: int, experts: int) -> None:
        self.tokens, self.top_k, self.experts = tokens, top_k, experts
        self.rows = tokens * top_k
        self.avg = -(-self.rows // experts)
        self.next_change: int | None = None

    def _flips_at(self, tokens: int) -> None:
        if tokens > self.tokens and (self.next_change is None or tokens < self.next_change):
            self.next_change = tokens

    def avg_at_most(self, rows: int) -> bool:
        """ceil(tokens * top_k / experts) <= rows, which holds up to tokens = floor(rows * experts / top_k)."""
        self._flips_at(rows * self.experts // self.top_k + 1)
        return self.avg <= rows

    def rows_below(self, rows: int) -> bool:
        """tokens * top_k < rows, which holds below tokens = ceil(rows / top_k)."""
        self._flips_at(-(-rows // self.top_k))
        return self.rows < rows

    def tokens_at_most(self, tokens: int) -> bool:
        """tokens <= `tokens` (e.g. within a band of another stage), which holds up to it."""
        self._flips_at(tokens + 1)
        return self.tokens <= tokens


# ---- the rules --------------------------------------------------------------------------------

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
    if call.fp8 != "none":
        return fp8_kernel_rule(call, rows)
    if call.woq != "none":
        return woq_kernel_rule(call, rows)
    limit = FINALIZE_DECODE_MAX_AVG_ROWS if call.epilogue == "finalize" else DECODE_MAX_AVG_ROWS
    if not call.deterministic and rows.avg_at_most(limit):
        return "decode"
    return "wgmma" if call.entry == "sm90" else "mma"


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


def fp8_kernel_rule(call: GemmCall, rows: RowCount) -> str:
    if call.entry != "sm90":
        return "decode"
    if call.fp8 == "block128":
        return "decode" if rows.rows_below(FP8_BLOCK_DECODE_ROWS) else "wgmma"
    # rowwise: decode to avg rows <= 6 (a short fast finalize: <= 1) and rows < 256
    most = FP8_FINALIZE_DECODE_MAX_AVG_ROWS if short_fast_finalize(call) else FP8_ROWWISE_DECODE_MAX_AVG_ROWS
    few = rows.avg_at_most(most) and rows.rows_below(FP8_ROWWISE_DECODE_ROWS)
    return "decode" if few else "wgmma"


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


def decode_column_blocks(call: GemmCall, k_split: int) -> int:
    """The decode kernel's CTAs per (expert, row chunk): 16 weight rows a warp, DECODE_WARPS / k_split warps across N."""
    return -(-call.n // (16 * (DECODE_WARPS // k_split)))


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


def ctas_at_most(call: GemmCall, rows: RowCount, column_blocks: int, limit: int) -> bool:
    """A decode launch's CTAs, non-empty experts (at most min(experts, rows)) times `column_blocks`, <= `limit`:
    min(experts, rows) <= limit // column_blocks, constant where every expert fits, else while the rows do (the
    threshold recorded in `rows`, so the token bands end where the answer flips)."""
    most = limit // column_blocks
    return call.experts <= most or rows.rows_below(most + 1)


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


# rowwise scales, fast accumulation, finalize epilogue, k <= 4096: the short finalize GEMM2 whose decode band
# (FP8_FINALIZE_DECODE_MAX_AVG_ROWS) and clustered narrow tile (FP8_FINALIZE_C2_MAX_AVG_ROWS) were measured
def short_fast_finalize(call: GemmCall) -> bool:
    return (call.fp8 == "rowwise" and call.fp8_accumulation == "fast" and call.epilogue == "finalize"
            and call.k <= FP8_FINALIZE_C2_MAX_K)


# fast accumulation, and gated: avg rows >= 256 (or > 32 with k >= 7168) -> pingpong128x128; finalize: avg rows >= 192
# -> pingpong128x128c2
def fp8_pingpong128_rule(call: GemmCall, rows: RowCount) -> str | None:
    if call.fp8 != "rowwise" or call.fp8_accumulation != "fast":
        return None
    if call.epilogue == "gated":
        least = FP8_NARROW_MAX_AVG_ROWS + 1 if call.k >= FP8_PINGPONG128_LONG_K else FP8_PINGPONG128_GATED_MIN_AVG_ROWS
        return None if rows.avg_at_most(least - 1) else "pingpong128x128"
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
    return "staged" if most >= DECODE_TOKENS or rows.rows_below(most + 1) else "none"


# Weight-only decode on token digits (the digits tile: gemm/woq_decode_digits.cu on the rows' token digits, in place
# of the staged tile at its K split) where a chunk's digits fit and the average rows per expert is at most 3, on
# layers of 64 experts or more (MXFP4: 1), to 2 on layers of 32 or more, or up to 4 rows in all. H200, the W4A16 bench GEMMs (int4, group 128, zeros) at 1-128
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
# MXFP4 (WFP4A16, where the alternative is the register-ring kernel: the staged one takes int4 only) on layers of 64
# experts or more to 1 average row per expert; 32-63 experts and 4 rows in all as int4. H200, WFP4A16 layers, graph
# replay, the plan with int4's bounds (both GEMMs on the tile, but Mixtral-8x7B's GEMM2 past 1 token, whose 8-row
# chunks do not fit) against the ring kernel's plan, 2-3 alternated rounds, us (docs/measured/h200-2026-12-03-mxfp4-
# digits): GPT-OSS-20B (32 experts) at 1 / 2 / 4 / 8 / 12 / 16 tokens 51.2-51.9 / 72.7-73.3 / 112.5-114.9 /
# 142.1-142.5 / 186.4-187.3 / 204.5-212.0 against 61.6-63.0 / 91.6-93.5 / 140.9-143.0 / 171.1-172.7 / 217.6-217.8 /
# 226.1-228.6; Mixtral-8x7B at 1 / 2 119.8-122.7 / 194.4-199.7 against 123.4-125.6 / 201.9-202.8; DeepSeek-V2-Lite
# (64) at 1 / 2 / 4 / 8 37.1-37.4 / 50.0-51.7 / 74.3-76.4 / 109.3-109.6 against 38.8-39.1 / 53.5-54.4 / 80.3-81.0 /
# 113.7-114.1; Qwen3-30B-A3B (128) at 1 / 2 / 4 / 8 / 16 35.0-35.2 / 45.7-46.1 / 64.4 / 94.3-94.7 / 142.6-142.8
# against 34.9-35.2 / 46.4-47.0 / 67.4-67.6 / 97.8-99.2 / 141.5-141.7. At 2 rows (rounded up) Qwen3-30B-A3B lost, 24 /
# 32 tokens 171.0 / 189.6-190.8 against 164.9 / 175.5, where DeepSeek-V2-Lite won 1-4%, 12 / 16 tokens 131.0-132.7 /
# 151.8-152.4 against 133.0-134.7 / 156.6-158.1 (given up here); at 3 both lost, Qwen3-30B-A3B at 48 229.4 against
# 196.4, DeepSeek-V2-Lite at 24 / 32 175.4-177.1 / 205.2-208.0 against 166.2-167.6 / 178.8-180.5.
DIGITS_MAX_AVG_ROWS = 3
DIGITS_MANY_EXPERTS = 64
DIGITS_FEW_ROWS = 4
DIGITS_MID_EXPERTS = 32
DIGITS_MID_MAX_AVG_ROWS = 2
DIGITS_MXFP4_MANY_MAX_AVG_ROWS = 1


def woq_digits_rule(call: GemmCall, rows: RowCount, k_split: int) -> bool:
    most = woq_digits_rows(call, k_split)
    fits = most > 0 and (most >= DECODE_TOKENS or rows.rows_below(most + 1))  # a chunk's rows, min(8, tokens * top_k)
    few_per_expert = rows.avg_at_most(DIGITS_MAX_AVG_ROWS)
    few_rows = rows.rows_below(DIGITS_FEW_ROWS + 1)
    experts_fit = rows.avg_at_most(digits_experts_max_avg_rows(call))
    return fits and few_per_expert and (few_rows or experts_fit)


def digits_experts_max_avg_rows(call: GemmCall) -> int:
    """The most average rows per expert (rounded up) the digits tile takes by the layer's experts, beside its 4 rows in
    all: 3 on 64 or more (MXFP4 1), 2 on 32-63, none below."""
    if call.experts >= DIGITS_MANY_EXPERTS:
        return DIGITS_MXFP4_MANY_MAX_AVG_ROWS if call.woq == "mxfp4" else DIGITS_MAX_AVG_ROWS
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
# converted), each K slice's rows padded by 64 bytes, and 256 bytes of zeros; at most 104 KB (two CTAs an SM).
DECODE_TOKENS = 8  # gemm/decode_launch.cuh kDecodeTokens: token rows per chunk
STAGED_TOKEN_BUDGET = 104 * 1024
STAGED_TOKEN_PAD = 64
STAGED_TOKEN_ZEROS = 256


def decode_k_slice(k: int, k_split: int) -> int:
    """gemm/decode_launch.cuh decode_k_slice: a warp's K slice, whole 128-k batches."""
    return -(-k // (k_split * 128)) * 128


def woq_staged_rows(call: GemmCall, k_split: int) -> int:
    """The most token rows a chunk may have for the staged kernel at `k_split` (0 where it does not take `call`):
    gemm/woq_decode.cu staged_smem within kTokenBudget."""
    if not woq_int4_staged(call):
        return 0
    slice_k = -(-min(call.k, decode_k_slice(call.k, k_split)) // 128) * 128  # whole batches (k % 128 == 64: a half)
    per_row = k_split * (slice_k * 2 + STAGED_TOKEN_PAD)
    return max(0, min(DECODE_TOKENS, (STAGED_TOKEN_BUDGET - STAGED_TOKEN_ZEROS) // per_row))


# gemm/woq_decode_digits.cu: a token row's digits take MB_TOKEN_DIGITS_BATCH_BYTES per 128-k group in shared memory
# (each K slice's rows at slice 0's length; k % 128 == 64: a half group at K's end), and 16 bytes of zeros; the
# staged kernel's budget.
DIGITS_GROUP_BYTES = 400
DIGITS_ZEROS = 16


def woq_digits_weights(call: GemmCall) -> bool:
    """The weights the digits kernel takes (gemm/woq.cuh digits_fit): the staged kernel's int4 forms, and MXFP4 with
    k a multiple of 64 (GPT-OSS-20B's 2880)."""
    return woq_int4_staged(call) or (call.woq == "mxfp4" and call.k % 64 == 0)


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


# decode K slices per CTA: 2, or 8 where 2 slices give fewer CTAs than SMs (non-empty experts at most
# min(experts, rows), times the column blocks). H200, 1 and 16 tokens of the bench shapes, each split
# forced: 2 is best or within 5% of best at most points; 1 loses 5-45% (too few warps per row block);
# 8 wins only when the grid is small (Mixtral GEMM2 and GPT-OSS-20B at 1 token) and loses up to 2x for
# short K (Qwen3-30B-A3B GEMM2, K = 768).
DECODE_WARPS = 8  # gemm/decode.cu kDecodeWarps: a CTA covers (gated ? 8 : 16) * (8 / k_split) columns


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
    if call.fp8 != "none":
        return fp8_wgmma_tile_rule(call, rows)
    if call.epilogue == "finalize":
        return "pingpong64x128" if rows.avg_at_most(FINALIZE_NARROW_MAX_AVG_ROWS) else "pingpong64x256"
    if rows.avg_at_most(NARROW_MAX_AVG_ROWS):
        return "pingpong64x128"
    if call.epilogue == "gated" and rows.avg_at_most(GATED_SINGLE_CTA_MAX_AVG_ROWS):
        return "pingpong64x256"
    # 64x192 in 2x1 clusters multicasts 96-row weight slices, which 64 x 64 weight blocks do not tile
    return "pingpong64x192c2" if narrow_columns_fit(call.n) and not call.weights_blocked else "pingpong64x256c2"


# wgmma launch: the gated GEMM1 and the finalize GEMM2 start by placement (after a trigger, each CTA at
# the tiles a plain launch puts on its SM) from 32 average rows per expert, on the one-CTA pingpong tiles,
# where one expert's weights of the GEMM fit in L2 (Qwen3-30B-A3B at 4096 tokens 580.9-581.2 vs 586.1-586.4
# us on the H200; Mixtral-8x7B's 117-235 MB experts lost with it: H100 4096 tokens +138 to +240 us). Below
# 32 rows placement was 0.6-1.8 us behind the unplaced launch; there the finalize GEMM still launches after
# a trigger up to 64 rows (256 tokens: Qwen3 306.0-306.8 vs 310.0-310.3 us, GPT-OSS-20B 393.9-394.6 vs
# 401.0-401.5), and every other wgmma GEMM plainly (launched early without placement, past 64 rows, the
# finalize GEMM lost up to 10% on the H100: its tiles lost the plain launch's layout over the chip).
# The FP8 GEMM has no placed launch (its 64x128x128 tile does not take the placed scheduler): its finalize
# GEMM2 launches after a trigger up to 64 rows and plainly above (the 16-bit thresholds; FP8's not measured yet).
PLACED_MIN_AVG_ROWS = 32
FINALIZE_EARLY_MAX_AVG_ROWS = 64


def wgmma_launch_rule(call: GemmCall, rows: RowCount, tile: str) -> str:
    if call.epilogue == "store":
        return "plain"
    if (call.fp8 == "none" and tile in PLACED_TILES and call.expert_weight_bytes <= call.l2_bytes
            and not rows.avg_at_most(PLACED_MIN_AVG_ROWS - 1)):
        return "placed"
    if call.epilogue == "finalize" and rows.avg_at_most(FINALIZE_EARLY_MAX_AVG_ROWS):
        return "after_trigger"
    return "plain"


# output L2 policy: the wgmma gated and finalize epilogues write under evict_last. Both write what is read
# again soon (GEMM2 reads GEMM1's rows next; the finalize adds top_k rows into each output row from experts
# spread over the whole GEMM), while the weights stream through L2. H100, whole layers at 4096 tokens: Qwen3
# 671.2-673.2 us vs 690.8-691.4, DeepSeek-V2-Lite 782.0-786.3 vs 794.3-804.3, Mixtral 4556-4717 vs 4782-5483;
# 12-30 us faster at 1024 tokens and 5-20 at 256 on all four bench shapes. The FP8 finalize epilogue writes
# the same way (FP8 not measured yet).
def output_l2_rule(call: GemmCall, kernel: str) -> str:
    return "evict_last" if kernel == "wgmma" and call.epilogue != "store" else "plain"


# decode launch: after a trigger from sm90 on (its CTAs load weights while the expansion finishes; the
# attribute does not exist below sm90).
def decode_launch_rule(call: GemmCall) -> str:
    return "after_trigger" if call.sm >= 90 else "plain"


def choose_tactic(call: GemmCall, rows: RowCount) -> GemmTactic:
    """The table: every rule above, in order, for one GEMM at one token count."""
    kernel = kernel_rule(call, rows)
    if kernel == "decode":
        k_split = (fp8_decode_k_split_rule(call, rows) if call.fp8 != "none" else
                   woq_decode_k_split_rule(call, rows) if call.woq != "none" else decode_k_split_rule(call, rows))
        tile = (woq_decode_tile_rule(call, rows, k_split) if call.woq != "none" else
                fp8_block_decode_tile_rule(call, rows, k_split) if call.fp8 == "block128" else "none")
        return GemmTactic("decode", tile, k_split, decode_launch_rule(call), "plain")
    if kernel == "mma":
        tile = woq_mma_tile_rule(call, rows) if call.woq != "none" else mma_tile_rule(call, rows)
        return GemmTactic("mma", tile, 0, "plain", "plain")
    if call.woq != "none" and woq_mixed_input(call):
        return GemmTactic("wgmma", woq_wgmma_tile_rule(call, rows), 0, "plain", "plain")
    if call.woq != "none":  # the 16-bit wgmma GEMM on the dequantized weights: row-major, plain store and launch
        dense = replace(call, woq="none", woq_group=0, itemsize=2, weights_blocked=False, epilogue="store")
        return GemmTactic("wgmma", wgmma_tile_rule(dense, rows), 0, "plain", "plain")
    tile = wgmma_tile_rule(call, rows)
    return GemmTactic("wgmma", tile, 0, wgmma_launch_rule(call, rows, tile), output_l2_rule(call, kernel))


X = TypeVar("X")


def token_bands(top_k: int, experts: int, rule: Callable[[RowCount], X]) -> list[tuple[int, int | None, X]]:
    """(first token count, last or None, answer) bands of `rule` covering every token count from 1, adjacent
    bands of one answer merged: each band ends where a threshold the rule compared could flip."""
    bands: list[tuple[int, int | None, X]] = []
    tokens: int | None = 1
    while tokens is not None:
        rows = RowCount(tokens, top_k, experts)
        answer = rule(rows)
        last = None if rows.next_change is None else rows.next_change - 1
        if bands and bands[-1][2] == answer:
            bands[-1] = (bands[-1][0], last, answer)
        else:
            bands.append((tokens, last, answer))
        tokens = rows.next_change
    return bands


def tactic_bands(call: GemmCall) -> list[tuple[int, int | None, GemmTactic]]:
    """The table's tactics for `call` (choose_tactic) as token_bands."""
    return token_bands(call.top_k, call.experts, lambda rows: choose_tactic(call, rows))


# ---- what a tactic needs ----------------------------------------------------------------------

def tactic_problem(call: GemmCall, tactic: GemmTactic) -> str | None:
    """Why `call` cannot run `tactic` (the library would refuse it), or None if it can."""
    if tactic.kernel == "wgmma" and call.entry != "sm90":
        return "the wgmma kernel runs only in the sm90 GEMMs (gemm_kernel=tma_warp_specialized)"
    if tactic.kernel == "decode" and tactic.tile in ("staged", "digits") and call.woq == "none":
        return f"the {tactic.tile} decode kernel is the weight-only int4 GEMM's"
    if tactic.kernel == "decode" and tactic.tile == "twocta" and call.fp8 != "block128":
        return "the twocta decode kernel is the FP8 GEMM's with block-128 scales"
    if call.fp8 != "none":
        fp8_problem = _fp8_tactic_problem(call, tactic)
        if fp8_problem is not None:
            return fp8_problem
    elif call.woq != "none":
        woq_problem = _woq_tactic_problem(call, tactic)
        if woq_problem is not None:
            return woq_problem
    elif tactic.kernel == "wgmma" and tactic.tile in FP8_ONLY_TILES:
        return f"wgmma {tactic.tile} is the FP8 GEMM's tile"
    elif tactic.kernel == "wgmma" and tactic.tile in WOQ_WGMMA_TILES:
        return f"wgmma {tactic.tile} is the weight-only GEMM's tile"
    if tactic.kernel == "mma" and call.weights_blocked:
        return "the mma tiles read row-major weights only (weight_layout=row_major)"
    if tactic.kernel == "wgmma" and call.weights_blocked and tactic.tile not in BLOCKED_TILES:
        return f"wgmma {tactic.tile} cannot read 64 x 64 weight blocks (weight_layout=row_major)"
    if tactic.launch == "placed" and not (tactic.kernel == "wgmma" and tactic.tile in PLACED_TILES
                                          and call.epilogue != "store"):
        return (f"a placed launch needs a wgmma {' or '.join(PLACED_TILES)} tile with the gated or finalize "
                "epilogue")
    if tactic.launch == "after_trigger" and tactic.kernel == "mma":
        return "the mma tiles launch plainly"
    if tactic.output_l2 == "evict_last" and not (tactic.kernel == "wgmma" and call.epilogue != "store"):
        return "evict_last outputs are the wgmma gated and finalize epilogues' only"
    if (tactic.kernel == "decode") != (tactic.k_split in K_SPLITS):
        return "the decode kernel takes a K split of 1, 2, 4 or 8, the other kernels none"
    return None


def _fp8_tactic_problem(call: GemmCall, tactic: GemmTactic) -> str | None:
    """Why the FP8 GEMM (gemm/fp8_abi.cu) cannot run `tactic`, or None."""
    if tactic.kernel == "mma":
        return "the mma tiles have no FP8 kernel (decode or wgmma)"
    if call.epilogue == "gated" and call.fp8 == "block128" and tactic.kernel != "decode":
        return "the gated epilogue with block-128 scales runs on the decode kernel only"
    if tactic.kernel == "wgmma" and tactic.tile not in FP8_WGMMA_TILES[call.fp8]:
        return f"the FP8 wgmma kernel's {call.fp8} tiles are {', '.join(FP8_WGMMA_TILES[call.fp8])}"
    if tactic.kernel == "wgmma" and tactic.tile in FP8_FAST_ONLY_TILES and call.fp8_accumulation != "fast":
        return f"wgmma {tactic.tile} runs with fast accumulation only (fp8_accumulation=fast)"
    if tactic.launch == "placed":
        return "the FP8 GEMM launches plainly or after a trigger"
    return None


def _woq_tactic_problem(call: GemmCall, tactic: GemmTactic) -> str | None:
    """Why the weight-only GEMM (gemm/woq_abi.cu, or with a wgmma tactic the dequantized weights' 16-bit GEMM)
    cannot run `tactic`, or None."""
    if call.epilogue == "finalize" and not (tactic.kernel == "decode" or on_mixed_input_tile(tactic)):
        return ("the weight-only finalize epilogue runs on the decode kernel and the mixed-input wgmma tiles "
                "(woq128x*) only")
    gated_only = "the weight-only gated epilogue runs on the mixed-input wgmma tiles (woq128x*) only"
    if tactic.kernel == "wgmma":
        if tactic.tile in WOQ_WGMMA_TILES and not woq_mixed_input(call):
            return (f"wgmma {tactic.tile} (the mixed-input kernel) takes int4 or int8 weights in groups of 64 or 128 "
                    "or per channel, or MXFP4 with bf16 activations, n a multiple of 8 and k of 64")
        if tactic.tile == "woq128x320c2" and not woq_weight_tiles_pair(call):
            return (f"wgmma woq128x320c2 runs in 2x1 clusters and takes an even count of 128-row weight tiles (n "
                    f"{call.n} makes {woq_weight_tiles(call)})")
        if tactic.tile in FP8_ONLY_TILES:
            return f"wgmma {tactic.tile} is the FP8 GEMM's tile"
        if call.epilogue == "gated" and tactic.tile not in WOQ_WGMMA_TILES:
            return gated_only
        if tactic.launch != "plain" or tactic.output_l2 != "plain":
            return "the dequantized weights' wgmma GEMM launches plainly, with plain outputs"
        return None
    if call.epilogue == "gated":
        return gated_only
    if tactic.kernel == "mma" and tactic.tile not in WOQ_MMA_TILES:
        return f"the weight-only mma kernel's tiles are {', '.join(WOQ_MMA_TILES)}"
    if tactic.launch == "placed" or tactic.output_l2 != "plain":
        return "the weight-only GEMM launches plainly or after a trigger, with plain outputs"
    if tactic.kernel == "decode" and tactic.tile == "staged":
        if not woq_int4_staged(call):
            return ("the staged decode kernel takes int4 weights with one scale per row or per 128 k and k a multiple "
                    "of 128, or per 64 k and k a multiple of 64")
        if woq_staged_rows(call, tactic.k_split) < DECODE_TOKENS:  # forced: every chunk, up to 8 rows, must fit
            return (f"the staged decode kernel's 8-row chunks do not fit its {STAGED_TOKEN_BUDGET // 1024} KB of "
                    f"shared memory at k {call.k} in {tactic.k_split} slices (a larger K split, or the register form)")
    if tactic.kernel == "decode" and tactic.tile == "digits":
        if not woq_digits_weights(call):
            return ("the digits decode kernel takes int4 weights with one scale per row or per 128 k and k a multiple "
                    "of 128, or per 64 k and k a multiple of 64, or MXFP4 with k a multiple of 64")
        if woq_digits_rows(call, tactic.k_split) < DECODE_TOKENS:  # forced: every chunk, up to 8 rows, must fit
            return (f"the digits decode kernel's 8-row chunks do not fit its {STAGED_TOKEN_BUDGET // 1024} KB of "
                    f"shared memory at k {call.k} in {tactic.k_split} slices (the staged or none tile)")
    return None
