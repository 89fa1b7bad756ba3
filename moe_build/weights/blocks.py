"""The 64 x 64 weight blocks the sm90 GEMMs read (MB_WEIGHTS_BLOCKED64 in cpp/include/moe_build_kernels.h)."""

BLOCK = 64  # block rows and columns


def blocks_fit(rows: int, cols: int) -> bool:
    """Whether a [.., rows, cols] weight tiles into whole blocks."""
    return rows % BLOCK == 0 and cols % BLOCK == 0
