// Weight-only experts dequantized to 16 bits (mb_woq_dequantize): what a weight-only GEMM with a wgmma tactic runs
// first, into the runner's workspace, before the 16-bit wgmma GEMM reads the result as row-major weights (the
// weight-only kernels have no wgmma mainloop: from many rows per expert one dequantizing pass plus the 16-bit
// GEMM costs less than the mma tiles; moe_build/planner/tactics.py's woq_kernel_rule).
// The stored forms are mb_grouped_gemm_woq's (cpp/include/moe_build_kernels.h): w = (u - z) * s (int4), q * s
// (int8), e2m1 * 2^(e - 127) (MXFP4), each computed in fp32 and rounded once to the output dtype. A thread writes 8
// consecutive columns of one row (one 16-byte store), reading its 4 (4-bit) or 8 (int8) bytes and its one scale
// (groups are 32 columns or more; 0: one scale per row).
#include <algorithm>
#include <cstdint>

#include "common/common.cuh"

namespace {

constexpr int kCols = 8;  // columns per thread
constexpr int kThreads = 256;

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  // code: sign bit 3, exponent bits 2..1, mantissa bit 0 (0, 0.5, 1, 1.5, 2, 3, 4, 6)
  const uint32_t mag = code & 7u;
  const float v = mag < 2 ? 0.5f * static_cast<float>(mag)
                          : static_cast<float>(1u << ((mag >> 1) - 1)) * (1.0f + 0.5f * static_cast<float>(mag & 1u));
  return code & 8u ? -v : v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
woq_dequantize_kernel(int kind, const uint8_t* __restrict__ data, const void* __restrict__ scales,
                      const uint8_t* __restrict__ zeros, int group, int64_t rows, int k, T* __restrict__ out) {
  const int64_t chunks_per_row = k / kCols;
  const int64_t total = rows * chunks_per_row;
  const int groups = group ? k / group : 1;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / chunks_per_row;
    const int col = static_cast<int>(i % chunks_per_row) * kCols;
    const int64_t g = row * groups + (group ? col / group : 0);
    float w[kCols];
    if (kind == MB_WOQ_INT8) {
      const uint2 q = *reinterpret_cast<const uint2*>(data + row * k + col);
      const float s = static_cast<const float*>(scales)[g];
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const uint32_t word = j < 4 ? q.x : q.y;
        w[j] = static_cast<float>(static_cast<int8_t>((word >> (8 * (j % 4))) & 0xffu)) * s;
      }
    } else {
      const uint32_t q = *reinterpret_cast<const uint32_t*>(data + row * (k / 2) + col / 2);
      if (kind == MB_WOQ_MXFP4) {
        const int e = static_cast<int>(static_cast<const uint8_t*>(scales)[g]) - 127;
#pragma unroll
        for (int j = 0; j < kCols; ++j) w[j] = ldexpf(e2m1_value((q >> (4 * j)) & 0xfu), e);
      } else {
        const float s = static_cast<const float*>(scales)[g];
        const float z = zeros ? static_cast<float>(zeros[g]) : 8.0f;
#pragma unroll
        for (int j = 0; j < kCols; ++j) w[j] = (static_cast<float>((q >> (4 * j)) & 0xfu) - z) * s;
      }
    }
    mb::store_f32<T, kCols>(out + row * k + col, w);
  }
}

}  // namespace

extern "C" mb_status mb_woq_dequantize(int kind, const void* data, const void* scales, const uint8_t* zeros, int group,
                                       int num_experts, int n, int k, int dtype, void* out, cudaStream_t stream) {
  const char* who = "mb_woq_dequantize";
  MB_REQUIRE(kind == MB_WOQ_INT4 || kind == MB_WOQ_INT8 || kind == MB_WOQ_MXFP4,
             "%s: kind %d is not int4 (%d), int8 (%d) or mxfp4 (%d)", who, kind, MB_WOQ_INT4, MB_WOQ_INT8,
             MB_WOQ_MXFP4);
  MB_REQUIRE(data && scales && out && num_experts >= 1 && n >= 1 && k >= 1, "%s: null pointer or non-positive size",
             who);
  MB_REQUIRE(k % 32 == 0, "%s: k (%d) must be a multiple of 32", who, k);
  MB_REQUIRE(kind == MB_WOQ_MXFP4 ? group == 32
                                  : (group == 0 || ((group == 32 || group == 64 || group == 128) && k % group == 0)),
             "%s: group %d with k %d (int4/int8: 0, or 32, 64 or 128 dividing k; mxfp4: 32)", who, group, k);
  MB_REQUIRE(!zeros || kind == MB_WOQ_INT4, "%s: zero points exist for int4 only", who);
  MB_REQUIRE(reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 8 == 0,
             "%s: out must be 16-byte and data 8-byte aligned", who);
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t rows = static_cast<int64_t>(num_experts) * n;
    const int64_t chunks = rows * (k / kCols);
    const int64_t sms = mb::device_attribute(cudaDevAttrMultiProcessorCount);
    const int grid = static_cast<int>(std::min<int64_t>((chunks + kThreads - 1) / kThreads, sms * 8));
    woq_dequantize_kernel<T><<<grid, kThreads, 0, stream>>>(kind, static_cast<const uint8_t*>(data), scales, zeros,
                                                           group, rows, k, static_cast<T*>(out));
    return mb::check_launch("woq_dequantize_kernel");
  });
}
