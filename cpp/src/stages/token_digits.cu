// The token rows as the int8 mma's operand (gemm/woq_decode_digits.cu, the weight-only int4 decode GEMM's digits
// tile): each 128-k group of a row split into three 8-bit digits per value under one power-of-two factor, in
// common/token_digits.cuh's layout. Done once per row here, where the GEMM's CTAs (one per 128 weight rows) would
// each redo it for every row of their chunk.
//
// A warp per (row, group), a lane per 4 consecutive k (zeros past k where k % 128 == 64), the record computed and
// stored by common/token_digits.cuh's digit_words / store_digit_words in the order of the GEMM's weight groups. Launched after a trigger and started with mb::chain_start(), as the stage kernels
// around it.
#include "common/common.cuh"
#include "common/token_digits.cuh"

namespace {

constexpr int kWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) token_digits_kernel(const T* __restrict__ in, int64_t rows, int k,
                                                                   mb::DigitOrder order, uint8_t* __restrict__ out) {
  mb::chain_start();
  const int lane = threadIdx.x & 31;
  const int64_t groups = mb::digit_groups(k), items = rows * groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); it < items; it += warps) {
    const int64_t r = it / groups, col = (it - r * groups) * mb::kDigitGroup + 4 * lane;
    const uint2 raw = col < k ? *reinterpret_cast<const uint2*>(in + r * k + col) : uint2{0u, 0u};
    const T* v = reinterpret_cast<const T*>(&raw);
    const float x[4] = {mb::to_f32(v[0]), mb::to_f32(v[1]), mb::to_f32(v[2]), mb::to_f32(v[3])};
    mb::store_digit_words(mb::digit_words(x, order), out + it * static_cast<int64_t>(mb::kDigitGroupBytes), order);
  }
}

}  // namespace

extern "C" mb_status mb_token_digits(const void* in, int dtype, int64_t rows, int k, int group, uint8_t* out,
                                     cudaStream_t stream) {
  const char* who = "mb_token_digits";
  MB_REQUIRE(rows >= 0, "%s: rows must be >= 0, got %lld", who, static_cast<long long>(rows));
  MB_TRY(mb::check_digits_rows(who, "k", k, group, dtype));
  if (rows == 0) return MB_OK;
  MB_REQUIRE(in && out, "%s: in and out must be non-NULL", who);
  MB_REQUIRE(reinterpret_cast<uintptr_t>(in) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "%s: in must be 8-byte and out 16-byte aligned", who);
  const int64_t items = rows * mb::digit_groups(k);
  const unsigned blocks = mb::row_grid((items + kWarps - 1) / kWarps);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    return mb::check_launch("token_digits_kernel",
                            mb::launch_after_trigger(token_digits_kernel<T>, dim3(blocks), dim3(kWarps * 32), stream,
                                                     static_cast<const T*>(in), rows, k, mb::digit_order(group), out));
  };
  return dtype == MB_FP16 ? launch(__half{}) : launch(__nv_bfloat16{});
}
