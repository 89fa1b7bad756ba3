// Weight-only experts dequantized to 16 bits (mb_woq_dequantize): what a weight-only GEMM with a wgmma tactic runs
// first, into the runner's workspace, before the 16-bit wgmma GEMM reads the result as row-major weights (the
// weight-only kernels have no wgmma mainloop: from many rows per expert one dequantizing pass plus the 16-bit
// GEMM costs less than the mma tiles; moe_build/planner/tactics/woq.py's woq_kernel_rule).
// The forms are mb_grouped_gemm_woq's (cpp/include/moe_build_kernels.h; int4 in rows or tiles): w = (u - z) * s
// (int4), q * s (int8), e2m1 * 2^(e - 127) (MXFP4), each computed in fp32 and rounded once to the output dtype.
// A block per weight row, a thread 16 consecutive columns at a time (one 8-byte load, int8 two, and two 16-byte
// stores, one scale: groups are 32 columns or more), the kind a template argument: the pass moves bytes, so its
// arithmetic is integer placement and one or two multiplies a weight, with no division or conversion call.
#include <algorithm>
#include <cstdint>

#include "common/common.cuh"
#include "gemm/woq.cuh"  // is_int4, int4_offset

namespace {

constexpr int kCols = 16;  // columns per thread step
constexpr int kThreads = 128;

// 2^23 + x as fp32 bits for a byte x (x < 256): the exact float x after subtracting 2^23.
__device__ __forceinline__ float magic_u8(uint32_t x) { return __uint_as_float(0x4b000000u | x) - 8388608.0f; }

template <typename T, int KIND>
__global__ void __launch_bounds__(kThreads)
woq_dequantize_rows(const uint8_t* __restrict__ data, const void* __restrict__ scales,
                    const uint8_t* __restrict__ zeros, int group, int k, bool tiles, T* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const int groups = group ? k / group : 1;
  T* o = out + row * k;
  for (int col = threadIdx.x * kCols; col < k; col += kThreads * kCols) {
    const int64_t g = row * groups + (group ? col / group : 0);
    float w[kCols];
    if constexpr (KIND == MB_WOQ_INT8) {
      const uint8_t* d = data + row * k;  // the row's bytes
      const uint2 lo = *reinterpret_cast<const uint2*>(d + col), hi = *reinterpret_cast<const uint2*>(d + col + 8);
      const uint32_t words[4] = {lo.x, lo.y, hi.x, hi.y};
      const float s = static_cast<const float*>(scales)[g];
#pragma unroll
      for (int j = 0; j < kCols; ++j)  // q + 128 exactly, then minus 128
        w[j] = (magic_u8(((words[j / 4] >> (8 * (j % 4))) & 0xffu) ^ 0x80u) - 128.0f) * s;
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(data + mbk::int4_offset(tiles, row, col / 2, k / 2));
      if constexpr (KIND == MB_WOQ_MXFP4) {
        // e2m1's magnitude bits as fp32's low two exponent bits and top mantissa bit, its sign as the sign: e2m1 *
        // 2^-126 (0.5 the subnormal 2^-127), times 2^126 and 2^(e - 127) (e 0: the subnormal 2^-127), both exact
        const uint32_t e = static_cast<const uint8_t*>(scales)[g];
        const float s = __uint_as_float(e ? e << 23 : 0x00400000u), two126 = __uint_as_float(0x7e800000u);
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          const uint32_t c = ((j < 8 ? q.x : q.y) >> (4 * (j % 8))) & 0xfu;
          w[j] = __uint_as_float(((c & 7u) << 22) | ((c & 8u) << 28)) * two126 * s;
        }
      } else {
        const float s = static_cast<const float*>(scales)[g];
        const float z = zeros ? magic_u8(zeros[g]) : 8.0f;
#pragma unroll
        for (int j = 0; j < kCols; ++j) w[j] = (magic_u8(((j < 8 ? q.x : q.y) >> (4 * (j % 8))) & 0xfu) - z) * s;
      }
    }
    mb::store_f32<T, kCols>(o + col, w);
  }
}

}  // namespace

extern "C" mb_status mb_woq_dequantize(int kind, const void* data, const void* scales, const uint8_t* zeros, int group,
                                       int num_experts, int n, int k, int dtype, void* out, cudaStream_t stream) {
  const char* who = "mb_woq_dequantize";
  MB_REQUIRE(mbk::is_int4(kind) || kind == MB_WOQ_INT8 || kind == MB_WOQ_MXFP4,
             "%s: kind %d is not int4 (%d), int4_tiles (%d), int8 (%d) or mxfp4 (%d)", who, kind, MB_WOQ_INT4,
             MB_WOQ_INT4_TILES, MB_WOQ_INT8, MB_WOQ_MXFP4);
  MB_REQUIRE(data && scales && out && num_experts >= 1 && n >= 1 && k >= 1, "%s: null pointer or non-positive size",
             who);
  MB_REQUIRE(k % 32 == 0, "%s: k (%d) must be a multiple of 32", who, k);
  MB_REQUIRE(kind == MB_WOQ_MXFP4 ? group == 32
                                  : (group == 0 || ((group == 32 || group == 64 || group == 128) && k % group == 0)),
             "%s: group %d with k %d (int4/int8: 0, or 32, 64 or 128 dividing k; mxfp4: 32)", who, group, k);
  MB_REQUIRE(!zeros || mbk::is_int4(kind), "%s: zero points exist for int4 only", who);
  MB_REQUIRE(kind != MB_WOQ_INT4_TILES || n % 16 == 0, "%s: int4 tiles hold 16 rows: n (%d) must be a multiple of 16",
             who, n);
  MB_REQUIRE(reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(data) % 8 == 0,
             "%s: out must be 16-byte and data 8-byte aligned", who);
  const int64_t rows = static_cast<int64_t>(num_experts) * n;
  MB_REQUIRE(rows < (int64_t{1} << 31), "%s: %lld weight rows (at most 2^31 - 1)", who, static_cast<long long>(rows));
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto launch = [&](auto kind_tag) {
      woq_dequantize_rows<T, decltype(kind_tag)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          static_cast<const uint8_t*>(data), scales, zeros, group, k, kind == MB_WOQ_INT4_TILES,
          static_cast<T*>(out));
      return mb::check_launch("woq_dequantize_rows");
    };
    if (kind == MB_WOQ_INT8) return launch(std::integral_constant<int, MB_WOQ_INT8>{});
    if (kind == MB_WOQ_MXFP4) return launch(std::integral_constant<int, MB_WOQ_MXFP4>{});
    return launch(std::integral_constant<int, MB_WOQ_INT4>{});
  });
}
