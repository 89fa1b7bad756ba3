// The weight-only grouped GEMM (mb_grouped_gemm_woq, issue 47): what its kernels share. C[p] = A[p] @ dequant(B[x])^T
// (+ bias[x]) for the permuted rows p of expert x, A and C in bf16/fp16, B in moe_build/weights/woq.py's packed
// forms (cpp/include/moe_build_kernels.h states them), dequantized in registers and rounded once to A's type
// before the mma; fp32 accumulation. gemm/woq_abi.cu checks the arguments and runs the tactic's kernel:
// gemm/woq_decode.cu (a few rows per expert) or gemm/woq_mma.cu (many).
#pragma once

#include <cstdint>

#include "common/common.cuh"
#include "moe_build_kernels.h"

namespace mbk {

constexpr int kMxfp4Group = 32;

struct WoqGemmParams {
  const void* A;           // [max_rows, k] in T
  const uint8_t* B;        // as the kind says
  const void* scales;      // fp32, or uint8 e8m0 for MXFP4
  const uint8_t* zeros;    // INT4 only, or null
  const void* bias;        // [E, n] in T, or null
  void* C;                 // [max_rows, n] in T
  const int64_t* offsets;  // [E + 1]
  int num_experts;
  int n, k;
  int group;  // k per scale; 0: one scale per output row (INT4 / INT8)
  int kind;   // enum mb_woq_kind
};

// e2m1 value of a 4-bit code: sign bit 3, exponent bits 2-1, mantissa bit 0 (OCP MX).
__device__ __forceinline__ float e2m1(uint32_t c) {
  const uint32_t mag = c & 7u;
  const float v = mag < 2u   ? 0.5f * mag
                  : mag < 4u ? 1.0f + 0.5f * (mag - 2u)
                  : mag < 6u ? 2.0f + (mag - 4u)
                             : 4.0f + 2.0f * (mag - 6u);
  return (c & 8u) ? -v : v;
}

// The kernels' launchers; the arguments and the tactic are checked by the caller (gemm/woq_abi.cu), max_rows > 0.
// gemm/woq_decode.cu: `k_split` (1, 2, 4 or 8) warps per K slice.
mb_status launch_woq_decode(const WoqGemmParams& p, int64_t max_rows, int dtype, int k_split, bool after_trigger,
                            cudaStream_t stream);
// gemm/woq_mma.cu: `tile` MB_TILE_MMA_64x128 or MB_TILE_MMA_128x128.
mb_status launch_woq_mma(const WoqGemmParams& p, int64_t max_rows, int dtype, int tile, bool after_trigger,
                         cudaStream_t stream);

}  // namespace mbk
