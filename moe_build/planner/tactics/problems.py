"""What a tactic needs: why a GEMM call cannot run a given tactic (the kernel library would refuse it), checked
before a forced tactic enters a plan."""
from __future__ import annotations

from ...weights.halves import HALF_FEATURES
from .decode_kernel import DECODE_TOKENS
from .tactic import (BLOCKED_TILES, FP8_FAST_ONLY_TILES, FP8_ONLY_TILES, FP8_WGMMA_TILES, K_SPLITS, PLACED_TILES,
                     WOQ_MMA_TILES, WOQ_WGMMA_TILES, GemmCall, GemmTactic)
from .woq import (STAGED_TOKEN_BUDGET, on_digits_tile, on_mixed_input_tile, woq_digits_rows, woq_digits_weights,
                  STAGED_CLUSTER_PARTS, woq_int4_staged, woq_mixed_input, woq_staged_rows, woq_weight_tiles,
                  woq_weight_tiles_pair)


def tactic_problem(call: GemmCall, tactic: GemmTactic) -> str | None:
    """Why `call` cannot run `tactic` (the library would refuse it), or None if it can."""
    if tactic.kernel == "wgmma" and call.entry != "sm90":
        return "the wgmma kernel runs only in the sm90 GEMMs (gemm_kernel=tma_warp_specialized)"
    if tactic.kernel == "decode" and tactic.tile in ("staged", "stagedc4", "digits") and call.woq == "none":
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
    if call.epilogue == "gated" and call.fp8 == "block128" and tactic.kernel == "wgmma" \
            and call.n % (2 * HALF_FEATURES):
        return (f"the gated epilogue with block-128 scales runs on the wgmma kernel by {HALF_FEATURES}-row "
                f"gate/up halves: intermediate_size a multiple of {HALF_FEATURES}")
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
    if tactic.kernel == "decode" and tactic.tile in ("staged", "stagedc4"):
        if not woq_int4_staged(call):
            return ("the staged decode kernel takes int4 weights with one scale per row or per 128 k and k a multiple "
                    "of 128, or per 64 k and k a multiple of 64")
        parts = STAGED_CLUSTER_PARTS if tactic.tile == "stagedc4" else 1
        if parts > 1 and call.sm < 90:
            return "the stagedc4 decode kernel runs in thread-block clusters: sm90 or later"
        if woq_staged_rows(call, tactic.k_split, parts) < DECODE_TOKENS:  # forced: every chunk, up to 8 rows, must fit
            return (f"the staged decode kernel's 8-row chunks do not fit its {STAGED_TOKEN_BUDGET // 1024} KB of "
                    f"shared memory at k {call.k} in {parts * tactic.k_split} slices (a larger K split, stagedc4, or "
                    "the register form)")
    if on_digits_tile(tactic):
        if not woq_digits_weights(call):
            return ("the digits decode kernel takes int4 weights with one scale per row or per 128 k and k a multiple "
                    "of 128, or per 64 k and k a multiple of 64, or MXFP4 with k a multiple of 64, or int8 with one "
                    "scale per row and k a multiple of 64 or per 128 k and k a multiple of 128")
        if woq_digits_rows(call, tactic.k_split) < DECODE_TOKENS:  # forced: every chunk, up to 8 rows, must fit
            return (f"the digits decode kernel's 8-row chunks do not fit its {STAGED_TOKEN_BUDGET // 1024} KB of "
                    f"shared memory at k {call.k} in {tactic.k_split} slices (the staged or none tile)")
    return None
