"""The C ABI of `libmoe_build_kernels.so` (cpp/include/moe_build_kernels.h) as ctypes declarations.

Every enum and struct mirrors the header value for value; tests/test_kernel_build.py parses the header
and checks that they agree, and that SIGNATURES lists exactly the functions it declares.
"""
from __future__ import annotations

import ctypes
import enum


class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    CUDA = 3


class DType(enum.IntEnum):
    FP32 = 0
    FP16 = 1
    BF16 = 2


class Routing(enum.IntEnum):
    SOFTMAX_TOPK = 0
    TOPK_SOFTMAX = 1
    SIGMOID_GROUPED = 2


class Activation(enum.IntEnum):
    IDENTITY = 0
    RELU = 1
    SILU = 2
    GELU = 3
    SWIGLU = 4
    GEGLU = 5
    SWIGLU_CLAMP = 6

    @property
    def is_gated(self) -> bool:
        return self in (Activation.SWIGLU, Activation.GEGLU, Activation.SWIGLU_CLAMP)


class WeightLayout(enum.IntEnum):
    """B's layout for the sm90 GEMM entry points (mb_weight_layout)."""
    ROW_MAJOR = 0
    BLOCKED64 = 1


class GemmKernel(enum.IntEnum):
    """mb_gemm_kernel: which grouped-GEMM kernel a tactic runs."""
    DECODE = 0
    MMA = 1
    WGMMA = 2


class GemmTile(enum.IntEnum):
    """mb_gemm_tile (MB_TILE_*): the tile of the mma or wgmma kernel; NONE, DECODE_STAGED, DECODE_STAGED_C4,
    DECODE_DIGITS or DECODE_TWOCTA for decode."""
    NONE = 0
    MMA_16x64 = 1
    MMA_64x128 = 2
    MMA_128x128 = 3
    COOP_128x256 = 4
    PINGPONG_64x256 = 5
    PINGPONG_64x128 = 6
    PINGPONG_64x256_C2 = 7
    PINGPONG_64x192_C2 = 8
    COOP_128x128 = 9
    COOP_128x128_C2 = 10
    COOP_128x192 = 11
    COOP_128x192_C2 = 12
    WOQ_128x64 = 13
    WOQ_128x128 = 14
    WOQ_128x16 = 15
    WOQ_128x32 = 16
    WOQ_128x256 = 17
    DECODE_STAGED = 18
    PINGPONG_64x128_C2 = 19
    PINGPONG_128x128 = 20
    PINGPONG_128x128_C2 = 21
    DECODE_DIGITS = 22
    DECODE_TWOCTA = 23
    WOQ_128x320_C2 = 24
    WOQ_128x160 = 25
    WOQ_128x192 = 26
    WOQ_128x224 = 27
    DECODE_STAGED_C4 = 28


class WoqKind(enum.IntEnum):
    """mb_woq_kind: how the weight-only GEMM's B is stored (moe_build/weights/woq.py's kinds; E5M2 MXFP4's form for the
    mixed-input wgmma kernel, woq.mxfp4_as_e5m2; MXFP4_QUARTERS its order for the digits tile, woq.mxfp4_quarters;
    INT4_TILES int4 codes in 16-row tiles for the decode, mma and dequantize kernels, woq.int4_tiles)."""
    INT4 = 0
    INT8 = 1
    MXFP4 = 2
    E5M2 = 3
    MXFP4_QUARTERS = 4
    INT4_TILES = 5


class WoqInput(enum.IntEnum):
    """mb_woq_input (MB_INPUT_*): the weight-only GEMM's A, in the call's dtype, or the token digits of 16-bit rows
    (mb_token_digits; the decode kernel's digits tile)."""
    DTYPE = 0
    DIGITS = 1



class StepTactic(enum.IntEnum):
    """mb_step_tactic (MB_STEP_*): the kernel of an FP8 row step (the expansion, the activation / quantize step), as
    the plan's step tactic stages name it in lower case (planner/tactics/steps.py)."""
    BLOCK_ROWS = 0
    WARP_ROWS = 1
    STAGED_ROWS = 2
    GROUP_ITEMS = 3


class Fp8Scaling(enum.IntEnum):
    """mb_fp8_scaling: the FP8 GEMM's scales (per row and column, or per 128-k block)."""
    ROWWISE = 0
    BLOCK128 = 1


class Fp8Accumulation(enum.IntEnum):
    """mb_fp8_accumulation: how the FP8 wgmma GEMM accumulates (fp32 promotion every 128 k, or the tensor cores'
    own over the whole k; the plan's fp8_accumulation stage)."""
    PROMOTED = 0
    FAST = 1


class GemmLaunch(enum.IntEnum):
    """mb_gemm_launch (MB_LAUNCH_*)."""
    PLAIN = 0
    AFTER_TRIGGER = 1
    PLACED = 2


class OutputL2(enum.IntEnum):
    """mb_output_l2 (MB_OUTPUT_L2_*)."""
    PLAIN = 0
    EVICT_LAST = 1


class GemmTacticStruct(ctypes.Structure):
    """mb_gemm_tactic, passed by value to every grouped-GEMM entry point."""
    _fields_ = [("kernel", ctypes.c_int32), ("tile", ctypes.c_int32), ("k_split", ctypes.c_int32),
                ("launch", ctypes.c_int32), ("output_l2", ctypes.c_int32)]


_p = ctypes.c_void_p
_i = ctypes.c_int
_i64 = ctypes.c_int64
_f = ctypes.c_float
_sz = ctypes.c_size_t
_t = GemmTacticStruct

# name -> (restype, argtypes), in the header's order.
SIGNATURES: dict[str, tuple[type, tuple[type, ...]]] = {
    "mb_last_error": (ctypes.c_char_p, ()),
    "mb_routing": (_i, (_p, _i, _p, _i, _i, _i, _i, _i, _i, _i, _f, _p, _p, _p)),
    "mb_routing_prologue_fused": (_i, (_p, _i, _i, _i, _p, _p, _p, _p)),
    "mb_routing_prologue_fused_routing": (_i, (_p, _i, _p, _i, _i, _i, _i, _i, _i, _i, _f, _p, _p, _p, _p, _p, _p)),
    "mb_routing_prologue_three_step_workspace": (_sz, (_i, _i, _i)),
    "mb_routing_prologue_three_step": (_i, (_p, _i, _i, _i, _p, _p, _p, _p, _sz, _p, _sz, _p)),
    "mb_routing_prologue_three_step_routing": (_i, (_p, _i, _p, _i, _i, _i, _i, _i, _i, _i, _f, _p, _p, _p, _p, _p,
                                                    _p, _sz, _p, _sz, _p)),
    "mb_expand_rows": (_i, (_p, _i, _p, _p, _p, _i, _i, _i, _p, _p, _p, _p)),
    "mb_scale_columns": (_i, (_p, _p, _i, _p, _i64, _i, _p)),
    "mb_fc1_activation": (_i, (_p, _i, _p, _p, _i, _i64, _i, _i, _i, _f, _f, _p, _p, _p)),
    "mb_finalize": (_i, (_p, _i, _p, _p, _p, _p, _i, _i, _i, _i, _i, _p, _p)),
    # expert parallelism (stages/ep_dispatch.cu, ep_nvlink.cu)
    "mb_ep_layout": (_i, (_p, _i, _i, _i, _i, _p, _p, _p, _p, _p)),
    "mb_ep_pack_send": (_i, (_p, _i, _p, _p, _i, _i, _i, _i, _p, _p, _i, _p, _p, _p, _p)),
    "mb_ep_local_ids": (_i, (_p, _i64, _i, _i, _p)),
    "mb_ep_combine": (_i, (_p, _i, _p, _i, _i, _i, _p, _i, _p)),
    "mb_ep_nccl_exchange": (_i, (_p, _i, _p, _p, _p, _p, _i64, _p, _p, _i64, _p, _p, _i64, _p)),
    "mb_ep_nccl_all_gather": (_i, (_p, _i, _p, _p, _p, _i64, _p, _p, _i64, _p, _p, _i64, _p)),
    "mb_ep_nccl_reduce_scatter": (_i, (_p, _i, _p, _i64, _i, _p, _p, _p)),
    "mb_ep_nvlink_dispatch": (_i, (_p, _i, _p, _p, _i, _i, _i, _i, _i, _i, _i, _p, _p, _p, _p, _p, _p, _p, _p, _p,
                                   _i, _p)),
    "mb_ep_nvlink_wait": (_i, (_p, _i, _p)),
    "mb_ep_nvlink_gather": (_i, (_p, _i, _p, _p, _i, _i, _i, _i, _i, _i, _i, _i, _p, _p, _p, _p, _p, _p, _p, _p,
                                 _p, _p, _i, _p)),
    "mb_ep_nvlink_return": (_i, (_p, _i, _p, _p, _i, _p, _i, _p, _i, _i, _p, _p, _i, _p)),
    "mb_ep_nvlink_combine": (_i, (_p, _i, _p, _p, _i, _i, _p, _i, _i, _p, _p, _p, _p, _i, _p, _p, _p, _i, _p)),
    # dispatch_with_permute (stages/ep_permute.cu)
    "mb_ep_permute_layout": (_i, (_p, _p, _i, _i, _i, _i, _i, _i, _i, _p, _p, _p, _p, _p, _p, _p, _p, _p)),
    "mb_ep_permute_rows": (_i, (_p, _i, _p, _p, _i, _i, _i, _i, _i, _p, _p, _p, _i, _p)),
    # FP8 activation quantization (issue 46; stages/quantize_fp8.cu, expand_rows.cu, fc1_activation.cu)
    "mb_quantize_fp8": (_i, (_p, _i, _i64, _i, _p, _p, _i, _p, _p, _p)),
    "mb_expand_rows_fp8": (_i, (_p, _i, _p, _p, _p, _i, _i, _i, _p, _i, _p, _p, _p, _p, _i, _p)),
    "mb_expand_rows_fp8_prequantized": (_i, (_p, _p, _i, _p, _p, _i, _i, _i, _p, _p, _p, _p, _i, _p)),
    "mb_fc1_activation_fp8": (_i, (_p, _i, _p, _p, _i, _i64, _i, _i, _f, _f, _p, _p, _i, _p, _p, _i, _p)),
    "mb_expand_rows_fp8_dequantized": (_i, (_p, _i, _p, _p, _p, _i, _i, _i, _p, _p, _p, _p, _i, _p)),
    "mb_fc1_activation_fp8_dequantized": (_i, (_p, _i, _p, _p, _i, _i64, _i, _i, _i, _f, _f, _p, _p, _p, _i, _p)),
    # end of FP8 activation quantization
    "mb_token_digits": (_i, (_p, _i, _i64, _i, _i, _p, _p)),
    "mb_expand_rows_digits": (_i, (_p, _i, _p, _p, _p, _p, _i, _i, _i, _i, _i, _p, _p, _p, _p)),
    "mb_fc1_activation_digits": (_i, (_p, _i, _p, _p, _i, _i64, _i, _i, _i, _f, _f, _p, _p, _i, _i, _p, _p)),
    "mb_grouped_gemm_sm80_workspace": (_sz, (_i,)),
    "mb_grouped_gemm_sm80": (_i, (_p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i, _i, _f, _f, _t, _p, _sz, _p)),
    "mb_grouped_gemm_sm90_workspace": (_sz, (_i, _i64, _i, _i)),
    "mb_grouped_gemm_sm90_placement_ints": (_sz, ()),
    "mb_grouped_gemm_sm90_placement_recorded": (_i, ()),
    "mb_grouped_gemm_sm90": (_i, (_p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i, _t, _p, _sz, _p)),
    "mb_grouped_gemm_sm90_finalize": (_i, (_p, _p, _p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i, _i, _i, _t, _p,
                                           _p, _sz, _p)),
    "mb_grouped_gemm_sm90_gated": (_i, (_p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i, _f, _f, _i, _t, _p, _p, _sz,
                                        _p)),
    "mb_grouped_gemm_fp8_workspace": (_sz, (_i, _i64, _i, _i)),
    "mb_grouped_gemm_fp8": (_i, (_p, _p, _p, _p, _i, _i, _p, _p, _p, _i, _i64, _i, _i, _i, _t, _p, _sz, _p)),
    "mb_grouped_gemm_fp8_finalize": (_i, (_p, _p, _p, _p, _i, _i, _p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i, _i,
                                          _t, _p, _sz, _p)),
    "mb_grouped_gemm_fp8_quantizing_finalize": (_i, (_p, _p, _p, _p, _i, _i, _p, _p, _p, _p, _p, _i, _i64, _i, _i,
                                                     _i, _i, _i, _t, _p)),
    "mb_grouped_gemm_fp8_gated": (_i, (_p, _p, _p, _p, _i, _i, _p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i, _f, _f, _t,
                                       _p, _sz, _p)),
    "mb_grouped_gemm_woq": (_i, (_p, _i, _p, _i, _p, _p, _i, _p, _p, _p, _i, _i64, _i, _i, _i, _t, _p)),
    "mb_grouped_gemm_woq_finalize": (_i, (_p, _i, _p, _i, _p, _p, _i, _p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i,
                                          _i, _t, _p)),
    "mb_woq_dequantize": (_i, (_i, _p, _p, _p, _i, _i, _i, _i, _i, _p, _p)),
    "mb_grouped_gemm_woq_sm90_workspace": (_sz, (_i,)),
    "mb_grouped_gemm_woq_sm90": (_i, (_p, _p, _i, _p, _p, _i, _p, _p, _i, _i64, _i, _i, _i, _t, _p, _sz, _p)),
    "mb_grouped_gemm_woq_sm90_gated": (_i, (_p, _p, _i, _p, _p, _i, _p, _p, _p, _i, _f, _f, _p, _p, _i, _i64, _i, _i,
                                            _i, _t, _p, _sz, _p)),
    "mb_grouped_gemm_woq_sm90_finalize": (_i, (_p, _p, _i, _p, _p, _i, _p, _p, _p, _p, _p, _i, _i64, _i, _i, _i, _i,
                                               _i, _t, _p, _sz, _p)),
}
