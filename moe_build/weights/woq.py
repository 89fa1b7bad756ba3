"""Weight-only quantized expert weights (int4, int8, MXFP4): the storage contract and the exact dequantization.

Every weight-only piece of moe-build follows this one file, as every FP8 piece follows fp8.py: the checkpoint
readers (woq_checkpoint.py) convert each producer's packing into the ONE canonical form below, exactly (no value is
rounded on load), the fp64 reference dequantizes with `dequantize_expert`, and later kernels read this form.

W1 [E, N1, H] and W2 [E, H, I] in nn.Linear [out, in] order (W1: gate rows then up rows, layout.py), stored as
- INT4:  uint8 [E, out, in/2], two unsigned 4-bit codes u in [0, 15] per byte along the input dimension, the low
         nibble the even column. w = (u - z) * s, z the group's zero point: `*_zero` uint8 [E, out, in/group] in
         [0, 15] for asymmetric producers (AutoAWQ, compressed-tensors asymmetric), else the implicit z = 8 (every
         symmetric producer's signed int4 q in [-8, 7] is stored as u = q + 8, which is the same number exactly);
- INT8:  int8 [E, out, in], symmetric: w = q * s (no zero points);
- MXFP4: uint8 [E, out, in/2], two e2m1 codes per byte (low nibble the even column, OCP MX order), with `*_scale`
         uint8 [E, out, in/32] the e8m0 exponents: w = e2m1(code) * 2^(e - 127) (GPT-OSS's `_blocks` / `_scales`).
INT4 codes may also be held in 16-row tiles (`int4_tiles`, the plan's weight_layout=int4_tiles): the same bytes, each
16 rows' moved so that a decode kernel's warp reads its rows of a 128-k batch as 1024 contiguous bytes.
Scales of INT4 / INT8 are fp32 [E, out, in/group], or [E, out, 1] for one scale per output channel
(group_size None); every producer stores fp16, bf16 or fp32 scales, each of which converts to fp32 exactly, so the
canonical fp32 scale is the stored number.

Activations: `fc1_act_scale` fp32 [H] and `fc2_act_scale` fp32 [I] are the AWQ pre-quant scales (ModelOpt's
`pre_quant_scale`): GEMM1's input is x * fc1_act_scale and GEMM2's input the activated rows * fc2_act_scale, as
TensorRT-LLM's MoE applies them (one vector per layer: ModelOpt shares the experts' input quantizer). W4AFP8 layers
quantize those products to FP8 by fp8.py's rule, with the static `a1_scale` / `a2_scale` (fp32 []) or per row
when None. `w1_scale_2` / `w2_scale_2` (fp32 [E]) are ModelOpt W4A8-AWQ's per-matrix `weight_scale_2`, the FP8
range of the int4 products that kernels rescale by; the dequantized weight is (u - z) * s without it, exactly what
ModelOpt's export quantized (round(w / weight_scale), modelopt/torch/export/quant_utils.py:813).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..errors import MoeBuildError
from ..spec import MoESpec, Quant

MXFP4_GROUP = 32          # values per e8m0 exponent (OCP MX)
E8M0_BIAS = 127
E8M0_NAN = 255            # the one e8m0 code that is not a power of two
INT4_ZERO = 8             # the implicit zero point of symmetric int4 (u = q + 8)
# e2m1 (FP4) values indexed by their 4-bit code: sign bit 3, then two exponent bits and one mantissa bit
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP_SIZES = (32, 64, 128)  # int4 groups moe-build reads (TensorRT-LLM's W4A16 / W4AFP8 kernels take these)
TILE_ROWS = 16            # rows of a tile (MB_WOQ_INT4_TILES, MB_WOQ_MXFP4_QUARTERS): a decode warp's weight rows
INT4_TILE_BATCH = 64      # bytes of a row in a tile's batch (128 k)


class WoqKind(str, enum.Enum):
    INT4 = "int4"
    INT8 = "int8"
    MXFP4 = "mxfp4"

    @property
    def packed(self) -> bool:
        """Two values per byte along the input dimension."""
        return self is not WoqKind.INT8


# The stored kind of each weight-only quant's experts (W4AFP8's int4 weights take FP8 activations).
QUANT_KIND = {Quant.W4A16_AWQ: WoqKind.INT4, Quant.W4AFP8: WoqKind.INT4, Quant.W8A16: WoqKind.INT8,
              Quant.WFP4A16: WoqKind.MXFP4}
_DATA_DTYPE = {WoqKind.INT4: torch.uint8, WoqKind.INT8: torch.int8, WoqKind.MXFP4: torch.uint8}
_TENSORS = ("w1", "w2", "w1_scale", "w2_scale", "w1_zero", "w2_zero", "fc1_act_scale", "fc2_act_scale",
            "a1_scale", "a2_scale", "w1_scale_2", "w2_scale_2")


def stored_form(spec: MoESpec) -> dict[str, str | None]:
    """The canonical form above for `spec`'s weight-only experts, in words: what every reader converts the
    producer's packing to, once, when the checkpoint is loaded, and what the kernels and the plugin's inputs hold
    (engine manifests record it). Where the spec's quant is not weight-only: a one-line refusal."""
    kind = QUANT_KIND.get(spec.quant)
    if kind is None:
        raise MoeBuildError("quant", f"{spec.quant.value} experts are not weight-only quantized",
                            [q.value for q in QUANT_KIND])
    g = MXFP4_GROUP if kind is WoqKind.MXFP4 else spec.quant_group_size
    per_channel = kind is not WoqKind.MXFP4 and spec.quant_per_channel
    columns = "1" if per_channel else f"in/{g}"
    if kind is WoqKind.MXFP4:
        scales = f"uint8 e8m0 exponents [E, out, in/{g}]"
    else:
        scales = f"fp32 [E, out, {columns}]"
    zeros = f"uint8 [E, out, {columns}] in 0..15" if kind is WoqKind.INT4 and spec.quant_zero_points else None
    weights = "uint8 [E, out, in/2], two codes a byte, the low nibble the even column"
    if kind is WoqKind.INT4 and zeros is None:
        weights += f", zero point {INT4_ZERO}"
    return {"kind": kind.value, "weights": "int8 [E, out, in]" if kind is WoqKind.INT8 else weights,
            "scales": scales, "zero_points": zeros,
            "prequant_scales": "fp32 [hidden], [intermediate]" if spec.quant_prequant_scales else None,
            "granularity": "channel" if per_channel else f"group{g}"}


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes [..., n] (any integer dtype, values 0..15, n even) -> uint8 [..., n/2], low nibble = even column."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n/2] -> the 4-bit codes [..., n] as uint8 (pack_nibbles' inverse)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _per_column(t: torch.Tensor, cols: int) -> torch.Tensor:
    """A per-group tensor [out, groups] repeated over each group's columns -> [out, cols]."""
    return t.repeat_interleave(cols // t.shape[-1], dim=-1)


def dequantize_matrix(kind: WoqKind, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> torch.Tensor:
    """One stored matrix [out, in(/2)] -> fp64 [out, in]: (u - z) * s, q * s or e2m1 * 2^(e - 127), each product
    computed in fp64 from the stored numbers (exact: a 4- or 8-bit integer or an e2m1 value times an fp32 scale or a
    power of two fits fp64's mantissa)."""
    if kind is WoqKind.MXFP4:
        lut = torch.tensor(E2M1, dtype=torch.float64, device=q.device)
        values = lut[unpack_nibbles(q).long()]
        return torch.ldexp(values, _per_column(scale.to(torch.int64) - E8M0_BIAS, values.shape[-1]).to(torch.float64))
    if kind is WoqKind.INT8:
        return q.to(torch.float64) * _per_column(scale.to(torch.float64), q.shape[-1])
    u = unpack_nibbles(q).to(torch.float64)
    z = torch.full_like(scale, INT4_ZERO, dtype=torch.float64) if zero is None else zero.to(torch.float64)
    return (u - _per_column(z, u.shape[-1])) * _per_column(scale.to(torch.float64), u.shape[-1])


def quantize_matrix(kind: WoqKind, w: torch.Tensor, group: int | None, asymmetric: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Float weights [..., out, in] -> (data, scale, zero) in the canonical form, round-to-nearest per group of
    `group` input columns (None: per output channel; MXFP4 always 32): random quantized layers for tests and
    benchmarks (checkpoints come quantized by their producers). int4: symmetric (z = 8) or, with `asymmetric`,
    min/max with a zero point as AutoAWQ's; int8: symmetric; MXFP4: the e8m0 exponent of amax / 6 rounded up."""
    cols = w.shape[-1]
    size = MXFP4_GROUP if kind is WoqKind.MXFP4 else (group or cols)
    g = w.float().reshape(*w.shape[:-1], cols // size, size)
    if kind is WoqKind.MXFP4:
        e = torch.ceil(torch.log2(g.abs().amax(-1).clamp_min(2.0 ** -126) / 6.0)).clamp(-127, 127)
        lut = torch.tensor(E2M1[:8], dtype=torch.float32, device=w.device)
        x = (g / torch.exp2(e)[..., None]).clamp(-6.0, 6.0)
        code = (x.abs()[..., None] - lut).abs().argmin(-1) | ((x < 0).to(torch.int64) << 3)
        return pack_nibbles(code.reshape(w.shape)), (e + E8M0_BIAS).to(torch.uint8), None
    if kind is WoqKind.INT8:
        scale = (g.abs().amax(-1) / 127.0).clamp_min(1e-8)
        q = torch.round(g / scale[..., None]).clamp(-127, 127)
        return q.reshape(w.shape).to(torch.int8), scale, None
    if asymmetric:
        lo, hi = g.amin(-1).clamp_max(0.0), g.amax(-1).clamp_min(0.0)
        scale = ((hi - lo) / 15.0).clamp_min(1e-8)
        zero = torch.round(-lo / scale).clamp(0, 15)
        u = (torch.round(g / scale[..., None]) + zero[..., None]).clamp(0, 15)
        return pack_nibbles(u.reshape(w.shape)), scale, zero.to(torch.uint8)
    scale = (g.abs().amax(-1) / 7.0).clamp_min(1e-8)
    u = torch.round(g / scale[..., None]).clamp(-8, 7) + INT4_ZERO
    return pack_nibbles(u.reshape(w.shape)), scale, None


@dataclass(frozen=True)
class GemmOperand:
    """One matrix stack as a weight-only GEMM kernel reads it: its weights, their kind there (`kernel_kind`: the
    stored one, "e5m2" for MXFP4's re-encoding on the mixed-input wgmma kernel, "mxfp4_quarters" for its order on the
    digits tile), scales, int4 zero points or zero terms, and k per scale (0: one per output row)."""

    data: torch.Tensor
    kernel_kind: str
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group: int


def wgmma_operand(w: "WoqWeights", name: str, dtype: torch.dtype) -> GemmOperand:
    """W1 or W2 ("w1" / "w2") as the wgmma weight-only GEMM reads it: int4 / int8 as stored with `wgmma_scales`, MXFP4
    (whose scale per 32 k is two a k tile of that mainloop) re-encoded as e5m2 under one bf16 scale per 64 k
    (`mxfp4_as_e5m2`). Made once when a runner whose plan runs that GEMM is built: the stored form above stays the
    only one on load."""
    data, scale, zero = getattr(w, name), getattr(w, f"{name}_scale"), getattr(w, f"{name}_zero")
    if w.kind is WoqKind.MXFP4:
        if dtype != torch.bfloat16:
            raise ValueError(f"dtype: MXFP4's wgmma form is exact under bf16 scales only, got {dtype}")
        q, s = mxfp4_as_e5m2(data, scale)
        return GemmOperand(q, "e5m2", s, None, E5M2_GROUP)
    s, zs = wgmma_scales(w.kind, scale, zero, dtype)
    if w.int4_tiles:  # a rows copy beside the tiles (the plan's summary names the memory)
        data = int4_rows(data)
    return GemmOperand(data, w.kind.value, s, zs, 0 if w.group_size is None else w.group_size)


def stored_operand(w: "WoqWeights", name: str) -> GemmOperand:
    """W1 or W2 ("w1" / "w2") as stored (the same tensors, no copy; int4 in rows or in 16-row tiles): what the
    decode, mma and dequantize kernels read."""
    kind = "int4_tiles" if w.int4_tiles else w.kind.value
    return GemmOperand(getattr(w, name), kind, getattr(w, f"{name}_scale"), getattr(w, f"{name}_zero"),
                       0 if w.group_size is None else w.group_size)


def int4_tiles(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes uint8 [E, n, k/2] in rows -> the same bytes in 16-row tiles (MB_WOQ_INT4_TILES,
    cpp/include/moe_build_kernels.h), the same shape: tile t (rows 16t .. 16t + 15) holds its rows' bytes from
    8 k t, each 128-k batch's 1024 bytes row by row (64 a row), a last batch of k % 128 k its rows' (k % 128) / 2 bytes
    each, row by row. A decode warp's 16 rows then come as 512 contiguous bytes a load, where rows give it 8 runs of
    64 bytes, and HBM serves them faster (bench/int4_layout_probe.cu). One expert at a time (the extra memory one
    expert's); the bytes are moved, not changed."""
    return _int4_reorder(codes, to_tiles=True)


def int4_rows(tiles: torch.Tensor) -> torch.Tensor:
    """int4_tiles' inverse: codes in 16-row tiles -> rows."""
    return _int4_reorder(tiles, to_tiles=False)


def _int4_reorder(codes: torch.Tensor, to_tiles: bool) -> torch.Tensor:
    e, n, row_bytes = codes.shape
    if n % TILE_ROWS:
        raise ValueError(f"codes: {n} rows are not whole tiles of {TILE_ROWS}")
    tiles, whole = n // TILE_ROWS, row_bytes // INT4_TILE_BATCH * INT4_TILE_BATCH
    batches = whole // INT4_TILE_BATCH
    out = torch.empty_like(codes)
    for x in range(e):
        src = codes[x].reshape(tiles, TILE_ROWS * row_bytes)
        dst = out[x].view(tiles, TILE_ROWS * row_bytes)
        rows_whole = (tiles, TILE_ROWS, batches, INT4_TILE_BATCH)
        tiled_whole = (tiles, batches, TILE_ROWS, INT4_TILE_BATCH)
        if to_tiles:
            rows = src.view(tiles, TILE_ROWS, row_bytes)
            dst[:, : TILE_ROWS * whole] = rows[..., :whole].reshape(rows_whole).transpose(1, 2).reshape(
                tiles, TILE_ROWS * whole)
            dst[:, TILE_ROWS * whole:] = rows[..., whole:].reshape(tiles, -1)
        else:
            rows = dst.view(tiles, TILE_ROWS, row_bytes)
            rows[..., :whole] = src[:, : TILE_ROWS * whole].reshape(tiled_whole).transpose(1, 2).reshape(
                tiles, TILE_ROWS, whole)
            rows[..., whole:] = src[:, TILE_ROWS * whole:].reshape(tiles, TILE_ROWS, row_bytes - whole)
    return out


def digits_operand(w: "WoqWeights", name: str) -> GemmOperand:
    """W1 or W2 ("w1" / "w2") as the decode kernel's digits tile reads it: int4 / int8 as stored (no copy), MXFP4 in
    its quarters order (`mxfp4_quarters`). Made once when a runner whose plan runs that GEMM on the digits tile is
    built."""
    if w.kind is WoqKind.MXFP4:
        q, s = mxfp4_quarters(getattr(w, name), getattr(w, f"{name}_scale"))
        return GemmOperand(q, "mxfp4_quarters", s, None, MXFP4_GROUP)
    return stored_operand(w, name)


def mxfp4_quarters(codes: torch.Tensor, exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (uint8 [E, n, k/2] e2m1 codes, uint8 e8m0 [E, n, k/32]) in the digits tile's quarters order
    (MB_WOQ_MXFP4_QUARTERS, cpp/include/moe_build_kernels.h): codes uint8 [E, n, 64 ceil(k/128)], exponents uint8
    [E, n, 4 ceil(k/128)], n a multiple of 16. The tile's step u of a 128-k group is its scale group u, and lane q's
    word of it the codes of k 32u + 8q .. 32u + 8q + 7; stored, a lane's four words lie 16 bytes apart and its four
    exponents in two 2-byte pairs, eight and four loads a row and group, and a warp's 16 rows each its own run of
    bytes. Here each row's group of 64 bytes is moved so that a lane's words follow each other at 16q, and each group
    gets its four exponents in one 4-byte word: one 16-byte and one 4-byte load; and the rows go in 16-row tiles,
    each group's 16 rows together (1024 code bytes, 64 exponent bytes), so that a warp's loads of a group read
    contiguous bytes. A half group at k's end (k % 128 == 64) becomes a whole one, its second half zero codes and
    exponents (the token digits' second half there is zero): every group 64-byte aligned, one load for all. The
    codes and exponents are moved, not changed."""
    e, n, half = codes.shape
    k = 2 * half
    if k % 64:
        raise ValueError(f"codes: k {k} is not a multiple of 64 (whole halves of 128-k groups)")
    if n % TILE_ROWS:
        raise ValueError(f"codes: n {n} is not a multiple of {TILE_ROWS} (the form's {TILE_ROWS}-row tiles)")
    groups = -(-k // 128)
    quarters = torch.empty((e, n, 64 * groups), dtype=torch.uint8, device=codes.device)
    padded = torch.zeros((n, 64 * groups), dtype=torch.uint8, device=codes.device)  # one expert's, the half padded
    for x in range(e):  # an expert at a time: the copy's extra memory one expert's
        padded[:, :half] = codes[x]
        # bytes 16u + 4q + b of a row's group (u the step, q the lane) to 16q + 4u + b, then each tile's rows of a
        # group together
        lanes = padded.view(n, groups, 4, 4, 4).transpose(2, 3)
        quarters[x] = lanes.reshape(n // TILE_ROWS, TILE_ROWS, groups, 64).transpose(1, 2).reshape(n, 64 * groups)
    scales = torch.zeros((e, n, 4 * groups), dtype=torch.uint8, device=codes.device)
    scales[..., : k // MXFP4_GROUP] = exponents
    return quarters, scales.view(e, n // TILE_ROWS, TILE_ROWS, groups, 4).transpose(2, 3).reshape(e, n, 4 * groups)


def wgmma_scales(kind: WoqKind, scale: torch.Tensor, zero: torch.Tensor | None, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """int4 / int8 scales as the wgmma weight-only GEMM reads them (mb_grouped_gemm_woq_sm90): CUTLASS's mixed-input
    mainloop computes w = (u - 8) * s + zs (int4, u the stored code) or q * s (int8) in the activations' 16-bit type,
    so s comes in `dtype` and MN-major ([E, groups, n], one output row's scales adjacent), and int4's zero term
    zs = (8 - z) * s (z the zero point; 0 without zeros) likewise, from s as rounded to `dtype` (the sum is then
    (u - z) * s with s's rounding a relative error of the whole weight)."""
    s = scale.transpose(1, 2).contiguous().to(dtype)
    if kind is WoqKind.INT8:
        return s, None
    if kind is not WoqKind.INT4:
        raise ValueError(f"kind: {kind.value} scales are not the wgmma GEMM's (int4 or int8; MXFP4: mxfp4_as_e5m2)")
    if zero is None:
        return s, torch.zeros_like(s)
    offset = INT4_ZERO - zero.transpose(1, 2).to(torch.float32)
    return s, (offset * s.float()).to(dtype).contiguous()


# MXFP4 for the mixed-input kernel: two e8m0 blocks of 32 k under one scale per E5M2_GROUP k
E5M2_GROUP = 64
E5M2_TOP = 12       # the 64 k's largest block exponent R maps e2m1's 6 to 6 * 2^12 (e5m2's largest is 57344)
E5M2_MIN_REF = 6    # R below it is taken as 6, so that the scale 2^(R - 139) stays a bf16 number (2^-133 at least)


def mxfp4_as_e5m2(codes: torch.Tensor, exponents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (uint8 [E, n, k/2] e2m1 codes, uint8 e8m0 [E, n, k/32]) as e5m2 q [E, n, k] and bf16 scales
    s [E, k/64, n] (MN-major), w = q * s. Per 64 k, R is the larger exponent of its two blocks that hold a nonzero code
    (at least E5M2_MIN_REF), s = 2^(R - 127 - E5M2_TOP) and q = e2m1 * 2^(e - R + E5M2_TOP): a block E below R gives
    q of e2m1 * 2^(12 - E), exact in e5m2 (2 mantissa bits, down to 2^-16) while E <= 27, and s a power of two that
    bf16 holds; so q * s is the stored weight, rounded once to bf16 as the dequantization rounds it (its overflow
    included). Blocks more than 27 below their neighbour, which no trained layer has, are rounded to e5m2: within
    2^-28 of the 64 k's largest weight. One expert at a time, so the float32 work stays one expert's size."""
    e, n, half = codes.shape
    k = 2 * half
    if k % E5M2_GROUP:
        raise ValueError(f"codes: k {k} is not a multiple of {E5M2_GROUP}")
    table = torch.tensor(E2M1, dtype=torch.float32, device=codes.device)
    q = torch.empty((e, n, k), dtype=torch.float8_e5m2, device=codes.device)
    s = torch.empty((e, k // E5M2_GROUP, n), dtype=torch.bfloat16, device=codes.device)
    for x in range(e):
        nib = unpack_nibbles(codes[x]).reshape(n, k // MXFP4_GROUP, MXFP4_GROUP)
        values = table[nib.long()]                                            # [n, blocks, 32] e2m1
        exp = exponents[x].to(torch.int32)                                    # [n, blocks]
        live = torch.where((nib & 7).amax(-1) > 0, exp, torch.zeros_like(exp))  # blocks of zeros do not set R
        ref = live.reshape(n, -1, 2).amax(-1).clamp_min(E5M2_MIN_REF)            # [n, k/64]
        # at most E5M2_TOP: a block of zeros above R would otherwise scale its zeros by an infinite power of two
        shift = (exp - ref.repeat_interleave(2, dim=1) + E5M2_TOP).clamp_max(E5M2_TOP)  # [n, blocks]
        q[x] = torch.ldexp(values, shift[..., None].float()).reshape(n, k).to(torch.float8_e5m2)
        s[x] = torch.ldexp(torch.ones_like(ref, dtype=torch.float32),
                           (ref - E8M0_BIAS - E5M2_TOP).float()).to(torch.bfloat16).T
    return q, s


@dataclass(frozen=True)
class WoqWeights:
    """One layer's weight-only quantized experts in the canonical form (module docstring). Constructing one
    validates every tensor, so a WoqWeights that exists is internally consistent."""

    kind: WoqKind
    group_size: int | None           # input columns per scale; None: one scale per output channel
    w1: torch.Tensor
    w2: torch.Tensor
    w1_scale: torch.Tensor
    w2_scale: torch.Tensor
    w1_zero: torch.Tensor | None = None
    w2_zero: torch.Tensor | None = None
    fc1_act_scale: torch.Tensor | None = None
    fc2_act_scale: torch.Tensor | None = None
    a1_scale: torch.Tensor | None = None
    a2_scale: torch.Tensor | None = None
    w1_scale_2: torch.Tensor | None = None
    w2_scale_2: torch.Tensor | None = None
    # W1 / W2's int4 codes in 16-row tiles (int4_tiles(); the plan's weight_layout=int4_tiles) rather than rows
    int4_tiles: bool = False

    def __post_init__(self) -> None:
        validate(self)

    @property
    def experts(self) -> int:
        return self.w1.shape[0]

    def in_features(self, name: str) -> int:
        """The dense input width of W1 ("w1") or W2 ("w2")."""
        t = getattr(self, name)
        return t.shape[-1] * (2 if self.kind.packed else 1)

    def named(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor present, by field name."""
        return [(n, getattr(self, n)) for n in _TENSORS if getattr(self, n) is not None]

    def storage_flags(self) -> dict[str, bool]:
        """How these experts are stored, as the MoESpec flags that say it (which the spec must agree with)."""
        return {"quant_zero_points": self.w1_zero is not None, "quant_per_channel": self.group_size is None,
                "quant_prequant_scales": self.fc1_act_scale is not None}

    def experts_slice(self, experts: slice | torch.Tensor) -> "WoqWeights":
        """These weights for the experts in `experts` only (a slice: one expert-parallel rank's, as views; an index
        tensor: a reference's chunk, as copies): every per-expert tensor cut, the per-layer activation scales kept."""
        per_expert = ("w1", "w2", "w1_scale", "w2_scale", "w1_zero", "w2_zero", "w1_scale_2", "w2_scale_2")
        return replace(self, **{n: t[experts] for n, t in self.named() if n in per_expert})

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "WoqWeights":
        """These weights with `fn` applied to every tensor (device moves, contiguous copies)."""
        return replace(self, **{n: fn(t) for n, t in self.named()})

    def dequantized_w(self, name: str, e: int) -> torch.Tensor:
        """Expert e's W1 or W2 ("w1" / "w2") dense in fp64 [out, in]."""
        zero = getattr(self, f"{name}_zero")
        data = getattr(self, name)[e : e + 1]
        return dequantize_matrix(self.kind, (int4_rows(data) if self.int4_tiles else data)[0],
                                 getattr(self, f"{name}_scale")[e], None if zero is None else zero[e])

    def as_int4_tiles(self) -> "WoqWeights":
        """These weights with W1 / W2's int4 codes in 16-row tiles (int4_tiles): the decode, mma and dequantize
        kernels' fastest form (MB_WOQ_INT4_TILES), the mixed-input wgmma kernel's being rows."""
        if self.int4_tiles:
            return self
        return replace(self, w1=int4_tiles(self.w1), w2=int4_tiles(self.w2), int4_tiles=True)

    def dense(self, name: str, dtype: torch.dtype, fold_prequant: bool = False) -> torch.Tensor:
        """W1 or W2 ("w1" / "w2") of every expert dequantized exactly and rounded once to `dtype`, one expert at a
        time so that no fp64 copy of every expert exists beside the result. fold_prequant: times its AWQ pre-quant
        scale along its input columns, in fp64 before the rounding (x * s @ W^T = x @ (W * s)^T), so that a 16-bit
        layer of these weights computes what the quantized one does before its activation rounding."""
        t = getattr(self, name)
        pre = (self.fc1_act_scale if name == "w1" else self.fc2_act_scale) if fold_prequant else None
        out = torch.empty((self.experts, t.shape[1], self.in_features(name)), dtype=dtype, device=t.device)
        for e in range(self.experts):
            w = self.dequantized_w(name, e)
            out[e] = (w if pre is None else w * pre.to(w.device, torch.float64)).to(dtype)
        return out

    def expected_shapes(self, experts: int, n1: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
        """The shape each tensor must have for W1 [experts, n1, hidden] and W2 [experts, hidden, inter]."""
        def data(out: int, cols: int) -> tuple[int, ...]:
            return (experts, out, cols // 2 if self.kind.packed else cols)

        def scales(out: int, cols: int) -> tuple[int, ...]:
            return (experts, out, 1 if self.group_size is None else cols // self.group_size)
        return {"w1": data(n1, hidden), "w2": data(hidden, inter), "w1_scale": scales(n1, hidden),
                "w2_scale": scales(hidden, inter), "w1_zero": scales(n1, hidden), "w2_zero": scales(hidden, inter),
                "fc1_act_scale": (hidden,), "fc2_act_scale": (inter,), "a1_scale": (), "a2_scale": (),
                "w1_scale_2": (experts,), "w2_scale_2": (experts,)}


def _refuse(name: str, problem: str, allowed: str) -> None:
    raise MoeBuildError(f"woq.{name}", problem, allowed)


def _positive_finite(name: str, t: torch.Tensor) -> None:
    if t.dtype != torch.float32:
        _refuse(name, f"dtype {t.dtype}", "torch.float32")
    if not bool((torch.isfinite(t) & (t > 0)).all()):
        _refuse(name, "holds a scale that is not a finite number > 0", "finite scales > 0")


def validate(w: WoqWeights) -> None:
    """Refuse, in one line naming the tensor (woq.<field>), weights that break the module docstring's contract."""
    kind = w.kind
    if not isinstance(kind, WoqKind):
        _refuse("kind", f"{kind!r}", ", ".join(k.value for k in WoqKind))
    for name in ("w1", "w2"):
        t = getattr(w, name)
        if t.dtype != _DATA_DTYPE[kind] or t.dim() != 3:
            _refuse(name, f"{kind.value} data must be {_DATA_DTYPE[kind]} [E, out, in{'/2' if kind.packed else ''}], "
                    f"got {t.dtype} {tuple(t.shape)}", str(_DATA_DTYPE[kind]))
    g = w.group_size
    if kind is WoqKind.MXFP4 and g != MXFP4_GROUP:
        _refuse("group_size", f"{g}: MXFP4 shares one exponent per {MXFP4_GROUP} values", str(MXFP4_GROUP))
    if kind is WoqKind.INT4 and g is not None and g not in GROUP_SIZES:
        _refuse("group_size", f"{g}", f"{', '.join(map(str, GROUP_SIZES))} or per channel")
    if kind is WoqKind.INT8 and g is not None and (g <= 0 or g % 2):
        _refuse("group_size", f"{g}", "a positive even group size or per channel")
    e, n1 = w.w1.shape[0], w.w1.shape[1]
    hidden, inter = w.in_features("w1"), w.in_features("w2")
    for name, cols in (("w1", hidden), ("w2", inter)):
        if g is not None and cols % g:
            _refuse(f"{name}_scale", f"{cols} input columns are not whole groups of {g}", f"multiples of {g}")
    want = w.expected_shapes(e, n1, hidden, inter)
    for name in _TENSORS:
        t = getattr(w, name)
        if t is not None and tuple(t.shape) != want[name]:
            _refuse(name, f"shape {tuple(t.shape)} does not fit W1 {(e, n1, hidden)} and W2 "
                    f"{(e, hidden, inter)}", f"shape {want[name]}")
    for name in ("w1_scale", "w2_scale"):
        t = getattr(w, name)
        if kind is WoqKind.MXFP4:
            if t.dtype != torch.uint8 or bool((t == E8M0_NAN).any()):
                _refuse(name, f"MXFP4 exponents must be uint8 e8m0 codes other than {E8M0_NAN} (NaN), "
                        f"got {t.dtype}", "uint8 0..254")
        elif t.dtype != torch.float32 or not bool(torch.isfinite(t).all()):
            _refuse(name, f"group scales must be finite fp32, got {t.dtype}", "torch.float32")
    for name in ("w1_zero", "w2_zero"):
        t = getattr(w, name)
        if t is None:
            continue
        if kind is not WoqKind.INT4:
            _refuse(name, f"{kind.value} weights are symmetric and carry no zero points", "None")
        if t.dtype != torch.uint8 or bool((t > 15).any()):
            _refuse(name, f"int4 zero points must be uint8 in 0..15, got {t.dtype}", "uint8 0..15")
    if w.int4_tiles and (kind is not WoqKind.INT4 or n1 % TILE_ROWS or hidden % TILE_ROWS):
        _refuse("int4_tiles", f"{kind.value} weights with {n1} / {hidden} output rows", f"int4 weights whose output "
                f"rows are multiples of {TILE_ROWS}")
    if (w.w1_zero is None) != (w.w2_zero is None):
        _refuse("w2_zero" if w.w2_zero is None else "w1_zero", "zero points on one GEMM only", "both or neither")
    for first, second in (("fc1_act_scale", "fc2_act_scale"), ("a1_scale", "a2_scale"), ("w1_scale_2", "w2_scale_2")):
        a, b = getattr(w, first), getattr(w, second)
        if (a is None) != (b is None):
            _refuse(second if b is None else first, f"given without {first if a is None else second}",
                    "both or neither")
        for name, t in ((first, a), (second, b)):
            if t is not None:
                _positive_finite(name, t)
    if kind is WoqKind.MXFP4 and (w.fc1_act_scale is not None or w.a1_scale is not None or w.w1_scale_2 is not None):
        _refuse("fc1_act_scale", "MXFP4 (wfp4a16) layers carry no activation or second-level scales", "None")

