"""The gate/up halves: how the block-128 FP8 GEMM1 with the gated epilogue reads W1 on the wgmma kernel
(mb_grouped_gemm_fp8_gated in cpp/include/moe_build_kernels.h). W1 stays stacked (gate rows, then up rows); each
128-row weight tile the kernel reads is 64 gate rows, then the up rows of the same 64 features, so one tile holds both
halves of its features. Each half lies inside one 128-row scale block where I is a multiple of 64; the kernel reads the
block scales by 8 rows in the halves' order (`scale_blocks`)."""

HALF_FEATURES = 64  # features a weight tile holds: the rows of each half
SCALE_ROWS = 8      # W1 rows a scale row covers in the halves' order


def halves_fit(inter: int) -> bool:
    """Whether W1 of `inter` features reads as gate/up halves (each half inside one 128-row block)."""
    return inter % HALF_FEATURES == 0


def scale_blocks(inter: int, block: int) -> list[int]:
    """For each scale row of the halves' order (2 inter / SCALE_ROWS of them), the `block`-row scale block of stacked
    W1 holding its rows: row 16t + u covers W1 rows 64t + 8u.. (u < 8, gate) or inter + 64t + 8(u - 8).. (up)."""
    per_half = HALF_FEATURES // SCALE_ROWS
    return [(h * inter + HALF_FEATURES * t + SCALE_ROWS * u) // block
            for t in range(inter // HALF_FEATURES) for h in (0, 1) for u in range(per_half)]
