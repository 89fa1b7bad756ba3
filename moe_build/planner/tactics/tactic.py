"""A GEMM tactic's vocabulary, and what the rules read about one GEMM call.

A tactic names the kernel (decode | mma | wgmma), its tile (or the decode kernel's K slices), how it is launched
and how its outputs are written to L2. The kernel library runs exactly the tactic it is given
(cpp/include/moe_build_kernels.h, mb_gemm_tactic); `GemmTactic.name` is its spelling in plans, reports and --force.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import MoeBuildError

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
# weight-only int4 codes kernel only, woq_staged_rows below; "stagedc4": the same with K split over the four CTAs of a
# cluster, each staging a quarter of the rows, sm90), or split into 8-bit digits by a step before the GEMM and
# multiplied on the int8 mma ("digits": the weight-only int4 forms with 16-bit activations, woq_digits_rows below), or
# held to 128 registers a thread, two CTAs an SM ("twocta": the FP8 kernel with block-128 scales,
# fp8_block_decode_tile_rule below).
DECODE_TILES = ("none", "staged", "digits", "twocta", "stagedc4")
_DECODE_TILE_PREFIX = {"none": "", "staged": "staged_", "digits": "digits_", "twocta": "twocta_",
                       "stagedc4": "stagedc4_"}
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
        stagedc4_ksplitN, digits_ksplitN or twocta_ksplitN)."""
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
                raise MoeBuildError("force", f"tactic {name!r}: the decode kernel's tile is its K split, plain, staged "
                                    "(in clusters of four), on digits or at two CTAs an SM", list(forms))
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
    weight layout, and the GPU's multiprocessor count, L2 size and peak DRAM rate."""

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
    memory_bytes_per_s: int
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
