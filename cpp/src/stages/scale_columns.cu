// Rows times a per-column fp32 scale (mb_scale_columns), into another buffer or in place: the AWQ pre-quant scales'
// separate step of weight-only layers (the runner's fc1_prequant:separate on the tokens' rows, before the expansion
// copies them top_k times, and fc2_prequant:separate in place on GEMM2's input rows). Each element is multiplied in
// fp32 and rounded once to its type, as torch's mixed-dtype multiply does; a thread takes 8 consecutive columns (one
// 16-byte load and store of 16-bit rows), grid-strided.
#include <algorithm>
#include <cstdint>

#include "common/common.cuh"

namespace {

constexpr int kCols = 8;
constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
scale_columns_kernel(const T* x, T* out, const float* __restrict__ scale, int64_t rows, int cols) {
  const int64_t vectors_per_row = cols / kCols;
  const int64_t total = rows * vectors_per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int c = static_cast<int>(i % vectors_per_row) * kCols;
    const int64_t at = (i / vectors_per_row) * cols + c;
    float v[kCols], s[kCols];
    mb::load_f32<T, kCols>(x + at, v);
    mb::load_f32<float, kCols>(scale + c, s);
#pragma unroll
    for (int j = 0; j < kCols; ++j) v[j] *= s[j];
    mb::store_f32<T, kCols>(out + at, v);
  }
}

}  // namespace

extern "C" mb_status mb_scale_columns(const void* x, void* out, int dtype, const float* scale, int64_t rows, int cols,
                                      cudaStream_t stream) {
  const char* who = "mb_scale_columns";
  MB_REQUIRE(x && out && scale && rows >= 0 && cols > 0, "%s: null pointer or bad size (rows %lld, cols %d)", who,
             static_cast<long long>(rows), cols);
  MB_REQUIRE(cols % kCols == 0, "%s: cols (%d) must be a multiple of %d", who, cols, kCols);
  MB_REQUIRE(dtype == MB_BF16 || dtype == MB_FP16, "%s: dtype %d is not bf16 (%d) or fp16 (%d)", who, dtype, MB_BF16,
             MB_FP16);
  MB_REQUIRE(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(scale) % 16 == 0,
             "%s: x, out and scale must be 16-byte aligned", who);
  if (rows == 0) return MB_OK;
  return mb::dispatch_dtype(dtype, who, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t vectors = rows * (cols / kCols);
    const int64_t sms = mb::device_attribute(cudaDevAttrMultiProcessorCount);
    const int grid = static_cast<int>(std::min<int64_t>((vectors + kThreads - 1) / kThreads, sms * 8));
    scale_columns_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(out), scale,
                                                            rows, cols);
    return mb::check_launch("scale_columns_kernel");
  });
}
