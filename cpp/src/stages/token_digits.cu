// The token rows as the int8 mma's operand (gemm/woq_decode_digits.cu, the weight-only int4 decode GEMM's digits
// tile): each 128-k group of a row split into three 8-bit digits per value under one power-of-two factor, in
// common/token_digits.cuh's layout. Done once per row here, where the GEMM's CTAs (one per 128 weight rows) would
// each redo it for every row of their chunk.
//
// A warp per (row, group), a lane per 4 consecutive k: the group's largest magnitude m (its bits, as an integer
// max: non-negative floats order as their bits) gives E = ilogb(m) - 5, so y = x / 2^E has |y| < 64; then
// d0 = rint(y), d1 = rint(64 (y - d0)), d2 = rint(64 (64 (y - d0) - d1)), each step exact in fp32, so
// x = 2^(E - 12) (4096 d0 + 64 d1 + d2) wherever x has no bits below 2^(E - 12) (every bf16 value within 2^10 of m,
// every fp16 one within 2^7). Lanes pair up to store each plane's 8-byte runs (the even lane the even k's digits, the odd lane the
// odd k's). Launched after a trigger and started with mb::chain_start(), as the stage kernels around it.
#include <cmath>

#include "common/common.cuh"
#include "common/token_digits.cuh"

namespace {

constexpr int kWarps = 8;

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return __bfloat162float(v);
}

// Four digits (one per k) as the bytes of a word, k order.
__device__ __forceinline__ uint32_t pack4(const int (&d)[4]) {
  return (d[0] & 0xff) | (d[1] & 0xff) << 8 | (d[2] & 0xff) << 16 | static_cast<uint32_t>(d[3] & 0xff) << 24;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) token_digits_kernel(const T* __restrict__ in, int64_t rows, int k,
                                                                   uint8_t* __restrict__ out) {
  mb::chain_start();
  const int lane = threadIdx.x & 31;
  const int64_t groups = k / mb::kDigitGroup, items = rows * groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); it < items; it += warps) {
    const int64_t r = it / groups, grp = it - r * groups;
    const uint2 raw = *reinterpret_cast<const uint2*>(in + r * k + grp * mb::kDigitGroup + 4 * lane);
    const T* v = reinterpret_cast<const T*>(&raw);
    float x[4];
    uint32_t top = 0;
    bool finite = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = to_f32(v[i]);
      top = max(top, __float_as_uint(fabsf(x[i])));
      finite = finite && isfinite(x[i]);
    }
    top = __reduce_max_sync(0xffffffffu, top);
    finite = __all_sync(0xffffffffu, finite);
    const float m = __uint_as_float(top);
    const int e = m > 0.f ? max(ilogbf(m), -100) - 5 : 0;  // |x| / 2^e < 64; tiny groups keep 2^-e finite
    const float inv = __int_as_float((127 - e) << 23);      // 2^-e
    int d[3][4], sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float y = x[i] * inv, d0 = rintf(y), r1 = (y - d0) * 64.f, d1 = rintf(r1), d2 = rintf((r1 - d1) * 64.f);
      d[0][i] = static_cast<int>(d0);
      d[1][i] = static_cast<int>(d1);
      d[2][i] = static_cast<int>(d2);
      sum += 4096 * d[0][i] + 64 * d[1][i] + d[2][i];
    }
    sum = __reduce_add_sync(0xffffffffu, sum);
    // Lane l holds k 4l .. 4l + 3: lane q = l / 8 of the GEMM's, step s = (l % 8) / 2; the even lane of a pair stores
    // bytes 0..3 of the run (k 0, 2, 4, 6 of the 8), the odd lane bytes 4..7 (k 1, 3, 5, 7).
    uint8_t* rec = out + it * static_cast<int64_t>(mb::kDigitGroupBytes);
    const bool odd = lane & 1;
    const unsigned at = ((lane & 7) >> 1) * mb::kDigitStepBytes + (lane >> 3) * 8 + (odd ? 4 : 0);
#pragma unroll
    for (int p = 0; p < 3; ++p) {
      const uint32_t own = pack4(d[p]), other = __shfl_xor_sync(0xffffffffu, own, 1);
      *reinterpret_cast<uint32_t*>(rec + at + p * mb::kDigitPlaneBytes) =
          odd ? __byte_perm(own, other, 0x3175) : __byte_perm(own, other, 0x6420);
    }
    if (lane == 0) {
      const float factor = finite ? __int_as_float((127 + e - 12) << 23) : __int_as_float(0x7fc00000);  // 2^(e-12)
      *reinterpret_cast<uint4*>(rec + mb::kDigitSumOffset) =
          make_uint4(static_cast<uint32_t>(sum), __float_as_uint(factor), 0u, 0u);
    }
  }
}

}  // namespace

extern "C" mb_status mb_token_digits(const void* in, int dtype, int64_t rows, int k, uint8_t* out,
                                     cudaStream_t stream) {
  const char* who = "mb_token_digits";
  MB_REQUIRE(rows >= 0, "%s: rows must be >= 0, got %lld", who, static_cast<long long>(rows));
  MB_REQUIRE(k >= mb::kDigitGroup && k % mb::kDigitGroup == 0, "%s: k must be a positive multiple of 128, got %d", who,
             k);
  if (dtype != MB_FP16 && dtype != MB_BF16)
    return mb::fail(dtype == MB_FP32 ? MB_ERR_UNSUPPORTED : MB_ERR_INVALID_ARGUMENT,
                    "%s: dtype %d is not one of fp16(1), bf16(2)", who, dtype);
  if (rows == 0) return MB_OK;
  MB_REQUIRE(in && out, "%s: in and out must be non-NULL", who);
  MB_REQUIRE(reinterpret_cast<uintptr_t>(in) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "%s: in must be 8-byte and out 16-byte aligned", who);
  const int64_t items = rows * (k / mb::kDigitGroup);
  const unsigned blocks = mb::row_grid((items + kWarps - 1) / kWarps);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    return mb::check_launch("token_digits_kernel",
                            mb::launch_after_trigger(token_digits_kernel<T>, dim3(blocks), dim3(kWarps * 32), stream,
                                                     static_cast<const T*>(in), rows, k, out));
  };
  return dtype == MB_FP16 ? launch(__half{}) : launch(__nv_bfloat16{});
}
